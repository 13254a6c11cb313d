"""Lesson 01's set-up (`01_attention`): the attention inputs' sizes, fitted so that the naive attention's
(B, H, N, N) score matrices fit the device, and the dtype the device computes in."""

from __future__ import annotations

import os

import torch

from helpers.config import get_profile, pick
from helpers.device import get_device
from helpers.lessons import LessonSetup
from helpers.precision import PRECISION_DTYPE, training_precision
from helpers.sizing import Size, fit_sizes

__all__ = ["SIZES", "setup"]

# the sizes memory depends on: the full value, the smoke value, the smallest the fit may go to
SIZES = {"BATCH": Size(full=4, smoke=1, floor=1),  # B of the attention inputs
         "SWEEP_MAX": Size(full=8192, smoke=1024, floor=1024),  # longest N of the scaling sweep
         "SEQ": Size(full=4096, smoke=256, floor=512),  # N for the single-length steps
         "FLEX_SEQ": Size(full=4096, smoke=128, floor=512)}  # N for the FlexAttention example
# the lesson is about N: the batch shrinks first, the longest N last
SHRINK = ["BATCH", "FLEX_SEQ", "SEQ", "SWEEP_MAX"]


def _estimates(heads: int, item: int) -> dict:
    """Each step's peak: its largest live (B, H, N, N) matrices (the inputs are small beside them)."""

    def scores(b: int, n: int, bytes_per_score: int) -> int:  # one (B, H, N, N) matrix of scores
        return b * heads * n * n * bytes_per_score

    return {
        "attention by hand (scores, fp32 softmax)": lambda s: scores(s["BATCH"], s["SEQ"], item + 8),
        "the fp32 math reference": lambda s: scores(s["BATCH"], s["SEQ"], 8),
        "naive attention at the longest N": lambda s: scores(s["BATCH"], s["SWEEP_MAX"], 2 * item),
        "one batch element at the longest N": lambda s: scores(1, s["SWEEP_MAX"], 8),
        "fp32 SDPA with a dense mask": lambda s: scores(s["BATCH"], s["FLEX_SEQ"], 8) + s["FLEX_SEQ"] ** 2,
    }


def setup(profile: str | None = None) -> LessonSetup:
    """Lesson 01's sizes and dtype on this device; prints what it chose and why (lesson 01)."""
    if not torch.cuda.is_available():  # must precede the first `import triton` in this process
        os.environ.setdefault("TRITON_INTERPRET", "1")
    profile = get_profile(profile)
    device = get_device()
    # the dtype follows the device: bf16 with bf16 tensor cores, fp16 with fp16 ones only, fp32 on a CPU
    dtype = PRECISION_DTYPE[training_precision(device)[0]]
    heads, head_dim = pick(profile, smoke=(4, 64), full=(16, 128))  # H, d of the attention inputs
    fit = fit_sizes(SIZES, _estimates(heads, dtype.itemsize), shrink=SHRINK, profile=profile, device=device)
    print(fit.line())
    sweep_max = fit["SWEEP_MAX"]
    return LessonSetup(
        PROFILE=fit.profile, DEVICE=device, FIT=fit, DTYPE=dtype, HEADS=heads, HEAD_DIM=head_dim, **fit.sizes,
        SWEEP=[sweep_max // 8, sweep_max // 4, sweep_max // 2, sweep_max],  # N of the scaling sweep
        # the interpreter is slow: keep N tiny on a CPU (and not a multiple of 16, on purpose)
        TRITON_SEQ=pick(fit.profile, smoke=45, full=4096),
        WINDOW=pick(fit.profile, smoke=16, full=256),  # sliding-window width of the custom mask
        MIN_RUN_TIME=pick(fit.profile, smoke=0.1, full=0.5))  # seconds of timed runs per measurement
