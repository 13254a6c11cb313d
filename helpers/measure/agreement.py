"""Correct before fast: does a faster variant compute what the reference computes, within the looser
precision's tolerance? (lesson 08's ladder checks every stack with it before timing it)
Guide: docs/library/measure.md#helpersmeasureagreement"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["PRECISION_ORDER", "TOLERANCES", "Agreement", "looser", "agree", "optimizer_step_agreement"]

PRECISION_ORDER = ("fp32", "tf32", "fp16", "bf16", "fp8")  # later = looser tolerance
# (atol, rtol) for logits and loss: |a - b| <= atol + rtol * max|reference|, per the looser precision.
# fp16 keeps 10 mantissa bits (bf16 7): between TF32's inputs (10 bits, fp32 sums) and bf16.
TOLERANCES: dict[str, tuple[float, float]] = {"fp32": (1e-5, 1e-4), "tf32": (2e-3, 1e-2),
                                              "fp16": (1e-2, 2.5e-2), "bf16": (2e-2, 5e-2),
                                              "fp8": (1e-1, 1e-1)}


@dataclass(frozen=True)
class Agreement:
    """The result of a check: within tolerance or not, the largest difference, and the allowed one."""

    ok: bool
    err: float
    allowed: float

    def __str__(self) -> str:
        return f"|Δ| {self.err:.1e} {'≤' if self.ok else '>'} {self.allowed:.1e}"


def looser(a: str, b: str) -> str:
    """The looser of two precisions, whose tolerance a comparison between them uses (lesson 08)."""
    for p in (a, b):
        if p not in PRECISION_ORDER:
            raise ValueError(f"unknown precision {p!r}: use one of {PRECISION_ORDER}")
    return max(a, b, key=PRECISION_ORDER.index)


def agree(a: torch.Tensor, b: torch.Tensor, precision: str) -> Agreement:
    """Whether `a` matches the reference `b` within the tolerance of `precision` (lesson 08)."""
    if precision not in TOLERANCES:
        raise ValueError(f"unknown precision {precision!r}: use one of {tuple(TOLERANCES)}")
    if a.shape != b.shape:
        raise ValueError(f"cannot compare shapes {tuple(a.shape)} and {tuple(b.shape)}")
    atol, rtol = TOLERANCES[precision]
    err = (a.float() - b.float()).abs().max().item()
    allowed = atol + rtol * b.float().abs().max().item()
    return Agreement(err <= allowed, err, allowed)


def optimizer_step_agreement(params: Sequence[nn.Parameter], make_reference: Callable[[list], Any],
                             make_candidate: Callable[[list], Any], rtol: float = 1e-3) -> Agreement:
    """One step of two optimizers on copies of the same parameters and gradients: do the updates agree within
    `rtol` of the largest reference update? (lesson 08; an update is ~lr, far below a parameter's size)"""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        raise ValueError("no parameter has a gradient: run a backward pass before the optimizer check")
    updates = []
    for make in (make_reference, make_candidate):
        copies = [p.detach().clone().float().requires_grad_(True) for p in with_grad]
        for c, p in zip(copies, with_grad):
            c.grad = p.grad.detach().clone().float()
        make(copies).step()
        deltas = [(c.detach() - p.detach().float()).flatten() for c, p in zip(copies, with_grad)]
        updates.append(torch.cat(deltas))
    err = (updates[1] - updates[0]).abs().max().item()
    allowed = rtol * updates[0].abs().max().item()
    return Agreement(err <= allowed, err, allowed)
