"""This machine's roofline and the peak FLOP/s MFU is measured against (lessons 00, 02, 08).

`measure_roofline` times an n×n matmul per precision and a large copy; `Roofline` keeps the result
(saved where `load_roofline` finds it again). `peak_flops` picks a device's peak for one precision: the
datasheet for known GPUs (`GPU_PEAK_FLOPS`), else the measured roofline; `mfu_peak` is the one peak every
MFU in the course divides by.

Precision names are the course's one vocabulary: "fp32", "tf32", "fp16", "bf16", "fp8" (the format the
matmuls run in; "tf32" is fp32 storage with TF32 tensor-core matmuls).
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from helpers.device import device_name, get_device
from helpers.precision import PRECISION_DTYPE, PRECISIONS, tf32_matmuls
from helpers.tables import Table

__all__ = ["Roofline", "measure_roofline", "load_roofline", "GPU_PEAK_FLOPS", "PeakFlops", "peak_flops",
           "MFU_PRECISIONS", "mfu_peak"]

# Names of the dtype vocabulary rooflines used before the course settled on one; read, never written.
_LEGACY_NAMES = {"float32": "fp32", "tfloat32": "tf32", "float16": "fp16", "bfloat16": "bf16"}


def _precision_key(name: str) -> str:
    return _LEGACY_NAMES.get(name, name)


@dataclass(frozen=True)
class Roofline:
    """Measured ceilings of a device: matmul FLOP/s per precision, copy bytes/s (lesson 00)."""

    device_name: str
    matmul_flops: dict[str, float]  # FLOP/s of an n×n×n matmul, keyed by precision ("fp32", "bf16", ...)
    bandwidth: float  # bytes/s of a large device copy, counting bytes read + written
    matmul_size: int
    copy_bytes: int

    def __post_init__(self) -> None:  # a roofline saved with dtype names ("float32") reads as precisions
        object.__setattr__(self, "matmul_flops", {_precision_key(k): v for k, v in self.matmul_flops.items()})

    def ridge_point(self, precision: str = "fp32") -> float:
        """FLOP per byte above which a kernel is compute-bound rather than memory-bound (lesson 00)."""
        key = _precision_key(precision)
        if key not in self.matmul_flops:
            raise ValueError(f"precision {precision!r} was not measured; measured: {list(self.matmul_flops)}")
        return self.matmul_flops[key] / self.bandwidth

    def table(self) -> Table:
        """The roofline as a table (TFLOP/s on GPUs, GFLOP/s on CPUs) (lesson 00)."""
        scale, unit = (1e12, "TFLOP/s") if max(self.matmul_flops.values()) > 5e12 else (1e9, "GFLOP/s")
        t = Table(["measurement", "value", "unit"], title=f"Measured roofline: {self.device_name}")
        for k, v in self.matmul_flops.items():
            t.add(f"matmul {k} ({self.matmul_size}³)", v / scale, unit)
        t.add(f"copy bandwidth ({self.copy_bytes / 1e6:.0f} MB)", self.bandwidth / 1e9, "GB/s")
        return t

    def _repr_markdown_(self) -> str:
        return self.table().to_markdown()

    def __str__(self) -> str:
        return str(self.table())

    def save(self, path: str | Path | None = None) -> Path:
        """Write the roofline as JSON (default: the course cache, where `load_roofline` looks) (lesson 00)."""
        path = Path(path) if path is not None else _roofline_path(self.device_name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))
        return path


def _roofline_path(name: str) -> Path:
    cache = Path(os.environ.get("COURSE_CACHE", Path.home() / ".cache" / "fast-transformers-course"))
    return cache / f"roofline-{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-').lower()}.json"


def load_roofline(name: str | None = None) -> Roofline | None:
    """The roofline lesson 00 measured for the device called `name` (default: the current one), or None."""
    path = _roofline_path(name if name is not None else device_name())
    if not path.exists():
        return None
    return Roofline(**json.loads(path.read_text()))


def measure_roofline(device: torch.device | str | None = None, precisions: list[str] | None = None,
                     matmul_size: int | None = None, copy_mb: int | None = None,
                     min_run_time: float = 0.3, *, dtypes: list[str] | None = None) -> Roofline:
    """Time an n×n matmul per precision (2n³ FLOP) and a large copy (read + write bytes) (lesson 00).

    `dtypes` is the old name of `precisions` and also takes the old names ("float32", "bfloat16")."""
    from helpers.timing import benchmark

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
    flops = {}
    for name in names:
        # random data: zeros or constants can run faster than real data on some hardware
        a = torch.randn(n, n, device=device, dtype=PRECISION_DTYPE[name], generator=gen)
        b = torch.randn(n, n, device=device, dtype=PRECISION_DTYPE[name], generator=gen)
        with tf32_matmuls(name == "tf32"):  # "fp32" is measured with TF32 off: true fp32 matmuls
            t = benchmark(functools.partial(torch.matmul, a, b), name=name, warmup=2,
                          min_run_time=min_run_time)
        flops[name] = 2 * n**3 / t.median_s
        del a, b
    src = torch.randn(copy_bytes // 4, device=device, generator=gen)
    dst = torch.empty_like(src)
    t = benchmark(lambda: dst.copy_(src), name="copy", warmup=2, min_run_time=min_run_time)
    return Roofline(device_name=device_name(device), matmul_flops=flops,
                    bandwidth=2 * copy_bytes / t.median_s, matmul_size=n, copy_bytes=copy_bytes)


# --- peak FLOP/s: the one place that picks the peak MFU is measured against ---------------------------

TFLOPS = 1e12

# Dense peak FLOP/s per precision ("fp16"/"bf16"/"fp8": tensor cores with fp32 accumulation, which is
# what mixed-precision training uses). Datasheets print the 2× "with sparsity" figures: they are halved
# back to dense here. Patterns are matched, in order, as whole words against the lower-case device name
# ("l4" is not "l40s"; "h100 nvl" and "h100 pcie" before "h100"). A precision a GPU has no units for
# is left out.
# Hopper's two dense tables (FLOP/s): SXM parts (H100 SXM5, H200) and NVL parts (H100 NVL per GPU, H200 NVL)
# H100 whitepaper / H200 datasheet, SXM: TF32 989, BF16/FP16 1,979, FP8 3,958 TFLOPS "with sparsity"
_HOPPER_SXM = dict(fp32=67.0 * TFLOPS, tf32=494.7 * TFLOPS, fp16=989.4 * TFLOPS, bf16=989.4 * TFLOPS,
                   fp8=1978.9 * TFLOPS)
# H100 NVL (per GPU) and H200 NVL datasheets: TF32 835, BF16/FP16 1,671, FP8 3,341 TFLOPS with sparsity
_HOPPER_NVL = dict(fp32=60.0 * TFLOPS, tf32=417.5 * TFLOPS, fp16=835.5 * TFLOPS, bf16=835.5 * TFLOPS,
                   fp8=1670.5 * TFLOPS)
GPU_PEAK_FLOPS: dict[str, dict[str, Any]] = {
    "h200 nvl": dict(_HOPPER_NVL, source="NVIDIA H200 NVL datasheet (dense = half the sparsity figures)"),
    "h200": dict(_HOPPER_SXM,
                 source="NVIDIA H200 Tensor Core GPU datasheet (SXM; dense = half the sparsity figures)"),
    "h100 nvl": dict(_HOPPER_NVL,
                     source="NVIDIA H100 NVL datasheet (per GPU; dense = half the sparsity figures)"),
    # H100 whitepaper, PCIe: TF32 378, BF16/FP16 756, FP8 1,513 TFLOPS dense
    "h100 pcie": dict(fp32=51.0 * TFLOPS, tf32=378.0 * TFLOPS, fp16=756.0 * TFLOPS, bf16=756.0 * TFLOPS,
                      fp8=1513.0 * TFLOPS,
                      source="NVIDIA H100 Tensor Core GPU datasheet (PCIe; dense figures)"),
    "h100": dict(_HOPPER_SXM,
                 source="NVIDIA H100 Tensor Core GPU datasheet (SXM; dense = half the sparsity figures)"),
    "a100": dict(fp32=19.5 * TFLOPS, tf32=156.0 * TFLOPS, fp16=312.0 * TFLOPS, bf16=312.0 * TFLOPS,
                 source="NVIDIA A100 Tensor Core GPU datasheet (dense figures)"),
    # L4 datasheet: FP8 485 TFLOPS with sparsity
    "l4": dict(fp32=30.3 * TFLOPS, tf32=60.0 * TFLOPS, fp16=121.0 * TFLOPS, bf16=121.0 * TFLOPS,
               fp8=242.5 * TFLOPS,
               source="NVIDIA L4 Tensor Core GPU datasheet (dense = half the sparsity figures)"),
    "a10": dict(fp32=31.2 * TFLOPS, tf32=62.5 * TFLOPS, fp16=125.0 * TFLOPS, bf16=125.0 * TFLOPS,
                source="NVIDIA A10 Tensor Core GPU datasheet (dense figures)"),
    "t4": dict(fp32=8.1 * TFLOPS, fp16=65.0 * TFLOPS,  # Turing: no TF32, no bf16 units
               source="NVIDIA T4 Tensor Core GPU datasheet (mixed-precision FP16/FP32 figure)"),
    "v100": dict(fp32=15.7 * TFLOPS, fp16=125.0 * TFLOPS,  # Volta: no TF32, no bf16 units
                 source="NVIDIA V100 Tensor Core GPU datasheet (SXM2)"),
    # Ada whitepaper, RTX 4090: FP8 tensor with FP32 accumulate 330.3 dense
    "rtx 4090": dict(fp32=82.6 * TFLOPS, tf32=82.6 * TFLOPS, fp16=165.2 * TFLOPS, bf16=165.2 * TFLOPS,
                     fp8=330.3 * TFLOPS,
                     source="NVIDIA Ada GPU architecture whitepaper, appendix table for the RTX 4090 "
                            "(tensor with FP32 accumulate, dense)"),
    "rtx 3090": dict(fp32=35.6 * TFLOPS, tf32=35.6 * TFLOPS, fp16=71.0 * TFLOPS, bf16=71.0 * TFLOPS,
                     source="NVIDIA Ampere GA102 GPU architecture whitepaper, table for the RTX 3090 "
                            "(FP16/BF16 tensor with FP32 accumulate, dense)"),
}
PEAK_PRECISIONS = tuple(PRECISION_DTYPE)  # helpers.precision's names: the training precisions and fp8


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
    measured `roofline`, else (with `measure`) a roofline measured now, else None.

    `gpu_name` looks a GPU up in the datasheet table without having it ("NVIDIA H100 80GB HBM3").
    "tf32" on hardware without TF32 units (a CPU, a pre-Ampere GPU) runs fp32 matmuls: fp32's peak."""
    if precision not in PEAK_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: use one of {PEAK_PRECISIONS}")
    if roofline is not None and not isinstance(roofline, Roofline):
        raise TypeError(f"roofline must be a helpers.roofline.Roofline (from measure_roofline), "
                        f"got {type(roofline).__name__}")
    dev = get_device(str(device) if device is not None else ("cuda" if gpu_name is None and
                                                             torch.cuda.is_available() else "cpu"))
    name = gpu_name or (torch.cuda.get_device_name(dev) if dev.type == "cuda" else None)
    if name:
        low = name.lower()
        for pattern, row in GPU_PEAK_FLOPS.items():
            if re.search(rf"\b{re.escape(pattern)}\b", low):
                if precision in row:
                    return PeakFlops(row[precision], precision, row["source"])
                if precision == "tf32" and "fp32" in row:  # no TF32 units: tf32 runs as fp32
                    return PeakFlops(row["fp32"], "fp32", row["source"] + "; no TF32 units: the fp32 peak")
                break  # a known GPU without units for this precision: try the measurement
    no_tf32 = gpu_name is None and not _has_tf32_units(dev)
    key = "fp32" if precision == "tf32" and no_tf32 else precision
    if roofline is None and measure and key in PRECISIONS:
        roofline = measure_roofline(dev, precisions=[key])
    if roofline is not None:
        measured = roofline.matmul_flops
        if precision in measured:
            key = precision
        if measured.get(key):
            note = "" if key == precision else "; no TF32 units: the fp32 matmul"
            return PeakFlops(float(measured[key]), key,
                             f"measured matmul roofline on {roofline.device_name}{note}")
    return None


MFU_PRECISIONS = ("fp32", "bf16")  # the dense rates MFU's one peak is chosen from (TF32, fp16: never faster)


def mfu_peak(device: torch.device | str | None = None, *, roofline: Roofline | None = None,
             measure: bool = False) -> PeakFlops | None:
    """The one peak every MFU in the course divides by (lessons 02, 08): the device's fastest dense rate
    among the training precisions, FP8 aside. A GPU's datasheet bf16 peak; on a CPU the faster of the
    fp32 and bf16 matmul rooflines (`roofline`, or with `measure` measured now: same threads, same load),
    so that a CPU with bf16 units never shows an MFU above 100 %. None when no peak is known."""
    peaks = (peak_flops(device, name, roofline=roofline, measure=measure) for name in MFU_PRECISIONS)
    found = [p for p in peaks if p is not None]
    return max(found, key=lambda p: p.flops) if found else None
