"""Where training memory goes: peak-memory tracking, a training-memory estimator, allocator history.

Measuring peak memory of a block of code
----------------------------------------
- On a CUDA GPU: the caching allocator's own statistics. `torch.cuda.reset_peak_memory_stats()` before,
  `torch.cuda.max_memory_allocated()` after: the most bytes held by live tensors at any moment (the
  allocator may *reserve* more than that from the driver; `nvidia-smi` shows the reserved figure).
- On a CPU there are no such statistics, and the process's resident size (RSS) mixes tensors with
  Python, libraries and memory malloc has not returned. So the CPU method is the profiler's memory
  events: `torch.profiler.profile(profile_memory=True)` records every allocation and free made by
  PyTorch's CPU allocator, with its size and time. Summing them in time order gives the bytes held by
  tensors created inside the block, at every moment; its maximum is the peak *increase* over what was
  held when the block began. Tensors that already existed (weights, say) are invisible to it, so the
  caller passes their size as `baseline_bytes` (see `tensor_bytes`) to get an absolute peak.
  Cost: the profiler slows the block down; do not time a block while tracking its memory this way.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
from torch import nn

__all__ = ["MemoryReport", "track_peak_memory", "tensor_bytes", "GiB", "MiB"]

MiB = 2 ** 20
GiB = 2 ** 30


@dataclass
class MemoryReport:
    """Peak memory of one block of code, filled in when the block ends."""

    device: str
    method: str  # how it was measured (one line, shown in tables)
    peak_bytes: int = 0  # the most bytes held at any moment: baseline + peak increase
    peak_increase_bytes: int = 0  # above what was held when the block began
    end_increase_bytes: int = 0  # still held when the block ended, above the start

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / MiB


def tensor_bytes(*things: nn.Module | torch.optim.Optimizer | torch.Tensor | Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct tensor storages in modules (parameters, buffers, gradients), optimizers
    (their state) and tensors: what a training step starts with."""
    seen: set[int] = set()
    total = 0

    def add(t: object) -> None:
        nonlocal total
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen and storage.nbytes():
                seen.add(storage.data_ptr())
                total += storage.nbytes()

    for thing in things:
        if isinstance(thing, nn.Module):
            for p in thing.parameters():
                add(p)
                add(p.grad)
            for b in thing.buffers():
                add(b)
        elif isinstance(thing, torch.optim.Optimizer):
            for state in thing.state.values():
                for value in state.values():
                    add(value)
        elif isinstance(thing, torch.Tensor):
            add(thing)
        elif isinstance(thing, Iterable):
            for t in thing:
                add(t)
        else:
            raise ValueError(f"tensor_bytes takes modules, optimizers and tensors, got {type(thing).__name__}")
    return total


def _cpu_peak_from_events(events: Iterable) -> tuple[int, int]:
    """(peak, final) running sum of the profiler's CPU memory events, in time order."""
    deltas = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    current = peak = 0
    for _, nbytes in deltas:
        current += nbytes
        peak = max(peak, current)
    return peak, current


@contextlib.contextmanager
def track_peak_memory(device: torch.device | str = "cpu", *, baseline_bytes: int = 0) -> Iterator[MemoryReport]:
    """Measure the peak memory of the `with` block (CUDA allocator stats; on CPU profiler memory events).

    `baseline_bytes`: bytes already held when the block starts, added on CPU (on CUDA the allocator
    knows them). Yields a `MemoryReport` that is filled in when the block exits.
    """
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("track_peak_memory was asked for a CUDA device, but torch sees no GPU")
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        report = MemoryReport(str(device), "torch.cuda.max_memory_allocated (caching allocator stats)")
        yield report
        torch.cuda.synchronize(device)
        report.peak_bytes = torch.cuda.max_memory_allocated(device)
        report.peak_increase_bytes = report.peak_bytes - start
        report.end_increase_bytes = torch.cuda.memory_allocated(device) - start
        return
    if device.type != "cpu":
        raise ValueError(f"track_peak_memory measures CUDA and CPU devices, got {device}")
    if torch.autograd._profiler_enabled():
        raise ValueError("track_peak_memory on CPU uses the profiler, and a profiler is already running: "
                         "measure memory outside it")
    from torch.profiler import ProfilerActivity, profile

    report = MemoryReport(str(device), "torch.profiler memory events (CPU allocator), plus the baseline")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield report
    peak, final = _cpu_peak_from_events(prof.profiler.kineto_results.events())
    report.peak_increase_bytes = peak
    report.end_increase_bytes = final
    report.peak_bytes = baseline_bytes + peak
