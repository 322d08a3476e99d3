"""Container health probe: exit 0 when GET http://127.0.0.1:$SERVE_PORT<path> answers 200, else 1.

    python /app/healthcheck.py /health   # liveness (Dockerfile HEALTHCHECK)
    python /app/healthcheck.py /ready    # readiness (docker-compose healthcheck)

Standard library only: the slim image has no curl.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else "/health"
    url = f"http://127.0.0.1:{os.environ.get('SERVE_PORT', '8000')}{path}"
    try:
        with urllib.request.urlopen(url, timeout=float(os.environ.get("HEALTHCHECK_TIMEOUT_S", "4"))) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
