"""Memory tools: the estimator's exact terms and its activation term against the CPU measurement,
peak tracking, the timeline, and the largest-batch search surviving out-of-memory errors.

Measurement method on this CPU: torch.profiler memory events (every allocation and free of PyTorch's
CPU allocator, summed in time order), see helpers/measure/memory.py.
"""

from __future__ import annotations

import weakref

import pytest
import torch

from helpers.measure.memory import (
    MemoryEstimate,
    estimate_training_memory,
    find_max_batch_size,
    memory_timeline,
    record_memory_history,
    tensor_bytes,
    track_peak_memory,
)
from helpers.model.models import SmallTransformer, TransformerConfig
from helpers.train.loop import make_optimizer

B, T = 8, 128


def model(**overrides) -> SmallTransformer:
    torch.manual_seed(0)
    cfg = dict(vocab_size=512, max_len=T, d_model=128, n_heads=4, n_layers=2)
    return SmallTransformer(TransformerConfig(**{**cfg, **overrides}))


def test_parameter_gradient_and_optimizer_terms_are_exact():
    m = model()
    est = estimate_training_memory(m, B, T)
    assert est.parameters == tensor_bytes(m)  # weights only: no gradients yet
    ids = torch.randint(512, (B, T))
    opt = make_optimizer(m, 1e-3, 0.01, fused=False)
    m(ids, labels=ids).loss.backward()
    assert est.gradients == sum(p.grad.numel() * p.grad.element_size() for p in m.parameters())
    opt.step()
    assert est.optimizer == tensor_bytes(opt)  # AdamW: exp_avg, exp_avg_sq, step per tensor
    assert estimate_training_memory(m.cfg, B, T).parameters == est.parameters  # from a config alone


@pytest.mark.parametrize("attn", ["sdpa", "naive"])
def test_activation_term_is_within_20_percent_of_the_measured_peak(attn):
    m = model(attn=attn)
    ids = torch.randint(512, (B, T))
    with track_peak_memory("cpu") as forward:
        loss = m(ids, labels=ids).loss  # keeps exactly what the backward pass needs
    est = estimate_training_memory(m, B, T)
    ratio = est.activations / forward.peak_increase_bytes
    assert 0.8 <= ratio <= 1.2, \
        f"estimate {est.activations} vs measured forward peak {forward.peak_increase_bytes}"
    # and what stays held after the forward pass is the saved activations the estimator counts
    assert est.activations == pytest.approx(forward.end_increase_bytes, rel=0.05)
    del loss


@pytest.mark.parametrize("n_layers", [2, 4])
def test_activation_checkpointing_keeps_less_and_the_estimate_follows(n_layers):
    m = model(n_layers=n_layers)
    m.set_activation_checkpointing(True)
    ids = torch.randint(512, (B, T))
    with track_peak_memory("cpu") as step:
        m(ids, labels=ids).loss.backward()  # the peak comes while a block is recomputed
    est = estimate_training_memory(m, B, T, activation_checkpointing=True)
    assert est.activations < estimate_training_memory(m, B, T).activations
    ratio = est.activations / step.peak_increase_bytes
    assert 0.8 <= ratio <= 1.2, f"estimate {est.activations} vs measured peak {step.peak_increase_bytes}"


def test_estimates_scale_as_they_should():
    cfg = TransformerConfig(vocab_size=512, max_len=256, d_model=128, n_heads=4, n_layers=2)
    e1, e2 = estimate_training_memory(cfg, 4, 64), estimate_training_memory(cfg, 8, 64)
    assert e2.activations == 2 * e1.activations and e2.parameters == e1.parameters
    bf16 = estimate_training_memory(cfg, 4, 64, precision="bf16")
    assert bf16.activations < e1.activations and bf16.weight_copies > 0 and e1.weight_copies == 0
    naive = estimate_training_memory(TransformerConfig(**{**cfg.__dict__, "attn": "naive"}), 4, 128)
    sdpa = estimate_training_memory(TransformerConfig(**{**cfg.__dict__, "attn": "sdpa"}), 4, 128)
    assert naive.activations > sdpa.activations  # the T×T attention weights
    assert isinstance(e1, MemoryEstimate) and e1.total == sum(e1.breakdown().values())


def test_estimator_bad_input():
    with pytest.raises(ValueError, match="unknown precision"):
        estimate_training_memory(model(), B, T, precision="int4")
    with pytest.raises(ValueError, match="max_len"):
        estimate_training_memory(model(), B, 4 * T)
    with pytest.raises(ValueError, match="SmallTransformer or a TransformerConfig.*method='dry run'"):
        estimate_training_memory(torch.nn.Linear(2, 2), B, T, method="formula")
    with pytest.raises(ValueError, match="SmallTransformer or a TransformerConfig"):
        estimate_training_memory("bert-base", B, T)
    with pytest.raises(ValueError, match="vocabulary.*batch="):  # the dry run needs a batch it can make
        estimate_training_memory(torch.nn.Linear(2, 2), B, T)
    with pytest.raises(ValueError, match="unknown method"):
        estimate_training_memory(model(), B, T, method="guess")


def test_track_peak_memory_sees_a_known_allocation():
    with track_peak_memory("cpu", baseline_bytes=1000) as r:
        x = torch.empty(1_000_000, dtype=torch.float32)  # 4 MB
        y = torch.empty(500_000, dtype=torch.float32)  # 2 MB more at the peak
        del y
    assert r.peak_increase_bytes == 6_000_000 and r.end_increase_bytes == 4_000_000
    assert r.peak_bytes == 6_001_000
    del x


def test_memory_timeline_sorts_a_training_step_into_categories():
    m = model(n_layers=1)
    opt = make_optimizer(m, 1e-3, 0.0, fused=False)
    ids = torch.randint(512, (2, 32))

    def step():
        opt.zero_grad(set_to_none=True)
        m(ids, labels=ids).loss.backward()
        opt.step()

    step()  # optimizer state exists from now on
    tl = memory_timeline(step)
    assert len(tl.times_s) == len(tl.total()) > 10
    weights = sum(p.numel() * p.element_size() for p in m.parameters())
    assert max(tl.bytes_by_category["parameter"]) == weights
    assert max(tl.bytes_by_category["gradient"]) == weights  # float32 gradients, one per weight
    assert max(tl.bytes_by_category["activation"]) > 0
    assert tl.peak_bytes >= 2 * weights + tensor_bytes(opt)


def test_largest_batch_search_survives_out_of_memory_and_frees_it():
    budget = 37  # a fake device: batches above 37 "run out of memory" after allocating
    leaked = []

    def step(n: int) -> None:
        # each try starts with nothing left of the earlier ones, failed tries included
        assert all(ref() is None for ref in leaked), "a previous try's tensors are still alive"
        activations = torch.empty(n, 1000)
        leaked.append(weakref.ref(activations))
        if n > budget:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} (fake)")

    assert find_max_batch_size(step, verbose=False) == budget
    assert all(ref() is None for ref in leaked)  # nothing from a failed try is still held
    assert find_max_batch_size(step, start=64, verbose=False) == 0
    assert find_max_batch_size(step, limit=20, verbose=False) == 20

    def broken(n: int) -> None:
        raise ValueError("not a memory problem")

    with pytest.raises(ValueError, match="not a memory problem"):
        find_max_batch_size(broken, verbose=False)


def test_gpu_only_tools_say_so():
    if torch.cuda.is_available():
        pytest.skip("this checks the message shown on machines without a GPU")
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        record_memory_history(lambda: None, "unused")
    with pytest.raises(ValueError, match="no GPU"):
        with track_peak_memory("cuda"):
            pass


def test_expected_peak_of_a_whole_step_is_within_20_percent_of_the_measured_one():
    m = model()
    opt = make_optimizer(m, 1e-3, 0.01, fused=False)
    ids = torch.randint(512, (B, T))

    def step():
        opt.zero_grad(set_to_none=True)
        m(ids, labels=ids).loss.backward()
        opt.step()

    step()  # AdamW's state exists from here on, as in every later step
    with track_peak_memory("cpu", baseline_bytes=tensor_bytes(m, opt, ids)) as measured:
        step()
    est = estimate_training_memory(m, B, T)
    assert 0.8 <= est.peak / measured.peak_bytes <= 1.2, (est.peak, measured.peak_bytes)
    assert est.peak <= est.total


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_activations_and_weight_copies_match_the_measurement(precision):
    from helpers.core.precision import autocast_context

    m = model()  # SDPA attention: the same autocast policy on CPU and CUDA
    ids = torch.randint(512, (B, T))
    with track_peak_memory("cpu") as forward:
        with autocast_context(precision, "cpu"):
            loss = m(ids, labels=ids).loss
    est = estimate_training_memory(m, B, T, precision=precision)
    # kept after the forward: the saved activations and autocast's 16-bit weight copies
    assert est.activations + est.weight_copies == pytest.approx(forward.end_increase_bytes, rel=0.05)
    del loss


def test_peak_rss_bytes_sees_a_large_allocation():
    from helpers.measure.memory import peak_rss_bytes

    before = peak_rss_bytes()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, written, so the pages are resident
    after = peak_rss_bytes()
    assert after >= before and after >= block.numel() * 4  # the peak includes at least this tensor
    assert after < 2**40  # bytes, not KiB read as bytes twice over


def test_the_dry_runs_tracker_keeps_the_same_peak_as_torchs_memtracker():
    """compat.tracked_peak keeps only the step's peak (torch's MemTracker also updates every module's own peak
    after every op, 2/3 of a large model's dry run): the same bytes by category as the stock tracker, on a
    model with many modules whose peak falls in the backward."""
    from unittest import mock

    from torch.distributed._tools import mem_tracker

    from helpers.core import compat
    from helpers.measure.memory import estimate_step_memory

    with torch.device("meta"):
        model = SmallTransformer(TransformerConfig(vocab_size=300, d_model=64, n_heads=4, n_layers=4,
                                                   max_len=32))
    batch = {"input_ids": torch.randint(300, (3, 32)), "labels": torch.randint(300, (3, 32))}
    ours = estimate_step_memory(model, batch, precision="bf16")
    with mock.patch.object(compat, "_peak_tracker", lambda stock, *args: mem_tracker.MemTracker(*args)):
        stock = estimate_step_memory(model, batch, precision="bf16")
    assert ours == stock, f"the dry run's peak differs from torch's MemTracker: {ours} vs {stock}"
