#!/usr/bin/env bash
# End-to-end test of the real Docker image and docker-compose.yml (the second half of .ci/run).
#
#   bash harness/deploy/run.sh
#
# 1. uses the Docker engine that answers `docker info`; with none, starts one with docker-sandbox
#    (DOCKER_SANDBOX, default ../shared/tools/docker-sandbox) and fails loudly if it cannot
# 2. validates every compose file / profile combination (`docker compose config` or `docker-compose config`)
# 3. builds the CPU image from the real Dockerfile (`docker build --network host`) and inspects it
# 4. starts `api` with docker compose (+ harness/deploy/docker-compose.ci.yml, rendered for host networking
#    by harness/deploy/compose.py) and waits for /ready
# 5. calls every endpoint through the container and checks real answers (harness/deploy/e2e.py,
#    expectations in harness/deploy/expectations.json); then the same through the nginx load balancer
# 6. stops the server (SIGTERM) during an in-flight generation: it must finish, then the server exits 0
# 6a. the reliability suite's load and SIGTERM sections against a fresh `api` (harness/reliability/container.sh)
# 6b. the compose `scale` profile: api + 2 replicas behind nginx, 300 requests, one replica stopped
#    mid-load (harness/deploy/scale.py)
# 7. docker compose down; docker-sandbox stop if this run started it (also on failure)
#
# Environment: DOCKER (the client; default: docker on PATH), DEPLOY_COMPOSE (the Compose CLI; default:
# `docker compose`, else `docker-compose`), DOCKER_SANDBOX (the tool, used only when no engine answers),
# DEPLOY_API_PORT (8000), DEPLOY_LB_PORT (8080) and DEPLOY_REPLICA_PORTS (8001,8002): the host ports the
# containers listen on; EXPECTATIONS (another expectations file); KEEP_ENGINE=1 (leave a started engine
# running afterwards, for local debugging).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"

SANDBOX=${DOCKER_SANDBOX:-$ROOT/../shared/tools/docker-sandbox}
DOCKER=${DOCKER:-$(command -v docker || echo /usr/bin/docker)}
PY=$ROOT/.venv/bin/python
[ -x "$PY" ] || PY=python3
PROJECT=tsdeploy
IMAGE=transformer-serving:cpu
LB_IMAGE=transformer-serving-lb:latest
export DEPLOY_API_PORT=${DEPLOY_API_PORT:-8000} DEPLOY_LB_PORT=${DEPLOY_LB_PORT:-8080}
export DEPLOY_REPLICA_PORTS=${DEPLOY_REPLICA_PORTS:-8001,8002}
API=http://127.0.0.1:$DEPLOY_API_PORT
LB=http://127.0.0.1:$DEPLOY_LB_PORT
EXPECTATIONS=${EXPECTATIONS:-harness/deploy/expectations.json}
export DOCKER_SANDBOX_LOG=${DOCKER_SANDBOX_LOG:-/tmp/docker-sandbox.log}

START=$SECONDS
declare -a TIMINGS=()
STEP=""; STEP_T0=0
step() {
  [ -z "$STEP" ] || TIMINGS+=("$(printf '%-40s %4ds' "$STEP" $((SECONDS - STEP_T0)))")
  STEP=$1; STEP_T0=$SECONDS
  printf '\n---- deploy: %s  [+%ds]\n' "$STEP" $((SECONDS - START))
}
fail() { echo "DEPLOY TEST FAILED: $*" >&2; exit 1; }

compose() {  # the Compose CLI on the real files + the CI override, rendered for host networking with the ports above
  "$PY" harness/deploy/compose.py -p "$PROJECT" "$@"
}

ENGINE_UP=0        # an engine answers: compose down at the end
SANDBOX_STARTED=0  # this run started it: stop it at the end
cleanup() {
  local rc=$?
  set +e
  if [ "$ENGINE_UP" = 1 ]; then
    if [ $rc -ne 0 ]; then
      echo "---- deploy: container logs (last 80 lines each) after the failure" >&2
      compose --profile scale logs --no-color --tail 80 >&2
    fi
    compose --profile scale down --remove-orphans -t 5 >/dev/null 2>&1
  fi
  if [ "$SANDBOX_STARTED" = 1 ] && [ "${KEEP_ENGINE:-0}" != 1 ]; then bash "$SANDBOX" stop; fi
  [ -z "$STEP" ] || TIMINGS+=("$(printf '%-40s %4ds' "$STEP" $((SECONDS - STEP_T0)))")
  echo
  echo "---- deploy: timings"
  printf '  %s\n' "${TIMINGS[@]}"
  printf '  %-40s %4ds\n' "total" $((SECONDS - START))
  if [ $rc -eq 0 ]; then echo "deploy: PASSED"; else echo "deploy: FAILED (exit $rc)" >&2; fi
  exit $rc
}
trap cleanup EXIT

wait_http() {  # URL SECONDS [container]: wait for a 200; fail early if the container has exited
  local url=$1 limit=$2 container=${3:-} t0=$SECONDS status
  until curl -fsS -o /dev/null --max-time 5 "$url" 2>/dev/null; do
    if [ -n "$container" ]; then
      status=$("$DOCKER" inspect -f '{{.State.Status}}' "$container" 2>/dev/null || echo missing)
      [ "$status" = running ] || fail "container $container is $status while waiting for $url"
    fi
    [ $((SECONDS - t0)) -lt "$limit" ] || fail "$url not 200 after ${limit}s"
    sleep 1
  done
  echo "$url: 200 after $((SECONDS - t0))s"
}

# ------------------------------------------------------------------------------------------------------
step "preflight"
for model in translator generator classifier; do
  [ -f "artifacts/$model/config.json" ] || fail "artifacts/$model/config.json missing: the image would serve nothing"
done
[ -f "$EXPECTATIONS" ] || fail "no expectations file $EXPECTATIONS"
command -v curl >/dev/null || fail "curl not found"

step "docker engine"
if "$DOCKER" info >/dev/null 2>&1; then
  echo "using the engine that answers $DOCKER"
else
  [ -f "$SANDBOX" ] || fail "no Docker engine answers \`$DOCKER info\`, and no docker-sandbox at $SANDBOX to start one (set DOCKER_SANDBOX)"
  SANDBOX_STARTED=1
  bash "$SANDBOX" start || fail "the Docker engine did not start (see $DOCKER_SANDBOX_LOG)"
  DOCKER=/usr/bin/docker  # Debian's client, matching the sandbox's engine
fi
ENGINE_UP=1
"$DOCKER" info --format 'engine {{.ServerVersion}}, storage {{.Driver}}' || fail "no Docker engine answers"
export DOCKER
if [ -z "${DEPLOY_COMPOSE:-}" ]; then
  if "$DOCKER" compose version >/dev/null 2>&1; then DEPLOY_COMPOSE="$DOCKER compose"; else DEPLOY_COMPOSE=docker-compose; fi
fi
export DEPLOY_COMPOSE
read -r -a COMPOSE_CLI <<< "$DEPLOY_COMPOSE"
"${COMPOSE_CLI[@]}" version || fail "no Compose CLI ($DEPLOY_COMPOSE)"
echo "ports: api $DEPLOY_API_PORT, load balancer $DEPLOY_LB_PORT, scale replicas $DEPLOY_REPLICA_PORTS"

step "compose config (every profile)"
for files in "docker-compose.yml" "docker-compose.yml docker-compose.gpu.yml"; do
  for profile in "" "--profile scale"; do
    args=(); for f in $files; do args+=(-f "$f"); done
    # shellcheck disable=SC2086
    "${COMPOSE_CLI[@]}" "${args[@]}" $profile config -q || fail "$DEPLOY_COMPOSE ${args[*]} $profile config"
    echo "valid: ${args[*]} $profile"
  done
done
compose --profile scale config -q || fail "CI override does not merge"
echo "valid: the CI override, rendered for host networking"
# The GPU image is not built here (its CUDA/cuDNN wheels are several GB): check what it would get.
"${COMPOSE_CLI[@]}" -f docker-compose.yml -f docker-compose.gpu.yml config \
  | "$PY" -c 'import sys, yaml
svc = yaml.safe_load(sys.stdin)["services"]["api"]
assert svc["build"]["args"]["ORT_VARIANT"] == "gpu", svc["build"]
assert svc["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
print("gpu override: ORT_VARIANT=gpu, nvidia device reserved")'
"$PY" deploy/requirements.py --variant gpu | grep -q '^onnxruntime-gpu\[cuda,cudnn\]==' || fail "gpu requirements"
! "$PY" deploy/requirements.py --variant gpu | grep -q '^onnxruntime==' || fail "gpu requirements keep onnxruntime"

step "docker build (CPU image)"
"$DOCKER" build --network host -t "$IMAGE" . || fail "docker build"

step "inspect image"
size=$("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE")
base=$("$DOCKER" image inspect -f '{{.Size}}' python:3.11-slim)
echo "image $IMAGE: $((size / 1000000)) MB (base python:3.11-slim here: $((base / 1000000)) MB; added by the Dockerfile: $(((size - base) / 1000000)) MB)"
[ "$("$DOCKER" image inspect -f '{{.Config.User}}' "$IMAGE")" = "app:app" ] || fail "image does not run as user app"
"$DOCKER" image inspect -f '{{json .Config.Healthcheck.Test}}' "$IMAGE" | grep -q '/health' || fail "no HEALTHCHECK on /health"
"$DOCKER" run --rm -i --network none "$IMAGE" python - <<'PY' || fail "image contents"
import importlib.util, os, shutil
from importlib import metadata
assert os.getuid() != 0, "runs as root"
assert importlib.util.find_spec("torch") is None, "torch is in the image"
assert importlib.util.find_spec("model") is None, "training code (model/) is in the image"
dists = {d.metadata["Name"].lower() for d in metadata.distributions()}
assert "onnxruntime" in dists and "onnxruntime-gpu" not in dists, sorted(dists)
for tool in ("gcc", "cc", "g++", "make"):
    assert shutil.which(tool) is None, f"compiler {tool} in the image"
assert not os.path.exists("/root/.cache/pip") and not os.path.exists("/opt/venv/bin/pip"), "pip or its cache in the image"
for name in ("translator", "generator", "classifier"):
    assert os.path.isfile(f"/app/artifacts/{name}/config.json"), name
print(f"uid {os.getuid()}, {len(dists)} distributions, no torch / compilers / pip; artifacts present")
PY

step "docker compose up (api) until /ready"
compose up -d api || fail "docker compose up"
CID=$(compose ps -q api)
[ -n "$CID" ] || fail "no api container"
wait_http "$API/ready" 300 "$CID"
t0=$SECONDS
until [ "$("$DOCKER" inspect -f '{{.State.Health.Status}}' "$CID")" = healthy ]; do
  [ $((SECONDS - t0)) -lt 60 ] || fail "compose healthcheck (/ready) never reported healthy"
  sleep 1
done
echo "compose healthcheck: healthy; read-only root: $("$DOCKER" inspect -f '{{.HostConfig.ReadonlyRootfs}}' "$CID")"

step "endpoints through the container"
"$PY" harness/deploy/e2e.py check --url "$API" --expectations "$EXPECTATIONS"

step "load balancer (nginx, profile scale)"
compose --profile scale build lb || fail "build of the load balancer image"
echo "image $LB_IMAGE: $(($("$DOCKER" image inspect -f '{{.Size}}' "$LB_IMAGE") / 1000000)) MB"
compose --profile scale up -d --no-deps lb || fail "docker compose up lb"
LB_CID=$(compose --profile scale ps -q lb)
"$DOCKER" exec "$LB_CID" nginx -t -c /tmp/nginx.conf || fail "nginx -t (the configuration the command wrote)"
wait_http "$LB/lb-health" 30 "$LB_CID"
"$PY" harness/deploy/e2e.py check --url "$LB" --expectations "$EXPECTATIONS" --quick
compose --profile scale stop lb >/dev/null

step "SIGTERM drains an in-flight generation"
"$PY" harness/deploy/e2e.py drain --url "$API" --expectations "$EXPECTATIONS" --container "$CID"
t0=$SECONDS
until [ "$("$DOCKER" inspect -f '{{.State.Status}}' "$CID")" = exited ]; do
  [ $((SECONDS - t0)) -lt 60 ] || fail "server still running $((SECONDS - t0))s after SIGTERM"
  sleep 0.5
done
code=$("$DOCKER" inspect -f '{{.State.ExitCode}}' "$CID")
echo "server exited with code $code, $((SECONDS - t0))s after the drained request completed"
[ "$code" = 0 ] || fail "server exit code $code after SIGTERM (expected 0: a clean drain)"
"$DOCKER" logs "$CID" 2>&1 | tail -8

# ---- issue 12: the reliability suite's load and SIGTERM sections against the container --------------------
# `api` again with a 5 s drain: 64 concurrent clients equal to solo answers; SIGTERM with streams in flight
# must exit 0 within the drain and end every stream with `done` or an `error` event (tests/reliability).
step "reliability suite against the container (load, SIGTERM)"
PROJECT="$PROJECT" PY="$PY" DOCKER="$DOCKER" API="$API" bash harness/reliability/container.sh \
  || fail "reliability suite against the container (harness/reliability/container.sh)"
# ---- end of issue 12 ------------------------------------------------------------------------------------

# ---- issue 14: the compose `scale` profile for real (harness/deploy/scale.py) -----------------------------
# api + 2 replicas behind nginx, each replica on its own port (host networking); 300 mixed requests through
# nginx, one replica stopped mid-load; every request must succeed, spread over all replicas; then down.
step "scale profile: api + 2 replicas behind nginx, one stopped mid-load"
"$PY" harness/deploy/scale.py --project "$PROJECT" || fail "scale profile (harness/deploy/scale.py)"
# ---- end of issue 14 ------------------------------------------------------------------------------------

step "docker compose down"
compose --profile scale down --remove-orphans -t 5
