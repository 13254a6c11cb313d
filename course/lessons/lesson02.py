"""Lesson 02 (`02_mixed_precision`): its set-up (what this device runs: precisions, autocast modes, the wide
model's mixed precision; the sizes of the small and the wide model, fitted to its memory), and the lesson's
plumbing: its checks (`check_...`, one line each in the lesson), tables and the summary."""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure

from course.claims import CLAIMS
from course.lessons import LessonSetup
from course.plots import bar_chart, loss_curves_chart
from course.profile import get_profile, pick, small_config
from course.sizing import Size, fit_sizes
from course.verdicts import MeasuredTable
from helpers.core.device import device_report, get_device
from helpers.core.precision import AUTOCAST_DTYPES, PRECISIONS, precision_runs
from helpers.core.tables import Table
from helpers.core.timing import LoadProbe, benchmark_interleaved, busy
from helpers.measure.flops import mfu
from helpers.measure.memory import estimate_training_memory
from helpers.measure.roofline import PeakFlops, measure_roofline, mfu_peak, peak_flops
from helpers.model.models import SmallTransformer, TransformerConfig
from helpers.train.meter import TrainResult
from helpers.train.runspec import RunSpec

__all__ = ["SIZES", "setup", "wide_config", "format_table", "check_format_facts", "op_inputs",
           "autocast_group", "autocast_table", "EXPECTED_GROUPS", "check_autocast_groups", "median_step_s",
           "check_runs_learn", "peak_for_mfu", "speed_table", "check_flops_per_token", "loss_chart",
           "step_time_chart", "scale_chart", "overflowing_scale", "ScalerStep", "scaler_table",
           "check_skipped_steps", "check_scaler_resumed", "check_matmul_close", "matmul_size_table",
           "GPU_SCRIPT", "summary_table"]

SIZES = {"BATCH": Size(full=32, smoke=8, floor=4),  # sequences per step
         "SEQ": Size(full=512, smoke=64, floor=128),  # tokens per sequence
         "WIDE_D_MODEL": Size(full=4096, smoke=512, floor=1024),  # the wide model's width (docs/claims.md#c3)
         "WIDE_BATCH": Size(full=32, smoke=8, floor=2)}  # its sequences per step
# the wide model keeps its width before its batch; the small model keeps its batch before its length
SHRINK = ["WIDE_BATCH", "WIDE_D_MODEL", "BATCH", "SEQ"]


def wide_config(profile: str, vocab: int, width: int, seq: int, layers: int) -> TransformerConfig:
    """The GPU-only cell's wide model: `layers` blocks of `width`, heads of 128 (lesson 02)."""
    return small_config(profile, vocab_size=vocab, max_len=seq, d_model=width, n_heads=width // 128,
                        n_layers=layers)


@functools.cache
def _shape(profile: str, vocab: int, seq: int, width: int | None, layers: int) -> SmallTransformer:
    """A model's shapes on the meta device, for the estimates: nothing is allocated."""
    with torch.device("meta"):
        return SmallTransformer(small_config(profile, vocab_size=vocab, max_len=seq) if width is None
                                else wide_config(profile, vocab, width, seq, layers))


def _step_peak(model: SmallTransformer, batch: int, seq: int, precisions: list[str]) -> int:
    """The largest estimated peak of one AdamW step over the precisions, bytes."""
    return max(estimate_training_memory(model, batch, seq, precision=p).peak for p in precisions)


def setup(profile: str | None = None, *, wide_layers: int = 4) -> LessonSetup:
    """Lesson 02's choices and sizes on this device; prints what it chose and why (lesson 02)."""
    profile = get_profile(profile)
    device = get_device()  # cuda if there is one, else cpu
    # what this device runs, from its compute capability: the precisions of the comparison, the 16-bit
    # autocast modes, and the wide model's mixed precision (bf16 with bf16 tensor cores, else fp16)
    runs = [p for p in PRECISIONS if precision_runs(p, device)]
    autocast_modes = [p for p in ("fp16", "bf16") if p in runs]
    amp = next((p for p in ("bf16", "fp16") if p in runs), None) if device.type == "cuda" else None
    vocab = pick(profile, smoke=512, full=8192)  # vocabulary of the synthetic task
    matmul_n = pick(profile, smoke=512, full=8192)  # the square matmul
    seq_full = SIZES["SEQ"].full
    estimates = {  # AdamW, as helpers.train.loop runs it; every precision the step trains in
        "the small model's step": lambda s: _step_peak(
            _shape(profile, vocab, seq_full, None, wide_layers), s["BATCH"], s["SEQ"], runs),
        # section 5's a, b, product, fp32 reference and 16-bit copies; section 6's pair of sizes (a, b and the
        # product of n x n and (n + 1) x (n + 1), in 16 bits) beside them
        "the matmuls": lambda s: 6 * 4 * matmul_n ** 2 + 2 * 3 * 2 * (matmul_n + 1) ** 2,
    }
    if amp:  # the wide model runs only on a GPU with tensor cores
        estimates["the wide model's step"] = lambda s: _step_peak(
            _shape(profile, vocab, seq_full, s["WIDE_D_MODEL"], wide_layers), s["WIDE_BATCH"], s["SEQ"],
            ["fp32", amp])
    notes = [f"autocast modes: {', '.join(autocast_modes) or 'none'}",
             f"wide model: fp32 vs {amp}" if amp else "wide model: skipped (no GPU)"]
    fit = fit_sizes(SIZES, estimates, shrink=SHRINK, profile=profile, device=device, notes=notes)
    print(fit.line())
    return LessonSetup(
        PROFILE=fit.profile, DEVICE=device, FIT=fit, RUNS=runs, AUTOCAST_MODES=autocast_modes, AMP=amp,
        VOCAB=vocab, MATMUL_N=matmul_n, **fit.sizes,
        STEPS=pick(fit.profile, smoke=16, full=200),  # optimizer steps per precision
        LR=pick(fit.profile, smoke=3e-3, full=1e-3),  # AdamW learning rate
        LOAD=LoadProbe(children=True).start())  # what other programs take of the CPUs from here on: summary


# --- section 1: the formats ---------------------------------------------------------------------------------

def format_table() -> Table:
    """What fp32, fp16, bf16 and TF32 can hold, from torch.finfo (lesson 02, section 1)."""
    t = Table(["format", "sign/exponent/mantissa bits", "largest", "smallest normal", "eps (gap after 1.0)"],
              title="Floating-point formats (from torch.finfo)")
    for name, dtype, bits in [("fp32", torch.float32, "1/8/23"), ("fp16", torch.float16, "1/5/10"),
                              ("bf16", torch.bfloat16, "1/8/7")]:
        fi = torch.finfo(dtype)
        t.add(name, bits, fi.max, fi.tiny, fi.eps)
    fi32 = torch.finfo(torch.float32)  # TF32 keeps fp32's range; its matmul inputs keep 10 mantissa bits
    t.add("tf32 (matmul inputs on tensor cores)", "1/8/10", fi32.max, fi32.tiny, 2.0 ** -10)
    return t


def check_format_facts(fp16: torch.dtype = torch.float16, bf16: torch.dtype = torch.bfloat16) -> None:
    """The three facts that shape mixed-precision training, checked on real tensors; AssertionError naming
    the one that failed (lesson 02, section 1)."""
    tiny_grad, big_activation = torch.tensor(1e-8), torch.tensor(70_000.0)
    assert tiny_grad.to(fp16) == 0, f"{fp16}: a gradient of 1e-8 should underflow to zero"
    assert (tiny_grad * 2 ** 16).to(fp16) > 0, f"{fp16}: 1e-8 scaled by 2**16 should survive"
    assert tiny_grad.to(bf16) > 0, f"{bf16}: 1e-8 should survive (float32's range)"
    assert torch.isinf(big_activation.to(fp16)), f"{fp16}: 70,000 should overflow to inf"
    assert torch.isfinite(big_activation.to(bf16)), f"{bf16}: 70,000 should stay finite"
    assert torch.tensor(1 + 2 ** -8).to(bf16) == 1, f"{bf16}: 1 + 1/256 should round back to 1"
    print("checked: fp16 underflows and overflows where bf16 does not; bf16 rounds where fp16 does not")


# --- section 2: what autocast does -------------------------------------------------------------------------

def op_inputs(dtype: torch.dtype, device: torch.device | str) -> dict[str, torch.Tensor]:
    """The same values every time, stored in `dtype`: x (16, 64), w (64, 64), q (1, 2, 16, 32), and int64
    labels (16,) (lesson 02, section 2)."""
    g = torch.Generator().manual_seed(0)
    t = {"x": torch.randn(16, 64, generator=g), "w": torch.randn(64, 64, generator=g),
         "q": torch.randn(1, 2, 16, 32, generator=g)}
    t = {k: v.to(device, dtype) for k, v in t.items()}
    t["labels"] = torch.randint(64, (16,), generator=g).to(device)
    return t


def autocast_group(from_fp32: torch.dtype, from_16bit: torch.dtype, low: torch.dtype) -> str:
    """Which of autocast's groups an op is in, from its output dtype for float32 and for 16-bit inputs
    (lesson 02, section 2)."""
    if from_fp32 == low and from_16bit == low:
        return "16-bit list"
    if from_fp32 == torch.float32 and from_16bit == torch.float32:
        return "float32 list"
    if from_fp32 == torch.float32 and from_16bit == low:
        return "follows its input"
    return f"other ({from_fp32} / {from_16bit})"


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def autocast_table(ops: Mapping[str, Callable[[dict], torch.Tensor]], modes: Sequence[str],
                   device: torch.device | str) -> tuple[Table, dict[tuple[str, str], str]]:
    """Each op run under autocast twice per mode, on float32 and on 16-bit inputs: (the table of output
    dtypes and groups, {(op, mode): group}) (lesson 02, section 2)."""
    device = torch.device(device)
    columns = ["op", "no autocast"]
    for p in modes:
        columns += [f"{p}: fp32 in", f"{p}: {p} in", f"{p}: group"]
    table = Table(columns, title=f"Output dtype of each op under autocast on {device.type}, by input dtype")
    groups: dict[tuple[str, str], str] = {}
    for name, fn in ops.items():
        row = [_short(fn(op_inputs(torch.float32, device)).dtype)]
        for p in modes:
            low = AUTOCAST_DTYPES[p]
            with RunSpec(precision=p).autocast(device):  # torch.autocast(device.type, dtype=low)
                from_fp32 = fn(op_inputs(torch.float32, device)).dtype
                from_16bit = fn(op_inputs(low, device)).dtype
            groups[name, p] = autocast_group(from_fp32, from_16bit, low)
            row += [_short(from_fp32), _short(from_16bit), groups[name, p]]
        table.add(name, *row)
    return table, groups


# the ops whose group is the same on every device PyTorch documents: the check's expectations
EXPECTED_GROUPS = {"F.linear": "16-bit list", "F.cross_entropy": "float32 list",
                   "x + x (elementwise)": "follows its input"}


def check_autocast_groups(groups: Mapping[tuple[str, str], str], modes: Sequence[str]) -> None:
    """Matmuls lowered, losses kept in float32, elementwise ops following their input, in every mode; then
    one line per mode naming the float32-list ops and the followers (lesson 02, section 2)."""
    for p in modes:
        for op, want in EXPECTED_GROUPS.items():
            got = groups.get((op, p))
            assert got == want, f"{op} under {p} autocast: expected the {want}, measured {got!r}"
        ops = sorted({op for op, mode in groups if mode == p})
        kept = [n for n in ops if groups[n, p] == "float32 list"]
        followed = [n for n in ops if groups[n, p] == "follows its input"]
        print(f"checked ({p}): matmuls lowered, the loss kept in float32, x + x follows; float32 list: "
              f"{', '.join(kept)}; follows its input: {', '.join(followed)}")


# --- section 3: four precisions ----------------------------------------------------------------------------

def median_step_s(r: TrainResult) -> float:
    """A run's median step time, its first step left out (warm-up; profiled on a CPU) (lesson 02)."""
    if len(r.step_times_s) < 2:
        raise ValueError(f"a run of {len(r.step_times_s)} timed steps has none after the warm-up: "
                         "run 2 or more")
    return statistics.median(r.step_times_s[1:])


def check_runs_learn(results: Mapping[str, TrainResult], *, start_rtol: float = 0.02,
                     drop: float = 0.9) -> None:
    """Correct before fast: every precision starts within `start_rtol` of fp32's first loss, and its last
    losses fall below `drop` x its start (lesson 02, section 3)."""
    if "fp32" not in results:
        raise ValueError(f"the runs need an fp32 baseline, got {sorted(results)}")
    start = results["fp32"].losses[0]
    for p, r in results.items():
        assert abs(r.losses[0] - start) <= start_rtol * start, \
            f"{p} starts at loss {r.losses[0]:.4f}, fp32 at {start:.4f}: more than {start_rtol:.0%} apart"
        assert min(r.losses[-3:]) < drop * r.losses[0], f"{p} did not learn: {r.losses}"
    print("checked: every precision starts where fp32 starts and learns: "
          + ", ".join(f"{p} {r.losses[0]:.3f} -> {r.losses[-1]:.3f}" for p, r in results.items()))


def peak_for_mfu(device: torch.device, *, matmul_n: int) -> PeakFlops | None:
    """The one peak every precision's MFU divides by: the device's fastest dense rate among fp32, fp16 and
    bf16 (`mfu_peak`), a known GPU's datasheet figure, else measured now under the runs' conditions; prints
    which (lesson 02, section 3)."""
    roofline = None
    if peak_flops(device, "fp32") is None:  # not a GPU of the datasheet table: measure this device's matmul
        # peak under the same conditions as the runs (a roofline saved earlier may come from another load)
        roofline = measure_roofline(device, precisions=["fp32", "bf16", "fp16"], matmul_size=matmul_n,
                                    min_run_time=0.3)
    peak = mfu_peak(device, roofline=roofline)
    print(f"MFU against the {peak.precision} peak, {peak.flops / 1e12:.3g} TFLOP/s ({peak.source})" if peak
          else "MFU: no peak known for this device")
    return peak


def speed_table(results: Mapping[str, TrainResult], device: torch.device, peak: PeakFlops | None) -> Table:
    """Step time, tokens/s, memory, final loss and MFU (against `peak`) of each precision against fp32's, and
    a line on how memory was measured (lesson 02, section 3)."""
    base = results["fp32"]
    steps = len(base.losses)
    t = Table(["precision", "median step [ms]", "tokens/s", "speed-up vs fp32", "peak memory [MiB]",
               "memory vs fp32", "final loss", "MFU"],
              title=f"{steps} steps of each precision on {device.type}")
    for p, r in results.items():
        u = mfu(r.tokens_per_s, r.flops_per_token, peak) if peak and r.flops_per_token else None
        t.add(p, median_step_s(r) * 1e3, r.tokens_per_s, median_step_s(base) / median_step_s(r),
              r.peak_memory_bytes / 2 ** 20, r.peak_memory_bytes / base.peak_memory_bytes, r.losses[-1],
              f"{u:.1%}" if u is not None else "–")
    print(f"memory measured with: {base.memory_method}")
    return t


def check_flops_per_token(by_hand: float, run: TrainResult) -> None:
    """The MFU formula written out in the lesson gives the FLOPs per token the training loop counted
    (`helpers.measure.flops.model_flops_per_token`); AssertionError otherwise (lesson 02, section 3)."""
    assert run.flops_per_token is not None, "the run counted no FLOPs per token"
    assert abs(by_hand - run.flops_per_token) <= 1e-9 * run.flops_per_token, (
        f"6·N + 12·L·H·Q·T by hand gives {by_hand:,.0f} FLOPs per token, the training loop counted "
        f"{run.flops_per_token:,.0f}: does N count every nn.Linear's weight and bias, and nothing else?")
    print(f"checked: {by_hand:,.0f} FLOPs per token by hand, the training loop's count exactly")


def loss_chart(results: Mapping[str, TrainResult], device: torch.device) -> Figure:
    """Each precision's loss per step, fp16's skipped steps marked x (lesson 02, section 3)."""
    skipped = {"fp16": results["fp16"].skipped_steps} if "fp16" in results else {}
    return loss_curves_chart({p: r.losses for p, r in results.items()}, marks=skipped,
                             title=f"Training loss per precision ({device.type})")


def step_time_chart(results: Mapping[str, TrainResult], device: torch.device) -> Figure:
    """Each precision's median step time, and its ratio to fp32's (lesson 02, section 3)."""
    return bar_chart({p: median_step_s(r) * 1e3 for p, r in results.items()}, baseline="fp32",
                     title=f"Step time per precision ({device.type})", ylabel="median step time [ms]",
                     xlabel="precision")


def scale_chart(run: TrainResult) -> Figure:
    """An fp16 run's loss scale per step on a log2 axis, its skipped steps marked x (lesson 02, section 4)."""
    return loss_curves_chart({"fp16 loss scale": run.scales}, title="GradScaler's scale over the steps",
                             ylabel="loss scale (log2 axis)", logy=True,
                             marks={"fp16 loss scale": run.skipped_steps})


# --- section 4: the GradScaler ---------------------------------------------------------------------------

def overflowing_scale(init_scale: float, tokens: int) -> tuple[int, int]:
    """(exponent, steps): a first scale 2**exponent that overflows fp16 on the first step for sure, and
    enough steps for the scaler to come down to 2**16 and take 4 clean ones (lesson 02, section 4).

    At the start each token's target logit gets a gradient of about -scale / tokens (its probability is
    ~1/VOCAB), and fp16 holds at most 65,504: the first power of two above 2 * 65,504 * tokens overflows
    (fewer real tokens only make the gradients larger). Halving once per skipped step, the scale is down to
    2**16 (AMP's usual start) after exponent - 16 steps."""
    if not init_scale > 0 or tokens < 1:
        raise ValueError(f"need init_scale > 0 and tokens >= 1, got {init_scale}, {tokens}")
    exponent = max(int(init_scale).bit_length() - 1, (2 * 65504 * tokens).bit_length())
    return exponent, exponent - 16 + 4


@dataclass(frozen=True)
class ScalerStep:
    """One step of the hand-written fp16 loop: what the scaler saw and did (lesson 02, section 4)."""

    step: int
    scale: float  # the scale this step used
    finite: bool  # every gradient finite (checked by hand, before scaler.step)
    changed: bool  # some parameter differs from its copy before the step
    scale_after: float  # after scaler.update()


def scaler_table(log: Sequence[ScalerStep]) -> Table:
    """The hand-written fp16 steps, one row each (lesson 02, section 4)."""
    t = Table(["step", "scale used", "all gradients finite", "parameters changed", "scale after"],
              title="GradScaler, step by step: what a skipped step does to the weights")
    for s in log:
        t.add(s.step, s.scale, s.finite, s.changed, s.scale_after)
    return t


def check_skipped_steps(log: Sequence[ScalerStep]) -> None:
    """A step with an overflowed gradient leaves every weight as it was, only such a step does, and the
    scale came down far enough for clean steps (lesson 02, section 4)."""
    overflowed = [s.step for s in log if not s.finite]
    moved = [s.step for s in log if s.changed]
    assert overflowed, "no step overflowed: the first scale was not high enough to show a skip"
    both = sorted(set(overflowed) & set(moved))
    assert not both, f"steps {both} had an overflowed gradient and still changed the weights"
    idle = sorted({s.step for s in log} - set(overflowed) - set(moved))
    assert not idle, f"steps {idle} had finite gradients and did not update the weights"
    assert moved, "every step overflowed: give the scaler more steps so that the scale comes down"
    print(f"checked: from scale 2**{math.log2(log[0].scale):.0f}, the steps with an overflowed gradient "
          f"{overflowed} left the weights alone; every other step updated them")


def check_scaler_resumed(resumed: torch.amp.GradScaler, saved: torch.amp.GradScaler) -> None:
    """A scaler loaded from a checkpoint has the saved scaler's scale and growth tracker (lesson 02,
    section 4)."""
    want, got = saved.state_dict(), resumed.state_dict()
    for key in ("scale", "_growth_tracker", "growth_interval"):
        assert got.get(key) == want.get(key), \
            f"the resumed scaler's {key} is {got.get(key)}, the saved one's {want.get(key)}: load its state"
    n = got["_growth_tracker"]
    print(f"checked: the resumed scaler goes on at scale {got['scale']:g}, with {n} clean "
          f"step{'' if n == 1 else 's'} counted towards its next doubling")


# --- section 5: matmuls on this device -------------------------------------------------------------------

def check_matmul_close(out: torch.Tensor, ref: torch.Tensor, name: str, *, rtol: float = 2e-2) -> float:
    """A 16-bit matmul's relative error against float32's, at most `rtol` (8-bit mantissas round: ~1e-2);
    returns it (lesson 02, section 5)."""
    err = float((out.float() - ref).norm() / ref.norm())
    assert err < rtol, f"{name} matmul is wrong: relative error {err:.2e} against float32 (at most {rtol})"
    return err


def matmul_size_table(device: torch.device | str, dtype: torch.dtype, sizes: Sequence[int], *,
                      min_run_time: float = 0.6) -> Table:
    """Square matmuls of each size in `dtype`, timed in rotating rounds, as GFLOP/s against the first size,
    and a line saying whether the difference stands out of this run's noise (lesson 02, section 6)."""
    device = torch.device(device)
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"sizes must be two or more positive sizes, the first the reference; got {sizes}")
    arms = {}
    for n in sizes:
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        arms[str(n)] = lambda a=a, b=b: a @ b
    with LoadProbe() as probe:
        timings = benchmark_interleaved(arms, rounds=3, min_run_time=min_run_time)
    rate = {n: 2 * n ** 3 / timings[str(n)].median_s for n in sizes}
    t = Table(["n (n x n matmul)", "multiple of 8", "GFLOP/s", "vs n = " + str(sizes[0]), "IQR / median"],
              title=f"{_short(dtype)} matmuls on {device.type}: sizes that are and are not multiples of 8")
    for n in sizes:
        tm = timings[str(n)]
        t.add(n, n % 8 == 0, rate[n] / 1e9, rate[n] / rate[sizes[0]], tm.iqr_s / tm.median_s)
    state = busy(*timings.values(), load=probe.load)
    worst = min(rate[n] / rate[sizes[0]] for n in sizes[1:])
    noise = max(tm.iqr_s / tm.median_s for tm in timings.values())
    if state.too_busy:
        print(f"no verdict: {state}")
    elif abs(1 - worst) <= noise:
        print(f"the odd sizes run within this run's noise (±{noise:.0%}) of n = {sizes[0]}: "
              "no difference here")
    else:
        print(f"the slowest odd size runs at {worst:.2f}x the rate of n = {sizes[0]} (noise ±{noise:.0%})")
    return t


# --- what we measured ----------------------------------------------------------------------------------

GPU_SCRIPT = "benchmarks/mixed_precision_gpu.py"


def summary_table(results: Mapping[str, TrainResult], gpu_results: Mapping[str, Any],
                  S: LessonSetup) -> MeasuredTable:
    """This run's numbers next to the claims C2 and C3, each verdict by its rule; prints the fastest mixed
    precision. Where other programs took the CPUs during the run (S.LOAD, helpers.core.timing.busy's rule), no
    timing verdict: "too busy to judge" (lesson 02, "What we measured")."""
    assert "wide_speedup" in gpu_results, "run the GPU-only cell above first: the summary reports its result"
    where = (torch.cuda.get_device_name(S.DEVICE) if S.DEVICE.type == "cuda"
             else f"CPU ({device_report().cpu.model})")
    base = results["fp32"]
    amp = {p: r for p, r in results.items() if p in ("fp16", "bf16")}
    best = max(amp, key=lambda p: median_step_s(base) / median_step_s(amp[p])) if amp else None
    speedup = median_step_s(base) / median_step_s(amp[best]) if best else None
    saving = 1 - amp[best].peak_memory_bytes / base.peak_memory_bytes if best else None
    on_cpu = ("measured on a CPU; the claim is about Ampere+ GPUs" if S.DEVICE.type != "cuda" else ""
              if S.AMP == "bf16" else
              "measured on a GPU older than Ampere (fp16 only); the claim is about Ampere+")
    probe = getattr(S, "LOAD", None)
    state = busy(load=probe.read()) if probe is not None else None
    summary = MeasuredTable(f"Mixed precision on {where}: claims vs this run")
    summary.add("median fp32 step, ms", median_step_s(base) * 1e3)
    summary.add(f"AMP step-time speed-up (fp32 / {best})", speedup, CLAIMS["amp-speedup"],
                why=on_cpu, needs="fp16 or bf16 on this device", busy=state)
    summary.add(f"AMP peak-memory saving ({best})", saving, CLAIMS["amp-memory"],
                why=on_cpu, needs="fp16 or bf16 on this device")
    full_width = S.FIT.full["WIDE_D_MODEL"]
    narrow = f"d_model fitted to this GPU; the claim's is {full_width}" if S.WIDE_D_MODEL < full_width else ""
    summary.add(f"wide model (d_model={S.WIDE_D_MODEL}): {S.AMP or 'mixed precision'} speed-up",
                gpu_results["wide_speedup"], CLAIMS["wide-amp"], why=narrow,
                needs=f"a CUDA GPU with tensor cores: run {GPU_SCRIPT}", busy=state)
    if "tf32" in results:
        summary.add("tf32 speed-up (fp32 / tf32 step time)",
                    median_step_s(base) / median_step_s(results["tf32"]))
    if speedup is not None and state is not None and state.too_busy:
        print(f"fastest mixed precision here: no verdict, {state}")
    elif speedup is not None:
        print(f"fastest mixed precision here: {best}, {speedup:.2f}x the speed of fp32"
              + (" (slower than fp32)" if speedup < 1 else ""))
    return summary
