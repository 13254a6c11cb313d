"""The checks of exercises 08-keep-rule and 08-new-rung (lesson 08, `08_bert_finetuning`): the greedy
ladder's keep rule on eight timing cases (each wrong rule learners write is matched by its decisions),
and a new rung the ladder lacks (one RunSpec switch, a value RunSpec accepts, a claim).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from helpers.exercises.core import Wrong

__all__ = ["keep_rule", "new_rung"]


def _timing(median_s: float, iqr_s: float) -> Any:
    from helpers.timing import Timing

    return Timing("arm", median_s, iqr_s, runs=5, calls_per_run=1)


_KEEP_CASES = (  # (candidate median, IQR), (best median, IQR)
    ((1.0, 0.01), (1.5, 0.01)),  # clearly faster: keep
    ((1.0, 0.2), (1.1, 0.01)),  # faster, within the candidate's spread: drop
    ((1.0, 0.01), (1.1, 0.22)),  # faster, within the best arm's spread: drop
    ((1.2, 0.01), (1.0, 0.01)),  # slower: drop
    ((1.0, 0.0), (1.0, 0.0)),  # the same: drop
    ((0.5, 0.1), (1.0, 0.05)),  # twice as fast, noisy: keep
    ((0.01, 0.002), (0.0115, 0.0001)),  # small times: the spread must be relative, drop
    ((1.0, 0.05), (1.3, 0.1)),  # faster than both spreads together: keep
)


def _keep_hypotheses(c: tuple[float, float], b: tuple[float, float]) -> dict[str | None, bool]:
    (cm, ci), (bm, bi) = c, b
    ratio, rel = bm / cm, max(ci / cm, bi / bm)
    return {None: ratio > 1 + rel, "inverted": cm / bm > 1 + rel,
            "candidate-spread-only": ratio > 1 + ci / cm,
            "best-spread-only": ratio > 1 + bi / bm, "absolute-spread": ratio > 1 + max(ci, bi),
            "no-spread": ratio > 1, "sum-of-spreads": ratio > 1 + ci / cm + bi / bm}


_KEEP_HINTS = {
    "inverted": "the ratio is upside down: best median / candidate median > 1 means the candidate is faster",
    "candidate-spread-only": "the threshold takes the larger relative spread of *both* arms",
    "best-spread-only": "the threshold takes the larger relative spread of *both* arms",
    "absolute-spread": "the spread must be relative: IQR / median, a fraction like the ratio's excess over 1",
    "no-spread": "faster by less than the noise is not faster: ratio > 1 + the larger relative IQR",
    "sum-of-spreads": "the rule takes the larger of the two relative spreads, not their sum",
}


def keep_rule(answer: Callable) -> str:
    """08-keep-rule: answer(candidate, best) -> keep? (a bool, or an object with `.keep`)."""
    got = []
    for c, b in _KEEP_CASES:
        out = answer(_timing(*c), _timing(*b))
        out = getattr(out, "keep", out)
        if not isinstance(out, (bool, torch.Tensor)) and type(out).__name__ != "bool_":
            raise Wrong("return-type", f"it returned {type(out).__name__}", "return True (keep) or False")
        got.append(bool(out))
    hyps = [_keep_hypotheses(c, b) for c, b in _KEEP_CASES]
    if got == [h[None] for h in hyps]:
        return f"keeps and drops as ladder.keeps does in {len(_KEEP_CASES)} cases (noise of both arms)"
    for mistake, hint in _KEEP_HINTS.items():
        if got == [h[mistake] for h in hyps]:
            raise Wrong(mistake, "its decisions differ from the rule's", hint)
    i = next(i for i, (g, h) in enumerate(zip(got, hyps)) if g != h[None])
    (cm, ci), (bm, bi) = _KEEP_CASES[i]
    raise Wrong("keep-rule", f"candidate {cm} s (IQR {ci}) vs best {bm} s (IQR {bi}): it said "
                f"{'keep' if got[i] else 'drop'}", "keep when best.median_s / candidate.median_s > 1 + "
                "max(candidate.iqr_s / candidate.median_s, best.iqr_s / best.median_s)")


def new_rung(answer: Any) -> str:
    """08-new-rung: answer is a helpers.ladder.Rung the ladder does not have yet."""
    from helpers import ladder

    if not isinstance(answer, ladder.Rung):
        raise Wrong("not-a-rung", f"NEW_RUNG is a {type(answer).__name__}",
                    "ladder.Rung(name, switch, value, claim): switch is a RunSpec field")
    try:
        stack = answer.on(ladder.BASELINE)
    except (ValueError, TypeError) as err:
        raise Wrong("bad-value", f"RunSpec refuses it: {err}",
                    "pick a value RunSpec accepts for that switch") from None
    same = [r.name for r in ladder.RUNGS if (r.switch, r.value) == (answer.switch, answer.value)]
    if same:
        raise Wrong("duplicate", f"the ladder has it already: {same[0]!r}",
                    "choose a switch value no rung sets (RunSpec's fields and their choices)")
    if stack == ladder.BASELINE:
        raise Wrong("no-change", "it sets the baseline's own value: nothing changes",
                    "a rung changes one switch away from the baseline")
    if not answer.claim.strip():
        raise Wrong("no-claim", "its claim is empty", "say what is commonly claimed for it: the ladder "
                    "prints it next to what this machine measured")
    return (f"{answer.name!r} sets RunSpec.{answer.switch}={answer.value!r}, which no rung sets; add it with "
            "ladder.climb_stacks(..., rungs=(*ladder.RUNGS, NEW_RUNG))")
