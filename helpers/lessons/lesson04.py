"""Lesson 04's set-up (`04_where_time_goes`): the small Transformer's and BERT's training-step sizes, the
batch sweep, and the sizes that put each toy op clearly in its regime on this kind of device."""

from __future__ import annotations

import torch

from helpers.config import get_profile, pick
from helpers.device import get_device
from helpers.lessons import LessonSetup
from helpers.memory import estimate_training_memory
from helpers.models import SmallTransformer, TransformerConfig, bert_config, small_config
from helpers.sizing import Size, fit_sizes

__all__ = ["SIZES", "setup"]

SIZES = {"BATCHES_MAX": Size(full=64, smoke=16, floor=4),  # the batch sweep: 1, 2, 4, ... up to this
         "BATCH": Size(full=16, smoke=4, floor=2),  # sequences per training step (small Transformer)
         "SEQ": Size(full=512, smoke=32, floor=128),  # tokens per sequence
         "BERT_BATCH": Size(full=16, smoke=4, floor=2),
         "BERT_SEQ": Size(full=512, smoke=64, floor=128)}
SHRINK = ["BATCHES_MAX", "BERT_BATCH", "BATCH", "BERT_SEQ", "SEQ"]


def _small_peak(model: SmallTransformer, batch: int, seq: int) -> int:
    """One fp32 training step of the small Transformer, estimated, bytes."""
    return estimate_training_memory(model, batch, seq).peak


def _shapes(profile: str, vocab: int, bert_size: str,
            dropout: float) -> tuple[SmallTransformer, SmallTransformer]:
    """The small Transformer's and BERT's shapes on the meta device (nothing allocated), for the estimates."""
    hf = bert_config(bert_size, 2)  # BERT's shapes, described to the estimator as a Transformer of that shape
    with torch.device("meta"):
        small = SmallTransformer(small_config(profile, vocab_size=vocab, dropout=dropout))
        bert = SmallTransformer(TransformerConfig(
            vocab_size=hf.vocab_size, max_len=hf.max_position_embeddings, d_model=hf.hidden_size,
            n_heads=hf.num_attention_heads, n_layers=hf.num_hidden_layers, d_ff=hf.intermediate_size,
            dropout=dropout, n_classes=2))
    return small, bert


def setup(profile: str | None = None, *, dropout: float = 0.1) -> LessonSetup:
    """Lesson 04's sizes on this device; prints what it chose and why (lesson 04)."""
    profile = get_profile(profile)
    device = get_device()
    vocab = pick(profile, smoke=2048, full=30522)  # vocabulary: the token head is vocab x d_model
    bert_size = pick(profile, smoke="tiny", full="base")  # BERT's shapes (helpers.models.MODEL_SIZES)
    small, bert = _shapes(profile, vocab, bert_size, dropout)
    # fp32 weights, gradients and AdamW's moments of a model whose step closure the lesson keeps alive
    small_states, bert_states = 16 * small.num_params(), 16 * bert.num_params()
    estimates = {
        "profiling the small Transformer": lambda s: _small_peak(small, s["BATCH"], s["SEQ"]),
        "profiling BERT, beside the small model": lambda s: small_states + estimate_training_memory(
            bert, s["BERT_BATCH"], s["BERT_SEQ"]).peak,
        # every batch size's model and optimizer stay alive (plus the two profiled), one step runs at a time
        "the batch sweep: a model per batch size": lambda s: (
            (s["BATCHES_MAX"].bit_length() + 1) * small_states + bert_states
            + _small_peak(small, s["BATCHES_MAX"], s["SEQ"])),
    }
    fit = fit_sizes(SIZES, estimates, shrink=SHRINK, profile=profile, device=device, precision="fp32")
    print(fit.line())
    profile = fit.profile
    # The toy ops are sized to sit clearly in their regime on this kind of device: a GPU launches each op for
    # a few µs, so only larger ops leave the overhead regime there (and its L2 cache holds tens of MB)
    on_gpu = device.type == "cuda"
    return LessonSetup(
        PROFILE=profile, DEVICE=device, FIT=fit, VOCAB=vocab, BERT_SIZE=bert_size, **fit.sizes,
        BATCHES=[2 ** i for i in range(fit["BATCHES_MAX"].bit_length())],  # the sweep: 1, 2, 4, ...
        PROFILE_STEPS=pick(profile, smoke=2, full=5),  # training steps recorded by torch.profiler per table
        SWEEP_ROUNDS=pick(profile, smoke=5, full=10),  # timed steps per batch size in the sweep
        MIN_RUN_TIME=pick(profile, smoke=0.2, full=1.0),  # seconds of timed runs per measurement
        MATMUL_N=2048 if on_gpu else pick(profile, smoke=256, full=1024),  # compute-bound: an n³ matmul
        BIG_ELEMENTS=2**26 if on_gpu else pick(profile, smoke=2**22, full=2**24),  # memory-bound: past caches
        COMPILE_ALL=pick(profile, smoke=False, full=True))  # False: compile only the memory-bound chain
