"""The tested version sets (`make test-matrix SET=...`) are what they say: each ci/constraints-<set>.txt pins
every package, the Colab set pins Colab's published versions, and the script, the constraints files and
docs/setup.md's table name the same versions and Python."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from hosted import IPYWIDGETS  # tests/hosted.py: the simulated Colab's ipywidgets

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "test_matrix.sh"
# Colab's package list of 2026-08-19 (Python 3.13.15; triton only on its GPU runtime): what the set must pin
COLAB = {"python": "3.13", "torch": "2.11.0", "transformers": "5.15.0", "triton": "3.6.0", "numpy": "2.1.3",
         "ipywidgets": "7.7.1"}


def _sets() -> dict[str, str]:
    """The sets scripts/test_matrix.sh knows -> the Python minor version each is built with."""
    return dict(re.findall(r"^  (\w+)\) want=(3\.\d+) ;;$", SCRIPT.read_text(), flags=re.M))


def _pins(name: str) -> dict[str, str]:
    """ci/constraints-<name>.txt as {package (lower case): version}; every line a comment or name==version."""
    pins: dict[str, str] = {}
    for n, line in enumerate((ROOT / "ci" / f"constraints-{name}.txt").read_text().splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][\w.-]*)==([\w.+!]+)", line)
        assert m, f"ci/constraints-{name}.txt line {n} is not name==version: {line!r}"
        key = re.sub(r"[-_.]+", "-", m[1]).lower()
        assert key not in pins, f"ci/constraints-{name}.txt pins {m[1]} twice"
        pins[key] = m[2]
    return pins


def _installed(name: str) -> str | None:
    """The version of `name` the venv imports (site-packages first; a copy vendored by setuptools, put on
    sys.path by a test that imported it, comes later), without its local tag (+cu130)."""
    try:
        return metadata.version(name).split("+")[0]
    except metadata.PackageNotFoundError:
        return None


def test_the_script_knows_the_colab_set() -> None:
    assert _sets() == {"floor": "3.11", "box": "3.12", "colab": COLAB["python"]}


@pytest.mark.parametrize("name", ["floor", "box", "colab"])
def test_each_set_pins_every_package_and_says_which_set_it_is(name: str) -> None:
    text = (ROOT / "ci" / f"constraints-{name}.txt").read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    pins = _pins(name)
    assert f"make test-matrix SET={name}" in header, f"ci/constraints-{name}.txt's header must name its set"
    assert f"Python {_sets()[name]}" in header, f"ci/constraints-{name}.txt's header names another Python"
    for pkg in ("torch", "transformers", "triton", "numpy", "ipywidgets", "jupyterlab", "pytest", "nbval"):
        assert pkg in pins, f"ci/constraints-{name}.txt does not pin {pkg}: it is not a pip freeze of the set"
    for pkg in ("torch", "transformers", "triton"):
        assert f"{pkg} {pins[pkg]}" in header, f"the header of ci/constraints-{name}.txt does not name {pkg}"
    assert "fast-transformers-course" not in pins, "the course itself is installed from the checkout (-e .)"


def test_the_colab_set_pins_colabs_published_versions() -> None:
    pins = _pins("colab")
    wrong = {pkg: (pins.get(pkg), want) for pkg, want in COLAB.items()
             if pkg != "python" and pins.get(pkg) != want}
    assert not wrong, f"ci/constraints-colab.txt differs from Colab's list (pinned, Colab's): {wrong}"
    assert IPYWIDGETS == f"ipywidgets=={pins['ipywidgets']}", "the simulated Colab (tests/hosted.py) differs"


def test_setup_docs_table_names_each_sets_versions() -> None:
    """docs/setup.md's "Supported versions" row of each set names its Python, torch, transformers, triton and
    numpy (major.minor) as the constraints file pins them, and the command that runs it."""
    doc = (ROOT / "docs" / "setup.md").read_text()
    for name, python in _sets().items():
        pins = _pins(name)
        run = "`make test-matrix`" if name == "floor" else f"`make test-matrix SET={name}`"
        row = (f"| {python} | {pins['torch']} | {pins['transformers']} | {pins['triton']} | "
               f"{'.'.join(pins['numpy'].split('.')[:2])} | {run} |")
        assert row in doc, f"docs/setup.md has no row ending {row!r}"


def test_an_unknown_set_is_refused_by_name() -> None:
    done = subprocess.run(["bash", str(SCRIPT), "colab2"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "floor, box or colab" in done.stderr, done.stderr


def test_a_matrix_venv_holds_its_set() -> None:
    """Run in a matrix venv (.venv-<set>), the installed versions are the set's pins: the file is the set as
    tested. Elsewhere (`make test`, the main .venv) there is nothing to compare."""
    name = Path(sys.prefix).name.removeprefix(".venv-")
    if name not in _sets():
        pytest.skip(f"not in a matrix venv ({Path(sys.prefix).name})")
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == _sets()[name]
    differ = {pkg: (v, _installed(pkg)) for pkg, v in _pins(name).items() if _installed(pkg) != v}
    assert not differ, (f"ci/constraints-{name}.txt is not what .venv-{name} holds (pinned, installed): "
                        f"{differ}")


def test_ci_runs_make_test_then_the_floor_set_and_fails_with_either(tmp_path: Path) -> None:
    """.ci/run runs the README's `make test`, then `make test-matrix SET=floor`, and fails when either fails
    (a `make` that records its arguments stands in; planted: each of the two fails in turn)."""
    calls = tmp_path / "calls"
    make = tmp_path / "make"
    make.write_text('#!/bin/sh\necho "$*" >> "$CALLS"\n[ "$*" != "$FAIL" ]\n')
    make.chmod(0o755)
    both = ["test", "test-matrix SET=floor"]
    for fail, ran, ok in (("", both, True), ("test", both[:1], False), (both[1], both, False)):
        calls.write_text("")
        env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}", "CALLS": str(calls),
               "FAIL": fail}
        done = subprocess.run(["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True,
                              timeout=60)
        assert calls.read_text().splitlines() == ran, (fail, calls.read_text())
        assert (done.returncode == 0) == ok, (fail, done.returncode, done.stderr)
