"""Where the time of a training step goes (lesson 04): every op of one step, counted (`helpers.opcount`) and
timed (`helpers.optime`), placed on the measured roofline, and the step's time split by regime:
compute-bound, memory-bound, overhead-bound, and communication where a process group is up. Also the checks
of such a table, what compiling fused and why it paid or not (lesson 05); scoring a learner's predictions is
`helpers.predictions`.

How an op is placed (the lesson says the same next to its tables):

- **regime**: the largest of three predicted times: FLOPs / the measured matmul peak (compute),
  bytes / the measured copy bandwidth (memory), calls × the measured cost of the smallest op
  (`helpers.optime.per_call_overhead`, overhead). Compute-bound is the same as "arithmetic intensity (FLOP per
  byte) right of the ridge point" (`Roofline.ridge_point`) unless the op is so small that its per-call cost
  dominates. Communication ops (c10d, NCCL, Gloo) are their own regime.
- **how far below its roof**: the time the op would take at its roof (the larger of the compute and
  memory times) over the time it took: 100 % is on the roof.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Mapping

import torch

from helpers.opcount import OpCount, StepFn, count_ops, op_class
from helpers.optime import OpTimes, per_call_overhead, time_ops
from helpers.roofline import Roofline
from helpers.tables import Table

__all__ = ["REGIMES", "REGIME_COLORS", "classify", "OpRow", "OpTable", "op_table", "profile_step",
           "check_regimes", "check_flops", "fusion_report", "amdahl_bound", "OPTIMISATION_TARGETS",
           "why_it_paid"]

REGIMES = ("compute", "memory", "overhead", "communication")
REGIME_COLORS = {"compute": "tab:blue", "memory": "tab:orange", "overhead": "tab:gray",
                 "communication": "tab:green"}


def roof_times(flops: float, nbytes: float, calls: float, *, peak_flops: float, bandwidth: float,
               overhead_s: float) -> dict[str, float]:
    """Seconds at each roof: FLOPs / peak FLOP/s, bytes / bandwidth, calls × per-call cost (lesson 04)."""
    return {"compute": flops / peak_flops, "memory": nbytes / bandwidth, "overhead": calls * overhead_s}


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
    times = roof_times(flops, nbytes, calls, peak_flops=peak_flops, bandwidth=bandwidth,
                       overhead_s=overhead_s)
    return max(times, key=times.get)  # ties go to the first: compute, then memory


def _roof_s(flops: float, nbytes: float, peak_flops: float, bandwidth: float) -> float:
    # an op's time at its roof: the slower of compute and memory (the overhead is the per-call cost, apart)
    t = roof_times(flops, nbytes, 0, peak_flops=peak_flops, bandwidth=bandwidth, overhead_s=0.0)
    return max(t["compute"], t["memory"])


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
                              _roof_s(f, b, self.peak_flops, self.bandwidth), ", ".join(sources)))
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
                          _roof_s(c.flops, c.bytes, peak, roofline.bandwidth), c.flops_source))
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
# the ladder's rungs (lesson 08) are RunSpec switches (helpers.runspec); "precision" names its value
# ("tf32", "bf16")
_SWITCHES = ("precision", "compile", "fused_adamw", "attn", "padding", "fp8")


def amdahl_bound(share: float) -> float:
    """The largest speed-up from making a `share` of the time free: 1 / (1 - share) (lesson 04)."""
    if not 0 <= share <= 1:
        raise ValueError(f"share must be a fraction in [0, 1], got {share}")
    return math.inf if share == 1 else 1 / (1 - share)


def why_it_paid(optimisation: str, breakdown: Mapping[str, float], *, speedup: float, paid: bool,
                value: Any = None) -> str:
    """One sentence for an optimisation: which regimes of the step (lesson 04's `OpTable.breakdown()`,
    measured before it) it targets, their share, the most it could gain, and whether it paid (lessons 04, 05).

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
