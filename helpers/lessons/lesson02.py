"""Lesson 02's set-up (`02_mixed_precision`): what this device runs (precisions, autocast modes, the wide
model's mixed precision) and the sizes of the small and the wide model, fitted to its memory."""

from __future__ import annotations

import functools

import torch

from helpers.config import get_profile, pick
from helpers.device import get_device
from helpers.lessons import LessonSetup
from helpers.memory import estimate_training_memory
from helpers.models import SmallTransformer, TransformerConfig, small_config
from helpers.precision import PRECISIONS, precision_runs
from helpers.sizing import Size, fit_sizes

__all__ = ["SIZES", "setup", "wide_config"]

SIZES = {"BATCH": Size(full=32, smoke=8, floor=4),  # sequences per step
         "SEQ": Size(full=512, smoke=64, floor=128),  # tokens per sequence
         "WIDE_D_MODEL": Size(full=4096, smoke=512, floor=1024),  # the wide model's width (docs/claims.md#c3)
         "WIDE_BATCH": Size(full=32, smoke=8, floor=2)}  # its sequences per step
# the wide model keeps its width before its batch; the small model keeps its batch before its length
SHRINK = ["WIDE_BATCH", "WIDE_D_MODEL", "BATCH", "SEQ"]


def wide_config(profile: str, vocab: int, width: int, seq: int, layers: int) -> TransformerConfig:
    """The GPU-only cell's wide model: `layers` blocks of `width`, heads of 128 (lesson 02)."""
    return small_config(profile, vocab_size=vocab, max_len=seq, d_model=width, n_heads=width // 128,
                        n_layers=layers)


@functools.cache
def _shape(profile: str, vocab: int, seq: int, width: int | None, layers: int) -> SmallTransformer:
    """A model's shapes on the meta device, for the estimates: nothing is allocated."""
    with torch.device("meta"):
        return SmallTransformer(small_config(profile, vocab_size=vocab, max_len=seq) if width is None
                                else wide_config(profile, vocab, width, seq, layers))


def _step_peak(model: SmallTransformer, batch: int, seq: int, precisions: list[str]) -> int:
    """The largest estimated peak of one AdamW step over the precisions, bytes."""
    return max(estimate_training_memory(model, batch, seq, precision=p).peak for p in precisions)


def setup(profile: str | None = None, *, wide_layers: int = 4) -> LessonSetup:
    """Lesson 02's choices and sizes on this device; prints what it chose and why (lesson 02)."""
    profile = get_profile(profile)
    device = get_device()  # cuda if there is one, else cpu
    # what this device runs, from its compute capability: the precisions of the comparison, the 16-bit
    # autocast modes, and the wide model's mixed precision (bf16 with bf16 tensor cores, else fp16)
    runs = [p for p in PRECISIONS if precision_runs(p, device)]
    autocast_modes = [p for p in ("fp16", "bf16") if p in runs]
    amp = next((p for p in ("bf16", "fp16") if p in runs), None) if device.type == "cuda" else None
    vocab = pick(profile, smoke=512, full=8192)  # vocabulary of the synthetic task
    matmul_n = pick(profile, smoke=512, full=8192)  # the square matmul
    seq_full = SIZES["SEQ"].full
    estimates = {  # AdamW, as helpers.train runs it; every precision the step trains in
        "the small model's step": lambda s: _step_peak(
            _shape(profile, vocab, seq_full, None, wide_layers), s["BATCH"], s["SEQ"], runs),
        "the matmul: a, b, product, fp32 reference, 16-bit copies": lambda s: 6 * 4 * matmul_n ** 2,
    }
    if amp:  # the wide model runs only on a GPU with tensor cores
        estimates["the wide model's step"] = lambda s: _step_peak(
            _shape(profile, vocab, seq_full, s["WIDE_D_MODEL"], wide_layers), s["WIDE_BATCH"], s["SEQ"],
            ["fp32", amp])
    notes = [f"autocast modes: {', '.join(autocast_modes) or 'none'}",
             f"wide model: fp32 vs {amp}" if amp else "wide model: skipped (no GPU)"]
    fit = fit_sizes(SIZES, estimates, shrink=SHRINK, profile=profile, device=device, notes=notes)
    print(fit.line())
    return LessonSetup(
        PROFILE=fit.profile, DEVICE=device, FIT=fit, RUNS=runs, AUTOCAST_MODES=autocast_modes, AMP=amp,
        VOCAB=vocab, MATMUL_N=matmul_n, **fit.sizes,
        STEPS=pick(fit.profile, smoke=16, full=200),  # optimizer steps per precision
        LR=pick(fit.profile, smoke=3e-3, full=1e-3))  # AdamW learning rate
