"""Pick the device (`get_device`, every lesson), and report the environment: versions, the CPU's instruction
sets, each GPU and what it accelerates, the NVIDIA driver (lesson 00).
Guide: docs/library/core.md#helperscoredevice
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from helpers.core.compat import version_of
from helpers.core.tables import Table

__all__ = ["get_device", "DEVICE_ENV", "DeviceUnavailableError", "GPUInfo", "CPUInfo", "EnvironmentReport",
           "device_report", "device_name", "device_facts", "cpu_info", "nvidia_smi", "nvidia_driver",
           "driver_cuda_version", "last_level_cache_bytes", "LIBRARIES", "CORES_PER_SM"]

DEVICE_ENV = "COURSE_DEVICE"  # the device "auto" resolves to, when set ("mps" opts in on a Mac)
LIBRARIES = ("transformers", "triton")  # versions reported beside torch's (they change what lessons run)
# FP32 "CUDA cores" per SM, by compute capability (NVIDIA's CUDA C++ Programming Guide, table of
# arithmetic instruction throughput: 32-bit floating-point add/multiply per clock per SM).
CORES_PER_SM = {(7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128,
                (9, 0): 128, (10, 0): 128, (12, 0): 128}
MPS_NOTE = (f"get_device: this Mac's GPU (MPS) is available, but the course runs on the CPU here: MPS has no "
            f"peak-memory statistics, Triton or FlashAttention kernels, which the lessons use; set "
            f"{DEVICE_ENV}=mps to use it anyway")
_SAID: set[str] = set()  # notes already printed in this process


class DeviceUnavailableError(RuntimeError):
    """The requested device does not exist on this machine (lesson 00)."""


def _say_once(note: str) -> None:
    if note not in _SAID:
        _SAID.add(note)
        print(note)


def nvidia_smi(*args: str) -> str | None:
    """Output of `nvidia-smi args`, or None where it is missing or fails: no driver (lesson 00)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _auto() -> torch.device:
    chosen = os.environ.get(DEVICE_ENV, "").strip().lower()
    if chosen and chosen != "auto":
        try:
            return get_device(chosen)
        except ValueError as err:
            raise ValueError(f"{DEVICE_ENV}={chosen!r}: {err}; or unset {DEVICE_ENV}") from None
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        _say_once(MPS_NOTE)
    return torch.device("cpu")


def get_device(name: str = "auto") -> torch.device:
    """The torch device to use (lesson 00): "auto" is $COURSE_DEVICE, else cuda, else the CPU (also on a
    Mac: COURSE_DEVICE=mps opts in); other names as asked, checked."""
    name = (name or "auto").strip().lower()
    if name == "auto":
        return _auto()
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
                f"helpers.core.diagnosis.diagnose() (lesson 00) for the fix.")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceUnavailableError(f"{name} was requested but only {torch.cuda.device_count()} "
                                         f"GPU(s) are visible (CUDA_VISIBLE_DEVICES may hide some)")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceUnavailableError("MPS was requested but this is not an Apple-silicon Mac with MPS; "
                                     "use 'auto'")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"unsupported device type {dev.type!r}: use 'auto', 'cpu', 'cuda' or 'mps'")
    return dev


# --- what the hardware is ----------------------------------------------------------------------------

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
        """Which formats run on tensor cores: FP16 from 7.0, TF32/BF16 from 8.0, FP8 from 8.9."""
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


def cpu_info() -> CPUInfo:
    """The CPU's model and instruction sets, from /proc/cpuinfo on Linux (elsewhere: no flags) (lesson 00)."""
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


def device_facts(device: torch.device | str) -> dict[str, Any]:
    """What explains a speed-up on `device`: a GPU's capability, a CPU's bf16 units (lesson 08's ladder)."""
    device = torch.device(device)
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        return {"type": "cuda", "cap": cap, "name": torch.cuda.get_device_name(device)}
    cpu = cpu_info()
    return {"type": device.type, "cpu_capability": cpu.torch_capability,
            "amx": cpu.isa["AMX-BF16"], "avx512_bf16": cpu.isa["AVX512-BF16"]}


def _driver() -> tuple[str | None, str | None]:
    out = nvidia_smi()
    if not out:
        return None, None
    drv = re.search(r"Driver Version:\s*([\d.]+)", out)
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", out)
    return (drv.group(1) if drv else None), (cuda.group(1) if cuda else None)


def nvidia_driver() -> str | None:
    """The NVIDIA driver version nvidia-smi reports, or None without a driver (lesson 00)."""
    return _driver()[0]


def driver_cuda_version() -> str | None:
    """The newest CUDA version the NVIDIA driver supports (nvidia-smi's header), or None (lesson 00)."""
    return _driver()[1]


def device_name(device: torch.device | str | None = None) -> str:
    """The one name of a device in reports, rooflines and stamps: the GPU's, or the CPU model (lesson 00)."""
    dev = get_device(str(device) if device is not None else "auto")
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    model = cpu_info().model
    return f"{model} (MPS)" if dev.type == "mps" else model


# --- the environment report --------------------------------------------------------------------------

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
    libraries: dict[str, str | None] = field(default_factory=dict)  # LIBRARIES -> version (None: absent)

    def versions(self) -> Table:
        """Software versions as a table."""
        t = Table(["component", "version"], title="Software")
        for k, v in [("Python", self.python), ("platform", self.platform), ("torch", self.torch),
                     *self.libraries.items(),
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


def device_report() -> EnvironmentReport:
    """Versions and hardware (lesson 00; `course.results.stamp` reads its versions from here)."""
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
    driver, cuda = _driver()
    return EnvironmentReport(python=sys.version.split()[0], platform=platform.platform(),
                             torch=torch.__version__,
                             cuda_build=torch.version.cuda, cudnn=str(cudnn) if cudnn else None, nccl=nccl,
                             driver=driver, driver_cuda=cuda, cpu=cpu_info(), gpus=tuple(gpus),
                             libraries={name: version_of(name) for name in LIBRARIES})


def last_level_cache_bytes(device: torch.device | str = "cpu") -> int | None:
    """Bytes of the device's last-level cache (a GPU's L2, a CPU's largest), or None; a bandwidth test must
    move more (lesson 00)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).L2_cache_size or None
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
