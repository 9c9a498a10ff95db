# ferrymq developer commands. `make demo` and `make test` are the README's two commands.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export HYPOTHESIS_PROFILE ?= ci

.PHONY: setup test lint unit bench bench-store demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,spark,bench]'
	touch $(STAMP)

lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/pytest -q -p no:cacheprovider

unit: setup
	$(BIN)/pytest -q tests/unit

bench: bench-store

bench-store: setup
	$(BIN)/ferry bench store

demo: setup
	$(BIN)/ferry demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
