# paralab: `make lab` opens the lab, `make test` runs everything CI runs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install lab test lint clean

$(STAMP): pyproject.toml constraints-ci.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints-ci.txt -e ".[lab,dev]"
	touch $(STAMP)

install: $(STAMP)

lab: $(STAMP)
	$(BIN)/python -m paralab.lab

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check paralab tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache
