"""Timing a training step's ops (lesson 04): each (phase, op)'s time per step under the profiler, beside a
plain step and less the profiler's own cost; the fixed cost of one call per op class; a step as a CUDA graph.
Guide: docs/library/measure.md#helpersmeasureoptime"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from helpers.core.timing import LoadProbe, benchmark, synchronize
from helpers.measure.opcount import DEFAULT_PHASE, StepFn, check_phase, is_communication, op_class

__all__ = ["OpTimes", "time_ops", "busy_time", "per_call_overhead", "per_call_costs", "call_cost",
           "CALL_CLASSES", "fastest_call", "cuda_graphed"]

PHASE_PREFIX = "phase: "  # the profiler labels each phase "phase: forward", ...
CALIBRATION = "profiler: cost of one event"  # the record_function around the calibration loop
CALIBRATION_CALLS = 300  # one-element adds per round that price one profiler event


@dataclass(frozen=True)
class OpTimes:
    """Per-step times of a step's ops from torch.profiler, and the plain step timed beside it (lesson 04)."""

    times_s: dict[tuple[str, str], float]  # (phase, op) -> seconds per step (outermost events, as profiled)
    calls: dict[tuple[str, str], float]  # (phase, op) -> calls per step, as the profiler saw them
    wall_s: float  # seconds per step, profiled (the mean of the rounds, as the ops' times are)
    steps: int
    device: str  # "cpu" or "cuda"
    top_level: dict[str, float] = field(default_factory=dict)  # aten op -> calls per step, outermost events
    busy_s: float | None = None  # GPU: seconds per step some kernel ran (None on a CPU)
    comm_s: float = 0.0  # seconds per step in communication events (c10d / NCCL / Gloo)
    kernels: float | None = None  # GPU: kernels launched per step (None on a CPU)
    unprofiled_s: float | None = None  # seconds per step without the profiler (the median of the rounds)
    pairs: tuple[tuple[float, float], ...] = ()  # (profiled s, unprofiled s) of each round, side by side
    events: float = 0.0  # profiler events per step (every op, the ops they call, the phases)
    inside_events: dict[tuple[str, str], float] = field(default_factory=dict)  # events inside an op's spans
    event_cost_s: float = 0.0  # host seconds the profiler adds per event (measured in the same rounds)
    others: float | None = None  # share of the CPUs other programs took meanwhile (LoadProbe; None: unknown)

    @property
    def profiler_cost_s(self) -> float:
        """Seconds per step the profiler's own events add: events x the measured cost of one."""
        return self.events * self.event_cost_s

    @property
    def ratio(self) -> float:
        """Profiled / unprofiled step: the median of the rounds' ratios (nan without plain steps)."""
        if not self.pairs:
            return math.nan
        return statistics.median(p / u for p, u in self.pairs)

    @property
    def noise(self) -> float:
        """How much the rounds disagree: the largest IQR / median of plain, profiled and ratio (0 below 2)."""
        if len(self.pairs) < 2:
            return 0.0
        columns = ([u for _, u in self.pairs], [p for p, _ in self.pairs], [p / u for p, u in self.pairs])
        spreads = []
        for values in columns:
            q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
            spreads.append((q3 - q1) / statistics.median(values))
        return max(spreads)


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


def _no_phase(name: str) -> contextlib.nullcontext:
    return contextlib.nullcontext()


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def _settle(fn: Callable[[], Any], device: torch.device, *, most: int = 10) -> None:
    """Run `fn` until a call takes at most 1.25x the fastest so far (at most `most` calls)."""
    # a new shape's first calls pay one-off costs (kernel selection, caches, the allocator's first blocks)
    times: list[float] = []
    for _ in range(most):
        times.append(_timed(fn, device))
        if len(times) >= 2 and times[-1] <= 1.25 * min(times[:-1]):
            return


class _Totals:
    """What the profiled rounds saw, summed over the rounds (divided by the rounds at the end)."""

    def __init__(self) -> None:
        self.times: Counter = Counter()
        self.calls: Counter = Counter()
        self.top: Counter = Counter()
        self.inside: Counter = Counter()
        self.comm = self.events = self.busy_us = self.kernels = 0.0


def _read_round(events: list, totals: _Totals, is_counted: Callable[[str, str], bool], gpu: bool) -> None:
    """Add one profiled round's events to `totals` (the calibration loop's events left out)."""
    cpu = [e for e in events if e.device_type == DeviceType.CPU and not e.is_async]
    calibration = [e for e in cpu if e.name == CALIBRATION]
    spans = sorted((e.time_range.start, e.time_range.end, e.name[len(PHASE_PREFIX):])
                   for e in cpu if e.name.startswith(PHASE_PREFIX))

    def phase_of(t: float) -> str:
        for a, b, name in spans:
            if a <= t <= b:
                return name
        return DEFAULT_PHASE

    for e in cpu:
        if e.name == CALIBRATION:
            continue
        above = list(_ancestors(e))
        if any(a in calibration for a in above):
            continue
        totals.events += 1
        ph = phase_of(e.time_range.start)
        us = _device_time_us(e) if gpu else e.cpu_time_total
        if e.name.startswith("aten::") and not any(a.name.startswith("aten::") for a in above):
            totals.top[e.name] += 1
        owner = next((a for a in reversed(above) if is_counted(a.name, ph)), None)  # outermost counted op
        if owner is not None:
            totals.inside[(ph, owner.name)] += 1  # its cost in the profiler falls inside that op's time
        elif is_counted(e.name, ph):
            totals.times[(ph, e.name)] += us
            totals.calls[(ph, e.name)] += 1
        elif is_communication(e.name) and not any(is_communication(a.name) for a in above):
            totals.comm += us  # communication no counted op accounts for (DDP's reducer calls the backend)
    if gpu:  # every kernel (and memcpy/memset) the GPU ran, as (start, end) in µs; not the GPU-side copies
        # of record_function ranges ("gpu_user_annotation"), which span whole phases
        spans_gpu = [(e.time_range.start, e.time_range.end) for e in events
                     if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
        totals.busy_us += busy_time(spans_gpu)
        totals.kernels += len(spans_gpu)


def time_ops(step: StepFn, *, device: torch.device | str = "cpu",
             steps: int = 3, warmup: int = 1,
             counted: Mapping[tuple[str, str], Any] | None = None) -> OpTimes:
    """Profile `steps` runs of `step(phase)` after `warmup`, each beside a plain run: time per (phase, op) of
    `counted` (default: every aten:: op), both wall times, the profiler's events and cost (lesson 04)."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"need steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    device = torch.device(device)
    gpu = device.type == "cuda"

    def phase(name: str) -> Any:
        return record_function(PHASE_PREFIX + check_phase(name))

    wanted: dict[str, set[str]] = {}
    for ph, op in (counted or {}):
        wanted.setdefault(ph, set()).add(op)

    def is_counted(name: str, ph: str) -> bool:
        return name in wanted.get(ph, ()) if counted is not None else name.startswith("aten::")

    one, out = torch.ones(1, device=device), torch.empty(1, device=device)

    def calibration() -> None:  # the smallest op, many times: what the profiler adds to each call
        for _ in range(CALIBRATION_CALLS):
            torch.add(one, one, out=out)

    for _ in range(warmup):
        step(phase)
        step(_no_phase)
    if warmup:
        _settle(lambda: step(_no_phase), device)
    calibration()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    totals, pairs, costs = _Totals(), [], []
    probe = LoadProbe().__enter__()  # what other programs take of the CPUs while the rounds run
    for r in range(steps):
        plain_first = r % 2 == 0  # ab, ba, ab, ...: a change of load falls on both arms alike
        if plain_first:
            plain, plain_loop = _timed(lambda: step(_no_phase), device), _timed(calibration, device)
        with profile(activities=activities) as prof:
            profiled = _timed(lambda: step(phase), device)
            with record_function(CALIBRATION):
                profiled_loop = _timed(calibration, device)
        if not plain_first:
            plain, plain_loop = _timed(lambda: step(_no_phase), device), _timed(calibration, device)
        pairs.append((profiled, plain))
        costs.append(max(profiled_loop - plain_loop, 0.0) / CALIBRATION_CALLS)
        _read_round(list(prof.events()), totals, is_counted, gpu)
    load = probe.read()
    per = 1 / steps
    busy = totals.busy_us / 1e6 * per if gpu else None
    return OpTimes({k: v / 1e6 * per for k, v in totals.times.items()},
                   {k: v * per for k, v in totals.calls.items()},
                   statistics.fmean(p for p, _ in pairs), steps, device.type,
                   {k: v * per for k, v in totals.top.items()}, busy, totals.comm / 1e6 * per,
                   totals.kernels * per if gpu else None, statistics.median(u for _, u in pairs),
                   tuple(pairs),
                   totals.events * per, {k: v * per for k, v in totals.inside.items()},
                   statistics.median(costs), load.others)


def per_call_overhead(device: torch.device | str = "cpu", *, min_run_time: float = 0.2) -> float:
    """Seconds per call of a one-element add: the fixed cost every op pays, dispatch or launch (lesson 04)."""
    device = torch.device(device)
    x = torch.ones(1, device=device)
    out = torch.empty_like(x)
    return benchmark(lambda: torch.add(x, x, out=out), name="one-element add", warmup=10,
                     min_run_time=min_run_time).median_s


# The smallest call of each op class (helpers.measure.opcount.op_class), on 8 x 8 tensors: 64 elements take
# the code path a step's ops take (vectorised, with their set-up); one element can take a scalar shortcut.
# Each is one op as the counter and the profiler see it (F.dropout on a CPU is bernoulli_, then div_, mul).
CALL_CLASSES = ("matmul", "attention", "LayerNorm", "GELU", "cross-entropy", "softmax", "dropout",
                "embedding", "copies and layout", "elementwise and reductions", "views (no data)",
                "optimizer step")
DEFAULT_CLASS = "elementwise and reductions"  # the price of a call of a class with no probe of its own


def _call_probes(device: torch.device) -> dict[str, Callable[[], Any]]:
    """One zero-argument call per op class, each as small as its op allows."""
    x = torch.randn(8, 8, device=device)
    w, b = torch.ones(8, device=device), torch.zeros(8, device=device)
    ids = torch.arange(8, device=device)
    q = x.view(1, 1, 8, 8)  # (batch, heads, tokens, head dim)
    param, grad, m, v = (torch.zeros(8, device=device) for _ in range(4))
    count = torch.ones((), device=device)
    mask = torch.empty(8, 8, device=device)

    def optimizer_step() -> None:  # fused AdamW, as helpers.train.loop builds it, on one tensor
        torch._fused_adamw_([param], [grad], [m], [v], [], [count], lr=1e-3, beta1=0.9, beta2=0.999,
                            weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False)

    # a CPU's dropout draws its mask with bernoulli_; a GPU's runs one fused native_dropout kernel
    dropout = ((lambda: torch.native_dropout(x, 0.1, True)) if device.type == "cuda" else
               (lambda: mask.bernoulli_(0.9)))
    return {"matmul": lambda: torch.mm(x, x),
            "attention": lambda: F.scaled_dot_product_attention(q, q, q),
            "LayerNorm": lambda: torch.native_layer_norm(x, [8], w, b, 1e-5),
            "GELU": lambda: F.gelu(x),
            "cross-entropy": lambda: F.nll_loss(x, ids),
            "softmax": lambda: torch.softmax(x, -1),
            "dropout": dropout,
            "embedding": lambda: F.embedding(ids, x),
            "copies and layout": lambda: x.clone(),
            DEFAULT_CLASS: lambda: torch.add(x, x),
            "views (no data)": lambda: x.view(-1),
            "optimizer step": optimizer_step}


def fastest_call(fn: Callable[[], Any], *, num_threads: int | None = None, min_run_time: float = 0.01,
                 blocks: int = 5, device: torch.device | str | None = None) -> float:
    """Seconds per call of `fn` in its fastest block of calls back to back: the least a call takes here, as a
    roof is the most a machine does (lesson 04)."""
    if not min_run_time > 0 or blocks < 1:
        raise ValueError(f"need min_run_time > 0 and blocks >= 1, got {min_run_time} and {blocks}")
    prior = torch.get_num_threads()
    torch.set_num_threads(num_threads or prior)
    try:
        fn()  # warm-up
        synchronize(device)
        # blocks of about min_run_time / blocks, not single calls: a parallel op's idle threads sleep, and
        # waking them (milliseconds on a busy machine) is not what a call costs in a step
        best, start, done, number = math.inf, time.perf_counter(), 0, 1
        while done < 2 or time.perf_counter() - start < min_run_time:
            best = min(best, _block(fn, number, device))
            done += 1
            number = max(1, int(min_run_time / blocks / max(best, 1e-9)))
    finally:
        torch.set_num_threads(prior)
    return best


def _block(fn: Callable[[], Any], number: int, device: torch.device | str | None) -> float:
    """Seconds per call of `number` calls back to back, the device synchronised at the end."""
    start = time.perf_counter()
    for _ in range(number):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / number


def per_call_costs(device: torch.device | str = "cpu", *, min_run_time: float = 0.01) -> dict[str, float]:
    """Seconds per call of the smallest op of each of CALL_CLASSES, at its fastest block (lesson 04); a class
    whose probe cannot run here gets an elementwise call's price."""
    device = torch.device(device)
    costs = {}
    for cls, fn in _call_probes(device).items():
        try:
            costs[cls] = fastest_call(fn, min_run_time=min_run_time, device=device)
        except (RuntimeError, NotImplementedError):  # e.g. fused AdamW on a build without it for this device
            continue
    for cls in CALL_CLASSES:
        costs.setdefault(cls, costs[DEFAULT_CLASS])
    return costs


def call_cost(costs: float | Mapping[str, float], op: str, phase: str = DEFAULT_PHASE, *,
              is_view: bool = False) -> float:
    """The fixed cost of one call of `op`: one price for all (a float), or its class's (lesson 04)."""
    if not isinstance(costs, Mapping):
        return float(costs)
    cls = op_class(op, phase, is_view=is_view)
    if cls in costs:
        return costs[cls]
    return costs.get(DEFAULT_CLASS, min(costs.values()))


def cuda_graphed(fn: Callable[[], Any], *, warmup: int = 3) -> Callable[[], Any]:
    """Record `fn` (static inputs, no host syncs) as a CUDA graph; return a one-launch replay that returns the
    recorded output, refreshed (lesson 04)."""
    if not torch.cuda.is_available():
        raise ValueError("CUDA graphs need a CUDA GPU; on a CPU there is no launch to remove")
    side = torch.cuda.Stream()  # warm-up on a side stream, as PyTorch's CUDA-graphs documentation says
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
