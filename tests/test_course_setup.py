"""course_setup: the check every lesson's install cell runs (issues 38, 40). It names a `helpers` of the
learner's that hides the course's, installs triton only for the lesson that runs Triton kernels, and says in
one line what it found."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import course_setup

ROOT = Path(__file__).resolve().parents[1]


def _check_in(folder: Path, lesson: str = "00_setup") -> subprocess.CompletedProcess:
    """course_setup.check run by a fresh Python whose working folder is `folder` (a notebook's folder: the
    kernel puts it first on sys.path)."""
    code = f"import sys; sys.path.insert(0, ''); import course_setup; course_setup.check({lesson!r})"
    return subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True,
                          timeout=60)


def test_the_course_as_installed_passes_with_one_line(tmp_path):
    done = _check_in(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("set-up: course ") and "torch " in lines[0], lines


@pytest.mark.parametrize("mine", ["helpers.py", "helpers/__init__.py"])
def test_a_helpers_of_yours_beside_the_notebook_is_named(tmp_path, mine):
    (tmp_path / mine).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / mine).write_text("def load(): ...\n")
    done = _check_in(tmp_path)
    assert done.returncode != 0
    shadow = tmp_path / mine if mine.endswith(".py") and "/" not in mine else tmp_path / "helpers"
    assert "CourseSetupError" in done.stderr and str(shadow) in done.stderr, done.stderr
    assert "Rename yours" in done.stderr and "Restart" in done.stderr, done.stderr


def test_without_the_check_the_shadow_shows_later_as_a_puzzle(tmp_path):
    """What the learner saw before the check (issue 40): the next cell's import fails far from the cause."""
    (tmp_path / "helpers.py").write_text("def load(): ...\n")
    code = "import sys; sys.path.insert(0, ''); from helpers.core.hub import hub_offline"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert "No module named 'helpers.core'" in done.stderr and str(tmp_path) not in done.stderr


class _Pip:
    """A stand-in for subprocess.run: records the pip command instead of downloading 270 MiB."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def __call__(self, cmd, **kwargs):
        self.commands.append(list(cmd))
        return subprocess.CompletedProcess(cmd, 0, "", "")


def _without_triton(monkeypatch) -> _Pip:
    real = course_setup.importlib.util.find_spec
    monkeypatch.setattr(course_setup.importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    pip = _Pip()
    monkeypatch.setattr(course_setup.subprocess, "run", pip)
    monkeypatch.setattr(course_setup.sys, "platform", "linux")
    return pip


def test_on_a_cpu_runtime_only_lesson_01_installs_triton(monkeypatch, capsys):
    pip = _without_triton(monkeypatch)
    for lesson in ("00_setup", "02_mixed_precision", "07_distributed"):
        course_setup.check(lesson)
    assert pip.commands == [], "a lesson without Triton kernels installed triton"
    course_setup.check("01_attention")
    assert len(pip.commands) == 1 and pip.commands[0][-1].startswith("triton>="), pip.commands
    assert pip.commands[0][:3] == [sys.executable, "-m", "pip"]  # the kernel's own pip
    assert "installed triton>=" in capsys.readouterr().out


def test_a_notebook_of_another_release_is_told(capsys):
    course_setup.check("00_setup", release=course_setup.RELEASE)
    assert "this notebook is from release" not in capsys.readouterr().out
    course_setup.check("00_setup", release="v0.0.1")
    out = capsys.readouterr().out
    assert f"from release v0.0.1 but the installed course is {course_setup.RELEASE}" in out, out
