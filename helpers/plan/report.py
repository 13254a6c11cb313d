"""What a plan reports (lesson 09): one GPU class's figures (`ClassPlan`), the table over the classes with
each row's source (`Plan`), and the prices a cost per epoch takes: a parameter, never a fact of the course."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from helpers.core.tables import Table
from helpers.core.units import GiB
from helpers.measure.gpus import GPU
from helpers.measure.memory import MARGIN
from helpers.plan.steptime import StepTime
from helpers.train.runspec import RunSpec

__all__ = ["Prices", "EXAMPLE_PRICES", "ClassPlan", "Plan"]


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
    assumptions: tuple[str, ...] = ()  # the planner's ASSUMPTIONS and the notes of this plan
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
            row("largest batch that fits", [c.largest_batch for c in cs],
                "dry run, searched (predict_max_batch_size)")
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
