#!/usr/bin/env bash
# The course's venv, made or repaired before anything is installed into it (`make setup` runs this first).
#   bash scripts/make_venv.sh PYTHON VENV
# - PYTHON must be Python 3.11 or newer (3.11 and 3.12 are tested) with its `venv` and `ensurepip` modules
#   (Debian and Ubuntu ship those apart, in python3-venv): otherwise this says what to install and how to
#   name another Python (`PYTHON=python3.12 make lab`), and makes nothing;
# - a VENV left half-made by a failed first set-up (no working python or pip in it, or one made by a Python
#   too old) is removed and made again; a working one is kept, with what it already holds (torch included).
set -uo pipefail
PYTHON=${1:?usage: make_venv.sh PYTHON VENV}
VENV=${2:?usage: make_venv.sh PYTHON VENV}
MIN=3.11          # pyproject.toml's requires-python (tests/test_packaging.py keeps them in step)
TESTED_MAX=3.12   # the newest Python the course's test sets use (README: Supported versions)
version_ok="import sys; sys.exit(0 if sys.version_info[:2] >= tuple(map(int, '$MIN'.split('.'))) else 1)"

say() { echo "set-up: $*" >&2; }

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$version_ok" 2>/dev/null \
   && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  exit 0  # a working venv: keep it and what it holds
fi

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  say "no '$PYTHON' on this machine. Install Python $MIN or $TESTED_MAX, then name it: PYTHON=python$TESTED_MAX make lab"
  exit 1
fi
have=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || {
  say "'$PYTHON' does not run. Name a working Python $MIN+: PYTHON=python$TESTED_MAX make lab"; exit 1; }
if ! "$PYTHON" -c "$version_ok"; then
  say "'$PYTHON' is Python $have; the course needs $MIN or newer ($MIN and $TESTED_MAX are tested)." \
      "Install one (Ubuntu 22.04: sudo apt install python3.11 python3.11-venv; macOS: brew install" \
      "python@$TESTED_MAX), then name it: PYTHON=python$TESTED_MAX make lab"
  exit 1
fi
if ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then
  say "'$PYTHON' (Python $have) lacks its venv/ensurepip modules, which Debian and Ubuntu ship apart:" \
      "sudo apt install python3-venv (or python$have-venv), then run make again"
  exit 1
fi
case "$have" in 3.11|3.12) ;; *) say "Python $have is newer than the tested $MIN-$TESTED_MAX: going on" ;; esac

if [ -e "$VENV" ]; then
  say "$VENV is half-made (a failed first set-up?): making it again"
  rm -rf "$VENV"
fi
if ! "$PYTHON" -m venv "$VENV"; then
  rm -rf "$VENV"  # never leave a half-made venv behind
  say "'$PYTHON -m venv $VENV' failed (above); on Debian or Ubuntu: sudo apt install python$have-venv"
  exit 1
fi
# The pip a venv starts with is the one its Python shipped (23.2 with Python 3.11); pip 26 resolves the course's
# ~180 packages about three times as fast (here: 18 s against 59 s). Offline it stays as it is.
"$VENV/bin/python" -m pip install --quiet --upgrade pip --retries 0 --timeout 15 >/dev/null 2>&1 \
  || say "pip not upgraded (no package index reachable?): going on with the venv's own"
pip_version=$("$VENV/bin/python" -m pip --version 2>/dev/null | cut -d' ' -f1-2)
echo "set-up: made $VENV with $("$VENV/bin/python" --version 2>&1), $pip_version"
