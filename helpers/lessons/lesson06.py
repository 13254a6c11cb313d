"""Lesson 06's set-up (`06_input_pipeline`): the batch of articles, fitted so that a fixed-length training
step fits the device, and how much of each experiment the profile runs."""

from __future__ import annotations

import os

import torch

from helpers.config import get_profile, pick
from helpers.device import get_device
from helpers.lessons import LessonSetup
from helpers.memory import estimate_training_memory
from helpers.models import SmallTransformer, small_config
from helpers.sizing import Size, fit_sizes

__all__ = ["SIZES", "setup"]

SIZES = {"BATCH": Size(full=32, smoke=8, floor=4)}  # articles per batch


def setup(profile: str | None = None, *, max_len: int = 512) -> LessonSetup:
    """Lesson 06's sizes on this device; prints what it chose and why (lesson 06)."""
    # Hugging Face tokenizers run their own threads; DataLoader workers are forked processes, and a fork after
    # those threads started can deadlock. Let the workers do the parallel work instead.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    profile = get_profile(profile)
    device = get_device()
    with torch.device("meta"):  # the model's shapes (BBC News has 5 classes), for the estimate
        shape = SmallTransformer(small_config(profile, n_classes=5, max_len=max_len))
    estimates = {  # a fixed-length batch is the largest; model0's weights stay beside the copy that trains
        "a training step on a copy of model0": lambda s: 4 * shape.num_params() + (
            estimate_training_memory(shape, s["BATCH"], max_len).peak)}
    fit = fit_sizes(SIZES, estimates, shrink=["BATCH"], profile=profile, device=device, precision="fp32")
    print(fit.line())
    p = fit.profile
    return LessonSetup(
        PROFILE=p, DEVICE=device, FIT=fit, **fit.sizes,
        WORKERS=pick(p, smoke=[0, 1, 2], full=[0, 2, 4, 8]),  # num_workers to try (capped at the cores)
        LOADER_STEPS=pick(p, smoke=4, full=40),  # training steps timed per num_workers setting
        SYNC_STEPS=pick(p, smoke=3, full=30),  # steps of the .item() experiment
        PROFILE_STEPS=pick(p, smoke=3, full=10),  # steps recorded by torch.profiler
        TIMING_SPLIT=pick(p, smoke="val", full="train"),  # split whose epoch is timed for each padding
        TIMING_EXAMPLES=pick(p, smoke=64, full=None),  # a random sample of that split (None: all of it)
        ROUNDS=pick(p, smoke=2, full=3),  # worker sweep and epoch timings repeated; the fastest round counts
        COPY_MB=pick(p, smoke=16, full=256))  # size of the host->device copy (GPU only)
