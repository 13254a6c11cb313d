"""helpers.kernels: the Triton FlashAttention forward agrees with SDPA's math backend.

Without CUDA the kernel runs through Triton's interpreter, which must be chosen before triton is first
imported: this module sets TRITON_INTERPRET=1 at collection time, before any test imports triton.

On a GPU (tests marked `cuda`) every new combination of dtype, head size, causal, mask and full last tile
is a cold Triton compile, and an autotuned launch compiles and times every configuration of each new key
one after another: the compiled cases use fixed 64×64 tiles and cover every pair of their switches' values
in 5 forward cases (not all 16), and autotuning has one test of its own, over two configurations.
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
NOT_INTERPRETING = "TRITON_INTERPRET is off in this process: these tests run the kernels interpreted"


def _interpreting() -> bool:
    from helpers import compat

    return compat.triton_interpret_enabled()


def _inputs(b, h, tq, tk, d, seed, padded, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, t, d, generator=g) for t in (tq, tk, tk))
    mask = None
    if padded:  # a random-length prefix of real keys per sequence (at least one)
        lengths = torch.randint(1, tk + 1, (b,), generator=g)
        mask = (torch.arange(tk)[None, :] < lengths[:, None]).to(device)
    return (*(x.to(device=device, dtype=dtype) for x in (q, k, v)), mask)


def _check(q, k, v, mask, causal, tol, **kw) -> None:
    ref = sdpa_attention(q.float(), k.float(), v.float(), causal=causal, key_padding_mask=mask,
                         backend="math")
    with torch.no_grad():
        out = flash_attention(q, k, v, causal=causal, key_padding_mask=mask, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("d,tq,tk", [(64, 37, 37), (16, 21, 45), (128, 19, 19)])  # not multiples of 16
def test_interpreter_matches_sdpa_math(causal: bool, padded: bool, d: int, tq: int, tk: int) -> None:
    if not _interpreting():
        pytest.skip(NOT_INTERPRETING)
    q, k, v, mask = _inputs(1, 2, tq, tk, d, seed=d + tq + 3 * causal + padded, padded=padded)
    _check(q, k, v, mask, causal, TOL[torch.float32])


@pytest.mark.parametrize("causal,padded,tq,tk", [(False, False, 37, 37), (True, False, 37, 37),
                                                 (False, True, 21, 45), (True, True, 29, 40)])
def test_interpreter_backward_matches_sdpa_math(causal: bool, padded: bool, tq: int, tk: int) -> None:
    """Gradients of q, k, v through the two backward kernels against autograd through the math backend."""
    if not _interpreting():
        pytest.skip(NOT_INTERPRETING)
    q, k, v, mask = _inputs(2, 2, tq, tk, 32, seed=tq + tk + causal, padded=padded)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad(flash_attention(q, k, v, causal=causal, key_padding_mask=mask), (q, k, v), do)
    ref = sdpa_attention(q, k, v, causal=causal, key_padding_mask=mask, backend="math")
    want = torch.autograd.grad(ref, (q, k, v), do)
    for name, a, b in zip("qkv", got, want):
        torch.testing.assert_close(a, b, atol=TOL[torch.float32], rtol=TOL[torch.float32], msg=f"d{name}")


def test_interpreter_block_sizes_do_not_change_the_result() -> None:
    if not _interpreting():
        pytest.skip(NOT_INTERPRETING)
    q, k, v, _ = _inputs(1, 1, 40, 40, 32, seed=11, padded=False)
    _check(q, k, v, None, True, TOL[torch.float32], block_m=32, block_n=16)


# (dtype, causal, padded, head size, T): any two switches take each pair of their values in some case, and
# T=256 (a multiple of the 64-key tile) takes the EVEN_N path; 5 cold compiles of the forward kernel
GPU_CASES = [(torch.float16, False, False, 64, 256), (torch.float16, True, True, 128, 333),
             (torch.bfloat16, False, True, 128, 333), (torch.bfloat16, True, False, 128, 333),
             (torch.bfloat16, True, True, 64, 333)]
GPU_TILE = 64  # fixed block sizes: no autotuning in these tests


def _compiling() -> None:
    if _interpreting():
        pytest.skip("TRITON_INTERPRET=1 is set: kernels are interpreted, not compiled")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype,causal,padded,d,t", GPU_CASES)
def test_gpu_matches_sdpa_math(dtype: torch.dtype, causal: bool, padded: bool, d: int, t: int) -> None:
    _compiling()
    q, k, v, mask = _inputs(2, 4, t, t, d, seed=d, padded=padded, device="cuda", dtype=dtype)
    _check(q, k, v, mask, causal, TOL[dtype], block_m=GPU_TILE, block_n=GPU_TILE)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype,causal", [(torch.float16, True), (torch.bfloat16, False)])
def test_gpu_backward_matches_sdpa_math(dtype: torch.dtype, causal: bool) -> None:
    """d=128, padded, T=333: the forward is one of GPU_CASES' (already compiled); two backward kernels."""
    _compiling()
    q, k, v, mask = _inputs(2, 4, 333, 333, 128, seed=5, padded=True, device="cuda", dtype=dtype)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    do = torch.randn_like(q)
    out = flash_attention(q, k, v, causal=causal, key_padding_mask=mask, block_m=GPU_TILE, block_n=GPU_TILE)
    got = torch.autograd.grad(out, (q, k, v), do)
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = sdpa_attention(qf, kf, vf, causal=causal, key_padding_mask=mask, backend="math")
    want = torch.autograd.grad(ref, (qf, kf, vf), do.float())
    for name, a, b in zip("qkv", got, want):  # gradients sum over N terms: twice the forward's tolerance
        torch.testing.assert_close(a.float(), b, atol=2 * TOL[dtype], rtol=2 * TOL[dtype], msg=f"d{name}")


@pytest.mark.cuda
def test_gpu_autotuned_forward_matches_sdpa_math(monkeypatch) -> None:
    """flash_attention without block sizes autotunes: here over two of GPU_CONFIGS (two cold compiles and
    two timings for the one new key), so the autotuned path is checked without tuning over all of them."""
    _compiling()
    import importlib

    from helpers.kernels import _triton_fwd

    fa = importlib.import_module("helpers.kernels.flash_attention")  # the module, not the function

    two = [c for c in _triton_fwd.GPU_CONFIGS if c.kwargs["BLOCK_N"] == 64][:2]
    monkeypatch.setattr(_triton_fwd, "GPU_CONFIGS", two)
    fa._kernel.cache_clear()  # build the autotuned kernel again, over `two`
    try:
        q, k, v, mask = _inputs(2, 4, 333, 333, 64, seed=7, padded=True, device="cuda", dtype=torch.bfloat16)
        _check(q, k, v, mask, False, TOL[torch.bfloat16])
        tuner = fa._kernel(False, True)
        assert len(tuner.configs) == 2 and len(tuner.cache) == 1  # one key, tuned over the two
    finally:
        fa._kernel.cache_clear()  # later calls get the full configuration list again


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


def test_supported_head_dims_include_the_usual_ones() -> None:
    assert {64, 128} <= set(SUPPORTED_HEAD_DIMS)


_COMPILE_FOR_GPU = r'''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from helpers.kernels import _triton_bwd, _triton_fwd

CONSTEXPR = ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL", "HAS_MASK", "EVEN_N")
FP32 = ("L", "D", "sm_scale")  # the row statistics and the scale
for raw, extra in [(_triton_fwd.attn_fwd, {"EVEN_N": False}), (_triton_bwd.attn_bwd_dkdv, {}),
                   (_triton_bwd.attn_bwd_dq, {})]:
    fn = triton.jit(raw)
    names = fn.arg_names
    for arch, dtype, d, causal, mask in [(90, "bf16", 128, True, True), (80, "fp16", 64, False, False)]:
        sig = {n: ("*i8" if n == "Mask" else "fp32" if n == "sm_scale" else "*fp32" if n in FP32
                   else "constexpr" if n in CONSTEXPR else "i32" if n in ("H", "TQ", "TK", "CAUSAL_OFFSET")
                   or n.startswith("stride") else "*" + dtype) for n in names}
        const = dict(HEAD_DIM=d, BLOCK_M=64, BLOCK_N=64, CAUSAL=causal, HAS_MASK=mask, **extra)
        src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in const.items()})
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                options={"num_warps": 4, "num_stages": 2})
        assert "mma" in kernel.asm["ptx"], "no tensor-core instruction in the PTX"
        print(f"{raw.__name__} sm_{arch} {dtype} d={d} causal={causal} mask={mask}: compiled")
'''


def test_kernel_compiles_for_gpus_without_a_gpu() -> None:
    """The compiled (non-interpreted) path, checked on any Linux machine: Triton compiles the forward and
    both backward kernels to PTX for sm_90 (H100/H200) and sm_80 (A100) without a GPU. Run in a fresh
    process: this one interprets."""
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    done = subprocess.run([sys.executable, "-c", _COMPILE_FOR_GPU], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("compiled") == 6, done.stdout


def test_cpu_call_after_compiled_triton_import_says_how_to_fix() -> None:
    """Triton imported before TRITON_INTERPRET was set cannot interpret: a clear error, no deep crash."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import triton, torch\nfrom helpers.kernels import flash_attention\n"
            "q = torch.randn(1, 1, 16, 16)\ntry:\n    flash_attention(q, q, q)\n"
            "except RuntimeError as err:\n    print(err)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "TRITON_INTERPRET" in done.stdout and "restart" in done.stdout, done.stdout
