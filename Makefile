# The course's two commands (see README.md):
#   make lab    set everything up, then open Jupyter Lab on notebooks/ (127.0.0.1, token auth on)
#   make test   set everything up, then run every test (unit, scripts, nbval over every notebook)
# and `make course`, which executes every notebook headless into build/ (executed copies + HTML).
#
# Set-up is idempotent: .venv is created once and re-installed only when pyproject.toml changes.
# COURSE_TORCH=cpu|cuda|keep overrides the torch build (default: cuda where nvidia-smi sees a GPU).

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
STAMP    := $(VENV)/.course-installed
LAB_PORT ?= 8888
LAB_ARGS ?=
PYTEST_ARGS ?=
# `make test TEST_PROFILE=full` on a GPU runs the notebooks with their real sizes
TEST_PROFILE ?= smoke

.PHONY: setup lab test course browser clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/install_torch.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	bash scripts/install_torch.sh $(PY)
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $@

lab: $(STAMP)
	# Token authentication stays on; Jupyter prints the URL with the token. Remote box: see README (SSH tunnel).
	$(PY) -m jupyter lab --notebook-dir=notebooks --ServerApp.ip=127.0.0.1 --ServerApp.port=$(LAB_PORT) $(LAB_ARGS)

test: $(STAMP) browser
	COURSE_PROFILE=$(TEST_PROFILE) HF_HUB_OFFLINE=1 $(PY) -m pytest --nbval-lax --nbval-current-env $(PYTEST_ARGS) tests notebooks

course: $(STAMP)
	mkdir -p build
	$(PY) -m jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=-1 --output-dir build notebooks/*.ipynb
	$(PY) -m jupyter nbconvert --to html --output-dir build build/*.ipynb

# The browser test needs Debian's chromium; installing it is best effort (the test skips, saying why, without it).
browser:
	@bash scripts/install_browser.sh $(PY)

clean:
	rm -rf build .pytest_cache
