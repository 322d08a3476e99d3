# make test   create .venv if missing, install the project with its train and dev extras, run pytest
# make run    install the server's own dependencies and start it on http://localhost:8000
# make e2e    build the Docker image and test the real container (needs ../shared/tools/docker-sandbox
#             or a running Docker engine); this is the second half of .ci/run
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help test run e2e docker-build up down clean-venv

help:
	@sed -n 's/^# \{0,1\}//p' $(firstword $(MAKEFILE_LIST)) | sed -n '1,4p'

$(PY):
	$(PYTHON) -m venv $(VENV)

# Stamp files: reinstall only when pyproject.toml changes.
$(VENV)/.installed-dev: pyproject.toml | $(PY)
	$(PY) -m pip install -e '.[train,dev]'
	touch $@ $(VENV)/.installed-base

$(VENV)/.installed-base: pyproject.toml | $(PY)
	$(PY) -m pip install -e .
	touch $@

test: $(VENV)/.installed-dev
	$(PY) -m pytest $(PYTEST_ARGS)

run: $(VENV)/.installed-base
	$(PY) -m service

e2e: $(VENV)/.installed-dev
	bash tests/deploy/run.sh

docker-build:
	docker build -t transformer-serving:cpu .

up:
	docker compose up -d

down:
	docker compose down

clean-venv:
	rm -rf $(VENV)
