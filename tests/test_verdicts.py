"""course.verdicts: the rules give the verdict words of docs/claims.md, the table refuses rows it cannot
judge, and the paired noise rule tells a real gap from a busy machine."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from course.verdicts import VERDICTS, AtLeast, AtMost, Claim, MeasuredTable, PairedRatio, Range

CLAIMS = Path(__file__).resolve().parents[1] / "docs" / "claims.md"


def test_the_verdict_words_are_those_of_the_claims_file():
    text = CLAIMS.read_text()
    paragraph = text[text.index("Verdict words used everywhere"):].split("\n\n")[0]
    assert tuple(re.findall(r"\*\*([^*]+)\*\*", paragraph)) == VERDICTS


def test_range_rule_in_both_directions():
    faster = Range(1.5, 2.3)  # a speed-up: higher is better
    assert [faster.verdict(v) for v in (1.0, 1.5, 2.0, 2.3, 3.0)] == [
        "does not hold", "holds", "holds", "holds", "beaten"]
    cost = Range(1.15, 1.45, better="lower")  # a time ratio: lower is better
    assert [cost.verdict(v) for v in (1.0, 1.3, 2.0)] == ["beaten", "holds", "does not hold"]
    with pytest.raises(ValueError, match="low must not exceed high"):
        Range(2.0, 1.0)
    agree = Range(0.8, 1.2, better=None)  # an agreement: off on either side does not hold
    assert [agree.verdict(v) for v in (0.5, 1.0, 1.5)] == ["does not hold", "holds", "does not hold"]
    with pytest.raises(ValueError, match="'higher', 'lower' or None"):
        Range(1.0, 2.0, better="up")


def test_threshold_rules():
    assert AtLeast(1.0).verdict(1.0) == "holds" and AtLeast(1.0).verdict(0.99) == "does not hold"
    assert AtMost(1e-5).verdict(1e-6) == "holds" and AtMost(1e-5).verdict(2e-5) == "does not hold"
    with pytest.raises(ValueError, match="must be a number"):
        AtLeast(1.0).verdict(float("nan"))


def test_table_rows_and_verdicts():
    t = MeasuredTable("Lesson 99")
    assert t.add("step, ms", 12.5) == ""  # a measurement that tests no claim
    assert t.add("speed-up", 0.4, "1.5–2.3×", rule=Range(1.5, 2.3)) == "does not hold"
    assert t.add("datasheet cores", 10496, "10,496 cores", verdict="wrong", why="8,704 by the datasheet") == \
        "wrong"
    assert t.add("wide model", None, "> 2×", rule=AtLeast(2.0), why="on a GPU only", needs="a CUDA GPU") == \
        "not testable here"
    assert t.add("measured wide model", 2.5, "> 2×", rule=AtLeast(2.0), needs="a CUDA GPU") == "holds"
    assert t.verdicts == {"step, ms": "", "speed-up": "does not hold", "datasheet cores": "wrong",
                          "wide model": "not testable here", "measured wide model": "holds"}
    md = t.to_markdown()
    assert md.startswith("**Lesson 99**") and "| measurement (this run) | value | claim | verdict |" in md
    assert "| wide model | – | > 2× | not testable here: needs a CUDA GPU |" in md
    assert "wrong: 8,704 by the datasheet" in str(t) and t.table.column("value")[1] == 0.4
    assert t.table.column("verdict")[-1] == "holds"  # `needs` speaks only when the value is missing
    assert t.add("packing on this data", 1.1, "≥ 1.5 with ≥ 30 % padding", rule=AtLeast(1.5), testable=False,
                 needs="data with ≥ 30 % padding") == "not testable here"
    assert t.table.rows[-1][1] == 1.1  # the value is still shown


def test_noise_marks_a_verdict_that_the_spread_could_flip():
    t = MeasuredTable()
    assert t.add("near the edge", 1.12, "1.15–1.45×", rule=Range(1.15, 1.45, better="lower"), noise=0.05) == \
        "beaten"
    assert t.add("far from it", 2.0, "1.15–1.45×", rule=Range(1.15, 1.45, better="lower"), noise=0.05) == \
        "does not hold"
    verdicts = t.table.column("verdict")
    assert verdicts[0] == "beaten: within this run's noise (±5%)" and verdicts[1] == "does not hold"


@pytest.mark.parametrize("kwargs, message", [
    (dict(value=1.0, claim="x", rule=AtLeast(1), verdict="holds"), "not both"),
    (dict(value=1.0, rule=AtLeast(1)), "needs the claim"),
    (dict(value=1.0, claim="x", verdict="true"), "is not one of"),
    (dict(value=None, claim="x", rule=AtLeast(1), why="no GPU"), "say what it would take"),
    (dict(value=1.0, claim="x", rule=AtLeast(1), noise=-0.1), "relative spread"),
])
def test_rows_it_cannot_judge_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MeasuredTable().add("m", **kwargs)


def test_a_row_is_named_once():
    t = MeasuredTable()
    t.add("m", 1.0)
    with pytest.raises(ValueError, match="already has a row"):
        t.add("m", 2.0)


def test_paired_ratio():
    r = PairedRatio.of([1.0, 1.1, 0.9, 1.0, 1.05], [1.0] * 5)
    assert r.median == 1.0 and r.ratios[1] == 1.1 and 0 < r.spread < 0.2
    with pytest.raises(ValueError, match="at least 5 pairs"):
        PairedRatio.of([1.0] * 4, [1.0] * 4)
    with pytest.raises(ValueError, match="positive"):
        PairedRatio.of([1.0] * 4 + [0.0], [1.0] * 5)


def test_the_median_of_pairs_survives_bursts_and_catches_a_real_gap():
    """A busy machine slows the whole machine for a while (both calls of a pair) and, now and then, one call
    alone (one call in ten) by up to 2x; a real gap (1.5x: counting 12 bytes per element for x + x instead
    of 8) is in every pair. With 9 pairs, the median stays under a bound of 1.3 when the counts are right
    and goes over it when they are wrong, in every one of 500 simulated busy runs."""
    rng = random.Random(0)
    for trial in range(500):
        copy_t, add_t = [], []
        for _ in range(9):
            load = rng.uniform(0.5, 1.5)  # the machine's speed during this pair, shared by both calls
            burst = [rng.uniform(1.2, 2.0) if rng.random() < 0.1 else 1.0 for _ in range(2)]  # one call alone
            copy_t.append(load * burst[0])
            add_t.append(load * burst[1] * rng.uniform(0.95, 1.1))  # the add: a little slower than a copy
        honest = PairedRatio.of(copy_t, add_t)  # the add's rate over the memory roof there: 8 bytes counted
        planted = PairedRatio.of([1.5 * c for c in copy_t], add_t)  # 12 bytes counted: 1.5x higher
        assert honest.median <= 1.3 < planted.median, (trial, honest.median, planted.median)


def test_a_timing_verdict_on_a_machine_too_busy_says_so():
    from helpers.core.timing import TOO_BUSY, TOO_BUSY_VERDICT, CpuLoad, busy

    t = MeasuredTable("Lesson 99")
    assert t.add("speed-up", 0.4, "1.5–2.3×", rule=Range(1.5, 2.3), noise=TOO_BUSY) == TOO_BUSY_VERDICT
    assert t.add("gain", 3.0, "≥ 1.5", rule=AtLeast(1.5), busy=busy(0.1, load=CpuLoad(0.9, 1.0, 2))) == \
        TOO_BUSY_VERDICT
    assert t.add("judged by hand", 1.0, "≥ 1", verdict="holds", busy=busy(0.8)) == TOO_BUSY_VERDICT
    assert t.add("quiet", 3.0, "≥ 1.5", rule=AtLeast(1.5), busy=busy(0.1, load=0.05)) == "holds"
    # a datasheet figure is wrong on any machine, and a missing value stays not testable
    assert t.add("cores", 1, "2 cores", verdict="wrong", busy=busy(0.9)) == "wrong"
    assert t.add("wide", None, "> 2×", rule=AtLeast(2.0), needs="a GPU",
                 busy=busy(0.9)) == "not testable here"
    assert t.add("said", 2.0, "≥ 1", verdict=TOO_BUSY_VERDICT, why="timed under load") == TOO_BUSY_VERDICT
    md = t.to_markdown()
    assert "| speed-up | 0.4 | 1.5–2.3× | too busy to judge: the rounds disagree by 50%" in md
    assert "too busy to judge: other programs took 90%" in md and "does not hold" not in md
    with pytest.raises(ValueError, match="helpers.core.timing.Busy"):
        t.add("bad", 1.0, "≥ 1", rule=AtLeast(1.0), busy=0.9)


def test_a_claim_brings_its_words_anchor_and_rule():
    amp = Claim("c2", "1.5–2.3×", Range(1.5, 2.3))
    t = MeasuredTable("t")
    assert t.add("speed-up", 0.41, amp) == "does not hold"  # the claim's own rule judged it
    assert t.add("speed-up, fast", 1.9, amp) == "holds"
    assert "1.5–2.3× (docs/claims.md#c2)" in t.to_markdown()
    assert t.add("given", "x", Claim("c11", "pairs"), verdict="wrong") == "wrong"  # no rule: a verdict given
    assert t.add("ruled here", 3.0, amp, rule=AtMost(2.0)) == "does not hold"  # a rule given wins
