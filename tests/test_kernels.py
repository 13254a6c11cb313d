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


_COMPILE_FOR_GPU = r'''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from helpers.kernels import _triton_fwd

fn = triton.jit(_triton_fwd.attn_fwd)
names = fn.arg_names
CONSTEXPR = ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL", "HAS_MASK", "EVEN_N")
for arch, dtype, d, causal, mask, even in [(90, "bf16", 128, True, True, False), (80, "fp16", 64, False, False, True)]:
    sig = {n: ("*" + dtype if n in "QKVO" else "*i8" if n == "Mask" else "fp32" if n == "sm_scale"
               else "constexpr" if n in CONSTEXPR else "i32") for n in names}
    const = dict(HEAD_DIM=d, BLOCK_M=128, BLOCK_N=64, CAUSAL=causal, HAS_MASK=mask, EVEN_N=even)
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in const.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 8, "num_stages": 3})
    assert "mma" in kernel.asm["ptx"], "no tensor-core instruction in the PTX"
    print(f"sm_{arch} {dtype} d={d} causal={causal} mask={mask}: compiled")
'''


def test_kernel_compiles_for_gpus_without_a_gpu() -> None:
    """The compiled (non-interpreted) path, checked on any Linux machine: Triton compiles the kernel to
    PTX for sm_90 (H100/H200) and sm_80 (A100) without a GPU. Run in a fresh process: this one interprets."""
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_GPU], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("compiled") == 2, done.stdout
