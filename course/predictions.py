"""Predict, then measure (lesson 04): the learner's prediction, for each kind of op (compute-, memory-,
overhead-bound), of the optimisation that will help it MOST and by how much, locked with the time it was made;
each optimisation's measured effect with its noise; and the score: did the one predicted help most here, and
how far was the number off. A prediction locked after the measurement began is refused: it would be recall,
not prediction. What each optimisation targets in theory is `helpers.measure.regimes.OPTIMISATION_TARGETS`
(shown after the measurement, not before).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Mapping

from helpers.core.timing import Timing

__all__ = ["OPTIMISATIONS", "OP_KINDS", "blank_predictions", "Locked", "lock_predictions", "start_measuring",
           "Effect", "effect", "not_measured", "score_predictions"]

OPTIMISATIONS = ("bf16", "compile", "bigger batch", "CUDA graphs")
OP_KINDS = ("compute-bound", "memory-bound", "overhead-bound")


def blank_predictions() -> dict[str, tuple[str, float] | None]:
    """The learner's predictions, not filled in: op kind -> (the optimisation expected to help it most, the
    speed-up expected from it), None until filled in (lesson 04)."""
    return dict.fromkeys(OP_KINDS)


@dataclass(frozen=True)
class Locked:
    """Predictions, checked and stamped with the moment they were made (lesson 04)."""

    predictions: dict[str, tuple[str, float] | None]
    made_at: float  # time.monotonic() when locked


def lock_predictions(predictions: Mapping[str, Any]) -> Locked:
    """Check the predictions (kinds, optimisations, a speed-up > 0 for each) and stamp them with the time:
    `score_predictions` refuses those made after the measurement began (lesson 04)."""
    unknown = set(predictions) - set(OP_KINDS)
    if unknown:
        raise ValueError(f"unknown op kind(s) {sorted(unknown)}: predictions are keyed by {OP_KINDS}")
    checked: dict[str, tuple[str, float] | None] = dict.fromkeys(OP_KINDS)
    for kind, value in predictions.items():
        if value is None:
            continue
        if not (isinstance(value, (tuple, list)) and len(value) == 2):
            raise ValueError(f"prediction for {kind!r} is {value!r}: give (optimisation, expected speed-up), "
                             f"e.g. ('compile', 1.5), with the optimisation one of {OPTIMISATIONS}")
        choice, speedup = value
        if choice not in OPTIMISATIONS:
            raise ValueError(f"prediction for {kind!r}: {choice!r} is not one of {OPTIMISATIONS}")
        if isinstance(speedup, bool) or not isinstance(speedup, (int, float)) or not speedup > 0:
            raise ValueError(f"prediction for {kind!r}: the expected speed-up must be a number > 0 (1.0: no "
                             f"change, 2.0: twice as fast), got {speedup!r}")
        checked[kind] = (choice, float(speedup))
    return Locked(checked, time.monotonic())


def start_measuring() -> float:
    """The moment a measurement begins (time.monotonic()): predictions locked later are refused
    (lesson 04)."""
    return time.monotonic()


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


def score_predictions(locked: Locked, effects: Mapping[str, Mapping[str, Effect]], *,
                      measured_at: float) -> list[dict[str, Any]]:
    """For each op kind: the prediction, the optimisation that helped MOST here (the largest speed-up beyond
    the noise), and the verdict: "held" (the one predicted helped most, or tied with it within the noise),
    "did not hold", "not testable here" (the one predicted cannot run here), "not filled in", or "refused"
    (locked after the measurement began at `measured_at`); with the predicted and measured speed-ups
    (lesson 04)."""
    if not isinstance(locked, Locked):
        raise ValueError("score locked predictions: lock_predictions(predictions) before the measurement "
                         "runs "
                         "(a prediction made after it would be recall)")
    late = locked.made_at > measured_at
    results = []
    for kind in OP_KINDS:
        measured = effects.get(kind, {})
        helped = {o: e for o, e in measured.items() if e.helps}
        best = max(helped, key=lambda o: helped[o].speedup) if helped else None
        value = locked.predictions.get(kind)
        choice, expected = value if value is not None else (None, None)
        got = measured.get(choice) if choice is not None else None
        if choice is None:
            verdict = "not filled in"
        elif late:
            verdict = ("refused: made after the measurement began (rerun the prediction cell, then the "
                       "measurement)")
        elif got is None or got.speedup is None:
            verdict = "not testable here"
        elif choice == best:
            verdict = "held"
        elif best is not None and got.helps and \
                helped[best].speedup <= got.speedup * (1 + max(got.noise, helped[best].noise)):
            verdict = f"held (tied with {best} within the noise)"
        else:
            verdict = "did not hold"
        off = (got.speedup / expected if got is not None and got.speedup is not None and expected and not late
               else math.nan)
        results.append(dict(kind=kind, predicted=choice, expected=expected, best=best, verdict=verdict,
                            measured=None if got is None else got.speedup, off=off,
                            speedups={o: e.speedup for o, e in measured.items()}))
    return results
