"""Plan a training run on GPUs you do not have: will it fit, how fast, what it costs (lesson 09).

    from helpers.plan.planner import plan
    p = plan(model, batch, RunSpec(), gpus=["T4", "L4", "A100-80", "H100"], dataset_tokens=50e6)
    p                      # a Markdown table: a column per GPU class, the last naming each row's source
    p.cheapest()           # the class that fits at the lowest cost per epoch (prices: a parameter)
    print(p.assumptions_text())

Every figure is a prediction, made on this CPU without the GPU, from the course's own pieces:

- **the precision and techniques** a class gets: the course's rules
(`helpers.core.precision.training_precision`, `helpers.model.fp8.fp8_capable`, FlexAttention on any CUDA GPU),
asked as if torch saw that GPU (`seen_as`); - **the memory** of one training step: lesson 03's dry run on fake
tensors (`helpers.measure.memory.
  estimate_step_memory`); it fits when its peak stays within the class's memory less the course's margin
  (`helpers.measure.memory.MARGIN`); the **largest batch** that fits is searched with the same dry run;
- **the step time**: the step's own ops, counted on fake tensors (lesson 04's
`helpers.measure.opcount.count_ops`:
  each op's FLOPs, bytes and calls), each placed on the class's roofs (the datasheet's dense peak for the
  precision, its memory bandwidth) by lesson 04's GPU model (`helpers.measure.regimes.predicted_time`: the
  slower of compute and memory, or the launches when the host cannot keep up); summed over the ops;
- **tokens/s, the MFU** it implies (`helpers.measure.flops.model_flops_per_token`, the datasheet peak
`mfu_peak`
  picks), **time and cost per epoch** of a data set of N tokens, given prices per GPU-hour (a parameter; the
  example table is dated and not current), and the **cheapest class** that fits;
- **the serving row**: decode tokens/s at batch 1 bounded by (weight + KV cache) bytes / bandwidth, and the KV
  cache's bytes per token (language models only).

`ASSUMPTIONS` (and `Plan.assumptions`) say what this takes for granted; a plan prints them. Each op at its
roof is the best a kernel can do: a real step is slower (kernels below their roof, the host's gaps). Lesson 09
holds the planner to this CPU's own measured step and to published GPU figures, and says how far it misses.

The same table from a terminal: `python -m course.scripts.plan --help`.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Callable
from unittest import mock

import torch
from torch import nn

from helpers.core import compat
from helpers.core.adapt import as_batch, loss_of, takes_course_batches, vocab_size
from helpers.core.precision import autocast_context, precision_runs, training_precision
from helpers.core.tables import Table
from helpers.core.units import GiB
from helpers.measure import opcount
from helpers.measure.flops import model_flops_per_token, model_shape
from helpers.measure.gpus import GPU, GPUS, gpu, seen_as
from helpers.measure.memory import MARGIN, estimate_step_memory
from helpers.measure.opcount import OPTIMIZER_PHASE, OpCount, count_ops
from helpers.measure.regimes import MemoryRoofs, is_synchronous
from helpers.measure.roofline import LAUNCH_S, Roofline, datasheet_roofline, mfu_peak
from helpers.plan.steptime import ASSUMED, StepTime, step_time
from helpers.train.runspec import RunSpec

__all__ = ["ASSUMPTIONS", "class_rules", "Prices", "EXAMPLE_PRICES", "measured_roofs", "gpu_like_attention",
           "meta_copy", "example_batch", "count_step", "predict_step", "largest_batch", "ClassPlan", "Plan",
           "plan"]

# fp16 and bf16 hold the same bytes and run the same ops under autocast: one dry run and one count serve both
_FAMILY = {"fp16": "bf16", "bf16": "bf16", "fp32": "fp32", "tf32": "fp32"}

ASSUMPTIONS = (
    "every op runs at its roof: FLOPs / the datasheet's dense peak for the precision (matmuls and attention; "
    "the other ops at the fp32 CUDA-core peak), or bytes / the datasheet's memory bandwidth, whichever is "
    "slower; a real kernel runs below its roof, so a real step is slower",
    f"one kernel per op call; the host issues one every {LAUNCH_S * 1e6:g} µs (an eager PyTorch step; a "
    "parameter)",
    ASSUMED[0],
    "bytes: each op reads its inputs and writes its outputs once (lesson 04's count); caches (L2) are not "
    "modelled; an embedding's rows are counted as if every token were distinct",
    "the memory and the ops come from a step run on fake tensors on the CPU: the CPU's kernels and autocast "
    "policy stand in for the GPU's (SDPA's CPU flash kernel keeps a log-sum-exp per row, as CUDA's flash and "
    "memory-efficient kernels do); SDPA's dropout runs inside a GPU's kernel, so the CPU step runs SDPA "
    "without it (with it, the CPU would fall back to the math path and keep T x T matrices a GPU does not)",
    "fp16 runs the same ops and holds the same bytes as bf16: one dry run and one count serve both (the "
    "GradScaler's few ops are left out)",
    "the memory margin is the course's (helpers.measure.memory.MARGIN): the CUDA context, the allocator's "
    "rounding and library workspaces, none of which the dry run sees",
    "tokens per step = batch x sequence length (no padding); an epoch = the data set's tokens / tokens per s",
    "decode at batch 1 reads every weight once per token (16-bit weights) and the KV cache of the context: "
    "tokens/s <= bandwidth / (weight bytes + KV bytes); the KV cache holds keys and values of every layer in "
    "16 bits",
)
_FP8 = ("FP8 (RunSpec.fp8): the Linear layers' matmuls at the datasheet FP8 rate on classes that have FP8 "
        "tensor cores; the scaling and casting kernels are not counted")
_COMPILE = "RunSpec.compile is not modelled: the step is predicted as eager PyTorch runs it, op by op"


# --- prices: a parameter, never a fact of the course ------------------------------------------------------

@dataclass(frozen=True)
class Prices:
    """US dollars per GPU-hour by class key, with the date they were read and where (lesson 09)."""

    usd_per_gpu_hour: Mapping[str, float]
    date: str
    source: str

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.usd_per_gpu_hour.items() if not (isinstance(v, (int, float)) and v > 0)}
        if bad:
            raise ValueError(f"prices must be positive dollars per GPU-hour, got {bad}")
        if not self.date or not self.source:
            raise ValueError("a price table needs the date it was read and its source: prices change")

    def of(self, key: str) -> float | None:
        return self.usd_per_gpu_hour.get(key)


# An example for the arithmetic, NOT current prices: pass your own (`plan(..., prices=Prices(...))`).
EXAMPLE_PRICES = Prices(
    {"T4": 0.5904, "L4": 0.7992, "A100-80": 2.4984, "H100": 3.9492}, "2026-05-07",
    "Modal's on-demand list prices as quoted by techbytes.app, 'Serverless GPU Pricing Matrix [2026 "
    "Developer Cheat Sheet]', which says it verified them on 2026-05-07")


# --- this machine's roofs, measured ----------------------------------------------------------------------

def measured_roofs(roofline: Roofline, *, overhead_s: float, memory_roofs: MemoryRoofs | None = None,
                   device: torch.device | str = "cpu", name: str = "") -> Roofline:
    """This machine's roofs, measured (lessons 00 and 04): the roofline's matmul rates and copy bandwidth, the
    cost of one op call (`helpers.measure.optime.per_call_overhead`), the cache roofs; a CPU runs each op
    before the next, a GPU queues them (lesson 09 checks the planner against this machine's own step)."""
    if not isinstance(roofline, Roofline):
        raise ValueError(f"roofline must be a helpers.measure.roofline.Roofline, got "
                         f"{type(roofline).__name__}")
    if not overhead_s >= 0:
        raise ValueError(f"overhead_s must be >= 0 seconds, got {overhead_s!r}")
    tiers = {} if memory_roofs is None else dict(
        cache_sizes=memory_roofs.sizes, cache_bandwidths=memory_roofs.bandwidths,
        cache_bytes=memory_roofs.cache_bytes, by_pattern=memory_roofs.by_pattern)
    return replace(roofline, device_name=name or roofline.device_name, overhead_s=overhead_s,
                   synchronous=is_synchronous(device), **tiers,
                   source=f"measured on {roofline.device_name}: matmul and copy (lessons 00, 04), "
                          f"{overhead_s * 1e6:.3g} µs per op call")


# --- the course's rules, asked of a GPU we do not have -----------------------------------------------------

def class_rules(g: GPU) -> tuple[str, str, list[str], float, str]:
    """(precision, why, techniques, MFU's peak FLOP/s, its source) of class `g`, by the course's rules, asked
    as if torch saw it (lessons 09, 10)."""
    from helpers.model.fp8 import fp8_capable

    with seen_as(g):
        cuda = torch.device("cuda")
        precision, why = training_precision(cuda)
        found = [name for name, ok in (("bf16", precision_runs("bf16", cuda)),
                                       ("fp16", precision_runs("fp16", cuda)),
                                       ("FP8", fp8_capable(cuda)[0]),
                                       ("FlexAttention", compat.flex_trains(cuda)[0])) if ok]
        peak = mfu_peak(cuda)
    assert peak is not None, f"{g.name}: helpers.measure.roofline has no datasheet row"
    return precision, why, found, peak.flops, f"{peak.precision} {peak.flops / 1e12:,.1f} TFLOP/s"


# --- the model and its batch, without allocating ------------------------------------------------------

def meta_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` whose parameters and buffers are on the meta device: shapes only, nothing allocated,
    the model itself untouched (tied weights stay tied) (lesson 09)."""
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in memo:
            empty = torch.empty_like(t, device="meta")
            memo[id(t)] = nn.Parameter(empty, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) \
                else empty
    return copy.deepcopy(model, memo)


def _per_row_labels(model: nn.Module) -> bool:
    inner = compat.unwrap_model(model)
    inner = getattr(inner, "model", inner) if type(inner).__name__ == "CourseModel" else inner
    return (type(inner).__name__.endswith("ForSequenceClassification")
            or bool(getattr(getattr(inner, "cfg", None), "n_classes", 0)))


def example_batch(model: nn.Module, batch_size: int, seq_len: int, *,
                  seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids (batch_size, seq_len) and labels for `model`'s task: one per row for a classifier
    (a *ForSequenceClassification, a SmallTransformer with classes), one per token otherwise (lesson 09)."""
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"need batch_size >= 1 and seq_len >= 1, got {batch_size}, {seq_len}")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(vocab_size(model, fix="give plan() a batch"), (batch_size, seq_len), generator=g)
    labels = torch.zeros(batch_size, dtype=torch.long) if _per_row_labels(model) else ids.clone()
    return {"input_ids": ids, "labels": labels}


def _shape(batch: Mapping[str, Any]) -> tuple[int, int]:
    ids = batch.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ValueError("a plan's batch needs input_ids of shape (batch, seq_len) (or x of an (x, y) pair)")
    return int(ids.shape[0]), int(ids.shape[1])


def _resized(batch: Mapping[str, Any], rows: int) -> dict[str, Any]:
    """The batch with `rows` rows: every tensor whose first dimension is the batch's, its rows repeated. Its
    values are the batch's, not zeros: a model may read them (transformers 4.x BERT warns of padding when
    the first or last token is its pad token, id 0), and the dry run answers such reads from the batch."""
    n, _ = _shape(batch)

    def resized(v: Any) -> Any:
        batched = isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n
        return v.repeat(-(-rows // n), *[1] * (v.dim() - 1))[:rows] if batched else v

    return {k: resized(v) for k, v in batch.items()}


def _prepared(model: nn.Module, spec: RunSpec) -> tuple[nn.Module, list[str]]:
    """A meta copy with the spec's model switches a dry run can take, and notes on those it cannot."""
    notes = []
    copy_ = meta_copy(model)
    attn = spec.attn if spec.attn in ("eager", "sdpa") else None
    if spec.attn in ("flex", "varlen"):
        notes.append(f"RunSpec.attn={spec.attn!r} is counted as the model's own attention (its CPU dry run "
                     "has no backward for it)")
    switches = RunSpec(attn=attn, activation_checkpointing=spec.activation_checkpointing)
    return switches.apply(copy_) if (attn or spec.activation_checkpointing) else copy_, notes


# --- counting the step's ops on fake tensors -----------------------------------------------------------

def _storage_key(t: torch.Tensor) -> tuple:
    """A tensor's identity that fake tensors have too: its storage, offset, shape and strides."""
    return (compat.storage_identity(t), t.storage_offset(), t.numel(), tuple(t.shape), tuple(t.stride()))


def _rows_at_most(weight: torch.Tensor, indices: torch.Tensor) -> int:
    """Bytes of the rows `indices` can name, at most: one per index (fake indices have no values)."""
    rows = min(indices.numel(), weight.shape[0])
    return rows * (weight[0].numel() if weight.dim() else 1) * weight.element_size()


@contextlib.contextmanager
def gpu_like_attention() -> Iterator[None]:
    """Inside the block SDPA runs without its dropout: a GPU's flash and memory-efficient kernels drop out
    inside the kernel, keeping no T x T matrix, while the CPU's flash kernel has no dropout and falls back to
    the math path, which does; the dry run and the count then see what a GPU runs (lesson 09)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def without_dropout(*args: Any, **kwargs: Any) -> torch.Tensor:
        if len(args) > 4:
            args = (*args[:4], 0.0, *args[5:])
        kwargs.pop("dropout_p", None)
        return sdpa(*args, **kwargs)

    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", without_dropout):
        yield


@contextlib.contextmanager
def _fake_counting() -> Iterator[None]:
    # count_ops keys a tensor by its data pointer, which fake tensors lack (every one reads 0), and reads an
    # embedding's distinct rows with torch.unique, which needs values: on fake tensors it keys by storage and
    # counts an embedding's rows at most once per index (the report asks for this rule inside opcount)
    with mock.patch.object(opcount, "_key", _storage_key), \
            mock.patch.object(opcount, "_distinct_rows", _rows_at_most):
        yield


def count_step(model: nn.Module, batch: Mapping[str, Any], *, precision: str = "fp32",
               fused_adamw: bool = True) -> dict[tuple[str, str], OpCount]:
    """Every op of one AdamW training step of `model` on `batch` at `precision` (autocast on the CPU), counted
    on fake tensors: calls, FLOPs and bytes per (phase, op), as lesson 04's `count_ops` counts a real step;
    nothing is allocated, the model is not changed (lesson 09)."""
    if not takes_course_batches(model):
        from helpers.core.adapt import adapter_hint

        raise ValueError(adapter_hint(model))
    host = as_batch(batch)
    _shape(host)
    cpu = torch.device("cpu")
    # the batch's values stay known: a model that reads one (transformers 4.x BERT: is the mask all ones?)
    # takes the branch a real step takes
    with compat.fake_step(host, cpu) as fake_batch, _fake_counting(), gpu_like_attention():
        fake = _fake_of(model, cpu).train()
        params = [p for p in fake.parameters() if p.requires_grad]
        # fused: one kernel for the update; else torch's default on a GPU, the multi-tensor (foreach) one
        opt = torch.optim.AdamW(params, lr=1e-3, fused=True) if fused_adamw else \
            torch.optim.AdamW(params, lr=1e-3, foreach=True)

        def step(phase: Callable[[str], Any]) -> None:
            with phase("forward"), autocast_context(precision, cpu):
                loss = loss_of(fake(**fake_batch))
            if loss is None:
                raise ValueError("the model returned no loss for the batch: give it labels")
            with phase("backward"):
                loss.backward()
            with phase(OPTIMIZER_PHASE):
                opt.step()
                opt.zero_grad(set_to_none=True)

        for p in params:  # AdamW's state appears at its first step: made on zero gradients, not by a pass
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        counts = count_ops(step, warmup=0)
    # prim:: ops are the fake mode's own questions (a tensor's device), not kernels
    return {k: c for k, c in counts.items() if not k[1].startswith("prim::")}


def _fake_of(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` copied with fake parameters and buffers (inside a fake mode), tied weights kept tied."""
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in memo:
            fake = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
            memo[id(t)] = nn.Parameter(fake, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) \
                else fake
    return copy.deepcopy(model, memo)


# --- the step's time -------------------------------------------------------------------------------------

def predict_step(model: nn.Module, batch: Mapping[str, Any], roofs: Roofline, *, precision: str = "fp32",
                 spec: RunSpec | None = None) -> StepTime:
    """`count_step` and `step_time` in one call: the predicted time of one training step of `model` on `batch`
    on `roofs` (a GPU class's datasheet roofs, or this machine's measured ones) (lesson 09)."""
    spec = spec or RunSpec()
    prepared, _ = _prepared(model, spec)
    counts = count_step(prepared, batch, precision=precision, fused_adamw=spec.fused_adamw)
    return step_time(counts, roofs, precision, fp8=spec.fp8)


# --- the memory: fits, and the largest batch that does --------------------------------------------------

class _DryRuns:
    """Each batch size's dry-run peak (bytes) of one prepared model at one precision, each run once."""

    def __init__(self, model: nn.Module, batch: Mapping[str, Any], precision: str, fused: bool) -> None:
        self.model, self.batch, self.precision, self.fused = model, batch, precision, fused
        self.peaks: dict[int, int] = {}
        self.states = 0  # bytes of the weights and AdamW's state at a peak: held at every batch size

    def __call__(self, rows: int) -> int:
        if rows not in self.peaks:
            with gpu_like_attention():
                est = estimate_step_memory(self.model, _resized(self.batch, rows), precision=self.precision,
                                           optimizer="adamw", fused=self.fused)
            self.peaks[rows] = est.peak
            self.states = max(self.states, est.parameters + est.optimizer)
        return self.peaks[rows]


def _line(seen: Mapping[int, int], at: int) -> float | None:
    """The peak at batch `at` on the line through the two sizes tried nearest it (None: fewer than two)."""
    if len(seen) < 2:
        return None
    (a, pa), (b, pb) = sorted((n, seen[n]) for n in sorted(seen, key=lambda n: (abs(n - at), n))[:2])
    return pa + (pb - pa) * (at - a) / (b - a)


def _reaches(seen: Mapping[int, int], usable: int, near: int) -> int | None:
    """The batch at which the line through the two sizes tried nearest `near` reaches `usable` bytes."""
    if len(seen) < 2:
        return None
    (a, pa), (b, pb) = sorted((n, seen[n]) for n in sorted(seen, key=lambda n: (abs(n - near), n))[:2])
    slope = (pb - pa) / (b - a)
    return a + math.floor((usable - pa) / slope) if slope > 0 else None


def largest_batch(peak: Callable[[int], int], usable: int, *, start: int = 1, limit: int = 1 << 16,
                  known: Mapping[int, int] | None = None, miss: float | None = None) -> int:
    """The largest batch n <= `limit` with peak(n) <= `usable` bytes, 0 if none fits, searched with `peak`
    (the dry run, a function of the batch size; `known`: peaks it gave before, by size) (lesson 09).

    Each size tried is where the line through the two nearest sizes tried so far reaches `usable` (doubling
    or halving before there are two). The answer n is a size that fits; n + 1 was tried and does not, or the
    line puts it over `usable` by more than twice the line's own miss at n plus 1 MiB (the dry run's peak
    grows by the same bytes per sample, so the line is exact up to the miss it shows): a dry run saved.
    `miss`: how far the line through `known` missed a dry run made to check it (`_check_line`): an answer
    between known sizes then comes from the line alone when it clears `usable` by twice that plus 1 MiB."""
    if not 1 <= start <= limit:
        raise ValueError(f"need 1 <= start <= limit, got start={start}, limit={limit}")
    seen: dict[int, int] = dict(known or {})
    if miss is not None and len(seen) >= 3:
        n = _reaches(seen, usable, start)
        n = _reaches(seen, usable, n) if n is not None else None  # again, between the sizes nearest it
        room = 2 * miss + 2**20
        if n is not None and min(seen) <= n < max(seen) and n <= limit:
            fits = seen[n] <= usable if n in seen else _line(seen, n) <= usable - room
            above = seen[n + 1] > usable if n + 1 in seen else _line(seen, n + 1) > usable + room
            if fits and above:
                return n
    lo, hi = 0, limit + 1  # peak(lo) fits (0: trivially), peak(hi) does not (limit + 1: never tried)
    n = start
    while True:
        predicted = _line({m: b for m, b in seen.items() if m != n}, n)
        if n not in seen:
            seen[n] = peak(n)
        lo, hi = (n, hi) if seen[n] <= usable else (lo, n)
        lo = max([lo] + [m for m, b in seen.items() if b <= usable and m < hi])  # what `known` says
        hi = min([hi] + [m for m, b in seen.items() if b > usable and m > lo])
        if hi - lo <= 1:
            return lo
        if lo == n and predicted is not None:
            miss = abs(seen[n] - predicted)
            beyond = _line(seen, n + 1)
            if beyond is not None and beyond - usable > 2 * miss + 2**20:
                return lo
        nxt = _reaches(seen, usable, n)
        if nxt is None:
            nxt = 2 * lo if hi > limit else (lo + hi) // 2
        n = min(max(nxt, lo + 1), hi - 1)  # strictly inside the bracket: every try narrows it


def _check_line(runs: _DryRuns, rows: int, usables: Sequence[int]) -> float | None:
    """Dry runs at `rows` and twice it draw a line; a third, at the largest batch the line gives for the
    classes' `usables`, checks it: how far the line missed that run (None: nothing to check)."""
    runs(rows)
    runs(2 * rows)
    guesses = [g for g in (_reaches(runs.peaks, u, rows) for u in usables) if g is not None and g > 0]
    far = max(guesses, default=None)
    if far is None or far in runs.peaks:
        return None
    predicted = _line(runs.peaks, far)
    return abs(runs(far) - predicted)


# --- the plan ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ClassPlan:
    """What one GPU class gets for the step (lesson 09)."""

    gpu: GPU
    precision: str
    precision_why: str
    techniques: tuple[str, ...]
    peak_bytes: int  # the dry run's peak at the planned batch and precision
    usable_bytes: int  # memory less the margin
    largest_batch: int | None  # None: not searched
    step: StepTime
    tokens_per_step: int
    mfu_peak: float
    mfu_peak_source: str
    model_flops_per_token: float
    price: float | None = None
    dataset_tokens: float | None = None
    decode_tokens_per_s: float | None = None

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.usable_bytes

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step.seconds

    @property
    def mfu(self) -> float:
        return self.tokens_per_s * self.model_flops_per_token / self.mfu_peak

    @property
    def epoch_s(self) -> float | None:
        return self.dataset_tokens / self.tokens_per_s if self.dataset_tokens else None

    @property
    def epoch_cost(self) -> float | None:
        if self.epoch_s is None or self.price is None:
            return None
        return self.epoch_s / 3600 * self.price * self.gpu.count


@dataclass(frozen=True)
class Plan:
    """A run planned on several GPU classes: one `ClassPlan` each, the table, the assumptions (lesson 09)."""

    model: str
    batch_size: int
    seq_len: int
    spec: RunSpec
    classes: tuple[ClassPlan, ...]
    weight_bytes_16: int  # the parameters in 16 bits (what decoding reads per token)
    kv_bytes_per_token: int | None  # None: not a language model
    prices: Prices | None
    dataset_tokens: float | None
    launch_s: float
    assumptions: tuple[str, ...] = field(default=ASSUMPTIONS)
    seconds: float = 0.0  # what making the plan took here

    def __getitem__(self, key: str) -> ClassPlan:
        for c in self.classes:
            if c.gpu.key == key:
                return c
        raise KeyError(f"no class {key!r} in this plan: it has {[c.gpu.key for c in self.classes]}")

    def cheapest(self) -> ClassPlan | None:
        """The class that fits at the lowest cost per epoch; None without prices or a data set size."""
        priced = [c for c in self.classes if c.fits and c.epoch_cost is not None]
        return min(priced, key=lambda c: c.epoch_cost) if priced else None

    def fastest(self) -> ClassPlan | None:
        """The class that fits with the shortest step."""
        fitting = [c for c in self.classes if c.fits]
        return min(fitting, key=lambda c: c.step.seconds) if fitting else None

    def table(self) -> Table:
        """One column per class, one row per figure, the last column naming where each row comes from."""
        keys = [c.gpu.key + (f" ×{c.gpu.count}" if c.gpu.count > 1 else "") for c in self.classes]
        t = Table(["", *keys, "source"], title=(
            f"Plan (a prediction): {self.model}, batch {self.batch_size} × {self.seq_len} tokens, AdamW"
            + (", FP8 linears" if self.spec.fp8 else "")))
        cs = self.classes

        def row(name: str, values: Sequence[Any], source: str) -> None:
            t.add(name, *values, source)

        row("memory (GiB)", [round(c.gpu.total_memory / GiB, 1) for c in cs],
            "what torch reports (helpers.measure.gpus)")
        row("trains in", [c.precision for c in cs], "course rule: helpers.core.precision.training_precision")
        row("can use", [", ".join(c.techniques) for c in cs],
            "course rules: precision_runs, fp8.fp8_capable, compat.flex_trains")
        row("peak of one step (GiB)", [round(c.peak_bytes / GiB, 2) for c in cs],
            "dry run (helpers.measure.memory.estimate_step_memory)")
        row(f"fits with a {MARGIN:.0%} margin", ["yes" if c.fits else "NO" for c in cs],
            f"dry run vs memory less helpers.measure.memory.MARGIN ({MARGIN:.0%})")
        if any(c.largest_batch is not None for c in cs):
            row("largest batch that fits", [c.largest_batch for c in cs], "dry run, searched (largest_batch)")
        row("step time (ms)", [_ms(c) for c in cs],
            f"op counts (dry run) on datasheet roofs + {self.launch_s * 1e6:g} µs per launch (assumed)")
        row("time in compute / memory / launch-bound ops (%)", [_split(c) for c in cs], "the same op table")
        row("tokens/s", [_num(c.tokens_per_s) if c.fits else None for c in cs], "batch × seq / step time")
        row("MFU it implies (%)", [round(100 * c.mfu, 1) if c.fits else None for c in cs],
            "6N+12LHQT FLOPs (helpers.measure.flops) / datasheet peak (roofline.mfu_peak)")
        if self.dataset_tokens:
            row(f"hours per epoch of {self.dataset_tokens:,.3g} tokens",
                [c.epoch_s / 3600 if c.fits else None for c in cs], "tokens / tokens/s")
        if self.prices is not None:
            row("USD per GPU-hour", [c.price for c in cs],
                f"EXAMPLE, not current: {self.prices.source} ({self.prices.date})"
                if self.prices is EXAMPLE_PRICES else f"{self.prices.source} ({self.prices.date})")
            if self.dataset_tokens:
                row("USD per epoch", [c.epoch_cost if c.fits and c.epoch_cost is not None else None
                                      for c in cs], "hours × price × GPUs")
        if self.kv_bytes_per_token is not None:
            row(f"decode tokens/s, batch 1, {self.seq_len}-token context (at most)",
                [_num(c.decode_tokens_per_s) for c in cs],
                "datasheet bandwidth / (16-bit weight bytes + the context's KV cache)")
            row("KV cache per token (KiB)", [round(self.kv_bytes_per_token / 1024, 1)] * len(cs),
                "2 × layers × KV heads × head dim × 2 bytes (model config)")
        return t

    def to_markdown(self) -> str:
        return self.table().to_markdown()

    def _repr_markdown_(self) -> str:
        return self.to_markdown() + "\n\n" + self.summary()

    def summary(self) -> str:
        """Two lines: the cheapest and the fastest class that fit."""
        lines = []
        cheap, fast = self.cheapest(), self.fastest()
        if fast is None:
            lines.append("No class fits one step at this batch: lower the batch (see 'largest batch').")
        else:
            lines.append(f"Fastest that fits: {fast.gpu.key}, {_ms(fast)} ms per step (predicted).")
        if cheap is not None:
            example = self.prices is EXAMPLE_PRICES
            lines.append(f"Cheapest per epoch that fits: {cheap.gpu.key}, {cheap.epoch_cost:,.3g} USD at the "
                         + ("EXAMPLE prices" if example else "prices") + f" of {self.prices.date}"
                         + (" (not current)." if example else "."))
        return "\n".join(lines)

    def assumptions_text(self) -> str:
        """The assumptions, one per line: print them beside the table."""
        return "Assumed:\n" + "\n".join(f"- {a}" for a in self.assumptions)


def _ms(c: ClassPlan) -> float:
    return round(c.step.seconds * 1e3, 3 if c.step.seconds < 0.01 else 1)


def _num(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.3g}")


def _split(c: ClassPlan) -> str:
    return " / ".join(f"{100 * c.step.share(r):.0f}" for r in ("compute", "memory", "overhead"))


def _kv_bytes_per_token(model: nn.Module) -> int:
    shape = model_shape(model)
    kv_heads = shape.n_heads
    for m in model.modules():
        n = getattr(getattr(m, "config", None), "num_key_value_heads", None)
        if isinstance(n, int) and n > 0:
            kv_heads = n
            break
    return 2 * shape.n_layers * kv_heads * shape.head_dim * 2


def plan(model: nn.Module, batch: Mapping[str, Any] | tuple[int, int], spec: RunSpec | None = None, *,
         gpus: Sequence[str | GPU] | None = None, dataset_tokens: float | None = None,
         prices: Prices | None = EXAMPLE_PRICES, launch_s: float = LAUNCH_S,
         search: bool = True) -> Plan:
    """Plan one training step of `model` on `batch` (a dict, an (x, y) pair, or a (batch, seq_len) shape for
    random tokens) with `spec`'s switches on each GPU class of `gpus` (default: every class of
    helpers.measure.gpus): precision and techniques, memory and whether it fits, the largest batch (`search`),
    step time, tokens/s,
    MFU, epoch time and cost for `dataset_tokens`, and the serving row. Nothing runs on a GPU (lesson 09)."""
    import time

    started = time.perf_counter()
    spec = spec or RunSpec()
    if not isinstance(spec, RunSpec):
        raise ValueError(f"spec must be a helpers.train.runspec.RunSpec, got {type(spec).__name__}")
    classes = [gpu(g) for g in (gpus if gpus is not None else list(GPUS))]
    if not classes:
        raise ValueError("give at least one GPU class: plan(..., gpus=['T4', 'A100-80'])")
    if dataset_tokens is not None and not dataset_tokens > 0:
        raise ValueError(f"dataset_tokens must be a positive number of tokens, got {dataset_tokens!r}")
    if isinstance(batch, tuple) and len(batch) == 2 and all(isinstance(x, int) for x in batch):
        batch = example_batch(model, *batch)
    host = as_batch(batch)
    rows, seq = _shape(host)
    prepared, notes = _prepared(model, spec)
    per_token = model_flops_per_token(prepared, seq)
    counts: dict[str, dict] = {}
    runs: dict[str, _DryRuns] = {}
    misses: dict[str, float | None] = {}  # per precision family: how far the dry runs' line missed its check
    usables = [int(g.total_memory * (1 - MARGIN)) for g in classes]
    out = []
    for g in classes:
        precision, why, techniques, mfu_flops, mfu_source = class_rules(g)
        family = _FAMILY[precision]
        if family not in counts:
            counts[family] = count_step(prepared, host, precision=family, fused_adamw=spec.fused_adamw)
            runs[family] = _DryRuns(prepared, host, family, spec.fused_adamw)
        roofs = datasheet_roofline(g, launch_s=launch_s)
        usable = int(g.total_memory * (1 - MARGIN))
        fp8 = spec.fp8 and "FP8" in techniques
        if search and family not in misses:
            misses[family] = _check_line(runs[family], rows, usables)
        largest = None
        if search:  # the weights and AdamW's state alone over the memory: no batch fits, none to search
            largest = 0 if runs[family].states > usable else largest_batch(
                runs[family], usable, start=rows, known=runs[family].peaks, miss=misses[family])
        weights = 2 * sum(p.numel() for p in prepared.parameters())
        # one generated token reads every weight and the keys and values of the whole context once
        kv = 0 if _per_row_labels(model) else seq * _kv_bytes_per_token(prepared)
        decode = None if _per_row_labels(model) else g.bandwidth / (weights + kv)
        out.append(ClassPlan(g, precision, why, tuple(techniques), runs[family](rows), usable, largest,
                             step_time(counts[family], roofs, precision, fp8=fp8), rows * seq, mfu_flops,
                             mfu_source, per_token, prices.of(g.key) if prices else None, dataset_tokens,
                             decode))
    assumptions = list(ASSUMPTIONS)
    assumptions[1] = assumptions[1].replace(f"{LAUNCH_S * 1e6:g} µs", f"{launch_s * 1e6:g} µs")
    assumptions += ([_FP8] if spec.fp8 else []) + ([_COMPILE] if spec.compile else []) + notes
    if prices is not None:
        example = "an EXAMPLE, not current: " if prices is EXAMPLE_PRICES else ""
        assumptions.append(f"prices per GPU-hour: {example}{prices.source} ({prices.date}); prices change: "
                           "pass your own (Prices) with the day you read them")
    lm = not _per_row_labels(model)
    weights = 2 * sum(p.numel() for p in prepared.parameters())
    return Plan(_describe(model), rows, seq, spec, tuple(out), weights,
                _kv_bytes_per_token(prepared) if lm else None, prices, dataset_tokens, launch_s,
                tuple(assumptions), time.perf_counter() - started)


def _describe(model: nn.Module) -> str:
    inner = compat.unwrap_model(model)
    inner = getattr(inner, "model", inner) if type(inner).__name__ == "CourseModel" else inner
    params = sum(p.numel() for p in inner.parameters())
    return f"{type(inner).__name__} ({params / 1e6:,.1f} M parameters)"
