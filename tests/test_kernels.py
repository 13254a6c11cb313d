"""helpers.model.kernels: the Triton FlashAttention forward agrees with SDPA's math backend.

Without CUDA the kernel runs through Triton's interpreter, which must be chosen before triton is first
imported: this module sets TRITON_INTERPRET=1 at collection time, before any test imports triton.

On a GPU (tests marked `cuda`) every new combination of dtype, head size, causal, mask and full last tile
is a cold Triton compile, and an autotuned launch compiles and times every configuration of each new key
one after another: the compiled cases use fixed tiles (the smallest planned for the GPU) and cover every
pair of their switches' values in 5 forward cases (not all 16), and autotuning has one test of its own,
over the plan at head dim 64. Without a GPU, tests/test_triton_targets.py compiles every planned
configuration for sm_75 to sm_90 ahead of time.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere in this process

from helpers.core import compat  # noqa: E402
from helpers.model.attention import sdpa_attention  # noqa: E402
from helpers.model.kernels import SUPPORTED_HEAD_DIMS, flash_attention, triton_available  # noqa: E402

pytestmark = pytest.mark.skipif(not triton_available(), reason="triton is not installed (Linux only)")

# Tolerances per dtype, against an fp32 math-backend reference of the same inputs:
# fp32 (interpreter, exact fp32 matmuls): 1e-5; fp32 on a GPU uses TF32 matmuls (10-bit mantissa): 1e-2;
# fp16 (P is rounded to fp16 before P·V): 1e-2; bf16 (8-bit mantissa): 3e-2.
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}
NOT_INTERPRETING = "TRITON_INTERPRET is off in this process: these tests run the kernels interpreted"


def _interpreting() -> bool:
    from helpers.core import compat

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
# T=256 (a multiple of the key tile) takes the EVEN_N path; 5 cold compiles of the forward kernel. A GPU
# without bf16 (sm_75) runs the bf16 cases in fp16, the dtype the course runs there.
GPU_CASES = [(torch.float16, False, False, 64, 256), (torch.float16, True, True, 128, 333),
             (torch.bfloat16, False, True, 128, 333), (torch.bfloat16, True, False, 128, 333),
             (torch.bfloat16, True, True, 64, 333)]


def _compiling() -> None:
    if _interpreting():
        pytest.skip("TRITON_INTERPRET=1 is set: kernels are interpreted, not compiled")


def _gpu_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if torch.cuda.get_device_capability() >= (8, 0) else torch.float16


def _gpu_tile(d: int) -> dict:
    """Fixed block sizes, no autotuning: the smallest configuration planned for this GPU and head dim."""
    from helpers.model.kernels import configs

    tile = configs.tile_configs("attn_fwd", tuple(torch.cuda.get_device_capability()), d)[-1]
    return dict(block_m=tile.block_m, block_n=tile.block_n)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype,causal,padded,d,t", GPU_CASES)
def test_gpu_matches_sdpa_math(dtype: torch.dtype, causal: bool, padded: bool, d: int, t: int) -> None:
    _compiling()
    dtype = _gpu_dtype(dtype)
    q, k, v, mask = _inputs(2, 4, t, t, d, seed=d, padded=padded, device="cuda", dtype=dtype)
    _check(q, k, v, mask, causal, TOL[dtype], **_gpu_tile(d))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype,causal", [(torch.float16, True), (torch.bfloat16, False)])
def test_gpu_backward_matches_sdpa_math(dtype: torch.dtype, causal: bool) -> None:
    """d=128, padded, T=333: the forward is one of GPU_CASES' (already compiled); two backward kernels, with
    the configuration planned for this GPU."""
    _compiling()
    dtype = _gpu_dtype(dtype)
    q, k, v, mask = _inputs(2, 4, 333, 333, 128, seed=5, padded=True, device="cuda", dtype=dtype)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    do = torch.randn_like(q)
    out = flash_attention(q, k, v, causal=causal, key_padding_mask=mask, **_gpu_tile(128))
    got = torch.autograd.grad(out, (q, k, v), do)
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = sdpa_attention(qf, kf, vf, causal=causal, key_padding_mask=mask, backend="math")
    want = torch.autograd.grad(ref, (qf, kf, vf), do.float())
    for name, a, b in zip("qkv", got, want):  # gradients sum over N terms: twice the forward's tolerance
        torch.testing.assert_close(a.float(), b, atol=2 * TOL[dtype], rtol=2 * TOL[dtype], msg=f"d{name}")


@pytest.mark.cuda
def test_gpu_autotuned_forward_matches_sdpa_math() -> None:
    """flash_attention without block sizes autotunes over the configurations planned for this GPU at d=64
    (one or two: as many cold compiles and timings for the one new key)."""
    _compiling()
    import importlib

    from helpers.model.kernels import configs

    fa = importlib.import_module("helpers.model.kernels.flash_attention")  # the module, not the function
    dtype = _gpu_dtype(torch.bfloat16)
    q, k, v, mask = _inputs(2, 4, 333, 333, 64, seed=7, padded=True, device="cuda", dtype=dtype)
    _check(q, k, v, mask, False, TOL[dtype])
    planned = configs.tile_configs("attn_fwd", tuple(torch.cuda.get_device_capability()), 64)
    tuner = fa._fwd_kernel(False, planned)
    assert len(tuner.configs) == len(planned) and len(tuner.cache) == 1  # one key, tuned over the plan


@pytest.mark.cuda
def test_gpu_refuses_fp32_and_other_head_dims_saying_why() -> None:
    _compiling()
    q = torch.randn(1, 2, 16, 64, device="cuda")
    with pytest.raises(ValueError, match="fp16 or bf16 inputs"):
        flash_attention(q, q, q)
    q = torch.randn(1, 2, 16, 32, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="head dims"):
        flash_attention(q, q, q)


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


def test_cpu_call_after_compiled_triton_import_says_how_to_fix() -> None:
    """Triton imported before TRITON_INTERPRET was set cannot interpret: a clear error, no deep crash."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import triton, torch\nfrom helpers.model.kernels import flash_attention\n"
            "q = torch.randn(1, 1, 16, 16)\ntry:\n    flash_attention(q, q, q)\n"
            "except RuntimeError as err:\n    print(err)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "TRITON_INTERPRET" in done.stdout and "restart" in done.stdout, done.stdout


def test_kernel_refusal_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """One line per reason the kernel cannot run here; None where it runs (the interpreter on a CPU, a
    planned GPU, dtype and head dim)."""
    import importlib

    from fakegpu import fake_gpu

    fa = importlib.import_module("helpers.model.kernels.flash_attention")
    assert fa.kernel_refusal("cpu", torch.float32, 64) is None
    assert "head dims" in fa.kernel_refusal("cpu", torch.float32, 48)
    assert "no backend for 'mps'" in fa.kernel_refusal("mps", torch.float32, 64)
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # a GPU compiles: the plan decides
    fake_gpu(monkeypatch, "A100-40")
    assert fa.kernel_refusal("cuda", torch.bfloat16, 128) is None
    assert "fp16 or bf16" in fa.kernel_refusal("cuda", torch.float32, 128)
    assert "head dims (64, 128)" in fa.kernel_refusal("cuda", torch.float16, 32)
    fake_gpu(monkeypatch, "T4")
    compiles, why = compat.triton_compiles_for((7, 5))
    if compiles:  # triton 3.4 and newer
        assert fa.kernel_refusal("cuda", torch.float16, 128) is None
    else:  # triton 3.3, the floor: no fp16 tl.dot compiles for sm_75 (test_triton_targets.py shows it)
        assert "triton>=3.4" in why, why
        for dtype in (torch.float16, torch.bfloat16):  # what the installed triton cannot build comes first
            assert fa.kernel_refusal("cuda", dtype, 128) == why
    with monkeypatch.context() as m:  # the reasons after it, as a triton that compiles for sm_75 gives them
        m.setattr(compat, "triton_compiles_for", lambda capability: (True, ""))
        assert fa.kernel_refusal("cuda", torch.float16, 128) is None
        assert "no bf16 units" in fa.kernel_refusal("cuda", torch.bfloat16, 128)
    fake_gpu(monkeypatch, "V100-16")
    assert "sm_75 and newer" in fa.kernel_refusal("cuda", torch.float16, 64)
    monkeypatch.setattr(fa, "triton_available", lambda: False)
    assert "Linux only" in fa.kernel_refusal("cuda", torch.float16, 64)


def test_lesson01_triton_steps_skip_with_a_reason_without_triton(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """On a Mac (no triton package) Run All must not stop at a Triton step: each lesson-01 function that calls
    flash_attention (the check, the backward and the timing) runs here with triton faked missing and a
    flash_attention that fails if called, and says in one line why it skipped. Planted: the same functions
    with their guard removed (kernel_refusal answering None) fail the same harness."""
    import importlib
    from types import SimpleNamespace

    from course.lessons import lesson01

    fa = importlib.import_module("helpers.model.kernels.flash_attention")
    monkeypatch.setattr(fa, "triton_available", lambda: False)

    def must_not_run(*args, **kwargs):
        raise AssertionError("a Triton step called flash_attention without triton")

    monkeypatch.setattr(lesson01, "flash_attention", must_not_run)
    S = SimpleNamespace(DEVICE=torch.device("cpu"), DTYPE=torch.float32, HEAD_DIM=64, TRITON_SEQ=45,
                        SCORE_STD=3.0, REL_TOL=1e-5, MIN_RUN_TIME=0.1)
    q = torch.randn(1, 2, 16, 64)
    steps = {"forward": lambda: lesson01.check_triton_forward(S),
             "backward": lambda: lesson01.check_triton_backward(S),
             "timing": lambda: lesson01.time_triton(q, q, q, q, {}, S)}
    for name, step in steps.items():
        step()
        out = capsys.readouterr().out
        assert out.count("\n") == 1 and "triton package" in out and "Linux only" in out, (name, out)
    assert lesson01.time_triton(q, q, q, q, {}, S) == {}  # nothing measured for the summary
    monkeypatch.setattr(lesson01, "kernel_refusal", lambda *args: None)  # planted: the guard removed
    for name in ("forward", "backward"):
        with pytest.raises(AssertionError, match="without triton"):
            steps[name]()
