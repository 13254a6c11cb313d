"""Each lesson's own parameters and sizes cells, run under a faked GPU class (tests/fakegpu.py): the decisions
a lesson makes on a GPU (sizes, precision, what it skips), made here without one.

    from lesson_sizes import LESSONS, decide   # tests/ is on sys.path under pytest

    ns = decide("02_mixed_precision", "T4", monkeypatch)   # the namespace after the two cells ran
    ns["FIT"].line(), ns["BATCH"], ns["AUTOCAST_MODES"]

The cells are read from the notebooks (never a copy): the `parameters` cell, then the cell tagged `sizes`
after it, executed in one namespace as a kernel would. They allocate nothing on the device, so a faked GPU
is enough; where a cell would, the fake raises ("Torch not compiled with CUDA enabled") and the test fails.
`edit` replaces text in the sizes cell first: how a test plants a bug in a lesson's decision code.
`tests/test_gpu_matrix.py` checks the decisions; `scripts/gpus_doc.py` writes them to docs/gpus.md.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from fakegpu import fake_gpu

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
LESSONS = tuple(p.stem for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")))
# what a cell may set in the process environment (os.environ.setdefault, os.environ[...] = ...): put back
ENV_TOUCHED = ("TRITON_INTERPRET", "TORCHINDUCTOR_CACHE_DIR", "TOKENIZERS_PARALLELISM", "COURSE_PROFILE")


def _tags(cell: dict[str, Any]) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def decision_cells(lesson: str) -> tuple[str, str]:
    """(parameters cell, sizes cell) sources of `lesson`; the sizes cell is the code cell right after."""
    cells = json.loads((NOTEBOOKS / f"{lesson}.ipynb").read_text(encoding="utf-8"))["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    at = next((i for i, c in enumerate(code) if "parameters" in _tags(c)), None)
    if at is None or at + 1 >= len(code) or "sizes" not in _tags(code[at + 1]):
        raise AssertionError(f"{lesson}: the code cell after the `parameters` cell must be tagged `sizes`")
    return "".join(code[at]["source"]), "".join(code[at + 1]["source"])


def run_cells(lesson: str, *, profile: str | None = None, edit: tuple[str, str] | None = None,
              tmp: Path | None = None) -> dict[str, Any]:
    """Execute `lesson`'s parameters and sizes cells in a fresh namespace (a kernel's globals); `profile`
    plays papermill's injected `PROFILE = ...`. The printed line is in ns["_printed"]."""
    params, sizes = decision_cells(lesson)
    if edit is not None:
        old, new = edit
        assert old in sizes, f"{lesson}: the sizes cell has no {old!r} to plant a bug in"
        sizes = sizes.replace(old, new)
    ns: dict[str, Any] = {"__name__": "__main__"}
    out = io.StringIO()
    saved = {k: os.environ.get(k) for k in ENV_TOUCHED}
    old_tmp = tempfile.tempdir
    tempfile.tempdir = str(tmp) if tmp is not None else old_tmp  # a cell's mkdtemp: in the test's folder
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(params, f"{lesson}.ipynb:parameters", "exec"), ns)
            if profile is not None:  # papermill's injected-parameters cell
                exec(f"PROFILE = {profile!r}", ns)
            exec(compile(sizes, f"{lesson}.ipynb:sizes", "exec"), ns)
    finally:
        tempfile.tempdir = old_tmp
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    ns["_printed"] = out.getvalue()
    return ns


def decide(lesson: str, gpu: str, monkeypatch: pytest.MonkeyPatch, *, profile: str | None = None,
           edit: tuple[str, str] | None = None, tmp: Path | None = None) -> dict[str, Any]:
    """`lesson`'s decisions on the GPU class `gpu` (a key of fakegpu.GPU_CLASSES), $COURSE_PROFILE unset."""
    fake_gpu(monkeypatch, gpu)
    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    return run_cells(lesson, profile=profile, edit=edit, tmp=tmp)
