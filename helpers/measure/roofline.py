"""This machine's roofline and the peak FLOP/s MFU is measured against (lessons 00, 02, 08).

`measure_roofline` times an n×n matmul per precision and a large copy; `Roofline` keeps the result
(saved where `load_roofline` finds it again). `peak_flops` picks a device's peak for one precision: the
datasheet for known GPUs (`GPU_PEAK_FLOPS`), else the measured roofline; `mfu_peak` is the one peak every
MFU in the course divides by.

A measured roofline is stamped: its date, the CPU threads it used, what other programs took of the CPUs
while it ran and how much its timings' rounds disagreed. A roofline measured while the machine was busy
(`helpers.core.timing.busy`: too busy to judge) is too low: every MFU divided by it would read too high (a run
under load once saved 16.8 GFLOP/s for an 800 GFLOP/s CPU, and every later MFU jumped 48x). So the saved
peak that later runs read is never replaced by one measured under load (`Roofline.save` writes that one to
`roofline-<device>-under-load.json` beside it), and a saved roofline that is unstamped or was measured under
load is never used for MFU (`saved_roofline` says why). A roofline given by hand that was measured under
load is used, and the peak's source says so.

Precision names are the course's one vocabulary: "fp32", "tf32", "fp16", "bf16", "fp8" (the format the
matmuls run in; "tf32" is fp32 storage with TF32 tensor-core matmuls).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from helpers.core.device import device_name, get_device
from helpers.core.precision import PRECISION_DTYPE, PRECISIONS, tf32_matmuls
from helpers.core.tables import Table
from helpers.core.timing import LoadProbe, busy, relative_spread

__all__ = ["Roofline", "measure_roofline", "load_roofline", "saved_roofline", "GPU_PEAK_FLOPS",
           "DatasheetPeaks", "normalise_gpu_name", "datasheet_peaks", "PeakFlops", "peak_flops",
           "MFU_PRECISIONS", "CPU_MFU_PRECISIONS", "mfu_peak"]

# Names of the dtype vocabulary rooflines used before the course settled on one; read, never written.
_LEGACY_NAMES = {"float32": "fp32", "tfloat32": "tf32", "float16": "fp16", "bfloat16": "bf16"}


def _precision_key(name: str) -> str:
    return _LEGACY_NAMES.get(name, name)


@dataclass(frozen=True)
class Roofline:
    """Measured ceilings of a device: matmul FLOP/s per precision, copy bytes/s, and the stamp of the
    measurement (when, with how many threads, under what load) (lesson 00)."""

    device_name: str
    matmul_flops: dict[str, float]  # FLOP/s of an n×n×n matmul, keyed by precision ("fp32", "bf16", ...)
    bandwidth: float  # bytes/s of a large device copy, counting bytes read + written
    matmul_size: int
    copy_bytes: int
    # the stamp (`measure_roofline` fills it in; a roofline made by hand or saved before issue 39 has none)
    measured_at: str = ""  # UTC date and time, ISO 8601
    threads: int | None = None  # torch's CPU threads while measuring
    device_type: str = ""  # "cpu", "cuda", ...
    others_load: float | None = None  # share of the CPUs' time other programs took meanwhile (LoadProbe)
    spread: float | None = None  # the largest IQR / median among its timings

    def __post_init__(self) -> None:  # a roofline saved with dtype names ("float32") reads as precisions
        object.__setattr__(self, "matmul_flops", {_precision_key(k): v for k, v in self.matmul_flops.items()})

    @property
    def stamped(self) -> bool:
        """Whether it says when, with how many threads and under what load it was measured."""
        return bool(self.measured_at) and self.threads is not None and self.spread is not None

    @property
    def under_load(self) -> str | None:
        """Why it was measured on a machine too busy to judge (helpers.core.timing.busy: its rounds disagreed,
        or
        other programs took the CPUs a CPU roofline is measured on), or None (lesson 00)."""
        others = self.others_load if self.device_type == "cpu" else None  # a GPU's roof is not the CPUs'
        state = busy(*([self.spread] if self.spread is not None else []), load=others)
        return "; ".join(state.reasons) if state.too_busy else None

    def stamp(self) -> str:
        """The stamp in words: date, threads, load; "unstamped" for a roofline made by hand or an old file."""
        if not self.stamped:
            return "unstamped (when, with how many threads and under what load is not known)"
        others = ("" if self.others_load is None
                  else f", other programs took {self.others_load:.0%} of the CPUs")
        return (f"measured {self.measured_at} with {self.threads} threads{others}, rounds within "
                f"{self.spread:.0%}" + (f"; UNDER LOAD: {self.under_load}" if self.under_load else ""))

    def ridge_point(self, precision: str = "fp32") -> float:
        """FLOP per byte above which a kernel is compute-bound rather than memory-bound (lesson 00)."""
        key = _precision_key(precision)
        if key not in self.matmul_flops:
            raise ValueError(f"precision {precision!r} was not measured; measured: {list(self.matmul_flops)}")
        return self.matmul_flops[key] / self.bandwidth

    def table(self) -> Table:
        """The roofline as a table (TFLOP/s on GPUs, GFLOP/s on CPUs), its stamp in the title (lesson 00)."""
        scale, unit = (1e12, "TFLOP/s") if max(self.matmul_flops.values()) > 5e12 else (1e9, "GFLOP/s")
        t = Table(["measurement", "value", "unit"],
                  title=f"Measured roofline: {self.device_name}, {self.stamp()}")
        for k, v in self.matmul_flops.items():
            t.add(f"matmul {k} ({self.matmul_size}³)", v / scale, unit)
        t.add(f"copy bandwidth ({self.copy_bytes / 1e6:.0f} MB)", self.bandwidth / 1e9, "GB/s")
        return t

    def _repr_markdown_(self) -> str:
        return self.table().to_markdown()

    def __str__(self) -> str:
        return str(self.table())

    def save(self, path: str | Path | None = None) -> Path:
        """Write the roofline as JSON; returns where (lesson 00). The default is the course cache, where
        `load_roofline` looks: there a roofline measured under load never replaces one measured on a quiet
        machine (it goes to `roofline-<device>-under-load.json`), and one without a stamp is refused."""
        if path is None:
            if not self.stamped:
                raise ValueError("a roofline saved for later runs' MFU must carry its stamp (date, threads, "
                                 "load): save the one measure_roofline returns, or give save() a path")
            path = _roofline_path(self.device_name, under_load=self.under_load is not None)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))
        return path


def _roofline_path(name: str, *, under_load: bool = False) -> Path:
    cache = Path(os.environ.get("COURSE_CACHE", Path.home() / ".cache" / "fast-transformers-course"))
    slug = re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-').lower()
    return cache / (f"roofline-{slug}-under-load.json" if under_load else f"roofline-{slug}.json")


def saved_roofline(name: str | None = None) -> tuple[Roofline | None, str]:
    """(the saved roofline of the device called `name` (default: the current one) that MFU may divide by,
    or None; where it comes from, or why there is none): a file that is missing, unreadable, unstamped or
    measured under load gives None and says which (lessons 00, 02, 08)."""
    path = _roofline_path(name if name is not None else device_name())
    if not path.exists():
        busy_one = _roofline_path(path.stem.removeprefix("roofline-"), under_load=True)
        return None, ("no roofline saved for this device measured on a quiet machine (the one measured under "
                      "load was kept apart): run lesson 00" if busy_one.exists()
                      else "no roofline saved for this device: run lesson 00")
    try:
        roof = Roofline(**json.loads(path.read_text()))
    # a file that cannot be read (OSError), is not JSON (ValueError) or has other fields (TypeError)
    except (OSError, ValueError, TypeError) as err:
        return None, f"the saved roofline {path.name} could not be read ({type(err).__name__}: {err}): run " \
                     "lesson 00 again"
    if not roof.stamped:
        return None, (f"the saved roofline {path.name} is unstamped (saved before rooflines carried their "
                      "date, threads and load: it may have been measured under load): run lesson 00 again")
    if roof.under_load:
        return None, (f"the saved roofline {path.name} was measured under load ({roof.under_load}): run "
                      "lesson 00 on a quiet machine")
    return roof, f"lesson 00's roofline, {roof.stamp()}"


def load_roofline(name: str | None = None, *, any_load: bool = False) -> Roofline | None:
    """The roofline lesson 00 saved for the device called `name` (default: the current one), or None
    (lessons 00, 04, 05): only a stamped one measured on a quiet machine (`saved_roofline` says why not);
    with `any_load`, whatever is saved, the one measured under load if nothing else is (`under_load` says)."""
    roof, _ = saved_roofline(name)
    if roof is not None or not any_load:
        return roof
    path = _roofline_path(name if name is not None else device_name())
    for p in (path, _roofline_path(path.stem.removeprefix("roofline-"), under_load=True)):
        if p.exists():
            return Roofline(**json.loads(p.read_text()))
    return None


def measure_roofline(device: torch.device | str | None = None, precisions: list[str] | None = None,
                     matmul_size: int | None = None, copy_mb: int | None = None,
                     min_run_time: float = 0.3, *, dtypes: list[str] | None = None) -> Roofline:
    """Time an n×n matmul per precision (2n³ FLOP) and a large copy (read + write bytes), stamped with the
    date, the threads and the load it ran under (lesson 00).

    `dtypes` is the old name of `precisions` and also takes the old names ("float32", "bfloat16")."""
    from helpers.core.timing import benchmark

    device = get_device(str(device) if device is not None else "auto")
    gpu = device.type == "cuda"
    asked = precisions if precisions is not None else dtypes
    names = [_precision_key(p) for p in asked] if asked else (["fp32", "tf32", "fp16", "bf16"] if gpu
                                                              else ["fp32", "bf16"])
    bad = [p for p in names if p not in PRECISIONS]  # fp8 needs scaled matmuls: its peak is the datasheet's
    if bad:
        raise ValueError(f"unknown precision(s) {bad}: choose from {list(PRECISIONS)}")
    n = matmul_size or (8192 if gpu else 1024)
    copy_bytes = (copy_mb or (1024 if gpu else 128)) * 2**20
    gen = torch.Generator(device=device).manual_seed(0)
    flops, spreads = {}, []
    probe = LoadProbe().__enter__()  # what other programs take of the CPUs while we measure
    for name in names:
        # random data: zeros or constants can run faster than real data on some hardware
        a = torch.randn(n, n, device=device, dtype=PRECISION_DTYPE[name], generator=gen)
        b = torch.randn(n, n, device=device, dtype=PRECISION_DTYPE[name], generator=gen)
        with tf32_matmuls(name == "tf32"):  # "fp32" is measured with TF32 off: true fp32 matmuls
            t = benchmark(functools.partial(torch.matmul, a, b), name=name, warmup=2,
                          min_run_time=min_run_time)
        flops[name] = 2 * n**3 / t.median_s
        spreads.append(relative_spread(t))
        del a, b
    src = torch.randn(copy_bytes // 4, device=device, generator=gen)
    dst = torch.empty_like(src)
    t = benchmark(lambda: dst.copy_(src), name="copy", warmup=2, min_run_time=min_run_time)
    spreads.append(relative_spread(t))
    load = probe.read()
    return Roofline(device_name=device_name(device), matmul_flops=flops,
                    bandwidth=2 * copy_bytes / t.median_s, matmul_size=n, copy_bytes=copy_bytes,
                    measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    threads=torch.get_num_threads(), device_type=device.type, others_load=load.others,
                    spread=max(spreads))


# --- peak FLOP/s: the one place that picks the peak MFU is measured against ---------------------------

TFLOPS = 1e12


@dataclass(frozen=True)
class DatasheetPeaks:
    """One GPU model's dense peak FLOP/s per precision, the nvidia-smi names it answers to, and where the
    figures come from (lesson 00)."""

    gpu: str  # the model, as the course names it in tables
    names: str  # a regex matched against the WHOLE normalised nvidia-smi name (`normalise_gpu_name`)
    flops: dict[str, float]  # precision -> dense FLOP/s; a precision the GPU has no units for is absent
    source: str

    def __post_init__(self) -> None:
        bad = set(self.flops) - set(PEAK_PRECISIONS)
        if bad:
            raise ValueError(f"{self.gpu}: unknown precision(s) {sorted(bad)}: use {PEAK_PRECISIONS}")


def _peaks(fp32: float, tf32: float | None = None, fp16: float | None = None, bf16: float | None = None,
           fp8: float | None = None) -> dict[str, float]:
    """TFLOPS -> FLOP/s, leaving out the precisions a GPU has no units for."""
    given = dict(fp32=fp32, tf32=tf32, fp16=fp16, bf16=bf16, fp8=fp8)
    return {k: v * TFLOPS for k, v in given.items() if v is not None}


HALVED = "dense = half the 'with sparsity' figures"
FP32_ACC = "tensor with FP32 accumulate, dense"
# Dense peak FLOP/s per precision ("fp16"/"bf16"/"fp8": tensor cores with fp32 accumulation, which is what
# mixed-precision training uses; "fp32": the CUDA cores, no tensor cores; "tf32": TF32 tensor cores).
# Datasheets print 2x "with sparsity" figures for Ampere and later: they are halved back to dense here.
# GeForce boards run fp16/bf16 tensor math with fp32 accumulation at half the fp16-accumulate rate: the
# whitepapers' "with FP32 accumulate" rows are used. Each row matches exact nvidia-smi names only (desktop
# vs Laptop, Ti, PCIe vs SXM vs NVL are different rows or unknown): an unknown GPU gets the measured roofline.
PEAK_PRECISIONS = tuple(PRECISION_DTYPE)  # helpers.core.precision's names: the training precisions and fp8
GPU_PEAK_FLOPS: tuple[DatasheetPeaks, ...] = (
    DatasheetPeaks("T4", r"t4", _peaks(8.1, fp16=65.0),  # Turing: no TF32, no bf16 units
                   "NVIDIA T4 Tensor Core GPU datasheet (FP32 8.1; mixed-precision FP16/FP32 65 TFLOPS)"),
    DatasheetPeaks("V100 SXM2", r"v100 sxm2 (16|32)gb", _peaks(15.7, fp16=125.0),  # Volta: no TF32/bf16
                   "NVIDIA V100 Tensor Core GPU datasheet (V100 SXM2: FP32 15.7, tensor 125 TFLOPS)"),
    DatasheetPeaks("V100 PCIe", r"v100 pcie (16|32)gb", _peaks(14.0, fp16=112.0),
                   "NVIDIA V100 Tensor Core GPU datasheet (V100 PCIe: FP32 14, tensor 112 TFLOPS)"),
    DatasheetPeaks("RTX 3090", r"rtx 3090", _peaks(35.6, 35.6, 71.0, 71.0),
                   f"NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090 column ({FP32_ACC})"),
    DatasheetPeaks("RTX 3090 Ti", r"rtx 3090 ti", _peaks(40.0, 40.0, 80.0, 80.0),
                   "derived: the GA102 whitepaper's per-SM rates (FP32 256, FP16/BF16 tensor with FP32 "
                   "accumulate 512 FLOP per clock per SM) x the RTX 3090 Ti's 84 SMs at its 1,860 MHz boost "
                   "clock (NVIDIA's product page)"),
    DatasheetPeaks("RTX A6000", r"rtx a6000", _peaks(38.7, 77.4, 154.8, 154.8),
                   f"NVIDIA Ampere GA102 GPU architecture whitepaper, RTX A6000 column ({FP32_ACC}; "
                   "the datasheet's 309.7 TFLOPS is with sparsity)"),
    DatasheetPeaks("A10", r"a10", _peaks(31.2, 62.5, 125.0, 125.0),
                   f"NVIDIA A10 Tensor Core GPU datasheet ({HALVED})"),
    DatasheetPeaks("A10G", r"a10g", _peaks(35.0, 35.0, 70.0, 70.0),
                   "NVIDIA publishes no A10G datasheet: Baseten's A10 vs A10G spec table (FP32 35, TF32 35, "
                   "FP16/BF16 70 TFLOPS dense), which is GA102's per-SM rates x 80 SMs at 1,710 MHz"),
    DatasheetPeaks("A100", r"a100 (sxm4 (40|80)gb|pcie (40|80)gb|80gb pcie)",
                   _peaks(19.5, 156.0, 312.0, 312.0),
                   "NVIDIA A100 Tensor Core GPU datasheet (SXM4 and PCIe: the same dense figures)"),
    DatasheetPeaks("RTX 4090", r"rtx 4090", _peaks(82.6, 82.6, 165.2, 165.2, 330.3),
                   f"NVIDIA Ada GPU architecture whitepaper, appendix table for the RTX 4090 ({FP32_ACC})"),
    DatasheetPeaks("RTX 4090 Laptop", r"rtx 4090 laptop gpu", _peaks(39.7, 39.7, 79.4, 79.4, 158.8),
                   "derived, an upper bound: the Ada whitepaper's per-SM rates (FP32 256, FP16/BF16 tensor "
                   "with FP32 accumulate 512, FP8 1,024 FLOP per clock per SM) x the laptop GPU's 76 SMs at "
                   "its highest listed boost clock, 2,040 MHz (NVIDIA's laptop spec page; the clock a laptop "
                   "reaches depends on its maker's power limit)"),
    DatasheetPeaks("L4", r"l4", _peaks(30.3, 60.0, 121.0, 121.0, 242.5),
                   f"NVIDIA L4 Tensor Core GPU datasheet ({HALVED})"),
    DatasheetPeaks("L40S", r"l40s", _peaks(91.6, 183.0, 366.5, 366.5, 733.0),
                   f"NVIDIA L40S GPU datasheet ({HALVED})"),
    DatasheetPeaks("H100 SXM", r"h100 (80gb hbm3|sxm5 80gb)", _peaks(67.0, 494.7, 989.4, 989.4, 1978.9),
                   f"NVIDIA H100 Tensor Core GPU datasheet, H100 SXM ({HALVED})"),
    DatasheetPeaks("H100 PCIe", r"h100 pcie", _peaks(51.0, 378.0, 756.0, 756.0, 1513.0),
                   f"NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe ({HALVED})"),
    DatasheetPeaks("H100 NVL", r"h100 nvl", _peaks(60.0, 417.5, 835.5, 835.5, 1670.5),
                   f"NVIDIA H100 NVL datasheet, per GPU ({HALVED})"),
    DatasheetPeaks("H200", r"h200", _peaks(67.0, 494.7, 989.4, 989.4, 1978.9),
                   f"NVIDIA H200 Tensor Core GPU datasheet, H200 SXM ({HALVED})"),
    DatasheetPeaks("H200 NVL", r"h200 nvl", _peaks(60.0, 417.5, 835.5, 835.5, 1670.5),
                   f"NVIDIA H200 Tensor Core GPU datasheet, H200 NVL ({HALVED})"),
    DatasheetPeaks("GH200", r"gh200( \S+)*", _peaks(67.0, 494.7, 989.4, 989.4, 1978.9),
                   f"NVIDIA GH200 Grace Hopper Superchip datasheet, the GPU's figures ({HALVED})"),
    DatasheetPeaks("B200", r"b200", _peaks(75.0, 1100.0, 2250.0, 2250.0, 4500.0),
                   f"NVIDIA HGX B200 datasheet, per GPU at 1,000 W ({HALVED})"),
    DatasheetPeaks("RTX 5090", r"rtx 5090", _peaks(104.8, 104.8, 209.5, 209.5, 419.0),
                   f"NVIDIA RTX Blackwell GPU architecture whitepaper, RTX 5090 column ({FP32_ACC})"),
)
_DROPPED_WORDS = ("nvidia", "geforce", "tesla")  # vendor and brand words: "Tesla T4" is a "t4"


def normalise_gpu_name(name: str) -> str:
    """nvidia-smi's name, lower case, '-' and '_' as spaces, without "NVIDIA", "GeForce" and "Tesla":
    "NVIDIA A100-SXM4-80GB" -> "a100 sxm4 80gb" (lesson 00)."""
    words = re.sub(r"[-_\s]+", " ", name.lower()).split()
    return " ".join(w for w in words if w not in _DROPPED_WORDS)


def datasheet_peaks(name: str) -> DatasheetPeaks | None:
    """The datasheet row whose names match all of `name` (an nvidia-smi name), or None: an unknown GPU,
    a laptop or Ti variant without its own row, a MIG slice (lesson 00)."""
    key = normalise_gpu_name(name)
    found = [row for row in GPU_PEAK_FLOPS if re.fullmatch(row.names, key)]
    assert len(found) <= 1, f"{name!r} matches several datasheet rows: {[r.gpu for r in found]}"
    return found[0] if found else None


@dataclass(frozen=True)
class PeakFlops:
    """A device's peak dense FLOP/s for one precision, and where the number comes from (lesson 00)."""

    flops: float
    precision: str
    source: str


def _has_tf32_units(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


def peak_flops(device: torch.device | str | None = None, precision: str = "bf16", *,
               roofline: Roofline | None = None, gpu_name: str | None = None,
               measure: bool = False) -> PeakFlops | None:
    """The peak MFU is measured against (lessons 00, 02, 08): the datasheet for a known GPU, else the
    measured `roofline` (one measured under load is used, and the source says so), else lesson 00's saved
    roofline of this device (`saved_roofline`: stamped, measured on a quiet machine), else (with `measure`)
    a roofline measured now, else None.

    `gpu_name` looks a GPU up in the datasheet table without having it ("NVIDIA H100 80GB HBM3").
    "tf32" on hardware without TF32 units (a CPU, a pre-Ampere GPU) runs fp32 matmuls: fp32's peak."""
    if precision not in PEAK_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: use one of {PEAK_PRECISIONS}")
    if roofline is not None and not isinstance(roofline, Roofline):
        raise TypeError(f"roofline must be a helpers.measure.roofline.Roofline (from measure_roofline), "
                        f"got {type(roofline).__name__}")
    dev = get_device(str(device) if device is not None else ("cuda" if gpu_name is None and
                                                             torch.cuda.is_available() else "cpu"))
    name = gpu_name or (torch.cuda.get_device_name(dev) if dev.type == "cuda" else None)
    row = datasheet_peaks(name) if name else None
    if row is not None:
        if precision in row.flops:
            return PeakFlops(row.flops[precision], precision, row.source)
        if precision == "tf32":  # no TF32 units: tf32 runs as fp32
            return PeakFlops(row.flops["fp32"], "fp32", row.source + "; no TF32 units: the fp32 peak")
        # a known GPU without units for this precision: try the measurement
    no_tf32 = gpu_name is None and not _has_tf32_units(dev)
    key = "fp32" if precision == "tf32" and no_tf32 else precision
    saved = None
    if roofline is None and gpu_name is None:  # lesson 00's, stamped and measured on a quiet machine
        saved, _ = saved_roofline(name or device_name(dev))
    if roofline is None and (saved is None or not saved.matmul_flops.get(key)):
        roofline = measure_roofline(dev, precisions=[key]) if measure and key in PRECISIONS else None
    roofline = roofline if roofline is not None else saved
    if roofline is not None:
        measured = roofline.matmul_flops
        if precision in measured:
            key = precision
        if measured.get(key):
            note = "" if key == precision else "; no TF32 units: the fp32 matmul"
            unknown = f" ({name} is not in the datasheet table)" if name and row is None else ""
            how = (f", lesson 00's saved one ({roofline.stamp()})" if roofline is saved else
                   f"; measured under load ({roofline.under_load}): an MFU against it reads high"
                   if roofline.under_load else "")
            return PeakFlops(float(measured[key]), key,
                             f"measured matmul roofline on {roofline.device_name}{note}{unknown}{how}")
    return None


# the dense rates MFU's one peak is chosen from: every training precision's but TF32's (never above fp16's
# where a GPU has it, fp32's where it has not). fp16 counts: a T4 or V100 has fp16 tensor cores and no bf16
# ones, and its fp16 run divided by its fp32 peak would show an MFU of up to 800 %.
MFU_PRECISIONS = ("fp32", "bf16", "fp16")  # on a tie (fp16 = bf16 on Ampere and later) bf16 is named
# A CPU trains in fp32 or bf16 in this course (the ladder's fp16 rung is a GPU's, helpers.train.ladder), so no
# CPU
# run has an fp16 MFU; and a CPU without fp16 units emulates its matmuls (0.8 GFLOP/s on the 2-core EPYC CI
# uses, against 540 for bf16): measuring that would take 10 s and name no peak.
CPU_MFU_PRECISIONS = ("fp32", "bf16")


def mfu_peak(device: torch.device | str | None = None, *, roofline: Roofline | None = None,
             measure: bool = False) -> PeakFlops | None:
    """The one peak every MFU in the course divides by (lessons 02, 08): the device's fastest dense rate
    among the training precisions (MFU_PRECISIONS; a CPU's: CPU_MFU_PRECISIONS), FP8 aside, so that no run in
    fp32, TF32, fp16 or bf16 shows an MFU above 100 %. A known GPU's datasheet figure (bf16 from Ampere on,
    fp16 on a T4 or V100); an unknown GPU's or a CPU's fastest measured matmul (`roofline`; else lesson 00's
    saved roofline when it is stamped and was measured on a quiet machine; else with `measure` measured now:
    same threads, same load; the source says which). None when no peak is known."""
    dev = get_device(str(device) if device is not None else "auto")
    names = CPU_MFU_PRECISIONS if dev.type == "cpu" else MFU_PRECISIONS
    peaks = (peak_flops(dev, name, roofline=roofline, measure=measure) for name in names)
    found = [p for p in peaks if p is not None]
    return max(found, key=lambda p: p.flops) if found else None
