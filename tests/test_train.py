"""The training loop: resuming loses nothing, fp16 skips overflowing steps, accumulation and
activation checkpointing do not change the maths, and bad input gets a clear error. CPU, tiny sizes."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from helpers.core.precision import autocast_context, check_precision
from helpers.core.seeding import seed_everything
from helpers.data.synthetic import synthetic_batch_fn
from helpers.model.models import SmallTransformer, TransformerConfig
from helpers.train.checkpoint import latest_checkpoint
from helpers.train.loop import TrainConfig, count_tokens, train
from helpers.train.runspec import RunSpec

VOCAB, BATCH, SEQ = 64, 4, 16


def tiny_model(seed: int = 0, **overrides) -> SmallTransformer:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, max_len=SEQ, d_model=32, n_heads=2, n_layers=2, dropout=0.1)
    return SmallTransformer(TransformerConfig(**{**cfg, **overrides}))


def quiet(**kw) -> TrainConfig:
    return TrainConfig(**{"progress": False, "track_memory": False, "lr": 3e-3, **kw})


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
    assert latest_checkpoint(tmp_path)[0] == 4
    resumed_model = tiny_model(seed=123)  # a fresh process: other initial weights, other RNG state
    resumed = train(resumed_model, batch_fn, cfg)
    assert resumed.resumed_from == 4 and resumed.steps_done == 6 and len(resumed.step_times_s) == 2
    assert resumed.losses == full.losses  # bit-identical: same batches, same dropout masks, same updates
    # the newest two kept, no temporary files left behind
    assert sorted(os.listdir(tmp_path)) == ["step_000004.pt", "step_000006.pt"]


def test_a_resume_with_a_changed_learning_rate_names_it_and_keeps_what_it_is_told(tmp_path, capsys):
    """Issue 48: a resume whose configuration differs from the checkpoint's once kept the old learning rate
    from the optimizer's saved state, saying nothing. Now it refuses, naming the setting, or keeps the
    checkpoint's or this run's as asked, and says which."""
    from helpers.train.checkpoint import CheckpointError

    batch_fn = synthetic_batch_fn(VOCAB, BATCH, SEQ)
    train(tiny_model(), batch_fn, quiet(steps=2, lr=3e-3, checkpoint_dir=str(tmp_path), checkpoint_every=2))
    same = train(tiny_model(), batch_fn, quiet(steps=3, lr=3e-3, checkpoint_dir=str(tmp_path)))
    assert same.resumed_from == 2  # the same settings: no question asked
    with pytest.raises(CheckpointError, match=r"lr: 0.003 in the checkpoint, 0.001 in this run.*'this run'"):
        train(tiny_model(), batch_fn, quiet(steps=4, lr=1e-3, checkpoint_dir=str(tmp_path)))
    lrs = {}
    for keep in ("checkpoint", "this run"):
        result = train(tiny_model(), batch_fn, quiet(steps=4, lr=1e-3, checkpoint_dir=str(tmp_path),
                                                      on_changed_settings=keep, checkpoint_every=0))
        lrs[keep] = result.lrs[-1]
        assert f"{keep}'s kept" in capsys.readouterr().out
    assert lrs == {"checkpoint": pytest.approx(3e-3), "this run": pytest.approx(1e-3)}


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

    result = train(model, batch_fn, quiet(steps=5, max_grad_norm=1.0), device="cpu",
                   spec=RunSpec(precision="fp16"))
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
    spec = RunSpec(activation_checkpointing=True)
    ckpt_model = spec.apply(tiny_model())
    ckpt = train(ckpt_model, batch_fn, quiet(steps=3), spec=spec)
    assert ckpt_model.activation_checkpointing
    with pytest.raises(ValueError, match=r"spec.apply\(model\)"):  # the spec's switch was never applied
        train(tiny_model(), batch_fn, quiet(steps=1), spec=spec)
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
    with pytest.raises(ValueError, match="precision='fp8'.*fp8=True"):
        RunSpec(precision="fp8")
    with pytest.raises(ValueError, match="unknown precision"):
        autocast_context("half", "cpu")
    with pytest.raises(ValueError, match="checkpoint_dir"):
        TrainConfig(steps=1, checkpoint_every=5)
    with pytest.raises(ValueError, match="callable batch_fn"):
        train(tiny_model(), 42, quiet(steps=1))
    with pytest.raises(ValueError, match="labels"):
        train(tiny_model(), lambda step, micro: {"input_ids": torch.zeros(2, 4, dtype=torch.long)},
              quiet(steps=1))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            check_precision("bf16", "cuda")


def test_fp16_on_a_device_without_autocast_is_refused(monkeypatch):
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda device_type: False)
    with pytest.raises(ValueError, match="fp16 needs torch.autocast"):
        check_precision("fp16", "cpu")
    check_precision("fp32", "cpu")  # fp32 needs nothing


def test_the_prepared_gpu_benchmark_runs_in_smoke_mode(tmp_path):
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import mixed_precision_gpu

    args = ["--smoke", "--device", "cpu", "--only", "small", "--out", str(tmp_path)]
    assert mixed_precision_gpu.main(args) == 0
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
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            vocab_size=VOCAB, max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0))

    plain = train(bert(), batch_fn, quiet(steps=3))
    spec = RunSpec(activation_checkpointing=True)
    model = spec.apply(bert())
    ckpt = train(model, batch_fn, quiet(steps=3), spec=spec)
    assert getattr(model, "is_activation_checkpointing", None) or getattr(model, "is_gradient_checkpointing")
    torch.testing.assert_close(torch.tensor(ckpt.losses), torch.tensor(plain.losses), rtol=1e-5, atol=1e-6)
    assert plain.flops_per_token > 0  # sizes read from the Hugging Face config


# --- issue 13: inputs that slipped through ------------------------------------------------------------

@pytest.mark.parametrize("norm", [-1.0, 0.0, float("nan"), "1.0"])
def test_a_clipping_norm_that_is_not_positive_is_refused(norm):
    # clip_grad_norm_ with max_norm=-1 multiplies every gradient by a negative factor: the loss climbs
    with pytest.raises(ValueError, match="use None for no clipping"):
        TrainConfig(steps=1, max_grad_norm=norm)
    TrainConfig(steps=1, max_grad_norm=None)  # None: no clipping


def test_zero_steps_is_a_run_of_no_steps_without_nans():
    result = train(tiny_model(), synthetic_batch_fn(VOCAB, BATCH, SEQ), quiet(steps=0))
    assert result.losses == [] and result.steps_done == 0 and result.step_times_s == []
    assert result.tokens_per_s is None and result.samples_per_s is None and result.mfu is None


def test_one_step_reports_no_throughput_rather_than_nan():
    result = train(tiny_model(), synthetic_batch_fn(VOCAB, BATCH, SEQ), quiet(steps=1))
    assert len(result.losses) == 1 and result.tokens_per_s is None  # the only step is the warm-up
    assert result.flops_per_token > 0  # a property of the model, measured or not


def test_stale_temporary_checkpoint_files_are_removed_on_the_next_start(tmp_path, capsys):
    cfg = quiet(steps=2, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    (tmp_path / "step_000004.pt.k2j3_x.tmp").write_bytes(b"half of a checkpoint")  # a killed save's leftover
    (tmp_path / "step_000006.tmp").mkdir()  # and a DCP folder's
    (tmp_path / "notes.tmp").write_text("not ours")  # other names are left alone
    train(tiny_model(), synthetic_batch_fn(VOCAB, BATCH, SEQ), cfg)
    assert sorted(os.listdir(tmp_path)) == ["notes.tmp", "step_000002.pt"]
    out = capsys.readouterr().out
    assert "removed 2 unfinished temporary file(s)" in out and "step_000004.pt.k2j3_x.tmp" in out


def test_checkpoint_every_zero_never_saves(tmp_path):
    train(tiny_model(), synthetic_batch_fn(VOCAB, BATCH, SEQ), quiet(steps=3, checkpoint_dir=str(tmp_path)))
    assert os.listdir(tmp_path) == []


def test_a_truncated_last_checkpoint_is_named_and_the_previous_one_offered(tmp_path):
    batch_fn = synthetic_batch_fn(VOCAB, BATCH, SEQ)
    cfg = quiet(steps=4, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    train(tiny_model(), batch_fn, cfg)
    newest = tmp_path / "step_000004.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # a copy that did not finish
    cfg.steps = 6
    with pytest.raises(ValueError, match="step_000004.pt.*not a complete checkpoint.*step_000002.pt"):
        train(tiny_model(), batch_fn, cfg)
    newest.unlink()  # what the message says to do: the run resumes from the previous one
    assert train(tiny_model(), batch_fn, cfg).resumed_from == 2


# --- the loop: exact, fed, measured -------------------------------------------------------------------

def _plain_loop(model, batch_fn, steps, lr=3e-3, max_grad_norm=1.0):
    """The loop as it was written before the loop kept the device fed: float() after every step."""
    from helpers.core.seeding import seed_everything
    from helpers.train.loop import make_optimizer

    seed_everything(0)
    opt = make_optimizer(model, lr, 0.01)
    losses = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(**batch_fn(step, 0)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        opt.step()
        losses.append(float(loss.detach().float()))
    return losses


def test_losses_are_bit_identical_to_a_plain_loop_that_syncs_every_step():
    batch_fn = synthetic_batch_fn(VOCAB, BATCH, SEQ, seed=6, pad_fraction=0.3)
    expected = _plain_loop(tiny_model(), batch_fn, 7)
    result = train(tiny_model(), batch_fn, quiet(steps=7, log_every=3))  # read back at 3, 6 and 7
    assert result.losses == expected


def test_train_step_in_a_loop_of_your_own_matches_train():
    from helpers.core.seeding import seed_everything
    from helpers.train.loop import TrainStep, make_optimizer

    batch_fn = synthetic_batch_fn(VOCAB, BATCH, SEQ, seed=7)
    expected = train(tiny_model(), batch_fn, quiet(steps=4, grad_accum=2)).losses
    model = tiny_model()
    seed_everything(0)
    opt = make_optimizer(model, 3e-3, 0.01)
    step = TrainStep(model, opt)  # made once: it checks the spec on the device, the model and the clipping
    outs = [step([batch_fn(s, m) for m in range(2)]) for s in range(4)]
    assert [float(o.loss) for o in outs] == expected
    assert all(o.samples == 2 * BATCH and o.tokens == 2 * BATCH * SEQ for o in outs)
    with pytest.raises(ValueError, match="GradScaler"):
        TrainStep(model, opt, spec=RunSpec(precision="fp16"))


def test_tokens_are_counted_on_the_host_before_the_model_runs():
    from helpers.train.loop import TrainStep, make_optimizer

    class EatsItsMask(nn.Module):  # zeroes the mask it gets: a count taken afterwards would see 0
        def __init__(self):
            super().__init__()
            self.inner = tiny_model()

        def forward(self, input_ids, attention_mask, labels):
            out = self.inner(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
            attention_mask.zero_()
            return out

    batch = synthetic_batch_fn(VOCAB, BATCH, SEQ, pad_fraction=0.5)(0, 0)
    real = int(batch["attention_mask"].sum())
    model = EatsItsMask()
    out = TrainStep(model, make_optimizer(model, 1e-3, 0.0))(batch)
    assert isinstance(out.tokens, int) and out.tokens == real < BATCH * SEQ


def test_mfu_counts_real_tokens_at_each_batch_width():
    from helpers.measure.flops import model_flops_per_token

    base = synthetic_batch_fn(VOCAB, BATCH, SEQ, seed=8, pad_fraction=0.5)
    widths = [SEQ, SEQ // 2, SEQ, SEQ // 4, SEQ // 2]  # dynamic padding: each batch as wide as it needs

    def batch_fn(step, micro):
        return {k: v[:, :widths[step]] for k, v in base(step, micro).items()}

    model = tiny_model()
    result = train(model, batch_fn, quiet(steps=5, peak_flops=1e12))
    useful = sum(int(batch_fn(s, 0)["attention_mask"].sum()) * model_flops_per_token(model, widths[s])
                 for s in range(1, 5))  # step 0 is the warm-up
    timed = sum(result.step_times_s[1:])
    assert result.mfu == pytest.approx(useful / timed / 1e12, rel=1e-9)
    assert result.peak_flops == 1e12 and result.peak_source == "TrainConfig.peak_flops"


def test_linear_warmup_and_decay_and_an_exact_resume(tmp_path):
    batch_fn = synthetic_batch_fn(VOCAB, BATCH, SEQ, seed=9)
    cfg = dict(steps=8, lr=1e-2, lr_schedule="linear", warmup_steps=2)
    full = train(tiny_model(), batch_fn, quiet(**cfg))
    # warm-up 0, 0.5 of the peak, then down in a straight line to 0 after the last step
    assert full.lrs == pytest.approx([0.0, 5e-3, 1e-2, 1e-2 * 5 / 6, 1e-2 * 4 / 6, 1e-2 * 3 / 6,
                                      1e-2 * 2 / 6, 1e-2 * 1 / 6])
    part = quiet(**cfg, checkpoint_dir=str(tmp_path), checkpoint_every=3)

    def dies_at_step_4(step, micro):
        if step == 4:
            raise Interrupt
        return batch_fn(step, micro)

    with pytest.raises(Interrupt):
        train(tiny_model(), dies_at_step_4, part)
    resumed = train(tiny_model(seed=5), batch_fn, part)
    assert resumed.resumed_from == 3
    assert resumed.lrs == full.lrs and resumed.losses == full.losses  # the schedule's state was saved
    with pytest.raises(ValueError, match="warmup_steps"):
        TrainConfig(steps=8, warmup_steps=2, warmup_frac=0.1)
    assert TrainConfig(steps=50, warmup_frac=0.1).warmup == 5


def test_on_step_sees_every_step_and_your_own_optimizer_is_used():
    from helpers.train.loop import make_optimizer

    model = tiny_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    train(model, synthetic_batch_fn(VOCAB, BATCH, SEQ), quiet(steps=3), optimizer=opt,
          on_step=lambda done, out: seen.append((done, out.loss.shape)))
    assert seen == [(1, ()), (2, ()), (3, ())]
    assert not opt.state or "momentum_buffer" in next(iter(opt.state.values()))  # SGD's, not AdamW's
    assert make_optimizer(tiny_model(), 1e-3, 0.0).defaults["fused"]  # fused AdamW on this CPU too


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_loop_reads_back_at_log_points_only():
    batch_fn = synthetic_batch_fn(VOCAB, BATCH, SEQ, pad_fraction=0.3)
    model = tiny_model(dropout=0.0).cuda()
    result = train(model, batch_fn, quiet(steps=7, log_every=3, track_memory=True), device="cuda")
    assert len(result.losses) == len(result.step_times_s) == 7 and all(t > 0 for t in result.step_times_s)
    assert result.tokens_per_s > 0 and result.peak_memory_bytes > 0
    host = sum(count_tokens(batch_fn(s, 0)) for s in range(1, 7))
    assert result.tokens_per_s * sum(result.step_times_s[1:]) == pytest.approx(host)


def test_evaluate_maps_predictions_back_to_the_dataset_order():
    from helpers.train.evaluation import evaluate

    class Docs:  # a tokenised dataset as helpers.data.text.tokenize makes it
        lengths = [5, 2, 7, 3, 6, 4]
        labels = [2, 2, 1, 0, 0, 0]

        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {"input_ids": [1] * self.lengths[i], "labels": self.labels[i]}

    class LengthMod3(nn.Module):  # predicts (number of real tokens) mod 3
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(()))

        def forward(self, input_ids, attention_mask):
            n = attention_mask.sum(1)
            return type("Out", (), {"logits": nn.functional.one_hot(n % 3, 3).float() + self.w})()

    acc, preds, labels = evaluate(LengthMod3(), Docs(), batch_size=4, device="cpu")
    assert preds == [n % 3 for n in Docs.lengths] and labels == Docs.labels
    assert acc == pytest.approx(5 / 6)  # every length but 4 (predicted 1, label 0)


def test_the_linear_schedule_is_transformers_one():
    from transformers import get_linear_schedule_with_warmup

    from helpers.train.loop import make_lr_scheduler

    lrs = {}
    for name in ("ours", "transformers"):
        opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
        sched = (make_lr_scheduler(opt, 10, "linear", 3) if name == "ours"
                 else get_linear_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=10))
        lrs[name] = []
        for _ in range(12):
            lrs[name].append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
    assert lrs["ours"] == pytest.approx(lrs["transformers"], abs=1e-12)


def test_the_loop_does_not_pin_batches_itself(monkeypatch):
    # issue 18: t.pin_memory().to(dev, non_blocking=True) in the loop is a blocking copy plus a copy; the
    # DataLoader pins (RunSpec.dataloader: with num_workers=0 inside next(), on the same thread), the loop
    # only queues the copy
    import helpers.train.loop as loop

    pinned, copies = [], []
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self, *a, **k: False)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: pinned.append(1) or self)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: copies.append(k.get("non_blocking")) or
                        self)
    batch = synthetic_batch_fn(VOCAB, BATCH, SEQ, pad_fraction=0.5)(0, 0)
    loop._to_device(batch, torch.device("cuda"))  # a CUDA device that is never touched: `to` is patched
    assert pinned == [] and copies == [True, True, True]


def test_accumulation_under_ddp_all_reduces_once_per_step(tmp_path):
    # issue 19: without no_sync, DDP all-reduces every micro-batch's gradients; count the all-reduces
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    calls = []

    def counting_allreduce(state, bucket):  # a one-process "all-reduce": count it, keep the gradients
        calls.append(1)
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    def all_reduces(accum: int) -> int:
        model = DDP(tiny_model(dropout=0.0))
        model.register_comm_hook(None, counting_allreduce)
        calls.clear()
        train(model, synthetic_batch_fn(VOCAB, BATCH, SEQ), quiet(steps=2, grad_accum=accum))
        return len(calls)

    try:
        per_step = all_reduces(1) // 2  # DDP's buckets: all-reduces of one step
        assert per_step >= 1 and all_reduces(4) == 2 * per_step  # 4 micro-batches, still one per step
    finally:
        dist.destroy_process_group()


def test_a_damaged_saved_roofline_is_said_and_other_errors_are_not_swallowed(monkeypatch, tmp_path):
    # issue 25: the peak lookup caught every exception; now only what reading lesson 00's file can raise
    import helpers.measure.roofline as hw
    from helpers.train.meter import run_peak

    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    hw._roofline_path(hw.device_name()).write_text('{"device_name": "half a')  # a half-written file
    peak, source = run_peak(torch.device("cpu"))  # no peak on a CPU, and it says why
    assert peak is None and "could not be read" in source and "run lesson 00" in source

    def broken(**fields):
        raise RuntimeError("a bug, not a damaged file")

    hw._roofline_path(hw.device_name()).write_text('{"device_name": "x"}')
    monkeypatch.setattr(hw, "Roofline", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        run_peak(torch.device("cpu"))


# --- issue 39 ---------------------------------------------------------------------------------------------

def test_5_one_step_checked_once_per_run_for_train_the_ladder_and_train_ddp(monkeypatch):
    """train, lesson 08's ladder and train_ddp run helpers.train.loop.TrainStep, whose spec is checked when it
    is
    made, once per run: not at every step (spec.check) nor at every forward pass (check_precision)."""
    from helpers.core import precision
    from helpers.train import loop as train_module
    from helpers.train import runspec

    checks, steps = [], []
    real_check = precision.check_precision
    monkeypatch.setattr(runspec, "check_precision", lambda *a: (checks.append(a), real_check(*a))[1])
    monkeypatch.setattr(precision, "check_precision", lambda *a: (checks.append(a), real_check(*a))[1])
    spec = RunSpec(precision="bf16")
    train(tiny_model(), synthetic_batch_fn(VOCAB, BATCH, SEQ), quiet(steps=4, grad_accum=2), spec=spec)
    assert len(checks) == 1, checks  # 4 steps, 8 forward passes: one check
    real_call = train_module.TrainStep.__call__
    monkeypatch.setattr(train_module.TrainStep, "__call__",
                        lambda self, b: (steps.append(1), real_call(self, b))[1])

    from helpers.train import ladder

    checks.clear(), steps.clear()
    batches, check = ladder.sample_batches([9, 16, 12, 7], batch_size=2, n_batches=2, seq_len=16, vocab=VOCAB,
                                           n_classes=2)
    model = SmallTransformer(TransformerConfig(vocab_size=VOCAB, max_len=16, d_model=32, n_heads=2,
                                               n_layers=1, n_classes=2))
    ladder.measure_stack(RunSpec(precision="bf16", fused_adamw=False, padding="fixed"), None,
                         make_model=lambda: model, batches=batches, check=check, device=torch.device("cpu"),
                         repeats=2)
    assert len(steps) == 2 * (1 + 2)  # a warm-up pass and 2 timed passes of 2 batches: train's step
    assert len(checks) <= 2, checks  # the check pass's autocast, and the step's once: not at each of 6 steps

    from course.scripts import train_ddp

    checks.clear(), steps.clear()
    train_ddp.main(["--steps", "3", "--global-batch", "4", "--seq-len", "8", "--vocab", "32", "--d-model",
                    "16", "--n-layers", "1", "--n-heads", "2", "--precision", "bf16", "--log-every", "3",
                    "--micro-batch", "2"])
    assert len(steps) == 3 and len(checks) <= 2, (len(steps), checks)  # the script's spec.check, the step's


def test_6_a_cpu_peak_counts_the_optimizer_state_a_later_step_starts_with():
    """On a CPU the peak is read with the profiler over one step. The first step's peak comes before AdamW
    makes its two moments: the steady state holds them during every later forward and backward pass."""
    from helpers.measure.memory import tensor_bytes, track_peak_memory
    from helpers.train.loop import TrainStep, make_optimizer

    batch_fn = synthetic_batch_fn(VOCAB, 8, SEQ)
    cfg = dict(dropout=0.0, d_model=64, n_layers=2)
    result = train(tiny_model(**cfg), batch_fn, quiet(steps=3, track_memory=True))
    model = tiny_model(**cfg)  # the same run by hand: the second step measured as the steady state
    seed_everything(0)
    opt = make_optimizer(model, 3e-3, 0.01)
    step = TrainStep(model, opt)
    step(batch_fn(0, 0))
    opt.zero_grad(set_to_none=True)
    with track_peak_memory("cpu", baseline_bytes=tensor_bytes(model, opt)) as steady:
        step(batch_fn(1, 0))
    moments = tensor_bytes(opt)  # the optimizer state the first step's peak has not got
    assert moments > 0.05 * steady.peak_bytes  # large enough to tell the two apart
    assert abs(result.peak_memory_bytes - steady.peak_bytes) < 0.25 * moments, (
        result.peak_memory_bytes, steady.peak_bytes, moments)
    assert result.tokens_per_s is not None  # the third step is timed: the profiled second is not
    assert len(result.step_times_s) == 3


def test_7_xy_pairs_for_a_model_that_shifts_its_labels_are_refused_with_the_fix():
    """A Hugging Face causal LM (and the course's causal SmallTransformer) shifts labels itself: the usual
    (x, y = x moved one ahead) pair would teach it the token two ahead. (x, x) trains; (x, y) is refused."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from helpers.core.adapt import as_batch

    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=SEQ + 1))
    causal = tiny_model(causal=True)
    seq = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    x, y = seq[:, :-1], seq[:, 1:]  # the pair a next-token data set gives
    for model in (llama, causal):
        with pytest.raises(ValueError, match=r"shifts its labels itself.*two ahead.*\(x, x\)"):
            train(model, [(x, y)], quiet(steps=1))
        assert train(model, [(x, x)], quiet(steps=1)).losses  # the pair it takes
    from helpers.core.adapt import shifts_labels

    assert shifts_labels(llama) and shifts_labels(causal) and not shifts_labels(tiny_model())
    assert as_batch((x, y))["labels"] is y  # without a model nothing is known, nothing refused
    assert as_batch((x, y), tiny_model())["labels"] is y  # a classifier's labels are its own


def test_1_fsdp2_train_resumes_every_rank_from_its_own_shards_after_a_rank_is_killed(tmp_path):
    """train() on an FSDP2 model checkpoints every rank's shards (a DCP folder) and resumes each rank from
    its own: after rank 1 is killed and torchrun restarts both, the final weights are the uninterrupted
    run's, with shards that split evenly over the ranks and shards that do not (33 / 32 rows)."""
    import json
    from pathlib import Path

    from helpers.train.distributed import launch

    script = Path(__file__).with_name("fsdp_resume.py")
    out = tmp_path / "report.json"
    result = launch(script, [str(out)], nproc_per_node=2, max_restarts=2, env={"OMP_NUM_THREADS": "1"},
                    timeout_s=300, echo=False)
    killed = [line for line in result.rank_lines(1) if "killed after step 3" in line]
    assert len(killed) == 2, result.rank_lines(1)[-20:]  # once per model: attempts 0 and 1
    report = json.loads(out.read_text())
    for name in ("even", "uneven"):
        r = report[name]
        assert r["resumed_from"] == 2, r  # the newest checkpoint before the kill
        assert "step_000006" in r["folder"] and not any(f.endswith(".pt") for f in r["folder"]), r
        assert r["resumed_losses"] == r["losses"], r  # the lost steps redone exactly
        assert r["max_abs_diff"] == 0.0, r  # the same weights to the bit
