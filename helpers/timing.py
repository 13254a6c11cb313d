"""Correct timing: warm-up, device synchronisation, repeats, median and spread; comparison tables.

The measuring is done by `torch.utils.benchmark.Timer`, which synchronises the accelerator around
each block of runs (so GPU work is timed, not just its launch) and picks a block size that keeps the
timer's own overhead negligible. Two traps it does not cover are handled here: it times with one CPU
thread unless told otherwise, and it does not warm up (first calls pay for compilation, autotuning
and allocator growth).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch.utils.benchmark import Timer

from helpers.tables import Table

__all__ = ["Timing", "benchmark", "time_once", "compare", "synchronize"]


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one benchmarked callable: median and interquartile range over the runs."""

    name: str
    median_s: float
    iqr_s: float
    runs: int  # number of timed blocks
    calls_per_run: int  # calls in each block
    times_s: tuple[float, ...] = field(default=(), repr=False)  # seconds per call, one per block

    @property
    def median_ms(self) -> float:
        return self.median_s * 1e3

    def __str__(self) -> str:
        return (f"{self.name}: {self.median_s * 1e3:.3f} ms median "
                f"(IQR {self.iqr_s * 1e3:.3f} ms, {self.runs} runs x {self.calls_per_run} calls)")


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued device work: needed before reading a host clock after GPU calls."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type == "cuda":
        if torch.cuda.is_available():
            torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def benchmark(fn: Callable[[], Any], *, name: str = "", warmup: int = 2, min_run_time: float = 0.5,
              num_threads: int | None = None) -> Timing:
    """Time `fn()` the honest way: `warmup` calls first, then timed blocks for `min_run_time` seconds."""
    if not callable(fn):
        raise ValueError(f"benchmark needs a callable taking no arguments, got {type(fn).__name__}; "
                         "wrap a call with arguments as `lambda: f(x)`")
    if warmup < 0 or min_run_time <= 0:
        raise ValueError(f"need warmup >= 0 and min_run_time > 0, got warmup={warmup}, "
                         f"min_run_time={min_run_time}")
    for _ in range(warmup):
        fn()
    synchronize()
    timer = Timer(stmt="fn()", globals={"fn": fn},
                  num_threads=num_threads or torch.get_num_threads())  # Timer's default is 1 thread
    m = timer.blocked_autorange(min_run_time=min_run_time)
    return Timing(name=name or getattr(fn, "__name__", "fn"), median_s=m.median, iqr_s=m.iqr,
                  runs=len(m.times), calls_per_run=m.number_per_run, times_s=tuple(m.times))


def time_once(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Run `fn()` once, synchronised: (its result, seconds). For one-off costs such as compilation."""
    synchronize()
    start = time.perf_counter()
    out = fn()
    synchronize()
    return out, time.perf_counter() - start


def compare(timings: Mapping[str, Timing] | list[Timing], baseline: str | None = None,
            title: str = "") -> Table:
    """A table of median times with each variant's speed-up over `baseline` (default: the first)."""
    items = dict(timings) if isinstance(timings, Mapping) else {t.name: t for t in timings}
    if not items:
        raise ValueError("compare needs at least one Timing")
    baseline = baseline if baseline is not None else next(iter(items))
    if baseline not in items:
        raise ValueError(f"baseline {baseline!r} is not among the timings {list(items)!r}")
    base = items[baseline].median_s
    table = Table(["variant", "median ms", "IQR ms", f"speed-up vs {baseline}"], title=title)
    for name, t in items.items():
        table.add(name, t.median_s * 1e3, t.iqr_s * 1e3, base / t.median_s)
    return table
