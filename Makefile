# Both entry points bootstrap .venv from nothing; the stamp keeps reruns fast.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
EXTRAS ?= dev,redis

.PHONY: up test lint bench chaos reliability gpu-check redis-server bench-tools clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $(STAMP)

# Debian's redis-server backs the Redis rate-limit tests; the tests start it themselves.
redis-server:
	@command -v redis-server >/dev/null || { \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null; }

# wrk drives the gateway benchmark.
bench-tools:
	@command -v wrk >/dev/null || { \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk) >/dev/null; }

up: $(STAMP)
	$(VENV)/bin/modelyard up

test: $(STAMP) redis-server
	$(PY) -m pytest -q -p no:cacheprovider

# Style, types and the layering contracts in pyproject.toml ([tool.mypy], [tool.importlinter]).
lint: $(STAMP)
	$(VENV)/bin/ruff check modelyard extproc adapters kernels ratelimit controlplane devstack gpuagent tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

bench: $(STAMP) redis-server bench-tools
	$(PY) bench/run_all.py

# On a CUDA machine: the gpu extra (CuPy), every test marked gpu, and the kernel benchmark.
gpu-check: $(STAMP)
	$(PY) -m pip install -q -e '.[dev,redis,gpu]'
	$(PY) -m pytest -q -m gpu -rs tests
	$(PY) bench/bench_kernels.py --gpu

clean:
	rm -rf $(VENV) build *.egg-info

# Fault injection on real stacks under load, long variant (the short one runs in `make test`).
chaos: $(STAMP) redis-server bench-tools
	MODELYARD_CHAOS=long $(PY) -m pytest -q -p no:cacheprovider -m chaos tests/chaos

# The long chaos run, its figures written to docs/reliability.md.
reliability: $(STAMP) redis-server bench-tools
	$(PY) bench/reliability.py
