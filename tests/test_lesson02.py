"""Lesson 02's checks (course.lessons.lesson02) pass on what the lesson measures and fail on planted errors:
each `check_...` the notebook calls in one line is called here with the error it is there to catch."""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course.lessons import lesson02
from helpers.core.tables import Table
from helpers.train.runspec import RunSpec

# --- section 1: the formats ---------------------------------------------------------------------------


def test_format_facts_hold(capsys):
    lesson02.check_format_facts()
    assert "checked: fp16 underflows" in capsys.readouterr().out
    assert [row[0] for row in lesson02.format_table().rows][:3] == ["fp32", "fp16", "bf16"]


@pytest.mark.parametrize("planted, message", [
    (dict(fp16=torch.bfloat16), "should underflow"),  # the formats swapped: bf16 does not underflow at 1e-8
    (dict(bf16=torch.float16), "should survive"),  # fp16 taken for bf16: 1e-8 vanishes
    (dict(fp16=torch.float32, bf16=torch.float32), "should underflow"),  # no 16-bit format at all
])
def test_planted_format_mixups_fail(planted, message):
    with pytest.raises(AssertionError, match=message):
        lesson02.check_format_facts(**planted)


def test_tf32_is_off_for_matmuls_by_default_and_one_line_turns_it_on():
    """Issue 50: the lesson says PyTorch leaves TF32 off for float32 matmuls (precision "highest") and lets
    cuDNN's convolutions use it; `set_float32_matmul_precision("high")` turns it on. Read in a fresh process,
    where nothing of the course has touched the settings."""
    import subprocess
    import sys

    probe = ("import torch; a = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,"
             " torch.backends.cudnn.allow_tf32); torch.set_float32_matmul_precision('high');"
             " print(a, torch.backends.cuda.matmul.allow_tf32)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "('highest', False, True) True"


# --- section 2: autocast ---------------------------------------------------------------------------------

OPS = {"F.linear": lambda t: F.linear(t["x"], t["w"]),
       "F.cross_entropy": lambda t: F.cross_entropy(t["x"], t["labels"]),
       "x + x (elementwise)": lambda t: t["x"] + t["x"]}


def test_autocast_groups_on_this_cpu(capsys):
    table, groups = lesson02.autocast_table(OPS, ["bf16"], "cpu")
    assert isinstance(table, Table) and len(table.rows) == 3
    assert groups == {(op, "bf16"): want for op, want in lesson02.EXPECTED_GROUPS.items()}
    lesson02.check_autocast_groups(groups, ["bf16"])
    assert "checked (bf16)" in capsys.readouterr().out


def test_planted_autocast_that_does_nothing_fails(monkeypatch):
    # autocast not applied at all (a context that does nothing): the matmul follows its input
    monkeypatch.setattr(RunSpec, "autocast", lambda self, device: contextlib.nullcontext())
    _, groups = lesson02.autocast_table(OPS, ["bf16"], "cpu")
    with pytest.raises(AssertionError, match="F.linear under bf16 autocast: expected the 16-bit list"):
        lesson02.check_autocast_groups(groups, ["bf16"])


@pytest.mark.parametrize("op, wrong", [("F.linear", "follows its input"), ("F.cross_entropy", "16-bit list"),
                                       ("x + x (elementwise)", "float32 list")])
def test_planted_wrong_group_fails(op, wrong):
    groups = {(o, "fp16"): g for o, g in lesson02.EXPECTED_GROUPS.items()} | {(op, "fp16"): wrong}
    with pytest.raises(AssertionError, match=f"{op.split(' ')[0]}.* under fp16 autocast"):
        lesson02.check_autocast_groups(groups, ["fp16"])


def test_autocast_group_reads_the_two_dtypes():
    low, f32 = torch.bfloat16, torch.float32
    assert lesson02.autocast_group(low, low, low) == "16-bit list"
    assert lesson02.autocast_group(f32, f32, low) == "float32 list"
    assert lesson02.autocast_group(f32, low, low) == "follows its input"
    assert lesson02.autocast_group(low, f32, low).startswith("other")


# --- section 3: the runs learn ---------------------------------------------------------------------------

def _run(losses, times=(0.5, 0.1, 0.1, 0.1)):
    return SimpleNamespace(losses=list(losses), step_times_s=list(times))


GOOD = {"fp32": _run([6.2, 5.0, 3.0, 2.0]), "bf16": _run([6.25, 5.1, 3.2, 2.1])}


def test_runs_that_learn_pass(capsys):
    lesson02.check_runs_learn(GOOD)
    assert "fp32 6.200 -> 2.000" in capsys.readouterr().out


@pytest.mark.parametrize("planted, message", [
    ({"bf16": _run([6.6, 5.0, 3.0, 2.0])}, "more than 2% apart"),  # another start: other weights or data
    ({"bf16": _run([6.2, 6.1, 6.0, 6.0])}, "bf16 did not learn"),  # a precision whose loss does not fall
])
def test_planted_runs_fail(planted, message):
    with pytest.raises(AssertionError, match=message):
        lesson02.check_runs_learn(GOOD | planted)


def test_median_step_leaves_out_the_first_and_needs_two():
    assert lesson02.median_step_s(_run([1.0], times=(9.0, 1.0, 2.0, 3.0))) == 2.0
    with pytest.raises(ValueError, match="none after the warm-up"):
        lesson02.median_step_s(_run([1.0], times=(9.0,)))


# --- section 4: the GradScaler ---------------------------------------------------------------------------

def test_overflowing_scale_matches_the_lesson():
    assert lesson02.overflowing_scale(2.0 ** 20, 8 * 64) == (26, 14)  # smoke: 512 tokens, 2**26 > 2*65504*512
    assert lesson02.overflowing_scale(2.0 ** 40, 1) == (40, 28)  # a higher first scale wins
    with pytest.raises(ValueError):
        lesson02.overflowing_scale(0, 10)


def _fp16_steps(steps: int, direct_step: bool = False) -> list[lesson02.ScalerStep]:
    """The lesson's hand-written fp16 loop on a tiny model whose gradients overflow at the first scales;
    `direct_step` is the planted bug: the gradients unscaled, then optimizer.step() called directly instead of
    scaler.step (which skips a step with inf gradients)."""
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24)
    x = torch.randn(16, 8)
    log = []
    for step in range(steps):
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
        scale = scaler.get_scale()
        if direct_step:
            scaler.unscale_(optimizer)
            optimizer.step()
        else:
            scaler.step(optimizer)
        scaler.update()
        changed = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
        log.append(lesson02.ScalerStep(step, scale, finite, changed, scaler.get_scale()))
    return log


def test_skipped_steps_leave_the_weights(capsys):
    log = _fp16_steps(12)
    lesson02.check_skipped_steps(log)
    assert "left the weights alone" in capsys.readouterr().out
    assert isinstance(lesson02.scaler_table(log), Table)


def test_planted_direct_optimizer_step_fails():
    with pytest.raises(AssertionError, match="had an overflowed gradient and still changed the weights"):
        lesson02.check_skipped_steps(_fp16_steps(12, direct_step=True))


@pytest.mark.parametrize("planted, message", [
    ([(False, False), (True, True)], None),  # the lesson's pattern: passes
    ([(True, True), (True, True)], "no step overflowed"),  # a first scale too low to show a skip
    ([(False, False), (True, False)], "did not update the weights"),  # a clean step that changed nothing
    ([(False, False), (False, False)], "every step overflowed"),  # a scale that never came down
])
def test_planted_scaler_logs(planted, message):
    log = [lesson02.ScalerStep(i, 2.0 ** (20 - i), finite, changed, 2.0 ** (19 - i))
           for i, (finite, changed) in enumerate(planted)]
    if message is None:
        lesson02.check_skipped_steps(log)
    else:
        with pytest.raises(AssertionError, match=message):
            lesson02.check_skipped_steps(log)


def _trained_scaler() -> torch.amp.GradScaler:
    """A scaler in mid-run: its scale came down to 2**17; 4 clean steps count towards the next doubling."""
    scaler = torch.amp.GradScaler("cpu")
    scaler.load_state_dict({"scale": 2.0 ** 17, "growth_factor": 2.0, "backoff_factor": 0.5,
                            "growth_interval": 2000, "_growth_tracker": 4})
    return scaler


def test_a_scaler_resumed_from_a_checkpoint_goes_on(tmp_path, capsys):
    saved = _trained_scaler()
    path = tmp_path / "ckpt.pt"
    torch.save({"scaler": saved.state_dict()}, path)
    resumed = torch.amp.GradScaler("cpu")
    resumed.load_state_dict(torch.load(path, weights_only=True)["scaler"])
    lesson02.check_scaler_resumed(resumed, saved)
    assert "at scale 131072, with 4 clean steps" in capsys.readouterr().out


def test_planted_scaler_not_loaded_fails():
    # resumed without load_state_dict: a fresh scaler at 2**16 with no clean steps counted
    with pytest.raises(AssertionError, match="scaler's scale is 65536.0, the saved one's 131072.0"):
        lesson02.check_scaler_resumed(torch.amp.GradScaler("cpu"), _trained_scaler())


def test_planted_growth_tracker_lost_fails():
    saved = _trained_scaler()
    state = saved.state_dict() | {"_growth_tracker": 0}  # the scale saved, its clean steps forgotten
    resumed = torch.amp.GradScaler("cpu")
    resumed.load_state_dict(state)
    with pytest.raises(AssertionError, match="_growth_tracker is 0, the saved one's 4"):
        lesson02.check_scaler_resumed(resumed, saved)


# --- sections 5 and 6: matmuls -----------------------------------------------------------------------------

def test_matmul_close_passes_bf16_and_fails_a_wrong_product():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    ref = a @ b
    assert lesson02.check_matmul_close(a.bfloat16() @ b.bfloat16(), ref, "bfloat16") < 2e-2
    with pytest.raises(AssertionError, match="transposed matmul is wrong: relative error"):
        lesson02.check_matmul_close(a.bfloat16() @ b.bfloat16().T, ref, "transposed")  # planted: b.T


def test_matmul_size_table_rates_every_size(capsys):
    table = lesson02.matmul_size_table("cpu", torch.float32, [32, 33], min_run_time=0.06)
    assert [row[:2] for row in table.rows] == [(32, True), (33, False)]
    assert table.rows[0][3] == 1.0 and all(math.isfinite(row[2]) for row in table.rows)
    assert capsys.readouterr().out.strip()  # one line: within the noise, a ratio, or no verdict
    with pytest.raises(ValueError, match="two or more"):
        lesson02.matmul_size_table("cpu", torch.float32, [32])


# --- the summary ---------------------------------------------------------------------------------------

def test_planted_summary_before_the_gpu_cell_fails():
    with pytest.raises(AssertionError, match="run the GPU-only cell above first"):
        lesson02.summary_table({}, {}, None)


def _timed_run(step_s: float, peak: int):
    from helpers.train.meter import TrainResult

    return TrainResult(losses=[2.0, 1.0], step_times_s=[step_s] * 4, tokens_per_s=1.0, samples_per_s=1.0,
                       mfu=None, peak_memory_bytes=peak, steps_done=4, resumed_from=None)


def test_the_summary_judges_no_timing_when_other_programs_took_the_cpus(capsys):
    from types import SimpleNamespace

    from helpers.core.timing import CpuLoad

    class Probe:  # a LoadProbe that read `others` over the run
        def __init__(self, others):
            self.others = others

        def read(self):
            return CpuLoad(self.others, 60.0, 2)

    results = {"fp32": _timed_run(0.10, 1000), "bf16": _timed_run(0.05, 600)}  # 2.0x: inside C2's 1.5-2.3x
    fit = SimpleNamespace(full={"WIDE_D_MODEL": 512})
    row = "AMP step-time speed-up (fp32 / bf16)"
    for others, want in ((0.0, "holds"), (0.7, "too busy to judge")):
        S = SimpleNamespace(DEVICE=torch.device("cpu"), AMP=None, FIT=fit, WIDE_D_MODEL=512,
                            LOAD=Probe(others))
        summary = lesson02.summary_table(results, {"wide_speedup": None}, S)
        # planted: other programs took 70 % of the CPUs over the run (issue 39: verdicts printed under load)
        assert summary.verdicts[row] == want, (others, summary.verdicts)
        assert summary.verdicts["AMP peak-memory saving (bf16)"] == "holds"  # memory: judged as ever
        out = capsys.readouterr().out
        assert ("2.00x the speed of fp32" in out) == (want == "holds"), out


# --- section 3: MFU by hand (issue 50) ----------------------------------------------------------------------

def _counted(flops_per_token: float) -> SimpleNamespace:
    return SimpleNamespace(flops_per_token=flops_per_token)


def _small_model():
    from course.profile import small_config
    from helpers.model.models import SmallTransformer

    return SmallTransformer(small_config("smoke", vocab_size=256, max_len=16))


def _by_hand(model, count) -> float:
    c = model.cfg
    return 6 * count(model) + 12 * c.n_layers * c.n_heads * (c.d_model // c.n_heads) * 16


def _matmul_params(model) -> int:  # the notebook's N
    return sum(p.numel() for p in {id(p): p for m in model.modules() if isinstance(m, nn.Linear)
                                   for p in m.parameters()}.values())


def test_the_formula_by_hand_is_the_training_loops_count(capsys):
    from helpers.measure.flops import model_flops_per_token

    model = _small_model()
    counted = _counted(model_flops_per_token(model, 16))
    lesson02.check_flops_per_token(_by_hand(model, _matmul_params), counted)
    assert "the training loop's count exactly" in capsys.readouterr().out
    everything = _by_hand(model, lambda m: sum(p.numel() for p in m.parameters()))  # planted: every parameter
    with pytest.raises(AssertionError, match="does N count every nn.Linear"):
        lesson02.check_flops_per_token(everything, _counted(model_flops_per_token(model, 16)))


def test_counting_every_parameter_of_bert_base_counts_about_30_percent_more():
    """The slip of issue 50: `sum(p.numel())` for BERT-base gives about 30 % more FLOPs than 6·N."""
    from transformers import AutoModelForSequenceClassification

    from helpers.model.models import bert_config

    with torch.device("meta"):
        bert = AutoModelForSequenceClassification.from_config(bert_config("base", 2))
    everything, n = sum(p.numel() for p in bert.parameters()), _matmul_params(bert)
    # lesson 08 cites the two counts: "85.6 M of its 109.5 M parameters"
    assert (round(everything / 1e6, 1), round(n / 1e6, 1)) == (109.5, 85.6)
    assert 0.25 < everything / n - 1 < 0.32
