"""helpers.train.ladder, helpers.train.ladder_report and benchmarks/ladder.py (lesson 08): rungs checked
before timing
(helpers.measure.agreement), the greedy rule, one timing session per row, MFU on useful FLOPs, device-specific
explanations, results written with their stamp, and lesson 08's checks of a climb on planted bugs."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from helpers.core.precision import tf32_enabled
from helpers.core.timing import Timing, time_interleaved
from helpers.measure import agreement
from helpers.model import models
from helpers.train import ladder, ladder_report
from helpers.train.runspec import PADDINGS, RunSpec

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("ladder_benchmark", ROOT / "benchmarks" / "ladder.py")
bench = importlib.util.module_from_spec(_spec)  # the published run: run_ladder, to_markdown, targets
_spec.loader.exec_module(bench)

# BERT-shaped but small, with a small vocabulary: the embedding table would dominate a tiny model's step
TEST_SIZE = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
                 vocab_size=2000)
LENGTHS = [5, 31, 12, 32, 20, 7, 32, 16]  # tokens per sample, as corpus_lengths would give them
SMALL = dict(model="test", seq_len=32, batch_size=4, n_batches=2, repeats=2, lengths=LENGTHS, device="cpu",
             peak_flops=1e11)
# compiling takes a minute on a small CPU: the tests climb the ladder without torch.compile
NO_COMPILE = tuple(r for r in ladder.RUNGS if r.switch != "compile")
# the greedy logic's tests: the rungs one device climbs (fp16 + GradScaler is the rung of GPUs without bf16)
ONE_16_BIT = tuple(r for r in ladder.RUNGS if r.value != "fp16")


@pytest.fixture(autouse=True)
def _test_size(monkeypatch):
    monkeypatch.setitem(models.MODEL_SIZES, "test", TEST_SIZE)


def _t(median: float, iqr: float) -> Timing:
    return Timing("t", median, iqr, 5, 1)


def _batches():
    return ladder.sample_batches(LENGTHS, batch_size=2, n_batches=3, seq_len=32, vocab=2000, n_classes=5)


def test_batches_hold_the_same_samples_whatever_the_padding():
    batches, check = _batches()

    def samples(bs):
        return sorted(tuple(ids[m.bool()].tolist())
                      for b in bs for ids, m in zip(b["input_ids"], b["attention_mask"]))

    assert samples(batches["fixed"]) == samples(batches["bucketed"])
    assert all(b["input_ids"].shape[1] == 32 for b in batches["fixed"])
    assert sum(b["input_ids"].numel() for b in batches["bucketed"]) < sum(b["input_ids"].numel()
                                                                           for b in batches["fixed"])
    # the check batches hold the same samples in the same order, so logits compare row by row
    f, d = check["fixed"], check["bucketed"]
    width = d["input_ids"].shape[1]
    assert torch.equal(f["input_ids"][:, :width], d["input_ids"]) and torch.equal(f["labels"], d["labels"])


def test_agree_uses_the_tolerance_of_the_looser_precision():
    ref = torch.tensor([1.0, -2.0])
    assert agreement.agree(ref + 1e-3, ref, "bf16").ok
    assert not agreement.agree(ref + 1e-3, ref, "fp32").ok
    assert agreement.looser("fp32", "bf16") == "bf16" and agreement.looser("tf32", "fp32") == "tf32"
    with pytest.raises(ValueError, match="unknown precision"):
        agreement.looser("fp64", "fp32")


def test_greedy_rule_keeps_only_what_is_faster_beyond_the_spread():
    best = _t(1.0, 0.05)
    assert ladder.keeps(_t(0.8, 0.02), best).keep  # 1.25x > 1.05
    assert not ladder.keeps(_t(0.97, 0.02), best).keep  # 1.03x: within the 5 % spread
    assert not ladder.keeps(_t(0.9, 0.2), best).keep  # 1.11x, but the candidate spreads 22 %
    assert not ladder.keeps(_t(1.5, 0.01), best).keep  # slower
    with pytest.raises(ValueError, match="positive median"):
        ladder.keeps(_t(0.0, 0.0), best)


def _fake_measure(seconds: dict[str, float], iqr: float = 0.01):
    """A timing function: each stack's time is the product of its switches' factors (no real work)."""
    def measure(stack, ref):
        t = 1.0
        for rung in ladder.RUNGS:
            on = getattr(stack, rung.switch) == rung.value
            if rung.switch in ("precision", "padding"):  # ladders of their own: bf16 includes TF32,
                order = agreement.PRECISION_ORDER if rung.switch == "precision" else PADDINGS  # packing
                on = order.index(getattr(stack, rung.switch)) >= order.index(rung.value)  # removes more
            if on:
                t *= seconds.get(rung.name, 1.0)
        return ladder.Arm(stack, _t(t, iqr * t), None, {"samples_per_s": 1 / t})
    return measure


def test_greedy_stack_leaves_out_what_is_slower_here_and_keeps_what_pays():
    # as on this CPU: bf16 and compile slower, TF32 the same math, fused AdamW and padding faster
    cpu_like = {"+ bf16 autocast": 3.0, "+ torch.compile": 1.2, "+ fused AdamW": 0.7,
                "+ length bucketing": 0.6}
    _, steps, stack = ladder.climb(ONE_16_BIT, _fake_measure(cpu_like), greedy=True, log=lambda s: None)
    assert stack == ladder.BASELINE.replace(fused_adamw=True, padding="bucketed")
    assert [s.decision.keep for s in steps] == [False, False, False, False, True, True, False, False]
    # the other way round: on a GPU-like machine every rung pays and all are kept
    gpu_like = {r.name: 0.8 for r in ladder.RUNGS}
    _, _, stack = ladder.climb(ONE_16_BIT, _fake_measure(gpu_like), greedy=True, log=lambda s: None)
    everything = dict(precision="bf16", attn="sdpa", compile=True, fused_adamw=True, padding="packed",
                      fp8=True)
    assert stack == ladder.BASELINE.replace(**everything)
    # cumulative: every rung is added whatever it measured
    _, _, stack = ladder.climb(ONE_16_BIT, _fake_measure(cpu_like), greedy=False, log=lambda s: None)
    assert stack.precision == "bf16" and stack.compile


def test_greedy_rung_is_compared_with_the_best_stack_so_far():
    seen = []

    def measure(stack, ref):
        seen.append((stack, ref.stack if ref else None))
        return _fake_measure({"+ bf16 autocast": 3.0})(stack, ref)

    ladder.climb(ONE_16_BIT[:3], measure, greedy=True, log=lambda s: None)
    # SDPA is added to fp32 (bf16 was dropped), and checked against the fp32 baseline
    assert seen[-1] == (ladder.BASELINE.replace(attn="sdpa"), ladder.BASELINE)


def test_time_budget_leaves_rungs_unmeasured():
    _, steps, _ = ladder.climb(ladder.RUNGS, _fake_measure({}), time_budget_s=0.0, log=lambda s: None)
    assert all(s.arm is None for s in steps)


def test_tf32_agreement_check_runs_with_tf32_on():
    # the old check compared fp32 with fp32; each forward pass must run with its own precision's TF32 switch
    from transformers import BertForSequenceClassification

    seen = []
    model = BertForSequenceClassification(models.bert_config("test", 5)).eval()
    model.classifier.register_forward_pre_hook(lambda m, a: seen.append(torch.get_float32_matmul_precision()))
    _, check = _batches()
    before = torch.get_float32_matmul_precision()
    for precision in ("fp32", "tf32", "bf16"):
        spec = RunSpec(precision=precision)
        with spec.step_context("cpu"), spec.autocast("cpu"):
            model(**check["fixed"])
    assert seen == ["highest", "high", "high"]  # TF32 stays on for what runs in fp32 after its rung
    assert torch.get_float32_matmul_precision() == before  # restored


def test_fused_adamw_is_checked_by_one_optimizer_step():
    w = torch.nn.Parameter(torch.randn(50))
    w.grad = torch.randn(50)
    same = agreement.optimizer_step_agreement([w], lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=False),
                                           lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True))
    assert same.ok
    planted = agreement.optimizer_step_agreement([w], lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                                              lambda ps: torch.optim.AdamW(ps, lr=1.1e-3))
    assert not planted.ok  # a different update is caught, which a forward-logits check never sees


def test_every_rung_is_checked_then_timed():
    result = bench.run_ladder(**SMALL, rungs=NO_COMPILE, log=lambda *a: None)
    rows = result["rows"]
    assert [r["name"] for r in rows[1:]] == [r.name for r in NO_COMPILE]
    timed = [r for r in rows[1:] if "skipped" not in r]
    # on a CPU: FP8 needs compute capability 8.9, fp16 + GradScaler is the rung of GPUs without bf16, and
    # TF32 would run the same fp32 matmuls (no TF32 units)
    assert {r["name"] for r in rows[1:] if "skipped" in r} == {"+ FP8", "+ fp16 autocast + GradScaler",
                                                               "+ TF32"}
    assert all("≤" in r["check_logits"] and "≤" in r["check_loss"] for r in timed), [r["why"] for r in timed]
    fused = next(r for r in rows if r["name"] == "+ fused AdamW")
    assert "≤" in fused["check_optimizer"]
    assert rows[0]["speedup"] == 1.0
    assert all(r["samples_per_s"] > 0 and r["mfu"] > 0 for r in [rows[0], *timed])
    by = {r["name"]: r for r in rows}
    bucketed, packed = by["+ length bucketing"], by["+ packing"]
    assert packed["padded_fraction"] <= bucketed["padded_fraction"] < rows[0]["padded_fraction"]
    assert "padding" in bucketed["why"]
    # MFU on useful FLOPs: the same samples padded, bucketed or packed do the same useful work, so
    # removing padding cannot lower MFU (the old MFU counted padded positions)
    assert rows[0]["useful_flops_per_pass"] == pytest.approx(packed["useful_flops_per_pass"])
    fp8 = by["+ FP8"]
    assert "samples_per_s" not in fp8 and "skipped" in fp8["why"] and "8.9" in fp8["why"]


def test_a_rung_that_disagrees_is_neither_timed_nor_kept(monkeypatch):
    # SDPA in fp32 differs from eager attention by rounding only; with a zero tolerance that must fail
    monkeypatch.setitem(agreement.TOLERANCES, "fp32", (0.0, 0.0))
    sdpa = next(r for r in ladder.RUNGS if r.switch == "attn")
    result = bench.run_ladder(**SMALL, rungs=(sdpa,), greedy=True, log=lambda *a: None)
    row = result["rows"][1]
    assert "disagrees" in row["why"] and "samples_per_s" not in row and not row["kept"]
    assert result["your_stack"]["attn"] == "eager"


def test_why_notes_describe_the_device_that_ran(monkeypatch):
    tf32, bf16 = ladder.RUNGS[0], ladder.RUNGS[1]
    cpu = torch.device("cpu")
    assert "CPU" in ladder_report.explain(tf32, ladder.Decision(False, 1.0, 1.1), cpu)
    h200 = {"type": "cuda", "cap": (9, 0), "name": "NVIDIA H200"}
    monkeypatch.setattr(ladder_report, "device_facts", lambda d: h200)  # the report's own import
    kept = ladder.Decision(True, 1.8, 1.1)
    on_gpu = ladder_report.explain(tf32, kept, cpu), ladder_report.explain(bf16, kept, cpu)
    assert all("CPU" not in note for note in on_gpu) and "tensor cores" in on_gpu[0]
    assert "pays" in on_gpu[1]
    # the verdict follows the rule: faster, but within the noise, is not called a gain
    noisy = ladder_report.explain(bf16, ladder.Decision(False, 1.3, 1.5), cpu)
    assert "pays here" not in noisy and "less than the noise" in noisy
    # a CPU is described by its own instruction sets: AVX512-BF16 is not "no bf16 units"
    monkeypatch.setattr(ladder_report, "device_facts", lambda d: {"type": "cpu", "cpu_capability": "AVX512",
                                                           "amx": False, "avx512_bf16": True})
    assert "AVX512-BF16" in ladder_report.explain(bf16, kept, cpu)


def test_results_are_written_with_their_stamp(tmp_path):
    from course.results import write_results

    result = bench.run_ladder(**SMALL, rungs=NO_COMPILE[:2], greedy=True, log=lambda *a: None)
    import matplotlib.pyplot as plt

    paths = write_results("ladder", result, bench.to_markdown(result), fig=plt.figure(), out_dir=tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["stamp"]["device_type"] == "cpu" and data["stamp"]["torch"] == torch.__version__
    md = paths["md"].read_text()
    assert data["stamp"]["date"] in md and "| fp32 eager (baseline) |" in md and "RunSpec(" in md
    assert paths["png"].stat().st_size > 0 and paths["json"].name == "ladder-cpu.json"


def test_a_run_stopped_after_its_first_rung_leaves_a_file_with_that_rung(tmp_path, monkeypatch):
    # the benchmark writes its results after each rung: a run killed at a time limit keeps what it finished
    # (a benchmark that writes only at the end leaves no file here)
    calls = []
    real = ladder.measure_stack

    def measure(stack, *args, **kwargs):
        calls.append(stack)
        if len(calls) == 3:  # the baseline, the first rung, then the run is stopped
            raise KeyboardInterrupt
        return real(stack, *args, **kwargs)

    monkeypatch.setattr(ladder, "measure_stack", measure)
    monkeypatch.setattr(bench, "corpus_lengths", lambda *a, **k: (LENGTHS, "test lengths"))
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--model", "test", "--seq-len", "32", "--batch-size", "4", "--batches", "2", "--repeats",
                    "2", "--device", "cpu", "--greedy", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "ladder-cpu-greedy.json").read_text())
    # on a CPU + TF32 is skipped (no TF32 units), + bf16 autocast is the first rung measured
    assert [r["name"] for r in data["rows"]] == ["fp32 eager (baseline)", "+ TF32", "+ bf16 autocast",
                                                 "+ fp16 autocast + GradScaler"]  # then + SDPA was stopped
    assert "skipped" in data["rows"][1] and "samples_per_s" in data["rows"][2]
    assert data["rows"][2]["kept"] in (True, False)
    assert data["partial"] == f"3 of {len(ladder.RUNGS)} rungs done"
    assert "Partial result: 3 of" in (tmp_path / "ladder-cpu-greedy.md").read_text()


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="unknown model size"):
        models.bert_config("huge", 2)
    with pytest.raises(ValueError, match="RunSpec.precision"):
        RunSpec(precision="fp64")
    with pytest.raises(ValueError, match="not a RunSpec switch"):
        ladder.Rung("+ magic", "magic", True, "")
    with pytest.raises(ValueError, match="need 8 samples"):
        ladder.sample_batches(LENGTHS[:3], batch_size=4, n_batches=2, seq_len=32, vocab=2000, n_classes=5)
    with pytest.raises(ValueError, match="seq_len 4"):
        bench.run_ladder(**{**SMALL, "seq_len": 4})


def test_your_stack_is_described_as_the_code_of_its_spec():
    code = ladder.BASELINE.replace(precision="bf16", compile=True, padding="bucketed").describe()
    assert "precision='bf16'" in code and "compile=True" in code and "padding='bucketed'" in code
    assert "compile" not in dataclasses.replace(ladder.BASELINE).describe()


def test_timed_passes_run_backward_and_the_optimizer_step_with_the_stacks_tf32(monkeypatch):
    # issue 18: the TF32 rung was timed with TF32 on in the forward pass only (the context closed before
    # backward). Record the switch where the backward pass and the optimizer step run.
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from transformers import BertForSequenceClassification

    seen = {"backward": [], "step": []}
    hook = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: seen["step"].append(tf32_enabled()))

    def make_model():
        torch.manual_seed(0)
        return BertForSequenceClassification(models.bert_config("test", 5))

    apply = RunSpec.apply

    def apply_and_hook(spec, model):  # hook the model the stack trains (transformers 4.x rebuilds it)
        run = apply(spec, model)
        getattr(run, "model", run).classifier.weight.register_hook(
            lambda g: seen["backward"].append(tf32_enabled()))
        return run

    monkeypatch.setattr(RunSpec, "apply", apply_and_hook)
    batches, check = _batches()
    try:
        ladder.measure_stack(ladder.BASELINE.replace(precision="tf32"), None, make_model=make_model,
                             batches=batches, check=check, device=torch.device("cpu"), repeats=1)
    finally:
        hook.remove()
    assert seen["backward"] and seen["step"]
    assert all(seen["backward"]) and all(seen["step"]), seen  # TF32 on for all of the step
    assert not tf32_enabled()  # and off again afterwards


def test_command_line_keeps_the_flags_gpu_check_uses(capsys):
    # the script's own parser, in this process (a `python benchmarks/ladder.py --help` costs 8 s of imports)
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    out = capsys.readouterr().out
    for flag in ("--gpu-target", "--time-budget", "--greedy", "--out", "--note"):
        assert flag in out


def test_capstone_charts_carry_titles_labels_and_units():
    import matplotlib.pyplot as plt

    from course.plots import confusion_matrix_chart, ladder_chart

    fig = ladder_chart({"fp32 eager": 1.0, "+ bf16": 0.5}, title="ladder",
                       accuracy={"fp32 eager": 0.9, "+ bf16": 0.92})
    bars, acc = fig.axes[:2]
    assert bars.get_title() == "ladder" and "speed-up" in bars.get_ylabel() and "%" in acc.get_ylabel()
    assert [t.get_text() for t in bars.texts] == ["1.00×", "0.50×"]  # the side-by-side speed-ups, as given
    with pytest.raises(ValueError, match="no speed"):
        ladder_chart({"a": 1.0}, title="t", accuracy={"b": 0.5})
    # the greedy chart answers its question: kept and dropped rungs look different, and a legend says which
    fig = ladder_chart({"fp32 eager": 1.0, "+ TF32": 0.97, "+ SDPA": 1.05}, title="greedy",
                       kept={"fp32 eager": True, "+ TF32": False, "+ SDPA": True})
    ax = fig.axes[0]
    looks = [(b.get_facecolor(), b.get_hatch()) for b in ax.patches]
    assert looks[0] == looks[2] != looks[1]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["kept in your stack",
                                                                   "dropped: not faster beyond the noise"]
    with pytest.raises(ValueError, match="no speed"):
        ladder_chart({"a": 1.0}, title="t", kept={"b": True})
    # a dropped rung can stand taller than a kept one timed in another session: its ratio to the stack below
    # (what the keep rule judged) is written inside its bar
    fig = ladder_chart({"fp32 eager": 1.0, "+ fused": 1.98, "+ packing": 2.11}, title="greedy",
                       kept={"fp32 eager": True, "+ fused": True, "+ packing": False},
                       vs_below={"+ fused": 1.77, "+ packing": 0.93})
    inside = [t.get_text() for t in fig.axes[0].texts if "below" in t.get_text()]
    assert inside == ["1.77×\nthe stack\nbelow", "0.93×\nthe stack\nbelow"]
    with pytest.raises(ValueError, match="no speed"):
        ladder_chart({"a": 1.0}, title="t", vs_below={"b": 1.1})
    fig2 = confusion_matrix_chart([[3, 1], [0, 4]], ["x", "y"], title="cm")
    assert fig2.axes[0].get_xlabel() == "predicted class"
    assert [t.get_text() for t in fig2.axes[0].texts] == ["3", "1", "0", "4"]
    with pytest.raises(ValueError, match="2×2"):
        confusion_matrix_chart([[1, 2, 3]], ["x", "y"], title="cm")
    plt.close("all")


def test_arms_are_timed_in_alternation():
    # a load change must fall on every arm: the candidate, the best stack (and the baseline) alternate
    calls = []
    ta, tb = time_interleaved(lambda: calls.append("a"), lambda: calls.append("b"), repeats=3)
    assert calls == ["a", "b", "b", "a", "a", "b"] and ta.runs == tb.runs == 3
    calls.clear()
    assert len(time_interleaved(*(lambda k=k: calls.append(k) for k in "abc"), repeats=2)) == 3
    assert calls == ["a", "b", "c", "c", "b", "a"]


class _Clock:
    """A virtual clock for helpers.core.timing: a pass advances it by its stack's seconds, so timings are
    exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def _clocked_measure(seconds: dict[RunSpec, float], calls: list[str], clock: _Clock):
    """A measure whose passes take `seconds[stack]` on `clock`; its own timing says 10x faster than the
    session will (a quieter machine earlier), so a number taken from it shows up."""
    counts = {"documents_per_pass": 4, "real_tokens_per_pass": 100, "useful_flops_per_pass": 1e6,
              "padded_fraction": 0.25}

    def measure(stack, ref):
        def run():
            calls.append(f"{stack.attn}/{stack.fused_adamw}")
            clock.now += seconds[stack]
        early = seconds[stack] / 10
        return ladder.Arm(stack, Timing("t", early, 0.0, 3, 1), None,
                          {**counts, "samples_per_s": 4 / early, "pass_median_s": early}, run=run)
    return measure


def test_every_number_of_a_row_comes_from_one_timing_session(monkeypatch):
    # issue 24 A12: the greedy file showed TF32 at 32.2 samples/s beside a baseline of 31.6, yet 0.97x: each
    # arm's samples/s came from its own timing, the speed-up from side-by-side ones. Now a candidate is timed
    # in alternation with the stack below AND the baseline, and its whole row comes from that session.
    sdpa = ladder.BASELINE.replace(attn="sdpa")
    fused = sdpa.replace(fused_adamw=True)
    calls, clock = [], _Clock()
    monkeypatch.setattr("helpers.core.timing.time", clock)
    measure = _clocked_measure({ladder.BASELINE: 0.006, sdpa: 0.002, fused: 0.003}, calls, clock)
    rungs = [r for r in ladder.RUNGS if r.switch in ("attn", "fused_adamw")]
    base, steps, final = ladder.climb(rungs, measure, greedy=False, repeats=3, log=lambda s: None)
    # SDPA beside the baseline (ab, ba, ab); fused AdamW beside SDPA and the baseline (abc, cba, abc)
    b, s, f = "eager/False", "sdpa/False", "sdpa/True"
    assert calls == [s, b, b, s, s, b, f, s, b, b, s, f, f, s, b]
    rows = ladder_report.ladder_rows(base, steps, torch.device("cpu"), greedy=False)
    for r in rows[1:]:
        assert r["samples_per_s"] / r["baseline_samples_per_s"] == pytest.approx(r["speedup"], rel=1e-9)
        assert r["samples_per_s"] / r["below_samples_per_s"] == pytest.approx(r["vs_below"], rel=1e-9)
        assert r["pass_median_s"] >= 0.002  # the session's timing, not the early one (a tenth of it)
    yours = ladder_report.your_stack(rows, final)
    assert final == fused and yours["name"] == "+ fused AdamW" and yours["speedup"] == rows[-1]["speedup"]


def test_timed_passes_train_the_model_the_stack_returns(monkeypatch):
    # transformers 4.x switches attention by rebuilding the model (helpers.core.compat): the optimizer must
    # step
    # the model the stack runs, not the one it was built from. Simulated here with a copy.
    import copy

    from transformers import BertForSequenceClassification

    apply, runs = RunSpec.apply, []

    def apply_as_a_rebuild(spec, model):
        runs.append(apply(spec, copy.deepcopy(model)))
        return runs[-1]

    def make_model():
        torch.manual_seed(0)
        return BertForSequenceClassification(models.bert_config("test", 5))

    monkeypatch.setattr(RunSpec, "apply", apply_as_a_rebuild)
    batches, check = _batches()
    ladder.measure_stack(ladder.BASELINE, None, make_model=make_model, batches=batches, check=check,
                         device=torch.device("cpu"), repeats=1)
    before = make_model().classifier.weight
    assert not torch.equal(runs[0].classifier.weight, before), "the optimizer stepped another model"


# --- lesson 08's checks of a climb (course/lessons/lesson08.py): each fails on its planted bug -----------

def _check_cell_source() -> str:
    """The source of lesson 08's check_climb (course.lessons.lesson08), where a test plants a bug."""
    import inspect

    from course.lessons import lesson08

    return inspect.getsource(lesson08.check_climb)


def _lesson_check_climb(device: torch.device, source: str | None = None):
    """lesson 08's check_climb, or the function `source` defines in its module's namespace (a planted bug),
    with the names a planted version may read (the device, fp8_supported)."""
    from course.lessons import lesson08
    from helpers.model.fp8 import fp8_supported

    if source is None:
        return lesson08.check_climb
    ns = {**vars(lesson08), "fp8_supported": fp8_supported, "device": device}
    exec(compile(source, lesson08.__file__, "exec"), ns)
    return ns["check_climb"]


def test_the_lessons_checks_of_a_climb_fail_on_planted_bugs(monkeypatch):
    import copy

    sdpa = ladder.BASELINE.replace(attn="sdpa")
    seconds = {ladder.BASELINE: 0.006, sdpa: 0.002, sdpa.replace(fused_adamw=True): 0.004,
               ladder.BASELINE.replace(fused_adamw=True): 0.004}
    rungs = [r for r in ladder.RUNGS if r.switch in ("attn", "fused_adamw", "fp8")]
    cpu = torch.device("cpu")
    clock = _Clock()
    monkeypatch.setattr("helpers.core.timing.time", clock)

    def cannot_run(stack, rung):  # as on this CPU: the last rung's switch is one the device lacks
        return "not run on this device" if stack.fp8 else None

    base, steps, final = ladder.climb(rungs, _clocked_measure(seconds, [], clock), greedy=True,
                                      skip=cannot_run, log=lambda s: None)
    rows = ladder_report.ladder_rows(base, steps, cpu, greedy=True)
    check = _lesson_check_climb(cpu)
    assert [r["kept"] for r in rows[1:]] == [True, False, False] and final == sdpa
    check(rows, final)  # the climb as it happened passes
    planted = {
        # A12: a row's samples/s from the arm's own early timing, its speed-up from the side-by-side session
        "two timings in a row": lambda r: r[1].update(samples_per_s=4 / (r[1]["pass_median_s"] / 10)),
        "a dropped rung reported kept": lambda r: r[2].update(kept=True),
        "a rung that failed its check": lambda r: r[1].update(why="failed its check, not timed") or
        [r[1].pop(k) for k in list(r[1]) if k == "samples_per_s"],
        # issue 39: a rung timed on a machine too busy to judge gets no verdict, so it is never kept
        "a rung kept though too busy to judge": lambda r: r[1].update(too_busy="others took 60 % of CPUs"),
    }
    for name, plant in planted.items():
        bad = copy.deepcopy(rows)
        plant(bad)
        with pytest.raises(AssertionError):
            check(bad, final)
            pytest.fail(f"lesson 08's checks missed {name}")
    with pytest.raises(AssertionError, match="not the baseline plus the kept rungs"):
        check(rows, sdpa.replace(fused_adamw=True))  # your stack with a dropped rung's switch in it
    busy = copy.deepcopy(rows)  # the SDPA rung too busy to judge: dropped though faster, the baseline stays
    busy[1].update(too_busy="others took 60 % of the CPUs", kept=False)
    check(busy, ladder.BASELINE)


def test_lesson_08s_ladder_on_a_t4_skips_what_it_cannot_run_and_goes_on(monkeypatch):
    # issue 30: a T4 (compute capability 7.5) has fp16 tensor cores and no bf16 ones, no FP8. The plan is
    # lesson 08's (its rungs, its device); the climb runs on a virtual clock; the checks are the lesson's own.
    import collections

    from fakegpu import fake_gpu

    fake_gpu(monkeypatch, "T4")
    t4 = torch.device("cuda")
    planned = {p["name"]: p["skipped"] for p in ladder.plan_rungs(t4)}
    # no TF32 units before compute capability 8.0 (issue 39 point 3): "+ TF32" would time the same fp32 math
    assert {n for n, why in planned.items() if why} == {"+ TF32", "+ bf16 autocast", "+ FP8"}
    assert "TF32" in planned["+ TF32"] and "FP8" in planned["+ FP8"]  # each skip gives its own reason
    assert "use fp16" in planned["+ bf16 autocast"] and planned["+ fp16 autocast + GradScaler"] is None
    clock = _Clock()
    monkeypatch.setattr("helpers.core.timing.time", clock)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)  # nothing runs on the fake T4
    seconds = collections.defaultdict(lambda: 0.006, {ladder.BASELINE.replace(precision="fp16"): 0.003})
    base, steps, final = ladder.climb(ladder.RUNGS, _clocked_measure(seconds, [], clock), greedy=True,
                                      skip=lambda stack, rung: planned[rung.name], log=lambda s: None)
    rows = ladder_report.ladder_rows(base, steps, t4, greedy=True)
    assert final.precision == "fp16"  # the T4's mixed precision: fp16 with its GradScaler
    _lesson_check_climb(t4)(rows, final)  # the lesson goes on
    # planted: the old check, which let only FP8 go unmeasured, stops the lesson at the first rung a T4 skips
    source = _check_cell_source()
    today = source.replace('assert r["why"] == "already in the stack" or r.get("skipped")',
                           'assert r["why"] == "already in the stack" or (r["name"] == "+ FP8" and not '
                           'fp8_supported(device)[0])')
    assert today != source
    with pytest.raises(AssertionError, match=r"\+ TF32: skipped: .*no TF32 tensor cores"):
        _lesson_check_climb(t4, today)(rows, final)


def test_the_ladder_and_its_report_import_one_way():
    # issue 32: ladder imported ladder_report in a function and ladder_report imported ladder for its types
    import ast

    def imported(module: str) -> set[str]:
        tree = ast.parse((ROOT / "helpers" / "train" / f"{module}.py").read_text())
        names = set()
        for node in ast.walk(tree):  # function-level and TYPE_CHECKING imports included
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("helpers"):
                names.add(node.module.rsplit(".", 1)[-1])
                names.update(a.name for a in node.names if node.module == "helpers")
            elif isinstance(node, ast.Import):
                names.update(a.name.rsplit(".", 1)[-1] for a in node.names
                             if a.name.startswith("helpers"))
        return names

    assert "ladder_report" in imported("ladder")
    assert "ladder" not in imported("ladder_report"), "ladder_report imports ladder: a cycle"


def test_a_rung_that_runs_out_of_memory_is_reported_and_the_climb_goes_on():
    """A stack that does not fit (a CUDA OOM while it is checked or timed) is a row with the memory it asked,
    not the end of the ladder; any other error still stops it."""
    timing = _fake_measure({"+ fused AdamW": 0.5})
    msg = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 14.74 GiB of which "
           "1.10 GiB is free. Of the allocated memory 12.90 GiB is allocated by PyTorch")

    def measure(stack, ref):
        if stack.compile:
            raise torch.cuda.OutOfMemoryError(msg)
        return timing(stack, ref)

    rungs = [r for r in ONE_16_BIT if r.switch in ("compile", "fused_adamw")]
    assert [r.switch for r in rungs] == ["compile", "fused_adamw"]
    _, steps, stack = ladder.climb(rungs, measure, greedy=True, log=lambda s: None)
    assert steps[0].arm is None and "did not fit" in steps[0].note and "asked for 2.00 GiB" in steps[0].note
    assert steps[1].decision.keep and stack == ladder.BASELINE.replace(fused_adamw=True)

    def broken(stack, ref):
        if stack.compile:
            raise RuntimeError("an unrelated bug")
        return timing(stack, ref)

    with pytest.raises(RuntimeError, match="unrelated"):
        ladder.climb(rungs, broken, greedy=True, log=lambda s: None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU --gpu-target runs the real thing")
def test_the_gpu_target_asks_for_cuda_instead_of_running_hours_on_a_cpu(monkeypatch):
    from helpers.core.device import DeviceUnavailableError

    seen = {}
    monkeypatch.setattr(bench, "run_ladder", lambda **kw: seen.update(kw) or {})  # planted: nothing is run
    with pytest.raises(DeviceUnavailableError, match="CUDA was requested"):
        bench.main(["--gpu-target", "--out", "unused"])
    assert not seen, "the ladder started on a CPU at the GPU targets' sizes"


# --- issue 39: verdicts under load, rungs a device runs no differently, dropout of every form -------------

def test_3_a_rung_timed_on_a_machine_too_busy_to_judge_gets_no_verdict():
    best = _t(1.0, 0.05)
    assert ladder.keeps(_t(0.5, 0.02), best).keep  # 2x beyond a 5 % spread: kept on a quiet machine
    noisy = ladder.keeps(_t(0.5, 0.3), best)  # the candidate's rounds disagree by 60 %: no verdict
    assert not noisy.keep  # before: kept, 2.00x beyond a threshold of 1.60x
    from helpers.core.timing import CpuLoad

    loaded = ladder.keeps(_t(0.5, 0.02), best, load=CpuLoad(0.6, 2.0, 2))  # others took 60 % of the CPUs
    for d in (noisy, loaded):
        assert d.too_busy and not d.keep and "too busy to judge" in str(d) and "not kept" in str(d)
    # a climb: the noisy rung is neither kept by noise nor dropped by it; its row and a line say so
    logged = []
    _, steps, stack = ladder.climb(ONE_16_BIT[3:5], _fake_measure({"+ fused AdamW": 0.5}, iqr=0.6),
                                   greedy=True, log=logged.append)
    rows = ladder_report.ladder_rows(_fake_measure({})(ladder.BASELINE, None), steps, torch.device("cpu"),
                                     greedy=True)
    assert stack == ladder.BASELINE and all(s.decision.too_busy for s in steps)
    assert all("too busy to judge" in line and "not kept" in line for line in logged)
    assert all(r["too_busy"] and not r["kept"] and "no verdict" in r["why"] for r in rows[1:])
    result = {"mode": "greedy", "rows": [{**rows[0], "samples_per_s": 1.0, "tokens_per_s": 1.0,
                                          "pass_median_s": 1.0, "pass_iqr_s": 0.1, "first_call_s": 0.0,
                                          "padded_fraction": 0.0, "peak_memory_bytes": None}]
              + [{**r, "samples_per_s": 2.0, "tokens_per_s": 2.0, "pass_median_s": 0.5, "pass_iqr_s": 0.3,
                  "first_call_s": 0.0, "padded_fraction": 0.0, "peak_memory_bytes": None} for r in rows[1:]]}
    assert ladder_report.ladder_table(result).column("kept")[1:] == ["too busy to judge"] * 2


def test_3_rungs_a_device_runs_no_differently_are_skipped_with_their_own_reason(monkeypatch):
    from fakegpu import fake_gpu

    cpu = {p["name"]: p["skipped"] for p in ladder.plan_rungs("cpu")}
    assert "no TF32 units" in cpu["+ TF32"] and "same fp32 matmuls" in cpu["+ TF32"]
    fake_gpu(monkeypatch, "T4")
    t4 = {p["name"]: p["skipped"] for p in ladder.plan_rungs("cuda")}
    assert "compute capability 7.5" in t4["+ TF32"] and "no TF32" in t4["+ TF32"]
    assert "fp8" in t4["+ FP8"].lower() and "bf16 needs" not in t4["+ FP8"], t4["+ FP8"]  # FP8's own reason
    with pytest.raises(ValueError, match="fp8=True"):  # the stack FP8 is added to on a T4: fp16
        RunSpec(precision="fp16", fp8=True).check("cuda")
    fake_gpu(monkeypatch, "A100-40")
    assert ladder.plan_rungs("cuda")[0]["skipped"] is None  # Ampere has TF32 tensor cores: + TF32 is timed


def _llama(attention_dropout: float):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
                      attention_dropout=attention_dropout, attn_implementation="eager")
    return LlamaForCausalLM(cfg)


def test_4_the_check_runs_with_functional_dropout_off_and_names_dropout_that_ignores_eval():
    import copy

    from torch import nn
    from torch.nn import functional as F

    from helpers.core.adapt import as_course_model

    llama = _llama(0.1)  # attention dropout applied functionally: there is no nn.Dropout module in it
    x = torch.randint(1, 96, (2, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": x, "labels": x, "attention_mask": torch.ones_like(x)}
    kw = dict(make_model=lambda: copy.deepcopy(llama), batches={"fixed": [batch]}, check={"fixed": batch},
              device=torch.device("cpu"), repeats=1)
    base = ladder.measure_stack(ladder.BASELINE, None, **kw)
    sdpa = ladder.measure_stack(ladder.BASELINE.replace(attn="sdpa"), base, **kw)  # before: |Δlogits| ~0.3
    assert "≤" in sdpa.row["check_logits"] and sdpa.row["check_mode"].startswith("eval")

    class DropsInEval(nn.Module):  # dropout that ignores model.eval(): its check fails, and says why
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(96, 16), nn.Linear(16, 96)

        def forward(self, idx, targets=None):
            logits = self.head(F.dropout(self.emb(idx), 0.1, training=True))
            return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    torch.manual_seed(0)
    odd = DropsInEval()
    kw.update(make_model=lambda: as_course_model(copy.deepcopy(odd)), batches={"fixed": [(x, x)]},
              check={"fixed": (x, x)})
    base = ladder.measure_stack(ladder.BASELINE.replace(attn=None), None, **kw)
    with pytest.raises(ladder.RungDisagrees, match=r"dropout that ignores model\.eval\(\)"):
        ladder.measure_stack(ladder.BASELINE.replace(attn=None, fused_adamw=True), base, **kw)


# --- issue 49: the climb keeps alive only what it still compares ----------------------------------------

def _holding_measure(made, alive, monkeypatch):
    """A measure on a virtual clock whose arm's timed pass holds a model, as measure_stack's does (its
    model, optimizer state, gradients): `alive` gets how many earlier ones are still held each time it makes
    one."""
    import gc

    clock = _Clock()
    monkeypatch.setattr("helpers.core.timing.time", clock)
    class Faster(dict):  # each switch changed from the baseline halves a pass: every rung is kept
        def __missing__(self, stack):
            return 0.006 * 0.5 ** sum(getattr(stack, f.name) != getattr(ladder.BASELINE, f.name)
                                      for f in dataclasses.fields(stack))

    timed = _clocked_measure(Faster(), [], clock)

    def measure(stack, ref):
        gc.collect()
        alive.append(len(made))
        model = torch.nn.Linear(2, 2)
        made.add(model)
        arm = timed(stack, ref)
        run = arm.run
        arm.run = lambda: (run(), model)
        return arm
    return measure


def test_5_the_climb_holds_the_baseline_the_stack_below_and_the_candidate_only(monkeypatch):
    # issue 49: climb() kept every measured arm's model, gradients and optimizer state until the climb
    # ended, one more model per rung: lesson 08's ladder ran out of memory on a T4 after a few rungs
    import gc
    import weakref

    from transformers import BertForSequenceClassification

    monkeypatch.setitem(models.MODEL_SIZES, "test", dict(TEST_SIZE, num_hidden_layers=1))
    made: weakref.WeakSet = weakref.WeakSet()
    alive: list[int] = []

    def make_model():  # measure_stack's own holders, on this CPU: two rungs of a real climb
        gc.collect()  # what only a reference cycle still holds is not alive
        alive.append(len(made))
        torch.manual_seed(0)
        model = BertForSequenceClassification(models.bert_config("test", 5))
        made.add(model)
        return model

    rungs = tuple(r for r in NO_COMPILE if r.switch == "fused_adamw" or r.value == "bucketed")
    batches, check = ladder.sample_batches(LENGTHS, batch_size=2, n_batches=1, seq_len=32, vocab=2000,
                                           n_classes=5)
    ladder.climb_stacks(make_model, batches, check, device=torch.device("cpu"), repeats=1, rungs=rungs,
                        log=lambda s: None)
    # the probe, the baseline, then each candidate beside the baseline and the stack it is added to
    # (at most: on transformers 4.x a rung that rebuilds the model lets the one before go sooner)
    assert len(alive) == 4 and alive[2] <= 1 and alive[3] <= 2, alive
    gc.collect()
    assert not list(made), "a model outlived the climb: something besides the arms' timed passes holds it"
    four = tuple(r for r in ONE_16_BIT if r.switch in ("fused_adamw", "padding", "attn"))
    for greedy, most in ((True, 2), (False, 2)):
        alive.clear()
        ladder.climb(four, _holding_measure(made, alive, monkeypatch), greedy=greedy, log=lambda s: None)
        assert alive[0] == 0 and max(alive[1:]) == most, (greedy, alive)
    # planted: the climb as it was, every arm's timed pass kept until the end
    monkeypatch.setattr(ladder, "let_go", lambda arms, keep: None)
    alive.clear()
    ladder.climb(four, _holding_measure(made, alive, monkeypatch), greedy=True, log=lambda s: None)
    assert alive == [0, 1, 2, 3, 4], alive
