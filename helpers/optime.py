"""Timing a training step's ops (lesson 04): `torch.profiler` over a few steps after a warm-up gives each
(phase, op) its time per step, the step's wall time, and on a GPU the time some kernel ran; the fixed cost of
one call; a step recorded as one CUDA graph. Counting the ops is `helpers.opcount`, their regimes
`helpers.regimes`.

Each op is timed as the profiler's outermost event of that name (its children, e.g. the `aten::item` inside a
fused optimizer, belong to it): CPU time on a CPU, the time of the kernels it launched on a GPU. What no op
accounts for (Python, the autograd engine, the GPU waiting for the next launch) is the step's wall time minus
the ops' time.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from helpers.opcount import DEFAULT_PHASE, StepFn, check_phase, is_communication
from helpers.timing import benchmark, synchronize

__all__ = ["OpTimes", "time_ops", "busy_time", "per_call_overhead", "cuda_graphed"]

PHASE_PREFIX = "phase: "  # the profiler labels each phase "phase: forward", ...


@dataclass(frozen=True)
class OpTimes:
    """Per-step times of a step's ops from torch.profiler, and the step's wall time under it (lesson 04)."""

    times_s: dict[tuple[str, str], float]  # (phase, op) -> seconds per step (outermost events of that op)
    calls: dict[tuple[str, str], float]  # (phase, op) -> calls per step, as the profiler saw them
    wall_s: float  # seconds per step, profiled (the profiler adds its own cost per op)
    steps: int
    device: str  # "cpu" or "cuda"
    top_level: dict[str, float] = field(default_factory=dict)  # aten op -> calls per step, outermost events
    busy_s: float | None = None  # GPU: seconds per step some kernel ran (None on a CPU)
    comm_s: float = 0.0  # seconds per step in communication events (c10d / NCCL / Gloo)
    kernels: float | None = None  # GPU: kernels launched per step (None on a CPU)


def _ancestors(event: Any) -> Iterator[Any]:
    parent = event.cpu_parent
    while parent is not None:
        yield parent
        parent = parent.cpu_parent


def _device_time_us(event: Any) -> float:
    """The time of the kernels an event launched, its children's included (torch < 2.4 called it cuda_...)."""
    name = "device_time_total" if hasattr(event, "device_time_total") else "cuda_time_total"
    return float(getattr(event, name))


def busy_time(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals: the time a GPU ran some kernel (lesson 04)."""
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b < a:
            raise ValueError(f"an interval ends before it starts: ({a}, {b})")
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def time_ops(step: StepFn, *, device: torch.device | str = "cpu",
             steps: int = 3, warmup: int = 1,
             counted: Mapping[tuple[str, str], Any] | None = None) -> OpTimes:
    """Profile `steps` runs of `step(phase)` after `warmup`: time per (phase, op) of the ops in `counted`
    (default: every op the profiler names aten::), and the wall time per step (lesson 04)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    device = torch.device(device)
    gpu = device.type == "cuda"

    def phase(name: str) -> Any:
        return record_function(PHASE_PREFIX + check_phase(name))

    for _ in range(warmup):
        step(phase)
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step(phase)
        synchronize(device)
        wall = (time.perf_counter() - start) / steps
    events = list(prof.events())
    cpu = [e for e in events if e.device_type == DeviceType.CPU and not e.is_async]
    spans = sorted((e.time_range.start, e.time_range.end, e.name[len(PHASE_PREFIX):])
                   for e in cpu if e.name.startswith(PHASE_PREFIX))

    def phase_of(t: float) -> str:
        for a, b, name in spans:
            if a <= t <= b:
                return name
        return DEFAULT_PHASE

    wanted: dict[str, set[str]] = {}
    for ph, op in (counted or {}):
        wanted.setdefault(ph, set()).add(op)

    def is_counted(name: str, ph: str) -> bool:
        return name in wanted.get(ph, ()) if counted is not None else name.startswith("aten::")

    times: Counter = Counter()
    calls: Counter = Counter()
    top: Counter = Counter()
    comm = 0.0
    for e in cpu:
        ph = phase_of(e.time_range.start)
        above = list(_ancestors(e))
        us = _device_time_us(e) if gpu else e.cpu_time_total
        if e.name.startswith("aten::") and not any(a.name.startswith("aten::") for a in above):
            top[e.name] += 1
        inside = any(is_counted(a.name, ph) for a in above)  # its time is in that op's
        if is_counted(e.name, ph) and not inside:
            times[(ph, e.name)] += us
            calls[(ph, e.name)] += 1
        elif is_communication(e.name) and not inside and not any(is_communication(a.name) for a in above):
            comm += us  # communication no counted op accounts for (DDP's reducer calls the backend directly)
    busy = kernels = None
    if gpu:  # every kernel (and memcpy/memset) the GPU ran, as (start, end) in µs; not the GPU-side copies
        # of record_function ranges ("gpu_user_annotation"), which span whole phases
        spans_gpu = [(e.time_range.start, e.time_range.end) for e in events
                     if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
        busy, kernels = busy_time(spans_gpu) / 1e6 / steps, len(spans_gpu) / steps
    return OpTimes({k: v / 1e6 / steps for k, v in times.items()}, {k: v / steps for k, v in calls.items()},
                   wall, steps, device.type, {k: v / steps for k, v in top.items()}, busy, comm / 1e6 / steps,
                   kernels)


def per_call_overhead(device: torch.device | str = "cpu", *, min_run_time: float = 0.2) -> float:
    """Seconds per call of the smallest op (a one-element add into a ready output): the fixed cost every
    op pays, dispatch on a CPU, launch on a GPU (lesson 04)."""
    device = torch.device(device)
    x = torch.ones(1, device=device)
    out = torch.empty_like(x)
    return benchmark(lambda: torch.add(x, x, out=out), name="one-element add", warmup=10,
                     min_run_time=min_run_time).median_s


def cuda_graphed(fn: Callable[[], Any], *, warmup: int = 3) -> Callable[[], Any]:
    """Record `fn` (static inputs, no host syncs) into a CUDA graph; return its one-launch replay, which
    returns the recorded output, refreshed (lesson 04).

    The warm-up runs on a side stream, as PyTorch's CUDA-graphs documentation prescribes."""
    if not torch.cuda.is_available():
        raise ValueError("CUDA graphs need a CUDA GPU; on a CPU there is no launch to remove")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()  # its tensors live in the graph's memory: each replay writes into them again

    def replay() -> Any:
        graph.replay()
        return out
    return replay
