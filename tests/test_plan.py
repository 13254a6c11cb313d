"""The planner (helpers.plan.planner, lesson 09): its fake-tensor count is lesson 04's count of the real step,
its
search finds the largest batch, a step too big for a T4 is refused with the largest batch that fits, every
figure of its table names its source, the course's rules decide each class's precision, its command line,
and lesson 09's exercise (09-largest-batch) against the wrong answers learners write. The planner beside this
machine's own step is lesson 09's own check (`course.lessons.lesson09.check_on_this_machine`, run by the
notebook's test); the published figures are tests/test_plan_published.py.

What the tests cost: one dry run of a 1- or 2-layer model is about a second on the 2-core CPU; no test here
plans a full-size model (docs/plan.md has the full-size timings).
"""

from __future__ import annotations

import copy
import math
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from exercise_answers import BATCH_51  # tests/exercise_answers.py
from fakegpu import GPU_CLASSES, fake_gpu  # tests/ is on sys.path under pytest
from owngpt import GPT, GPTConfig

from course.exercises import EXERCISES, outcome_of
from course.exercises.lesson09 import draw_cases
from course.sizing import MARGIN
from helpers.core import compat
from helpers.core.adapt import as_course_model
from helpers.core.precision import training_precision
from helpers.measure.gpus import GPUS, seen_as
from helpers.measure.memory import estimate_step_memory
from helpers.measure.opcount import count_ops, count_step, gpu_like_attention, labelled_step
from helpers.model.models import TransformerConfig, bert_config, meta_model
from helpers.plan.batch_search import predict_max_batch_size
from helpers.plan.planner import example_batch, plan
from helpers.plan.report import EXAMPLE_PRICES, Prices
from helpers.train.runspec import RunSpec


def _small() -> torch.nn.Module:
    torch.manual_seed(0)
    return TransformerConfig(vocab_size=512, d_model=64, n_heads=4, n_layers=2, max_len=128).build()


def _bert_tiny() -> torch.nn.Module:
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    cfg = bert_config("tiny", 3)
    cfg.vocab_size = 1000  # BERT-tiny's shape with a small vocabulary: the real count below runs in a second
    return BertForSequenceClassification(cfg)


def _nanogpt() -> torch.nn.Module:
    torch.manual_seed(0)
    return as_course_model(GPT(GPTConfig(block_size=64, vocab_size=300, n_layer=2, n_head=2, n_embd=64)))


MODELS = {"SmallTransformer": _small, "BERT (Hugging Face)": _bert_tiny, "nanoGPT-style": _nanogpt}


# --- the count on fake tensors is lesson 04's count of the real step -------------------------------------

@pytest.mark.parametrize("name", list(MODELS))
def test_the_fake_count_is_the_real_count(name):
    """Every op of the step, its calls and FLOPs exactly and its bytes exactly but for the embedding look-up,
    which the fake count charges one row per token (an upper bound: fake indices have no values)."""
    model = MODELS[name]()
    batch = example_batch(model, 4, 32)
    fake = count_step(model, batch)  # fp32, fused AdamW: what the real step below runs
    real_model = copy.deepcopy(model)
    real = count_ops(labelled_step(real_model, batch, torch.optim.AdamW(real_model.parameters(), fused=True)))
    _same_counts(fake, real)
    if name == "BERT (Hugging Face)":
        # transformers 4.x's BERT reads values in its forward (is the first or last token padding? is the
        # attention mask all ones?), which the fake count answers from the batch; 5.x reads none
        reads = ("forward", "aten::_local_scalar_dense") in real
        assert reads == (not compat.at_least("transformers", compat.TRANSFORMERS_V5)), sorted(real)


def _same_counts(fake: dict, real: dict) -> None:
    assert set(fake) == set(real), f"ops only in one count: {set(fake) ^ set(real)}"
    for key, r in real.items():
        f = fake[key]
        assert (f.calls, f.flops) == (r.calls, r.flops), key
        if key[1] == "aten::embedding":
            assert f.bytes >= r.bytes, key
        else:
            assert f.bytes == r.bytes, (key, f.bytes, r.bytes)


class _Reads(torch.nn.Module):
    """A model that reads values in its forward, as models do: whether the batch has padding and which tokens
    are real (`nonzero`: an output whose shape the values decide), both decided by the batch alone; with
    `weights_read`, also whether its hidden state sums above zero, which the weights decide."""

    def __init__(self, weights_read: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.out = torch.nn.Embedding(50, 8), torch.nn.Linear(8, 50)
        self.weights_read = weights_read

    def forward(self, input_ids, labels, attention_mask=None):
        h, labels = self.emb(input_ids).flatten(0, 1), labels.flatten()
        if attention_mask is not None and not attention_mask.bool().all():  # padding: the real tokens only
            keep = attention_mask.flatten().nonzero().squeeze(1)
            h, labels = h[keep], labels[keep]
        if self.weights_read and h.sum() > 0:
            h = h * 2
        return SimpleNamespace(loss=torch.nn.functional.cross_entropy(self.out(h), labels))


def _read_batch(padded: bool) -> dict[str, torch.Tensor]:
    ids = torch.randint(50, (3, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, 10:] = 0
    return {"input_ids": ids, "labels": ids.clone(), "attention_mask": mask}


@pytest.mark.parametrize("padded", [False, True], ids=["no padding", "padded"])
def test_a_value_the_batch_decides_takes_the_real_steps_branch(padded):
    """The fake count and the dry run answer a model's reads of values the batch decides (transformers 4.x
    BERT makes such reads) as a real step does: the same ops, and the branch follows the batch (planted: the
    other batch takes the other branch, so an answer that did not come from the batch fails one case)."""
    model, batch = _Reads(), _read_batch(padded)
    fake = count_step(model, batch)
    real_model = copy.deepcopy(model)
    _same_counts(fake, count_ops(labelled_step(real_model, batch, torch.optim.AdamW(real_model.parameters(),
                                                                                      fused=True))))
    assert (("forward", "aten::nonzero") in fake) == padded
    assert estimate_step_memory(model, batch).peak > 0


def test_a_value_the_weights_decide_is_refused_naming_the_op_and_the_line():
    """A read no dry run can answer (`if h.sum() > 0:` on the weights' output) fails with ValueReadError
    naming the op, the model's line and the fix, in the count and in the memory dry run alike."""
    from helpers.core.compat import ValueReadError

    model, batch = _Reads(weights_read=True), _read_batch(False)
    line = r"test_plan\.py:\d+ \(forward: `if self\.weights_read and h\.sum\(\) > 0:`\)"
    for dry_run in (count_step, estimate_step_memory):
        with pytest.raises(ValueReadError, match=r"aten::_local_scalar_dense.*" + line + r".*torch\.where"):
            dry_run(model, batch)


def test_a_count_keyed_by_data_pointer_is_wrong_on_fake_tensors():
    """Why the planner keys tensors by storage: fake tensors all read data pointer 0, so a count keyed by it
    merges same-shaped tensors (AdamW's parameters, gradients and moments) and loses their bytes."""
    from unittest import mock

    from helpers.core import compat
    from helpers.measure import opcount

    model = _small()
    batch = example_batch(model, 4, 32)
    right = count_step(model, batch)
    with compat.fake_tensor_mode(), mock.patch.object(opcount, "_distinct_rows", opcount._rows_at_most):
        fake = opcount._fake_of(model, torch.device("cpu")).train()
        fb = {k: torch.empty_strided(v.size(), v.stride(), dtype=v.dtype) for k, v in batch.items()}
        opt = torch.optim.AdamW(list(fake.parameters()), lr=1e-3, fused=True)
        wrong = count_ops(labelled_step(fake, fb, opt))
    key = ("optimizer", "aten::_fused_adamw_")
    print(f"fused AdamW's bytes: {right[key].bytes:,.0f} by storage, {wrong[key].bytes:,.0f} by pointer")
    assert wrong[key].bytes < right[key].bytes / 2


def test_fp16_and_bf16_steps_hold_the_same_bytes():
    """The planner runs one dry run and one count for both 16-bit precisions: they must agree."""
    model = _small()
    batch = example_batch(model, 4, 32)
    peaks = {p: estimate_step_memory(model, batch, precision=p).peak for p in ("fp16", "bf16")}
    counts = {p: count_step(model, batch, precision=p) for p in ("fp16", "bf16")}
    assert peaks["fp16"] == peaks["bf16"]
    assert {k: (c.calls, c.flops, c.bytes) for k, c in counts["fp16"].items()} == \
        {k: (c.calls, c.flops, c.bytes) for k, c in counts["bf16"].items()}


# --- the search -------------------------------------------------------------------------------------------

def _brute(peak, usable: int, limit: int) -> int:
    return max([n for n in range(1, limit + 1) if peak(n) <= usable], default=0)


@pytest.mark.parametrize("shape", ["affine", "a jump at 40", "flat then steep"])
def test_largest_batch_is_the_largest_that_fits(shape):
    mib = 2**20  # peaks in MiB, as a step's are: the line's 1 MiB of slack is small beside a sample's bytes
    peaks = {"affine": lambda n: (5_000 + 300 * n) * mib,
             "a jump at 40": lambda n: (5_000 + 300 * n + (4_000 if n >= 40 else 0)) * mib,
             "flat then steep": lambda n: (20_000 if n < 16 else 20_000 + 2_000 * (n - 15)) * mib}
    peak = peaks[shape]
    for usable in (u * mib for u in (4_000, 5_300, 9_999, 17_100, 21_500, 60_000, 10**9)):
        calls = []

        def counted(n, peak=peak, calls=calls):
            calls.append(n)
            return peak(n)

        got = predict_max_batch_size(counted, usable, start=8, limit=4096)
        assert got == _brute(peak, usable, 4096), (shape, usable, calls)
        if shape == "affine" and 0 < got < 4096:
            assert len(calls) <= 4, f"an affine peak needs at most 4 dry runs, took {calls}"
        # the plan's way: a line through 8 and 16, checked by a third run far out; an answer between them may
        # come from the line alone, only where the check shows it exact (the jump is not: the search runs on)
        known = {n: peak(n) for n in (8, 16)}
        far = 300
        miss = abs(peak(far) - (known[8] + (known[16] - known[8]) * (far - 8) / 8))
        known[far] = peak(far)
        calls.clear()
        got = predict_max_batch_size(counted, usable, start=8, limit=4096, known=known, miss=miss)
        assert got == _brute(peak, usable, 4096), (shape, usable, calls, "with the checked line")
        if shape == "affine" and 8 <= got < far:  # a dry run only where the edge is within the line's slack
            assert len(calls) <= 1, f"an exact line needs at most one more dry run, made {calls}"


def test_a_step_too_big_for_a_t4_is_refused_with_the_largest_batch_that_fits():
    """A planted step: a 1-layer model with a 32k vocabulary at 48 x 1024 tokens, whose logits alone take
    GBs. The plan says it does not fit a T4 and names the largest batch that does; two dry runs made here,
    apart from the planner's search, confirm it: that batch fits, one more does not."""
    torch.manual_seed(0)
    model = TransformerConfig(vocab_size=32_000, d_model=128, n_heads=4, n_layers=1, max_len=1024).build()
    p = plan(model, (48, 1024), gpus=["T4", "A100-80"])
    t4 = p["T4"]
    print(p.to_markdown())
    usable = int(GPUS["T4"].total_memory * (1 - MARGIN))
    assert not t4.fits and t4.peak_bytes > usable
    assert p["A100-80"].fits
    n = t4.largest_batch
    assert 1 <= n < 48
    batch = example_batch(model, n + 1, 1024)
    with gpu_like_attention():
        at = {rows: estimate_step_memory(model, {k: v[:rows] for k, v in batch.items()},
                                         precision="bf16").peak for rows in (n, n + 1)}
    assert at[n] <= usable < at[n + 1], (n, at, usable)
    row = next(r for r in p.table().rows if r[0].startswith("fits"))
    assert row[1] == "NO" and row[2] == "yes"
    assert p.fastest().gpu.key == "A100-80"


# --- the table: every figure names its source ---------------------------------------------------------------

def _hf(kind: str) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        if kind == "GPT-2":
            return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000))
        if kind == "Llama":
            return LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                num_attention_heads=4, num_key_value_heads=2,
                                                vocab_size=1000))
        return _bert_tiny().to("meta")


@pytest.mark.parametrize("kind", ["BERT", "GPT-2", "Llama", "nanoGPT-style"])
def test_every_figure_of_the_table_names_its_source(kind):
    """For Hugging Face models built from a config and a nanoGPT-style GPT, on six classes or more: every
    row's last cell names where the row comes from; prices are the dated example, said to be not current;
    the assumptions name the launch cost, FP8's rate and SDPA's kernels."""
    model = _nanogpt() if kind == "nanoGPT-style" else _hf(kind)
    classes = ["T4", "V100-16", "L4", "RTX4090", "A100-80", "H100", "H200"]
    p = plan(model, (4, 64), RunSpec(fp8=True), gpus=classes, dataset_tokens=1e7, search=False)
    t = p.table()
    assert list(t.columns) == ["", *classes, "source"]
    for row in t.rows:
        assert row[-1] and len(row[-1]) > 10, row
    md = p.to_markdown()
    price_row = next(r for r in t.rows if r[0] == "USD per GPU-hour")
    assert "EXAMPLE, not current" in price_row[-1] and EXAMPLE_PRICES.date in price_row[-1]
    text = p.assumptions_text()
    for word in ("µs", "FP8", "SDPA", "not current"):
        assert word in text, word
    lm = kind != "BERT"
    assert ("decode tokens/s" in md) == lm and ("KV cache" in md) == lm
    assert p.cheapest() is not None and p.cheapest().gpu.key in EXAMPLE_PRICES.usd_per_gpu_hour
    print(md)


def test_prices_need_a_date_and_a_source():
    with pytest.raises(ValueError, match="date"):
        Prices({"T4": 0.3}, "", "me")
    with pytest.raises(ValueError, match="positive"):
        Prices({"T4": -1.0}, "2026-01-01", "me")


@pytest.mark.parametrize("key", list(GPU_CLASSES))
def test_the_course_rules_decide_each_class(monkeypatch, key):
    """`seen_as` asks the same rules the lessons ask under a faked GPU (tests/fakegpu.py), and leaves
    torch.cuda as it was."""
    with seen_as(key):
        seen = training_precision("cuda")
    with monkeypatch.context() as m:
        fake_gpu(m, key)
        faked = training_precision("cuda")
    assert seen == faked
    assert torch.cuda.is_available() == (torch.version.cuda is not None and torch.cuda.device_count() > 0)


# --- the command line -------------------------------------------------------------------------------------

def test_the_command_line_prints_the_table(capsys):
    from course.scripts.plan import main

    assert main(["--model", "bert-tiny", "--batch", "4", "--seq", "32", "--gpus", "T4,A100-80",
                         "--tokens", "1e6", "--no-search", "--fp8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("**Plan (a prediction): BertForSequenceClassification")
    assert "| source |" in out and "Assumed:" in out and "FP8" in out
    with pytest.raises(SystemExit):
        main(["--model", "bert-tiny", "--gpus", "T5"])
    assert "unknown GPU class 'T5'" in capsys.readouterr().err
    for name in ("qwen2.5-0.5b", "llama-3.2-1b", "llama-2-7b"):  # shapes of today's fine-tuned models
        model = meta_model(name)
        assert next(model.parameters()).is_meta and sum(p.numel() for p in model.parameters()) > 4e8


# --- exercise 09-largest-batch ------------------------------------------------------------------------------

EX = EXERCISES["09-largest-batch"]
SIGNATURE = "def largest_batch_from(batch, peak_at_batch, peak_at_double, memory_bytes, margin):\n"

# Wrong answers a learner would write, each whole, keyed by the mistake the check must name.
WRONG = {
    "no-margin": "import math\n\n" + SIGNATURE + textwrap.indent(textwrap.dedent("""
        per = (peak_at_double - peak_at_batch) / batch
        fixed = peak_at_batch - per * batch
        return max(0, math.floor((memory_bytes - fixed) / per))
        """), "    "),
    "no-fixed-part": SIGNATURE + textwrap.indent(textwrap.dedent("""
        bytes_per_sample = peak_at_batch / batch  # the peak shared out over the samples
        return max(0, int(memory_bytes * (1 - margin) // bytes_per_sample))
        """), "    "),
    "per-sample-over-double": "import math\n\n" + SIGNATURE + textwrap.indent(textwrap.dedent("""
        per_sample = (peak_at_double - peak_at_batch) / (2 * batch)
        fixed = peak_at_batch - batch * per_sample
        return max(0, math.floor((memory_bytes * (1 - margin) - fixed) / per_sample))
        """), "    "),
    "rounded-up": "import math\n\n" + SIGNATURE + textwrap.indent(textwrap.dedent("""
        per = (peak_at_double - peak_at_batch) / batch
        room = memory_bytes * (1 - margin) - (peak_at_batch - batch * per)
        return max(0, math.ceil(room / per))
        """), "    "),
    "rounded-to-nearest": SIGNATURE + textwrap.indent(textwrap.dedent("""
        per = (peak_at_double - peak_at_batch) / batch
        n = round((memory_bytes * (1 - margin) - (peak_at_batch - batch * per)) / per)
        return n if n > 0 else 0
        """), "    "),
    "negative": "import math\n\n" + SIGNATURE + textwrap.indent(textwrap.dedent("""
        per = (peak_at_double - peak_at_batch) / batch
        fixed = peak_at_batch - batch * per
        return math.floor((memory_bytes * (1 - margin) - fixed) / per)
        """), "    "),
    "margin-of-the-room": "import math\n\n" + SIGNATURE + textwrap.indent(textwrap.dedent("""
        per = (peak_at_double - peak_at_batch) / batch
        free = (memory_bytes - (peak_at_batch - batch * per)) * (1 - margin)  # the margin of what is left
        return max(0, math.floor(free / per))
        """), "    "),
    "float": SIGNATURE + textwrap.indent(textwrap.dedent("""
        per = (peak_at_double - peak_at_batch) / batch
        fixed = peak_at_batch - batch * per
        return max(0.0, (memory_bytes * (1 - margin) - fixed) // per)
        """), "    "),
    "differs": SIGNATURE + textwrap.indent(textwrap.dedent("""
        per = (peak_at_double - peak_at_batch) / batch
        fixed = peak_at_batch - batch * per
        usable = memory_bytes * (1 - margin)
        n = batch  # powers of two from the first dry run's batch
        while fixed + 2 * n * per <= usable:
            n *= 2
        return n if fixed + n * per <= usable else 0
        """), "    "),
    "course-function": "from helpers.plan.batch_search import predict_max_batch_size\n\n" + SIGNATURE
    + textwrap.indent(
        textwrap.dedent("""
        per = (peak_at_double - peak_at_batch) / batch
        fixed = peak_at_batch - batch * per
        return predict_max_batch_size(lambda n: fixed + n * per, memory_bytes * (1 - margin), start=batch)
        """), "    "),
}
RIGHT = {
    "solution": EX.solution_path.read_text(encoding="utf-8"),
    "integer-arithmetic": SIGNATURE + textwrap.indent(textwrap.dedent("""
        per = (peak_at_double - peak_at_batch) / batch
        fixed = peak_at_batch - batch * per
        n = int((memory_bytes * (1 - margin) - fixed) // per)
        return n if n > 0 else 0
        """), "    "),
    "count-up": SIGNATURE + textwrap.indent(textwrap.dedent("""
        per = (peak_at_double - peak_at_batch) / batch
        fixed = peak_at_batch - batch * per
        n = 0
        while fixed + (n + 1) * per <= memory_bytes * (1 - margin):
            n += 1
        return n
        """), "    "),
}
assert not set(BATCH_51[EX.id]) & set(WRONG)
WRONG.update(BATCH_51[EX.id])  # issue 51's batch: state kept, a numpy result, float32 arithmetic, ...
SEEDS = (0, 1, 2, 12345)


def _load(tmp_path: Path, source: str):
    import runpy

    path = tmp_path / "answer.py"
    path.write_text(source, encoding="utf-8")
    return runpy.run_path(str(path))[EX.answer]


@pytest.mark.parametrize("key", list(RIGHT))
def test_exercise_right_answers_pass(key, tmp_path):
    answer = _load(tmp_path, RIGHT[key])
    for seed in SEEDS:
        outcome = outcome_of(EX.id, answer, seed=seed)
        assert outcome.status == "passed", outcome.line


@pytest.mark.parametrize("key", list(WRONG))
def test_exercise_wrong_answers_fail_with_their_hint(key, tmp_path):
    answer = _load(tmp_path, WRONG[key])
    for seed in SEEDS:
        outcome = outcome_of(EX.id, answer, seed=seed)
        assert outcome.status == "failed", (key, outcome.line)
        assert outcome.mistake == key.split("#")[0], (key, outcome.line)
        assert f"seed={seed}" in outcome.line


def test_exercise_cases_change_from_run_to_run():
    first, second = draw_cases(1), draw_cases(2)
    assert first != second and len(first) == 6
    assert any(c.fixed > c.memory_bytes * (1 - c.margin) for c in first), "a case where nothing fits"
    c = first[0]
    assert math.isclose(c.peak_at_double - c.peak_at_batch, c.batch * c.per_sample)


def test_exercise_skeleton_is_not_attempted(tmp_path):
    skeleton = _load(tmp_path, SIGNATURE + "    # YOUR CODE HERE\n    raise NotImplementedError\n")
    assert outcome_of(EX.id, skeleton).status == "not attempted"


# --- on a lent GPU: the plan beside the measured step (make gpu-check runs the tests marked cuda) -------

@pytest.mark.cuda
def test_the_plan_beside_this_gpus_own_step():
    """The ladder's BERT-base at 32 x 512 in fp32 (its first rung) and the capstone's stack (bf16, SDPA, fused
    AdamW), each planned from the datasheet (what a learner without this GPU gets) and from the roofs measured
    on it, beside the step measured here. The table is printed and written to $GPU_CHECK_OUT/work/results/
    plan/ (the check's summary shows it): the first GPU run grades the planner. Asserted: the step does not
    beat the datasheet plan by more than lesson 04's noise rule (a planner that over-counts fails)."""
    import os
    import re

    from transformers import BertForSequenceClassification

    from helpers.core.tables import Table
    from helpers.core.timing import benchmark
    from helpers.measure.optime import per_call_overhead
    from helpers.measure.regimes import ROOF_MARGIN
    from helpers.measure.roofline import datasheet_roofline, measure_roofline
    from helpers.model.models import bert_config
    from helpers.plan.planner import measured_roofs
    from helpers.plan.steptime import step_time

    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(dev)
    known = next((g for g in GPUS.values() if g.name == name and g.count == 1), None)
    roofline = measure_roofline(dev, precisions=["fp32", "bf16"])
    here = measured_roofs(roofline, overhead_s=per_call_overhead(dev), device=dev)
    t = Table(["step", "plan: datasheet (ms)", "plan: measured roofs (ms)", "measured (ms)",
               "measured / datasheet plan"], title=f"The planner on {name} (BERT-base, batch 32 x 512)")
    stacks = (("fp32, the ladder's first rung", RunSpec(precision="fp32")),
              ("bf16 + SDPA + fused AdamW, the capstone's", RunSpec(precision="bf16", attn="sdpa")))
    for label, spec in stacks:
        torch.manual_seed(0)
        model = spec.apply(BertForSequenceClassification(bert_config("base", 5)))
        batch = example_batch(model, 32, 512)
        counts = count_step(model, batch, precision=spec.precision, fused_adamw=spec.fused_adamw)  # ~2 s
        sheet = step_time(counts, datasheet_roofline(known), spec.precision) if known is not None else None
        roofs = step_time(counts, here, spec.precision)
        model = model.to(dev)
        on_gpu = {k: v.to(dev) for k, v in batch.items()}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

        def step(model=model, on_gpu=on_gpu, opt=opt, spec=spec) -> None:
            with spec.step_context(dev):
                with spec.autocast(dev):
                    loss = model(**on_gpu).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

        measured = benchmark(step, name=label, warmup=3, min_run_time=1.0).median_s
        ratio = measured / sheet.seconds if sheet is not None else None
        t.add(label, sheet.seconds * 1e3 if sheet is not None else None, roofs.seconds * 1e3, measured * 1e3,
              ratio)
        if sheet is not None:
            assert ratio >= 1 / ROOF_MARGIN, f"{label}: the step beat its datasheet plan {1 / ratio:.1f}x"
        del model, opt, on_gpu
        torch.cuda.empty_cache()
    print(t)
    out = os.environ.get("GPU_CHECK_OUT")
    if out:
        folder = Path(out) / "work" / "results" / "plan"
        folder.mkdir(parents=True, exist_ok=True)
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        (folder / f"plan-vs-measured-{slug}.md").write_text(t.to_markdown() + "\n", encoding="utf-8")
