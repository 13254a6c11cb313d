"""Lesson 01 (`01_attention`): its set-up (the attention inputs' sizes, fitted so that the naive attention's
(B, H, N, N) score matrices fit the device, and the dtype the device computes in), and the lesson's plumbing:
its test inputs, its checks (`check_...`, one line each in the lesson), the Triton steps that skip with a
reason where the kernel cannot run, its tables, figure and summary."""

from __future__ import annotations

import functools
import inspect
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from IPython.display import display
from matplotlib.figure import Figure

from course.claims import CLAIMS
from course.lessons import LessonSetup
from course.plots import attention_sweep_chart
from course.profile import get_profile, pick
from course.sizing import Size, fit_sizes
from course.verdicts import AtLeast, AtMost, MeasuredTable
from helpers.core.compat import flex_compiles
from helpers.core.device import get_device
from helpers.core.precision import PRECISION_DTYPE, training_precision
from helpers.core.tables import Table
from helpers.core.timing import Timing, benchmark, busy, compare, time_once
from helpers.model.attention import (
    AttentionMaps,
    agreement_tolerance,
    attention_agreement,
    attention_flops,
    expected_sdpa_backends,
    expected_sdpa_default,
    naive_attention,
    probe_sdpa_backends,
    sdpa_attention,
    sdpa_backend_used,
)
from helpers.model.kernels import flash_attention, kernel_refusal, uses_interpreter

__all__ = ["SIZES", "setup", "source_from", "spread_qkv", "check_inputs", "check_agreement",
           "check_catches_swapped_heads", "check_sdpa_matches_naive", "memory_slopes", "sweep_table",
           "sweep_chart", "sdpa_backends", "backends_table", "time_backends", "check_triton_forward",
           "check_triton_backward", "time_triton", "check_masked_weights", "check_flex", "check_maps",
           "summary_table"]

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


def setup(profile: str | None = None, *, score_std: float = 3.0) -> LessonSetup:
    """Lesson 01's sizes and dtype on this device; prints what it chose and why (lesson 01). `score_std`: the
    spread of the test inputs' scores q·k/√d (S.SCORE_STD)."""
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
        MIN_RUN_TIME=pick(fit.profile, smoke=0.1, full=0.5),  # seconds of timed runs per measurement
        # largest relative error per (batch, head) accepted against an fp32 reference: 1e-5 for fp32 on a CPU,
        # 5e-3 for fp16 (and for fp32 on a GPU, whose matmuls may run in TF32), 3e-2 for bf16
        REL_TOL=agreement_tolerance(dtype, device),
        SCORE_STD=score_std)


def source_from(code: Callable[..., Any] | str, marker: str, lines: int | None = None) -> str:
    """The source of a function (or a source text) from the first line containing `marker`, `lines` lines of
    it (None: to the end), for the lesson to print (lesson 01, sections 5 and 6)."""
    text = code if isinstance(code, str) else inspect.getsource(code)
    rows = text.splitlines()
    start = next((i for i, row in enumerate(rows) if marker in row), None)
    if start is None:
        raise ValueError(f"no line of the source contains {marker!r}")
    return "\n".join(rows[start:None if lines is None else start + lines])


# --- sections 1-3: inputs, agreement, the memory sweep ------------------------------------------------------

def spread_qkv(b: int, h: int, n: int, S: LessonSetup, generator: torch.Generator | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q, k, v (b, h, n, S.HEAD_DIM) in S.DTYPE on S.DEVICE whose scores q·k/√d have std S.SCORE_STD
    (a trained model's spread, not near-uniform attention); drawn on the CPU from `generator` if given, else
    from the device's global generator (lesson 01)."""
    where = "cpu" if generator is not None else S.DEVICE
    q, k, v = (torch.randn(b, h, n, S.HEAD_DIM, device=where, generator=generator).to(S.DEVICE)
               for _ in range(3))
    scale = S.SCORE_STD ** 0.5  # q·k/√d of unit-variance entries has std 1: scale q and k by √std each
    return q.mul(scale).to(S.DTYPE), k.mul(scale).to(S.DTYPE), v.to(S.DTYPE)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, S: LessonSetup) -> None:
    """q, k, v have the shape (B, H, N, d) and their scores spread as a trained model's do: AssertionError
    otherwise (lesson 01, section 1)."""
    want = (S.BATCH, S.HEADS, S.SEQ, S.HEAD_DIM)
    assert q.shape == k.shape == v.shape == want, (
        f"q, k, v have shapes {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}; "
        f"want (B, H, N, d) = {want}")
    # (1, 4, N, N): the scores of a sample of heads
    scores = (q[:1, :4].float() @ k[:1, :4].float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    std = scores.std().item()
    top = torch.softmax(scores, -1).amax(-1).mean().item()  # a query's largest weight, on average
    n = q.shape[-2]
    assert 0.5 * S.SCORE_STD < std < 2 * S.SCORE_STD and top > 10 / n, (
        f"inputs are near-uniform: scores of std {std:.2f} (want about {S.SCORE_STD}), a query's largest "
        f"weight {top:.3f} on average (uniform: {1 / n:.4f})")
    print(f"checked: q, k, v are (B, H, N, d) = {want}; scores spread with std {std:.2f}, and a query's "
          f"largest attention weight is {top:.2f} on average (uniform attention: {1 / n:.4f})")


def check_agreement(outputs: Mapping[str, torch.Tensor], reference: torch.Tensor, tol: float) -> float:
    """Each output's largest relative error per (batch, head) against `reference` is below `tol`:
    AssertionError naming the one that is not; -> the largest error (lesson 01)."""
    errors = {name: attention_agreement(out, reference) for name, out in outputs.items()}
    for name, err in errors.items():
        assert err < tol, f"{name}: relative error {err:.1e} against the fp32 reference, above {tol:g}"
    print(f"checked: relative errors against the fp32 reference below {tol:g}: "
          + ", ".join(f"{name} {err:.1e}" for name, err in errors.items()))
    return max(errors.values())


def check_catches_swapped_heads(out: torch.Tensor, reference: torch.Tensor, tol: float) -> float:
    """The agreement check fails on a planted bug, heads 0 and 1 exchanged (as a wrong reshape would):
    AssertionError if it does not; -> the planted error (lesson 01, section 2)."""
    heads = out.shape[1]
    swapped = out[:, [1, 0, *range(2, heads)]]
    err = attention_agreement(swapped, reference)
    assert err > 10 * tol, (f"the agreement check did not catch two swapped heads (error {err:.1e}, "
                            f"tolerance {tol:g})")
    print(f"checked: two heads swapped give a relative error of {err:.2f}, {err / tol:.0f}x the tolerance: "
          "caught")
    return err


def check_sdpa_matches_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tol: float) -> None:
    """SDPA agrees with the naive formula in fp32 on one (batch, head) pair slice of q, k, v (an fp32 copy
    of every score would not fit at long N): AssertionError otherwise (lesson 01, section 3)."""
    one = (q[:1, :2], k[:1, :2], v[:1, :2])
    with torch.no_grad():
        exact = naive_attention(*(t.float() for t in one))
        err = attention_agreement(F.scaled_dot_product_attention(*one), exact)
    n = q.shape[-2]
    assert err < tol, f"N={n}: SDPA and naive differ by {err:.1e} (relative), above {tol:g}"
    print(f"checked at N={n}: SDPA agrees with the naive formula (relative error {err:.1e})")


Sweep = Mapping[str, Mapping[int, tuple[float, int]]]  # implementation -> {N: (median s, peak bytes)}


def _slope(values: Sequence[float], lengths: Sequence[int]) -> float:
    # log-log slope between the shortest and the longest length
    return math.log(values[-1] / values[0]) / math.log(lengths[-1] / lengths[0])


def memory_slopes(sweep: Sweep) -> dict[str, float]:
    """How naive and SDPA memory and time scale over the sweep, for the summary; prints the slopes
    (lesson 01, section 3)."""
    lengths = sorted(sweep["naive"])
    times = {name: [sweep[name][n][0] for n in lengths] for name in ("naive", "SDPA")}
    peaks = {name: [sweep[name][n][1] for n in lengths] for name in ("naive", "SDPA")}
    out = {"memory slope naive": _slope(peaks["naive"], lengths),
           "memory slope sdpa": _slope(peaks["SDPA"], lengths),
           "memory ratio": peaks["naive"][-1] / peaks["SDPA"][-1],
           "time ratio short": times["naive"][0] / times["SDPA"][0],
           "time ratio long": times["naive"][-1] / times["SDPA"][-1]}
    print(f"memory grows as N^{out['memory slope naive']:.2f} (naive) and N^{out['memory slope sdpa']:.2f} "
          "(SDPA)")
    return out


def sweep_table(sweep: Sweep, S: LessonSetup) -> Table:
    """The sweep's times and peak memory per length, next to the size of one score matrix (lesson 01)."""
    table = Table(["N", "naive ms", "SDPA ms", "naive MiB", "SDPA MiB", "score matrix MiB"],
                  title=f"naive attention vs SDPA, B={S.BATCH} H={S.HEADS} d={S.HEAD_DIM} {S.DTYPE} "
                        f"on {S.DEVICE}")
    for n in sorted(sweep["naive"]):
        (t_naive, m_naive), (t_sdpa, m_sdpa) = sweep["naive"][n], sweep["SDPA"][n]
        table.add(n, t_naive * 1e3, t_sdpa * 1e3, m_naive / 2**20, m_sdpa / 2**20,
                  S.BATCH * S.HEADS * n * n * S.DTYPE.itemsize / 2**20)
    return table


def sweep_chart(sweep: Sweep, S: LessonSetup) -> Figure:
    """Time and peak memory against N, log-log, naive and SDPA (lesson 01, section 3)."""
    lengths = sorted(sweep["naive"])
    times = {name: [sweep[name][n][0] for n in lengths] for name in sweep}
    peaks = {name: [sweep[name][n][1] for n in lengths] for name in sweep}
    return attention_sweep_chart(lengths, times, peaks,
                                 title=f"naive vs SDPA on {S.DEVICE} ({S.DTYPE}, d={S.HEAD_DIM})")


# --- section 4: SDPA's backends ---------------------------------------------------------------------------

def sdpa_backends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, S: LessonSetup) -> dict[str, Any]:
    """Which SDPA backends run these inputs here (and torch's reasons where not), what torch's rules predict,
    and the kernel a plain call ran (read from the profiler); prints that kernel (lesson 01, section 4)."""
    with torch.no_grad():
        probe = probe_sdpa_backends(q, k, v)
    expected = expected_sdpa_backends(S.DEVICE, S.DTYPE, S.HEAD_DIM)  # torch's rules for this device, dtype
    found = {"probe": probe, "expected": expected,
             "backends": [name for name, reason in probe.items() if reason is None],
             # cuDNN's rules change with the cuDNN build, so it is reported, not predicted
             "unexpected": [name for name in ("math", "flash", "efficient")
                            if (probe[name] is None) != (expected[name] is None)],
             "kernel": sdpa_backend_used(q, k, v),  # behind every plain SDPA call of the lesson
             "kernel expected": expected_sdpa_default(S.DEVICE, S.DTYPE, S.HEAD_DIM)}
    print(f"a plain SDPA call ran the {found['kernel']!r} kernel here; torch's rules predict "
          f"{' or '.join(map(repr, found['kernel expected']))}")
    return found


def backends_table(found: Mapping[str, Any], S: LessonSetup) -> Table:
    """Each backend: does it run here, what torch's rules predict, and why not (lesson 01, section 4)."""
    table = Table(["backend", "runs here?", "torch's rules predict", "why not (its rule; torch's message)"],
                  title=f"SDPA backends on {S.DEVICE} for {S.DTYPE}, d={S.HEAD_DIM}")
    for name, reason in found["probe"].items():
        rule = found["expected"][name]
        why = "; ".join(filter(None, [rule, reason])) if reason else ""
        table.add(name, reason is None, "runs" if rule is None else "refused", why)
    return table


def time_backends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, reference: torch.Tensor,
                  found: Mapping[str, Any], S: LessonSetup) -> dict[str, Timing]:
    """Each backend that runs here, checked against `reference` (AssertionError if it disagrees), then timed
    (lesson 01, section 4)."""
    timings = {}
    with torch.no_grad():
        for name in found["backends"]:
            err = attention_agreement(sdpa_attention(q, k, v, backend=name), reference)
            assert err < S.REL_TOL, f"SDPA's {name} backend: relative error {err:.1e}, above {S.REL_TOL:g}"
            timings[name] = benchmark(functools.partial(sdpa_attention, q, k, v, backend=name), name=name,
                                      min_run_time=S.MIN_RUN_TIME)
    print(f"checked: every backend that runs here agrees with the fp32 reference ({', '.join(timings)})")
    return timings


# --- section 6: the Triton kernel ---------------------------------------------------------------------------

def _triton_inputs(S: LessonSetup) -> tuple[torch.Tensor, ...]:
    """q, k, v (1, 2, TRITON_SEQ, d) and a padding mask (1, TRITON_SEQ) whose last 7 keys are padding."""
    q, k, v = spread_qkv(1, 2, S.TRITON_SEQ, S, torch.Generator().manual_seed(1))  # the same in both checks
    padding = torch.arange(S.TRITON_SEQ, device=S.DEVICE)[None, :] < S.TRITON_SEQ - 7
    return q, k, v, padding


def _triton_skip(S: LessonSetup, what: str) -> bool:
    """Prints why the Triton kernel does not run here, if it does not: no triton (Linux only), or a GPU or
    dtype it is not planned for."""
    why_not = kernel_refusal(S.DEVICE, S.DTYPE, S.HEAD_DIM)
    if why_not:
        print(f"{what} is skipped here: {why_not}")
    return bool(why_not)


def check_triton_forward(S: LessonSetup) -> None:
    """The Triton kernel against the fp32 math kernel, without masks, causal, with padding and both, at a
    length that is not a multiple of the tile: AssertionError naming the variant that disagrees; or one line
    saying why it is skipped here (lesson 01, section 6)."""
    if _triton_skip(S, "the Triton kernel"):
        return
    q, k, v, padding = _triton_inputs(S)
    if uses_interpreter(S.DEVICE):
        mode = "run by its interpreter on CPU tensors"
    else:
        mode = "compiled for " + torch.cuda.get_device_name()
    errors = {}
    with torch.no_grad():
        for causal, mask in ((False, None), (True, None), (False, padding), (True, padding)):
            got = flash_attention(q, k, v, causal=causal, key_padding_mask=mask)
            want = sdpa_attention(q.float(), k.float(), v.float(), causal=causal, key_padding_mask=mask,
                                  backend="math")
            name = f"causal={causal}, padding={mask is not None}"
            errors[name] = attention_agreement(got, want)
            assert errors[name] < S.REL_TOL, f"Triton, {name}: relative error {errors[name]:.1e}"
    print(f"checked: the Triton kernel, {mode}, agrees with the fp32 math kernel at N={S.TRITON_SEQ}: "
          + "; ".join(f"{name} {err:.1e}" for name, err in errors.items()))


def check_triton_backward(S: LessonSetup) -> None:
    """The Triton kernel's gradients (causal, with padding) against autograd through the fp32 math kernel:
    AssertionError naming dQ, dK or dV; or one line saying why it is skipped here (lesson 01, section 6)."""
    if _triton_skip(S, "the Triton kernel's backward"):
        return
    q, k, v, padding = _triton_inputs(S)
    gq, gk, gv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    grad_out = torch.randn_like(q)
    out = flash_attention(gq, gk, gv, causal=True, key_padding_mask=padding)
    ours = torch.autograd.grad(out, (gq, gk, gv), grad_out)
    fq, fk, fv = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = sdpa_attention(fq, fk, fv, causal=True, key_padding_mask=padding, backend="math")
    theirs = torch.autograd.grad(ref, (fq, fk, fv), grad_out.float())
    errors = {}
    for name, a, b in zip(("dQ", "dK", "dV"), ours, theirs):
        errors[name] = attention_agreement(a, b)
        # sums of N terms: twice the forward's tolerance
        assert errors[name] < 2 * S.REL_TOL, f"Triton backward, {name}: relative error {errors[name]:.1e}"
    print("checked: Triton's gradients agree with autograd through the math kernel: "
          + ", ".join(f"{name} {err:.1e}" for name, err in errors.items()))


def time_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, reference: torch.Tensor,
                timings: Mapping[str, Timing], S: LessonSetup) -> dict[str, float]:
    """On a CUDA GPU: the Triton kernel checked, then timed against the fastest SDPA backend of `timings`;
    -> its numbers for the summary. Elsewhere one line saying why it is not timed, and {} (lesson 01)."""
    why_not = kernel_refusal(S.DEVICE, S.DTYPE, S.HEAD_DIM)
    if S.DEVICE.type != "cuda" or uses_interpreter(S.DEVICE) or why_not:
        print("the Triton kernel is not timed here: "
              + (why_not or "it needs a CUDA GPU (the interpreter's speed means nothing)"))
        return {}
    with torch.no_grad():
        err = attention_agreement(flash_attention(q, k, v), reference)
        assert err < S.REL_TOL, f"the Triton kernel disagrees with the reference: relative error {err:.1e}"
        _, tune_s = time_once(lambda: flash_attention(q, k, v))  # first call: compile and autotune
        best = min(timings.values(), key=lambda t: t.median_s)
        tri = benchmark(lambda: flash_attention(q, k, v), name="triton", min_run_time=S.MIN_RUN_TIME)
    flops = attention_flops(*q.shape[:3], k.shape[2], q.shape[3])
    print(f"Triton's first call (compiling and autotuning the kernel at this shape): {tune_s:.1f} s")
    print(f"Triton {tri.median_ms:.3f} ms ({flops / tri.median_s / 1e12:.0f} TFLOP/s) vs best SDPA backend "
          f"{best.name} {best.median_ms:.3f} ms ({flops / best.median_s / 1e12:.0f} TFLOP/s): "
          f"{tri.median_s / best.median_s:.2f}x its time")
    return {"triton first call s": tune_s, "triton vs best sdpa": tri.median_s / best.median_s,
            "triton tflops": flops / tri.median_s / 1e12}


# --- sections 7-9: masks, FlexAttention, attention maps ---------------------------------------------------

def check_masked_weights(weights: torch.Tensor, real: torch.Tensor) -> None:
    """Causal and padding masks applied: no query weighs a future key or a padded one, and each row sums to 1.
    weights (N, N), real (N,) bool, True for a real token: AssertionError otherwise (lesson 01, section 7)."""
    assert torch.all(weights.triu(1) == 0), "a query attended to a future key"
    assert torch.all(weights[:, ~real] == 0), "a query attended to padding"
    torch.testing.assert_close(weights.sum(-1), torch.ones(len(weights)),
                               msg=lambda m: f"a row of weights does not sum to 1: {m}")
    print(f"checked: no query weighs a future key or one of the {int((~real).sum())} padded ones; "
          "each row sums to 1")


def check_flex(flex: Callable[..., torch.Tensor], qkv: Sequence[torch.Tensor], block_mask: Any,
               flex_out: torch.Tensor, S: LessonSetup) -> float:
    """FlexAttention's output against SDPA with the same sliding window as a dense (N, N) mask, built here
    from S.WINDOW (AssertionError if they differ); then both timed -> SDPA's time / FlexAttention's
    (lesson 01, section 8)."""
    compiled, why = flex_compiles(S.DEVICE)  # torch 2.7 cannot compile it for a CPU: then it runs uncompiled
    if not compiled:
        print(f"FlexAttention: {why}")
    fq, fk, fv = qkv
    n = fq.shape[-2]
    idx = torch.arange(n, device=S.DEVICE)
    allowed = (idx[None, :] <= idx[:, None]) & (idx[:, None] - idx[None, :] <= S.WINDOW)  # (N, N) dense mask
    with torch.no_grad():
        dense = F.scaled_dot_product_attention(fq.float(), fk.float(), fv.float(), attn_mask=allowed)
        err = attention_agreement(flex_out, dense)
        assert err < S.REL_TOL, f"FlexAttention differs from SDPA with the dense mask by {err:.1e}"
        flex_t = benchmark(lambda: flex(fq, fk, fv, block_mask=block_mask), name="flex (compiled)",
                           min_run_time=S.MIN_RUN_TIME)
        sdpa_t = benchmark(lambda: F.scaled_dot_product_attention(fq, fk, fv, attn_mask=allowed),
                           name="SDPA + dense mask", min_run_time=S.MIN_RUN_TIME)
    print(f"checked: FlexAttention agrees with SDPA and a dense mask (relative error {err:.1e}); "
          f"then {flex_t.median_ms:.3f} ms per call")
    display(compare([sdpa_t, flex_t], title=f"sliding window {S.WINDOW}, N={n}"))
    return sdpa_t.median_s / flex_t.median_s


def check_maps(all_maps: Sequence[AttentionMaps], model: Any, tokenizer: Any, texts: Sequence[str]) -> None:
    """One set of maps per text, cut to that text's own tokens (no [PAD]), shaped (layers, heads, tokens,
    tokens), rows summing to 1: AssertionError otherwise (lesson 01, section 9)."""
    assert len(all_maps) == len(texts), f"{len(all_maps)} sets of maps for {len(texts)} texts"
    for maps, text in zip(all_maps, texts):
        n = len(tokenizer(text)["input_ids"])
        assert "[PAD]" not in maps.tokens and len(maps.tokens) == n, (
            f"maps of {text[:30]!r}... hold {len(maps.tokens)} tokens, want its own {n} (no [PAD])")
        want = (model.config.num_hidden_layers, model.config.num_attention_heads, n, n)
        assert tuple(maps.maps.shape) == want, f"maps {tuple(maps.maps.shape)}, want {want}"
        torch.testing.assert_close(maps.maps.sum(-1), torch.ones(maps.maps.shape[:-1]), atol=1e-4, rtol=0,
                                   msg=lambda m: f"a row of attention weights does not sum to 1: {m}")
    print(f"checked: {len(texts)} sets of maps, each (layers, heads, tokens, tokens) over its own tokens; "
          "rows sum to 1")


def summary_table(measured: Mapping[str, Any], S: LessonSetup) -> MeasuredTable:
    """This run's numbers next to claim C6, with verdicts; the sweep's times get none where other programs
    took the CPUs while it ran (`measured["sweep load"]`, helpers.core.timing.busy's rule): "too busy to
    judge"
    (lesson 01, "What we measured")."""
    backends = measured["backends"]
    sweep = S.SWEEP
    state = busy(load=measured.get("sweep load"))  # the sweep's CpuLoad (helpers.core.timing.LoadProbe)
    summary = MeasuredTable(f"Lesson 01 on {S.DEVICE} ({S.DTYPE})")
    summary.add(f"naive peak memory grows as N^x, N={sweep[0]}..{sweep[-1]}", measured["memory slope naive"],
                "N² (x ≈ 2): the reference", rule=AtLeast(1.6))
    summary.add("SDPA peak memory grows as N^x", measured["memory slope sdpa"],
                CLAIMS["flash-memory"])
    summary.add(f"naive / SDPA peak memory at N={sweep[-1]} (SDPA: its {backends['kernel']} kernel here)",
                measured["memory ratio"], "> 1: lower memory", rule=AtLeast(1.0))
    summary.add("naive / tiled (PyTorch) peak memory", measured["tiled vs naive memory"], "> 1: lower memory",
                rule=AtLeast(1.0))
    summary.add(f"naive / SDPA time at N={sweep[0]}", measured["time ratio short"])
    summary.add(f"naive / SDPA time at N={sweep[-1]}", measured["time ratio long"],
                CLAIMS["flash-latency"], busy=state)
    summary.add("the latency advantage, longest N / shortest N",
                measured["time ratio long"] / measured["time ratio short"], "> 1: most on long sequences",
                rule=AtLeast(1.0), busy=state)
    summary.add(f"largest relative error vs fp32 reference ({S.DTYPE})", measured["largest relative error"],
                f"< {S.REL_TOL:g} (the check)", rule=AtMost(S.REL_TOL))
    summary.add("relative error with two heads swapped (planted bug)", measured["swapped heads error"],
                f"> {S.REL_TOL:g}: caught", rule=AtLeast(S.REL_TOL))
    unexpected = backends["unexpected"]
    summary.add("SDPA backends that run here", ", ".join(backends["backends"]),
                "math, flash, memory-efficient as torch's rules predict (section 4)",
                verdict="does not hold" if unexpected else "holds",
                why=", ".join(f"{name} differs" for name in unexpected))
    summary.add("SDPA's kernel for a plain call", backends["kernel"],
                f"{' or '.join(backends['kernel expected'])} on {S.DEVICE}, by torch's rules (section 4)",
                verdict="holds" if backends["kernel"] in backends["kernel expected"] else "does not hold")
    summary.add("FlexAttention first call (compile), s", measured.get("flex compile s"))
    summary.add("Triton: first call (compile + autotune), s", measured.get("triton first call s"))
    summary.add("Triton time / best SDPA backend", measured.get("triton vs best sdpa"),
                "≤ 1.3 (the course's target)", rule=AtMost(1.3), needs="a CUDA GPU (section 6)")
    if "triton tflops" in measured:
        summary.add("Triton TFLOP/s", measured["triton tflops"])
    return summary
