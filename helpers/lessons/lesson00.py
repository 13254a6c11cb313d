"""Lesson 00's set-up (`00_setup`): the sizes of the matmul and the copy that measure the roofline."""

from __future__ import annotations

from helpers.config import get_profile, pick
from helpers.device import get_device
from helpers.lessons import LessonSetup
from helpers.sizing import Size, fit_sizes

__all__ = ["SIZES", "setup"]

SIZES = {"MATMUL_SIZE": Size(full=8192, smoke=512, floor=2048),  # n of the n×n×n matmul that measures FLOP/s
         "COPY_MB": Size(full=2048, smoke=64, floor=256)}  # size of the copy that measures memory bandwidth
ESTIMATES = {  # fp32 a and b, and a float64 reference of their product with its two float64 inputs
    "the matmul, checked against float64": lambda s: (2 * 4 + 3 * 8) * s["MATMUL_SIZE"] ** 2,
    "the copy: a source and a destination": lambda s: 2 * s["COPY_MB"] * 2**20}


def setup(profile: str | None = None) -> LessonSetup:
    """Lesson 00's sizes on this device; prints the one line saying what it chose and why (lesson 00)."""
    device = get_device()
    fit = fit_sizes(SIZES, ESTIMATES, shrink=["COPY_MB", "MATMUL_SIZE"], profile=get_profile(profile),
                    device=device)
    print(fit.line())
    return LessonSetup(PROFILE=fit.profile, DEVICE=device, FIT=fit, **fit.sizes,
                       MIN_RUN_TIME=pick(fit.profile, smoke=0.2, full=1.0))  # seconds of timed runs each
