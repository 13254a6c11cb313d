"""The largest batch that fits, predicted with lesson 03's dry run (lesson 09): each size tried is where the
line through the two nearest sizes tried so far reaches the memory, so a few dry runs serve all classes.
Guide: docs/library/plan.md#helpersplanbatch_search"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch
from torch import nn

from helpers.core.adapt import batch_shape
from helpers.measure.memory import estimate_step_memory
from helpers.measure.opcount import gpu_like_attention

__all__ = ["DryRuns", "predict_max_batch_size", "check_line"]


def _resized(batch: Mapping[str, Any], rows: int) -> dict[str, Any]:
    """The batch with `rows` rows, its own rows repeated."""
    # not zeros: a model may read the values (transformers 4.x BERT warns of padding at a pad token, id 0)
    n, _ = batch_shape(batch)

    def resized(v: Any) -> Any:
        batched = isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n
        return v.repeat(-(-rows // n), *[1] * (v.dim() - 1))[:rows] if batched else v

    return {k: resized(v) for k, v in batch.items()}


class DryRuns:
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


def predict_max_batch_size(peak: Callable[[int], int], usable: int, *, start: int = 1, limit: int = 1 << 16,
                           known: Mapping[int, int] | None = None, miss: float | None = None) -> int:
    """The largest batch n <= `limit` whose dry-run `peak(n)` fits `usable` bytes, 0 if none (lesson 09),
    predicted from few dry runs; find_max_batch_size runs steps until out of memory instead."""
    if not 1 <= start <= limit:
        raise ValueError(f"need 1 <= start <= limit, got start={start}, limit={limit}")
    seen: dict[int, int] = dict(known or {})  # `known`: peaks `peak` gave before, by size
    # `miss`: how far the line through `known` missed a dry run made to check it (`check_line`); an answer
    # between known sizes then comes from the line alone when it clears `usable` by twice that plus 1 MiB
    if miss is not None and len(seen) >= 3:
        n = _reaches(seen, usable, start)
        n = _reaches(seen, usable, n) if n is not None else None  # again, between the sizes nearest it
        room = 2 * miss + 2**20
        if n is not None and min(seen) <= n < max(seen) and n <= limit:
            fits = seen[n] <= usable if n in seen else _line(seen, n) <= usable - room
            above = seen[n + 1] > usable if n + 1 in seen else _line(seen, n + 1) > usable + room
            if fits and above:
                return n
    # each size tried is where the line through the two nearest sizes tried reaches `usable` (doubling or
    # halving before there are two); the peak grows by the same bytes per sample, so the line is exact up to
    # the miss it shows: n is the answer once n + 1 is over `usable` by more than twice that plus 1 MiB
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


def check_line(runs: DryRuns, rows: int, usables: Sequence[int]) -> float | None:
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
