#!/usr/bin/env bash
# Best effort: make a Chromium available for the browser test (tests/test_browser.py). Debian's
# `chromium` package is used because Playwright cannot download its own browser build offline.
# Idempotent and fast when Chromium is already there; never fails the caller: without Chromium the
# browser test skips and says why. An installed chromium-browser or Google Chrome (as on GitHub's Ubuntu
# runners) is used as it is. Usage: scripts/install_browser.sh [PATH/TO/python]
# COURSE_CHROMIUM=/path/to/chromium names a browser to use instead (nothing is installed then).
set -uo pipefail
PY=${1:-python3}

find_chromium() {
  local name
  for name in ${COURSE_CHROMIUM:-} chromium chromium-browser google-chrome google-chrome-stable; do
    if command -v "$name" >/dev/null 2>&1 && "$name" --version >/dev/null 2>&1; then command -v "$name"; return 0; fi
  done
  return 1
}

check_playwright() {
  if ! "$PY" -c 'import playwright.sync_api' >/dev/null 2>&1; then
    echo "browser: Playwright for Python is missing from $PY (it is in the course's test extra: make setup)"
  fi
}

if path=$(find_chromium); then
  echo "browser: $("$path" --version 2>/dev/null | head -n1) at $path"
  check_playwright
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "browser: no Chromium and no apt-get here; install Chromium yourself (or set COURSE_CHROMIUM)." \
       "The browser test will skip."
  check_playwright
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
else
  echo "browser: installing Chromium needs root: run 'sudo apt-get install chromium'. The browser test will skip."
  check_playwright
  exit 0
fi
if grep -qi '^ID=ubuntu' /etc/os-release 2>/dev/null; then
  echo "browser: note: on Ubuntu the chromium package is a snap wrapper, which does not run in containers"
fi

echo "browser: installing Debian's chromium with apt-get (once; a few minutes)"
export DEBIAN_FRONTEND=noninteractive
if timeout 900 "${SUDO[@]}" apt-get update -qq >/dev/null \
   && timeout 900 "${SUDO[@]}" apt-get install -y -qq chromium >/dev/null; then
  if path=$(find_chromium); then
    echo "browser: $("$path" --version 2>/dev/null | head -n1) installed at $path"
  else
    echo "browser: apt-get installed chromium but it does not start here. The browser test will skip."
  fi
else
  echo "browser: apt-get could not install chromium (no package index reachable?). The browser test will skip."
fi
check_playwright
exit 0
