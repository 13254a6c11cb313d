"""Where the course's files are, and where a lesson writes what you open (lessons 03, 05-08).

What a lesson opens at run time ships inside the package, so an installed course (Colab, Kaggle, `pip
install`) has it too: the `torchrun` scripts (`course/scripts/`), the exercises' solutions
(`course/solutions/`) and the sample CSV (`course/sample_data/`). `checkout_root()` is the course's repository
when `course` runs from one (its `benchmarks/` results), else None.

`output_dir(lesson)` is the folder where a lesson writes the files you open afterwards: `outputs/<lesson>/`
next to the notebook, so Jupyter Lab's file browser shows them, or `$COURSE_OUTPUT_DIR/<lesson>/` when set.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["OUTPUT_ENV", "PACKAGE", "script", "solutions_dir", "sample_data", "checkout_root", "output_dir"]

OUTPUT_ENV = "COURSE_OUTPUT_DIR"  # where lessons write their outputs instead of ./outputs
PACKAGE = Path(__file__).resolve().parent  # course/, wherever it is installed


def script(name: str) -> Path:
    """The course's script `name` ("train_ddp", "finetune_bert", ...) in course/scripts/ (07, 08)."""
    path = PACKAGE / "scripts" / (name if name.endswith((".py", ".sbatch")) else f"{name}.py")
    if not path.is_file():
        known = sorted(p.stem for p in (PACKAGE / "scripts").glob("*.py") if p.stem != "__init__")
        raise FileNotFoundError(f"no script {name!r} in {path.parent}: use one of {', '.join(known)}")
    return path


def solutions_dir() -> Path:
    """The exercises' solutions, shipped in course/solutions/<lesson>/ (every lesson)."""
    return PACKAGE / "solutions"


def sample_data(name: str = "sample.csv") -> Path:
    """A file of the course's sample data: a CSV in the format your own data takes (06)."""
    return PACKAGE / "sample_data" / name


def checkout_root() -> Path | None:
    """The course's repository when the course runs from one (`make lab`'s editable install), else None
    (08)."""
    root = PACKAGE.parent
    return root if (root / "pyproject.toml").is_file() and (root / "benchmarks").is_dir() else None


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
