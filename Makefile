# paralab: `make lab` opens the lab, `make test` runs everything CI runs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install lab test lint gpu-check book clean

$(STAMP): pyproject.toml constraints-ci.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints-ci.txt -e ".[lab,dev,book]"
	touch $(STAMP)

install: $(STAMP)

# JupyterLab on notebooks/, bound to 127.0.0.1 with a token, configured by lab/ (see
# lab/jupyter_server_config.py). Extra jupyter options: make lab LAB_ARGS="--port=8899 --no-browser".
# A non-loopback --ip or an empty token is refused (lab/guard.py) unless you opt in explicitly:
# make lab LAB_ARGS="--ip=0.0.0.0" PARALAB_LAB_ALLOW_REMOTE=1 (or PARALAB_LAB_ALLOW_NO_TOKEN=1).
LAB_ARGS ?=
lab: $(STAMP)
	JUPYTER_CONFIG_PATH="$(CURDIR)/lab$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}" $(BIN)/jupyter lab $(LAB_ARGS)

# Lint first (ruff, lines of 110 characters at most), so that a long line fails CI too.
test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Every strategy on the visible GPUs (bf16, recomputation on) and the CUDA tests; says so and exits 0
# on a machine without CUDA.
gpu-check: $(STAMP)
	$(BIN)/python -m paralab.gpu_check

# Every notebook executed and laid out as a static HTML site in book/_build (open index.html): figures
# interactive, widgets as snapshots with a link to the live notebook, and gallery.html, every figure the
# notebooks draw on one page (runs every notebook: minutes). Some notebooks only, for their pages and
# gallery: make book BOOK_ARGS="--only 07_elastic 08_planning_at_scale".
BOOK_ARGS ?=
book: $(STAMP)
	$(BIN)/python book/build.py $(BOOK_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check paralab tests benchmarks book docs

clean:
	rm -rf $(VENV) .pytest_cache book/_build
