"""The course's Triton FlashAttention, forward and backward (lesson 01): compiled and autotuned on a CUDA
GPU, run by Triton's interpreter on CPU tensors (correct, thousands of times slower: for checking only).
Guide: docs/library/model.md#helpersmodelkernels"""

from __future__ import annotations

from helpers.model.kernels.flash_attention import (
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_DIMS,
    flash_attention,
    kernel_refusal,
    kernel_source,
    triton_available,
    uses_interpreter,
)

__all__ = ["flash_attention", "triton_available", "uses_interpreter", "kernel_source", "kernel_refusal",
           "SUPPORTED_HEAD_DIMS", "SUPPORTED_DTYPES"]
