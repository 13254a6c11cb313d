"""A device's roofs, one type for all (lessons 00, 04, 09, 10): peak FLOP/s per precision, memory bandwidth,
the cost of one op call; measured here and stamped, or from a datasheet. `mfu_peak`: the one peak of MFU.
Guide: docs/library/measure.md#helpersmeasureroofline"""

from __future__ import annotations

import datetime
import functools
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from helpers.core.device import device_name, get_device
from helpers.core.precision import PRECISION_DTYPE, PRECISIONS, tf32_matmuls
from helpers.core.tables import Table
from helpers.core.timing import LoadProbe, benchmark, busy, relative_spread
from helpers.measure.gpus import GPU, PEAK_PRECISIONS, gpu, gpu_named

__all__ = ["Roofline", "measure_roofline", "load_roofline", "saved_roofline", "datasheet_roofline",
           "LAUNCH_S",
           "PeakFlops", "peak_flops", "MFU_PRECISIONS", "CPU_MFU_PRECISIONS", "mfu_peak"]

# Names of the dtype vocabulary rooflines used before the course settled on one; read, never written.
_LEGACY_NAMES = {"float32": "fp32", "tfloat32": "tf32", "float16": "fp16", "bfloat16": "bf16"}


def _precision_key(name: str) -> str:
    return _LEGACY_NAMES.get(name, name)


@dataclass(frozen=True)
class Roofline:
    """A device's ceilings: matmul FLOP/s per precision, bytes/s, and the measurement's stamp (lesson 00)."""

    device_name: str
    matmul_flops: dict[str, float]  # FLOP/s of an n×n×n matmul, keyed by precision ("fp32", "bf16", ...)
    bandwidth: float  # bytes/s of a large device copy, counting bytes read + written
    matmul_size: int = 0  # 0: not measured here (a datasheet's roofs)
    copy_bytes: int = 0
    # the stamp (`measure_roofline` fills it in; a roofline made by hand or saved before issue 39 has none)
    measured_at: str = ""  # UTC date and time, ISO 8601
    threads: int | None = None  # torch's CPU threads while measuring
    device_type: str = ""  # "cpu", "cuda", ...
    others_load: float | None = None  # share of the CPUs' time other programs took meanwhile (LoadProbe)
    spread: float | None = None  # the largest IQR / median among its timings
    # what a step's time model needs beyond the matmul and copy rates (lessons 04, 09)
    vector_flops: float | None = None  # FLOP/s of the ops that are not matmuls; None: the fp32 matmul rate
    overhead_s: float = 0.0  # the cost of one op call: a CPU's dispatch, a GPU's launch interval
    synchronous: bool | None = None  # an op finishes before the next is issued; None: a CPU's roofs are
    source: str = ""  # where the figures come from, when not measured here
    # bandwidth by working set (bytes read + written per call) within the last-level cache, measured in lesson
    # 04 (`helpers.measure.regimes.measure_memory_roofs`); beyond the cache: `bandwidth`
    cache_sizes: tuple[int, ...] = ()  # working sets measured, ascending
    cache_bandwidths: tuple[float, ...] = ()  # bytes/s at each: the fastest access pattern there
    cache_bytes: int | None = None  # the last-level cache
    by_pattern: tuple[dict[str, float], ...] = ()  # bytes/s of each access pattern at each size, then beyond

    def __post_init__(self) -> None:  # a roofline saved with dtype names ("float32") reads as precisions
        object.__setattr__(self, "matmul_flops", {_precision_key(k): v for k, v in self.matmul_flops.items()})
        sizes = list(self.cache_sizes)
        if len(sizes) != len(self.cache_bandwidths) or sizes != sorted(sizes):
            raise ValueError("cache roofs need one bandwidth per working set, the sets in ascending order")
        if not self.bandwidth > 0 or any(not b > 0 for b in self.cache_bandwidths):
            raise ValueError("bandwidths must be > 0 bytes/s")
        # a larger working set can only be slower: a smaller set measured slower (a burst of load) takes the
        # larger set's bandwidth, so that a roof never sits below what a larger working set reached
        monotone, best = [], self.bandwidth
        for b in reversed(self.cache_bandwidths):
            best = max(best, b)
            monotone.append(best)
        object.__setattr__(self, "cache_bandwidths", tuple(reversed(monotone)))
        object.__setattr__(self, "cache_sizes", tuple(self.cache_sizes))
        object.__setattr__(self, "by_pattern", tuple(dict(p) for p in self.by_pattern))
        if self.synchronous is None:
            object.__setattr__(self, "synchronous", self.device_type in ("cpu", ""))

    def peak(self, precision: str) -> float:
        """Dense FLOP/s of matmuls and attention at `precision` (lessons 04, 09)."""
        key = _precision_key(precision)
        if key not in self.matmul_flops:
            have = ", ".join(self.matmul_flops)
            raise ValueError(f"{self.device_name} has no {precision!r} peak (it has {have})"
                             ": plan in one of those")
        return self.matmul_flops[key]

    @property
    def vector_rate(self) -> float:
        """FLOP/s of the other ops: `vector_flops`, else the fp32 matmul rate (lessons 04, 09)."""
        return self.vector_flops or self.matmul_flops.get("fp32", max(self.matmul_flops.values()))

    def bandwidth_for(self, working_set: float) -> float:
        """The bandwidth an op moving `working_set` bytes per call can reach at most (lessons 04, 09)."""
        if self.cache_bytes is None or working_set > self.cache_bytes or not self.cache_sizes:
            return self.bandwidth
        below = [b for s, b in zip(self.cache_sizes, self.cache_bandwidths) if s <= working_set]
        return below[-1] if below else self.cache_bandwidths[0]

    def where(self, working_set: float) -> str:
        """Where an op of that working set runs from: "cache" or "memory" (beyond the caches) (lesson 04)."""
        in_cache = self.cache_bytes is not None and working_set <= self.cache_bytes and bool(self.cache_sizes)
        return "cache" if in_cache else "memory"

    def memory_table(self) -> Table:
        """The roofs by working set: each access pattern's GB/s, and the roof (the fastest) (lesson 04)."""
        names = list(self.by_pattern[0]) if self.by_pattern else []  # the access patterns, in their order
        t = Table(["working set", *[f"{n} GB/s" for n in names], "roof GB/s", "where"],
                  title="Memory roofs by working set (the fastest pattern)")
        measured = list(self.by_pattern) or [{}] * (len(self.cache_sizes) + 1)
        for size, b, p in zip(self.cache_sizes, self.cache_bandwidths, measured):
            t.add(f"{size / 2**20:,.2f} MiB", *[p.get(n, float("nan")) / 1e9 for n in names], b / 1e9,
                  "in the last-level cache")
        cache = f" ({self.cache_bytes / 2**20:,.0f} MiB)" if self.cache_bytes else ""
        beyond = [measured[-1].get(n, float("nan")) / 1e9 for n in names]
        t.add("beyond the last-level cache" + cache, *beyond,
              self.bandwidth / 1e9, "memory")
        return t

    @property
    def stamped(self) -> bool:
        """Whether it says when, with how many threads and under what load it was measured."""
        return bool(self.measured_at) and self.threads is not None and self.spread is not None

    @property
    def under_load(self) -> str | None:
        """Why it was measured on a machine too busy to judge (timing.busy), or None (lesson 00)."""
        others = self.others_load if self.device_type == "cpu" else None  # a GPU's roof is not the CPUs'
        state = busy(*([self.spread] if self.spread is not None else []), load=others)
        return "; ".join(state.reasons) if state.too_busy else None

    def stamp(self) -> str:
        """The stamp in words: date, threads, load; "unstamped" for a roofline made by hand or an old file."""
        if not self.stamped:
            return "unstamped (when, with how many threads and under what load is not known)"
        others = ("" if self.others_load is None
                  else f", other programs took {self.others_load:.0%} of the CPUs")
        return (f"measured {self.measured_at} with {self.threads} threads{others}, rounds within "
                f"{self.spread:.0%}" + (f"; UNDER LOAD: {self.under_load}" if self.under_load else ""))

    def ridge_point(self, precision: str = "fp32") -> float:
        """FLOP per byte above which a kernel is compute-bound rather than memory-bound (lesson 00)."""
        key = _precision_key(precision)
        if key not in self.matmul_flops:
            raise ValueError(f"precision {precision!r} was not measured; measured: {list(self.matmul_flops)}")
        return self.matmul_flops[key] / self.bandwidth

    def table(self) -> Table:
        """The roofline as a table (TFLOP/s on GPUs, GFLOP/s on CPUs), its stamp in the title (lesson 00)."""
        scale, unit = (1e12, "TFLOP/s") if max(self.matmul_flops.values()) > 5e12 else (1e9, "GFLOP/s")
        t = Table(["measurement", "value", "unit"],
                  title=f"Measured roofline: {self.device_name}, {self.stamp()}")
        for k, v in self.matmul_flops.items():
            t.add(f"matmul {k} ({self.matmul_size}³)", v / scale, unit)
        t.add(f"copy bandwidth ({self.copy_bytes / 1e6:.0f} MB)", self.bandwidth / 1e9, "GB/s")
        return t

    def _repr_markdown_(self) -> str:
        extra = "\n\n" + self.memory_table().to_markdown() if self.cache_sizes else ""
        return self.table().to_markdown() + extra

    def __str__(self) -> str:
        return str(self.table()) + ("\n\n" + str(self.memory_table()) if self.cache_sizes else "")

    def save(self, path: str | Path | None = None) -> Path:
        """Write the roofline as JSON and return where (lesson 00); the default, the course cache, refuses an
        unstamped one and keeps one measured under load apart."""
        if path is None:
            if not self.stamped:
                raise ValueError("a roofline saved for later runs' MFU must carry its stamp (date, threads, "
                                 "load): save the one measure_roofline returns, or give save() a path")
            path = _roofline_path(self.device_name, under_load=self.under_load is not None)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))
        return path


def _roofline_path(name: str, *, under_load: bool = False) -> Path:
    cache = Path(os.environ.get("COURSE_CACHE", Path.home() / ".cache" / "fast-transformers-course"))
    slug = re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-').lower()
    return cache / (f"roofline-{slug}-under-load.json" if under_load else f"roofline-{slug}.json")


def saved_roofline(name: str | None = None) -> tuple[Roofline | None, str]:
    """(lesson 00's saved roofline of device `name` (default: this one) or None, its source or why none):
    missing, unreadable, unstamped or measured under load gives None (lessons 00, 02, 08)."""
    path = _roofline_path(name if name is not None else device_name())
    if not path.exists():
        busy_one = _roofline_path(path.stem.removeprefix("roofline-"), under_load=True)
        return None, ("no roofline saved for this device measured on a quiet machine (the one measured under "
                      "load was kept apart): run lesson 00" if busy_one.exists()
                      else "no roofline saved for this device: run lesson 00")
    try:
        roof = Roofline(**json.loads(path.read_text()))
    # a file that cannot be read (OSError), is not JSON (ValueError) or has other fields (TypeError)
    except (OSError, ValueError, TypeError) as err:
        return None, f"the saved roofline {path.name} could not be read ({type(err).__name__}: {err}): run " \
                     "lesson 00 again"
    if not roof.stamped:
        return None, (f"the saved roofline {path.name} is unstamped (saved before rooflines carried their "
                      "date, threads and load: it may have been measured under load): run lesson 00 again")
    if roof.under_load:
        return None, (f"the saved roofline {path.name} was measured under load ({roof.under_load}): run "
                      "lesson 00 on a quiet machine")
    return roof, f"lesson 00's roofline, {roof.stamp()}"


def load_roofline(name: str | None = None, *, any_load: bool = False) -> Roofline | None:
    """Lesson 00's stamped roofline of device `name` (default: this one) measured on a quiet machine, or None;
    `any_load` takes one measured under load too (lessons 00, 04, 05)."""
    roof, _ = saved_roofline(name)
    if roof is not None or not any_load:
        return roof
    path = _roofline_path(name if name is not None else device_name())
    for p in (path, _roofline_path(path.stem.removeprefix("roofline-"), under_load=True)):
        if p.exists():
            return Roofline(**json.loads(p.read_text()))
    return None


def measure_roofline(device: torch.device | str | None = None, precisions: list[str] | None = None,
                     matmul_size: int | None = None, copy_mb: int | None = None,
                     min_run_time: float = 0.3, *, dtypes: list[str] | None = None) -> Roofline:
    """Time an n×n matmul per precision (2n³ FLOP) and a large copy (read + write bytes), stamped with the
    date, threads and load (lesson 00). `dtypes`: the old name of `precisions`."""
    device = get_device(str(device) if device is not None else "auto")
    gpu = device.type == "cuda"
    asked = precisions if precisions is not None else dtypes
    names = [_precision_key(p) for p in asked] if asked else (["fp32", "tf32", "fp16", "bf16"] if gpu
                                                              else ["fp32", "bf16"])
    bad = [p for p in names if p not in PRECISIONS]  # fp8 needs scaled matmuls: its peak is the datasheet's
    if bad:
        raise ValueError(f"unknown precision(s) {bad}: choose from {list(PRECISIONS)}")
    n = matmul_size or (8192 if gpu else 1024)
    copy_bytes = (copy_mb or (1024 if gpu else 128)) * 2**20
    gen = torch.Generator(device=device).manual_seed(0)
    flops, spreads = {}, []
    probe = LoadProbe().__enter__()  # what other programs take of the CPUs while we measure
    for name in names:
        # random data: zeros or constants can run faster than real data on some hardware
        a = torch.randn(n, n, device=device, dtype=PRECISION_DTYPE[name], generator=gen)
        b = torch.randn(n, n, device=device, dtype=PRECISION_DTYPE[name], generator=gen)
        with tf32_matmuls(name == "tf32"):  # "fp32" is measured with TF32 off: true fp32 matmuls
            t = benchmark(functools.partial(torch.matmul, a, b), name=name, warmup=2,
                          min_run_time=min_run_time)
        flops[name] = 2 * n**3 / t.median_s
        spreads.append(relative_spread(t))
        del a, b
    src = torch.randn(copy_bytes // 4, device=device, generator=gen)
    dst = torch.empty_like(src)
    t = benchmark(lambda: dst.copy_(src), name="copy", warmup=2, min_run_time=min_run_time)
    spreads.append(relative_spread(t))
    load = probe.read()
    return Roofline(device_name=device_name(device), matmul_flops=flops,
                    bandwidth=2 * copy_bytes / t.median_s, matmul_size=n, copy_bytes=copy_bytes,
                    measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    threads=torch.get_num_threads(), device_type=device.type, others_load=load.others,
                    spread=max(spreads))


# --- a GPU class's roofs from its datasheets ------------------------------------------------------------

LAUNCH_S = 10e-6  # seconds per kernel launch an eager step's host needs (Python, dispatcher, launch): assumed


def datasheet_roofline(g: str | GPU, *, launch_s: float = LAUNCH_S) -> Roofline:
    """A GPU class's roofs from its datasheets (helpers.measure.gpus): its dense peaks, its memory bandwidth,
    `launch_s` per kernel (an assumption); a GPU queues its kernels (lessons 09, 10)."""
    g = gpu(g)
    if g.bandwidth is None:
        raise ValueError(f"{g.key}: the GPU table has no memory bandwidth for it: add it to "
                         f"helpers.measure.gpus")
    if not launch_s >= 0:
        raise ValueError(f"launch_s must be >= 0 seconds, got {launch_s!r}")
    peaks = dict(g.peaks)
    peaks.setdefault("tf32", g.peaks["fp32"])  # no TF32 units (T4, V100): tf32 runs as fp32
    return Roofline(g.key, peaks, g.bandwidth, device_type="cuda", vector_flops=g.peaks["fp32"],
                    overhead_s=launch_s, synchronous=False,
                    source=f"{g.peaks_source}; {g.bandwidth_source}; launch {launch_s * 1e6:g} µs per kernel "
                           "(assumed)")


# --- peak FLOP/s: the one place that picks the peak MFU is measured against ---------------------------

@dataclass(frozen=True)
class PeakFlops:
    """A device's peak dense FLOP/s for one precision, and where the number comes from (lesson 00)."""

    flops: float
    precision: str
    source: str


def _has_tf32_units(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0)


def peak_flops(device: torch.device | str | None = None, precision: str = "bf16", *,
               roofline: Roofline | None = None, gpu_name: str | None = None,
               measure: bool = False) -> PeakFlops | None:
    """The peak at `precision` and its source (lessons 00, 02, 08): a known GPU's datasheet, else `roofline`,
    lesson 00's saved one, or with `measure` one measured now; else None. `gpu_name`: a GPU not here."""
    if precision not in PEAK_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: use one of {PEAK_PRECISIONS}")
    if roofline is not None and not isinstance(roofline, Roofline):
        raise TypeError(f"roofline must be a helpers.measure.roofline.Roofline (from measure_roofline), "
                        f"got {type(roofline).__name__}")
    dev = get_device(str(device) if device is not None else ("cuda" if gpu_name is None and
                                                             torch.cuda.is_available() else "cpu"))
    name = gpu_name or (torch.cuda.get_device_name(dev) if dev.type == "cuda" else None)
    row = gpu_named(name) if name else None
    if row is not None:
        if precision in row.peaks:
            return PeakFlops(row.peaks[precision], precision, row.peaks_source)
        if precision == "tf32":  # no TF32 units: tf32 runs as fp32
            return PeakFlops(row.peaks["fp32"], "fp32", row.peaks_source + "; no TF32 units: the fp32 peak")
        # a known GPU without units for this precision: try the measurement
    no_tf32 = gpu_name is None and not _has_tf32_units(dev)
    key = "fp32" if precision == "tf32" and no_tf32 else precision
    saved = None
    if roofline is None and gpu_name is None:  # lesson 00's, stamped and measured on a quiet machine
        saved, _ = saved_roofline(name or device_name(dev))
    if roofline is None and (saved is None or not saved.matmul_flops.get(key)):
        roofline = measure_roofline(dev, precisions=[key]) if measure and key in PRECISIONS else None
    roofline = roofline if roofline is not None else saved
    if roofline is not None:
        measured = roofline.matmul_flops
        if precision in measured:
            key = precision
        if measured.get(key):
            note = "" if key == precision else "; no TF32 units: the fp32 matmul"
            unknown = f" ({name} is not in the GPU table)" if name and row is None else ""
            how = (f", lesson 00's saved one ({roofline.stamp()})" if roofline is saved else
                   f"; measured under load ({roofline.under_load}): an MFU against it reads high"
                   if roofline.under_load else "")
            return PeakFlops(float(measured[key]), key,
                             f"measured matmul roofline on {roofline.device_name}{note}{unknown}{how}")
    return None


# the dense rates MFU's one peak is chosen from: every training precision's but TF32's (never above fp16's
# where a GPU has it, fp32's where it has not). fp16 counts: a T4 or V100 has fp16 tensor cores and no bf16
# ones, and its fp16 run divided by its fp32 peak would show an MFU of up to 800 %.
MFU_PRECISIONS = ("fp32", "bf16", "fp16")  # on a tie (fp16 = bf16 on Ampere and later) bf16 is named
# A CPU trains in fp32 or bf16 in this course (the ladder's fp16 rung is a GPU's, helpers.train.ladder), so no
# CPU run has an fp16 MFU; and a CPU without fp16 units emulates its matmuls (0.8 GFLOP/s on the 2-core EPYC
# CI uses, against 540 for bf16): measuring that would take 10 s and name no peak.
CPU_MFU_PRECISIONS = ("fp32", "bf16")


def mfu_peak(device: torch.device | str | None = None, *, roofline: Roofline | None = None,
             measure: bool = False) -> PeakFlops | None:
    """The one peak every MFU divides by (lessons 02, 08): the fastest dense rate among the training
    precisions (FP8 aside), so that no MFU shows above 100 %; None when no peak is known."""
    dev = get_device(str(device) if device is not None else "auto")
    names = CPU_MFU_PRECISIONS if dev.type == "cpu" else MFU_PRECISIONS
    peaks = (peak_flops(dev, name, roofline=roofline, measure=measure) for name in names)
    found = [p for p in peaks if p is not None]
    return max(found, key=lambda p: p.flops) if found else None
