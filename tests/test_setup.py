"""An install that forgives (issue 31): `make setup` checks the Python and its venv/ensurepip first, naming
the fix, and the next `make` repairs a half-made .venv or resumes a failed first install, no manual clean-up.

Cheap: the Makefile and its set-up scripts run for real, in a temporary copy holding a stub project (no
dependencies, COURSE_TORCH=keep), so that pip installs in seconds what the course installs in minutes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
STUB = """[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "course-stub"
version = "0.0.1"
dependencies = [{deps}]

[project.optional-dependencies]
course = []
test = []

[tool.setuptools.packages.find]
include = ["helpers*"]
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for rel in ("Makefile", "scripts/make_venv.sh", "scripts/install_torch.sh"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(STUB.format(deps=""))
    return tmp_path


def _make(project: Path, python: Path | str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "MAKE"))}
    env["COURSE_TORCH"] = "keep"
    return subprocess.run(["make", "-s", "setup", f"PYTHON={python}"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=600)


def _wrapper(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


@pytest.mark.skipif(not BASE_PYTHON.exists(), reason=f"no {BASE_PYTHON} to make venvs from")
def test_a_failed_first_setup_is_followed_by_a_working_one(project: Path, tmp_path: Path) -> None:
    venv = project / ".venv"
    # 1. a Python too old: named, with the fix, and nothing made
    old = _wrapper(tmp_path / "python3.10", 'case "$2" in *print*) echo 3.10;; *) exit 1;; esac')
    done = _make(project, old)
    assert done.returncode != 0 and "is Python 3.10" in done.stderr, done.stderr
    assert "PYTHON=python3.12 make lab" in done.stderr
    assert not venv.exists()
    # 2. a Python without ensurepip (Debian without python3-venv): named, with the fix, nothing made
    stub = tmp_path / "no-ensurepip" / "ensurepip"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'ensurepip'\")\n")
    debian = _wrapper(tmp_path / "python3", f'PYTHONPATH={stub.parent} exec {BASE_PYTHON} "$@"')
    done = _make(project, debian)
    assert done.returncode != 0 and "apt install python3-venv" in done.stderr, done.stderr
    assert not venv.exists()
    # 3. what such a Python leaves when venv is run by hand: a .venv with a python and no pip
    subprocess.run([str(BASE_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True)
    done = _make(project, BASE_PYTHON)  # python3-venv installed: the plain `make` works now
    assert done.returncode == 0, done.stdout + done.stderr
    assert "half-made" in done.stderr and (venv / ".course-installed").exists()
    imported = subprocess.run([str(venv / "bin" / "python"), "-c", "import helpers"], cwd=tmp_path)
    assert imported.returncode == 0, "the repaired venv does not hold the installed project"
    # 4. a first install that failed at pip (a dependency that cannot be had) resumes in the same venv
    marker = venv / "kept.txt"
    marker.write_text("what the venv held before, torch included")
    (project / "pyproject.toml").write_text(STUB.format(deps='"missing @ file:///no/such/wheel.whl"'))
    assert _make(project, BASE_PYTHON).returncode != 0
    assert not (venv / ".course-installed").exists() or (venv / ".course-installed").stat().st_mtime < (
        project / "pyproject.toml").stat().st_mtime
    (project / "pyproject.toml").write_text(STUB.format(deps=""))
    done = _make(project, BASE_PYTHON)
    assert done.returncode == 0, done.stdout + done.stderr
    assert marker.exists() and "made" not in done.stderr + done.stdout, "the venv was made again"
