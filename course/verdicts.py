"""The table that ends every lesson, "What we measured on this machine": each measurement of this run next to
the claim it tests, and the verdict the claim's rule gives, in the words of docs/claims.md (lessons 00-08).

    summary = MeasuredTable("Lesson 02 on cpu")
    summary.add("median fp32 step, ms", 12.5)  # a measurement that tests no claim
    summary.add("AMP speed-up (fp32 / bf16 step time)", 0.41, "1.5–2.3× (docs/claims.md#c2)",
                rule=Range(1.5, 2.3))  # -> "does not hold"
    summary.add("wide models gain > 2×", None, "> 2×", rule=AtLeast(2.0), needs="a CUDA GPU")
    summary  # drawn as Markdown in Jupyter, as text in a terminal

A rule turns a value into one of `VERDICTS`: `Range` (holds inside, beaten beyond the better end),
`AtLeast` and `AtMost` (holds or does not hold). A value of None, or testable=False (the value is shown, the
rule not applied), is "not testable here", with `needs`: what it would take; `why` adds a note to any
verdict. With `noise` (the relative spread of the value in this run), a verdict that a value inside
value × (1 ± noise) would change is marked as within the noise.

A timing verdict on a machine too busy to judge is no verdict: with `busy` (a `helpers.core.timing.Busy` that
says too busy), or a `noise` of `helpers.core.timing.TOO_BUSY` or more, the row says "too busy to judge"
(`TOO_BUSY_VERDICT`) and why, instead of holds or does not hold; `verdicts` records that word for it.

`PairedRatio` is the noise rule for a check on two measurements: taken in interleaved pairs, judged by the
median of the pairs' ratios (lesson 00's roof check).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from helpers.core.tables import Table
from helpers.core.timing import TOO_BUSY_VERDICT, Busy
from helpers.core.timing import busy as busy_rule

__all__ = ["VERDICTS", "TOO_BUSY_VERDICT", "Range", "AtLeast", "AtMost", "Claim", "MeasuredTable",
           "PairedRatio"]

# docs/claims.md: holds (inside the claimed range or above its threshold), beaten (better than claimed),
# does not hold (outside it), wrong (false on any machine, e.g. a datasheet figure), not testable here
# (the device lacks what the claim is about: say what it would take)
VERDICTS = ("holds", "beaten", "does not hold", "wrong", "not testable here")


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{what} must be a number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Range:
    """Rule: holds in [low, high]; beaten beyond the better end (`better`: "higher" or "lower"), does not
    hold beyond the other; with better=None (an agreement) it does not hold beyond either (lessons 02-05)."""

    low: float
    high: float
    better: str | None = "higher"

    def __post_init__(self) -> None:
        if _number(self.low, "Range.low") > _number(self.high, "Range.high"):
            raise ValueError(f"Range({self.low}, {self.high}): low must not exceed high")
        if self.better not in ("higher", "lower", None):
            raise ValueError(f"Range.better={self.better!r}: use 'higher', 'lower' or None")

    def verdict(self, value: float) -> str:
        """The verdict for one measured value."""
        value = _number(value, "the measured value")
        if self.low <= value <= self.high:
            return "holds"
        if self.better is None:
            return "does not hold"
        above = value > self.high
        return "beaten" if above == (self.better == "higher") else "does not hold"


@dataclass(frozen=True)
class AtLeast:
    """Rule: holds at or above `threshold`, else does not hold (lessons 00-08)."""

    threshold: float

    def verdict(self, value: float) -> str:
        """The verdict for one measured value."""
        return "holds" if _number(value, "the measured value") >= _number(self.threshold, "threshold") \
            else "does not hold"


@dataclass(frozen=True)
class AtMost:
    """Rule: holds at or below `threshold`, else does not hold (lessons 00-08)."""

    threshold: float

    def verdict(self, value: float) -> str:
        """The verdict for one measured value."""
        return "holds" if _number(value, "the measured value") <= _number(self.threshold, "threshold") \
            else "does not hold"


Rule = Range | AtLeast | AtMost


@dataclass(frozen=True)
class Claim:
    """A claim as the summaries cite it: what it says, its anchor in docs/claims.md, the rule that judges a
    measurement of it (None: judged by an assertion or by arithmetic); the registry is course.claims."""

    anchor: str  # "c2" -> docs/claims.md#c2
    says: str  # the claim as a summary row shows it: "1.5–2.3×"
    rule: Rule | None = None

    def __str__(self) -> str:
        return f"{self.says} (docs/claims.md#{self.anchor})"


@dataclass
class MeasuredTable:
    """The "What we measured on this machine" table: measurement, value, claim, verdict (lessons 00-08)."""

    title: str = ""

    def __post_init__(self) -> None:
        self._table = Table(["measurement (this run)", "value", "claim", "verdict"], title=self.title)
        self.verdicts: dict[str, str] = {}  # measurement -> its verdict word ("" for no claim)

    def add(self, measurement: str, value: Any, claim: str | Claim = "", *, rule: Rule | None = None,
            verdict: str | None = None, noise: float | None = None, why: str = "", needs: str = "",
            testable: bool = True, busy: Busy | None = None) -> str:
        """One row; returns its verdict word: `rule`'s for `value` ("not testable here" when it is None or
        `testable` is False: `needs` says what it would take), or `verdict` as given (a claim judged by an
        assertion or by arithmetic), or "" for a measurement that tests no claim. `why`: a note after it.
        "too busy to judge" instead of a verdict when `busy` says so or `noise` reaches
        helpers.core.timing.TOO_BUSY (the module docstring). A `Claim` brings its own rule."""
        if isinstance(claim, Claim):
            rule = claim.rule if rule is None and verdict is None else rule
            claim = str(claim)
        if measurement in self.verdicts:
            raise ValueError(f"the table already has a row {measurement!r}: name each measurement once")
        if rule is not None and verdict is not None:
            raise ValueError(f"{measurement!r}: give a rule or a verdict, not both")
        if (rule is not None or verdict is not None) and not claim:
            raise ValueError(f"{measurement!r}: a verdict needs the claim it judges (claim=...)")
        if verdict is not None and verdict not in (*VERDICTS, TOO_BUSY_VERDICT):
            raise ValueError(f"{measurement!r}: verdict {verdict!r} is not one of {VERDICTS} (or "
                             f"{TOO_BUSY_VERDICT!r})")
        if noise is not None and _number(noise, "noise") < 0:
            raise ValueError(f"{measurement!r}: noise is a relative spread (>= 0), got {noise!r}")
        if busy is not None and not isinstance(busy, Busy):
            raise ValueError(f"{measurement!r}: busy must be a helpers.core.timing.Busy (from "
                             f"helpers.core.timing.busy(...)), got {type(busy).__name__}")
        state = busy if busy is not None else busy_rule(noise) if noise is not None else None
        note = why
        # only a verdict drawn from timings can be overturned by load (not "wrong", not "not testable here")
        judged = (rule is not None and value is not None and testable) or verdict in ("holds", "beaten",
                                                                                     "does not hold")
        if judged and state is not None and state.too_busy:
            verdict, note = TOO_BUSY_VERDICT, "; ".join(filter(None, [why, *state.reasons]))
        elif rule is not None and (value is None or not testable):
            if not needs:
                raise ValueError(f"{measurement!r} was not measured: say what it would take (needs=...)")
            verdict, note = "not testable here", f"needs {needs}"
        elif rule is not None:
            verdict = rule.verdict(value)
            if noise and len({rule.verdict(value * (1 - noise)), rule.verdict(value * (1 + noise))}
                             | {verdict}) > 1:
                note = "; ".join(filter(None, [why, f"within this run's noise (±{noise:.0%})"]))
        word = verdict or ""
        self.verdicts[measurement] = word
        self._table.add(measurement, "–" if value is None else value, claim,
                        f"{word}: {note}" if word and note else word or note)
        return word

    @property
    def table(self) -> Table:
        """The rows as a `helpers.core.tables.Table`."""
        return self._table

    def to_markdown(self) -> str:
        """The table as GitHub-flavoured Markdown."""
        return self._table.to_markdown()

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def __str__(self) -> str:
        return str(self._table)


@dataclass(frozen=True)
class PairedRatio:
    """Ratios a_i / b_i of two measurements taken in interleaved pairs; the median is the value to judge
    (lesson 00). The noise rule: a burst of other work slows one call of a pair and moves that pair only;
    more than half the pairs would have to be hit the same way to move the median."""

    ratios: tuple[float, ...]

    MIN_PAIRS = 5

    @classmethod
    def of(cls, a: Sequence[float], b: Sequence[float]) -> PairedRatio:
        """From the two arms' values, pair by pair (a[i] and b[i] measured next to each other)."""
        if len(a) != len(b) or len(a) < cls.MIN_PAIRS:
            raise ValueError(f"need as many values in each arm, at least {cls.MIN_PAIRS} pairs; got {len(a)} "
                             f"and {len(b)}: measure more interleaved rounds")
        if any(_number(x, "a measured value") <= 0 for x in (*a, *b)):
            raise ValueError("paired values must be positive (times, rates)")
        return cls(tuple(x / y for x, y in zip(a, b)))

    @property
    def median(self) -> float:
        """The median ratio: the value a check judges."""
        return statistics.median(self.ratios)

    @property
    def spread(self) -> float:
        """Interquartile range over the median: how much the pairs disagree."""
        q1, _, q3 = statistics.quantiles(self.ratios, n=4, method="inclusive")
        return (q3 - q1) / self.median
