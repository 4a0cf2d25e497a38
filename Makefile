# The two commands of the README, plus the fast tier. Each creates .venv on first use (scripts/bootstrap.sh).
VENV ?= .venv
# pytest processes for `make test` (by file: a module's shared engine runs stay in one process); 0 = all in one process.
# Three were 7% faster on 2026-11-26 (26:15 against 28:22); on f9d1643 (2026-11-28) slower: 26:21 against 23:52 and
# 25:34, 46 min of CPU against 41 (three processes' engines contend for two cores)
TEST_WORKERS ?= 2
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
# Python may write .pyc files under these commands even where the shell forbids it (PYTHONDONTWRITEBYTECODE): the
# modules a command imports are then compiled once, not again in every process (scripts/bootstrap.sh)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: quickstart test test-fast lint env

## Main job: environment, bundled model, then HF vs vLLM on scenarios/quickstart.yaml with a verdict table.
quickstart: env
	parity models prepare
	parity run scenarios/quickstart.yaml

## Test suite: the fast tier, then real engines, servers, model and browser (see README for its duration).
test: env
	scripts/ensure_chromium.sh
	parity models prepare --engine-files
	ruff check .
	python -m pytest -q -p no:cacheprovider --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

## Fast tier: pure logic (verdict rules, noise floor, localisation, tables, validation, rendering), no engine loads.
test-fast: env
	python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) tests/unit $(PYTEST_ARGS)

lint: env
	ruff check .

env:
	LLM_PARITY_VENV=$(VENV) scripts/bootstrap.sh
