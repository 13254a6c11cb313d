"""Each lesson's own parameters and sizes cells, run under a faked GPU class (tests/fakegpu.py): the decisions
a lesson makes on a GPU (sizes, precision, what it skips), made here without one.

    from lesson_sizes import LESSONS, decide   # tests/ is on sys.path under pytest

    ns = decide("02_mixed_precision", "T4", monkeypatch)   # the namespace after the two cells ran
    ns["FIT"].line(), ns["BATCH"], ns["AUTOCAST_MODES"]

The cells are read from the notebooks (never a copy): the `parameters` cell, then the cell tagged `sizes`
after it, executed in one namespace as a kernel would. They allocate nothing on the device, so a faked GPU
is enough; where a cell would, the fake raises ("Torch not compiled with CUDA enabled") and the test fails.
`edit` replaces text in the sizes cell first ((old, new) pairs): how a test plants a bug in a lesson's
decision code.
`tests/test_gpu_matrix.py` checks the decisions; `scripts/gpus_doc.py` writes them to docs/gpus.md.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import tempfile
from collections.abc import Sequence
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


Edit = Sequence[tuple[str, str]]  # (old, new) replacements in the sizes cell: a planted bug


def run_cells(lesson: str, *, profile: str | None = None, edit: Edit = (), tmp: Path | None = None,
              ns: dict[str, Any] | None = None) -> dict[str, Any]:
    """Execute `lesson`'s parameters and sizes cells in a fresh namespace (a kernel's globals), or in `ns`
    (a second Run All in the same kernel); `profile` plays papermill's injected `PROFILE = ...`. The
    printed line is in ns["_printed"]."""
    params, sizes = decision_cells(lesson)
    for old, new in edit:
        assert old in sizes, f"{lesson}: the sizes cell has no {old!r} to plant a bug in"
        sizes = sizes.replace(old, new)
    ns = ns if ns is not None else {"__name__": "__main__"}
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
           edit: Edit = (), tmp: Path | None = None) -> dict[str, Any]:
    """`lesson`'s decisions on the GPU class `gpu` (a key of fakegpu.GPU_CLASSES), $COURSE_PROFILE unset."""
    fake_gpu(monkeypatch, gpu)
    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    return run_cells(lesson, profile=profile, edit=edit, tmp=tmp)


@functools.cache
def decisions(lesson: str, gpu: str) -> dict[str, Any]:
    """`decide` with the default profile, made once per process (the matrix and docs/gpus.md share it), and
    the MFU peaks on that class: "_mfu" (per precision it runs) and "_mfu_peak" (the one MFU divides by)."""
    from helpers import roofline
    from helpers.precision import PRECISIONS, precision_runs

    with pytest.MonkeyPatch.context() as mp:
        ns = decide(lesson, gpu, mp)
        ns["_mfu"] = {p: roofline.peak_flops("cuda", p) for p in PRECISIONS if precision_runs(p, "cuda")}
        ns["_mfu_peak"] = roofline.mfu_peak("cuda")
    return ns


@functools.cache
def plan(gpu: str) -> dict[str, str | None]:
    """`ladder_plan` made once per process."""
    with pytest.MonkeyPatch.context() as mp:
        return ladder_plan(gpu, mp)


# --- the ladder's plan on a faked GPU --------------------------------------------------------------------

def ladder_plan(gpu: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str | None]:
    """Each rung of helpers.ladder.RUNGS, added to the stack below it (cumulative), checked by RunSpec.check
    on the faked GPU: rung -> None (runs) or the reason it is skipped. The one probe that runs a kernel (FP8's
    matmul) cannot run on a fake: it is answered yes, so only the capability decides."""
    from helpers import compat, ladder

    fake_gpu(monkeypatch, gpu)
    monkeypatch.setattr(compat, "scaled_mm_supports", lambda device, rowwise: (True, "faked: runs"))
    plan, stack = {}, ladder.BASELINE
    for rung in ladder.RUNGS:
        candidate = rung.on(stack)
        try:
            candidate.check("cuda")
        except ValueError as err:  # a reason, never another exception
            plan[rung.name] = str(err)
            continue
        plan[rung.name], stack = None, candidate
    return plan


# --- docs/gpus.md ------------------------------------------------------------------------------------------

DOC = ROOT / "docs" / "gpus.md"
# SDPA's choice for fp16/bf16 inputs: torch's priority order is flash, memory-efficient, math, cuDNN
# (torch._C._get_sdp_priority_order() in torch 2.13); aten's sdp_utils.cpp accepts flash on sm80-sm121 only
SDPA_SOURCE = ("torch 2.13 tries flash, memory-efficient, math, cuDNN in that order "
               "(`torch._C._get_sdp_priority_order()`); flash needs sm_80 to sm_121 and fp16/bf16 "
               "(`sdp_utils.cpp`)")


def _sdpa(capability: tuple[int, int]) -> str:
    return "flash" if (8, 0) <= capability <= (12, 1) else "memory-efficient"


def _cut(fit: Any) -> str:
    return ", ".join(f"{k} {v}/{full}" for k, (v, full) in fit.shrunk().items()) or "full"


def render_gpus_doc(decisions: Any, plans: Any, classes: Sequence[str]) -> str:
    """docs/gpus.md from `decisions(lesson, gpu)` (a namespace after the lesson's cells ran) and `plans(gpu)`
    (ladder_plan's answer): the page `scripts/gpus_doc.py` writes and the matrix test compares."""
    from fakegpu import GPU_CLASSES

    from helpers.sizing import MARGIN

    lines = [
        "# What each GPU gets, lesson by lesson",
        "",
        "Generated by `python scripts/gpus_doc.py` from the lessons' own parameters and sizes cells, run on "
        "a CPU under each faked GPU class (`tests/fakegpu.py`, `tests/lesson_sizes.py`); "
        "`tests/test_gpu_matrix.py` checks the same decisions and fails when this page is not current. The "
        "sizes are what the `fit` profile (the default on a GPU) chooses so that every step's *estimated* "
        f"peak memory stays {MARGIN:.0%} below the device's memory: estimated, not measured on these GPUs. "
        "`full` means the lesson's full sizes; "
        "`BATCH 16/64` means 16 of the full 64. `PROFILE = \"full\"` keeps the full sizes where they fit and "
        "is refused, with the memory each step needs, where they do not.",
        "",
        "## The GPU classes",
        "",
        "| class | torch reports | sm | memory GiB | trains in | SDPA (fp16/bf16), expected | FP8 | "
        "max-autotune's Triton GEMMs | MFU's peak |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for gpu in classes:
        g = GPU_CLASSES[gpu]
        ns = decisions("00_setup", gpu)
        peak = ns["_mfu_peak"]
        count = f" ×{g.count}" if g.count > 1 else ""
        sm, gib = f"{g.capability[0]}.{g.capability[1]}", f"{g.total_memory / 2**30:.1f}"
        lines.append(
            f"| {gpu} | {g.name}{count} | {sm} | {gib} | "
            f"{ns['FIT'].precision} | {_sdpa(g.capability)} | {'yes' if g.capability >= (8, 9) else 'no'} | "
            f"{'yes' if g.sms >= 68 else f'no ({g.sms} SMs < 68)'} | "
            f"{peak.precision} {peak.flops / 1e12:,.1f} TFLOP/s |")
    lessons = list(LESSONS)
    lines += ["", "SDPA: " + SDPA_SOURCE + "; lesson 01 probes what runs. FP8 from compute capability 8.9 "
              "(`helpers.fp8.fp8_capable`); max-autotune's Triton GEMM templates from 68 SMs (`is_big_gpu` "
              "in `torch/_inductor/utils.py`, torch 2.13); MFU's peak: `helpers.roofline.mfu_peak`, the "
              "fastest dense datasheet rate among fp32, fp16 and bf16 (sources: `GPU_PEAK_FLOPS`).",
              "", "## Sizes per lesson (fit profile)", "",
              "| class | " + " | ".join(lesson[:2] for lesson in lessons) + " |",
              "|---|" + "---|" * len(lessons)]
    for gpu in classes:
        cuts = (_cut(decisions(lesson, gpu)["FIT"]) for lesson in lessons)
        lines.append(f"| {gpu} | " + " | ".join(cuts) + " |")
    lines += ["", "## What changes or is skipped, and why", "",
              "| class | 02 mixed precision | 05 max-autotune | 07 DDP/FSDP on GPUs | 08 rungs skipped |",
              "|---|---|---|---|---|"]
    for gpu in classes:
        g = GPU_CLASSES[gpu]
        l02 = decisions("02_mixed_precision", gpu)
        amp = ("bf16 and fp16; wide model fp32 vs bf16" if "bf16" in l02["AUTOCAST_MODES"] else
               "fp16 only (no bf16 tensor cores): bf16 skipped; wide model fp32 vs fp16 + GradScaler")
        l05 = "Triton GEMM templates" if decisions("05_compile", gpu)["GEMM_TEMPLATES"] else \
            f"no Triton GEMM templates ({g.sms} SMs), ATen matmuls"
        l07 = "run (2 GPUs)" if g.count >= 2 else "skipped: 1 GPU"
        skipped = [f"{name} ({why.removeprefix('RunSpec.').removesuffix(' (device cuda)')})"
                   for name, why in plans(gpu).items() if why]
        lines.append(f"| {gpu} | {amp} | {l05} | {l07} | {'; '.join(skipped) or 'none'} |")
    return "\n".join(lines) + "\n"
