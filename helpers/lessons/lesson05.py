"""Lesson 05's set-up (`05_compile`): the model and batch sizes, fitted beside the copies of the weights the
lesson keeps, whether max-autotune may use Triton GEMM templates here, and a fresh Inductor cache folder."""

from __future__ import annotations

import os

import torch

from helpers.config import get_profile, pick
from helpers.device import get_device
from helpers.lessons import LessonSetup
from helpers.memory import estimate_training_memory
from helpers.models import SmallTransformer, small_config
from helpers.paths import output_dir
from helpers.sizing import Size, fit_sizes

__all__ = ["SIZES", "COPIES", "BIG_GPU_SMS", "setup"]

SIZES = {"BATCH": Size(full=16, smoke=4, floor=2),  # sequences per training step
         "SEQ": Size(full=512, smoke=32, floor=128)}  # tokens per sequence
# copies of the weights the lesson keeps alive: base, eager, compiled, twin, again, a mode's, regional, grads
COPIES = 8
# max-autotune's Triton GEMM templates need a "big" GPU, 68 SMs or more (torch/_inductor/utils.py, is_big_gpu,
# torch 2.13): below that (a T4 has 40, an L4 58) Inductor keeps ATen's matmuls and tunes only the rest
BIG_GPU_SMS = 68


def setup(profile: str | None = None) -> LessonSetup:
    """Lesson 05's sizes and choices on this device; prints what it chose and why (lesson 05). Points
    TORCHINDUCTOR_CACHE_DIR at a fresh folder, so that the lesson's cold compiles are cold."""
    cache_root = str(output_dir("05_compile", fresh=True))  # each cold compile gets a new folder in here
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_root, "other")  # uncounted compiles
    profile = get_profile(profile)
    device = get_device()
    vocab = pick(profile, smoke=2048, full=30522)  # vocabulary: the token head is vocab x d_model
    n_layers = pick(profile, smoke=2, full=8)  # Transformer blocks (regional compilation compiles one)
    with torch.device("meta"):  # the model's shapes, for the estimates: nothing is allocated
        shape = SmallTransformer(small_config(profile, vocab_size=vocab, n_layers=n_layers))
    graphs = 2 if device.type == "cuda" else 0  # reduce-overhead and max-autotune each keep a CUDA graph

    def step_with_copies(s: dict[str, int]) -> int:  # one fp32 step beside the copies and the CUDA graphs
        step = estimate_training_memory(shape, s["BATCH"], s["SEQ"])
        return COPIES * 8 * shape.num_params() + step.peak + graphs * (step.activations + step.temporary)

    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else None
    templates = sms is not None and sms >= BIG_GPU_SMS
    note = ("" if sms is None else f"max-autotune: Triton GEMM templates ({sms} SMs)" if templates
            else f"max-autotune: no Triton GEMM templates ({sms} SMs, Inductor wants {BIG_GPU_SMS})")
    fit = fit_sizes(SIZES, {"a step beside the copies and CUDA graphs": step_with_copies},
                    shrink=["BATCH", "SEQ"], profile=profile, device=device, precision="fp32",
                    notes=[note] if note else [])
    print(fit.line())
    return LessonSetup(
        PROFILE=fit.profile, DEVICE=device, FIT=fit, VOCAB=vocab, N_LAYERS=n_layers, SMS=sms,
        GEMM_TEMPLATES=templates, CACHE_ROOT=cache_root, **fit.sizes,
        LENGTHS=pick(fit.profile, smoke=[16, 24, 32, 40], full=[128, 192, 256, 384]),  # the recompile demo
        MIN_RUN_TIME=pick(fit.profile, smoke=0.5, full=2.0),  # seconds of timed runs per measurement
        TRY_MAX_AUTOTUNE=pick(fit.profile, smoke=False, full=True))  # max-autotune compiles many kernels
