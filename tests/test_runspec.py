"""helpers.runspec (issue 19): one frozen RunSpec is the one home of a run's switches: its context covers
forward, backward and step; its dataloader builds every padding (and pins for a GPU); apply and describe.
A source test checks that no other code applies the TF32/autocast switches or computes MFU."""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path

import pytest
import torch

from helpers import compat
from helpers.data import TokenizedDataset
from helpers.models import SmallTransformer, TransformerConfig
from helpers.precision import tf32_enabled
from helpers.runspec import ATTNS, PADDINGS, RunSpec
from helpers.train import TrainConfig, synthetic_batch_fn, train

ROOT = Path(__file__).resolve().parents[1]
LENGTHS = [5, 9, 3, 12, 7, 4]


def _dataset() -> TokenizedDataset:
    return TokenizedDataset([list(range(1, n + 1)) for n in LENGTHS], [i % 2 for i in range(len(LENGTHS))])


def test_bad_switches_are_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"RunSpec.precision='fp8'.*fp8=True"):
        RunSpec(precision="fp8")
    with pytest.raises(ValueError, match="RunSpec.padding='packing'"):
        RunSpec(padding="packing")
    with pytest.raises(ValueError, match="RunSpec.attn"):
        RunSpec(attn="flash")
    with pytest.raises(ValueError, match="RunSpec.compile must be True or False"):
        RunSpec(compile=1)
    assert set(PADDINGS) == {"fixed", "dynamic", "bucketed", "packed"} and ATTNS == ("eager", "sdpa")
    with pytest.raises(dataclass_frozen_error()):
        RunSpec().precision = "bf16"  # frozen: a run's switches do not change under it


def dataclass_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_the_context_switches_tf32_and_autocast_by_one_rule_and_restores_them():
    seen = {}
    for spec in (RunSpec(), RunSpec(precision="tf32"), RunSpec(precision="bf16"), RunSpec(fp8=True)):
        with spec.context("cpu"):
            seen[spec] = (tf32_enabled(), torch.is_autocast_enabled("cpu"))
        assert not tf32_enabled() and not torch.is_autocast_enabled("cpu")
    assert list(seen.values()) == [(False, False), (True, False), (True, True), (True, True)]


def test_train_runs_the_backward_pass_and_the_step_inside_the_context():
    model = SmallTransformer(TransformerConfig(vocab_size=32, max_len=8, d_model=16, n_heads=2, n_layers=1))
    seen = []
    model.head.weight.register_hook(lambda g: seen.append(tf32_enabled()))
    train(model, synthetic_batch_fn(32, 2, 8), TrainConfig(steps=2, progress=False, track_memory=False),
          spec=RunSpec(precision="tf32"))
    assert seen == [True, True]


@pytest.mark.parametrize("padding", ["fixed", "dynamic", "bucketed", "packed"])
def test_the_dataloader_batches_every_example_once_with_its_padding(padding):
    loader = RunSpec(padding=padding).dataloader(_dataset(), 2, max_length=16, seed=1, device="cpu")
    batches = list(loader)
    ids = sorted(tuple(row[m.bool()].tolist()) for b in batches for row, m in
                 zip(b["input_ids"], b["attention_mask"]) if padding != "packed")
    if padding == "packed":  # rows hold whole documents: count the real tokens and the documents
        assert sum(int(b["attention_mask"].sum()) for b in batches) == sum(LENGTHS)
        assert sum(len(b["labels"]) for b in batches) == len(LENGTHS)
        assert all(b["input_ids"].shape[1] == 16 for b in batches)
    else:
        assert ids == sorted(tuple(range(1, n + 1)) for n in LENGTHS)
        widths = {b["input_ids"].shape[1] for b in batches}
        assert widths == {16} if padding == "fixed" else max(widths) <= max(LENGTHS)


def test_the_dataloader_pins_in_its_own_thread_for_a_gpu_only():
    # issue 18: pinning belongs in the DataLoader's pin thread (PyTorch's pin_memory guide), not the loop
    assert RunSpec().dataloader(_dataset(), 2, device="cuda").pin_memory
    assert RunSpec(padding="packed").dataloader(_dataset(), 2, device="cuda").pin_memory
    assert not RunSpec().dataloader(_dataset(), 2, device="cpu").pin_memory


def test_apply_sets_the_attention_and_wraps_a_packed_model():
    from transformers import BertConfig, BertForSequenceClassification

    from helpers.packed_model import PackedModel

    cfg = BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                     vocab_size=100, attn_implementation="eager")
    model = BertForSequenceClassification(cfg)
    out = RunSpec(attn="sdpa", padding="packed").apply(model)
    assert isinstance(out, PackedModel) and out.model.config._attn_implementation == "sdpa"
    if compat.at_least("transformers", "5.0"):  # transformers 4.x switches by rebuilding (helpers.compat)
        assert out.model is model
    assert RunSpec().apply(model) is model  # nothing asked, nothing changed


def test_describe_gives_the_code_of_the_changed_switches():
    text = RunSpec(precision="bf16", attn="sdpa", padding="bucketed").describe()
    assert "RunSpec(precision='bf16', attn='sdpa', padding='bucketed')" in text
    assert "spec.apply(model)" in text and "spec.dataloader(" in text and "spec=spec" in text
    assert "RunSpec()" in RunSpec().describe()


# --- one home for each switch: a source test ---------------------------------------------------------

# tf32_matmuls / autocast_context / set_tf32: defined in helpers.precision, applied by RunSpec.context only.
# Exempt, with the reason: helpers/roofline.py measures the TF32 matmul *rate* of the chip (lesson 00's
# roofline, a measure-layer module that cannot import RunSpec), and lesson 02 teaches the primitives.
SWITCH_CALL = re.compile(r"\b(tf32_matmuls|autocast_context|set_tf32)\(")
# exempt: the homes of the switches, and the cells that measure the precisions themselves (the roofline,
# lesson 00's TF32 control of its fp32 accuracy check, lesson 02's precision experiments): no training step
SWITCH_EXEMPT = {"helpers/precision.py", "helpers/runspec.py", "helpers/roofline.py",
                 "notebooks/00_setup.ipynb", "notebooks/02_mixed_precision.ipynb"}
# MFU: helpers.flops.mfu is the one formula; nothing else divides by a peak or rescales an MFU
MFU_INLINE = re.compile(r"/\s*\(?\s*[\w.\[\]\"']*\bpeak(_flops)?(\.flops)?\b(?![\w(])"
                        r"|\bmfu\b[\"'\]]*\s*\*\s*\w+\s*/\s*\w")


def _code(text: str) -> str:
    """`text` with its comments and docstrings blanked out: what runs (a docstring may state a formula)."""
    lines = text.splitlines(keepends=True)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            doc = tok.type == tokenize.STRING and tok.string.lstrip("rbuRBU")[:3] in ('"""', "'''")
            if tok.type == tokenize.COMMENT or doc:
                (r0, c0), (r1, c1) = tok.start, tok.end
                for r in range(r0, r1 + 1):
                    a, b = (c0 if r == r0 else 0), (c1 if r == r1 else len(lines[r - 1]))
                    lines[r - 1] = lines[r - 1][:a] + " " * (b - a) + lines[r - 1][b:]
    except (tokenize.TokenError, IndentationError):  # a notebook cell with IPython syntax: as it is
        return text
    return "".join(lines)


def _sources():
    for folder in ("helpers", "scripts", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), _code(path.read_text())
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join(_code("".join(c["source"])) for c in cells if c["cell_type"] == "code")
        yield path.relative_to(ROOT).as_posix(), code


def test_each_switch_is_applied_in_one_function_and_mfu_only_in_flops():
    switches = [f"{name}: {m.group(0)}" for name, text in _sources() if name not in SWITCH_EXEMPT
                for m in SWITCH_CALL.finditer(text)]
    assert not switches, f"apply TF32/autocast through RunSpec.context: {switches}"
    # regimes.roof_times divides FLOPs (not FLOP/s) by the peak: the time at the roof, its one home
    inline = [f"{name}: {m.group(0)}" for name, text in _sources()
              if name not in ("helpers/flops.py", "helpers/regimes.py")
              for m in MFU_INLINE.finditer(text)]
    assert not inline, f"compute MFU with helpers.flops.mfu: {inline}"


def test_the_source_test_catches_a_planted_switch_and_an_inline_mfu():
    assert SWITCH_CALL.search("    with tf32_matmuls(True), autocast_context(p, dev):")
    assert MFU_INLINE.search("mfu = useful / timed / peak")
    assert MFU_INLINE.search('"mfu": res.mfu * world / devices')
    assert not MFU_INLINE.search("mfu(tokens / t, flops / tokens, peak)")
    assert not MFU_INLINE.search("r.peak_memory_bytes / base.peak_memory_bytes")
    assert "peak" not in _code('"""MFU = flops / peak"""  # / peak\nx = 1')
