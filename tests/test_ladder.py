"""benchmarks/ladder.py: rungs are checked against each other before timing, and results are written."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _ladder():
    spec = importlib.util.spec_from_file_location("ladder", ROOT / "benchmarks" / "ladder.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ladder"] = mod
    spec.loader.exec_module(mod)
    return mod


ladder = _ladder()
# BERT-shaped but small, with a small vocabulary: the embedding table would dominate a tiny model's step
ladder.MODEL_SIZES["test"] = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                                  intermediate_size=128, vocab_size=2000)
LENGTHS = [5, 31, 12, 32, 20, 7, 32, 16]  # tokens per sample, as corpus_lengths would give them
SMALL = dict(model="test", seq=32, batch=2, n_batches=2, min_run_time=0.01, lengths=LENGTHS, device="cpu",
             pad_multiple=8, peak_flops=1e11)
# compiling takes a minute on a small CPU: the tests climb the ladder without torch.compile
NO_COMPILE = tuple(replace(r, compile=False) for r in ladder.RUNGS if r.name != "+ torch.compile")


def test_batches_hold_the_same_samples_whatever_the_padding():
    kw = dict(batch=2, n_batches=3, seq=32, vocab=2000, n_classes=5, pad_multiple=8)
    padded = ladder.make_batches(LENGTHS, bucketing=False, **kw)
    bucketed = ladder.make_batches(LENGTHS, bucketing=True, **kw)
    def samples(batches):
        return sorted(tuple(ids[m.bool()].tolist()) for b in batches
                      for ids, m in zip(b["input_ids"], b["attention_mask"]))
    assert samples(padded) == samples(bucketed)
    assert all(b["input_ids"].shape[1] == 32 for b in padded)
    assert all(b["input_ids"].shape[1] % 8 == 0 for b in bucketed)
    assert sum(b["input_ids"].numel() for b in bucketed) < sum(b["input_ids"].numel() for b in padded)


def test_agree_uses_the_tolerance_of_the_precision():
    ref = torch.tensor([1.0, -2.0])
    assert ladder.agree(ref + 1e-3, ref, "bf16")[0]
    assert not ladder.agree(ref + 1e-3, ref, "fp32")[0]


def test_every_rung_is_checked_then_timed():
    result = ladder.run_ladder(**SMALL, rungs=NO_COMPILE, log=lambda *a: None)
    rows = result["rungs"]
    assert [r["name"] for r in rows] == [r.name for r in NO_COMPILE]
    for row in rows[1:]:  # each rung after the first was compared with the one before it
        assert row["check_logits_err"] <= row["check_logits_tol"]
        assert row["check_loss_err"] <= row["check_loss_tol"]
    assert "check_fused_err" in rows[-1]
    assert rows[0]["speedup"] == 1.0 and all(r["samples_per_s"] > 0 for r in rows)
    assert rows[-1]["padded_fraction"] < rows[0]["padded_fraction"]  # bucketing removed padding


def test_a_rung_that_disagrees_stops_the_ladder(monkeypatch):
    # SDPA in fp32 differs from eager attention by rounding only; with a zero tolerance that must fail
    monkeypatch.setitem(ladder.TOLERANCES, "fp32", (0.0, 0.0))
    rungs = (ladder.RUNGS[0], replace(ladder.RUNGS[0], name="sdpa fp32", attn="sdpa"))
    with pytest.raises(AssertionError, match="disagrees"):
        ladder.run_ladder(**SMALL, rungs=rungs, log=lambda *a: None)


def test_results_are_written_with_their_stamp(tmp_path):
    result = ladder.run_ladder(**SMALL, rungs=NO_COMPILE[:2], log=lambda *a: None)
    paths = ladder.write_results(result, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["stamp"]["device_type"] == "cpu" and data["stamp"]["versions"]["torch"] == torch.__version__
    md = paths["md"].read_text()
    assert data["stamp"]["date"] in md and "| fp32 eager |" in md
    assert paths["png"].stat().st_size > 0
    assert paths["json"].name == "ladder-cpu.json"


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="unknown --model"):
        ladder.bert_config("huge", 2)
    with pytest.raises(ValueError, match="torch sees no CUDA"):
        if torch.cuda.is_available():
            pytest.skip("a CUDA GPU is present")
        ladder.run_ladder(**{**SMALL, "device": "cuda"})


def test_capstone_charts_carry_titles_labels_and_units():
    import matplotlib.pyplot as plt

    from helpers.plots import confusion_matrix_chart, ladder_chart

    fig = ladder_chart({"fp32 eager": 2.0, "+ bf16": 1.0}, title="ladder", accuracy={"fp32 eager": 0.9, "+ bf16": 0.92})
    bars, acc = fig.axes[:2]
    assert bars.get_title() == "ladder" and "samples/s" in bars.get_ylabel() and "%" in acc.get_ylabel()
    assert any("0.50×" in t.get_text() for t in bars.texts)  # the speed-up over the first rung is written
    with pytest.raises(ValueError, match="no speed"):
        ladder_chart({"a": 1.0}, title="t", accuracy={"b": 0.5})
    fig2 = confusion_matrix_chart([[3, 1], [0, 4]], ["x", "y"], title="cm")
    assert fig2.axes[0].get_xlabel() == "predicted class" and [t.get_text() for t in fig2.axes[0].texts] == ["3", "1", "0", "4"]
    with pytest.raises(ValueError, match="2×2"):
        confusion_matrix_chart([[1, 2, 3]], ["x", "y"], title="cm")
    plt.close("all")
