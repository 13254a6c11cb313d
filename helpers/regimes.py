"""Where the time of a training step goes (lesson 04): every op of one step with its calls, time, FLOPs and
bytes, placed on the measured roofline, and the step's time split by regime: compute-bound, memory-bound,
overhead-bound, and communication where a process group is up.

How each number is obtained (the lesson says the same next to its tables):

- **time**: `torch.profiler`, over a few steps after a warm-up. Each op is timed as the profiler's
  outermost event of that name (its children, e.g. the `aten::item` inside a fused optimizer, belong to
  it): CPU time on a CPU, the time of the kernels it launched on a GPU. What no op accounts for (Python,
  the autograd engine, the GPU waiting for the next launch) is the step's wall time minus the ops' time.
- **FLOPs**: `torch.utils.flop_counter.FlopCounterMode` for what it counts (matmuls, attention kernels,
  convolutions; SDPA's CPU kernel is added with the library's own SDPA formula). It counts every other op
  as 0. For those we count **one FLOP per element written** when the op does arithmetic (elementwise ops,
  normalisations, softmax, reductions, the optimizer update) and 0 when it only moves or makes data
  (copies, indexing, embedding look-ups, fills, views). One per element is an under-count (GELU's erf
  alone is tens of instructions): it moves those ops further left on the roofline, never across the ridge
  at the sizes the course runs.
- **bytes**: the minimum traffic: every tensor an op reads, once, plus every tensor it writes (returns, or
  its schema marks as mutated), once; a broadcast input counts the elements it stores; views move nothing.
  Real kernels can move more (a matmul re-reads tiles), and on a CPU caches can hide some: an op whose
  tensors stay in cache can sit above a memory roof measured with a copy much larger than the caches.
- **regime**: the largest of three predicted times: FLOPs / the measured matmul peak (compute),
  bytes / the measured copy bandwidth (memory), calls × the measured cost of the smallest op
  (`per_call_overhead`, overhead). Compute-bound is the same as "arithmetic intensity (FLOP per byte)
  right of the ridge point" (`Roofline.ridge_point`) unless the op is so small that its per-call cost
  dominates. Communication ops (c10d, NCCL, Gloo) are their own regime.
- **how far below its roof**: the time the op would take at its roof (the larger of the compute and
  memory times) over the time it took: 100 % is on the roof.

A step is a function `step(phase)` that wraps its parts in `with phase("forward"):` (and "backward",
"optimizer"...): the same function is run once under the counters and a few times under the profiler, and
the two are joined by (phase, op). Ops in the phase named "optimizer" form the class "optimizer step".
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from helpers.roofline import Roofline
from helpers.tables import Table
from helpers.timing import Timing, benchmark, synchronize

__all__ = ["REGIMES", "REGIME_COLORS", "op_class", "labelled_step", "OpCount", "count_ops", "OpTimes",
           "time_ops", "per_call_overhead", "classify", "OpRow", "OpTable", "op_table", "profile_step",
           "check_regimes", "check_flops", "busy_time", "fusion_report", "amdahl_bound",
           "OPTIMISATION_TARGETS", "why_it_paid", "OPTIMISATIONS", "OP_KINDS", "blank_predictions",
           "Effect", "effect", "not_measured", "score_predictions", "cuda_graphed"]

REGIMES = ("compute", "memory", "overhead", "communication")
REGIME_COLORS = {"compute": "tab:blue", "memory": "tab:orange", "overhead": "tab:gray",
                 "communication": "tab:green"}
PHASE_PREFIX = "phase: "  # the profiler labels each phase "phase: forward", ...
OPTIMIZER_PHASE = "optimizer"
DEFAULT_PHASE = "step"  # ops outside any `with phase(...)`
StepFn = Callable[[Callable[[str], Any]], Any]  # step(phase): `with phase("forward"): ...`

# Op classes, first match wins, on the op's name ("aten::addmm"); views are found from the op's schema too.
_CLASS_PATTERNS = (
    ("communication", r"^c10d::|nccl|gloo|record_param_comms"),
    ("views (no data)", r"::(_unsafe_view|_reshape_alias|alias|detach|lift_fresh)$"),
    ("attention", r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention|flex_attention"),
    ("matmul", r"::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|addmv|mv|dot)$"),
    ("LayerNorm", r"layer_norm"),
    ("GELU", r"gelu"),
    ("cross-entropy", r"log_softmax|nll_loss|cross_entropy"),
    ("softmax", r"softmax"),
    ("dropout", r"dropout|bernoulli"),
    ("embedding", r"embedding"),
    ("copies and layout", r"copy|clone|contiguous|::cat$|::stack$|_unsafe_view|index|gather|scatter|fill|"
                          r"zero|ones|empty|full|arange|::where$|narrow|slice|select|split|unbind"),
)
# Ops that only move or make data: FLOPs 0 under the "one per element written" rule.
_NO_ARITHMETIC = re.compile(r"copy|clone|contiguous|::cat$|::stack$|index|gather|scatter|fill|zero|ones|"
                            r"empty|full|arange|::embedding$|narrow|slice|select|split|unbind|::where$|"
                            r"_unsafe_view|alias|detach|lift_fresh|scalar_tensor|::to$|::resize_$")
# Ops that move no data at all (allocations, metadata): bytes 0 even when their schema is not a view.
_NO_DATA = re.compile(r"::(empty|empty_like|empty_strided|_unsafe_view|_reshape_alias|alias|detach|"
                      r"lift_fresh|resize_|set_)$")
# Mutated arguments these ops overwrite without reading them.
_WRITE_ONLY = re.compile(r"::(fill_|zero_|bernoulli_|normal_|uniform_|random_|exponential_|copy_)$")


# SDPA's CPU kernel, counted with the library's own formulas (FlopCounterMode has them for the GPU kernels);
# FlopCounterMode hands a custom formula the shapes of the op's arguments, in the op's order.
def _sdpa_cpu_flop(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_flop_count(query, key, value)


def _sdpa_cpu_backward_flop(grad_out: Any, query: Any, key: Any, value: Any, *args: Any,
                            out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_backward_flop_count(grad_out, query, key, value)


_SDPA_CPU = {"_scaled_dot_product_flash_attention_for_cpu": _sdpa_cpu_flop,
             "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_cpu_backward_flop}


def op_class(op: str, phase: str = DEFAULT_PHASE, *, is_view: bool = False) -> str:
    """The class of an op ("matmul", "LayerNorm", "GELU", ...) from its name and phase (lesson 04)."""
    if not isinstance(op, str) or not op:
        raise ValueError(f"op must be an op name such as 'aten::mm', got {op!r}")
    if phase == OPTIMIZER_PHASE:
        return "optimizer step"
    if is_view and not re.search(_CLASS_PATTERNS[0][1], op):
        return "views (no data)"
    for name, pattern in _CLASS_PATTERNS:
        if re.search(pattern, op):
            return name
    return "elementwise and reductions"


# --- counting: calls, FLOPs, bytes -----------------------------------------------------------------------

@dataclass(frozen=True)
class OpCount:
    """What one op did in one run of a step, all calls together: FLOPs and minimum bytes (lesson 04)."""

    phase: str
    op: str
    calls: int
    flops: float
    bytes_read: float
    bytes_written: float
    flops_source: str  # "FlopCounterMode", "1 per element written" or "none (moves data)"
    is_view: bool = False

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in an argument: a tensor, or lists/tuples/dicts of them (foreach ops take lists)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _stored_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor holds: a broadcast (stride-0) view counts its storage once."""
    try:
        stored = t.untyped_storage().nbytes() // max(t.element_size(), 1)
    except (RuntimeError, NotImplementedError):  # tensors without storage (meta, some subclasses)
        stored = t.numel()
    return min(t.numel(), stored) * t.element_size()


def _key(t: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    return (t.data_ptr(), t.numel(), tuple(t.shape))


def _traffic(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[int, int, int]:
    """(bytes read, bytes written, elements written) of one call: inputs once, outputs and mutated once."""
    name = func._schema.name
    if func.is_view or _NO_DATA.search(name):
        return 0, 0, 0
    written: dict[tuple, torch.Tensor] = {}
    read: dict[tuple, torch.Tensor] = {}
    write_only = bool(_WRITE_ONLY.search(name))
    for i, arg in enumerate(func._schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        mutated = arg.alias_info is not None and arg.alias_info.is_write
        for t in _tensors(value):
            if mutated or arg.is_out:
                written[_key(t)] = t
            if not (arg.is_out or (mutated and write_only)):
                read[_key(t)] = t
    for t in _tensors(out):
        written[_key(t)] = t
    return (sum(_stored_bytes(t) for t in read.values()), sum(_stored_bytes(t) for t in written.values()),
            sum(t.numel() for t in written.values()))


class _Recorder(TorchDispatchMode):
    """Sees each op below autograd once: its calls, bytes, and the FLOPs FlopCounterMode counted for it."""

    def __init__(self, counter: FlopCounterMode) -> None:
        super().__init__()
        self.counter = counter
        self.phase = DEFAULT_PHASE
        self.calls: dict[tuple[str, str], list] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        before = self.counter.get_total_flops()
        out = func(*args, **kwargs)  # goes on to FlopCounterMode, below this mode on the stack
        name = func._schema.name
        if name.startswith("profiler::"):  # record_function's own ops
            return out
        library_flops = self.counter.get_total_flops() - before
        read, written, elements = _traffic(func, args, kwargs, out)
        entry = self.calls.setdefault((self.phase, name), [0, 0, 0, 0, 0, bool(func.is_view)])
        entry[0] += 1
        entry[1] += library_flops
        entry[2] += elements
        entry[3] += read
        entry[4] += written
        return out


def labelled_step(model: torch.nn.Module, batch: Mapping[str, Any],
                  optimizer: torch.optim.Optimizer) -> StepFn:
    """A training step in three labelled phases, "forward" (with the loss), "backward", "optimizer", for
    `count_ops`, `time_ops` and `profile_step` (lessons 04, 05)."""
    if not callable(getattr(optimizer, "step", None)):
        raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")

    def step(phase: Callable[[str], Any]) -> None:
        with phase("forward"):
            loss = model(**batch).loss  # a Hugging Face model or SmallTransformer: the output carries .loss
        with phase("backward"):
            loss.backward()
        with phase(OPTIMIZER_PHASE):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return step


def count_ops(step: StepFn, *, warmup: int = 1) -> dict[tuple[str, str], OpCount]:
    """Run `step(phase)` `warmup` times, then once under FlopCounterMode and a dispatch mode: calls, FLOPs
    and bytes per (phase, op) (lesson 04). The warm-up keeps one-off work (optimizer state) out."""
    if not callable(step):
        raise ValueError(f"step must be a function step(phase) that wraps its parts in `with phase(name):`, "
                         f"got {type(step).__name__}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    for _ in range(warmup):
        step(lambda name: contextlib.nullcontext())
    aten = torch.ops.aten
    extra = {getattr(aten, n): f for n, f in _SDPA_CPU.items() if hasattr(aten, n)}
    counter = FlopCounterMode(display=False, custom_mapping=extra)
    recorder = _Recorder(counter)

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        outer, recorder.phase = recorder.phase, _check_phase(name)
        try:
            yield
        finally:
            recorder.phase = outer

    with counter, recorder:
        step(phase)
    counts = {}
    for (ph, name), (calls, lib_flops, elements, read, written, is_view) in recorder.calls.items():
        if lib_flops > 0:
            flops, source = float(lib_flops), "FlopCounterMode"
        elif is_view or _NO_ARITHMETIC.search(name) or op_class(name, ph) == "communication":
            flops, source = 0.0, "none (moves data)"
        else:
            flops, source = float(elements), "1 per element written"
        counts[(ph, name)] = OpCount(ph, name, calls, flops, float(read), float(written), source, is_view)
    return counts


def _check_phase(name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a phase needs a name such as 'forward', 'backward' or 'optimizer', got {name!r}")
    return name.strip()


# --- timing: torch.profiler ------------------------------------------------------------------------------

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
        return record_function(PHASE_PREFIX + _check_phase(name))

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

    comm_pattern = _CLASS_PATTERNS[0][1]
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
        elif (re.search(comm_pattern, e.name) and not inside
              and not any(re.search(comm_pattern, a.name) for a in above)):
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


# --- regimes ---------------------------------------------------------------------------------------------

def classify(flops: float, nbytes: float, calls: float, *, peak_flops: float, bandwidth: float,
             overhead_s: float) -> str:
    """The regime an op is in: the largest of FLOPs / peak, bytes / bandwidth and calls × per-call cost
    (lesson 04)."""
    for name, v in (("flops", flops), ("bytes", nbytes), ("calls", calls), ("overhead_s", overhead_s)):
        if not v >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {v!r}")
    for name, v in (("peak_flops", peak_flops), ("bandwidth", bandwidth)):
        if not v > 0:
            raise ValueError(f"{name} must be > 0 (a measured roofline), got {v!r}")
    if flops == 0 and nbytes == 0:
        return "overhead"  # a call that computes and moves nothing (a view): its call is all it costs
    times = {"compute": flops / peak_flops, "memory": nbytes / bandwidth, "overhead": calls * overhead_s}
    return max(times, key=times.get)  # ties go to the first: compute, then memory


@dataclass(frozen=True)
class OpRow:
    """One row of the op table: an op (or a class of ops) of one step, counted, timed and placed
    (lesson 04)."""

    label: str  # the op ("aten::addmm") or the class ("matmul")
    phase: str
    op_class: str
    calls: float  # per step
    time_s: float  # per step, profiled
    flops: float  # per step
    bytes: float  # per step, minimum traffic
    regime: str
    roof_s: float  # the time at its roof: max(FLOPs / peak, bytes / bandwidth)
    flops_source: str = ""

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte (inf for FLOPs without bytes, nan for neither)."""
        if self.bytes > 0:
            return self.flops / self.bytes
        return math.inf if self.flops > 0 else math.nan

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.time_s if self.time_s > 0 else math.nan

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.time_s if self.time_s > 0 else math.nan

    @property
    def roof_fraction(self) -> float:
        """Time at its roof / time taken: 1 is on the roof, 0.1 is ten times below it."""
        return self.roof_s / self.time_s if self.time_s > 0 else math.nan


@dataclass(frozen=True)
class OpTable:
    """A step's ops on the roofline, and its time by regime (lesson 04)."""

    rows: tuple[OpRow, ...]
    wall_s: float  # per step, profiled
    device: str
    precision: str
    peak_flops: float
    bandwidth: float
    overhead_s: float
    comm_s: float = 0.0
    busy_s: float | None = None
    ridge: float = math.nan  # Roofline.ridge_point(precision), FLOP per byte

    @property
    def op_time_s(self) -> float:
        return sum(r.time_s for r in self.rows)

    def breakdown(self) -> dict[str, float]:
        """Seconds per step by regime; what no op accounts for (Python, the autograd engine, a GPU idle
        between kernels) is overhead. Sums to the profiled wall time unless ops overlapped."""
        out = dict.fromkeys(REGIMES, 0.0)
        for r in self.rows:
            out[r.regime] += r.time_s
        out["overhead"] += max(self.wall_s - sum(out.values()) - self.comm_s, 0.0)
        out["communication"] += self.comm_s
        return out

    def shares(self) -> dict[str, float]:
        """The breakdown as fractions of the step."""
        b = self.breakdown()
        total = sum(b.values()) or 1.0
        return {k: v / total for k, v in b.items()}

    def by_class(self) -> OpTable:
        """The same table with one row per op class (calls, time, FLOPs, bytes summed; regime by the rule)."""
        groups: dict[str, list[OpRow]] = {}
        for r in self.rows:
            groups.setdefault(r.op_class, []).append(r)
        rows = []
        for name, rs in groups.items():
            f, b, c = sum(r.flops for r in rs), sum(r.bytes for r in rs), sum(r.calls for r in rs)
            regime = ("communication" if name == "communication" else
                      classify(f, b, c, peak_flops=self.peak_flops, bandwidth=self.bandwidth,
                               overhead_s=self.overhead_s))
            phases = sorted({r.phase for r in rs})
            sources = sorted({r.flops_source for r in rs if r.flops > 0})
            rows.append(OpRow(name, "+".join(phases), name, c, sum(r.time_s for r in rs), f, b, regime,
                              max(f / self.peak_flops, b / self.bandwidth), ", ".join(sources)))
        rows.sort(key=lambda r: -r.time_s)
        return replace(self, rows=tuple(rows))

    def row(self, label: str) -> OpRow:
        """The row called `label` (an op, or a class after `by_class`); several phases: the first."""
        for r in self.rows:
            if r.label == label:
                return r
        raise ValueError(f"no row {label!r}; rows: {sorted({r.label for r in self.rows})}")

    def table(self, *, top: int | None = None, title: str = "") -> Table:
        """The rows as a table, slowest first: calls, time, FLOPs, bytes, FLOP/byte, rates, regime."""
        gpu = self.peak_flops > 5e12
        fscale, funit = (1e12, "TFLOP/s") if gpu else (1e9, "GFLOP/s")
        t = Table(["op", "phase", "calls", "ms", "% of step", "MFLOP", "MB", "FLOP/byte", funit, "GB/s",
                   "regime", "% of its roof"], title=title or f"One step, op by op ({self.device})")
        wall = sum(self.breakdown().values()) or 1.0
        for r in sorted(self.rows, key=lambda r: -r.time_s)[:top]:
            t.add(r.label, r.phase, r.calls, r.time_s * 1e3, 100 * r.time_s / wall, r.flops / 1e6,
                  r.bytes / 1e6, r.intensity, r.flops_per_s / fscale, r.bytes_per_s / 1e9, r.regime,
                  100 * r.roof_fraction)
        return t

    def breakdown_table(self, title: str = "") -> Table:
        """The step's time by regime, in ms and % of the step."""
        b = self.breakdown()
        total = sum(b.values()) or 1.0
        t = Table(["regime", "ms per step", "% of the step"], title=title or "One step by regime")
        for k, v in b.items():
            t.add(k, v * 1e3, 100 * v / total)
        return t

    def points(self) -> list[dict[str, Any]]:
        """Rows with FLOPs and time, for a roofline scatter: label, intensity, FLOP/s, share, regime."""
        wall = sum(self.breakdown().values()) or 1.0
        return [dict(label=r.label, intensity=r.intensity, flops_per_s=r.flops_per_s, share=r.time_s / wall,
                     regime=r.regime) for r in self.rows
                if r.flops > 0 and r.bytes > 0 and r.time_s > 0]

    def _repr_markdown_(self) -> str:
        return self.table().to_markdown()


def op_table(counts: Mapping[tuple[str, str], OpCount], times: OpTimes, roofline: Roofline, *,
             precision: str = "fp32", overhead_s: float) -> OpTable:
    """Join counts (`count_ops`) and times (`time_ops`) into rows placed on `roofline` (lesson 04)."""
    if not counts:
        raise ValueError("counts is empty: count_ops saw no op; does the step run anything?")
    if overhead_s < 0:
        raise ValueError(f"overhead_s must be >= 0 (seconds per call), got {overhead_s}")
    ridge = roofline.ridge_point(precision)  # raises ValueError for a precision the roofline lacks
    peak = ridge * roofline.bandwidth  # the measured matmul FLOP/s of that precision
    rows = []
    for (ph, op), c in counts.items():
        cls = op_class(op, ph, is_view=c.is_view)
        regime = ("communication" if cls == "communication" else
                  classify(c.flops, c.bytes, c.calls, peak_flops=peak, bandwidth=roofline.bandwidth,
                           overhead_s=overhead_s))
        rows.append(OpRow(op, ph, cls, c.calls, times.times_s.get((ph, op), 0.0), c.flops, c.bytes, regime,
                          max(c.flops / peak, c.bytes / roofline.bandwidth), c.flops_source))
    rows.sort(key=lambda r: -r.time_s)
    return OpTable(tuple(rows), times.wall_s, times.device, precision, peak, roofline.bandwidth, overhead_s,
                   times.comm_s, times.busy_s, ridge)


def profile_step(step: StepFn, roofline: Roofline, *,
                 device: torch.device | str = "cpu", precision: str = "fp32", overhead_s: float | None = None,
                 steps: int = 3, warmup: int = 1) -> OpTable:
    """`count_ops`, `time_ops` and `op_table` in one call: a step's op table on the roofline (lesson 04)."""
    overhead = per_call_overhead(device) if overhead_s is None else overhead_s
    counts = count_ops(step, warmup=warmup)
    times = time_ops(step, device=device, steps=steps, warmup=warmup, counted=counts)
    return op_table(counts, times, roofline, precision=precision, overhead_s=overhead)


def check_regimes(table: OpTable) -> list[str]:
    """What is wrong with a table's regimes, checked against the ridge point; empty when nothing is
    (lesson 04)."""
    problems = []
    for r in table.rows:
        if r.flops < 0 or r.bytes < 0 or r.calls < 0 or r.time_s < 0:
            problems.append(f"{r.label} ({r.phase}): negative counts or time")
        if r.regime not in REGIMES:
            problems.append(f"{r.label} ({r.phase}): unknown regime {r.regime!r}")
            continue
        if (r.regime == "communication") != (r.op_class == "communication"):
            problems.append(f"{r.label} ({r.phase}): communication ops, and only they, are communication")
        if r.regime == "compute" and not r.intensity >= table.ridge:
            problems.append(f"{r.label} ({r.phase}) is reported compute-bound at {r.intensity:.3g} "
                            f"FLOP/byte, left of the ridge at {table.ridge:.3g}")
        if r.regime == "memory" and not r.intensity < table.ridge:
            problems.append(f"{r.label} ({r.phase}) is reported memory-bound at {r.intensity:.3g} "
                            f"FLOP/byte, right of the ridge at {table.ridge:.3g}")
        fixed = r.calls * table.overhead_s
        if r.regime in ("compute", "memory") and fixed > r.roof_s * (1 + 1e-9):
            problems.append(f"{r.label} ({r.phase}) is reported {r.regime}-bound but its calls cost "
                            f"{fixed:.3g} s, more than its roof time {r.roof_s:.3g} s: overhead-bound")
        if r.regime == "overhead" and fixed < r.roof_s * (1 - 1e-9):
            problems.append(f"{r.label} ({r.phase}) is reported overhead-bound but its roof time "
                            f"{r.roof_s:.3g} s exceeds its calls' cost {fixed:.3g} s")
    return problems


def check_flops(table: OpTable, expected: float, *, rtol: float = 1e-6) -> list[str]:
    """FlopCounterMode's FLOPs of the step against an independent count (a hand formula); empty when they
    agree within `rtol` (lesson 04)."""
    if not expected > 0:
        raise ValueError(f"expected must be a positive FLOP count, got {expected!r}")
    counted = sum(r.flops for r in table.rows if r.flops_source == "FlopCounterMode")
    if abs(counted - expected) > rtol * expected:
        by_op = Counter()
        for r in table.rows:
            if r.flops_source == "FlopCounterMode":
                by_op[f"{r.label} ({r.phase})"] += r.flops
        return [f"the table counts {counted:.6g} matmul/attention FLOPs, the formula {expected:.6g} "
                f"({counted / expected:.4f}x); by op: {dict(by_op)}"]
    return []


# --- lesson 05: what compiling fused ---------------------------------------------------------------------

def fusion_report(eager: OpTable, compiled: OpTimes, *, title: str = "") -> Table:
    """Per op class of the eager step: its regime and time, and whether its ops still run as separate ops
    in the compiled step or were fused into generated kernels (lesson 05)."""
    if not eager.rows:
        raise ValueError("the eager table has no rows")
    t = Table(["op class", "eager regime", "eager ms", "eager calls", "calls left when compiled",
               "what compile did"], title=title or "Which ops the compiled step still calls")
    classes: dict[str, list[OpRow]] = {}
    for r in eager.rows:
        classes.setdefault(r.op_class, []).append(r)
    for cls, rs in sorted(classes.items(), key=lambda kv: -sum(r.time_s for r in kv[1])):
        if cls == "views (no data)":
            continue
        regime = eager.by_class().row(cls).regime
        ops = {r.label for r in rs}
        left = sum(v for k, v in compiled.top_level.items() if k in ops)
        calls = sum(r.calls for r in rs)
        what = ("fused into generated kernels" if left == 0 else
                "still called as library ops" if left >= calls else "partly fused")
        t.add(cls, regime, sum(r.time_s for r in rs) * 1e3, calls, left, what)
    return t


# --- lesson 08: why a rung paid --------------------------------------------------------------------------

# Which regime's time each optimisation removes: the answer key of lesson 04's predict-then-measure.
OPTIMISATION_TARGETS: dict[str, tuple[str, ...]] = {
    "bf16": ("compute", "memory"),  # faster matmul units (where the hardware has them); half the bytes
    "tf32": ("compute",),  # tensor-core matmuls for fp32 storage
    "fp8": ("compute",),
    "compile": ("memory", "overhead"),  # fusion: one pass over memory instead of several; fewer launches
    "fused_adamw": ("memory", "overhead"),  # one kernel for the whole update instead of one per tensor
    "attn": ("memory",),  # SDPA: the T×T matrix is never written to memory
    "padding": ("compute", "memory", "overhead"),  # less work of every kind
    "cuda graphs": ("overhead",),  # one launch for the whole step
    "bigger batch": ("overhead",),  # the same fixed costs spread over more samples
}
# lesson 08's rungs are RunSpec switches (helpers.runspec); "precision" names its value ("tf32", "bf16")
_SWITCHES = ("precision", "compile", "fused_adamw", "attn", "padding", "fp8")


def amdahl_bound(share: float) -> float:
    """The largest speed-up from making a `share` of the time free: 1 / (1 - share) (lesson 04)."""
    if not 0 <= share <= 1:
        raise ValueError(f"share must be a fraction in [0, 1], got {share}")
    return math.inf if share == 1 else 1 / (1 - share)


def why_it_paid(optimisation: str, breakdown: Mapping[str, float], *, speedup: float, paid: bool,
                value: Any = None) -> str:
    """One sentence for a rung: which regimes of the step (lesson 04's `OpTable.breakdown()`, measured before
    the rung) it targets, their share, the most it could gain, and whether it paid (lesson 08).

    `optimisation`: a key of OPTIMISATION_TARGETS or a RunSpec switch; for "precision", `value` is the
    precision ("tf32", "bf16")."""
    key = value if optimisation == "precision" else optimisation
    if key not in OPTIMISATION_TARGETS:
        raise ValueError(f"unknown optimisation {optimisation!r} (value {value!r}): use one of "
                         f"{sorted(OPTIMISATION_TARGETS)}, or a RunSpec switch {_SWITCHES} (precision with "
                         "value='tf32' or 'bf16')")
    if not breakdown or any(v < 0 for v in breakdown.values()) or set(breakdown) - set(REGIMES):
        raise ValueError(f"breakdown must map regimes {REGIMES} to seconds >= 0, got {dict(breakdown)}")
    total = sum(breakdown.values())
    if total <= 0:
        raise ValueError("breakdown adds up to no time at all")
    targets = OPTIMISATION_TARGETS[key]
    share = sum(breakdown.get(r, 0.0) for r in targets) / total
    bound = amdahl_bound(min(share, 1.0))
    pieces = [f"{100 * breakdown.get(r, 0.0) / total:.0f} % {r}-bound" for r in targets]
    parts = pieces[0] if len(pieces) == 1 else ", ".join(pieces[:-1]) + " and " + pieces[-1]
    ceiling = "no limit" if math.isinf(bound) else f"at most {bound:.2f}x"
    verdict = (f"it paid ({speedup:.2f}x): the step was {parts}" if paid else
               f"it did not pay ({speedup:.2f}x) although the step was {parts}" if share >= 0.5 else
               f"it did not pay ({speedup:.2f}x): the step was only {parts}")
    return f"{verdict}, the time {key} removes ({ceiling} if all of it went)"


# --- lesson 04: predict, then measure --------------------------------------------------------------------

OPTIMISATIONS = ("bf16", "compile", "bigger batch", "CUDA graphs")
OP_KINDS = ("compute-bound", "memory-bound", "overhead-bound")


def blank_predictions() -> dict[str, str | None]:
    """The learner's predictions, not filled in: op kind -> the optimisation expected to help it most
    (lesson 04)."""
    return dict.fromkeys(OP_KINDS)


@dataclass(frozen=True)
class Effect:
    """What one optimisation did to one kind of op on this machine (lesson 04)."""

    speedup: float | None  # > 1: faster (per unit of work); None: not measured here
    noise: float  # the larger relative IQR (IQR / median) of the two arms
    note: str = ""  # why it was not measured, or what was compared

    @property
    def helps(self) -> bool | None:
        """Faster beyond the noise: speed-up > 1 + noise (None when not measured)."""
        return None if self.speedup is None else self.speedup > 1 + self.noise


def effect(base: Timing, variant: Timing, *, work_ratio: float = 1.0, note: str = "") -> Effect:
    """Speed-up of `variant` over `base` per unit of work (`work_ratio`: the variant's work / the base's,
    e.g. 8 for an 8× batch), with the noise of the two timings (lesson 04)."""
    for name, t in (("base", base), ("variant", variant)):
        if not t.median_s > 0 or t.iqr_s < 0:
            raise ValueError(f"the {name} timing needs a positive median and a non-negative IQR, got {t}")
    if not work_ratio > 0:
        raise ValueError(f"work_ratio must be > 0, got {work_ratio}")
    noise = max(base.iqr_s / base.median_s, variant.iqr_s / variant.median_s)
    return Effect(work_ratio * base.median_s / variant.median_s, noise, note)


def not_measured(why: str) -> Effect:
    """An optimisation this machine cannot measure, and why (lesson 04)."""
    return Effect(None, 0.0, why)


def score_predictions(predictions: Mapping[str, str | None],
                      effects: Mapping[str, Mapping[str, Effect]]) -> list[dict[str, Any]]:
    """For each op kind: the prediction, the optimisation that helped most here, and whether the prediction
    held ("held", "did not hold", "not testable here", "not filled in") (lesson 04)."""
    unknown = set(predictions) - set(OP_KINDS)
    if unknown:
        raise ValueError(f"unknown op kind(s) {sorted(unknown)}: predictions are keyed by {OP_KINDS}")
    for kind, choice in predictions.items():
        if choice is not None and choice not in OPTIMISATIONS:
            raise ValueError(f"prediction for {kind!r} is {choice!r}: choose one of {OPTIMISATIONS}, "
                             "or None for not filled in")
    results = []
    for kind in OP_KINDS:
        measured = effects.get(kind, {})
        helped = {o: e for o, e in measured.items() if e.helps}
        best = max(helped, key=lambda o: helped[o].speedup) if helped else None
        choice = predictions.get(kind)
        if choice is None:
            verdict = "not filled in"
        elif choice not in measured or measured[choice].speedup is None:
            verdict = "not testable here"
        else:
            verdict = "held" if measured[choice].helps else "did not hold"
        results.append(dict(kind=kind, predicted=choice, best=best, verdict=verdict,
                            speedups={o: e.speedup for o, e in measured.items()}))
    return results


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
