"""A faked CUDA GPU for the tests: `torch.cuda` reports a named GPU class, on a CPU-only machine.

    from fakegpu import GPU_CLASSES, fake_gpu   # tests/ is on sys.path under pytest

    def test_something(monkeypatch):
        fake_gpu(monkeypatch, "T4")             # torch.cuda.is_available() is True from here on
        ...
        fake_gpu(monkeypatch, ("A100-40", "T4"))  # a mixed box: cuda:0 an A100, cuda:1 a T4

What is faked is what the course's *decisions* read: availability, device count, name, compute capability,
`get_device_properties` (total memory, SM count, L2 cache), `is_bf16_supported` (with its emulation
argument, as torch answers it: native bf16 from compute capability 8.0; emulation on anything CUDA),
`mem_get_info`, `current_device` and `torch.version.cuda`. Nothing can be allocated on the fake device: a
tensor on "cuda" still fails (this torch has no CUDA), so decision code that allocates is caught.

The figures are what each board reports to torch (name string, capability, SMs, L2) and its memory as torch
reports it (a little under the marketing figure: the driver keeps some), from `helpers.measure.gpus.GPUS`.
They are
rounded: exact to the byte they are not, and no test may depend on the last megabyte.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest
import torch

from helpers.measure.gpus import GPUS

__all__ = ["GPUClass", "GPU_CLASSES", "fake_gpu", "gpu_class"]



@dataclass(frozen=True)
class GPUClass:
    """One GPU class as torch sees it."""

    key: str
    name: str  # torch.cuda.get_device_name(), which is nvidia-smi's name
    capability: tuple[int, int]
    total_memory: int  # bytes, torch.cuda.get_device_properties().total_memory
    sms: int  # multi_processor_count
    l2_bytes: int
    count: int = 1  # GPUs in the box
    cuda: str = "12.6"  # torch.version.cuda of the build the box runs


# The classes' facts live in helpers/measure/gpus.py (one home: the planner of lesson 09 reads them too); here
# each
# becomes what a test fakes, with the CUDA version of the torch build its box runs.
_CUDA = {"H200": "13.0"}  # the reference H200 box runs a CUDA 13 build; the others 12.6
GPU_CLASSES: dict[str, GPUClass] = {
    g.key: GPUClass(g.key, g.name, g.capability, g.total_memory, g.sms, g.l2_bytes, count=g.count,
                    cuda=_CUDA.get(g.key, "12.6"))
    for g in GPUS.values()}


def gpu_class(key: str, **changes: object) -> GPUClass:
    """The named class, with `changes` (e.g. `count=4`) applied."""
    if key not in GPU_CLASSES:
        raise ValueError(f"unknown GPU class {key!r}: use one of {', '.join(GPU_CLASSES)}")
    return replace(GPU_CLASSES[key], **changes)


def _index(device: object = None) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"Expected a cuda device, but got: {device}")
    return device.index or 0


def fake_gpu(monkeypatch: pytest.MonkeyPatch, gpu: str | GPUClass | tuple[str | GPUClass, ...]) -> GPUClass:
    """Make `torch.cuda` report `gpu` (a key of GPU_CLASSES or a GPUClass; a tuple of them is a mixed box,
    one GPU each, cuda:0 first) until the test ends; returns the class of cuda:0."""
    if isinstance(gpu, tuple):
        board = tuple(gpu_class(g) if isinstance(g, str) else g for g in gpu)
        if not board:
            raise ValueError("a mixed box needs at least one GPU class")
    else:
        g = gpu_class(gpu) if isinstance(gpu, str) else gpu
        board = (g,) * g.count
    g = board[0]

    def checked(device: object = None) -> GPUClass:
        i = _index(device)
        if not 0 <= i < len(board):
            raise RuntimeError(f"CUDA error: invalid device ordinal {i} (the fake box has {len(board)})")
        return board[i]

    def properties(device: object = None) -> SimpleNamespace:
        d = checked(device)
        return SimpleNamespace(name=d.name, major=d.capability[0], minor=d.capability[1],
                               total_memory=d.total_memory, multi_processor_count=d.sms,
                               L2_cache_size=d.l2_bytes, is_integrated=0, is_multi_gpu_board=0)

    def bf16(including_emulation: bool = True) -> bool:  # torch asks the *current* device: cuda:0
        return g.capability >= (8, 0) or including_emulation

    def memory(device: object = None) -> tuple[int, int]:
        d = checked(device)
        return d.total_memory - 400 * 2**20, d.total_memory  # (free, total): less the CUDA context, roughly

    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: len(board))
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda, "get_device_name", lambda device=None: checked(device).name)
    monkeypatch.setattr(cuda, "get_device_capability", lambda device=None: checked(device).capability)
    monkeypatch.setattr(cuda, "get_device_properties", properties)
    monkeypatch.setattr(cuda, "is_bf16_supported", bf16)
    monkeypatch.setattr(cuda, "mem_get_info", memory)
    # no CUDA graph is ever captured on it (optimizers ask; a CUDA build of torch would ask the real driver)
    monkeypatch.setattr(cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", g.cuda)
    return g
