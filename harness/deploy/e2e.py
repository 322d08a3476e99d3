"""End-to-end checks of a running server (the real container in harness/deploy/run.sh). Standard library only.

    python harness/deploy/e2e.py check --url http://127.0.0.1:8000 [--quick]
    python harness/deploy/e2e.py drain --url http://127.0.0.1:8000 --container CONTAINER_ID

`check` calls every endpoint and checks real answers: known sentences translate to the expected French
words and reviews classify as expected (harness/deploy/expectations.json; adjust it when the models are
retrained, never empty it), plus consistency checks that hold for any model: streamed text equals the
whole response, greedy decoding repeats, a seed reproduces a sample, completions match generate.
`--quick` runs a subset (used through the load balancer).

`drain` starts several streamed generations, sends SIGTERM to the container (Docker's kill API on the
engine's socket, as `docker kill --signal TERM` does; the CLI for an engine reached otherwise) while they
are in flight, checks that the server is draining (/ready and new requests 503, the in-flight gauge above 0)
and that every stream still completes in full.

Prints one line per check and a closing `N passed, N failed`; exits 1 if any check failed. The checks are in
e2e_checks.py and e2e_drain.py, the HTTP client in e2e_client.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # mypy reads the repository as packages; the script imports its siblings from its own folder
    from harness.deploy.e2e_checks import check_all
    from harness.deploy.e2e_client import Client
    from harness.deploy.e2e_drain import check_drain
else:
    from e2e_checks import check_all
    from e2e_client import Client
    from e2e_drain import check_drain

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("check", "drain"))
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--expectations", type=Path, default=HERE / "expectations.json")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--quick", action="store_true", help="check: a subset of the endpoints")
    parser.add_argument("--container", help="drain: the id of the server's container")
    args = parser.parse_args()
    expectations = json.loads(args.expectations.read_text())
    client = Client(args.url, args.api_key)
    if args.command == "check":
        sys.exit(check_all(client, expectations, args.quick))
    if not args.container:
        parser.error("drain needs --container")
    sys.exit(check_drain(client, expectations, args.container))


if __name__ == "__main__":
    main()
