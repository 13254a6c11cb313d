"""The training loop: resuming loses nothing, fp16 skips overflowing steps, accumulation and
activation checkpointing do not change the maths, and bad input gets a clear error. CPU, tiny sizes."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from helpers.models import SmallTransformer, TransformerConfig
from helpers.train import (TrainConfig, autocast_context, check_precision, checkpoint_path, count_tokens,
                           load_checkpoint, save_checkpoint, synthetic_batch_fn, train)

VOCAB, BATCH, SEQ = 64, 4, 16


def tiny_model(seed: int = 0, **overrides) -> SmallTransformer:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, max_len=SEQ, d_model=32, n_heads=2, n_layers=2, dropout=0.1)
    return SmallTransformer(TransformerConfig(**{**cfg, **overrides}))


def quiet(**kw) -> TrainConfig:
    return TrainConfig(progress=False, track_memory=False, lr=3e-3, **kw)


class Interrupt(Exception):
    pass


def test_resumed_run_repeats_the_uninterrupted_one(tmp_path):
    batch_fn = synthetic_batch_fn(VOCAB, BATCH, SEQ)
    full = train(tiny_model(), batch_fn, quiet(steps=6))

    def dies_at_step_5(step: int, micro: int):
        if step == 5:  # the process is killed while fetching step 5: steps 0-4 ran, 4 was checkpointed
            raise Interrupt
        return batch_fn(step, micro)

    cfg = quiet(steps=6, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    with pytest.raises(Interrupt):
        train(tiny_model(), dies_at_step_5, cfg)
    assert torch.load(checkpoint_path(tmp_path), weights_only=False)["step"] == 4
    resumed_model = tiny_model(seed=123)  # a fresh process: other initial weights, other RNG state
    resumed = train(resumed_model, batch_fn, cfg)
    assert resumed.resumed_from == 4 and resumed.steps_done == 6 and len(resumed.step_times_s) == 2
    assert resumed.losses == full.losses  # bit-identical: same batches, same dropout masks, same updates
    assert [p for p in os.listdir(tmp_path)] == ["last.pt"]  # no temporary files left behind


def test_resume_with_a_sequence_and_an_iterable_of_batches(tmp_path):
    batch_fn = synthetic_batch_fn(VOCAB, BATCH, SEQ, seed=1)
    data = [batch_fn(i, 0) for i in range(3)]  # 3 batches, 5 steps: the epochs repeat in order
    for kind in ("list", "iterable"):
        def source():
            return data if kind == "list" else _Reiterable(data)

        full = train(tiny_model(), source(), quiet(steps=5))
        cfg = quiet(steps=3, checkpoint_dir=str(tmp_path / kind), checkpoint_every=1)
        train(tiny_model(), source(), cfg)
        cfg.steps = 5
        resumed = train(tiny_model(seed=7), source(), cfg)
        assert resumed.resumed_from == 3 and resumed.losses == full.losses, kind


class _Reiterable:
    """An iterable like a DataLoader without shuffling: each iter() starts again from the first batch."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


class Boostable(nn.Module):
    """A linear regressor whose loss a batch can multiply, to make fp16 gradients overflow on purpose."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, input_ids, labels, boost=1.0):
        out = self.lin(input_ids.float())
        loss = ((out.float() - labels) ** 2).mean() * boost
        return type("Out", (), {"loss": loss})()


def test_fp16_gradscaler_skips_a_step_whose_gradients_overflow():
    model = Boostable()
    seen = {}  # parameters as they are when each step's batch is fetched = after the previous step

    def batch_fn(step: int, micro: int):
        seen[step] = model.lin.weight.detach().clone()
        g = torch.Generator().manual_seed(step)
        return {"input_ids": torch.randn(4, 8, generator=g), "labels": torch.randn(4, 8, generator=g),
                "boost": 1e8 if step == 2 else 1.0}  # step 2: the scaled fp16 gradient is inf

    result = train(model, batch_fn, quiet(steps=5, precision="fp16", max_grad_norm=1.0), device="cpu")
    assert result.skipped_steps == [2]
    assert torch.equal(seen[2], seen[3])  # step 2 left the weights alone
    assert not torch.equal(seen[1], seen[2]) and not torch.equal(seen[3], seen[4])  # the others updated
    assert result.scales[3] == result.scales[2] / 2  # and the scaler halved its scale
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_gradient_accumulation_gives_the_big_batch_gradient():
    big = synthetic_batch_fn(VOCAB, 2 * BATCH, SEQ, seed=3)

    def halves(step: int, micro: int):
        b = big(step, 0)
        return {k: v[micro * BATCH:(micro + 1) * BATCH] for k, v in b.items()}

    m1, m2 = tiny_model(dropout=0.0), tiny_model(dropout=0.0)
    r1 = train(m1, big, quiet(steps=3))
    r2 = train(m2, halves, quiet(steps=3, grad_accum=2))
    torch.testing.assert_close(torch.tensor(r2.losses), torch.tensor(r1.losses), rtol=1e-5, atol=1e-6)
    # Adam divides by sqrt(v): float rounding in near-zero gradients moves a weight by up to ~1e-5
    # after 3 steps of lr 3e-3 (a step moves it by ~3e-3); a wrong accumulation would differ by ~1e-3.
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        torch.testing.assert_close(p2, p1, rtol=1e-4, atol=3e-5)


def test_activation_checkpointing_does_not_change_the_losses():
    batch_fn = synthetic_batch_fn(VOCAB, BATCH, SEQ, seed=4)
    plain = train(tiny_model(), batch_fn, quiet(steps=3))
    ckpt_model = tiny_model()
    ckpt = train(ckpt_model, batch_fn, quiet(steps=3, activation_checkpointing=True))
    assert ckpt_model.activation_checkpointing
    torch.testing.assert_close(torch.tensor(ckpt.losses), torch.tensor(plain.losses), rtol=1e-5, atol=1e-6)


def test_the_loss_goes_down_and_the_report_is_filled_in():
    result = train(tiny_model(dropout=0.0), synthetic_batch_fn(VOCAB, BATCH, SEQ, pad_fraction=0.5),
                   TrainConfig(steps=30, lr=1e-2, progress=False, peak_flops=1e12))
    assert result.losses[-1] < 0.5 * result.losses[0]
    assert result.tokens_per_s > 0 and result.samples_per_s > 0 and 0 < result.mfu < 1
    assert result.peak_memory_bytes > sum(p.numel() * 4 for p in tiny_model().parameters())
    assert "profiler" in result.memory_method


def test_count_tokens_uses_the_attention_mask():
    batch = synthetic_batch_fn(VOCAB, BATCH, SEQ, pad_fraction=0.5)(0, 0)
    assert count_tokens(batch) == int(batch["attention_mask"].sum()) < BATCH * SEQ
    assert count_tokens({"input_ids": batch["input_ids"]}) == BATCH * SEQ


def test_bad_input_is_explained():
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        TrainConfig(steps=1, precision="fp8")
    with pytest.raises(ValueError, match="unknown precision"):
        autocast_context("half", "cpu")
    with pytest.raises(ValueError, match="checkpoint_dir"):
        TrainConfig(steps=1, checkpoint_every=5)
    with pytest.raises(ValueError, match="callable batch_fn"):
        train(tiny_model(), 42, quiet(steps=1))
    with pytest.raises(ValueError, match="labels"):
        train(tiny_model(), lambda step, micro: {"input_ids": torch.zeros(2, 4, dtype=torch.long)}, quiet(steps=1))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            check_precision("bf16", "cuda")


def test_fp16_on_a_device_without_autocast_is_refused(monkeypatch):
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)
    with pytest.raises(ValueError, match="fp16 needs torch.autocast"):
        check_precision("fp16", "cpu")
    check_precision("fp32", "cpu")  # fp32 needs nothing


def test_checkpoint_of_another_model_is_refused(tmp_path):
    path = tmp_path / "other.pt"
    save_checkpoint(path, tiny_model(d_model=48), None, None, step=3)
    with pytest.raises(ValueError, match="another model"):
        load_checkpoint(path, tiny_model())
    state = load_checkpoint(path, tiny_model(d_model=48))
    assert state["step"] == 3


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    model = tiny_model()
    save_checkpoint(path, model, None, None, step=1)

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model, None, None, step=2)
    monkeypatch.undo()
    assert load_checkpoint(path, model)["step"] == 1
    assert os.listdir(tmp_path) == ["last.pt"]


def test_the_prepared_gpu_benchmark_runs_in_smoke_mode(tmp_path):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import mixed_precision_gpu

    assert mixed_precision_gpu.main(["--smoke", "--device", "cpu", "--only", "small", "--out", str(tmp_path)]) == 0
    (result,) = tmp_path.glob("mixed_precision-*.json")
    rows = json.loads(result.read_text())["rows"]
    assert [r["precision"] for r in rows] == ["fp32", "tf32", "fp16", "bf16"]
    assert all(r["correct"] and r["estimate_bytes"] > 0 for r in rows)
    assert (tmp_path / result.name.replace(".json", ".md")).read_text().startswith("# Mixed precision on")


def test_a_hugging_face_model_trains_with_the_same_loop():
    from transformers import BertConfig, BertForSequenceClassification

    tokens = synthetic_batch_fn(VOCAB, BATCH, SEQ, seed=5)

    def batch_fn(step: int, micro: int):
        b = tokens(step, micro)
        b["labels"] = (b["input_ids"][:, 0] < VOCAB // 2).long()  # a sequence label
        return b

    def bert():
        torch.manual_seed(0)
        return BertForSequenceClassification(BertConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=VOCAB,
            max_position_embeddings=SEQ, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))

    plain = train(bert(), batch_fn, quiet(steps=3))
    model = bert()
    ckpt = train(model, batch_fn, quiet(steps=3, activation_checkpointing=True))
    assert getattr(model, "is_activation_checkpointing", None) or getattr(model, "is_gradient_checkpointing")
    torch.testing.assert_close(torch.tensor(ckpt.losses), torch.tensor(plain.losses), rtol=1e-5, atol=1e-6)
    assert plain.flops_per_token > 0  # sizes read from the Hugging Face config
