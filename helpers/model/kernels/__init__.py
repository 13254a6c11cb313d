"""Triton kernels of the course: FlashAttention (`flash_attention`), forward and backward.

On a CUDA GPU the kernel is compiled by Triton (and autotuned over block sizes). On a machine without
CUDA it runs through Triton's interpreter, which executes the same kernel code in Python with NumPy on
CPU tensors: correct, and fine for small sizes, but thousands of times slower than a GPU, so it is for
checking the algorithm, not for timing it.

Triton decides when it is first imported whether kernels are interpreted: TRITON_INTERPRET=1 must be
set before then. `flash_attention` on CPU tensors sets it itself if nothing has imported triton yet,
and otherwise raises an error that says to restart with the variable set (lesson 01's setup cell and
the tests set it first, on machines without CUDA).

`flash_attention` is differentiable: its backward pass is two more Triton kernels (`_triton_bwd.py`) that
recompute the attention probabilities tile by tile from the row log-sum-exp the forward kept. On a GPU the
tiles follow its architecture (`helpers.model.kernels.configs`: what fits its shared memory per block); only
the
forward is autotuned, each backward kernel launches one configuration.
"""

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
