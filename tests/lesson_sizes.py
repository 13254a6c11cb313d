"""Each lesson's set-up (course/lessons/lessonNN.py) run under a faked GPU class (tests/fakegpu.py): the
decisions a lesson makes on a GPU (sizes, precision, what it skips), made here without one.

    from lesson_sizes import LESSONS, decide   # tests/ is on sys.path under pytest

    ns = decide("02_mixed_precision", "T4", monkeypatch)   # the lesson's choices, as a dict
    ns["FIT"].line(), ns["BATCH"], ns["AUTOCAST_MODES"]

The setup is called as the notebook calls it: its keyword arguments are read from the notebook's set-up cell
(`lesson02.setup(PROFILE, wide_layers=WIDE_LAYERS)`) and their values from its parameters cell, which holds
plain values only (read with ast.literal_eval; no cell is executed). A setup allocates nothing on the device,
so a faked GPU is enough; where it would, the fake raises ("Torch not compiled with CUDA enabled") and the
test fails. `plant` replaces attributes of the lesson's module during the call ((name, value) pairs): how a
test plants a bug in a lesson's decision code.
`tests/test_gpu_matrix.py` checks the decisions; `tests/gpus_doc.py` writes them to docs/gpus.md.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import io
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fakegpu import fake_gpu

from course.lessons import LESSON_MODULES

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
LESSONS = tuple(p.stem for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")) if p.stem in LESSON_MODULES)
# what a setup may set in the process environment (os.environ.setdefault, os.environ[...] = ...): put back
ENV_TOUCHED = ("TRITON_INTERPRET", "TORCHINDUCTOR_CACHE_DIR", "TOKENIZERS_PARALLELISM", "COURSE_PROFILE",
               "COURSE_OUTPUT_DIR")


def _tags(cell: dict[str, Any]) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def lesson_module(lesson: str) -> ModuleType:
    """course.lessons.lessonNN of `lesson` (a notebook's stem)."""
    return importlib.import_module(f"course.lessons.{LESSON_MODULES[lesson]}")


@functools.cache
def setup_arguments(lesson: str) -> dict[str, Any]:
    """The keyword arguments the notebook's set-up cell passes to its setup, with the parameters cell's
    values: {"wide_layers": 4}."""
    cells = json.loads((NOTEBOOKS / f"{lesson}.ipynb").read_text(encoding="utf-8"))["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    params = next(c for c in code if "parameters" in _tags(c))
    values = {t.id: ast.literal_eval(node.value) for node in ast.parse("".join(params["source"])).body
              if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    setup_cell = next(c for c in code if "setup" in _tags(c))
    call = next(n for n in ast.walk(ast.parse("".join(setup_cell["source"])))
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "setup")
    return {kw.arg: values[kw.value.id] for kw in call.keywords}


Plant = Sequence[tuple[str, Any]]  # (attribute of the lesson's module, its planted value)


def run_setup(lesson: str, *, profile: str | None = None, plant: Plant = (), tmp: Path | None = None,
              monkeypatch: pytest.MonkeyPatch | None = None) -> dict[str, Any]:
    """`lesson`'s setup called as its notebook calls it -> its choices as a dict, the printed line in
    ns["_printed"]. `profile` plays papermill's `-p PROFILE ...`; folders it makes go under `tmp`."""
    module = lesson_module(lesson)
    out = io.StringIO()
    saved = {k: os.environ.get(k) for k in ENV_TOUCHED}
    with contextlib.ExitStack() as stack:
        mp = monkeypatch if monkeypatch is not None else stack.enter_context(pytest.MonkeyPatch.context())
        for name, value in plant:
            assert hasattr(module, name), f"{lesson}: its module has no {name!r} to plant a bug in"
            mp.setattr(module, name, value)
        where = tmp if tmp is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        os.environ["COURSE_OUTPUT_DIR"] = str(where)  # the outputs a setup makes: not in the checkout
        try:
            with contextlib.redirect_stdout(out):
                chosen = module.setup(profile, **setup_arguments(lesson))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    ns = dict(vars(chosen))
    ns["_printed"] = out.getvalue()
    return ns


def decide(lesson: str, gpu: str, monkeypatch: pytest.MonkeyPatch, *, profile: str | None = None,
           plant: Plant = (), tmp: Path | None = None) -> dict[str, Any]:
    """`lesson`'s decisions on the GPU class `gpu` (a key of fakegpu.GPU_CLASSES), $COURSE_PROFILE unset."""
    fake_gpu(monkeypatch, gpu)
    monkeypatch.delenv("COURSE_PROFILE", raising=False)
    return run_setup(lesson, profile=profile, plant=plant, tmp=tmp, monkeypatch=monkeypatch)


@functools.cache
def decisions(lesson: str, gpu: str) -> dict[str, Any]:
    """`decide` with the default profile, made once per process (the matrix and docs/gpus.md share it), and
    the MFU peaks on that class: "_mfu" (per precision it runs) and "_mfu_peak" (the one MFU divides by)."""
    from helpers.core.precision import PRECISIONS, precision_runs
    from helpers.measure import roofline

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
    """Each rung of helpers.train.ladder.RUNGS, added to the stack below it (cumulative), checked by
    RunSpec.check
    on the faked GPU: rung -> None (runs) or the reason it is skipped. The one probe that runs a kernel (FP8's
    matmul) cannot run on a fake: it is answered yes, so only the capability decides."""
    from helpers.core import compat
    from helpers.train import ladder

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
    (ladder_plan's answer): the page `tests/gpus_doc.py` writes and the matrix test compares."""
    from fakegpu import GPU_CLASSES

    from course.sizing import MARGIN

    lines = [
        "# What each GPU gets, lesson by lesson",
        "",
        "Generated by `python tests/gpus_doc.py` from each lesson's set-up (`course/lessons/`), run on "
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
              "(`helpers.model.fp8.fp8_capable`); max-autotune's Triton GEMM templates from 68 SMs "
              "(`is_big_gpu` "
              "in `torch/_inductor/utils.py`, torch 2.13); MFU's peak: `helpers.measure.roofline.mfu_peak`, "
              "the fastest dense datasheet rate among fp32, fp16 and bf16 (sources: "
              "`helpers.measure.gpus.GPU_TABLE`).",
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
