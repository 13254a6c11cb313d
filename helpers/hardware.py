"""Pick the device, report the environment (versions, GPUs, CPU features), diagnose common breakage,
measure this machine's roofline (matmul throughput per precision, memory bandwidth), and pick the peak
FLOP/s that MFU is measured against: the datasheet for known GPUs, else the measured roofline.

Precision names are the course's one vocabulary: "fp32", "tf32", "fp16", "bf16", "fp8" (the format the
matmuls run in; "tf32" is fp32 storage with TF32 tensor-core matmuls).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from helpers.precision import PRECISION_DTYPE, PRECISIONS, tf32_matmuls
from helpers.tables import Table

__all__ = ["get_device", "DeviceUnavailableError", "GPUInfo", "CPUInfo", "EnvironmentReport",
           "device_report", "device_name", "nvidia_driver", "last_level_cache_bytes", "Roofline",
           "measure_roofline", "load_roofline",
           "GPU_PEAK_FLOPS", "PeakFlops", "peak_flops", "MFU_PRECISIONS", "mfu_peak", "device_facts",
           "Finding", "SetupFacts", "diagnose",
           "findings_table", "explain_error", "KNOWN_ERRORS"]

# FP32 "CUDA cores" per SM, by compute capability (NVIDIA's CUDA C++ Programming Guide, table of
# arithmetic instruction throughput: 32-bit floating-point add/multiply per clock per SM).
CORES_PER_SM = {(7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128,
                (9, 0): 128, (10, 0): 128, (12, 0): 128}


class DeviceUnavailableError(RuntimeError):
    """The requested device does not exist on this machine (lesson 00)."""


def _smi(*args: str) -> str | None:
    """Output of `nvidia-smi args`, or None where it is missing or fails (no driver)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def get_device(name: str = "auto") -> torch.device:
    """The torch device to use (lesson 00): "auto" picks cuda, then mps, then cpu; others as asked."""
    name = (name or "auto").strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = ("this torch is a CPU-only build" if torch.version.cuda is None
                   else "torch was built with CUDA but finds no usable GPU (driver missing or too old?)")
            raise DeviceUnavailableError(
                f"CUDA was requested but {why}; use device 'auto' or 'cpu' here, or run "
                f"helpers.hardware.diagnose() (lesson 00) for the fix.")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceUnavailableError(f"{name} was requested but only {torch.cuda.device_count()} "
                                         f"GPU(s) are visible (CUDA_VISIBLE_DEVICES may hide some)")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None)
                                    and torch.backends.mps.is_available()):
        raise DeviceUnavailableError("MPS was requested but this is not an Apple-silicon Mac with MPS; "
                                     "use 'auto'")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"unsupported device type {dev.type!r}: use 'auto', 'cpu', 'cuda' or 'mps'")
    return dev


# --- environment report ------------------------------------------------------------------------------

@dataclass(frozen=True)
class GPUInfo:
    """One CUDA device as torch sees it, with the number formats its hardware accelerates (lesson 00)."""

    index: int
    name: str
    capability: tuple[int, int]
    memory_gib: float  # total memory as the device reports it, GiB (2³⁰ bytes)
    sm_count: int

    @classmethod
    def from_properties(cls, index: int, props: Any) -> "GPUInfo":
        """From `torch.cuda.get_device_properties(index)`: what the device itself reports (lesson 00)."""
        return cls(index, props.name, (props.major, props.minor), props.total_memory / 2**30,
                   props.multi_processor_count)

    @property
    def cuda_cores(self) -> int | None:
        """SMs × FP32 cores per SM for the architecture (None for an architecture not in the table)."""
        per_sm = CORES_PER_SM.get(self.capability)
        return self.sm_count * per_sm if per_sm else None

    @property
    def accelerates(self) -> dict[str, bool]:
        """Which formats run on tensor cores: FP16 from Volta (7.0), TF32/BF16 from Ampere (8.0), FP8 from
        Ada/Hopper (8.9)."""
        cc = self.capability
        return {"FP16": cc >= (7, 0), "TF32": cc >= (8, 0), "BF16": cc >= (8, 0), "FP8": cc >= (8, 9)}


@dataclass(frozen=True)
class CPUInfo:
    """The host CPU: model, logical cores, and the vector/matrix instruction sets that matter (lesson 00)."""

    model: str
    cores: int
    torch_threads: int
    isa: dict[str, bool]  # AVX2, AVX-512, AVX512-BF16, AMX-BF16, AMX-FP16
    torch_capability: str  # what torch's CPU kernels dispatch to, e.g. "AVX512"


@dataclass(frozen=True)
class EnvironmentReport:
    """Versions and hardware, as a table in a notebook and as text in a terminal (lesson 00)."""

    python: str
    platform: str
    torch: str
    cuda_build: str | None  # CUDA version torch was built with (None: CPU-only build)
    cudnn: str | None
    nccl: str | None
    driver: str | None  # NVIDIA driver version, from nvidia-smi
    driver_cuda: str | None  # newest CUDA version the driver supports, from nvidia-smi
    cpu: CPUInfo
    gpus: tuple[GPUInfo, ...] = field(default=())

    def versions(self) -> Table:
        """Software versions as a table."""
        t = Table(["component", "version"], title="Software")
        for k, v in [("Python", self.python), ("platform", self.platform), ("torch", self.torch),
                     ("CUDA (torch built with)", self.cuda_build or "none (CPU-only build)"),
                     ("cuDNN", self.cudnn), ("NCCL", self.nccl), ("NVIDIA driver", self.driver),
                     ("CUDA (driver supports up to)", self.driver_cuda)]:
            t.add(k, v)
        return t

    def hardware(self) -> Table:
        """The CPU and each GPU, with what they accelerate, as a table."""
        t = Table(["device", "name", "compute capability", "memory GiB (device)", "SMs", "CUDA cores",
                   "accelerates"], title="Hardware")
        isa = ", ".join(k for k, v in self.cpu.isa.items() if v) or "none of AVX2/AVX-512/AMX"
        t.add("cpu", self.cpu.model, None, None, None, None,
              f"{self.cpu.cores} cores, {isa} (torch uses {self.cpu.torch_capability})")
        for g in self.gpus:
            acc = ", ".join(k for k, v in g.accelerates.items() if v) or "no tensor cores"
            t.add(f"cuda:{g.index}", g.name, f"{g.capability[0]}.{g.capability[1]}", round(g.memory_gib, 1),
                  g.sm_count, g.cuda_cores, acc)
        return t

    def to_markdown(self) -> str:
        return self.versions().to_markdown() + "\n\n" + self.hardware().to_markdown()

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def __str__(self) -> str:
        return f"{self.versions()}\n\n{self.hardware()}"


def _cpu_info() -> CPUInfo:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith(("flags", "Features")) and ":" in line:
                    flags = set(line.split(":", 1)[1].split())
                if model and flags:
                    break
    except OSError:  # not Linux: leave the flags empty
        pass
    isa = {"AVX2": "avx2" in flags, "AVX-512": "avx512f" in flags, "AVX512-BF16": "avx512_bf16" in flags,
           "AMX-BF16": "amx_bf16" in flags, "AMX-FP16": "amx_fp16" in flags}
    return CPUInfo(model=model, cores=os.cpu_count() or 1, torch_threads=torch.get_num_threads(), isa=isa,
                   torch_capability=torch.backends.cpu.get_cpu_capability())


def _driver() -> tuple[str | None, str | None]:
    out = _smi()
    if not out:
        return None, None
    drv = re.search(r"Driver Version:\s*([\d.]+)", out)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", out)
    return (drv.group(1) if drv else None), (cuda.group(1) if cuda else None)


def device_report() -> EnvironmentReport:
    """Versions (Python, torch, CUDA, cuDNN, NCCL, driver) and hardware (CPU features, GPUs) (lesson 00)."""
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            gpus.append(GPUInfo.from_properties(i, torch.cuda.get_device_properties(i)))
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    nccl = None
    if (torch.cuda.is_available() and torch.distributed.is_available()
            and torch.distributed.is_nccl_available()):
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    driver, driver_cuda = _driver()
    return EnvironmentReport(python=sys.version.split()[0], platform=platform.platform(),
                             torch=torch.__version__,
                             cuda_build=torch.version.cuda, cudnn=str(cudnn) if cudnn else None, nccl=nccl,
                             driver=driver, driver_cuda=driver_cuda, cpu=_cpu_info(), gpus=tuple(gpus))


def nvidia_driver() -> str | None:
    """The NVIDIA driver version nvidia-smi reports, or None without a driver (lesson 00)."""
    return _driver()[0]


def device_name(device: torch.device | str | None = None) -> str:
    """The one name of a device in reports, rooflines and stamps: the GPU's, or the CPU model (lesson 00)."""
    dev = get_device(str(device) if device is not None else "auto")
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    model = _cpu_info().model
    return f"{model} (MPS)" if dev.type == "mps" else model


def last_level_cache_bytes(device: torch.device | str = "cpu") -> int | None:
    """Size of the device's last-level cache in bytes: a GPU's L2, a CPU's largest cache (Linux sysfs,
    macOS sysctl); None where it cannot be read. A bandwidth test must move more than this (lesson 00)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", None) or None
    if dev.type not in ("cpu", "mps"):
        return None
    sizes = []
    for level in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):  # Linux: one folder per cache
        try:
            text = (level / "size").read_text().strip()  # "307200K"
        except OSError:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KMGkmg")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    if not sizes and sys.platform == "darwin":
        for key in ("hw.l3cachesize", "hw.l2cachesize"):
            try:
                out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            if out.strip().isdigit() and int(out) > 0:
                sizes.append(int(out))
                break
    return max(sizes) if sizes else None


# --- roofline ----------------------------------------------------------------------------------------

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
        raise TypeError(f"roofline must be a helpers.hardware.Roofline (from measure_roofline), "
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


def device_facts(device: torch.device | str) -> dict[str, Any]:
    """What explains a speed-up on `device` (lesson 08): a GPU's name and compute capability, or a CPU's
    instruction set and whether it has AMX / AVX512-BF16 bf16 units (Linux /proc/cpuinfo; else unknown)."""
    device = torch.device(device)
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        return {"type": "cuda", "cap": cap, "name": torch.cuda.get_device_name(device)}
    flags: set[str] = set()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        flags = {w for line in lines if line.startswith("flags") for w in line.split()}
    except OSError:
        pass
    return {"type": device.type, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "amx": "amx_bf16" in flags, "avx512_bf16": "avx512_bf16" in flags}


# --- diagnosing common breakage ----------------------------------------------------------------------

@dataclass(frozen=True)
class Finding:
    """One check of the set-up: what was checked, whether it is fine, what was seen, the fix (lesson 00)."""

    check: str
    ok: bool
    detail: str
    fix: str = ""


# (pattern in an error message, cause, fix): the breakages learners report most
KNOWN_ERRORS = [
    (r"Found no NVIDIA driver|NVIDIA driver on your system|no CUDA-capable device",
     "torch is a CUDA build but no working NVIDIA driver / GPU is visible",
     "on a GPU box install the NVIDIA driver (nvidia-smi must work); on a CPU box use the CPU build: "
     "COURSE_TORCH=cpu make setup"),
    (r"driver version is insufficient|NVIDIA driver on your system is too old"
     r"|CUDA driver version is insufficient",
     "the NVIDIA driver is older than the CUDA version torch was built with",
     "update the driver (it must support at least torch.version.cuda), or install a torch built for "
     "an older CUDA (pip install torch --index-url https://download.pytorch.org/whl/cu118, for example)"),
    (r"Torch not compiled with CUDA enabled",
     "a CPU-only torch build is installed",
     "on a GPU box install the CUDA build: COURSE_TORCH=cuda make setup"),
    (r"libcudart\.so[\d.]*: cannot open shared object file|libcudart",
     "a library expects the CUDA runtime (libcudart) from a system CUDA toolkit that is not on the "
     "loader's path (torch's own wheels ship theirs)",
     "install the package's CUDA-bundled wheel, or the CUDA toolkit matching it and add its lib64 "
     "folder to LD_LIBRARY_PATH; mixing a system CUDA with pip wheels of another version is the usual cause"),
    (r"CUDA out of memory|OutOfMemoryError",
     "the GPU ran out of memory",
     "smaller batch or sequence, mixed precision, activation checkpointing (lesson 03)"),
]


def explain_error(message: str) -> str | None:
    """The cause and fix of a known CUDA set-up error message, or None for an unknown one (lesson 00)."""
    for pattern, cause, fix in KNOWN_ERRORS:
        if re.search(pattern, message, flags=re.IGNORECASE):
            return f"{cause}. Fix: {fix}"
    return None


def _version_tuple(v: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v or "")[:2])


@dataclass(frozen=True)
class SetupFacts:
    """What `diagnose` looks at; `SetupFacts.gather()` reads them off this machine (lesson 00)."""

    torch_cuda: str | None  # torch.version.cuda: None for a CPU-only build
    torch_sees_gpu: bool  # torch.cuda.is_available()
    smi_gpus: list[str] | None  # lines of `nvidia-smi -L`; None when nvidia-smi is missing or fails
    driver_cuda: str | None  # "CUDA Version" in nvidia-smi's header
    visible_devices: str | None  # $CUDA_VISIBLE_DEVICES

    @classmethod
    def gather(cls) -> "SetupFacts":
        out = _smi("-L")
        return cls(torch_cuda=torch.version.cuda, torch_sees_gpu=torch.cuda.is_available(),
                   smi_gpus=None if out is None else [ln for ln in out.splitlines() if ln.startswith("GPU")],
                   driver_cuda=_driver()[1], visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))


def diagnose(facts: SetupFacts | None = None) -> list[Finding]:
    """Check the GPU set-up: what is broken and how to fix it (default: this machine's facts) (lesson 00)."""
    f = facts or SetupFacts.gather()
    torch_cuda, torch_sees_gpu, smi_gpus = f.torch_cuda, f.torch_sees_gpu, f.smi_gpus
    driver_cuda, visible_devices = f.driver_cuda, f.visible_devices
    findings = [Finding("torch build", True, f"torch {torch.__version__}, "
                        + (f"built with CUDA {torch_cuda}" if torch_cuda else "CPU-only build"))]
    has_gpu = bool(smi_gpus)
    findings.append(Finding("NVIDIA driver", True,
                            "nvidia-smi not found: no NVIDIA driver on this machine" if smi_gpus is None
                            else f"nvidia-smi lists {len(smi_gpus)} GPU(s), driver supports CUDA "
                                 f"{driver_cuda}"))
    if torch_cuda and smi_gpus is None:
        findings.append(Finding("CUDA build without a driver", False,
                                "torch is a CUDA build but there is no NVIDIA driver (nvidia-smi missing)",
                                "fine on a CPU box, but it is GBs of unused CUDA libraries: COURSE_TORCH=cpu "
                                "make setup installs the CPU build; on a GPU box install the NVIDIA driver"))
    if torch_cuda is None and has_gpu:
        findings.append(Finding("CPU-only torch on a GPU box", False,
                                "nvidia-smi sees a GPU but torch is a CPU-only build, so every lesson "
                                "runs on the CPU",
                                "COURSE_TORCH=cuda make setup (installs the CUDA build of torch)"))
    if torch_cuda and driver_cuda and _version_tuple(driver_cuda) < _version_tuple(torch_cuda):
        findings.append(Finding("driver too old for this torch", False,
                                f"torch needs CUDA {torch_cuda}; the driver supports up to CUDA "
                                f"{driver_cuda}",
                                "update the NVIDIA driver, or install a torch built for CUDA "
                                f"{driver_cuda} or older"))
    if visible_devices is not None and visible_devices.strip() in ("", "-1") and has_gpu:
        findings.append(Finding("GPUs hidden", False,
                                f"CUDA_VISIBLE_DEVICES={visible_devices!r} hides every GPU",
                                "unset CUDA_VISIBLE_DEVICES or list the GPU indices to use"))
    if torch_cuda and has_gpu and not torch_sees_gpu and all(f.ok for f in findings):
        findings.append(Finding("torch cannot use the GPU", False,
                                "torch is a CUDA build, the driver sees a GPU, but "
                                "torch.cuda.is_available() is False",
                                "run python -c 'import torch; torch.zeros(1).cuda()' and look the message up "
                                "with helpers.hardware.explain_error"))
    findings.append(Finding("torch can use a GPU", True, "yes" if torch_sees_gpu else
                            "no: the lessons run on the CPU with the smoke sizes"))
    return findings


def findings_table(findings: list[Finding]) -> Table:
    """Findings of `diagnose` as a table: check, status, what was seen, the fix (lesson 00)."""
    t = Table(["check", "status", "seen", "fix"], title="Diagnosis")
    for f in findings:
        t.add(f.check, "ok" if f.ok else "PROBLEM", f.detail, f.fix or None)
    return t
