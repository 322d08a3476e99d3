#!/usr/bin/env bash
# The reliability suite's `load` and `sigterm` sections against the real container (called by
# harness/deploy/run.sh once the image is built and the first `api` container has exited).
#
#   PROJECT=... PY=... DOCKER=... API=http://127.0.0.1:$DEPLOY_API_PORT bash harness/reliability/container.sh
#
# Starts `api` again with a 5 s drain (SERVE_DRAIN_TIMEOUT_S passes through docker-compose.yml), runs
# 64 concurrent clients whose answers must equal the same requests sent alone, then SIGTERM with
# streams in flight: exit 0 within the drain, every stream ending with `done` or an `error` event; once
# in one process and once with SERVE_API_PROCESSES=2 (the signal reaches the engine process, PID 1).
# The figures go to $RELIABILITY_REPORT with -1 / -2 before .json (default /tmp/reliability-container-N.json)
# and the log. Compose runs through harness/deploy/compose.py, as in run.sh: any engine, the ports of
# DEPLOY_API_PORT and the rest.
set -euo pipefail
: "${PROJECT:?}" "${PY:?}" "${DOCKER:?}" "${API:?}"
DRAIN_S=${RELIABILITY_DRAIN_S:-5}
REPORT=${RELIABILITY_REPORT:-/tmp/reliability-container.json}

compose() {
  "$PY" harness/deploy/compose.py -p "$PROJECT" "$@"
}

# In one process and with the HTTP front end in two processes (SERVE_API_PROCESSES passes through too).
for PROCESSES in 1 2; do
  SERVE_API_PROCESSES=$PROCESSES SERVE_DRAIN_TIMEOUT_S=$DRAIN_S compose up -d --force-recreate api
  CID=$(compose ps -q api)
  [ -n "$CID" ] || { echo "reliability: no api container" >&2; exit 1; }
  t0=$SECONDS
  until curl -fsS -o /dev/null --max-time 5 "$API/ready" 2>/dev/null; do
    [ "$("$DOCKER" inspect -f '{{.State.Status}}' "$CID")" = running ] || { echo "reliability: api exited" >&2; exit 1; }
    [ $((SECONDS - t0)) -lt 300 ] || { echo "reliability: $API/ready not 200 after 300 s" >&2; exit 1; }
    sleep 1
  done
  echo "api ready after $((SECONDS - t0)) s (drain timeout ${DRAIN_S} s, SERVE_API_PROCESSES=$PROCESSES)"
  DOCKER=$DOCKER "$PY" -m harness.reliability --url "$API" --container "$CID" --sections load,sigterm \
    --setting "SERVE_DRAIN_TIMEOUT_S=$DRAIN_S" --setting SERVE_MAX_NEW_TOKENS=256 \
    --setting "SERVE_API_PROCESSES=$PROCESSES" --report "${REPORT%.json}-$PROCESSES.json"
done
