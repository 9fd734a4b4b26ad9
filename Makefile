# Two commands do all the set-up: `make lab` opens the course, `make test` runs every check.
# Both create (or reuse) a virtual environment in .venv.
#   TORCH_SPEC   which torch to install first (default: a CPU-only release; a bare
#                `pip install torch` would pull a multi-GB CUDA build). GPU users on
#                Linux want exactly that: make lab TORCH_SPEC=torch
#   PYTHON       the interpreter that creates the venv (3.10 or newer)
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pagedkv-installed

.PHONY: lab test lint figures bench visualizer clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

visualizer: $(STAMP)
	$(PY) -m pagedkv visualize

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .

figures: $(STAMP)
	$(PY) -m pagedkv figures --out figures/

bench: $(STAMP)
	for script in benchmarks/bench_*.py; do $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV)
