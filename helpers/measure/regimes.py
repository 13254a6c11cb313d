"""Where a training step's time goes (lessons 04, 05): every op counted and timed, placed on the measured
roofline, the step's time split by regime and by cause, the table's checks, and why an optimisation paid.
Guide: docs/library/measure.md#helpersmeasureregimes"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

import torch

from helpers.core.tables import Table
from helpers.core.timing import TOO_BUSY, Busy, benchmark, busy
from helpers.measure.opcount import OpCount, StepFn, count_ops, op_class
from helpers.measure.optime import OpTimes, call_cost, fastest_call, per_call_costs, time_ops
from helpers.measure.roofline import Roofline

__all__ = ["REGIMES", "LABELS", "REGIME_COLORS", "EXCESS", "roof_times", "classify_regime", "predicted_time",
           "is_synchronous", "measure_memory_roofs", "measure_peak_flops", "OpRow", "OpTable",
           "op_table", "profile_step", "check_regimes", "check_roofs", "check_reconciled", "check_flops",
           "fixed_work_s", "ROOF_MARGIN", "RECONCILE_MARGIN", "TOO_BUSY", "MEMORY_PATTERNS", "fusion_report",
           "amdahl_bound", "OPTIMISATION_TARGETS", "why_it_paid"]

EXCESS = "below the roof"  # the time ops ran slower than their roof allows
LABELS = ("compute", "memory", "overhead", "communication")  # the regime an op is labelled with
REGIMES = (*LABELS, EXCESS)  # what a step's time is split into (`OpTable.breakdown`, `OpTable.causes`)
REGIME_COLORS = {"compute": "tab:blue", "memory": "tab:orange", "overhead": "tab:gray",
                 "communication": "tab:green", EXCESS: "tab:red"}
# The noise rules of the checks (lesson 04 states them next to the checks):
ROOF_MARGIN = 10.0  # an op may show at most 10x above its roof: the roofs and the op are timed at different
# moments, and on a shared 2-core machine (a load average of 7) a roof timed in a busy moment came out up to
# ~6x below what an op reached in a quiet one; the errors this catches are far beyond (a gather charged for
# its whole table: ~100x for BERT's embedding; a loss charged for all N x V log-probabilities: V x)
RECONCILE_MARGIN = 0.25  # the profile less the profiler's events: within 25 % (+ how far the rounds disagree)
# TOO_BUSY (helpers.core.timing): rounds that disagree by 50 % or more (IQR / median): too busy to judge


def roof_times(flops: float, nbytes: float, calls: float, *, peak_flops: float, bandwidth: float,
               overhead_s: float) -> dict[str, float]:
    """Seconds at each roof: FLOPs / peak FLOP/s, bytes / bandwidth, calls × per-call cost (lesson 04)."""
    return {"compute": flops / peak_flops, "memory": nbytes / bandwidth, "overhead": calls * overhead_s}


def _check_counts(flops: float, nbytes: float, calls: float, peak_flops: float, bandwidth: float,
                  overhead_s: float) -> None:
    for name, v in (("flops", flops), ("bytes", nbytes), ("calls", calls), ("overhead_s", overhead_s)):
        if not v >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {v!r}")
    for name, v in (("peak_flops", peak_flops), ("bandwidth", bandwidth)):
        if not v > 0:
            raise ValueError(f"{name} must be > 0 (a measured roofline), got {v!r}")


def classify_regime(flops: float, nbytes: float, calls: float, *, peak_flops: float, bandwidth: float,
             overhead_s: float) -> str:
    """The regime an op is in: the largest of its compute, memory and overhead times (lesson 04)."""
    _check_counts(flops, nbytes, calls, peak_flops, bandwidth, overhead_s)
    if flops == 0 and nbytes == 0:
        return "overhead"  # a call that computes and moves nothing (a view): its call is all it costs
    times = roof_times(flops, nbytes, calls, peak_flops=peak_flops, bandwidth=bandwidth,
                       overhead_s=overhead_s)
    return max(times, key=times.get)  # ties go to the first: compute, then memory


def is_synchronous(device: torch.device | str) -> bool:
    """Whether the device runs each op before the host issues the next (a CPU), not queueing (lesson 04)."""
    return torch.device(device).type not in ("cuda", "mps")


def predicted_time(flops: float, nbytes: float, calls: float, *, peak_flops: float, bandwidth: float,
                   overhead_s: float, synchronous: bool) -> float:
    """The roofline model's seconds for an op (lesson 04): a CPU adds the calls' cost to the work, a GPU
    hides its launches under running kernels: max(compute, memory, calls × overhead)."""
    _check_counts(flops, nbytes, calls, peak_flops, bandwidth, overhead_s)
    t = roof_times(flops, nbytes, calls, peak_flops=peak_flops, bandwidth=bandwidth, overhead_s=overhead_s)
    work = max(t["compute"], t["memory"])
    return t["overhead"] + work if synchronous else max(work, t["overhead"])


# --- memory roofs by working set -------------------------------------------------------------------------

# The access patterns a memory roof is measured with: tensors read and written per element, each counted as
# (read + written) x 4 bytes per fp32 element; the roof is the fastest of them (a copy counts 2 bytes per
# element where a CPU that reads each cache line before writing it moves 3: reading alone runs faster).
MEMORY_PATTERNS = {"read": (1, 0), "copy": (1, 1), "read 2, write 1": (2, 1)}


def _copy_only(roofline: Roofline) -> Roofline:
    """`roofline` with one memory roof for every working set, its copy bandwidth (no roofs by working set)."""
    return replace(roofline, cache_sizes=(), cache_bandwidths=(), cache_bytes=None, by_pattern=())


def _pattern_rates(device: torch.device, working_set: int, threads: list[int],
                   min_run_time: float, overhead_s: float) -> dict[str, float]:
    """Bytes/s of each access pattern at one working set: each at its fastest block, over `threads`."""
    sync = is_synchronous(device)
    rates = {}
    for name, (reads, writes) in MEMORY_PATTERNS.items():
        n = max(working_set // (4 * (reads + writes)), 1)  # fp32 elements per tensor
        src = [torch.ones(n, device=device) for _ in range(reads)]  # the values do not change the time
        fn = _pattern(name, src, torch.empty(n, device=device))
        t = min(fastest_call(fn, num_threads=k, min_run_time=min_run_time, device=device) for k in threads)
        work = max(t - overhead_s, t / 2) if sync else t  # a synchronous call's fixed cost is not memory time
        rates[name] = 4 * n * (reads + writes) / work
    return rates


def _pattern(name: str, src: list[torch.Tensor], dst: torch.Tensor) -> Callable[[], Any]:
    """The call that moves memory in that pattern: a sum reads, a copy, an add of two."""
    if name == "read":
        return lambda: torch.sum(src[0])
    if name == "copy":
        return lambda: dst.copy_(src[0])
    return lambda: torch.add(src[0], src[1], out=dst)


def measure_memory_roofs(device: torch.device | str, roofline: Roofline, *, cache_bytes: int | None,
                         overhead_s: float = 0.0, smallest: int = 256 * 2**10,
                         min_run_time: float = 0.01) -> Roofline:
    """`roofline` with memory roofs by working set (lesson 04): each of MEMORY_PATTERNS timed at 256 KiB,
    1 MiB, ... up to half the last-level cache and at twice it; the fastest pattern is the roof."""
    if cache_bytes is not None and cache_bytes <= 0:
        raise ValueError(f"cache_bytes must be > 0 or None (unknown), got {cache_bytes}")
    device = torch.device(device)
    threads = _threads(device)
    sizes, bws, by_pattern = [], [], []
    size = smallest
    while cache_bytes is not None and size <= cache_bytes // 2:
        rates = _pattern_rates(device, size, threads, min_run_time, overhead_s)
        sizes.append(size)
        bws.append(max(rates.values()))
        by_pattern.append(rates)
        size *= 4
    beyond = roofline.bandwidth
    if cache_bytes is not None:  # beyond the caches: every pattern at twice the cache, and lesson 00's copy
        rates = _pattern_rates(device, 2 * cache_bytes, threads, min_run_time, overhead_s)
        beyond = max(beyond, *rates.values())
        by_pattern.append(rates)
    # one roofline: `roofline`'s rates, its bandwidth the roof beyond the caches, the cache's roofs beside it
    return replace(roofline, bandwidth=beyond, cache_sizes=tuple(sizes), cache_bandwidths=tuple(bws),
                   cache_bytes=cache_bytes, by_pattern=tuple(by_pattern))


def _threads(device: torch.device) -> list[int]:
    """The thread counts a CPU roof is measured with: all of them, and one."""
    # the faster counts: on a busy machine an op split over two threads waits for the slower one
    n = torch.get_num_threads()
    return [n] + ([1] if device.type == "cpu" and n > 1 else [])


def measure_peak_flops(device: torch.device | str, *, sizes: Sequence[int] = (128, 256, 512),
                       min_run_time: float = 0.05) -> float:
    """The most fp32 FLOP/s an n x n x n matmul reached here over `sizes`: the compute roof (lesson 04)."""
    # several small sizes, each at its fastest block: on a shared machine a long matmul is interrupted more
    device = torch.device(device)
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        for threads in _threads(device):
            t = benchmark(lambda: a @ b, name=f"matmul {n}", warmup=2, min_run_time=min_run_time,
                          num_threads=threads)
            best = max(best, 2 * n**3 / min(t.times_s))
    return best


# --- the op table ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpRow:
    """One row of the op table: an op (or a class of ops) of a step, counted, timed and placed (lesson 04)."""

    label: str  # the op ("aten::addmm") or the class ("matmul")
    phase: str
    op_class: str
    calls: float  # per step
    time_s: float  # per step: profiled, less the profiler's events recorded inside it
    flops: float  # per step
    bytes: float  # per step, minimum traffic
    regime: str
    roof_s: float  # the time at its roof: max(FLOPs / peak, bytes / its memory roof)
    flops_source: str = ""
    profiled_s: float = 0.0  # per step, as the profiler measured it
    bandwidth: float = math.nan  # its memory roof, bytes/s (by its working set)
    where: str = "memory"  # "cache" (its working set fits the last-level cache) or "memory"
    fixed_s: float = 0.0  # per step: calls × the per-call cost (the fixed part of a CPU op's time)
    compute_s: float = 0.0  # per step: FLOPs / the peak (its compute roof time; roof_s is the larger roof)

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

    def split(self, synchronous: bool) -> dict[str, float]:
        """Its time at its roof, its calls' fixed cost (a CPU's: a GPU op holds no launch), the excess."""
        fixed = min(self.time_s, self.fixed_s) if synchronous else 0.0
        at_roof = min(self.time_s - fixed, self.roof_s)
        return {"roof": at_roof, "overhead": fixed, EXCESS: max(self.time_s - fixed - at_roof, 0.0)}

    @property
    def roof_kind(self) -> str:
        """Which roof bounds it: "compute" when its compute time is the larger, else "memory"."""
        return "compute" if self.compute_s > 0 and self.compute_s >= self.roof_s * (1 - 1e-12) else "memory"


@dataclass(frozen=True)
class OpTable:
    """A step's ops on the roofline, and its time by regime and by cause (lesson 04)."""

    rows: tuple[OpRow, ...]
    wall_s: float  # per step, profiled
    device: str
    precision: str
    peak_flops: float
    bandwidth: float  # beyond the caches (lesson 00's copy)
    overhead_s: float  # the fixed cost of one call: of the cheapest class (per class: `call_costs`)
    comm_s: float = 0.0
    busy_s: float | None = None
    ridge: float = math.nan  # Roofline.ridge_point(precision), FLOP per byte
    unprofiled_s: float | None = None  # the plain step, timed beside the profiled one
    profiler_cost_s: float = 0.0  # per step: the profiler's events x the measured cost of one
    pairs: tuple[tuple[float, float], ...] = ()  # (profiled s, unprofiled s) of each round
    noise: float = 0.0  # how much the rounds disagree (OpTimes.noise)
    untimed: tuple[str, ...] = ()  # counted ops the profiler never saw, and what was done with each
    memory_roofs: Roofline | None = None  # the roofs by working set it was placed on
    call_costs: tuple[tuple[str, float], ...] = ()  # (op class, seconds per call); empty: overhead_s for all
    others: float | None = None  # share of the CPUs other programs took while it was profiled (None: unknown)

    @property
    def synchronous(self) -> bool:
        return self.device not in ("cuda", "mps")

    @property
    def busy(self) -> Busy:
        """Whether the profile can be judged: its rounds' spread and other programs' load (timing.busy)."""
        return busy(self.noise, load=self.others)

    def call_cost(self, op_class: str) -> float:
        """Seconds one call of an op of `op_class` costs before its work (the table's per-call prices)."""
        return dict(self.call_costs).get(op_class, self.overhead_s)

    @property
    def op_time_s(self) -> float:
        return sum(r.time_s for r in self.rows)

    @property
    def total_s(self) -> float:
        """The step's time the breakdown adds up to: a CPU's profiled step less the profiler's events."""
        # a GPU's plain step: kernel times do not change under the profiler, the idle time does
        if not self.synchronous and self.unprofiled_s is not None:
            return max(self.unprofiled_s, self.busy_s or 0.0, self.op_time_s + self.comm_s)
        return max(self.wall_s - self.profiler_cost_s, self.op_time_s + self.comm_s)

    @property
    def outside_s(self) -> float:
        """Seconds per step outside every op: Python and the autograd engine (a CPU); the GPU idle (a GPU)."""
        if not self.synchronous and self.busy_s is not None:
            return max(self.total_s - self.busy_s, 0.0)
        return max(self.total_s - self.op_time_s - self.comm_s, 0.0)

    @property
    def ratio(self) -> float:
        """The profiled step over the plain one beside it (median of the rounds; nan without them)."""
        if not self.pairs:
            return math.nan
        return _median([p / u for p, u in self.pairs])

    @property
    def reconciled_ratio(self) -> float:
        """The profiled step less the profiler's events, over the plain one (median of the rounds)."""
        if not self.pairs:
            return math.nan
        if not self.synchronous:
            return _median([max(self.busy_s or 0.0, 1e-12) / u for _, u in self.pairs])
        return _median([(p - self.profiler_cost_s) / u for p, u in self.pairs])

    def overhead_total_s(self) -> float:
        """The step's overhead: calls × per-call cost plus the time between ops (a CPU); idle time (a GPU)."""
        if self.synchronous:
            return sum(min(r.time_s, r.fixed_s) for r in self.rows if r.op_class != "communication") \
                + self.outside_s
        return self.outside_s

    def breakdown(self) -> dict[str, float]:
        """Seconds per step by each op's regime label, unaccounted time as overhead; sums to `total_s`."""
        out = dict.fromkeys(REGIMES, 0.0)
        for r in self.rows:
            out[r.regime] += r.time_s
        out["overhead"] += max(self.total_s - sum(out.values()) - self.comm_s, 0.0)
        out["communication"] += self.comm_s
        return out

    def causes(self) -> dict[str, float]:
        """Seconds per step by cause: at roofs, overhead, below roofs, communication (sum: total_s)."""
        out = dict.fromkeys(REGIMES, 0.0)
        for r in self.rows:
            if r.op_class == "communication":
                out["communication"] += r.time_s
                continue
            parts = r.split(self.synchronous)
            out[r.roof_kind] += parts["roof"]
            out["overhead"] += parts["overhead"]
            out[EXCESS] += parts[EXCESS]
        out["overhead"] += self.outside_s
        out["communication"] += self.comm_s
        return out

    def shares(self, by: str = "cause") -> dict[str, float]:
        """The causes (or, by="regime", the breakdown by label) as fractions of the step."""
        if by not in ("cause", "regime"):
            raise ValueError(f"by must be 'cause' or 'regime', got {by!r}")
        b = self.causes() if by == "cause" else self.breakdown()
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
            roof = sum(r.roof_s for r in rs)  # each op at its own roof
            bw = b / sum(r.bytes / r.bandwidth for r in rs) if b > 0 else self.bandwidth
            regime = ("communication" if name == "communication" else
                      classify_regime(f, b, c, peak_flops=self.peak_flops, bandwidth=bw,
                               overhead_s=sum(r.fixed_s for r in rs) / c if c else self.overhead_s))
            phases = sorted({r.phase for r in rs})
            sources = sorted({r.flops_source for r in rs if r.flops > 0})
            wheres = sorted({r.where for r in rs})
            rows.append(OpRow(name, "+".join(phases), name, c, sum(r.time_s for r in rs), f, b, regime,
                              roof, ", ".join(sources), sum(r.profiled_s for r in rs), bw, "+".join(wheres),
                              sum(r.fixed_s for r in rs), sum(r.compute_s for r in rs)))
        rows.sort(key=lambda r: -r.time_s)
        return replace(self, rows=tuple(rows))

    def row(self, label: str) -> OpRow:
        """The row called `label` (an op, or a class after `by_class`); several phases: the first."""
        for r in self.rows:
            if r.label == label:
                return r
        raise ValueError(f"no row {label!r}; rows: {sorted({r.label for r in self.rows})}")

    def table(self, *, top: int | None = None, title: str = "") -> Table:
        """The rows as a table, slowest first, with where each op's time went."""
        gpu = self.peak_flops > 5e12
        fscale, funit = (1e12, "TFLOP/s") if gpu else (1e9, "GFLOP/s")
        t = Table(["op", "phase", "calls", "ms", "% of step", "MFLOP", "MB", "FLOP/byte", funit, "GB/s",
                   "memory roof GB/s", "regime", "% of its roof", "at roof / fixed / below, %"],
                  title=title or f"One step, op by op ({self.device})")
        total = self.total_s or 1.0
        for r in sorted(self.rows, key=lambda r: -r.time_s)[:top]:
            parts = r.split(self.synchronous)
            split = " / ".join(f"{100 * v / r.time_s:.0f}" if r.time_s > 0 else "–"
                               for v in (parts["roof"], parts["overhead"], parts[EXCESS]))
            t.add(r.label, r.phase, r.calls, r.time_s * 1e3, 100 * r.time_s / total, r.flops / 1e6,
                  r.bytes / 1e6, r.intensity, r.flops_per_s / fscale, r.bytes_per_s / 1e9,
                  f"{r.bandwidth / 1e9:.3g} ({r.where})", r.regime, 100 * r.roof_fraction, split)
        return t

    def breakdown_table(self, title: str = "") -> Table:
        """The step's time by cause, in ms and % of the step."""
        b = self.causes()
        total = sum(b.values()) or 1.0
        t = Table(["where the time went", "ms per step", "% of the step"], title=title or "One step by cause")
        for k, v in b.items():
            t.add(k, v * 1e3, 100 * v / total)
        return t

    def points(self) -> list[dict[str, Any]]:
        """Rows with FLOPs and time, for a roofline scatter: label, intensity, FLOP/s, share, regime."""
        total = self.total_s or 1.0
        return [dict(label=r.label, intensity=r.intensity, flops_per_s=r.flops_per_s, share=r.time_s / total,
                     regime=r.regime) for r in self.rows
                if r.flops > 0 and r.bytes > 0 and r.time_s > 0]

    def _repr_markdown_(self) -> str:
        return self.table().to_markdown()


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def op_table(counts: Mapping[tuple[str, str], OpCount], times: OpTimes | None, roofline: Roofline, *,
             precision: str = "fp32", overhead_s: float | Mapping[str, float],
             memory_roofs: Roofline | None = None, untimed: str = "error") -> OpTable:
    """Counts (`count_ops`) and times (`time_ops`; None: counts only) joined into an OpTable on `roofline`
    (lesson 04). A counted op the profiler missed raises ValueError; untimed="estimate": the model's time."""
    if not counts:
        raise ValueError("counts is empty: count_ops saw no op; does the step run anything?")
    costs = dict(overhead_s) if isinstance(overhead_s, Mapping) else {}
    if not costs and isinstance(overhead_s, Mapping):
        raise ValueError("overhead_s is an empty mapping: give seconds per call, or per_call_costs(device)")
    if any(not isinstance(v, (int, float)) or not v >= 0 for v in (costs.values() or [overhead_s])):
        raise ValueError(f"overhead_s must be >= 0 (seconds per call) or a mapping of them, got {overhead_s}")
    cheapest = min(costs.values()) if costs else float(overhead_s)
    if untimed not in ("error", "estimate"):
        raise ValueError(f"untimed must be 'error' or 'estimate', got {untimed!r}")
    ridge = roofline.ridge_point(precision)  # raises ValueError for a precision the roofline lacks
    peak = ridge * roofline.bandwidth  # the measured matmul FLOP/s of that precision
    roofs = memory_roofs or _copy_only(roofline)
    synchronous = times is None or times.device not in ("cuda", "mps")
    notes, estimated = [], set()
    if times is not None:
        missing = [(ph, op) for (ph, op) in counts if (ph, op) not in times.times_s]
        working = [(ph, op) for ph, op in missing if counts[(ph, op)].bytes > 0 or counts[(ph, op)].flops > 0]
        if working and untimed == "error":
            names = [f"{op} ({ph}, {counts[(ph, op)].calls} calls, {counts[(ph, op)].bytes:,.0f} bytes)"
                     for ph, op in working]
            raise ValueError(f"counted ops the profiler never timed: {names}; their time would hide in the "
                             "overhead: profile the same step that was counted, or pass untimed='estimate' "
                             "to give them the model's time, taken out of the time between ops")
        # e.g. the autograd engine's gradient sums, which the profiler does not record: their real time sits
        # in the time between ops, so the model's time is taken out of it
        estimated = set(working)
        notes = [f"{op} ({ph}, {counts[(ph, op)].calls} calls): " +
                 ("the model's time, out of the time between ops" if (ph, op) in estimated else "a view")
                 for ph, op in missing]
    event_cost = times.event_cost_s if times is not None else 0.0
    rows = []
    for (ph, op), c in counts.items():
        cls = op_class(op, ph, is_view=c.is_view)
        working_set = c.bytes / c.calls if c.calls else 0.0
        bw = roofs.bandwidth_for(working_set)
        per_call = call_cost(overhead_s, op, ph, is_view=c.is_view)
        regime = ("communication" if cls == "communication" else
                  classify_regime(c.flops, c.bytes, c.calls, peak_flops=peak, bandwidth=bw,
                                  overhead_s=per_call))
        profiled = times.times_s.get((ph, op), 0.0) if times is not None else 0.0
        inside = times.inside_events.get((ph, op), 0.0) if times is not None else 0.0
        # the profiler's events inside the op's spans (the ops it called) cost it host time: taken out (a GPU
        # op's time is its kernels', which the profiler does not slow)
        time_s = max(profiled - inside * event_cost, 0.0) if synchronous else profiled
        if (ph, op) in estimated:
            time_s = predicted_time(c.flops, c.bytes, c.calls, peak_flops=peak, bandwidth=bw,
                                    overhead_s=per_call, synchronous=synchronous)
        rows.append(OpRow(op, ph, cls, c.calls, time_s, c.flops, c.bytes, regime,
                          max(c.flops / peak, c.bytes / bw), c.flops_source, profiled, bw,
                          roofs.where(working_set), c.calls * per_call, c.flops / peak))
    rows.sort(key=lambda r: -r.time_s)
    prices = tuple(sorted(costs.items()))
    if times is None:
        return OpTable(tuple(rows), 0.0, "cpu", precision, peak, roofline.bandwidth, cheapest, ridge=ridge,
                       memory_roofs=roofs, call_costs=prices)
    table = OpTable(tuple(rows), times.wall_s, times.device, precision, peak, roofline.bandwidth, cheapest,
                    times.comm_s, times.busy_s, ridge, times.unprofiled_s, times.profiler_cost_s, times.pairs,
                    times.noise, tuple(notes), roofs, prices, times.others)
    guessed = sum(r.time_s for r in rows if (r.phase, r.label) in estimated)
    if synchronous and guessed > 0 and table.wall_s - table.profiler_cost_s < table.op_time_s + table.comm_s:
        raise ValueError(f"the model's time of the ops the profiler did not record ({guessed * 1e3:.3g} ms) "
                         "is more than the time between the recorded ops: the join does not add up")
    return table


def profile_step(step: StepFn, roofline: Roofline, *,
                 device: torch.device | str = "cpu", precision: str = "fp32",
                 overhead_s: float | Mapping[str, float] | None = None,
                 steps: int = 3, warmup: int = 1, memory_roofs: Roofline | None = None,
                 untimed: str = "error") -> OpTable:
    """`count_ops`, `time_ops` and `op_table` in one call (lesson 04). `overhead_s`: seconds per call, for all
    ops or per op class; None measures `per_call_costs(device)` now."""
    overhead = per_call_costs(device) if overhead_s is None else overhead_s
    counts = count_ops(step, warmup=warmup)
    times = time_ops(step, device=device, steps=steps, warmup=warmup, counted=counts)
    return op_table(counts, times, roofline, precision=precision, overhead_s=overhead,
                    memory_roofs=memory_roofs, untimed=untimed)


# --- the checks ------------------------------------------------------------------------------------------

def check_regimes(table: OpTable) -> list[str]:
    """Problems in a table's rows (negative counts, regimes, `check_roofs`); empty if none (lesson 04)."""
    problems = []
    for r in table.rows:
        if r.flops < 0 or r.bytes < 0 or r.calls < 0 or r.time_s < 0:
            problems.append(f"{r.label} ({r.phase}): negative counts or time")
        if r.regime not in LABELS:
            problems.append(f"{r.label} ({r.phase}): unknown regime {r.regime!r}")
        elif (r.regime == "communication") != (r.op_class == "communication"):
            problems.append(f"{r.label} ({r.phase}): communication ops, and only they, are communication")
    return problems + check_roofs(table)


def check_roofs(table: OpTable, *, margin: float = ROOF_MARGIN) -> list[str]:
    """Ops more than `margin` times faster than their roof: a count too high or a roof too low (lesson 04)."""
    if not margin >= 1:
        raise ValueError(f"margin must be >= 1, got {margin}")
    problems = []
    for r in table.rows:
        if r.time_s <= 0 or r.op_class == "communication" or r.roof_s <= 0:
            continue
        if r.roof_s > margin * r.time_s:
            kind = r.roof_kind
            rate = (f"{r.flops_per_s / 1e9:.3g} GFLOP/s against a peak of {table.peak_flops / 1e9:.3g}"
                    if kind == "compute" else
                    f"{r.bytes_per_s / 1e9:.3g} GB/s against a {r.where} roof of {r.bandwidth / 1e9:.3g}")
            what = "FLOPs" if kind == "compute" else "bytes"
            problems.append(f"{r.label} ({r.phase}) ran at {r.roof_s / r.time_s:.1f}x its {kind} roof "
                            f"({rate}; margin {margin:g}x): are its {what} counted right?")
    return problems


def check_reconciled(table: OpTable, *, margin: float = RECONCILE_MARGIN) -> list[str]:
    """The profile against the plain step beside it, within `margin` plus the rounds' noise (lesson 04); empty
    when it holds, and when the machine was too busy to judge (`OpTable.busy`: the caller says so)."""
    if not table.pairs:
        return ["no plain step was timed beside the profiled one: use helpers.measure.optime.time_ops"]
    if table.busy.too_busy:
        return []
    ratio, allowed = table.reconciled_ratio, margin + table.noise
    if table.synchronous and abs(ratio - 1) > allowed:
        return [f"the profiled step less the profiler's events ({table.profiler_cost_s * 1e3:.3g} ms) is "
                f"{ratio:.2f}x the plain step (rule: within {allowed:.0%}): the profile does not account for "
                "the step"]
    if not table.synchronous and ratio > 1 + allowed:
        return [f"the GPU's kernels ran {ratio:.2f}x the plain step's time: kernels counted twice?"]
    return []


def check_flops(table: OpTable, expected: float, *, rtol: float = 1e-6) -> list[str]:
    """FlopCounterMode's FLOPs of the step against a hand formula's; empty when within `rtol` (lesson 04)."""
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


def fixed_work_s(small: Mapping[tuple[str, str], OpCount], large: Mapping[tuple[str, str], OpCount],
                 batches: tuple[int, int], roofline: Roofline, *, precision: str = "fp32",
                 memory_roofs: Roofline | None = None) -> float:
    """Seconds per step of work that does not grow with the batch (the optimizer update, weight reads), at
    its roofs: each op's counts at two batch sizes extended to batch 0 (lesson 04)."""
    b1, b2 = batches
    if not 0 < b1 < b2:
        raise ValueError(f"batches must be two sizes, smaller first, got {batches}")
    peak = roofline.ridge_point(precision) * roofline.bandwidth
    roofs = memory_roofs or _copy_only(roofline)
    total = 0.0
    for key, c1 in small.items():
        c2 = large.get(key)
        f2, by2 = (c2.flops, c2.bytes) if c2 is not None else (c1.flops, c1.bytes)
        # a line through (b1, x1) and (b2, x2), read at batch 0; never below 0 nor above the small batch's
        f0 = min(max(c1.flops - (f2 - c1.flops) * b1 / (b2 - b1), 0.0), c1.flops)
        by0 = min(max(c1.bytes - (by2 - c1.bytes) * b1 / (b2 - b1), 0.0), c1.bytes)
        bw = roofs.bandwidth_for(c1.bytes / c1.calls if c1.calls else 0.0)
        total += max(f0 / peak, by0 / bw)
    return total


# --- lesson 05: what compiling fused ---------------------------------------------------------------------

def fusion_report(eager: OpTable, compiled: OpTimes, *, title: str = "") -> Table:
    """Per op class of the eager step: its regime and time, and whether compile fused its ops (lesson 05)."""
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


# --- lessons 04, 05: why an optimisation paid ------------------------------------------------------------

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
# the ladder's rungs (lesson 08) are RunSpec switches (helpers.train.runspec); "precision" names its value
# ("tf32", "bf16")
_SWITCHES = ("precision", "compile", "fused_adamw", "attn", "padding", "fp8")


def amdahl_bound(share: float) -> float:
    """The largest speed-up from making a `share` of the time free: 1 / (1 - share) (lesson 04)."""
    if not 0 <= share <= 1:
        raise ValueError(f"share must be a fraction in [0, 1], got {share}")
    return math.inf if share == 1 else 1 / (1 - share)


def why_it_paid(optimisation: str, breakdown: Mapping[str, float], *, speedup: float, paid: bool,
                value: Any = None) -> str:
    """One sentence on an optimisation: the regimes of `breakdown` it targets, their share, Amdahl's bound,
    whether it paid (lessons 04, 05). For optimisation="precision", `value` names it ("tf32", "bf16")."""
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
