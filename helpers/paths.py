"""Where the course's files are and where a lesson writes what you open (lessons 03, 05-08).

`course_root()` finds the course's folder (its `scripts/`, `solutions/`, `benchmarks/`) from the installed
`helpers` package, never from the folder a notebook runs in: on Colab or Kaggle, or in your own copy of the
lessons, the working folder is not the course's. `output_dir(lesson)` is the folder where a lesson writes the
files you open afterwards (lesson 06's Perfetto trace, lesson 03's memory snapshot, lesson 07's checkpoints):
`outputs/<lesson>/` next to the notebook, so Jupyter Lab's file browser shows them (over SSH and in the
container too), or `$COURSE_OUTPUT_DIR/<lesson>/` when that is set (`make test` sets it to `build/outputs`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["ROOT_ENV", "OUTPUT_ENV", "course_root", "output_dir"]

ROOT_ENV = "COURSE_ROOT"  # names the course's folder explicitly (a non-editable install of helpers)
OUTPUT_ENV = "COURSE_OUTPUT_DIR"  # where lessons write their outputs instead of ./outputs
_MARKERS = ("pyproject.toml", "scripts", "notebooks")  # what a course folder holds


def _is_course(path: Path) -> bool:
    return all((path / m).exists() for m in _MARKERS) and (path / "helpers").is_dir()


def course_root() -> Path:
    """The course's folder (scripts/, solutions/, benchmarks/), found from the installed helpers (07, 08)."""
    named = os.environ.get(ROOT_ENV, "").strip()
    if named:
        root = Path(named).expanduser().resolve()
        if not _is_course(root):
            raise FileNotFoundError(
                f"{ROOT_ENV}={named!r} is not the course's folder (it needs {', '.join(_MARKERS)} and "
                f"helpers/): point {ROOT_ENV} at the folder you cloned, or unset it")
        return root
    package = Path(__file__).resolve().parent
    root = package.parent
    if not _is_course(root):
        raise FileNotFoundError(
            f"helpers is installed at {package}, outside a copy of the course (no scripts/ or notebooks/ "
            f"beside it: a non-editable `pip install`). Install the course editable from its folder "
            f"(`pip install -e '<course folder>[course]'`, as `make setup` and every lesson's set-up cell "
            f"do), or set {ROOT_ENV}=<course folder>")
    return root


def output_dir(lesson: str, *, fresh: bool = False) -> Path:
    """The folder (created) where `lesson` writes the files you open: ./outputs/<lesson>, or
    $COURSE_OUTPUT_DIR/<lesson>; `fresh=True` empties it first (lessons 03, 05-08)."""
    if not isinstance(lesson, str) or lesson in ("", ".", "..") or Path(lesson).name != lesson:
        raise ValueError(f"lesson must be a plain folder name such as '06_input_pipeline', got {lesson!r}")
    base = os.environ.get(OUTPUT_ENV, "").strip()
    folder = (Path(base).expanduser() if base else Path.cwd() / "outputs") / lesson
    if fresh and folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder.resolve()
