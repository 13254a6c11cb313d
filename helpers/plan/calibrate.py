"""The expected step time (lessons 09, 10): the roof plan (a bound) with its memory-bound kernels slowed by a
factor per stack, fitted on published runs (`helpers.plan.published`); the range is the fit's leave-one-out
error. Guide: docs/plan.md#the-expected-step-time-how-it-is-calibrated"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from helpers.plan.steptime import StepTime

__all__ = ["STACKS", "ESTIMATES", "WITHIN", "Observed", "Expected", "Calibration", "CALIBRATION", "expected",
           "expected_seconds", "fit_factors", "leave_one_out", "calibrate"]

STACKS = ("eager", "compiled", "fused")  # plain PyTorch ops; torch.compile; hand-fused kernels
# the two ways of turning a roof plan into an estimate, compared in docs/plan.md
ESTIMATES = ("memory-bound kernels slowed per stack", "the whole step slowed per stack")
_BOUNDS = (0.1, 20.0)  # the factors searched
WITHIN = 1.3  # the expected step is held within 1.3x of every published run (tests/test_plan_published.py)


class Observed(Protocol):
    """A published run beside its roof plan: its stack, the planner's step, and their measured seconds."""

    stack: str
    step: StepTime
    measured_s: float


def expected_seconds(step: StepTime, factor: float, estimate: str = ESTIMATES[0]) -> float:
    """The step's seconds with its memory-bound kernels `factor` times slower than their roof, or
    (ESTIMATES[1]) the whole roof plan times `factor` (lessons 09, 10)."""
    if estimate == ESTIMATES[1]:
        return step.seconds * factor
    if estimate != ESTIMATES[0]:
        raise ValueError(f"estimate must be one of {ESTIMATES}, got {estimate!r}")
    kernels = step.by_regime.get("compute", 0.0) + factor * step.by_regime.get("memory", 0.0)
    busy = max(kernels, step.host_s)  # a GPU's queue: the longer of the kernels and the host's issue time
    return max(busy, step.communication_s) + step.offload_s


def _best(error: Callable[[float], float]) -> float:
    """The factor in _BOUNDS that minimises `error`, by golden-section search over its logarithm."""
    lo, hi = (math.log(b) for b in _BOUNDS)
    g = (math.sqrt(5) - 1) / 2
    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    for _ in range(80):
        if error(math.exp(a)) < error(math.exp(b)):
            hi, b = b, a
            a = hi - g * (hi - lo)
        else:
            lo, a = a, b
            b = lo + g * (hi - lo)
    return math.exp((lo + hi) / 2)


def fit_factors(runs: Sequence[Observed], estimate: str = ESTIMATES[0]) -> dict[str, float]:
    """Per stack, the factor whose estimates miss the stack's runs least: the sum of squared logarithms of
    measured / expected, so 2x too slow and 2x too fast weigh the same (lessons 09, 10)."""
    out = {}
    for stack in STACKS:
        mine = [r for r in runs if r.stack == stack]
        if mine:
            out[stack] = _best(lambda f, mine=mine: sum(
                math.log(r.measured_s / expected_seconds(r.step, f, estimate)) ** 2 for r in mine))
    return out


def leave_one_out(runs: Sequence[Observed], estimate: str = ESTIMATES[0]) -> list[float | None]:
    """Per run, measured / expected with the run left out of the fit: how well the estimate predicts a run it
    has not seen; None for a run alone in its stack (lessons 09, 10)."""
    out: list[float | None] = []
    for i, run in enumerate(runs):
        others = [r for j, r in enumerate(runs) if j != i]
        factors = fit_factors(others, estimate)
        out.append(run.measured_s / expected_seconds(run.step, factors[run.stack], estimate)
                   if run.stack in factors else None)
    return out


@dataclass(frozen=True)
class Calibration:
    """The fitted factors and the range (lessons 09, 10)."""

    factors: Mapping[str, float]  # per stack: how much slower than its roof a memory-bound kernel runs
    low: float  # the range: expected x low to expected x high
    high: float
    runs: int  # the published runs fitted
    estimate: str = ESTIMATES[0]

    def how(self, stack: str) -> str:
        f = self.factors[stack]
        if self.estimate == ESTIMATES[1]:
            core = f"the roof plan x {f:.2g} ({stack})"
        else:
            core = f"compute-bound kernels at their roof, memory-bound ones x {f:.2g} ({stack})"
        return (f"{core}, fitted on {self.runs} published runs; range x{self.low:.2f} to x{self.high:.2f}, "
                "their leave-one-out errors (helpers.plan.published)")


def calibrate(runs: Sequence[Observed], estimate: str = ESTIMATES[0]) -> Calibration:
    """The factors fitted on `runs` and the range their leave-one-out errors span, widened to two decimals
    (lessons 09, 10)."""
    errors = [e for e in leave_one_out(runs, estimate) if e is not None]
    if not errors:
        raise ValueError("calibrate needs at least two runs of one stack: none could be left out")
    low, high = math.floor(min(errors) * 100 + 1e-6) / 100, math.ceil(max(errors) * 100 - 1e-6) / 100
    return Calibration(fit_factors(runs, estimate), low, high, len(runs), estimate)


# Fitted by `calibrate(helpers.plan.published.rows())` on the 17 runs of helpers.plan.published.RUNS (on a
# 2-core x86 CPU, torch 2.13, transformers 5.x); tests/test_plan_published.py refits them and fails when these
# figures are no longer what the fit gives. Kept here so that an estimate costs no dry run.
CALIBRATION = Calibration({"eager": 3.5, "compiled": 2.2, "fused": 1.0}, low=0.85, high=1.20, runs=17)


@dataclass(frozen=True)
class Expected:
    """An expected step time and its range, in seconds, and how they were made (lessons 09, 10)."""

    seconds: float
    low: float
    high: float
    how: str

    def __str__(self) -> str:
        return f"{_two(self.seconds)} s ({_two(self.low)} to {_two(self.high)} s)"

    def scaled(self, k: float) -> Expected:
        """The same estimate for k steps (an epoch, a cost per second times k)."""
        return replace(self, seconds=self.seconds * k, low=self.low * k, high=self.high * k)


def _two(x: float) -> str:
    """Two significant figures: what a range of about +-20 % supports."""
    return f"{float(f'{x:.2g}'):g}"


def expected(step: StepTime, stack: str, calibration: Calibration = CALIBRATION) -> Expected:
    """The expected time of `step` (a roof plan from `helpers.plan.steptime.step_time`) on the `stack` it
    will run on ("eager", "compiled", "fused"), with its range (lessons 09, 10)."""
    if stack not in STACKS:
        raise ValueError(f"stack must be one of {STACKS} (plain PyTorch ops, torch.compile, hand-fused "
                         f"kernels), got {stack!r}")
    if stack not in calibration.factors:
        raise ValueError(f"the calibration has no published run on the {stack!r} stack: it holds "
                         f"{sorted(calibration.factors)}")
    s = expected_seconds(step, calibration.factors[stack], calibration.estimate)
    return Expected(s, s * calibration.low, s * calibration.high, calibration.how(stack))
