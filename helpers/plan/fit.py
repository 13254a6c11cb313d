"""Make a run fit (lesson 10): every combination of the memory levers priced in memory per GPU (the dry run's
terms) and in step time, and per GPU class the fastest (or cheapest) that fits, with the reason.
Guide: docs/plan.md#make-it-fit-lesson-10"""

from __future__ import annotations

import itertools
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from helpers.core.tables import Table
from helpers.core.units import GiB
from helpers.measure.flops import transformer_blocks
from helpers.measure.gpus import GPU, gpu
from helpers.measure.levers import (
    LEVERS,
    SHARDINGS,
    Levers,
    LoRA,
    add_lora,
    optimizer_state_bytes,
    turn_on_checkpointing,
)
from helpers.measure.memory import MARGIN, MemoryEstimate, estimate_step_memory
from helpers.measure.opcount import OPTIMIZER_PHASE, OpCount, count_step
from helpers.measure.roofline import LAUNCH_S, datasheet_roofline
from helpers.plan.calibrate import STACKS, Expected, expected
from helpers.plan.extrapolate import consistent, corners_of, counts_at, layers_of, memory_at
from helpers.plan.planner import class_rules, example_batch, meta_copy
from helpers.plan.report import EXAMPLE_PRICES, Prices
from helpers.plan.steptime import StepTime, step_time

__all__ = [
    "OPTIMIZERS",
    "GpuMemory",
    "Option",
    "FitPlan",
    "make_it_fit",
]

OPTIMIZERS = ("adamw", "adamw8bit")  # what the planner tries: torch's AdamW; bitsandbytes' 8-bit AdamW
# a fused AdamW step moves 28 bytes per fp32 parameter (reads weight, gradient and two states; writes weight
# and states); with 8-bit states, 16: the optimizer's op table is scaled by that ratio
_ADAMW8_BYTES = 16 / 28
TIE = 1.01  # options whose time (or cost) is within 1 % of the best count as equally good
# which levers cut which part of a GPU's memory (the seed's decision: accumulation and checkpointing for
# activations; sharding, offload and smaller state for what the model itself holds)
CUTS = {
    "activations": ("accumulation", "checkpointing"),
    "weights": ("sharding", "offload", "16-bit weights", "LoRA"),
    "gradients": ("sharding", "16-bit weights", "LoRA"),
    "optimizer state": ("sharding", "offload", "8-bit state", "16-bit weights", "LoRA"),
    "FSDP buffers": ("16-bit weights",),
}


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's bytes at the step's peak, by what holds them (lesson 10)."""

    weights: int
    gradients: int
    optimizer: int
    activations: int  # activations and temporaries (the logits), and the batch
    gathered: int = 0  # FSDP2's buffers: the unsharded weights it computes with, the reduce-scatter's

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.gathered

    def parts(self) -> dict[str, int]:
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer state": self.optimizer,
            "activations": self.activations,
            "FSDP buffers": self.gathered,
        }

    def largest(self) -> str:
        return max(self.parts().items(), key=lambda kv: kv[1])[0]


def _unsharded(model: nn.Module) -> int:
    """Bytes FSDP2 holds gathered at once: the root's parameters (embeddings, head: gathered for the whole
    step) and two blocks' (the one computing and the one prefetched), in the parameters' own dtype."""
    blocks = transformer_blocks(model) or []
    block = max((sum(p.numel() for p in b.parameters()) for b in blocks), default=0)
    every = sum(p.numel() for p in model.parameters())
    root = every - sum(p.numel() for b in blocks for p in b.parameters())
    size = next(model.parameters()).element_size()
    return size * (root + 2 * block)


MAX_CORNER_ROWS = 32  # the largest micro-batch a corner's dry run is made at


def _peaks_with_gradients(corners: dict, rows: int) -> bool:
    return any(e.at_peak.get("Gradient", 0) > 0 for (_, r), e in corners.items() if r == rows)


@dataclass
class _Variant:
    """One prepared model (checkpointing on or off, LoRA or not), its dry runs and op counts by corner, each
    made when first asked for (a published step time needs the counts only)."""

    model: nn.Module
    prepare: Any  # how a rebuilt 1- or 2-layer copy is prepared the same way
    family: str  # the precision the dry runs and counts run in
    seq_len: int
    _memory: dict | None = None
    _counts: dict | None = None

    @property
    def memory(self) -> dict:
        if self._memory is None:
            seq, family = self.seq_len, self.family
            run = lambda m, r: estimate_step_memory(m, example_batch(m, r, seq), precision=family)  # noqa: E731
            rows = (1, 2, 4)
            self._memory = corners_of(run, self.model_full, rows, prepare=self.prepare)
            # more sequences until the top segment's copies peak at one moment, the end of the forward pass
            # (with checkpointing, 1-2-layer copies of a large-vocabulary model peak late in the backward at
            # 2 to 4 sequences): the moment that grows with the batch, extrapolated above it
            while rows[-1] < MAX_CORNER_ROWS and not (
                consistent(self._memory, *rows[-2:]) and not _peaks_with_gradients(self._memory, rows[-1])
            ):
                rows = (*rows, 2 * rows[-1])
                self._memory.update(corners_of(run, self.model_full, rows[-1:], prepare=self.prepare))
        return self._memory

    @property
    def counts(self) -> dict:
        if self._counts is None:
            seq, family = self.seq_len, self.family
            self._counts = corners_of(
                lambda m, r: count_step(m, example_batch(m, r, seq), precision=family),
                self.model_full,
                (1, 2),
                prepare=self.prepare,
            )
        return self._counts

    model_full: nn.Module | None = None  # the unprepared model the copies are rebuilt from


@dataclass(frozen=True)
class Option:
    """One class with one combination of levers: its memory per GPU and its step time (lesson 10)."""

    gpu: GPU
    levers: Levers
    memory: GpuMemory
    usable: int  # bytes per GPU less the margin
    step: StepTime
    tokens_per_step: int  # the global batch's tokens
    price: float | None = None  # USD per GPU-hour
    dataset_tokens: float | None = None
    stack: str = "eager"  # what the step will run as: helpers.plan.calibrate.STACKS

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.usable

    @property
    def expected(self) -> Expected:
        """The step's expected seconds and range on its stack, calibrated on published runs (lesson 09)."""
        return expected(self.step, self.stack)

    @property
    def tokens_per_s(self) -> float:
        """At the expected step time."""
        return self.tokens_per_step / self.expected.seconds

    @property
    def epoch_cost(self) -> Expected | None:
        """USD per epoch of `dataset_tokens`, expected and its range."""
        if self.price is None or not self.dataset_tokens:
            return None
        steps = self.dataset_tokens / self.tokens_per_step
        return self.expected.scaled(steps / 3600 * self.price * self.levers.gpus)


@dataclass(frozen=True)
class FitPlan:
    """Every option tried on every class, and per class the one chosen (lesson 10)."""

    model: str
    seq_len: int
    global_batch: int
    options: tuple[Option, ...]
    objective: str  # "time" or "cost"
    allowed: tuple[str, ...]
    seconds: float = 0.0

    def of(self, key: str) -> list[Option]:
        found = [o for o in self.options if o.gpu.key == key]
        if not found:
            raise KeyError(
                f"no class {key!r} in this plan: it has {sorted({o.gpu.key for o in self.options})}"
            )
        return found

    def baseline(self, key: str) -> Option:
        """No lever pulled: the whole batch at once on each GPU, plain data parallelism."""
        return min(self.of(key), key=lambda o: (len(o.levers.used()), -o.levers.micro_batch))

    def chosen(self, key: str) -> Option | None:
        """The fastest (or cheapest) option that fits, fewer levers on a tie; None when none fits."""
        fitting = [o for o in self.of(key) if o.fits]
        if not fitting:
            return None
        cost = (
            (lambda o: o.epoch_cost.seconds if o.epoch_cost else math.inf)
            if self.objective == "cost"
            else (lambda o: o.expected.seconds)
        )
        best = min(cost(o) for o in fitting)
        # within 1 % of the best is a tie (below what the model can tell apart): then the fewest levers
        near = [o for o in fitting if cost(o) <= best * TIE]
        return min(near, key=lambda o: (len(o.levers.used()), cost(o)))

    def why(self, key: str) -> str:
        """In the seed's words: which part of the memory is too large, which lever cuts it, at what time."""
        base, pick = self.baseline(key), self.chosen(key)
        usable = base.usable / GiB
        parts = ", ".join(f"{k} {v / GiB:.1f}" for k, v in base.memory.parts().items() if v)
        head = (
            f"{key}: with no lever the step needs {base.memory.total / GiB:.1f} GiB per GPU, {usable:.1f} "
            f"usable ({parts} GiB); the largest part is {base.memory.largest()}."
        )
        if base.fits and pick.levers == base.levers:
            return head + " It fits as it is: no lever needed, and none makes it faster."
        if base.fits:
            head += " It fits as it is; a lever still makes it faster."
        if pick is None:
            least = min(self.of(key), key=lambda o: o.memory.total)  # the most the allowed levers do
            part = least.memory.largest()
            others = [lv for lv in CUTS[part] if lv not in self.allowed]
            help_ = (
                f"{', '.join(others)} would cut them"
                if others
                else "no lever cuts them further: a shorter sequence or a smaller model"
            )
            return (
                f"{head} Nothing allowed ({', '.join(self.allowed) or 'no lever'}) makes it fit: at best "
                f"({least.levers.describe()}) it needs {least.memory.total / GiB:.1f} GiB, "
                f"{part} {least.memory.parts()[part] / GiB:.1f} of it; {help_}."
            )
        lines = [
            head,
            f"Chosen: {pick.levers.describe()} -> {pick.memory.total / GiB:.1f} GiB, "
            f"step {_ms_range(pick.expected)} ms expected.",
        ]
        for lever in pick.levers.used():  # what each lever of the choice buys, by taking it away
            without = self._without(pick, lever)
            if without is not None:
                saved = without.memory.total - pick.memory.total
                cost = pick.expected.seconds / without.expected.seconds - 1
                lines.append(f"  {lever}: saves {saved / GiB:.1f} GiB for {cost:+.0%} step time")
        return "\n".join(lines)

    def _without(self, pick: Option, lever: str) -> Option | None:
        lv = pick.levers
        undo = {
            "accumulation": dict(micro_batch=lv.micro_batch * lv.accumulation, accumulation=1),
            "checkpointing": dict(checkpointing=False),
            "sharding": dict(sharding="none", offload=False),
            "offload": dict(offload=False),
            "16-bit weights": dict(weights16=False),
            "8-bit state": dict(optimizer="adamw"),
            "LoRA": dict(lora_rank=0),
        }
        target = replace(lv, **undo[lever])
        return next((o for o in self.of(pick.gpu.key) if o.levers == target), None)

    def table(self) -> Table:
        keys = list(dict.fromkeys(o.gpu.key for o in self.options))
        t = Table(
            ["", *keys],
            title=(
                f"Make it fit: {self.model}, {self.global_batch} x {self.seq_len} tokens "
                f"per optimizer step ({', '.join(self.allowed)} allowed)"
            ),
        )
        picks = [self.chosen(k) for k in keys]
        bases = [self.baseline(k) for k in keys]
        t.add(
            "no lever: GiB per GPU (usable)",
            *[f"{b.memory.total / GiB:.1f} ({b.usable / GiB:.1f})" for b in bases],
        )
        t.add("largest part without levers", *[b.memory.largest() for b in bases])
        t.add("levers chosen", *[p.levers.describe() if p else "nothing fits" for p in picks])
        for part in ("weights", "gradients", "optimizer state", "activations", "FSDP buffers"):
            t.add(
                f"  {part} (GiB per GPU)",
                *[round(p.memory.parts()[part] / GiB, 2) if p else None for p in picks],
            )
        t.add(
            "step at the roofs (ms), bound by",
            *[f"{_sig(p.step.seconds * 1e3)}, {p.step.bound}" if p else None for p in picks],
        )
        t.add("step expected (ms, range)", *[_ms_range(p.expected) if p else None for p in picks])
        t.add("tokens/s expected", *[float(f"{p.tokens_per_s:.2g}") if p else None for p in picks])
        if any(p and p.epoch_cost is not None for p in picks):
            t.add(
                "USD per epoch (range)",
                *[_usd_range(p.epoch_cost) if p and p.epoch_cost else None for p in picks],
            )
        return t

    def _repr_markdown_(self) -> str:
        return self.table().to_markdown()


class Pricer:
    """Prices combinations of levers for one model and sequence length: memory per GPU and step time on a
    class, from dry runs and op counts of 1- and 2-layer copies of the model, each made once (lesson 10)."""

    def __init__(
        self,
        model: nn.Module,
        seq_len: int,
        *,
        lora_targets: tuple[str, ...] | str | None = None,
        launch_s: float = LAUNCH_S,
    ) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        self.model, self.seq_len, self.lora_targets, self.launch_s = model, seq_len, lora_targets, launch_s
        self.layers = layers_of(model)
        self.variants: dict[tuple, _Variant] = {}

    def variant(self, family: str, levers: Levers) -> _Variant:
        """The model as `levers` prepare it (LoRA, 16-bit weights, checkpointing), its dry runs and counts."""
        key = (family, levers.checkpointing, levers.lora_rank, levers.weights16)
        if key not in self.variants:

            def prepare(model: nn.Module) -> nn.Module:
                lora = levers.lora_rank
                base = meta_copy(model)
                if lora:  # peft's adapters, the base frozen in bf16 (helpers.measure.levers)
                    base = add_lora(base, LoRA(rank=lora, alpha=2 * lora, targets=self.lora_targets))
                if levers.weights16 and not lora:
                    base = base.to(torch.bfloat16)
                if levers.checkpointing:
                    turn_on_checkpointing(base)
                return base

            self.variants[key] = _Variant(
                prepare(self.model), prepare, family, self.seq_len, model_full=self.model
            )
        return self.variants[key]

    def step(self, g: str | GPU, levers: Levers, *, precision: str | None = None) -> StepTime:
        """`levers` on class `g`: the optimizer step's time at the roofs, from the op counts alone (no dry
        run: a published step time is rebuilt with this) (lessons 09, 10)."""
        g = gpu(g)
        if levers.gpus != g.count:
            raise ValueError(f"{g.key} has {g.count} GPU(s), the levers spread over {levers.gpus}")
        precision = precision or class_rules(g)[0]
        v = self.variant(_family(precision), levers)
        counts = counts_at(v.counts, self.layers, levers.micro_batch)
        trainable = sum(p.numel() for p in v.model.parameters() if p.requires_grad)
        params = sum(p.numel() for p in v.model.parameters())
        return step_time(
            _optimizer_counts(counts, levers.optimizer),
            datasheet_roofline(g, launch_s=self.launch_s),
            precision,
            levers=levers,
            g=g,
            trainable=trainable,
            parameters=params,
        )

    def memory(self, g: str | GPU, levers: Levers, *, precision: str | None = None) -> GpuMemory:
        """`levers` on class `g`: the memory per GPU by part, from the dry runs alone (no op count; a
        published memory figure is rebuilt with this) (lessons 09, 10)."""
        g = gpu(g)
        v = self.variant(_family(precision or class_rules(g)[0]), levers)
        return _per_gpu(memory_at(v.memory, self.layers, levers.micro_batch), v.model, levers)

    def option(
        self,
        g: str | GPU,
        levers: Levers,
        *,
        precision: str | None = None,
        prices: Prices | None = None,
        dataset_tokens: float | None = None,
    ) -> Option:
        """`levers` on class `g` (its precision by the course's rules, or `precision`): memory and time."""
        g = gpu(g)
        precision = precision or class_rules(g)[0]
        step = self.step(g, levers, precision=precision)
        board = re.sub(r"^\d+x", "", g.key)  # prices are per GPU of the board
        usable = int(g.total_memory * (1 - MARGIN)) if g.total_memory else 0
        return Option(
            g,
            levers,
            self.memory(g, levers, precision=precision),
            usable,
            step,
            levers.global_batch * self.seq_len,
            prices.of(board) if prices else None,
            dataset_tokens,
        )


def make_it_fit(
    model: nn.Module,
    *,
    seq_len: int,
    global_batch: int,
    gpus: Sequence[str | GPU],
    allow: Sequence[str] = ("accumulation", "checkpointing", "sharding", "offload"),
    objective: str = "time",
    stack: str = "eager",
    lora_rank: int = 8,
    lora_targets: tuple[str, ...] | str | None = None,
    prices: Prices | None = EXAMPLE_PRICES,
    dataset_tokens: float | None = None,
    launch_s: float = LAUNCH_S,
    pricer: Pricer | None = None,
) -> FitPlan:
    """Per class of `gpus` ("8xH100": 8 data-parallel GPUs), the fastest (objective="cost": cheapest) levers
    of `allow` fitting `global_batch` sequences a step, timed on `stack`; `pricer`: to reuse (lesson 10)."""
    started = time.perf_counter()
    bad = set(allow) - set(LEVERS)
    if bad:
        raise ValueError(f"unknown lever(s) {sorted(bad)}: allow some of {LEVERS}")
    if objective not in ("time", "cost"):
        raise ValueError(f"objective must be 'time' or 'cost', got {objective!r}")
    if stack not in STACKS:
        raise ValueError(f"stack must be one of {STACKS}, got {stack!r}")
    if global_batch < 1:
        raise ValueError(f"global_batch must be >= 1 sequences, got {global_batch}")
    if pricer is None:
        pricer = Pricer(model, seq_len, lora_targets=lora_targets, launch_s=launch_s)
    elif (pricer.model, pricer.seq_len, pricer.lora_targets, pricer.launch_s) != (
        model, seq_len, lora_targets, launch_s
    ):
        raise ValueError(
            "pricer was made for another model, seq_len, lora_targets or launch_s: make it with "
            "Pricer(model, seq_len, lora_targets=..., launch_s=...) as this call has them, or leave it out"
        )
    options = []
    for g in (gpu(g) for g in gpus):
        if global_batch % g.count:
            raise ValueError(f"{g.key}: a global batch of {global_batch} does not split over {g.count} GPUs")
        precision = class_rules(g)[0]
        for levers in _combinations(global_batch // g.count, g.count, allow, lora_rank):
            option = pricer.option(
                g, levers, precision=precision, prices=prices, dataset_tokens=dataset_tokens
            )
            options.append(replace(option, stack=stack))
    name = f"{type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e9:,.2f} B parameters)"
    return FitPlan(
        name, seq_len, global_batch, tuple(options), objective, tuple(allow), time.perf_counter() - started
    )


def _combinations(per_gpu: int, n: int, allow: Sequence[str], lora_rank: int) -> list[Levers]:
    micro = [m for m in range(1, per_gpu + 1) if per_gpu % m == 0] if "accumulation" in allow else [per_gpu]
    micro = [m for m in micro if m & (m - 1) == 0 or m == per_gpu]  # powers of two and the whole batch
    shardings = [s for s in SHARDINGS if n > 1 and (s == "none" or "sharding" in allow)] or ["none"]
    both = (False, True)
    out = []
    for m, ckpt, shard, off, w16, opt, lora in itertools.product(
        micro,
        both if "checkpointing" in allow else (False,),
        shardings,
        both if "offload" in allow else (False,),
        both if "16-bit weights" in allow else (False,),
        OPTIMIZERS if "8-bit state" in allow else ("adamw",),
        (0, lora_rank) if "LoRA" in allow else (0,),
    ):
        if off and shard != "full" and n > 1:
            continue  # FSDP2 offloads sharded state; DDP and ZeRO-1 keep theirs
        if w16 and lora:
            continue  # LoRA's base is 16-bit already
        out.append(Levers(m, per_gpu // m, ckpt, n, shard, off, w16, opt, lora))
    return out


def _ms_range(e: Expected) -> str:
    """"1,300 (1,100 to 1,560)": milliseconds, three significant figures at most, no exponent."""
    return f"{_sig(e.seconds * 1e3)} ({_sig(e.low * 1e3)} to {_sig(e.high * 1e3)})"


def _sig(x: float) -> str:
    """`x` to three significant figures, written out ("3,040", "36.2", "0.512")."""
    if not x:
        return "0"
    r = float(f"{x:.3g}")
    return f"{r:,.{max(0, 2 - math.floor(math.log10(abs(r))))}f}"


def _usd_range(e: Expected) -> str:
    return f"{_sig(e.seconds)} ({_sig(e.low)} to {_sig(e.high)})"


def _family(precision: str) -> str:
    """The precision a dry run runs in: fp16 and bf16 hold the same bytes and run the same ops."""
    return "fp32" if precision in ("fp32", "tf32") else "bf16"


def _per_gpu(est: MemoryEstimate, model: nn.Module, levers: Levers) -> GpuMemory:
    """One GPU's bytes under `levers`: the whole model's dry run at one micro-batch, each category divided or
    moved as each lever does (tests/test_fit.py: within 5 % of the levers' own dry run)."""
    at = est.at_peak  # the tracker's categories at the one pass's peak; the rest of the peak: the batch
    weights, optimizer = at.get("Parameter", 0) + at.get("Buffer", 0), at.get("Optstate", 0)
    # the gradients alive at the peak, at most all of them: a segment whose corners peaked at two moments can
    # extrapolate the category past it while the peak itself stays right
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    gradients = min(at.get("Gradient", 0), trainable)
    activations = max(est.peak - weights - optimizer - gradients, 0)  # activations, temporaries, the batch
    if levers.accumulation > 1:  # the gradients of the micro-batches before live through the next one's pass
        gradients = trainable
    if levers.optimizer == "adamw8bit":  # bitsandbytes keeps its states in uint8 whatever the weights' dtype
        optimizer = optimizer_state_bytes(model, "adamw8bit")
    n, gathered = levers.gpus, 0
    if levers.sharding in ("optimizer", "full"):
        optimizer //= n
    if levers.sharding == "full" or (levers.offload and n == 1):  # FSDP2
        # each rank keeps its shard, gathers what it computes, and reduce-scatters gradients through a buffer
        # (the reduce-scatter's buffer, one micro-step's gradients / n, counts with the gathered weights)
        weights, gradients, gathered = weights // n, gradients // n, _unsharded(model) + gradients // n
    if levers.offload:  # FSDP2's CPUOffloadPolicy: the shards and the optimizer on the host
        weights, optimizer, gradients = 0, 0, 0
    return GpuMemory(weights, gradients, optimizer, activations, gathered)


def _optimizer_counts(counts: Mapping[tuple[str, str], OpCount], optimizer: str) -> dict:
    if optimizer == "adamw":
        return dict(counts)
    return {
        k: (
            replace(c, bytes_read=c.bytes_read * _ADAMW8_BYTES, bytes_written=c.bytes_written * _ADAMW8_BYTES)
            if k[0] == OPTIMIZER_PHASE
            else c
        )
        for k, c in counts.items()
    }
