# Two entry points for a fresh machine: `make demo` and `make test`. Both bootstrap what they need.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench vllm-env clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# vLLM lives in its own environment (its pins conflict with verl's), cached outside the checkout.
vllm-env: $(STAMP)
	$(BIN)/otel-rl vllm setup

# `make demo QUICK=1`: the shortened run (a few minutes) that the test suite also runs.
demo: $(STAMP) vllm-env
	$(BIN)/otel-rl demo $(if $(QUICK),--quick)

test: $(STAMP) vllm-env
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check otel_rl tests bench examples
	$(BIN)/ruff format --check otel_rl tests bench examples

bench: $(STAMP) vllm-env
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .otel_rl .pytest_cache
