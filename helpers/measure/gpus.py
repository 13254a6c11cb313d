"""The course's one table of GPU facts: each board's dense peak FLOP/s, memory, bandwidth, SMs and links, each
figure with its datasheet (lessons 00, 09, 10). `seen_as` makes `torch.cuda` report a board you do not have.
Guide: docs/library/measure.md#helpersmeasuregpus"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from types import SimpleNamespace
from unittest import mock

import torch

from helpers.core.units import GiB

__all__ = ["Link", "GPU", "GPU_TABLE", "GPUS", "gpu", "normalise_gpu_name", "gpu_named", "seen_as",
           "PEAK_PRECISIONS", "BETWEEN_NODES"]

GB = 1e9  # datasheets give bandwidth in decimal GB/s or TB/s
TFLOPS = 1e12
PEAK_PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8")


@dataclass(frozen=True)
class Link:
    """How one GPU talks to the others in its box: bytes/s each way, its kind, its source (lesson 10)."""

    bandwidth: float  # bytes/s in each direction (datasheets print both directions added: halved here)
    kind: str  # "NVLink 4", "PCIe 4.0 x16"
    source: str


# Between nodes: a parameter, not a fact of any board. 400 Gb/s InfiniBand NDR per GPU (one NIC per GPU, as in
# NVIDIA's DGX H100 reference design) is 50 GB/s each way.
BETWEEN_NODES = Link(50 * GB, "InfiniBand NDR 400 Gb/s per GPU (a parameter)",
                     "NVIDIA DGX H100 user guide: eight 400 Gb/s ConnectX-7 ports, one per GPU")


@dataclass(frozen=True)
class GPU:
    """One board: its dense peaks and, for boards a plan runs on, torch's figures (lessons 00, 09, 10)."""

    key: str  # the course's short name: "T4", "A100-80"
    name: str  # torch.cuda.get_device_name() (nvidia-smi's name)
    names: str  # a regex over the WHOLE normalised nvidia-smi name (`normalise_gpu_name`) this row answers to
    peaks: Mapping[str, float]  # precision -> dense FLOP/s; a precision without units is absent
    peaks_source: str
    capability: tuple[int, int] | None = None
    total_memory: int | None = None  # bytes torch reports (under the marketing figure); None: not seen yet
    sms: int | None = None
    l2_bytes: int | None = None
    bandwidth: float | None = None  # bytes/s of the memory, the datasheet's (decimal) figure
    bandwidth_source: str = ""
    link: Link | None = None  # to the other GPUs of its box
    host_link: Link | None = None  # to the CPU's memory (offloaded optimizer state travels over it)
    count: int = 1  # GPUs in the box

    def __post_init__(self) -> None:
        bad = set(self.peaks) - set(PEAK_PRECISIONS)
        if bad:
            raise ValueError(f"{self.key}: unknown precision(s) {sorted(bad)}: use {PEAK_PRECISIONS}")

    def __hash__(self) -> int:  # a board is its key and count (its peaks are a dict: not hashable)
        return hash((self.key, self.count))

    @property
    def plannable(self) -> bool:
        """Whether the table holds what a plan needs: memory, SMs, L2, bandwidth and capability."""
        return None not in (self.total_memory, self.sms, self.l2_bytes, self.bandwidth, self.capability,
                            self.link, self.host_link)

    def with_count(self, count: int) -> GPU:
        """The same board, `count` of them in the box ("2xT4") (lessons 09, 10)."""
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be a positive number of GPUs, got {count!r}")
        base = self.key.split("x", 1)[1] if re.match(r"^\d+x", self.key) else self.key
        return replace(self, key=base if count == 1 else f"{count}x{base}", count=count)


def _peaks(fp32: float, tf32: float | None = None, fp16: float | None = None, bf16: float | None = None,
           fp8: float | None = None) -> dict[str, float]:
    given = dict(fp32=fp32, tf32=tf32, fp16=fp16, bf16=bf16, fp8=fp8)
    return {k: v * TFLOPS for k, v in given.items() if v is not None}


# Dense peaks ("fp16"/"bf16"/"fp8": tensor cores with fp32 accumulation, what mixed precision uses; "fp32":
# the CUDA cores; "tf32": TF32 tensor cores). Datasheets print 2x "with sparsity" figures from Ampere on:
# halved here. GeForce boards: the whitepapers' "with FP32 accumulate" rows. Each row matches exact
# nvidia-smi names.
HALVED = "dense = half the 'with sparsity' figures"
FP32_ACC = "tensor with FP32 accumulate, dense"
_T4 = "NVIDIA T4 Tensor Core GPU datasheet"
_V100 = "NVIDIA V100 Tensor Core GPU datasheet"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet"
_GA102 = "NVIDIA Ampere GA102 GPU architecture whitepaper"
_ADA = "NVIDIA Ada GPU architecture whitepaper"
_BUS = "the board's datasheet names the bus"
_PCIE3 = Link(16 * GB, "PCIe 3.0 x16", f"PCIe 3.0 x16: 32 GB/s both ways ({_BUS})")
_PCIE4 = Link(32 * GB, "PCIe 4.0 x16", f"PCIe 4.0 x16: 64 GB/s both ways ({_BUS})")
_PCIE5 = Link(64 * GB, "PCIe 5.0 x16", f"PCIe 5.0 x16: 128 GB/s both ways ({_BUS})")
_NVLINK2 = Link(150 * GB, "NVLink 2", f"{_V100} (V100 SXM2: NVLink 300 GB/s both ways)")
_NVLINK3 = Link(300 * GB, "NVLink 3", f"{_A100} (SXM: NVLink 600 GB/s both ways)")
_NVLINK4 = Link(450 * GB, "NVLink 4", f"{_H100} / {_H200} (SXM: NVLink 900 GB/s both ways)")

_ROWS = (
    GPU("T4", "Tesla T4", r"t4", _peaks(8.1, fp16=65.0),  # Turing: no TF32, no bf16 units
        f"{_T4} (FP32 8.1; mixed-precision FP16/FP32 65 TFLOPS)", (7, 5), int(14.75 * GiB), 40, 4 * 2**20,
        320 * GB, f"{_T4} (GPU memory bandwidth 320+ GB/s)", _PCIE3, _PCIE3),
    GPU("V100-16", "Tesla V100-SXM2-16GB", r"v100 sxm2 16gb", _peaks(15.7, fp16=125.0),  # Volta: no TF32/bf16
        f"{_V100} (V100 SXM2: FP32 15.7, tensor 125 TFLOPS)", (7, 0), int(15.77 * GiB), 80, 6 * 2**20,
        900 * GB, f"{_V100} (V100 SXM2: memory bandwidth 900 GB/s)", _NVLINK2, _PCIE3),
    GPU("V100-32", "Tesla V100-SXM2-32GB", r"v100 sxm2 32gb", _peaks(15.7, fp16=125.0),
        f"{_V100} (V100 SXM2: FP32 15.7, tensor 125 TFLOPS)"),
    GPU("V100-PCIe", "Tesla V100-PCIE-16GB", r"v100 pcie (16|32)gb", _peaks(14.0, fp16=112.0),
        f"{_V100} (V100 PCIe: FP32 14, tensor 112 TFLOPS)"),
    GPU("RTX3090", "NVIDIA GeForce RTX 3090", r"rtx 3090", _peaks(35.6, 35.6, 71.0, 71.0),
        f"{_GA102}, RTX 3090 column ({FP32_ACC})", (8, 6), int(23.69 * GiB), 82, 6 * 2**20, 936 * GB,
        f"{_GA102}, RTX 3090 column (memory bandwidth 936 GB/s)", _PCIE4, _PCIE4),
    GPU("RTX3090Ti", "NVIDIA GeForce RTX 3090 Ti", r"rtx 3090 ti", _peaks(40.0, 40.0, 80.0, 80.0),
        "derived: the GA102 whitepaper's per-SM rates (FP32 256, FP16/BF16 tensor with FP32 accumulate 512 "
        "FLOP per clock per SM) x the RTX 3090 Ti's 84 SMs at its 1,860 MHz boost clock (NVIDIA's product "
        "page)"),
    GPU("RTXA6000", "NVIDIA RTX A6000", r"rtx a6000", _peaks(38.7, 77.4, 154.8, 154.8),
        f"{_GA102}, RTX A6000 column ({FP32_ACC}; the datasheet's 309.7 TFLOPS is with sparsity)"),
    GPU("A10", "NVIDIA A10", r"a10", _peaks(31.2, 62.5, 125.0, 125.0),
        f"NVIDIA A10 Tensor Core GPU datasheet ({HALVED})"),
    GPU("A10G", "NVIDIA A10G", r"a10g", _peaks(35.0, 35.0, 70.0, 70.0),
        "NVIDIA publishes no A10G datasheet: Baseten's A10 vs A10G spec table (FP32 35, TF32 35, FP16/BF16 "
        "70 TFLOPS dense), which is GA102's per-SM rates x 80 SMs at 1,710 MHz"),
    GPU("A100-40", "NVIDIA A100-SXM4-40GB", r"a100 sxm4 40gb", _peaks(19.5, 156.0, 312.0, 312.0),
        f"{_A100} ({HALVED})", (8, 0), int(39.39 * GiB), 108, 40 * 2**20, 1555 * GB,
        f"{_A100} (A100 40GB SXM 1,555 GB/s)", _NVLINK3, _PCIE4),
    GPU("A100-80", "NVIDIA A100-SXM4-80GB", r"a100 sxm4 80gb", _peaks(19.5, 156.0, 312.0, 312.0),
        f"{_A100} ({HALVED})", (8, 0), int(79.15 * GiB), 108, 40 * 2**20, 2039 * GB,
        f"{_A100} (A100 80GB SXM 2,039 GB/s)", _NVLINK3, _PCIE4),
    GPU("A100-PCIe", "NVIDIA A100-PCIE-40GB", r"a100 pcie (40|80)gb|a100 80gb pcie",
        _peaks(19.5, 156.0, 312.0, 312.0), f"{_A100} (PCIe: the SXM's dense figures; {HALVED})"),
    GPU("RTX4090", "NVIDIA GeForce RTX 4090", r"rtx 4090", _peaks(82.6, 82.6, 165.2, 165.2, 330.3),
        f"{_ADA}, appendix table for the RTX 4090 ({FP32_ACC})", (8, 9), int(23.65 * GiB), 128, 72 * 2**20,
        1008 * GB, f"{_ADA}, RTX 4090 (memory bandwidth 1,008 GB/s)", _PCIE4, _PCIE4),
    GPU("RTX4090-Laptop", "NVIDIA GeForce RTX 4090 Laptop GPU", r"rtx 4090 laptop gpu",
        _peaks(39.7, 39.7, 79.4, 79.4, 158.8),
        "derived, an upper bound: the Ada whitepaper's per-SM rates (FP32 256, FP16/BF16 tensor with FP32 "
        "accumulate 512, FP8 1,024 FLOP per clock per SM) x the laptop GPU's 76 SMs at its highest listed "
        "boost clock, 2,040 MHz (NVIDIA's laptop spec page; the clock a laptop reaches depends on its power "
        "limit)"),
    GPU("L4", "NVIDIA L4", r"l4", _peaks(30.3, 60.0, 121.0, 121.0, 242.5),
        f"NVIDIA L4 Tensor Core GPU datasheet ({HALVED})", (8, 9), int(22.05 * GiB), 58, 48 * 2**20, 300 * GB,
        "NVIDIA L4 Tensor Core GPU datasheet (GPU memory bandwidth 300 GB/s)", _PCIE4, _PCIE4),
    GPU("L40S", "NVIDIA L40S", r"l40s", _peaks(91.6, 183.0, 366.5, 366.5, 733.0),
        f"NVIDIA L40S GPU datasheet ({HALVED})"),
    GPU("H100", "NVIDIA H100 80GB HBM3", r"h100 (80gb hbm3|sxm5 80gb)",
        _peaks(67.0, 494.7, 989.4, 989.4, 1978.9),
        f"{_H100}, H100 SXM ({HALVED})", (9, 0), int(79.11 * GiB), 132, 50 * 2**20, 3350 * GB,
        f"{_H100} (H100 SXM: GPU memory bandwidth 3.35 TB/s)", _NVLINK4, _PCIE5),
    GPU("H100-PCIe", "NVIDIA H100 PCIe", r"h100 pcie", _peaks(51.0, 378.0, 756.0, 756.0, 1513.0),
        f"{_H100}, H100 PCIe ({HALVED})"),
    GPU("H100-NVL", "NVIDIA H100 NVL", r"h100 nvl", _peaks(60.0, 417.5, 835.5, 835.5, 1670.5),
        f"NVIDIA H100 NVL datasheet, per GPU ({HALVED})"),
    GPU("H200", "NVIDIA H200", r"h200", _peaks(67.0, 494.7, 989.4, 989.4, 1978.9),
        f"{_H200}, H200 SXM ({HALVED})", (9, 0), int(139.8 * GiB), 132, 60 * 2**20, 4800 * GB,
        f"{_H200} (H200 SXM: GPU memory bandwidth 4.8 TB/s)", _NVLINK4, _PCIE5),
    GPU("H200-NVL", "NVIDIA H200 NVL", r"h200 nvl", _peaks(60.0, 417.5, 835.5, 835.5, 1670.5),
        f"{_H200}, H200 NVL ({HALVED})"),
    GPU("GH200", "NVIDIA GH200 480GB", r"gh200( \S+)*", _peaks(67.0, 494.7, 989.4, 989.4, 1978.9),
        f"NVIDIA GH200 Grace Hopper Superchip datasheet, the GPU's figures ({HALVED})"),
    GPU("B200", "NVIDIA B200", r"b200", _peaks(75.0, 1100.0, 2250.0, 2250.0, 4500.0),
        f"NVIDIA HGX B200 datasheet, per GPU at 1,000 W ({HALVED})"),
    GPU("RTX5090", "NVIDIA GeForce RTX 5090", r"rtx 5090", _peaks(104.8, 104.8, 209.5, 209.5, 419.0),
        f"NVIDIA RTX Blackwell GPU architecture whitepaper, RTX 5090 column ({FP32_ACC})"),
)
GPU_TABLE: dict[str, GPU] = {g.key: g for g in _ROWS}
# the classes a plan runs on by default (and tests/fakegpu.py fakes): the boards learners have, free to large
_CLASSES = ("T4", "2xT4", "V100-16", "RTX3090", "RTX4090", "L4", "A100-40", "A100-80", "H100", "H200")
GPUS: dict[str, GPU] = {k: GPU_TABLE["T4"].with_count(2) if k == "2xT4" else GPU_TABLE[k] for k in _CLASSES}


def gpu(key: str | GPU) -> GPU:
    """The board named `key` ("T4", "A100-80"; "8xH100" for a box of 8), or `key` itself (lessons 09, 10)."""
    if isinstance(key, GPU):
        return key
    count, _, base = key.partition("x") if re.match(r"^\d+x", key) else ("1", "", key)
    if base not in GPU_TABLE:
        raise ValueError(f"unknown GPU class {key!r}: use one of {', '.join(GPU_TABLE)} (a box of N: "
                         f"'NxH100'), "
                         "or build a helpers.measure.gpus.GPU for another board")
    return GPU_TABLE[base].with_count(int(count)) if int(count) > 1 else GPU_TABLE[base]


_DROPPED_WORDS = ("nvidia", "geforce", "tesla")  # vendor and brand words: "Tesla T4" is a "t4"


def normalise_gpu_name(name: str) -> str:
    """nvidia-smi's name, lower case, '-' and '_' as spaces, without "NVIDIA", "GeForce" and "Tesla":
    "NVIDIA A100-SXM4-80GB" -> "a100 sxm4 80gb" (lesson 00)."""
    words = re.sub(r"[-_\s]+", " ", name.lower()).split()
    return " ".join(w for w in words if w not in _DROPPED_WORDS)


def gpu_named(name: str) -> GPU | None:
    """The row whose names match all of `name` (an nvidia-smi name), or None: an unknown GPU, a laptop or Ti
    variant without its own row, a MIG slice (lesson 00)."""
    key = normalise_gpu_name(name)
    found = [g for g in _ROWS if re.fullmatch(g.names, key)]
    assert len(found) <= 1, f"{name!r} matches several rows of the GPU table: {[g.key for g in found]}"
    return found[0] if found else None


@contextlib.contextmanager
def seen_as(g: str | GPU) -> Iterator[GPU]:
    """Inside the block `torch.cuda` reports the board `g`, so the course's rules answer for it; nothing can
    be allocated on it (lessons 09, 10)."""
    g = gpu(g)
    if not g.plannable:
        raise ValueError(f"{g.key}: the table lacks what torch would report (memory, SMs, L2, capability)")
    props = SimpleNamespace(name=g.name, major=g.capability[0], minor=g.capability[1],
                            total_memory=g.total_memory, multi_processor_count=g.sms,
                            L2_cache_size=g.l2_bytes, is_integrated=0, is_multi_gpu_board=0)
    with mock.patch.multiple(
            torch.cuda, is_available=lambda: True, device_count=lambda: g.count, current_device=lambda: 0,
            get_device_name=lambda device=None: g.name,
            get_device_capability=lambda device=None: g.capability,
            get_device_properties=lambda device=None: props,
            is_bf16_supported=lambda including_emulation=True: g.capability >= (8, 0) or including_emulation):
        yield g
