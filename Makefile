# The two commands of the README. Both create .venv on first use (scripts/bootstrap.sh).
VENV ?= .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: quickstart test env

## Main job: environment, bundled model, then HF vs vLLM on scenarios/quickstart.yaml with a verdict table.
quickstart: env
	parity models prepare
	parity run scenarios/quickstart.yaml

## Test suite (real engines, servers, model and browser; about 30 minutes on 2 cores).
test: env
	scripts/ensure_chromium.sh
	parity models prepare
	python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

env:
	LLM_PARITY_VENV=$(VENV) scripts/bootstrap.sh
