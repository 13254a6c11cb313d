#!/usr/bin/env bash
# `make test-matrix [SET=floor|box|colab]`: build one tested version set in its own venv (.venv-<set>)
# from ci/constraints-<set>.txt, then run every test and notebook there (the browser test left out).
#   floor: Python 3.11, torch 2.7.1, transformers 4.52.4, triton 3.3.1 (the oldest supported)
#   box:   Python 3.12, torch 2.11.0, transformers 5.17.0, triton 3.6.0 (the reference GPU box)
#   colab: Python 3.13, torch 2.11.0, transformers 5.15.0, triton 3.6.0, numpy 2.1.3, ipywidgets 7.7.1
#          (Colab's package list of 2026-08-19)
# The newest set is the main .venv (`make test`). MATRIX_PYTHON overrides the interpreter the venv is
# made from; PYTEST_ARGS is passed on (e.g. PYTEST_ARGS="tests/test_packing.py" to run one file).
# HOSTED_LESSONS (the Makefile's) are left out of nbval: tests/test_hosted.py runs them, as in `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
SET=${1:-floor}
case "$SET" in
  floor) want=3.11 ;;
  box) want=3.12 ;;
  colab) want=3.13 ;;
  *) echo "SET must be floor, box or colab, got '$SET'" >&2; exit 2 ;;
esac
PYTHON=${MATRIX_PYTHON:-python$want}
VENV=.venv-$SET
CONSTRAINTS=ci/constraints-$SET.txt
STAMP=$VENV/.matrix-installed
PY=$VENV/bin/python

if [ ! -f "$STAMP" ] || [ "$CONSTRAINTS" -nt "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  if [ ! -x "$PY" ]; then
    command -v "$PYTHON" >/dev/null || {
      echo "$SET needs Python $want: set MATRIX_PYTHON=/path/to/python$want" >&2; exit 2; }
    "$PYTHON" -m venv "$VENV"
  fi
  have=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [ "$have" = "$want" ] || {
    echo "$VENV is Python $have, the $SET set needs $want: remove $VENV, set MATRIX_PYTHON" >&2; exit 2; }
  "$PY" -m pip install --quiet --upgrade pip
  # what building the course needs (pyproject.toml's [build-system] requires: setuptools >= 77, for the licence
  # as an SPDX expression), in the set's pinned version: tests/test_install_split.py builds the package with
  # this venv's own setuptools, without build isolation, and a venv of Python 3.11 starts with setuptools 65
  build=$("$PY" -c 'import tomllib
print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
  # shellcheck disable=SC2086
  "$PY" -m pip install --quiet -c "$CONSTRAINTS" $build
  torch=$(grep -E '^torch==' "$CONSTRAINTS")
  # the CPU wheel first (no multi-GB CUDA libraries); the default index (CUDA build, runs on CPUs) if unreachable
  "$PY" -m pip install --quiet "$torch" --index-url https://download.pytorch.org/whl/cpu --retries 0 --timeout 15 \
    2>/dev/null || "$PY" -m pip install --quiet -c "$CONSTRAINTS" "$torch"
  "$PY" -m pip install --quiet -c "$CONSTRAINTS" -e ".[course,kernels,lab,test]"
  touch "$STAMP"
fi
"$PY" -c 'import sys, torch, transformers, numpy, ipywidgets
try:
    import triton; tv = triton.__version__
except ImportError:
    tv = "none"
print(f"{sys.argv[1]} set: Python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
      f"{transformers.__version__}, triton {tv}, numpy {numpy.__version__}, "
      f"ipywidgets {ipywidgets.__version__}")' "$SET"
# Two tests hold for the main .venv's versions only: the newest set's pins (ci/constraints-newest.txt;
# tests/test_version_sets.py compares this set with its own file instead), and the GPU box's wheel list,
# pinned to the main .venv's Jupyter stack (another ipywidgets, such as Colab's 7.7, needs other packages).
ignore=(--deselect tests/test_packaging.py::test_the_readmes_library_install_takes_the_tested_set
        --deselect tests/test_gpu_check.py::test_wheel_list_is_one_version_each_and_covers_what_the_box_lacks)
if [ -z "${PYTEST_ARGS:-}" ]; then
  for lesson in ${HOSTED_LESSONS:-}; do ignore+=("--ignore=notebooks/$lesson.ipynb"); done
fi
# --durations=25: the slowest tests, as `make test` prints them (what the floor's run in CI costs)
# shellcheck disable=SC2086
COURSE_PROFILE=smoke HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$PY" -m pytest -q --nbval-lax \
  --nbval-current-env --durations=25 -p no:cacheprovider -k 'not browser' "${ignore[@]}" ${PYTEST_ARGS:-tests notebooks}
