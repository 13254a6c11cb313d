"""Timing done right: warm-up, device sync, repeats, median and spread; cold starts (lessons 00-08).
Too busy to judge (`busy`; every timing verdict asks it first): a timing's rounds disagree by `TOO_BUSY` or
more (IQR / median), or other programs took `OTHERS_BUSY` or more of the CPUs meanwhile.
Guide: docs/library/core.md#helperscoretiming
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from helpers.core.tables import Table

# torch.utils.benchmark is imported inside `benchmark`, the one function that times with it: 0.13 s on first
# import (it pulls in setuptools; 2-core CPU, `python -X importtime`), which every process that imports this
# module but never times a call (a torchrun rank, a lesson's set-up) would pay

__all__ = ["Timing", "benchmark", "benchmark_interleaved", "time_interleaved", "time_passes", "timing_from",
           "time_once", "compare", "synchronize", "ColdStart", "cold_start", "TOO_BUSY", "OTHERS_BUSY",
           "TOO_BUSY_VERDICT", "relative_spread", "CpuLoad", "LoadProbe", "Busy", "busy"]


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
    """Wait for queued device work: needed before reading a host clock after GPU calls (lesson 00)."""
    device = torch.device(device) if device is not None else None
    if device is None or device.type == "cuda":
        if torch.cuda.is_available():
            torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def benchmark(fn: Callable[[], Any], *, name: str = "", warmup: int = 2, min_run_time: float = 0.5,
              num_threads: int | None = None) -> Timing:
    """Time `fn()` the honest way: `warmup` calls, then timed blocks for `min_run_time` s (lesson 00)."""
    if not callable(fn):
        raise ValueError(f"benchmark needs a callable taking no arguments, got {type(fn).__name__}; "
                         "wrap a call with arguments as `lambda: f(x)`")
    if warmup < 0 or min_run_time <= 0:
        raise ValueError(f"need warmup >= 0 and min_run_time > 0, got warmup={warmup}, "
                         f"min_run_time={min_run_time}")
    for _ in range(warmup):
        fn()
    synchronize()
    from torch.utils.benchmark import Timer

    timer = Timer(stmt="fn()", globals={"fn": fn},
                  num_threads=num_threads or torch.get_num_threads())  # Timer's default is 1 thread
    m = timer.blocked_autorange(min_run_time=min_run_time)
    return Timing(name=name or getattr(fn, "__name__", "fn"), median_s=m.median, iqr_s=m.iqr,
                  runs=len(m.times), calls_per_run=m.number_per_run, times_s=tuple(m.times))


def benchmark_interleaved(fns: Mapping[str, Callable[[], Any]], *, rounds: int = 3, warmup: int = 1,
                          min_run_time: float = 0.5) -> dict[str, Timing]:
    """`benchmark` each arm in `rounds` rotating rounds; each keeps its fastest round (lesson 05)."""
    if not fns or rounds < 1:
        raise ValueError(f"need at least one callable and rounds >= 1, got {len(fns)} and rounds={rounds}")
    names = list(fns)
    best: dict[str, Timing] = {}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # a different arm goes first each round
            t = benchmark(fns[name], name=name, warmup=warmup, min_run_time=min_run_time / rounds)
            if name not in best or t.median_s < best[name].median_s:
                best[name] = t
    return {name: best[name] for name in names}


def time_interleaved(*fns: Callable[[], Any], repeats: int = 5,
                     device: torch.device | None = None) -> tuple[Timing, ...]:
    """One Timing per callable, timed in turn (ab, ba, ab, ...) so load falls on each alike (lesson 08)."""
    if len(fns) < 2 or repeats < 1:
        raise ValueError(f"need two callables or more and repeats >= 1, got {len(fns)} and {repeats}")
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats):
        for k in (range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))):
            synchronize(device)
            t = time.perf_counter()
            fns[k]()
            synchronize(device)
            times[k].append(time.perf_counter() - t)
    return tuple(timing_from(ts) for ts in times)


def timing_from(times: list[float], name: str = "") -> Timing:
    """A Timing (median, IQR) from one time per call, in seconds (lesson 08)."""
    q = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else [times[0]] * 3
    return Timing(name=name, median_s=statistics.median(times), iqr_s=q[2] - q[0], runs=len(times),
                  calls_per_run=1, times_s=tuple(times))


def time_passes(fn: Callable[[], Any], *, repeats: int = 5, name: str = "",
                device: torch.device | None = None) -> Timing:
    """`repeats` timed calls of `fn` (device synchronised), as a Timing: median and IQR (lesson 08)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    times = []
    for _ in range(repeats):
        synchronize(device)
        t = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t)
    return timing_from(times, name)


def time_once(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Run `fn()` once, synchronised: (its result, seconds), for one-off costs like compiling (lesson 05)."""
    synchronize()
    start = time.perf_counter()
    out = fn()
    synchronize()
    return out, time.perf_counter() - start


def compare(timings: Mapping[str, Timing] | list[Timing], baseline: str | None = None,
            title: str = "") -> Table:
    """Median times with each variant's speed-up over `baseline` (default: the first) (lesson 01)."""
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


@dataclass(frozen=True)
class ColdStart:
    """One-off costs of a fresh Python process, then the steady state, in seconds (lesson 00)."""

    import_s: float  # `import torch`
    init_s: float  # the first tensors on the device (a CUDA context, the allocator's first blocks)
    first_call_s: float  # the first matmul (library handles, kernel selection, lazy module loading)
    steady_s: float  # median of the calls after it
    pid: int  # the process that measured it: not the caller's

    def __str__(self) -> str:
        return (f"fresh process {self.pid}: import torch {self.import_s:.2f} s, first tensors "
                f"{self.init_s * 1e3:.1f} ms, first matmul {self.first_call_s * 1e3:.2f} ms, then "
                f"{self.steady_s * 1e3:.2f} ms per call (median)")


# Runs in a fresh interpreter: argv = device, n, repeats, threads. Prints one line of JSON.
_COLD_START = """
import json, os, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
dev, n, repeats = torch.device(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(int(sys.argv[4]))
sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
a = torch.randn(n, n, device=dev)
b = torch.randn(n, n, device=dev)
sync(); t2 = time.perf_counter()
c = a @ b
sync(); t3 = time.perf_counter()
times = []
for _ in range(repeats):
    s = time.perf_counter(); c = a @ b; sync(); times.append(time.perf_counter() - s)
times.sort()
print(json.dumps(dict(import_s=t1 - t0, init_s=t2 - t1, first_call_s=t3 - t2, steady_s=times[len(times) // 2],
                      pid=os.getpid())))
"""


def cold_start(device: torch.device | str = "cpu", n: int = 512, *, repeats: int = 5,
               timeout_s: float = 300) -> ColdStart:
    """An n×n matmul's first call and steady state, timed in a fresh Python process (lesson 00)."""
    device = torch.device(device)
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device must be cpu, cuda[:N] or mps, got {device}")
    if n < 1 or repeats < 1:
        raise ValueError(f"need n >= 1 and repeats >= 1, got n={n}, repeats={repeats}")
    proc = subprocess.run([sys.executable, "-c", _COLD_START, str(device), str(n), str(repeats),
                           str(torch.get_num_threads())], capture_output=True, text=True, timeout=timeout_s,
                          env=os.environ.copy())
    if proc.returncode != 0:
        raise RuntimeError(f"the fresh process failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return ColdStart(**json.loads(proc.stdout.strip().splitlines()[-1]))


# --- too busy to judge: the one rule every timing verdict honours (see the module docstring) ------------

TOO_BUSY = 0.5  # the rounds of a timing disagree by 50 % or more (IQR / median): too busy to judge
OTHERS_BUSY = 0.25  # other programs took a quarter or more of all CPUs' time while we measured
TOO_BUSY_VERDICT = "too busy to judge"  # the words every verdict prints instead, in tables and lines


def relative_spread(timing: Timing | Sequence[float]) -> float:
    """How much a timing's rounds disagree: IQR / median (a Timing, or seconds per round) (lessons 00-08)."""
    if not isinstance(timing, Timing):
        times = [float(t) for t in timing]
        if not times:
            raise ValueError("relative_spread needs a Timing or at least one time")
        timing = timing_from(times)
    if not timing.median_s > 0:
        raise ValueError(f"a spread needs a positive median time, got {timing}")
    return timing.iqr_s / timing.median_s


@dataclass(frozen=True)
class CpuLoad:
    """What other programs took of this machine's CPUs while something was measured (lessons 00, 04, 08)."""

    others: float | None  # share of all CPUs' time (0-1) other programs used; None: unknown on this system
    wall_s: float  # how long the measurement took
    cpus: int  # CPUs counted
    load_average: float | None = None  # the 1-minute load average at the end (all programs, this one too)

    def __str__(self) -> str:
        if self.others is None:
            return f"other programs' CPU use unknown here (load average {self.load_average})"
        return f"other programs took {self.others:.0%} of the {self.cpus} CPUs' time over {self.wall_s:.1f} s"


def _cpu_jiffies() -> tuple[int, int] | None:
    try:  # (busy, total) clock ticks of all CPUs since boot; None without /proc/stat
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user); steal is time the
    # hypervisor gave to another machine: taken from us too
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    return total - idle, total


_MIN_TICKS = 20  # all CPUs' clock ticks a reading needs (0.1 s on 2 CPUs): fewer are too coarse to tell


def _own_cpu_s() -> float:
    t = os.times()  # this process's threads and its ended children (DataLoader workers, torchrun's)
    return t.user + t.system + t.children_user + t.children_system


def _descendant_ticks() -> dict[int, int]:
    parent, ticks = {}, {}  # pid -> CPU clock ticks of each live process below this one (compile workers)
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()  # after "pid (name)": state ppid ... utime stime
        except (OSError, IndexError):
            continue  # ended meanwhile
        parent[pid], ticks[pid] = int(rest[1]), int(rest[11]) + int(rest[12])
    below, todo = set(), [os.getpid()]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in below]
        below.update(kids)
        todo += kids
    return {p: ticks[p] for p in below}


class LoadProbe:
    """What other programs took of the CPUs while its block ran: `probe.load` (lessons 00-09).
    `children=True`: this process's running children count as its own too."""

    def __init__(self, children: bool = False) -> None:
        self._start: tuple[float, float, tuple[int, int] | None] | None = None
        self._children = children
        self._kids: dict[int, int] = {}
        self.load: CpuLoad | None = None

    def __enter__(self) -> LoadProbe:
        self._kids = _descendant_ticks() if self._children else {}
        self._start = (time.perf_counter(), _own_cpu_s(), _cpu_jiffies())
        return self

    def start(self) -> LoadProbe:
        """Start measuring without a `with` block (a lesson's setup: its summary reads the whole run)."""
        return self.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.load = self.read()

    def read(self) -> CpuLoad:
        """The load since the block started (also inside the block, for a reading so far)."""
        if self._start is None:
            raise RuntimeError("LoadProbe.read() before the probe started: use `with LoadProbe() as probe:`")
        t0, own0, j0 = self._start
        wall, own, j1 = time.perf_counter() - t0, _own_cpu_s() - own0, _cpu_jiffies()
        avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        cpus = os.cpu_count() or 1
        if j0 is None or j1 is None or j1[1] - j0[1] < _MIN_TICKS:  # no /proc/stat, or too short to tell
            return CpuLoad(None, wall, cpus, avg)
        hz = os.sysconf("SC_CLK_TCK")  # the kernel's clock ticks per second (100 on Linux)
        kids = (sum(t - self._kids.get(p, 0) for p, t in _descendant_ticks().items())  # our running children
                if self._children else 0)
        busy_s, capacity_s = (j1[0] - j0[0]) / hz, (j1[1] - j0[1]) / hz  # all CPUs' seconds: busy, in all
        others = (busy_s - own - max(kids, 0) / hz) / capacity_s
        return CpuLoad(min(1.0, max(0.0, others)), wall, cpus, avg)


@dataclass(frozen=True)
class Busy:
    """Whether timings can judge a comparison, and why not (lessons 00-08)."""

    noise: float | None  # the largest relative spread (IQR / median) among the timings; None: none given
    others: float | None = None  # what other programs took of the CPUs (CpuLoad.others); None: unknown
    noise_limit: float = TOO_BUSY
    others_limit: float = OTHERS_BUSY
    signs: tuple[str, ...] = ()  # other signs a check saw, in words (lesson 00: a planted error unseen)

    @property
    def too_busy(self) -> bool:
        """True when no verdict may be drawn from these timings."""
        return bool(self.reasons)

    @property
    def reasons(self) -> list[str]:
        """Each sign of a too busy machine that was seen, in words (empty: the timings can judge)."""
        out = []
        if self.noise is not None and self.noise >= self.noise_limit:
            out.append(f"the rounds disagree by {self.noise:.0%} (IQR / median; the rule: under "
                       f"{self.noise_limit:.0%})")
        if self.others is not None and self.others >= self.others_limit:
            out.append(f"other programs took {self.others:.0%} of the CPUs' time (the rule: under "
                       f"{self.others_limit:.0%})")
        return out + list(self.signs)

    def __str__(self) -> str:
        if self.too_busy:
            return f"{TOO_BUSY_VERDICT}: " + " and ".join(self.reasons)
        parts = ([f"rounds within {self.noise:.0%}"] if self.noise is not None else []) + (
            [f"other programs took {self.others:.0%} of the CPUs"] if self.others is not None else [])
        return "quiet enough to judge" + (f" ({', '.join(parts)})" if parts else "")


def busy(*timings: Timing | float, load: CpuLoad | float | None = None, noise_limit: float = TOO_BUSY,
         others_limit: float = OTHERS_BUSY) -> Busy:
    """The course's one "too busy to judge" rule over one comparison's Timings (or relative spreads) and the
    CPU load while they ran (a CpuLoad or its `others` share) (lessons 00-08)."""
    spreads = []
    for t in timings:
        if isinstance(t, Timing):
            spreads.append(relative_spread(t))
        elif isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0:
            spreads.append(float(t))
        else:
            raise ValueError(f"busy() takes Timings or relative spreads (IQR / median, >= 0), got {t!r}")
    if isinstance(load, CpuLoad):
        others = load.others
    elif load is None or (isinstance(load, (int, float)) and not isinstance(load, bool) and 0 <= load <= 1):
        others = load
    else:
        raise ValueError(f"load must be a CpuLoad (helpers.core.timing.LoadProbe) or a share in [0, 1], "
                         f"got {load!r}")
    if not noise_limit > 0 or not 0 < others_limit <= 1:
        raise ValueError(f"need noise_limit > 0 and 0 < others_limit <= 1, got {noise_limit}, "
                         f"{others_limit}")
    return Busy(max(spreads) if spreads else None, others, noise_limit, others_limit)
