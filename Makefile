# The course's two commands (see README.md):
#   make lab    set everything up, copy the lessons into my-lessons/ (yours, ignored by git), then open Jupyter
#               Lab there (127.0.0.1, token auth on)
#   make test   set everything up, then run every test (unit, scripts, nbval over every notebook); it
#               prints the 25 slowest tests, so that what a new lesson or exercise costs is seen
# and `make course`, which executes every notebook headless into build/ (executed copies + HTML), and
# `make site`, the whole course as a static site of a real run on this machine (build/site/index.html).
# On a GPU box (air-gapped is fine): `make gpu-check` (see docs/gpu-check.md), after `make gpu-wheels` here.
#
# Set-up is idempotent: .venv is created once and re-installed only when pyproject.toml changes. It checks the
# Python first (PYTHON=python3.12 names another) and repairs a .venv that a failed first set-up left half-made.
# COURSE_TORCH=cpu|cuda|keep overrides the torch build (default: cuda where nvidia-smi sees a GPU).

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.course-installed
LAB_PORT ?= 8888
LAB_ARGS ?=
# your copy of the lessons, where your edits live (in .gitignore); make lab copies new lessons into it
LESSONS  ?= my-lessons
# lessons tests/test_hosted.py runs as on Colab instead of nbval (the same checks; not run twice)
HOSTED_LESSONS := 00_setup 07_distributed
PYTEST_ARGS ?=
# `make test TEST_PROFILE=full` on a GPU runs the notebooks with their real sizes
TEST_PROFILE ?= smoke

.PHONY: setup lab test lint course site browser clean gpu-check gpu-wheels test-matrix release

setup: $(STAMP)

# pip byte-compiles what it installs one file at a time (about a minute here); compileall does the same on every
# core. The compiled files matter where PYTHONDONTWRITEBYTECODE is set (CI): there imports never write them.
# A file that does not compile is skipped, as pip skips it. Left out, as nothing here imports them: packages'
# own tests/ and transformers' model families other than the ones the course loads (a third of the bytes);
# imported anyway, such a file is compiled in memory, as without the set-up.
NOT_COMPILED := /tests/|/transformers/models/(?!(auto|bert|llama|qwen2|gpt2|align|encoder_decoder)/)
$(STAMP): pyproject.toml scripts/install_torch.sh scripts/make_venv.sh
	@bash scripts/make_venv.sh "$(PYTHON)" "$(VENV)"
	bash scripts/install_torch.sh $(PY)
	$(PY) -m pip install --quiet --no-compile -e ".[course,kernels,lab,test]"
	@$(PY) -m compileall -q -j 0 -x '$(NOT_COMPILED)' \
	  "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
	@touch $@

lab: $(STAMP)
	@$(PY) scripts/copy_lessons.py notebooks "$(LESSONS)"
	# Token authentication stays on; Jupyter prints the URL with the token. Remote box: see README (SSH tunnel).
	@# Root is the usual user in containers and on cloud GPU boxes, and Jupyter refuses it without --allow-root.
	@root=; if [ "$$(id -u)" = 0 ]; then root=--allow-root; \
	  echo "make lab: running as root (usual in containers and on cloud GPU boxes): adding --allow-root"; fi; \
	exec $(PY) -m jupyter lab --notebook-dir="$(LESSONS)" --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) \
	  $$root $(LAB_ARGS)

# What lessons write goes to build/outputs/ (not notebooks/outputs/); lessons in HOSTED_LESSONS run in
# tests/test_hosted.py (a simulated Colab, with nbval's checks) and nbval leaves them out.
test: $(STAMP) browser lint
	COURSE_PROFILE=$(TEST_PROFILE) HF_HUB_OFFLINE=1 COURSE_OUTPUT_DIR=$(CURDIR)/build/outputs \
	  $(PY) -m pytest --nbval-lax --nbval-current-env --durations=25 \
	  $(foreach l,$(HOSTED_LESSONS),--ignore=notebooks/$(l).ipynb) $(PYTEST_ARGS) tests notebooks

# The suite on one tested version set, in its own venv (.venv-$(SET), built once from
# ci/constraints-$(SET).txt): SET=floor (default; torch 2.7.1, transformers 4.52, Python 3.11), SET=box
# (torch 2.11, transformers 5.17, triton 3.6, Python 3.12) or SET=colab (Colab's versions: torch 2.11,
# transformers 5.15, numpy 2.1, ipywidgets 7.7, Python 3.13). Not part of `make test`: 9-20 min on 2 cores,
# plus the first build (a few GB); CI (.ci/run) runs SET=floor after `make test`. MATRIX_PYTHON=/path/to/
# python3.X when the set's Python is not on PATH (needed only to build the venv).
SET ?= floor
test-matrix:
	PYTEST_ARGS="$(PYTEST_ARGS)" HOSTED_LESSONS="$(HOSTED_LESSONS)" bash scripts/test_matrix.sh $(SET)

# ruff's linter (rules and the 110-character line in pyproject.toml) over code, tests and notebooks
lint: $(STAMP)
	$(PY) -m ruff check .

# How notebooks are executed headless. nbclient alone sometimes never returns from a cell, its kernel idle (a
# missed wake-up of its socket poll, jupyter/nbclient#312; seen here at lesson 01's attention explorer in 3 of
# 4 runs): course/nbrun.py's kernel manager polls in one-second slices, so a missed wake-up costs a second. A
# cell may still run an hour (as site/build.py allows), not forever. tests/test_nbrun.py runs this line.
EXECUTE := --execute --ExecutePreprocessor.timeout=3600 --ExecutePreprocessor.kernel_manager_class=course.nbrun.CourseKernelManager
course: $(STAMP)
	mkdir -p build
	$(PY) -m jupyter nbconvert --to notebook $(EXECUTE) --output-dir build notebooks/*.ipynb
	$(PY) -m jupyter nbconvert --to html --output-dir build build/*.ipynb

# The whole course as a static site (Sphinx + MyST-NB, the pydata/book theme installed by pip, nothing fetched):
# every lesson executed here first, every page stamped with this machine and the profile. SITE_PROFILE=full on
# a GPU; SITE_LESSONS=00,04 builds some lessons only. Opens as build/site/index.html.
SITE_PROFILE ?=
SITE_LESSONS ?=
site: $(STAMP)
	$(if $(SITE_PROFILE),COURSE_PROFILE=$(SITE_PROFILE)) $(PY) site/build.py --out build/site \
	  $(if $(SITE_LESSONS),--lessons $(SITE_LESSONS))

# The browser test needs Debian's chromium; installing it is best effort (the test skips, saying why, without it).
browser:
	@bash scripts/install_browser.sh $(PY)

# The prepared GPU check (docs/gpu-check.md). It runs with the box's own python3 and torch, offline: no set-up
# stamp, no pip from an index. ONLY=step,step reruns some steps; NOTEBOOKS=03,05 narrows the notebooks step;
# DRY_RUN=1 prints the plan and any problem (a missing plugin or wheel, a network call, a GPU test no step
# runs); SCALE=2 doubles every time limit (a slower GPU than an H200); GPU_WHEELS=<folder> holds the wheels
# (default .whl); GPU_CHECK_OUT=<folder> is where it writes (default build/gpu-check).
ONLY ?=
SCALE ?=
NOTEBOOKS ?=
DRY_RUN ?=
GPU_WHEELS ?=
gpu-check:
	$(if $(GPU_CHECK_OUT),GPU_CHECK_OUT=$(GPU_CHECK_OUT)) $(PYTHON) scripts/gpu_check.py $(if $(ONLY),--only $(ONLY)) \
	  $(if $(NOTEBOOKS),--notebooks $(NOTEBOOKS)) $(if $(SCALE),--scale $(SCALE)) \
	  $(if $(GPU_WHEELS),--wheels $(GPU_WHEELS)) $(if $(filter-out 0,$(DRY_RUN)),--dry-run)

# Wheels the GPU box lacks, for Python 3.12 manylinux x86-64, into .whl/ (ignored; carried to the box), plus
# .whl/bert-standin/ (BERT config + tokenizer, no weights). Needs the package index; prints the set's size.
gpu-wheels: $(STAMP)
	$(PY) scripts/gpu_check.py --make-wheels

# A release: `make release VERSION=0.2.0` sets the version and the tag v0.2.0 in pyproject.toml,
# helpers.__version__, CITATION.cff, every lesson's install cell and badges and README.md's links, then commits
# and tags it (CHANGELOG.md must have a "## [0.2.0]" section first). Push with `git push origin main v0.2.0`.
VERSION ?=
release: $(STAMP)
	@test -n "$(VERSION)" || { echo "make release: name the version, e.g. make release VERSION=0.2.0"; exit 2; }
	$(PY) scripts/course_release.py --release $(VERSION) --tag

clean:
	rm -rf build .pytest_cache
