"""helpers.kernels: the Triton FlashAttention forward agrees with SDPA's math backend.

Without CUDA the kernel runs through Triton's interpreter, which must be chosen before triton is first
imported: this module sets TRITON_INTERPRET=1 at collection time, before any test imports triton.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere in this process

from helpers.attention import sdpa_attention  # noqa: E402
from helpers.kernels import SUPPORTED_HEAD_DIMS, flash_attention, triton_available  # noqa: E402

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed (Linux only)")

# Tolerances per dtype, against an fp32 math-backend reference of the same inputs:
# fp32 (interpreter, exact fp32 matmuls): 1e-5; fp32 on a GPU uses TF32 matmuls (10-bit mantissa): 1e-2;
# fp16 (P is rounded to fp16 before P·V): 1e-2; bf16 (8-bit mantissa): 3e-2.
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def _interpreting() -> bool:
    from triton import knobs

    return bool(knobs.runtime.interpret)


def _inputs(b, h, tq, tk, d, seed, padded, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, t, d, generator=g) for t in (tq, tk, tk))
    mask = None
    if padded:  # a random-length prefix of real keys per sequence (at least one)
        lengths = torch.randint(1, tk + 1, (b,), generator=g)
        mask = (torch.arange(tk)[None, :] < lengths[:, None]).to(device)
    return (*(x.to(device=device, dtype=dtype) for x in (q, k, v)), mask)


def _check(q, k, v, mask, causal, tol, **kw) -> None:
    ref = sdpa_attention(q.float(), k.float(), v.float(), causal=causal, key_padding_mask=mask, backend="math")
    with torch.no_grad():
        out = flash_attention(q, k, v, causal=causal, key_padding_mask=mask, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("d,tq,tk", [(64, 37, 37), (16, 21, 45), (128, 19, 19)])  # not multiples of 16
def test_interpreter_matches_sdpa_math(causal: bool, padded: bool, d: int, tq: int, tk: int) -> None:
    if not _interpreting():
        pytest.skip("triton compiles for the GPU in this process; the interpreter tests run without CUDA")
    q, k, v, mask = _inputs(1, 2, tq, tk, d, seed=d + tq + 3 * causal + padded, padded=padded)
    _check(q, k, v, mask, causal, TOL[torch.float32])


def test_interpreter_block_sizes_do_not_change_the_result() -> None:
    if not _interpreting():
        pytest.skip("interpreter only")
    q, k, v, _ = _inputs(1, 1, 40, 40, 32, seed=11, padded=False)
    _check(q, k, v, None, True, TOL[torch.float32], block_m=32, block_n=16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_matches_sdpa_math(dtype: torch.dtype, causal: bool, padded: bool, d: int) -> None:
    if _interpreting():
        pytest.skip("TRITON_INTERPRET=1 is set: kernels are interpreted, not compiled")
    q, k, v, mask = _inputs(2, 4, 333, 333, d, seed=d, padded=padded, device="cuda", dtype=dtype)
    _check(q, k, v, mask, causal, TOL[dtype])


def test_bad_input_names_the_shapes() -> None:
    q = torch.randn(1, 2, 8, 48)
    with pytest.raises(ValueError, match=r"head dimension 48 \(q \(1, 2, 8, 48\)\).*need d in"):
        flash_attention(q, q, q)
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(ValueError, match=r"k \(1, 2, 9, 32\)"):
        flash_attention(q, torch.randn(1, 2, 9, 32), torch.randn(1, 2, 9, 32))
    with pytest.raises(ValueError, match=r"\(B, Tk\) = \(1, 8\), got \(2, 8\)"):
        flash_attention(q, q, q, key_padding_mask=torch.ones(2, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="one dtype"):
        flash_attention(q, q.double(), q)
    with pytest.raises(ValueError, match="power of two"):
        flash_attention(q, q, q, block_m=24)
    with pytest.raises(ValueError, match="no backward"):
        flash_attention(q.requires_grad_(), q, q)


def test_supported_head_dims_include_the_usual_ones() -> None:
    assert {64, 128} <= set(SUPPORTED_HEAD_DIMS)
