"""Lesson 07's set-up (`07_distributed`): the model and batches of the multi-process runs (CPU processes on
gloo, or GPUs), the training script they launch, and the per-GPU batch fitted to the GPU's memory."""

from __future__ import annotations

import os

import torch

from helpers.config import get_profile, pick
from helpers.device import get_device
from helpers.lessons import LessonSetup
from helpers.memory import estimate_training_memory
from helpers.models import SmallTransformer, TransformerConfig
from helpers.paths import output_dir, script
from helpers.sizing import Size, fit_sizes

__all__ = ["SIZES", "script_args", "setup"]

SIZES = {"GPU_BATCH": Size(full=16, smoke=8, floor=2)}  # sequences per GPU per step


def script_args(sizes: dict[str, int]) -> list[str]:
    """train_ddp.py's model flags from a dict of sizes: ["--vocab", "256", ...] (lesson 07)."""
    return [arg for k, v in sizes.items() for arg in (f"--{k.replace('_', '-')}", str(v))]


def setup(profile: str | None = None, *, nproc: int = 2, accum: int = 2) -> LessonSetup:
    """Lesson 07's sizes on this device; prints what it chose and why (lesson 07)."""
    profile = get_profile(profile)
    device = get_device()
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    steps = pick(profile, smoke=8, full=30)  # optimizer steps per run
    global_batch = pick(profile, smoke=16, full=32)  # sequences per optimizer step, summed over processes
    micro = global_batch // (nproc * accum)  # sequences per forward pass, the same in every run
    # the small causal Transformer of the CPU runs, on a synthetic learnable task
    model = pick(profile, smoke=dict(vocab=256, seq_len=64, d_model=64, n_layers=2, n_heads=4),
                 full=dict(vocab=1024, seq_len=128, d_model=128, n_layers=4, n_heads=4))
    # the GPU cells: BERT-base-sized layers at full size
    gpu_model = pick(profile, smoke=model,
                     full=dict(vocab=30522, seq_len=512, d_model=768, n_layers=12, n_heads=12))
    with torch.device("meta"):  # the GPU cells' model shapes, for the estimate: nothing is allocated
        shape = SmallTransformer(TransformerConfig(
            vocab_size=gpu_model["vocab"], max_len=gpu_model["seq_len"], d_model=gpu_model["d_model"],
            n_layers=gpu_model["n_layers"], n_heads=gpu_model["n_heads"], causal=True))
    estimates = {  # per GPU, fp32 (the largest precision), DDP's gradient buckets beside the gradients
        "DDP, one rank": lambda s: estimate_training_memory(
            shape, s["GPU_BATCH"], gpu_model["seq_len"]).peak + 4 * shape.num_params()}
    fit = fit_sizes(SIZES, estimates, shrink=["GPU_BATCH"], profile=profile, device=device,
                    notes=[f"{gpus} GPU(s); CPU runs: {nproc} gloo processes, {steps} steps, global batch "
                           f"{global_batch} = micro-batch {micro} x {accum} micro-steps x {nproc} processes"])
    print(fit.line())
    return LessonSetup(
        PROFILE=fit.profile, DEVICE=device, FIT=fit, GPUS=gpus, STEPS=steps, GLOBAL_BATCH=global_batch,
        MICRO=micro, MODEL=model, GPU_MODEL=gpu_model, MODEL_ARGS=script_args(model),
        GPU_ARGS=script_args(gpu_model), **fit.sizes,
        FAULT_AT=steps // 2 + 1,  # the fault-tolerance run's rank 1 is killed with SIGKILL in this step
        TIMEOUT_S=pick(fit.profile, smoke=240, full=900),  # per launch: a hung run is stopped and reported
        CORES=os.cpu_count() or 1,
        SCRIPT=script("train_ddp"),  # the one training script every step launches
        WORK=output_dir("07_distributed", fresh=True))  # JSON summaries, parameters, checkpoints of this run
