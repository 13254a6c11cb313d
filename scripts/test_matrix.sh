#!/usr/bin/env bash
# `make test-matrix [SET=floor|box]`: build one tested version set in its own venv (.venv-floor, .venv-box)
# from ci/constraints-<set>.txt, then run every test and notebook there (the browser test left out).
#   floor: Python 3.11, torch 2.7.1, transformers 4.52.4, triton 3.3.1 (the oldest supported)
#   box:   Python 3.12, torch 2.11.0, transformers 5.17.0, triton 3.6.0 (the reference GPU box)
# The newest set is the main .venv (`make test`). MATRIX_PYTHON overrides the interpreter the venv is
# made from; PYTEST_ARGS is passed on (e.g. PYTEST_ARGS="tests/test_packing.py" to run one file).
set -euo pipefail
cd "$(dirname "$0")/.."
SET=${1:-floor}
case "$SET" in
  floor) want=3.11 ;;
  box) want=3.12 ;;
  *) echo "SET must be floor or box, got '$SET'" >&2; exit 2 ;;
esac
PYTHON=${MATRIX_PYTHON:-python$want}
VENV=.venv-$SET
CONSTRAINTS=ci/constraints-$SET.txt
STAMP=$VENV/.matrix-installed
PY=$VENV/bin/python

if [ ! -f "$STAMP" ] || [ "$CONSTRAINTS" -nt "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  command -v "$PYTHON" >/dev/null || { echo "$SET needs Python $want: set MATRIX_PYTHON=/path/to/python$want" >&2; exit 2; }
  test -x "$PY" || "$PYTHON" -m venv "$VENV"
  "$PY" -m pip install --quiet --upgrade pip
  torch=$(grep -E '^torch==' "$CONSTRAINTS")
  # the CPU wheel first (no multi-GB CUDA libraries); the default index (CUDA build, runs on CPUs) if unreachable
  "$PY" -m pip install --quiet "$torch" --index-url https://download.pytorch.org/whl/cpu --retries 0 --timeout 15 \
    2>/dev/null || "$PY" -m pip install --quiet -c "$CONSTRAINTS" "$torch"
  "$PY" -m pip install --quiet -c "$CONSTRAINTS" -e ".[course,kernels,lab,test]"
  touch "$STAMP"
fi
"$PY" -c 'import sys, torch, transformers, numpy
try:
    import triton; tv = triton.__version__
except ImportError:
    tv = "none"
print(f"{sys.argv[1]} set: Python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
      f"{transformers.__version__}, triton {tv}, numpy {numpy.__version__}")' "$SET"
# shellcheck disable=SC2086
COURSE_PROFILE=smoke HF_HUB_OFFLINE=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$PY" -m pytest -q --nbval-lax \
  --nbval-current-env -p no:cacheprovider -k 'not browser' ${PYTEST_ARGS:-tests notebooks}
