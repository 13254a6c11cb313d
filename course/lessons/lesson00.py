"""Lesson 00 (`00_setup`): its sizes (the matmul and the copy that measure the roofline), and its plumbing:
the checks that the GPU report, the fp32 matmul, the cold start, the roofline and the diagnosis are right,
the datasheet and typical-machine tables, and the closing summary. Each check raises AssertionError when it
fails and prints one line saying what it checked when it passes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from course.claims import CLAIMS
from course.lessons import LessonSetup
from course.profile import get_profile, pick
from course.sizing import Size, fit_sizes
from course.verdicts import AtLeast, AtMost, MeasuredTable, PairedRatio
from helpers.core.device import CORES_PER_SM, EnvironmentReport, get_device
from helpers.core.diagnosis import Compilers, SetupFacts, diagnose
from helpers.core.precision import tf32_matmuls
from helpers.core.tables import Table
from helpers.core.timing import Busy, ColdStart, CpuLoad, LoadProbe, benchmark, busy, time_interleaved
from helpers.measure.roofline import Roofline, measure_roofline, peak_flops

__all__ = ["SIZES", "setup", "DATASHEET", "QUOTED", "datasheet_verdicts", "datasheet_table", "memory_off",
           "check_gpu_memory", "FP32_MATMUL_TOL", "tf32_inputs", "relative_error", "check_fp32_matmul",
           "check_cold_start", "ROOF_MARGIN", "TOO_NOISY", "RoofCheck", "judge_under_roof",
           "one_thread_pairs", "check_matmul_under_roof", "check_add_under_roof", "TYPICAL_MACHINES",
           "check_typical_machines", "typical_machines_table", "run_busy", "summary_table"]

SIZES = {"MATMUL_SIZE": Size(full=8192, smoke=512, floor=2048),  # n of the n×n×n matmul that measures FLOP/s
         "COPY_MB": Size(full=2048, smoke=64, floor=256)}  # size of the copy that measures memory bandwidth
ESTIMATES = {  # fp32 a and b, and a float64 reference of their product with its two float64 inputs
    "the matmul, checked against float64": lambda s: (2 * 4 + 3 * 8) * s["MATMUL_SIZE"] ** 2,
    "the copy: a source and a destination": lambda s: 2 * s["COPY_MB"] * 2**20}


def setup(profile: str | None = None) -> LessonSetup:
    """Lesson 00's sizes on this device; prints the one line saying what it chose and why (lesson 00)."""
    device = get_device()
    fit = fit_sizes(SIZES, ESTIMATES, shrink=["COPY_MB", "MATMUL_SIZE"], profile=get_profile(profile),
                    device=device)
    print(fit.line())
    return LessonSetup(PROFILE=fit.profile, DEVICE=device, FIT=fit, **fit.sizes,
                       MIN_RUN_TIME=pick(fit.profile, smoke=0.2, full=1.0))  # seconds of timed runs each


# --- step 2: datasheet arithmetic, and the report against CUDA's own count ---------------------------------

# NVIDIA's datasheets and architecture whitepapers, not read from any device:
# name -> (compute capability, SMs, memory in GB on the datasheet)
DATASHEET = {"A100-SXM4-40GB": ((8, 0), 108, 40), "GeForce RTX 3090": ((8, 6), 82, 24),
             "GeForce RTX 4090": ((8, 9), 128, 24)}
# what articles quote: name -> (CUDA cores, memory GB); None where they quote nothing
QUOTED = {"A100-SXM4-40GB": (6912, None), "GeForce RTX 3090": (10496, 24), "GeForce RTX 4090": (None, 40)}


def datasheet_verdicts() -> dict[str, str]:
    """GPU name -> "holds" or "wrong": the quoted figures against SMs × FP32 cores per SM (lesson 00)."""
    verdicts = {}
    for name, (cc, sms, mem) in DATASHEET.items():
        cores, (quoted_cores, quoted_mem) = sms * CORES_PER_SM[cc], QUOTED[name]
        ok = quoted_cores in (None, cores) and quoted_mem in (None, mem)
        verdicts[name] = "holds" if ok else "wrong"
    return verdicts


def datasheet_table() -> Table:
    """The quoted CUDA cores and memory next to the datasheets' arithmetic, with verdicts (lesson 00)."""
    table = Table(["GPU", "claim: CUDA cores", "claim: memory GB", "datasheet: SMs × FP32 cores/SM",
                   "datasheet: memory GB", "verdict"], title="Datasheet arithmetic (no device involved)")
    verdicts = datasheet_verdicts()
    for name, (cc, sms, mem) in DATASHEET.items():
        per_sm = CORES_PER_SM[cc]
        table.add(name, *QUOTED[name], f"{sms} × {per_sm} = {sms * per_sm}", mem, verdicts[name])
    return table


def memory_off(report_gib: float, cuda_total_bytes: int) -> float:
    """Relative difference between a report's GiB and the bytes CUDA counts (lesson 00)."""
    return abs(report_gib * 2**30 / cuda_total_bytes - 1)


def check_gpu_memory(report: EnvironmentReport, tolerance: float = 0.01) -> None:
    """Each GPU's memory in `report` against the CUDA runtime's own count (`torch.cuda.mem_get_info`),
    within `tolerance` (rounding only); a report that divided by 10⁹ and called it GiB must fail
    (lesson 00)."""
    if not report.gpus:
        print("check_gpu_memory: no GPU here; on a GPU it checks the report against CUDA's own count")
        return
    for g in report.gpus:
        total = torch.cuda.mem_get_info(g.index)[1]  # bytes, as the CUDA runtime counts them
        assert memory_off(g.memory_gib, total) < tolerance, (
            f"cuda:{g.index}: the report says {g.memory_gib:.2f} GiB, CUDA counts {total / 2**30:.2f} GiB")
        # the planted-bug control: GB (10⁹ bytes) called GiB is 7 % off, so the check can tell them apart
        gb = torch.cuda.get_device_properties(g.index).total_memory / 1e9
        assert memory_off(gb, total) > tolerance, "the check cannot tell GB from GiB"
        cores = f" × {CORES_PER_SM[g.capability]} = {g.cuda_cores} CUDA cores" if g.cuda_cores else ""
        print(f"check_gpu_memory: cuda:{g.index} {g.name}: {g.memory_gib:.1f} GiB, and CUDA counts "
              f"{total:,} bytes: they agree (GB called GiB would not); {g.sm_count} SMs{cores}")


# --- step 4: correct before fast, and the cold start -------------------------------------------------------

# In fp32 (TF32 off) an n×n matmul errs by ~1e-6 against float64; TF32 rounds its inputs to a 10-bit mantissa
# and errs by ~3e-4. The tolerance sits between the two.
FP32_MATMUL_TOL = 1e-5


def tf32_inputs(t: torch.Tensor) -> torch.Tensor:
    """`t` (float32) with its mantissa rounded to TF32's 10 bits, sign and exponent kept: what TF32 tensor
    cores read (lesson 00)."""
    return ((t.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


def relative_error(product: torch.Tensor, reference: torch.Tensor) -> float:
    """‖product − reference‖ / ‖reference‖, in float64 (lesson 00)."""
    return float((product.double() - reference).norm() / reference.norm())


def check_fp32_matmul(a: torch.Tensor, b: torch.Tensor, product: torch.Tensor,
                      reference: torch.Tensor | None = None, *,
                      tf32_product: torch.Tensor | None = None) -> float:
    """`product` (a @ b) against `reference` (a @ b in float64; computed when None), below FP32_MATMUL_TOL;
    TF32's rounding must fail the same test: `tf32_product`, the product of TF32-rounded inputs the lesson
    computes (else `tf32_inputs`'), and on an Ampere or later GPU its tensor cores. Returns the error
    (lesson 00)."""
    ref = reference if reference is not None else a.double() @ b.double()
    err = relative_error(product, ref)
    assert err < FP32_MATMUL_TOL, (
        f"fp32 matmul: relative error {err:.1e} above {FP32_MATMUL_TOL:g}: is TF32 on?")
    control = tf32_product if tf32_product is not None else tf32_inputs(a) @ tf32_inputs(b)
    tf32_err = relative_error(control, ref)  # the planted-bug control
    assert tf32_err > FP32_MATMUL_TOL, (
        f"the check cannot tell TF32 ({tf32_err:.1e}) from fp32: are the TF32 inputs rounded to 10 bits?")
    extra = ""
    if a.device.type == "cuda" and torch.cuda.get_device_capability(a.device) >= (8, 0):
        with tf32_matmuls(True):  # the real TF32 units, for the control only; the setting found comes back
            real_err = relative_error(a @ b, ref)
        assert real_err > FP32_MATMUL_TOL, f"TF32 tensor cores ({real_err:.1e}) pass the fp32 check"
        extra = f", with TF32 tensor cores {real_err:.1e}"
    print(f"check_fp32_matmul: relative error {err:.1e} against float64; with TF32's 10-bit inputs "
          f"{tf32_err:.1e}{extra}: the tolerance {FP32_MATMUL_TOL:g} tells them apart")
    return err


def check_cold_start(cold: ColdStart, device: torch.device | str) -> None:
    """The cold start was measured in another process; on a GPU its first call is slower than its steady
    state (the cuBLAS handle, the kernels loaded) (lesson 00)."""
    assert cold.pid != os.getpid(), "the cold start ran in this warmed-up kernel, not in a fresh process"
    gpu = torch.device(device).type == "cuda"
    if gpu:
        assert cold.first_call_s > cold.steady_s, f"on a GPU the first call is the slow one: {cold}"
    print(f"check_cold_start: measured in process {cold.pid}, not this one ({os.getpid()})"
          + ("; its first call is the slower one" if gpu else ""))


# --- step 5: the roofline, checked by points of our own -----------------------------------------------------

ROOF_MARGIN = 1.3  # two timings of one kernel, side by side: within 30 % of each other
TOO_NOISY = 0.5  # noise at which a roof check cannot judge


@dataclass(frozen=True)
class RoofCheck:
    """One point checked against the roof: its ratio to the roof, the noise, the planted error's ratio, the
    ratio allowed, and whether the machine was quiet enough to judge (lesson 00)."""

    what: str
    value: float  # the point over the roof
    noise: float  # how much the measurements themselves disagree
    planted: float  # the planted error's point over the roof: above `allowed`, or no judgement
    allowed: float  # 1 + max(ROOF_MARGIN - 1, 2 × noise)
    judged: bool
    state: Busy | None = None  # why it did not judge (too_busy), or that it could (helpers.core.timing.busy)


def judge_under_roof(what: str, value: float, noise: float, planted: float,
                     load: CpuLoad | None = None) -> RoofCheck:
    """The noise rule: a point may sit above the roof by ROOF_MARGIN - 1, or by twice the noise if that is
    larger. It judges only where the noise is below TOO_NOISY, the planted error lies above that line and
    other programs left the CPUs alone while it measured (`load`, helpers.core.timing.busy's rule); otherwise
    it
    says the machine is too busy to judge (lesson 00)."""
    allowed = 1 + max(ROOF_MARGIN - 1, 2 * noise)
    others = busy(load=load) if load is not None else None
    lost = () if planted > allowed else (f"the planted error at {planted:.2f}x is inside the {allowed:.2f}x "
                                         "the noise allows",)
    state = Busy(noise, others.others if others is not None else None, noise_limit=TOO_NOISY, signs=lost)
    judged = not state.too_busy
    if not judged:
        why = f"; {' and '.join(others.reasons)}" if others is not None and others.too_busy else ""
        print(f"{what}: this machine was too busy to judge (noise {noise:.0%}; the planted error at "
              f"{planted:.2f}x against {allowed:.2f}x allowed{why}); close other programs, rerun")
    else:
        assert value <= allowed, f"{what} at {value:.2f}x the roof (allowed {allowed:.2f}x)"
    return RoofCheck(what, value, noise, planted, allowed, judged, state)


def one_thread_pairs(first: Callable[[], float], second: Callable[[], float],
                     pairs: int) -> tuple[list[float], list[float]]:
    """`pairs` rounds of (first(), second()), the order alternating, on one thread: their values in two lists.
    A busy machine slows both alike; on two threads a kernel waits for the slower one (lesson 00)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        values: tuple[list[float], list[float]] = ([], [])
        for i in range(pairs):
            for k in ((0, 1) if i % 2 == 0 else (1, 0)):
                values[k].append((first, second)[k]())
        return values
    finally:
        torch.set_num_threads(threads)


def check_matmul_under_roof(a: torch.Tensor, b: torch.Tensor, *, flop: float, pairs: int = 9) -> RoofCheck:
    """a @ b, with `flop` counted by hand, at or below the fp32 matmul roof: `pairs` interleaved pairs of our
    rate and the roofline's own fp32 measurement, on one thread, their median judged; a roof counted with n³
    (half its FLOPs) is the planted error it must see (lesson 00)."""
    n = a.shape[0]

    def ours() -> float:
        return flop / benchmark(lambda: a @ b, warmup=1, min_run_time=0.05).median_s

    def roof() -> float:
        quick = measure_roofline(a.device, ["fp32"], matmul_size=n, copy_mb=1, min_run_time=0.05)
        return quick.matmul_flops["fp32"]

    with LoadProbe() as probe:  # what other programs took of the CPUs meanwhile
        rates, roofs = one_thread_pairs(ours, roof, pairs)
    point = PairedRatio.of(rates, roofs)
    planted = PairedRatio.of(rates, [r / 2 for r in roofs])  # the roof's FLOPs counted as n³
    check = judge_under_roof("a matmul", point.median, point.spread, planted.median, probe.load)
    if check.judged:
        print(f"check_matmul_under_roof: the matmul runs at {point.median:.2f}x the fp32 roof (median of "
              f"{pairs} pairs on one thread, spread {point.spread:.0%}); a roof counted with n³: "
              f"{planted.median:.2f}x, caught")
    return check


def _fastest(rates: list[float]) -> tuple[float, float]:
    # an arm's fastest call (other programs only add time), and how far its second fastest is below it
    best, second = sorted(rates)[-1], sorted(rates)[-2]
    return best, best / second - 1


def check_add_under_roof(x: torch.Tensor, y: torch.Tensor, *, flop_per_byte: float,
                         pairs: int = 9) -> RoofCheck:
    """`torch.add(x, x, out=y)` at `flop_per_byte` (the intensity counted by hand) at or below the memory roof
    there, a copy of the same bytes measuring the roof: `pairs` interleaved calls on one thread, each arm's
    fastest judged. An add counted with 12 bytes per fp32 element, as if it read x twice, is the planted error
    it must see (lesson 00)."""
    device = x.device

    def add() -> None:
        torch.add(x, x, out=y)

    def copy() -> None:
        y.copy_(x)

    add(), copy()  # warm-up
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with LoadProbe() as probe:  # what other programs took of the CPUs meanwhile
            adds, copies = time_interleaved(add, copy, repeats=pairs, device=device)
    finally:
        torch.set_num_threads(threads)
    add_rates = [x.numel() / s for s in adds.times_s]  # 1 FLOP per element, FLOP/s
    bandwidths = [2 * x.nbytes / s for s in copies.times_s]  # bytes read + written per second
    (add_best, add_noise), (bw_best, bw_noise) = _fastest(add_rates), _fastest(bandwidths)

    def over_roof(intensity: float) -> float:
        return add_best / (bw_best * intensity)

    planted_intensity = 1 / (3 * x.element_size())  # a read of each operand and a write: 12 bytes in fp32
    value, planted = over_roof(flop_per_byte), over_roof(planted_intensity)
    check = judge_under_roof("x + x", value, max(add_noise, bw_noise), planted, probe.load)
    if check.judged:
        print(f"check_add_under_roof: x + x at {flop_per_byte:.3g} FLOP per byte runs at {value:.2f}x the "
              f"memory roof (each arm's fastest of {pairs} interleaved calls on one thread, noise "
              f"{check.noise:.0%}); counted with 12 bytes: {planted:.2f}x, caught")
    return check


# --- step 6: the diagnosis on typical machines --------------------------------------------------------------

_A10G = ["GPU 0: NVIDIA A10G"]
# name -> (the facts `diagnose` would read off such a machine, the problem it must name first; None: none)
TYPICAL_MACHINES: dict[str, tuple[SetupFacts, str | None]] = {
    "CUDA build, no driver": (SetupFacts("12.4", False, None, None, None), "CUDA build without a driver"),
    "CPU-only torch on a GPU box": (
        SetupFacts(None, False, _A10G, "12.4", None), "CPU-only torch on a GPU box"),
    "CUDA 13.0 build, driver 535 (CUDA 12.2)": (
        SetupFacts("13.0", False, _A10G, "12.2", None, driver="535.104.05"), "driver too old for this torch"),
    "CUDA 12.6 build, driver 535 (CUDA 12.2)": (
        SetupFacts("12.6", True, _A10G, "12.2", None, driver="535.104.05"), None),
    "no C/C++ compiler (Ubuntu)": (
        SetupFacts(None, False, None, None, None, compilers=Compilers(c=None, cxx=None, os_family="debian")),
        "no C/C++ compiler"),
}


def check_typical_machines() -> None:
    """`diagnose` names each broken typical machine's problem first, and flags nothing on the working one
    (lesson 00)."""
    for name, (facts, expected) in TYPICAL_MACHINES.items():
        problems = [f.check for f in diagnose(facts) if not f.ok]
        assert problems[:1] == ([expected] if expected else []), (
            f"{name}: diagnose found {problems or 'no problem'}, expected {expected or 'none'} first")
    broken = sum(e is not None for _, e in TYPICAL_MACHINES.values())
    print(f"check_typical_machines: each of {broken} broken machines caught by the right check, "
          f"{len(TYPICAL_MACHINES) - broken} working one not flagged")


def typical_machines_table() -> Table:
    """What `diagnose` finds on each typical machine: the problem, why, the fix (lesson 00)."""
    table = Table(["machine", "problem found", "why", "fix"], title="Diagnosis of typical machines")
    for name, (facts, _) in TYPICAL_MACHINES.items():
        findings = diagnose(facts)
        problems = [f for f in findings if not f.ok]
        shown = problems[0] if problems else next(f for f in findings if f.check == "driver and torch build")
        table.add(name, shown.check if problems else "none: fine", shown.detail, shown.fix or None)
    return table


# --- what we measured ---------------------------------------------------------------------------------------

def run_busy(roof: Roofline, *checks: RoofCheck) -> Busy | None:
    """The first sign that this run was too busy to judge its timings, or None: the roofline's own timings
    (helpers.core.timing.busy over their spread and, on a CPU, what other programs took meanwhile), then the
    roof
    checks' (lesson 00)."""
    others = roof.others_load if roof.device_type == "cpu" else None  # a GPU's roof is not the CPUs'
    states = [busy(*([roof.spread] if roof.spread is not None else []), load=others)]
    states += [c.state for c in checks if c.state is not None]
    return next((s for s in states if s.too_busy), None)


def summary_table(report: EnvironmentReport, roof: Roofline, cold: ColdStart, matmul_err: float,
                  add_check: RoofCheck, device: torch.device | str, *,
                  matmul_check: RoofCheck | None = None) -> MeasuredTable:
    """This run's numbers next to the claims about environments articles make; once the roofline or a roof
    check was too busy to judge (`run_busy`), no timing verdict: "too busy to judge" (lesson 00)."""
    device = torch.device(device)
    state = run_busy(roof, *[c for c in (matmul_check, add_check) if c is not None])
    gpu = report.gpus[0] if report.gpus else None
    best = max(roof.matmul_flops, key=roof.matmul_flops.get)
    scale, unit = (1e12, "TFLOP/s") if roof.matmul_flops[best] > 5e12 else (1e9, "GFLOP/s")
    sheet = peak_flops(device, best) if device.type == "cuda" else None  # the datasheet's, for a known GPU
    smi_gpus = SetupFacts.gather().smi_gpus  # None: no NVIDIA driver, so no GPU to find
    verdicts = datasheet_verdicts()
    summary = MeasuredTable(f"Lesson 00 on {roof.device_name}")
    available = torch.cuda.is_available()
    summary.add("torch.cuda.is_available()", available, CLAIMS["cuda-is-there"],
                verdict="holds" if available else "does not hold" if smi_gpus else "not testable here",
                why="" if available else "section 6 says why" if smi_gpus else "no NVIDIA GPU here")
    build = (f"CUDA {torch.version.cuda}; the driver supports CUDA {report.driver_cuda}" if torch.version.cuda
             else "CPU-only")
    summary.add("torch and the CUDA it was built with", f"torch {torch.__version__}, {build}",
                CLAIMS["torch-cuda-pairs"], verdict="wrong",
                why="a release is built for several CUDA versions; the driver decides which runs (section 1)")
    summary.add("RTX 4090 memory, datasheet (section 2)", "24 GB", CLAIMS["rtx4090-40gb"],
                verdict=verdicts["GeForce RTX 4090"])
    summary.add("A100 CUDA cores, datasheet arithmetic (section 2)", "108 SMs × 64",
                CLAIMS["a100-cores"], verdict=verdicts["A100-SXM4-40GB"])
    summary.add("RTX 3090 CUDA cores and memory, datasheet (section 2)", "82 SMs × 128, 24 GB",
                CLAIMS["rtx3090-cores"], verdict=verdicts["GeForce RTX 3090"])
    if gpu:
        summary.add(f"{gpu.name}, read off the device", f"{gpu.memory_gib:.1f} GiB, {gpu.sm_count} SMs, "
                    f"{gpu.cuda_cores or 'unknown'} CUDA cores")
    summary.add("first matmul in a fresh process / its steady time", cold.first_call_s / cold.steady_s,
                "the first call is slow", rule=AtLeast(1.0), busy=state)
    summary.add("import torch in a fresh process, s", cold.import_s)
    datasheet = f"datasheet: {sheet.flops / 1e12:,.0f} TFLOP/s ({sheet.source})" if sheet else ""
    summary.add(f"peak {best} matmul throughput ({roof.matmul_size}³), {unit}",
                roof.matmul_flops[best] / scale, datasheet)
    summary.add(f"memory bandwidth (copy of {roof.copy_bytes / 2**20:,.0f} MiB), GB/s", roof.bandwidth / 1e9)
    summary.add("fp32 matmul, relative error vs float64", matmul_err, f"< {FP32_MATMUL_TOL:g} (TF32 off)",
                rule=AtMost(FP32_MATMUL_TOL))
    summary.add("x + x over the memory roof (each arm's fastest call)", add_check.value,
                f"≤ {add_check.allowed:.2f} (no point above the roof, within the noise)",
                rule=AtMost(add_check.allowed), busy=state)
    if "bf16" in roof.matmul_flops:
        ratio = roof.matmul_flops["bf16"] / roof.matmul_flops["fp32"]
        why = "this device has no bf16 matrix units (AVX512-BF16/AMX on a CPU)" if ratio < 1 else ""
        summary.add("bf16 / fp32 matmul throughput", ratio, "bf16 is faster than fp32", rule=AtLeast(1.0),
                    why=why, busy=state)
    return summary
