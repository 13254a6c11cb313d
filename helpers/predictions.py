"""Predict, then measure (lesson 04): the learner's prediction of which optimisation helps each kind of op
most (compute-, memory-, overhead-bound), each optimisation's measured effect with its noise, and the score:
did the prediction hold on this machine. What each optimisation targets in theory is
`helpers.regimes.OPTIMISATION_TARGETS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from helpers.timing import Timing

__all__ = ["OPTIMISATIONS", "OP_KINDS", "blank_predictions", "Effect", "effect", "not_measured",
           "score_predictions"]

OPTIMISATIONS = ("bf16", "compile", "bigger batch", "CUDA graphs")
OP_KINDS = ("compute-bound", "memory-bound", "overhead-bound")


def blank_predictions() -> dict[str, str | None]:
    """The learner's predictions, not filled in: op kind -> the optimisation expected to help it most
    (lesson 04)."""
    return dict.fromkeys(OP_KINDS)


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


def score_predictions(predictions: Mapping[str, str | None],
                      effects: Mapping[str, Mapping[str, Effect]]) -> list[dict[str, Any]]:
    """For each op kind: the prediction, the optimisation that helped most here, and whether the prediction
    held ("held", "did not hold", "not testable here", "not filled in") (lesson 04)."""
    unknown = set(predictions) - set(OP_KINDS)
    if unknown:
        raise ValueError(f"unknown op kind(s) {sorted(unknown)}: predictions are keyed by {OP_KINDS}")
    for kind, choice in predictions.items():
        if choice is not None and choice not in OPTIMISATIONS:
            raise ValueError(f"prediction for {kind!r} is {choice!r}: choose one of {OPTIMISATIONS}, "
                             "or None for not filled in")
    results = []
    for kind in OP_KINDS:
        measured = effects.get(kind, {})
        helped = {o: e for o, e in measured.items() if e.helps}
        best = max(helped, key=lambda o: helped[o].speedup) if helped else None
        choice = predictions.get(kind)
        if choice is None:
            verdict = "not filled in"
        elif choice not in measured or measured[choice].speedup is None:
            verdict = "not testable here"
        else:
            verdict = "held" if measured[choice].helps else "did not hold"
        results.append(dict(kind=kind, predicted=choice, best=best, verdict=verdict,
                            speedups={o: e.speedup for o, e in measured.items()}))
    return results

