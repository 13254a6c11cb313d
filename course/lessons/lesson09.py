"""Lesson 09's set-up (`09_plan_your_run`) and plumbing: what the lesson plans at which size, the check of the
planner against this machine's own step, and which published runs (helpers.plan.published) it shows.

Planning allocates nothing on any device (`helpers.plan.planner` runs fake tensors on the CPU); the only step
this lesson runs for real is the small Transformer's, on this machine, to hold the planner to a measurement.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from course.lessons import LessonSetup
from course.profile import get_profile, pick, small_config
from course.sizing import MARGIN, Size, fit_sizes
from helpers.core.device import get_device, last_level_cache_bytes
from helpers.core.tables import Table
from helpers.measure.memory import estimate_step_memory, estimate_training_memory
from helpers.measure.opcount import gpu_like_attention, labelled_step
from helpers.measure.optime import per_call_overhead
from helpers.measure.regimes import (
    EXCESS,
    ROOF_MARGIN,
    measure_memory_roofs,
    measure_peak_flops,
    profile_step,
)
from helpers.measure.roofline import Roofline, measure_roofline
from helpers.model.models import SmallTransformer
from helpers.plan.calibrate import WITHIN, expected
from helpers.plan.planner import example_batch, measured_roofs, plan, predict_step
from helpers.plan.published import RUNS, Row, rows
from helpers.plan.report import Plan

__all__ = ["SIZES", "SMOKE_GPUS", "SMOKE_PUBLISHED", "setup", "check_on_this_machine", "published_rows",
           "theirs_over_expected", "compare_prediction", "measured_table"]

SIZES = {"CHECK_BATCH": Size(full=16, smoke=8, floor=2),  # sequences per step of the step measured here
         "CHECK_SEQ": Size(full=256, smoke=128, floor=64)}  # its tokens per sequence
SMOKE_GPUS = ["T4", "L4", "A100-40", "A100-80", "H100", "H200"]  # six classes: the smoke profile's plans
BBC_TRAIN_ARTICLES = 1780  # the capstone's training split: 80 % of the 2,225 BBC News articles (lesson 08)


def setup(profile: str | None = None) -> LessonSetup:
    """Lesson 09's sizes on this device; prints what it chose and why (lesson 09)."""
    profile = get_profile(profile)
    device = get_device()
    vocab = pick(profile, smoke=2048, full=8192)  # the small Transformer measured on this machine
    with torch.device("meta"):  # its shapes, for the estimate: nothing allocated
        shape = SmallTransformer(small_config(profile, vocab_size=vocab))
    estimates = {"the small Transformer's step, measured here": lambda s: estimate_training_memory(
        shape, s["CHECK_BATCH"], s["CHECK_SEQ"]).peak}
    fit = fit_sizes(SIZES, estimates, shrink=["CHECK_BATCH", "CHECK_SEQ"], profile=profile, device=device,
                    precision="fp32", notes=["the plans themselves allocate nothing on any device"])
    print(fit.line())
    p = fit.profile
    capstone_seq = pick(p, smoke=128, full=512)
    return LessonSetup(
        PROFILE=p, DEVICE=device, FIT=fit, VOCAB=vocab, **fit.sizes,
        CAPSTONE=pick(p, smoke="bert-mini", full="bert-base"),  # lesson 08's model (models.KNOWN_MODELS)
        CAPSTONE_BATCH=32, CAPSTONE_SEQ=capstone_seq,  # lesson 08's batch and longest sequence
        CAPSTONE_TOKENS=BBC_TRAIN_ARTICLES * capstone_seq,  # one epoch, every article padded to the longest
        GPT_SIZES=pick(p, smoke=dict(n_layer=2, n_embd=128, n_head=4), full=dict(n_layer=12, n_embd=768,
                                                                                   n_head=12)),
        GPT_BATCH=8, GPT_SEQ=pick(p, smoke=256, full=1024),
        GPT_TOKENS=pick(p, smoke=1e8, full=1e10),  # the GPT's data set, tokens per epoch
        GPUS=pick(p, smoke=SMOKE_GPUS, full=None),  # None: every class of helpers.measure.gpus
        PUBLISHED=pick(p, smoke=SMOKE_PUBLISHED, full=None))  # None: every run of helpers.plan.published


# --- the planner on this machine: predicted beside measured ----------------------------------------------

def _roofs_here(device: torch.device) -> tuple[Roofline, Roofline, Roofline, float]:
    """This machine's roofs, measured now as lesson 04 measures them: the best matmul rate of a few sizes,
    a copy beyond the caches, the copies that fit the caches, and the cost of one call."""
    gpu_here = device.type == "cuda"
    copy_mb = max(64, -(-(last_level_cache_bytes(device) or 0) // 2**20))
    now = measure_roofline(device, precisions=["fp32"], matmul_size=2048 if gpu_here else 512,
                           copy_mb=copy_mb, min_run_time=0.2)
    peak = max(now.matmul_flops["fp32"], measure_peak_flops(device))
    roofline = Roofline(now.device_name, {"fp32": peak}, now.bandwidth, now.matmul_size, now.copy_bytes)
    overhead = per_call_overhead(device)
    cache = last_level_cache_bytes(device)
    memory = measure_memory_roofs(device, roofline, cache_bytes=cache, overhead_s=overhead)
    roofs = measured_roofs(roofline, overhead_s=overhead, memory_roofs=memory, device=device)
    return roofline, roofs, memory, overhead


def check_on_this_machine(model: nn.Module, batch: Mapping[str, Any], *,
                          device: torch.device | str | None = None) -> tuple[Table, float]:
    """The planner's step time of `model` on `batch` from this machine's measured roofs, beside the step
    measured here, and the measured step split by lesson 04's causes; (the table, measured / predicted)
    (lesson 09). The model is copied to `device` (default: this lesson's) and trained one fp32 step at a
    time (fused AdamW), as the plan assumes. Checks that the step is not faster than the prediction by more
    than lesson 04's noise rule (`ROOF_MARGIN`): a step cannot beat its roofs, so a planner that over-counts
    fails; prints what it checked."""
    import copy

    device = torch.device(device) if device is not None else get_device()
    roofline, roofs, memory, overhead = _roofs_here(device)
    predicted = predict_step(model, batch, roofs)
    here = copy.deepcopy(model).to(device)
    on_device = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    opt = torch.optim.AdamW(here.parameters(), lr=1e-4, fused=True)
    table = profile_step(labelled_step(here, on_device, opt), roofline, device=device, overhead_s=overhead,
                         memory_roofs=memory, steps=3, untimed="estimate")
    measured = table.unprofiled_s or table.total_s
    causes, scale = table.causes(), measured / max(table.total_s, 1e-12)
    t = Table(["", "ms per step", "where it comes from"],
              title=f"The planner on this machine ({roofline.device_name}), one fp32 step")
    t.add("predicted: every op at its roof, plus its calls' cost", predicted.seconds * 1e3,
          "helpers.plan.planner.predict_step on the roofs measured just now")
    t.add("measured: the same step, plain", measured * 1e3, "median of 3 steps beside profiled ones")
    t.add("measured / predicted", measured / predicted.seconds, "the gap the causes below explain")
    t.add("  of which: ops at their roofs (compute + memory)",
          (causes["compute"] + causes["memory"]) * scale * 1e3, "lesson 04's profile, scaled to the step")
    t.add("  of which: calls' cost and time between ops (overhead)", causes["overhead"] * scale * 1e3,
          "lesson 04: the host's Python, dispatcher, autograd")
    t.add(f"  of which: {EXCESS}", causes[EXCESS] * scale * 1e3, "lesson 04: kernels slower than their roof")
    ratio = measured / predicted.seconds
    # the check: a step cannot beat its roofs; by more than lesson 04's noise rule, the planner over-counts
    assert ratio >= 1 / ROOF_MARGIN, (f"the step ran {1 / ratio:.1f}x faster than the planner's roofs allow "
                                      f"(rule: at most {ROOF_MARGIN:g}x, lesson 04): its counts are too high")
    print(f"checked: the measured step is {ratio:.2f}x the planner's prediction (a step cannot beat its "
          f"roofs: at least 1/{ROOF_MARGIN:g}x, lesson 04's noise rule)")
    return t, ratio


# --- published runs the planner is held to (helpers.plan.published) ----------------------------------------

# the smoke profile's runs: one per stack (eager, compiled, fused), three models' counts (about 25 s here)
SMOKE_PUBLISHED = ("nanoGPT GPT-2 124M, eager", "nanoGPT GPT-2 124M, compiled", "GPT3-125M, FlashAttention",
                   "GPT3-355M, FlashAttention")


def published_rows(names: Sequence[str] | None) -> list[Row]:
    """The published runs named (None: every one), rebuilt by the planner on their datasheets (lesson 09)."""
    runs = [r for r in RUNS if names is None or r.name in names]
    if names is not None and len(runs) != len(set(names)):
        raise ValueError(f"unknown published run(s) {sorted(set(names) - {r.name for r in runs})}: "
                         f"helpers.plan.published.RUNS names {[r.name for r in RUNS]}")
    return rows(runs)


def theirs_over_expected(found: Sequence[Row]) -> list[float]:
    """Each published run's step / the planner's expected step on its stack (lesson 09)."""
    return [r.measured_s / expected(r.step, r.stack).seconds for r in found]


# --- the exercise's prediction beside the planner's search, and the lesson's summary ------------------------

def compare_prediction(answer: Callable[..., int], model: nn.Module, the_plan: Plan, key: str = "T4") -> None:
    """Your `largest_batch_from` for class `key`, from two dry runs (the plan's batch and twice it), beside
    the largest batch the planner searches now (lesson 09); an untouched skeleton shows the search alone."""
    from course.exercises import is_skeleton

    c = the_plan[key]
    rows = the_plan.batch_size
    searched = plan(model, (rows, the_plan.seq_len), gpus=[key], prices=None)[key].largest_batch
    batch = example_batch(model, 2 * rows, the_plan.seq_len)
    with gpu_like_attention():
        peaks = [estimate_step_memory(model, {k: v[:n] for k, v in batch.items()}, precision="bf16").peak
                 for n in (rows, 2 * rows)]
    line = (f"{key}: dry runs {peaks[0] / 2**30:.2f} GiB at batch {rows} and {peaks[1] / 2**30:.2f} GiB at "
            f"{2 * rows}; {c.gpu.total_memory / 2**30:.1f} GiB, {MARGIN:.0%} kept free")
    print(line)
    print(f"the planner's search: {searched} (dry runs until one fits next to one that does not)")
    if is_skeleton(answer):
        print("your line: write largest_batch_from above to see your prediction here")
    else:
        print(f"your line: {answer(rows, peaks[0], peaks[1], c.gpu.total_memory, MARGIN)}")


def measured_table(plans: Mapping[str, Plan], here_ratio: float, published: list[float]) -> Table:
    """This run's numbers next to what the lesson claims (lesson 09)."""
    t = Table(["claim", "this run", "where"], title="What we measured on this machine")
    low, high = 1 / WITHIN, WITHIN
    t.add("a plan takes seconds on a CPU, nothing on a GPU",
          ", ".join(f"{name} {p.seconds:.0f} s ({len(p.classes)} classes)" for name, p in plans.items()),
          "sections 1 and 4")
    t.add("a real step is slower than every op at its roof", f"{here_ratio:.2f}x on this machine",
          "section 5, lesson 04's causes")
    t.add(f"published GPU steps are within {low:.2f}x to {high:.1f}x of the expected step",
          ", ".join(f"{r:.2f}" for r in published), "section 5, tests/test_plan_published.py")
    return t
