"""Lesson 08's set-up (`08_bert_finetuning`): the ladder's and the final fine-tuning's batch and length,
fitted so that three stacks side by side (the ladder) and the final run fit the device; whether FP8 runs."""

from __future__ import annotations

import torch

from helpers.config import get_profile, pick
from helpers.device import get_device
from helpers.fp8 import fp8_capable
from helpers.lessons import LessonSetup
from helpers.memory import estimate_training_memory
from helpers.models import SmallTransformer, TransformerConfig, bert_config
from helpers.sizing import Size, fit_sizes

__all__ = ["SIZES", "setup"]

SIZES = {"LADDER_BATCH": Size(full=32, smoke=4, floor=4),  # samples per step while the ladder is timed
         "FINAL_BATCH": Size(full=32, smoke=16, floor=4),  # samples per step of the final fine-tuning
         # tokens per article, longer ones truncated (BERT's limit: 512)
         "MAX_LENGTH": Size(full=512, smoke=64, floor=128)}


def setup(profile: str | None = None) -> LessonSetup:
    """Lesson 08's sizes on this device; prints what it chose and why (lesson 08)."""
    profile = get_profile(profile)
    device = get_device()
    hf = bert_config(pick(profile, smoke="mini", full="base"), 5)  # sized for BERT-base, the largest it loads
    with torch.device("meta"):  # its shapes for the estimator (eager attention, dropout off)
        shape = SmallTransformer(TransformerConfig(
            vocab_size=hf.vocab_size, max_len=hf.max_position_embeddings, d_model=hf.hidden_size,
            n_heads=hf.num_attention_heads, n_layers=hf.num_hidden_layers, d_ff=hf.intermediate_size,
            attn="naive", n_classes=5))
    states = 16 * shape.num_params()  # fp32 weights, gradients and AdamW's moments of one stack's model

    def fp32_eager(batch: int, s: dict[str, int]) -> int:  # the largest stack: fp32, eager, every row padded
        return estimate_training_memory(shape, batch, s["MAX_LENGTH"]).peak

    estimates = {  # the ladder times a candidate beside the best stack and the baseline: three models at once
        "the ladder: three stacks side by side": lambda s: 2 * states + fp32_eager(s["LADDER_BATCH"], s),
        "the final fine-tuning, at worst fp32 eager": lambda s: fp32_eager(s["FINAL_BATCH"], s)}
    fp8, fp8_why = fp8_capable(device)  # FP8 tensor cores (compute capability 8.9+): the capability alone
    note = "FP8: runs (compute capability 8.9+)" if fp8 else "FP8: skipped (needs compute capability 8.9+)"
    fit = fit_sizes(SIZES, estimates, shrink=["LADDER_BATCH", "FINAL_BATCH", "MAX_LENGTH"], profile=profile,
                    device=device, notes=[note])
    print(fit.line())
    p = fit.profile
    return LessonSetup(
        PROFILE=p, DEVICE=device, FIT=fit, FP8=fp8, FP8_WHY=fp8_why, **fit.sizes,
        LADDER_STEPS=pick(p, smoke=2, full=4),  # steps per timed pass (the same samples for every stack)
        REPEATS=pick(p, smoke=3, full=5),  # timed passes per stack: median and IQR
        FINAL_EXAMPLES=pick(p, smoke=480, full=0),  # training articles for the final model; 0 = all
        FINAL_LR=pick(p, smoke=2e-4, full=5e-5),  # peak lr: a short run takes a higher one (with warm-up)
        DDP_STEPS=pick(p, smoke=5, full=20),  # steps of each DDP launch (the first is warm-up)
        DDP_TIMEOUT_S=pick(p, smoke=600, full=1800))  # give up on the torchrun launch after this long
