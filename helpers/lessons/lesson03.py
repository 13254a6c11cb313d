"""Lesson 03's set-up (`03_memory`): the small Transformer's batch and length, fitted so that one fp32 AdamW
step, and a trade-off variant beside the first model, fit the device."""

from __future__ import annotations

import torch

from helpers.config import get_profile, pick
from helpers.device import get_device
from helpers.lessons import LessonSetup
from helpers.memory import estimate_training_memory
from helpers.models import SmallTransformer, small_config
from helpers.paths import output_dir
from helpers.sizing import Size, fit_sizes

__all__ = ["setup", "step_peak"]


def step_peak(model: SmallTransformer, sizes: dict[str, int]) -> int:
    """One fp32 AdamW step of `model` at `sizes` (BATCH, SEQ), estimated, bytes (lesson 03)."""
    return estimate_training_memory(model, sizes["BATCH"], sizes["SEQ"]).peak


def setup(profile: str | None = None, *, accum: int = 4) -> LessonSetup:
    """Lesson 03's sizes on this device; prints what it chose and why (lesson 03)."""
    profile = get_profile(profile)
    device = get_device()  # cuda if there is one, else cpu
    vocab = pick(profile, smoke=512, full=8192)  # vocabulary of the synthetic task
    sizes = {"BATCH": Size(full=32, smoke=8, floor=accum),  # sequences per optimizer step (accum micro-steps)
             "SEQ": Size(full=512, smoke=128, floor=128)}  # tokens per sequence
    with torch.device("meta"):  # the model's shapes, for the estimates: nothing is allocated
        shape = SmallTransformer(small_config(profile, vocab_size=vocab, max_len=sizes["SEQ"].full))
    states = 16 * shape.num_params()  # fp32 weights, gradients and AdamW's two moments: the first model, kept
    estimates = {"one training step, measured and recorded": lambda s: step_peak(shape, s),
                 "a trade-off variant, beside the first model": lambda s: states + step_peak(shape, s)}
    fit = fit_sizes(sizes, estimates, shrink=["BATCH", "SEQ"], profile=profile, device=device,
                    precision="fp32", notes=["the search finds the largest batch by running out of memory"])
    print(fit.line())
    return LessonSetup(
        PROFILE=fit.profile, DEVICE=device, FIT=fit, VOCAB=vocab, SHAPE=shape, **fit.sizes,
        STEPS=pick(fit.profile, smoke=8, full=12),  # optimizer steps per trade-off variant
        SEARCH_LIMIT=pick(fit.profile, smoke=256, full=4096),  # largest batch the search tries
        OUT=output_dir("03_memory"))  # the memory snapshot and its HTML: outputs/03_memory/
