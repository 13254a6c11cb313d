"""The course on the GPU a learner has, proven without one: under each faked GPU class (tests/fakegpu.py) each
lesson's set-up runs as its notebook calls it (tests/lesson_sizes.py) and its decisions are checked: every
step's estimated peak within the device's memory less the margin, the sizes the lesson uses the ones it
fitted, the precision what the capability allows, the full profile refused where it does not fit; MFU's
peak no precision can pass; the ladder's rungs nothing the device cannot run. Each check is shown to fail on
a planted error (today's lesson 02 crash among them). One full-size step is sized a second way, with
FakeTensorMode + MemTracker on the CPU, against the estimator every lesson uses."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fakegpu import GPU_CLASSES, fake_gpu
from lesson_sizes import DOC, LESSONS, decide, decisions, ladder_plan, plan, render_gpus_doc, run_setup

from course.sizing import MARGIN, Fit, SizingError
from helpers.core.precision import precision_runs
from helpers.measure import roofline
from helpers.train import ladder

CLASSES = list(GPU_CLASSES)
# what the capability allows: bf16 from Ampere (8.0), fp16 only on Volta/Turing; FP8 from Ada/Hopper (8.9)
EXPECTED_PRECISION = {k: "bf16" if g.capability >= (8, 0) else "fp16" for k, g in GPU_CLASSES.items()}
# lessons whose full sizes the issue found too big for a T4 (~17 GB naive attention, ~29 GB wide model,
# ~28 GB batch sweep, the fp32 BERT-base ladder): the estimates must see it too
TOO_BIG_FOR_A_T4 = ("01_attention", "02_mixed_precision", "04_where_time_goes", "08_bert_finetuning")


def checkdecisions(lesson: str, gpu: str, ns: dict[str, Any]) -> None:
    """The matrix's checks of one lesson's decisions on one GPU class (AssertionError names what is wrong)."""
    g = GPU_CLASSES[gpu]
    fit = ns["FIT"]
    assert isinstance(fit, Fit) and fit.profile == "fit", f"{lesson} on {gpu}: profile {fit.profile}"
    usable = g.total_memory * (1 - MARGIN)
    peaks = {step: est(fit.sizes) for step, est in fit.steps.items()}  # recomputed, not the Fit's own
    over = {step: f"{b / 2**30:.1f} GiB" for step, b in peaks.items() if b > usable}
    assert not over, f"{lesson} on {gpu} ({usable / 2**30:.1f} GiB usable): {over}"
    used = {name: ns.get(name) for name in fit.sizes}
    assert used == fit.sizes, f"{lesson} on {gpu}: the lesson runs {used}, it fitted {fit.sizes}"
    if "this lesson's" not in fit.precision_why:
        assert fit.precision == EXPECTED_PRECISION[gpu], (lesson, gpu, fit.precision)
    printed = ns["_printed"].strip()
    assert printed == fit.line() and "\n" not in printed and g.name in printed, (lesson, gpu, printed)


@pytest.mark.parametrize("gpu", CLASSES)
@pytest.mark.parametrize("lesson", LESSONS)
def test_every_lesson_fits_every_gpu_class(lesson: str, gpu: str) -> None:
    checkdecisions(lesson, gpu, decisions(lesson, gpu))


def check_capabilities(gpu: str, ns: dict[str, dict[str, Any]]) -> None:
    """The lessons' capability-driven choices on `gpu`: ns maps lesson -> its decisions."""
    g = GPU_CLASSES[gpu]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[EXPECTED_PRECISION[gpu]]
    assert ns["01_attention"]["DTYPE"] == dtype, f"{gpu}: lesson 01 computes in {ns['01_attention']['DTYPE']}"
    modes = {"fp16", "bf16"} if g.capability >= (8, 0) else {"fp16"}
    l02 = ns["02_mixed_precision"]
    assert set(l02["AUTOCAST_MODES"]) == modes, f"{gpu}: lesson 02 autocasts to {l02['AUTOCAST_MODES']}"
    assert l02["AMP"] == EXPECTED_PRECISION[gpu]
    assert ns["05_compile"]["GEMM_TEMPLATES"] == (g.sms >= 68)  # Inductor's is_big_gpu
    assert ns["08_bert_finetuning"]["FP8"] == (g.capability >= (8, 9))


@pytest.mark.parametrize("gpu", CLASSES)
def test_capability_choices_are_what_the_gpu_can_run(gpu: str) -> None:
    lessons = ("01_attention", "02_mixed_precision", "05_compile", "08_bert_finetuning")
    check_capabilities(gpu, {lesson: decisions(lesson, gpu) for lesson in lessons})


def check_shrinks_on_a_t4(lesson: str, ns: dict[str, Any]) -> None:
    assert ns["FIT"].shrunk(), f"{lesson}: nothing shrunk on a T4: does its estimate see the big step?"


def test_the_estimates_see_what_does_not_fit_a_t4_and_the_h200_runs_full_sizes() -> None:
    for lesson in TOO_BIG_FOR_A_T4:  # an estimate that said 0 bytes would fit everything everywhere
        check_shrinks_on_a_t4(lesson, decisions(lesson, "T4"))
    for lesson in LESSONS:
        assert not decisions(lesson, "H200")["FIT"].shrunk(), f"{lesson}: shrunk on an H200"


@pytest.mark.parametrize("lesson", LESSONS)
def test_a_second_run_all_decides_the_same(lesson: str, monkeypatch, tmp_path) -> None:
    # in one process, as Run All twice does in one kernel: the setup keeps no state between calls
    first = decide(lesson, "T4", monkeypatch, tmp=tmp_path)
    sizes, printed = dict(first["FIT"].sizes), first["_printed"]
    again = run_setup(lesson, tmp=tmp_path, monkeypatch=monkeypatch)
    assert again["FIT"].sizes == sizes and again["_printed"] == printed


def test_full_profile_is_refused_where_it_does_not_fit(monkeypatch, tmp_path) -> None:
    with pytest.raises(SizingError, match=r"does not fit Tesla T4, 14\.8 GiB .*the batch sweep.* GiB"):
        decide("04_where_time_goes", "T4", monkeypatch, profile="full", tmp=tmp_path)
    ns = decide("04_where_time_goes", "H100", monkeypatch, profile="full", tmp=tmp_path)  # papermill's -p
    assert ns["FIT"].profile == "full" and ns["BATCHES"][-1] == 64


# --- planted errors: each check above fails on one -------------------------------------------------------

def test_planted_lesson_02_crash_fails_the_matrix(monkeypatch, tmp_path) -> None:
    # lesson 02 once filtered with `check_precision(p, DEVICE) is None`, which raises for bf16 on a T4
    from helpers.core.precision import check_precision

    crash = [("precision_runs", lambda p, device: check_precision(p, device) is None)]
    with pytest.raises(ValueError, match="bf16 needs a GPU of compute capability 8.0"):
        decide("02_mixed_precision", "T4", monkeypatch, tmp=tmp_path, plant=crash)
    assert decide("02_mixed_precision", "A100-40", monkeypatch, tmp=tmp_path, plant=crash)["AMP"] == "bf16"


def test_planted_unfitted_size_fails_the_matrix(monkeypatch, tmp_path) -> None:
    from course.lessons import lesson04

    fitted = lesson04.setup

    def unfitted(*args, **kwargs):  # a setup that runs the full batch sweep whatever it fitted
        return fitted(*args, **kwargs).replace(BATCHES_MAX=lesson04.SIZES["BATCHES_MAX"].full)

    ns = decide("04_where_time_goes", "T4", monkeypatch, tmp=tmp_path, plant=[("setup", unfitted)])
    with pytest.raises(AssertionError, match="the lesson runs .*'BATCHES_MAX': 64"):
        checkdecisions("04_where_time_goes", "T4", ns)


def test_planted_estimate_of_nothing_fails_the_matrix(monkeypatch, tmp_path) -> None:
    # the small Transformer's step estimated at 0 bytes: the batch sweep "fits" a T4 at batch 64
    ns = decide("04_where_time_goes", "T4", monkeypatch, tmp=tmp_path,
                plant=[("_small_peak", lambda model, batch, seq: 0)])
    with pytest.raises(AssertionError, match="nothing shrunk on a T4"):
        check_shrinks_on_a_t4("04_where_time_goes", ns)


def test_planted_bf16_on_a_t4_fails_the_matrix(monkeypatch, tmp_path) -> None:
    # lesson 01 as it was: bf16 whatever the GPU
    ns = {lesson: decide(lesson, "T4", monkeypatch, tmp=tmp_path)
          for lesson in ("02_mixed_precision", "05_compile", "08_bert_finetuning")}
    ns["01_attention"] = decide("01_attention", "T4", monkeypatch, tmp=tmp_path, plant=[
        ("training_precision", lambda device: ("bf16", "planted: bf16 whatever the GPU"))])
    with pytest.raises(AssertionError, match="lesson 01 computes in torch.bfloat16"):
        check_capabilities("T4", ns)


# --- MFU: one peak no precision can pass -----------------------------------------------------------------

def check_mfu(gpu: str, per_precision: dict[str, roofline.PeakFlops | None],
              peak: roofline.PeakFlops | None) -> None:
    """Every precision the GPU runs has a datasheet peak at or below MFU's one peak, so MFU <= 100 %."""
    assert peak is not None and "measured" not in peak.source, f"{gpu}: no datasheet peak for MFU"
    for p, pk in per_precision.items():
        assert pk is not None and pk.flops <= peak.flops, (
            f"{gpu}: a {p} run at its peak ({pk.flops / 1e12:.0f} TFLOP/s) would show MFU "
            f"{pk.flops / peak.flops:.0%} against {peak.precision} ({peak.flops / 1e12:.0f})")


@pytest.mark.parametrize("gpu", CLASSES)
def test_mfu_stays_at_or_below_100_percent_for_every_precision(gpu: str) -> None:
    ns = decisions("00_setup", gpu)
    check_mfu(gpu, ns["_mfu"], ns["_mfu_peak"])


def test_planted_mfu_without_fp16_fails_on_a_t4(monkeypatch) -> None:
    fake_gpu(monkeypatch, "T4")
    monkeypatch.setattr(roofline, "MFU_PRECISIONS", ("fp32", "bf16"))  # today's main
    per = {p: roofline.peak_flops("cuda", p) for p in ("fp32", "fp16")}
    with pytest.raises(AssertionError, match="would show MFU 802%"):
        check_mfu("T4", per, roofline.mfu_peak("cuda"))


# --- the ladder: no rung the device cannot run -----------------------------------------------------------

def check_plan(gpu: str, plan: dict[str, str | None]) -> None:
    g = GPU_CLASSES[gpu]
    runs = {name for name, why in plan.items() if why is None}
    precisions = {r.value for r in ladder.RUNGS if r.switch == "precision" and r.name in runs}
    assert all(precision_runs(p, "cuda") for p in precisions), f"{gpu}: the plan runs {precisions}"
    fp8 = {r.name for r in ladder.RUNGS if r.switch == "fp8"}
    assert bool(fp8 & runs) == (g.capability >= (8, 9)) or not fp8, f"{gpu}: FP8 rung in the plan: {runs}"
    assert all(why for name, why in plan.items() if name not in runs), plan


@pytest.mark.parametrize("gpu", CLASSES)
def test_the_ladder_plans_no_rung_the_gpu_cannot_run(gpu: str, monkeypatch) -> None:
    fake_gpu(monkeypatch, gpu)  # check_plan asks the device too
    check_plan(gpu, plan(gpu))


def test_planted_capability_blind_precision_check_fails_the_ladder_plan(monkeypatch) -> None:
    from helpers.train import runspec

    monkeypatch.setattr(runspec, "check_precision", lambda precision, device: None)  # asks nothing
    plan = ladder_plan("T4", monkeypatch)  # the T4 stays faked for check_plan
    with pytest.raises(AssertionError, match="T4: the plan runs"):
        check_plan("T4", plan)


# --- the estimator, cross-checked at full size without the memory ----------------------------------------

def test_the_estimator_agrees_with_fake_tensors_at_full_size() -> None:
    """Lessons 02 and 03's small Transformer at full size (8 layers, d 512, vocab 8192, batch 32 x 512, fp32,
    AdamW): one step run under FakeTensorMode on the CPU device with MemTracker, nothing allocated (~6 s).
    Without dropout the CPU's SDPA (its flash kernel) keeps what CUDA's flash / memory-efficient kernels keep,
    a log-sum-exp per row; with dropout the CPU falls back to the math path and stores the H x T x T
    probabilities with their mask (2.9 GiB more at lesson 04's sizes), which CUDA's kernels do not: so no
    dropout here. A fake `cuda` device aborts on a CPU-only torch."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from course.profile import small_config
    from helpers.measure.memory import estimate_training_memory
    from helpers.model.models import SmallTransformer

    cfg = small_config("full", vocab_size=8192, max_len=512)
    with FakeTensorMode():
        model = SmallTransformer(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids, labels = torch.randint(0, 8192, (32, 512)), torch.randint(0, 8192, (32, 512))

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=labels).loss.backward()
            opt.step()

        step()  # AdamW's moments exist from here on
        tracker = MemTracker()
        tracker.track_external(model, opt)
        with tracker:
            step()
        peak = next(iter(tracker.get_tracker_snapshot("peak").values()))["Total"]
    estimated = estimate_training_memory(cfg, 32, 512).peak
    assert peak > 4 * 2**30, peak  # a full-size step, not a toy
    # measured here (torch 2.13, CPU build): 5.90 GiB both ways, activations 4.57 and logits 1.00 alike
    assert abs(estimated / peak - 1) < 0.05, ("GiB estimated, traced", estimated / 2**30, peak / 2**30)


# --- docs/gpus.md: the same decisions, written out ---------------------------------------------------------

def test_docs_gpus_md_is_current() -> None:
    page = render_gpus_doc(decisions, plan, CLASSES)
    assert DOC.read_text(encoding="utf-8") == page, "docs/gpus.md is not current: python tests/gpus_doc.py"
    t4 = "| T4 | Tesla T4 | 7.5 | 14.8 | fp16 | memory-efficient | no | no (40 SMs < 68) | fp16 65.0 TFLOP/s"
    assert t4 in page and "| T4 | full | BATCH 2/4 |" in page
