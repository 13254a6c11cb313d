"""The GPU classes learners have, as torch reports them, with the facts a plan needs (lesson 09).

One row per class: the name `torch.cuda.get_device_name()` gives, the compute capability, the memory torch
reports (`get_device_properties().total_memory`: a little under the marketing figure, the driver keeps some),
the SM count, the L2 cache, and the memory bandwidth with the datasheet it comes from. The dense peak FLOP/s
per precision are not repeated here: `GPU.peaks` looks the name up in
`helpers.measure.roofline.GPU_PEAK_FLOPS`, the
course's one datasheet table.

The figures torch reports are rounded: exact to the byte they are not, and no decision may depend on the last
megabyte. tests/fakegpu.py makes `torch.cuda` report these classes on a CPU; `helpers.plan.planner` plans a
run on them; docs/gpus.md lists what each lesson does on them.

    from helpers.measure.gpus import GPUS, gpu
    gpu("A100-80").bandwidth / 1e12      # 2.039 TB/s, NVIDIA's A100 datasheet
    gpu("T4").peaks.flops["fp16"]         # 65e12 FLOP/s, helpers.measure.roofline's table
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from helpers.measure.roofline import DatasheetPeaks, datasheet_peaks

__all__ = ["GPU", "GPUS", "gpu", "GiB"]

GiB = 2**30
GB_S = 1e9  # datasheets give bandwidth in GB/s or TB/s: decimal


@dataclass(frozen=True)
class GPU:
    """One GPU class as torch sees it, with its memory bandwidth from the datasheet (lesson 09)."""

    key: str  # the course's short name: "T4", "A100-80"
    name: str  # torch.cuda.get_device_name(), which is nvidia-smi's name
    capability: tuple[int, int]
    total_memory: int  # bytes, torch.cuda.get_device_properties().total_memory
    sms: int  # multi_processor_count
    l2_bytes: int
    bandwidth: float  # bytes/s of the memory, the datasheet's figure (decimal GB/s)
    bandwidth_source: str
    count: int = 1  # GPUs in the box

    @property
    def peaks(self) -> DatasheetPeaks | None:
        """Dense peak FLOP/s per precision (helpers.measure.roofline's datasheet table), or None (lesson
        09)."""
        return datasheet_peaks(self.name)

    def with_count(self, count: int) -> GPU:
        """The same class, `count` GPUs in the box."""
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"count must be a positive number of GPUs, got {count!r}")
        return replace(self, count=count)


_T4 = "NVIDIA T4 Tensor Core GPU datasheet (GPU memory bandwidth 320+ GB/s)"
_V100 = "NVIDIA V100 Tensor Core GPU datasheet (V100 SXM2: memory bandwidth 900 GB/s)"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet (A100 40GB SXM 1,555 GB/s; A100 80GB SXM 2,039 GB/s)"

GPUS: dict[str, GPU] = {g.key: g for g in (
    GPU("T4", "Tesla T4", (7, 5), int(14.75 * GiB), 40, 4 * 2**20, 320 * GB_S, _T4),  # Colab / Kaggle free
    GPU("2xT4", "Tesla T4", (7, 5), int(14.75 * GiB), 40, 4 * 2**20, 320 * GB_S, _T4, count=2),  # Kaggle
    GPU("V100-16", "Tesla V100-SXM2-16GB", (7, 0), int(15.77 * GiB), 80, 6 * 2**20, 900 * GB_S, _V100),
    GPU("RTX3090", "NVIDIA GeForce RTX 3090", (8, 6), int(23.69 * GiB), 82, 6 * 2**20, 936 * GB_S,
        "NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090 column (memory bandwidth 936 GB/s)"),
    GPU("RTX4090", "NVIDIA GeForce RTX 4090", (8, 9), int(23.65 * GiB), 128, 72 * 2**20, 1008 * GB_S,
        "NVIDIA Ada GPU architecture whitepaper, RTX 4090 (memory bandwidth 1,008 GB/s)"),
    GPU("L4", "NVIDIA L4", (8, 9), int(22.05 * GiB), 58, 48 * 2**20, 300 * GB_S,
        "NVIDIA L4 Tensor Core GPU datasheet (GPU memory bandwidth 300 GB/s)"),
    GPU("A100-40", "NVIDIA A100-SXM4-40GB", (8, 0), int(39.39 * GiB), 108, 40 * 2**20, 1555 * GB_S, _A100),
    GPU("A100-80", "NVIDIA A100-SXM4-80GB", (8, 0), int(79.15 * GiB), 108, 40 * 2**20, 2039 * GB_S, _A100),
    GPU("H100", "NVIDIA H100 80GB HBM3", (9, 0), int(79.11 * GiB), 132, 50 * 2**20, 3350 * GB_S,
        "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: GPU memory bandwidth 3.35 TB/s)"),
    GPU("H200", "NVIDIA H200", (9, 0), int(139.8 * GiB), 132, 60 * 2**20, 4800 * GB_S,
        "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: GPU memory bandwidth 4.8 TB/s)"),
)}


def gpu(key: str | GPU) -> GPU:
    """The class named `key` (a key of GPUS), or `key` itself when it is a GPU already (lesson 09)."""
    if isinstance(key, GPU):
        return key
    if key not in GPUS:
        raise ValueError(f"unknown GPU class {key!r}: use one of {', '.join(GPUS)}, or build a "
                         "helpers.measure.gpus.GPU for another board")
    return GPUS[key]
