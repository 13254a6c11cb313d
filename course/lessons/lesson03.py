"""Lesson 03 (`03_memory`): the small Transformer's batch and length, fitted so that one fp32 AdamW step, and
a trade-off variant beside the first model, fit the device; and the lesson's plumbing: the checks that the
estimate agrees with the measurement (parameters, activations, the peak, the dry run) and that the trade-off
variants compute the same losses, the tables, and the closing summary. Each check raises AssertionError when
it fails and prints one line saying what it checked when it passes. The estimate itself stays in the lesson.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure

from course.claims import CLAIMS
from course.lessons import LessonSetup
from course.paths import output_dir
from course.plots import memory_breakdown_chart
from course.profile import get_profile, pick, small_config
from course.sizing import Size, fit_sizes
from course.verdicts import AtMost, MeasuredTable, Range
from helpers.core.device import get_device
from helpers.core.tables import Table
from helpers.core.timing import LoadProbe, busy
from helpers.measure.memory import (
    MemoryEstimate,
    MemoryReport,
    estimate_training_memory,
    tensor_bytes,
    track_peak_memory,
)
from helpers.model.models import SmallTransformer
from helpers.train.loop import make_optimizer
from helpers.train.meter import TrainResult

__all__ = ["setup", "step_peak", "MiB", "GB", "estimate_table", "PARAM_SLACK_PER_TENSOR",
           "check_parameter_term", "ACT_TOL", "PEAK_TOL", "measured_table", "check_estimate",
           "measured_step_peak", "TIMELINE_TERMS", "breakdown_chart", "Compared", "compare_estimators",
           "estimators_table", "DRY_TOL", "check_dry_run", "LOSS_TOL", "check_same_losses", "step_s",
           "least_disturbed", "tradeoff_table", "bert_table", "summary_table"]

MiB, GB = 2**20, 1e9


def step_peak(model: SmallTransformer, sizes: dict[str, int]) -> int:
    """One fp32 AdamW step of `model` at `sizes` (BATCH, SEQ), estimated, bytes (lesson 03)."""
    return estimate_training_memory(model, sizes["BATCH"], sizes["SEQ"]).peak


def setup(profile: str | None = None, *, accum: int = 4) -> LessonSetup:
    """Lesson 03's sizes on this device; prints what it chose and why (lesson 03)."""
    profile = get_profile(profile)
    device = get_device()  # cuda if there is one, else cpu
    vocab = pick(profile, smoke=512, full=8192)  # vocabulary of the synthetic task
    sizes = {"BATCH": Size(full=32, smoke=8, floor=accum),  # sequences per optimizer step (accum micro-steps)
             "SEQ": Size(full=512, smoke=128, floor=128)}  # tokens per sequence
    with torch.device("meta"):  # the model's shapes, for the estimates: nothing is allocated
        shape = SmallTransformer(small_config(profile, vocab_size=vocab, max_len=sizes["SEQ"].full))
    states = 16 * shape.num_params()  # fp32 weights, gradients and AdamW's two moments: the first model, kept
    estimates = {"one training step, measured and recorded": lambda s: step_peak(shape, s),
                 "a trade-off variant, beside the first model": lambda s: states + step_peak(shape, s)}
    fit = fit_sizes(sizes, estimates, shrink=["BATCH", "SEQ"], profile=profile, device=device,
                    precision="fp32", notes=["the search finds the largest batch by running out of memory"])
    print(fit.line())
    return LessonSetup(
        PROFILE=fit.profile, DEVICE=device, FIT=fit, VOCAB=vocab, SHAPE=shape, **fit.sizes,
        STEPS=pick(fit.profile, smoke=8, full=12),  # optimizer steps per trade-off variant
        SEARCH_LIMIT=pick(fit.profile, smoke=256, full=4096),  # largest batch the search tries
        OUT=output_dir("03_memory"),  # the memory snapshot and its HTML: outputs/03_memory/
        LOAD=LoadProbe(children=True).start())  # what other programs take of the CPUs from here on: summary


# --- section 1: the estimate, and its parameter term against the allocator ----------------------------------

def _peak_of(terms: Mapping[str, int]) -> int:
    # the formula's peak: weights and optimizer state throughout; the larger of activations + logits and grads
    return (terms["parameters"] + terms["optimizer state"] + terms.get("autocast weight copies", 0)
            + max(terms["activations"] + terms["temporary (logits)"], terms["gradients"]))


def estimate_table(by_hand: Mapping[str, int], estimates: Mapping[str, MemoryEstimate]) -> Table:
    """The terms counted by hand (fp32, bytes; keys of MemoryEstimate.breakdown) next to the estimator's, per
    precision, in MiB, with the total and the expected peak (lesson 03)."""
    first = next(iter(estimates.values()))
    unknown = set(by_hand) - set(first.breakdown())
    if unknown:
        raise ValueError(f"by_hand has terms the estimator does not name: {sorted(unknown)}; use "
                         f"{list(first.breakdown())}")
    table = Table(["term", "by hand, fp32 [MiB]"] + [f"estimator, {p} [MiB]" for p in estimates],
                  title=f"Estimated memory of one step, batch {first.batch_size}x{first.seq_len}")
    for term in first.breakdown():
        table.add(term, by_hand[term] / MiB if term in by_hand else None,
                  *[e.breakdown()[term] / MiB for e in estimates.values()])
    complete = set(by_hand) >= {"parameters", "gradients", "optimizer state", "activations",
                                "temporary (logits)"}
    table.add("total (every term at once: an upper bound)", sum(by_hand.values()) / MiB if complete else None,
              *[e.total / MiB for e in estimates.values()])
    table.add("expected peak (gradients replace activations)", _peak_of(by_hand) / MiB if complete else None,
              *[e.peak / MiB for e in estimates.values()])
    return table


PARAM_SLACK_PER_TENSOR = 512  # a GPU's allocator rounds each tensor up to a multiple of 512 bytes


def check_parameter_term(estimate: MemoryEstimate, built: MemoryReport, model: torch.nn.Module) -> None:
    """The estimate's parameter bytes against what the allocator handed out while `model` was built
    (`built`), up to PARAM_SLACK_PER_TENSOR per parameter tensor; an estimator that counted the tied embedding
    and output head twice must fail the same test (lesson 03)."""
    params = list(model.parameters())
    slack = PARAM_SLACK_PER_TENSOR * len(params)
    allocated = built.end_increase_bytes

    def off(estimated: int) -> int:
        return abs(estimated - allocated)

    assert off(estimate.parameters) <= slack, (
        f"the estimator's parameters ({estimate.parameters:,} B) are not the {allocated:,} B measured")
    tied_twice = estimate.parameters + 4 * model.tok_emb.weight.numel()  # the planted-bug control
    assert off(tied_twice) > slack, "the check cannot see the tied weights counted twice"
    print(f"check_parameter_term: estimated {estimate.parameters / MiB:.2f} MiB, allocated "
          f"{allocated / MiB:.2f} MiB ({built.method.split(' (')[0]}); tied weights counted twice would be "
          f"{tied_twice / MiB:.2f} MiB: caught")


# --- section 2: estimate against measurement ----------------------------------------------------------------

ACT_TOL, PEAK_TOL = 0.20, 0.25  # the tolerances the lesson states


def measured_table(estimate: MemoryEstimate, forward: MemoryReport, step: MemoryReport) -> Table:
    """The estimate's activations and peak next to the measured forward pass and step (lesson 03)."""
    table = Table(["quantity", "estimated [MiB]", "measured [MiB]", "estimate / measured"],
                  title=f"Estimate vs measurement ({step.method})")
    table.add("activations (forward peak)", estimate.activations / MiB, forward.peak_increase_bytes / MiB,
              estimate.activations / forward.peak_increase_bytes)
    table.add("whole step (peak)", estimate.peak / MiB, step.peak_bytes / MiB,
              estimate.peak / step.peak_bytes)
    return table


def check_estimate(estimate: MemoryEstimate, forward: MemoryReport, step: MemoryReport) -> None:
    """The estimated activations within ACT_TOL of the forward pass's measured peak increase, the estimated
    peak within PEAK_TOL of the measured step's (lesson 03)."""
    act_ratio = estimate.activations / forward.peak_increase_bytes
    peak_ratio = estimate.peak / step.peak_bytes
    assert abs(act_ratio - 1) <= ACT_TOL, (
        f"the activation estimate is off by more than {ACT_TOL:.0%}: {act_ratio:.2f}x the measurement")
    assert abs(peak_ratio - 1) <= PEAK_TOL, (
        f"the estimated peak is off by more than {PEAK_TOL:.0%}: {peak_ratio:.2f}x the measurement")
    print(f"check_estimate: activations {act_ratio:.2f}x the measured forward pass (within {ACT_TOL:.0%}), "
          f"the peak {peak_ratio:.2f}x the measured step (within {PEAK_TOL:.0%})")


def measured_step_peak(model: torch.nn.Module, batch: Mapping[str, torch.Tensor],
                       device: torch.device | str) -> int:
    """The measured peak bytes of one fused-AdamW training step of `model` on `batch`, after a first step that
    made the optimizer's state (lesson 03)."""
    opt = make_optimizer(model, 1e-3, 0.01, fused=True)

    def one() -> None:
        opt.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        opt.step()

    one()
    with track_peak_memory(device, baseline_bytes=tensor_bytes(model, opt, *batch.values())) as report:
        one()
    return report.peak_bytes


@dataclass(frozen=True)
class Compared:
    """One model's two estimates and its measured step peak (None: not measured, `why` says why)
    (lesson 03)."""

    name: str
    formula: MemoryEstimate
    dry_run: MemoryEstimate
    measured: int | None
    why: str = ""

    def ratio(self, estimate: MemoryEstimate) -> float | None:
        """An estimate's peak over the measured one (None when not measured)."""
        return estimate.peak / self.measured if self.measured else None


DRY_TOL = 0.15  # the dry run within 15 % of the measured peak, on a CPU


def compare_estimators(models: Mapping[str, tuple[MemoryEstimate, MemoryEstimate, Any]],
                       device: torch.device | str) -> list[Compared]:
    """name -> (formula, dry run, measured peak bytes | (model, batch) to measure now): each model's step
    peak, measured where the dry run says it fits in 80 % of a GPU's memory, any size on a CPU (lesson 03)."""
    device = torch.device(device)
    capacity = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    rows = []
    for name, (formula, dry, measured) in models.items():
        why = ""
        if isinstance(measured, tuple):
            net, batch = measured
            if capacity is not None and dry.peak > 0.8 * capacity:  # the dry run says it would not fit
                measured, why = None, (f"the dry run needs {dry.peak / GB:.1f} GB of this GPU's "
                                       f"{capacity / GB:.1f} GB: not measured")
                print(f"{name}: {why}")
            else:
                measured = measured_step_peak(net.to(device), {k: v.to(device) for k, v in batch.items()},
                                              device)
        rows.append(Compared(name, formula, dry, measured, why))
    return rows


def estimators_table(rows: list[Compared]) -> Table:
    """The formula and the dry run against the measured peak, per model (lesson 03)."""
    first = rows[0].formula
    table = Table(["model", "formula [MiB]", "dry run [MiB]", "measured [MiB]", "formula / measured",
                   "dry run / measured"],
                  title=f"Two estimators and a measurement, fp32, batch {first.batch_size}x{first.seq_len}")
    for r in rows:
        measured = r.measured / MiB if r.measured else None
        table.add(r.name, r.formula.peak / MiB, r.dry_run.peak / MiB, measured, r.ratio(r.formula),
                  r.ratio(r.dry_run))
    return table


def check_dry_run(rows: list[Compared], device: torch.device | str) -> None:
    """On a CPU, each dry run within DRY_TOL of the measured step peak; on a GPU shown, not checked: its fused
    kernels and workspaces differ from the CPU kernels the dry run ran (lesson 03)."""
    if torch.device(device).type != "cpu":
        print("check_dry_run: on a GPU the dry run is shown, not checked (it ran the CPU's kernels)")
        return
    for r in rows:
        ratio = r.ratio(r.dry_run)
        assert ratio is not None, f"{r.name}: no measured peak to check the dry run against ({r.why})"
        assert abs(ratio - 1) <= DRY_TOL, (
            f"{r.name}: the dry run is off by more than {DRY_TOL:.0%}: {ratio:.2f}x the measured peak")
    print("check_dry_run: " + ", ".join(f"{r.name} {r.ratio(r.dry_run):.2f}x" for r in rows)
          + f" the measured peak (within {DRY_TOL:.0%})")


# --- section 3: the timeline next to the estimate -----------------------------------------------------------

# the timeline's categories (torch's memory timeline) that are the estimator's terms, by the estimator's names
TIMELINE_TERMS = {"parameter": "parameters", "gradient": "gradients", "activation": "activations"}


def breakdown_chart(estimates: Mapping[str, MemoryEstimate], at_peak: Mapping[str, int]) -> Figure:
    """Stacked bars: each estimate's terms, and the timeline's categories at its peak, the ones that are the
    estimator's terms under the estimator's names so that they share a colour (lesson 03)."""
    bars = {f"estimate ({p})": e.breakdown() for p, e in estimates.items()}
    bars["timeline at its peak"] = {TIMELINE_TERMS.get(c, c): b for c, b in at_peak.items()}
    return memory_breakdown_chart(bars, title="Where the memory goes: estimate vs the measured timeline")


# --- section 4: trading time for memory ---------------------------------------------------------------------

LOSS_TOL = 1e-4  # rtol and atol: the variants compute the same maths, up to float rounding


def check_same_losses(runs: Mapping[str, list[TrainResult]], baseline: str = "baseline") -> None:
    """Every run of every variant gives the baseline's first run's losses, within LOSS_TOL (lesson 03)."""
    base = torch.tensor(runs[baseline][0].losses)
    for name, rs in runs.items():
        for r in rs:
            try:
                torch.testing.assert_close(torch.tensor(r.losses), base, rtol=LOSS_TOL, atol=LOSS_TOL)
            except AssertionError as err:
                raise AssertionError(f"{name}: its losses are not the {baseline}'s: {err}") from None
    print(f"check_same_losses: {sum(map(len, runs.values()))} runs of {len(runs)} variants give the "
          f"{baseline}'s losses {[round(x, 4) for x in base.tolist()]} (within {LOSS_TOL:g})")


def step_s(run: TrainResult) -> float:
    """The median step time of a run, its first (warm-up) step left out, seconds (lesson 03)."""
    return statistics.median(run.step_times_s[1:])


def least_disturbed(runs: Mapping[str, list[TrainResult]]) -> dict[str, TrainResult]:
    """Each variant's round with the lowest median step time: other programs only ever add time
    (lesson 03)."""
    return {name: min(rs, key=step_s) for name, rs in runs.items()}


def tradeoff_table(tradeoffs: Mapping[str, TrainResult], baseline: str = "baseline") -> Table:
    """Peak memory and step time of each variant, and both against the baseline (lesson 03)."""
    base = tradeoffs[baseline]
    table = Table(["variant", "peak memory [MiB]", "memory vs baseline", "median step [ms]",
                   "time vs baseline"], title="Memory saved and time paid")
    for name, r in tradeoffs.items():
        table.add(name, r.peak_memory_bytes / MiB, r.peak_memory_bytes / base.peak_memory_bytes,
                  step_s(r) * 1e3, step_s(r) / step_s(base))
    return table


# --- section 6: BERT-base -----------------------------------------------------------------------------------

def bert_table(rows: Mapping[str, MemoryEstimate]) -> Table:
    """The estimator's BERT-base rows: activations, model states, total, and whether activations pass 16 GB
    (lesson 03)."""
    first = next(iter(rows.values()))
    table = Table([f"BERT-base, batch {first.batch_size} x {first.seq_len}", "activations [GB]",
                   "model states [GB]", "total [GB]", "activations > 16 GB?"],
                  title="The estimator on BERT-base shapes")
    for name, e in rows.items():
        table.add(name, e.activations / GB, (e.parameters + e.gradients + e.optimizer) / GB, e.total / GB,
                  e.activations > 16e9)
    return table


# --- what we measured ---------------------------------------------------------------------------------------

def _spread(run: TrainResult) -> float:
    # how much the timed steps of one run differ: (max - min) / median
    timed = run.step_times_s[1:]
    return (max(timed) - min(timed)) / statistics.median(timed)


def summary_table(*, device: torch.device | str, estimate: MemoryEstimate, built: MemoryReport,
                  forward: MemoryReport, step: MemoryReport, tradeoffs: Mapping[str, TrainResult],
                  bert_rows: Mapping[str, MemoryEstimate], bert_measured: int | None,
                  bert_need_bytes: float, load: LoadProbe | None = None) -> MeasuredTable:
    """This run's numbers next to the claims (C5, C15); prints the two verdicts in words. The step-time
    verdict is "too busy to judge" where a run's steps disagree by helpers.core.timing.TOO_BUSY or more, or
    other
    programs took the CPUs while the lesson ran (`load`: S.LOAD, started by the setup) (lesson 03)."""
    device = torch.device(device)
    eager = bert_rows["eager attention, fp32"].activations
    sdpa = bert_rows["SDPA, fp32"].activations
    base = tradeoffs["baseline"]
    accum_name = next(n for n in tradeoffs if n.startswith("accumulation"))
    accum, ckpt = tradeoffs[accum_name], tradeoffs["activation checkpointing"]
    ckpt_ratio = step_s(ckpt) / step_s(base)
    ckpt_noise = max(_spread(ckpt), _spread(base))  # steps of one run differ by this much: the noise
    state = busy(ckpt_noise, load=load.read() if load is not None else None)
    method = forward.method.split(" (")[0]
    summary = MeasuredTable(f"Lesson 03 on {device.type}, batch {estimate.batch_size}x{estimate.seq_len}")
    c5 = CLAIMS["activations-16gb"]
    eager_row = "BERT-base, batch 64 x 512, fp32: activations, eager attention, estimated [GB]"
    sdpa_row = "…the same with SDPA, estimated [GB]"
    summary.add(eager_row, eager / GB, c5)
    summary.add(sdpa_row, sdpa / GB, c5)
    summary.add("…eager attention, measured on a GPU [GB]", bert_measured / GB if bert_measured else None, c5,
                needs=f"a CUDA GPU with {bert_need_bytes / GB:.0f} GB")
    summary.add("estimated / allocated parameter bytes", estimate.parameters / built.end_increase_bytes,
                "equal, up to the allocator's rounding (checked)", rule=Range(0.99, 1.01, better=None))
    summary.add(f"estimated / measured activations ({method})",
                estimate.activations / forward.peak_increase_bytes, f"within {ACT_TOL:.0%} (checked)",
                rule=Range(1 - ACT_TOL, 1 + ACT_TOL, better=None))
    summary.add(f"estimated / measured peak of a step ({method})", estimate.peak / step.peak_bytes,
                f"within {PEAK_TOL:.0%} (checked)", rule=Range(1 - PEAK_TOL, 1 + PEAK_TOL, better=None))
    summary.add(f"gradient {accum_name}: peak memory / baseline",
                accum.peak_memory_bytes / base.peak_memory_bytes, "less memory", rule=AtMost(0.99))
    summary.add("…its step time / baseline", step_s(accum) / step_s(base))
    summary.add("activation checkpointing: peak memory / baseline",
                ckpt.peak_memory_bytes / base.peak_memory_bytes, "less memory", rule=AtMost(0.99))
    verdict = summary.add("activation checkpointing: step time / baseline", ckpt_ratio,
                          CLAIMS["checkpointing-cost"], noise=ckpt_noise, busy=state,
                          why="cheaper than claimed" if ckpt_ratio < 1.15 and not state.too_busy else "")
    print(f"activation checkpointing: {ckpt_ratio:.2f}x the baseline's step time; the claim 'about 1.3x' "
          f"{verdict} here (steps of one run differ by up to {ckpt_noise:.0%})")
    print(f"C5 on BERT-base shapes: {summary.verdicts[eager_row]} for eager attention, "
          f"{summary.verdicts[sdpa_row]} with SDPA (estimated)")
    return summary
