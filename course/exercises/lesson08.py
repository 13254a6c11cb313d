"""The checks of exercises 08-greedy-climb and 08-new-rung (lesson 08, `08_bert_finetuning`).

08-greedy-climb: the greedy ladder the lesson just climbed, written by the learner, keep rule included. It
runs on simulated machines drawn per run (each switch's effect on the pass time, the machine's load changing
from one timing session to the next, each arm's noise), rejection-sampled until every typical mistake gives
different decisions somewhere: the cumulative ladder, candidates timed beside the baseline or added to it,
the best stack's timing reused from an earlier session, and each keep rule learners write instead of the
ladder's (the ratio upside down, one arm's spread, absolute spreads, no spread, the sum of the spreads, the
intervals median ± IQR). A mistake is named only when the answer's timings and decisions are that mistake's
in every simulated climb; otherwise the line says at which rung it differs and with which numbers.

08-new-rung: a rung the ladder lacks, and a measured task: the rung runs on a tiny BERT (built here, weights
and batches drawn per run), is checked against the baseline by `helpers.train.ladder.measure_stack` (correct
before
fast) and timed beside it by the ladder's keep rule (`ladder.climb_stacks`, one thread, in well under a
second), on the device the lesson runs on (`helpers.core.device.get_device`, as the lesson picks it; `device=`
to choose): a rung a GPU runs (FlexAttention, FP8 on Hopper) is measured there. Kept or dropped, the line says
what this device measured; a rung this device cannot run, one that disagrees with the baseline, or one whose
switch changes nothing here fails with the reason. A name and a claim are required, as strings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import random
import sys
from collections.abc import Callable, Sequence
from typing import Any

from course.exercises.contract import Task, contract, reference, search
from course.exercises.core import Halt, Wrong, course_module, time_limit

__all__ = ["greedy_climb", "new_rung", "climb_task"]


# --- 08-greedy-climb: keep rules ---------------------------------------------------------------------------

def _rule(name: str) -> Callable[[Any, Any], bool]:
    """keep(candidate, best) for the ladder's rule (None) and each rule learners write instead."""
    def keep(c: Any, b: Any) -> bool:
        cm, ci, bm, bi = c.median_s, c.iqr_s, b.median_s, b.iqr_s
        ratio, rc, rb = bm / cm, ci / cm, bi / bm
        return {
            "right": ratio > 1 + max(rc, rb),
            "inverted": cm / bm > 1 + max(rc, rb),
            "candidate-spread-only": ratio > 1 + rc,
            "best-spread-only": ratio > 1 + rb,
            "absolute-spread": ratio > 1 + max(ci, bi),
            "no-spread": ratio > 1,
            "sum-of-spreads": ratio > 1 + rc + rb,
            "min-of-spreads": ratio > 1 + min(rc, rb),
            "spread-over-best-median": ratio > 1 + max(ci, bi) / bm,
            "intervals": cm + ci < bm - bi,
        }[name]

    return keep


_RULE_HINTS = {
    "inverted": ("its decisions are those of the ratio upside down (or of the two timings swapped)",
                 "best.median_s / candidate.median_s > 1 means the candidate is faster; "
                 "time_side_by_side(a, b) returns a's timing first"),
    "candidate-spread-only": ("its decisions are those of the candidate's spread alone",
                              "the threshold takes the larger relative spread of *both* arms"),
    "best-spread-only": ("its decisions are those of the best stack's spread alone",
                         "the threshold takes the larger relative spread of *both* arms"),
    "absolute-spread": ("its decisions are those of absolute spreads (IQR in seconds) added to a ratio",
                        "the spread must be relative: IQR / median, a fraction like the ratio's excess over "
                        "1"),
    "no-spread": ("its decisions are those of `faster at all` (ratio > 1)",
                  "faster by less than the noise is not faster: ratio > 1 + the larger relative IQR"),
    "sum-of-spreads": ("its decisions are those of the sum of the two relative spreads",
                       "the rule takes the larger of the two relative spreads, not their sum"),
    "min-of-spreads": ("its decisions are those of the smaller of the two relative spreads",
                       "the rule takes the larger of the two relative spreads: the noisier arm decides"),
    "spread-over-best-median": ("its decisions are those of the larger IQR divided by the best stack's "
                                "median (the candidate's IQR is relative to its own median)",
                                "take each arm's relative spread, IQR / its own median, then the larger: "
                                "max(candidate.iqr_s / candidate.median_s, best.iqr_s / best.median_s)"),
    "intervals": ("its decisions are those of non-overlapping intervals (candidate median + IQR below the "
                  "best's median - IQR)", "the ladder's rule is a ratio: keep when best.median_s / "
                  "candidate.median_s > 1 + max(candidate.iqr_s / candidate.median_s, best.iqr_s / "
                  "best.median_s)"),
}


# --- 08-greedy-climb: ways to climb ---------------------------------------------------------------------

def _climb(how: str, rule: str, baseline: Any, rungs: Sequence[Any], time_pair: Callable) -> tuple[Any, list]:
    """The greedy climb (how="greedy") and the climbs learners write instead."""
    keep = _rule(rule)
    best = below = baseline
    stored = None  # "stale": the best stack's timing from the session that kept it
    kept = []
    for rung in rungs:
        base = below if how == "cumulative" else best
        cand = rung.on(baseline if how == "from-baseline" else base)
        t_c, t_b = time_pair(cand, baseline if how == "vs-baseline" else base)
        if how == "stale":
            t_b = stored if stored is not None else t_b
        k = bool(keep(t_c, t_b))
        kept.append(k)
        below = cand
        if how == "stale" and stored is None:
            stored = t_b
        if k:
            best = cand
            if how == "stale":
                stored = t_c
    return (below if how == "cumulative" else best), kept


_CLIMB_HINTS = {
    "cumulative": ("each rung was added to the stack below it and kept or not, whatever the one before (the "
                   "cumulative ladder)", "greedy adds each rung to the best stack so far: a dropped rung "
                   "leaves the best stack as it was, and the next rung goes on that"),
    "vs-baseline": ("each candidate was timed beside the baseline, not beside the best stack so far",
                    "the rule compares a rung with the stack it is added to: time_side_by_side(candidate, "
                    "best)"),
    "from-baseline": ("each rung was added to the baseline, not to the best stack so far",
                      "candidate = rung.on(best): the kept rungs stay in the stack"),
    "stale": ("the best stack's timing came from an earlier session than the candidate's",
              "the machine's load changes between sessions: compare the two timings "
              "time_side_by_side(candidate, "
              "best) returns, from one session"),
}
_HYPOTHESES = ([("greedy", "right")] + [(h, "right") for h in _CLIMB_HINTS]
               + [("greedy", r) for r in _RULE_HINTS])


class _Machine:
    """A simulated machine: each (switch, value) multiplies the pass time; each timing session has its own
    load (shared by its two arms) and noise; a session's numbers depend only on what is timed and how many
    times that pair was timed before, so an extra call shifts nothing else."""

    def __init__(self, rng: random.Random, baseline: Any) -> None:
        self.salt = rng.randrange(2 ** 31)
        self.base_s = 10 ** rng.uniform(-1.5, 0.5)
        self.baseline = baseline
        self.effect: dict[tuple[str, Any], float] = {}
        self.calls: list[tuple[Any, Any]] = []
        self.rng = rng
        self.max_calls: int | None = None  # the learner's climb: stopped beyond this many sessions
        self.sessions: dict[tuple[str, ...], int] = {}  # each pair: how many times it was timed so far

    def factor(self, switch: str, value: Any) -> float:
        if (switch, value) not in self.effect:
            kind = self.rng.random()
            self.effect[switch, value] = (self.rng.uniform(0.35, 0.8) if kind < 0.35 else
                                          self.rng.uniform(0.85, 0.99) if kind < 0.65 else
                                          self.rng.uniform(0.97, 1.03) if kind < 0.8 else
                                          self.rng.uniform(1.05, 1.6))
        return self.effect[switch, value]

    def true_s(self, stack: Any) -> float:
        t = self.base_s
        for f in dataclasses.fields(stack):
            value = getattr(stack, f.name)
            if value != getattr(self.baseline, f.name):
                t *= self.factor(f.name, value)
        return t

    def draw_effects(self, rungs: Sequence[Any]) -> None:
        for r in rungs:
            self.factor(r.switch, r.value)

    def time_pair(self, a: Any, b: Any) -> tuple[Any, Any]:
        """Two stacks timed side by side in one session: (a's Timing, b's Timing)."""
        from helpers.core.timing import Timing

        if self.max_calls is not None and len(self.calls) >= self.max_calls:
            raise Halt("endless", f"it timed more than {self.max_calls} sessions for "
                       f"{(self.max_calls - 8) // 4} rungs: the climb does not end", _ONE_SESSION)
        key = tuple(sorted((repr(a), repr(b))))  # one session, whichever arm is named first
        k = self.sessions.get(key, 0)
        self.sessions[key] = k + 1
        self.calls.append((a, b))
        load = 1 + _draw(self.salt, key, k).uniform(0, 1.0)  # the machine's load now: both arms alike
        out = []
        for name, stack in (("a", a), ("b", b)):
            r = _draw(self.salt, key, k, repr(stack))
            spread = 10 ** r.uniform(-2.3, -0.8)  # relative IQR: 0.5 % .. 16 %
            median = self.true_s(stack) * load * (1 + r.uniform(-0.5, 0.5) * spread)
            out.append(Timing(name, median, median * spread, runs=5, calls_per_run=1))
        return out[0], out[1]


_ONE_SESSION = ("one session per rung: for rung in rungs (a while loop must move on to the next rung whether "
                "the rung was kept or dropped)")


def _draw(*key: Any) -> random.Random:
    return random.Random(hashlib.sha256(repr(key).encode()).digest())


def _pair(call: tuple[Any, Any]) -> tuple[str, ...]:
    return tuple(sorted((repr(call[0]), repr(call[1]))))


def _sessions(calls: list) -> list:
    return [_pair(c) for c in calls]


def _shown(stack: Any) -> str:
    """A stack as the switches it changes from the ladder's baseline."""
    from helpers.train import ladder

    changed = [f"{f.name}={getattr(stack, f.name)!r}" for f in dataclasses.fields(stack)
               if getattr(stack, f.name) != getattr(ladder.BASELINE, f.name)]
    return "the baseline + " + ", ".join(changed) if changed else "the baseline"


@functools.lru_cache(maxsize=8)
def _climbs(seed: int, n: int) -> tuple[tuple[int, tuple], ...]:
    """n simulated climbs or a few more (machine seed, rungs), drawn from `seed` until every hypothesis
    differs from every other in the sessions it times or the decisions it makes, in at least one of them."""
    from helpers.train import ladder

    rng = random.Random(seed)

    def outputs(seed: int, rungs: list) -> list:
        res = []
        for how, rule in _HYPOTHESES:
            m = _Machine(random.Random(seed), ladder.BASELINE)
            m.draw_effects(rungs)
            stack, kept = _climb(how, rule, ladder.BASELINE, rungs, m.time_pair)
            res.append((_sessions(m.calls), stack, tuple(kept)))
        return res

    chosen: list[tuple[int, tuple]] = []
    unsplit = {(i, j) for i in range(len(_HYPOTHESES)) for j in range(i + 1, len(_HYPOTHESES))}
    for _ in range(400):
        rungs = rng.sample(ladder.RUNGS, rng.randrange(5, len(ladder.RUNGS) + 1))
        m_seed = rng.randrange(2 ** 31)
        outs = outputs(m_seed, rungs)
        splits = {(i, j) for i, j in unsplit if outs[i] != outs[j]}  # pairs this climb tells apart
        if len(chosen) < n or splits:
            chosen.append((m_seed, tuple(rungs)))
            unsplit -= splits
        if len(chosen) >= n and not unsplit:
            break
    return tuple(chosen)


class _CourseCalls:
    """Which of the ladder's own climbing functions the answer calls (sys.setprofile while it runs)."""

    BANNED = ("helpers.train.ladder.keeps", "helpers.train.ladder.climb", "helpers.train.ladder.climb_stacks",
              "helpers.train.ladder._side_by_side")

    def __init__(self) -> None:
        self.found: str | None = None

    def __enter__(self) -> _CourseCalls:
        self.previous = sys.getprofile()

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and self.found is None:
                name = f"{course_module(frame.f_code.co_filename)}.{frame.f_code.co_name}"
                if name in self.BANNED:
                    self.found = name

        sys.setprofile(profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(self.previous)


def _run_climb(answer: Callable, seed: int, rungs: list) -> tuple[Any, list, list]:
    from helpers.train import ladder

    m = _Machine(random.Random(seed), ladder.BASELINE)
    m.draw_effects(rungs)
    m.max_calls = 4 * len(rungs) + 8
    with _CourseCalls() as course:
        got = answer(ladder.BASELINE, list(rungs), m.time_pair)
    if course.found:
        raise Wrong("uses-course-code", f"it calls the course's {course.found}",
                    "write the climb and its rule yourself: the lesson's ladder is what you are rebuilding")
    stack, kept = _stack_and_kept(got)
    kept = list(kept) if isinstance(kept, (list, tuple)) else kept
    pairs = _sessions(m.calls)
    retried = any(pairs[i] == pairs[i + 1] for i in range(len(pairs) - 1))
    if isinstance(kept, list) and len(kept) > len(rungs) and retried:  # the timings' noise ended it this time
        raise Wrong("endless", f"it timed a dropped rung again until a session kept it ({len(m.calls)} "
                    f"sessions for {len(rungs)} rungs): on a quiet machine such a climb does not end",
                    _ONE_SESSION)
    if not isinstance(kept, list) or len(kept) != len(rungs):
        raise Wrong("return-shape", f"kept is {kept!r}, not one True/False for each of the {len(rungs)} "
                                    f"rungs",
                    "append the rule's decision for every rung, in order")
    return stack, [bool(k) for k in kept], m.calls


def _first_difference(answer_run: tuple, right_run: tuple, seed: int, rungs: list) -> str:
    from helpers.train import ladder

    stack, kept, calls = answer_run
    r_stack, r_kept, r_calls = right_run
    m = _Machine(random.Random(seed), ladder.BASELINE)
    m.draw_effects(rungs)
    for i, rung in enumerate(rungs):
        if i >= len(calls) or _pair(calls[i]) != _pair(r_calls[i]):
            shown = "nothing" if i >= len(calls) else f"{_shown(calls[i][0])} beside {_shown(calls[i][1])}"
            return (f"at rung {rung.name!r} it timed {shown}; the greedy ladder times that rung on the best "
                    f"stack "
                    f"so far beside that stack: {_shown(r_calls[i][0])} beside {_shown(r_calls[i][1])}")
        t_c, t_b = m.time_pair(*r_calls[i])
        if kept[i] != r_kept[i]:
            ratio, threshold = t_b.median_s / t_c.median_s, 1 + max(t_c.iqr_s / t_c.median_s,
                                                                    t_b.iqr_s / t_b.median_s)
            return (f"at rung {rung.name!r}: candidate {t_c.median_s:.4g} s (IQR {t_c.iqr_s:.2g}), best "
                    f"{t_b.median_s:.4g} s (IQR {t_b.iqr_s:.2g}) in one session: ratio {ratio:.3f} vs "
                    f"threshold "
                    f"{threshold:.3f}, so {'keep' if r_kept[i] else 'drop'}; it said "
                    f"{'keep' if kept[i] else 'drop'}")
    if len(calls) != len(r_calls):
        return f"it timed {len(calls)} sessions for {len(rungs)} rungs; the greedy ladder times one per rung"
    return f"the decisions are right, but it returned {_shown(stack)}, not {_shown(r_stack)}"


def _check_sessions(runs: list, climbs: tuple) -> None:
    """Wrong when a climb timed other than one session per rung: twice per rung (its two timings taken from
    two sessions), or some other count."""
    for (stack, kept, calls), (_, rungs) in zip(runs, climbs):
        if len(calls) == len(rungs):
            continue
        pairs = [_pair(c) for c in calls]
        if len(calls) == 2 * len(rungs) and all(pairs[i] == pairs[i + 1] for i in range(0, len(pairs), 2)):
            raise Wrong("two-sessions", f"it timed each rung twice ({len(calls)} sessions for {len(rungs)} "
                        "rungs): the candidate's and the best stack's timings came from different sessions",
                        "call time_side_by_side(candidate, best) once per rung and use both timings it "
                        "returns: they share one session's load, which a second session does not")
        raise Wrong("sessions-per-rung", f"it timed {len(calls)} sessions for {len(rungs)} rungs",
                    "one session per rung: t_c, t_b = time_side_by_side(candidate, best)")


# --- 08-greedy-climb: the contract and the differential search ---------------------------------------------

class _EdgeMachine(_Machine):
    """A machine whose every session puts the ratio best / candidate just above or just below (by 0.01-0.3 %)
    a threshold some keep rule uses: 1 + the larger relative spread (the ladder's), the smaller, each arm's
    own, their sum, their mean, both spreads over the candidate's median, no spread at all. Each comparison
    then falls on both sides of the rule's threshold within one search. A session's numbers depend only on
    the pair timed (in either order) and how often it was timed before."""

    def __init__(self, rng: random.Random, baseline: Any, rungs: Sequence[Any]) -> None:
        super().__init__(rng, baseline)
        self.rungs = list(rungs)
        self.draw_effects(rungs)

    def _roles(self, a: Any, b: Any) -> tuple[Any, Any]:
        """(candidate, best), whichever order they were given in: the candidate is the stack a rung makes of
        the other (when a rung goes each way, or none, the first by repr)."""
        x, y = sorted((a, b), key=repr)
        if any(r.on(x) == y for r in self.rungs) and not any(r.on(y) == x for r in self.rungs):
            return y, x
        return x, y

    def time_pair(self, a: Any, b: Any) -> tuple[Any, Any]:
        from helpers.core.timing import Timing

        if self.max_calls is not None and len(self.calls) >= self.max_calls:
            raise Halt("endless", f"it timed more than {self.max_calls} sessions for "
                       f"{(self.max_calls - 8) // 4} rungs: the climb does not end", _ONE_SESSION)
        key = tuple(sorted((repr(a), repr(b))))
        k = self.sessions.get(key, 0)
        self.sessions[key] = k + 1
        self.calls.append((a, b))
        r = _draw(self.salt, "edge", key, k)
        rc, rb = 10 ** r.uniform(-2.3, -0.8), 10 ** r.uniform(-2.3, -0.8)  # relative IQRs: 0.5 % .. 16 %
        target = r.choice((1 + max(rc, rb), 1 + min(rc, rb), 1 + rc, 1 + rb, 1 + rc + rb, 1 + (rc + rb) / 2,
                           1 / (1 - rb), 1 + rc * (1 + max(rc, rb)), 1.0))
        ratio = target * (1 + r.choice((-1, 1)) * r.uniform(1e-4, 3e-3))
        cand, best = self._roles(a, b)
        best_s = self.true_s(best) * (1 + r.uniform(0, 1.0))  # the session's load falls on both
        timed = {id(cand): Timing("candidate", best_s / ratio, best_s / ratio * rc, runs=5, calls_per_run=1),
                 id(best): Timing("best", best_s, best_s * rb, runs=5, calls_per_run=1)}
        if cand is best:  # a stack timed beside itself
            return timed[id(best)], timed[id(best)]
        return timed[id(a)], timed[id(b)]


@dataclasses.dataclass(frozen=True)
class _Climb:
    machine: int
    rungs: tuple

    def __repr__(self) -> str:
        return f"a climb of {len(self.rungs)} rungs ({', '.join(r.name for r in self.rungs)}) on machine " \
               f"{self.machine}"


def _climb_arguments(c: _Climb) -> dict[str, Any]:
    from helpers.train import ladder

    m = _EdgeMachine(random.Random(c.machine), ladder.BASELINE, c.rungs)
    m.max_calls = 4 * len(c.rungs) + 8
    return {"baseline": ladder.BASELINE, "rungs": list(c.rungs), "time_side_by_side": m.time_pair}


def _climb_observe(returned: Any, arguments: dict) -> tuple:
    stack, kept = returned
    machine = arguments["time_side_by_side"].__self__
    return stack, [bool(k) for k in kept], _sessions(machine.calls)


def _stack_and_kept(returned: Any) -> tuple[Any, Any]:
    """(stack, kept) from what a climb returned, the stack a RunSpec, or the Wrong that names the shape."""
    from helpers.train.runspec import RunSpec

    if not isinstance(returned, (tuple, list)) or len(returned) != 2:
        raise Wrong("return-shape", f"it returned {type(returned).__name__}, not (your stack, kept)",
                    "end with `return best, kept`: the final RunSpec and one True/False per rung")
    stack, kept = returned
    if not isinstance(stack, RunSpec):
        raise Wrong("return-type", f"the stack it returned is a {type(stack).__name__}",
                    "return the best stack itself, a RunSpec (rung.on(stack) makes one)")
    return stack, kept


def _climb_validate(returned: Any, c: _Climb) -> None:
    _, kept = _stack_and_kept(returned)
    decisions = isinstance(kept, (list, tuple)) and all(
        isinstance(k, (bool, int)) or type(k).__name__ == "bool_" for k in kept)
    if not decisions:
        raise Wrong("return-shape", f"kept is {kept!r}, not one True/False for each of the {len(c.rungs)} "
                    "rungs", "append the rule's decision for every rung, in order")


def _climb_agree(got: tuple, want: tuple, c: _Climb) -> str | None:
    if len(got[1]) != len(want[1]):
        return f"kept holds {len(got[1])} decisions for {len(c.rungs)} rungs"
    if got[2] != want[2]:
        i = next((i for i, (g, w) in enumerate(zip(got[2], want[2])) if g != w),
                 min(len(got[2]), len(want[2])))
        return f"session {i + 1} timed {' beside '.join(got[2][i]) if i < len(got[2]) else 'nothing'}"
    if got[1] != want[1]:
        i = next(i for i, (g, w) in enumerate(zip(got[1], want[1])) if g != w)
        return f"at rung {c.rungs[i].name!r} it said {'keep' if got[1][i] else 'drop'}"
    return None if got[0] == want[0] else f"it returned {_shown(got[0])}"


def _climb_name(c: _Climb, got: tuple, want: tuple) -> None:
    """Too many or too few sessions; or where the climb first parts from the ladder's, with that session's
    numbers."""
    if len(got[2]) != len(c.rungs):
        raise Wrong("sessions-per-rung", f"it timed {len(got[2])} sessions for {len(c.rungs)} rungs ({c})",
                    "one session per rung: t_c, t_b = time_side_by_side(candidate, best)")
    if len(got[1]) != len(c.rungs):
        raise Wrong("return-shape", f"kept holds {len(got[1])} decisions for the {len(c.rungs)} rungs ({c})",
                    "append the rule's decision for every rung, in order")
    if got[2] != want[2] or got[1] == want[1]:
        return
    i = next(i for i, (g, w) in enumerate(zip(got[1], want[1])) if g != w)
    args = _climb_arguments(c)  # the ladder's climb again, for its sessions; then the first i + 1 replayed
    reference("08_bert_finetuning/greedy_climb.py", "greedy_climb")(*args.values())
    machine = args["time_side_by_side"].__self__
    fresh = _climb_arguments(c)["time_side_by_side"].__self__
    for call in machine.calls[:i]:
        fresh.time_pair(*call)
    t_c, t_b = fresh.time_pair(*machine.calls[i])
    ratio = t_b.median_s / t_c.median_s
    spread = max(t_c.iqr_s / t_c.median_s, t_b.iqr_s / t_b.median_s)
    raise Wrong("climb", f"at rung {c.rungs[i].name!r} of {c}: candidate {t_c.median_s:.6g} s (IQR "
                f"{t_c.iqr_s:.3g}), best {t_b.median_s:.6g} s (IQR {t_b.iqr_s:.3g}) in one session: ratio "
                f"{ratio:.5f} vs threshold 1 + the larger relative spread = {1 + spread:.5f}, so "
                f"{'keep' if want[1][i] else 'drop'}; it said {'keep' if got[1][i] else 'drop'}",
                "keep when best.median_s / candidate.median_s > 1 + max(candidate.iqr_s / "
                "candidate.median_s, best.iqr_s / best.median_s): ratios a hair either side of that "
                "threshold decide differently")


def _confirmed(answer: Callable, how: str, rule: str, rng: random.Random, n: int = 6) -> bool:
    """Whether the answer climbs as the named mistake does on n climbs whose sessions sit at the rules'
    thresholds too: a mistake the hypotheses lack can agree with one of them on the simulated climbs."""
    from helpers.train import ladder

    task = climb_task()
    for _ in range(n):
        c = task.draw(rng)
        args = _climb_arguments(c)
        try:
            mine = _climb_observe(answer(*args.values()), args)
        except Exception:  # noqa: BLE001 - not the mistake's behaviour: the generic line says what differs
            return False
        theirs = _climb_arguments(c)
        stack, kept = _climb(how, rule, ladder.BASELINE, list(c.rungs), theirs["time_side_by_side"])
        if mine != _climb_observe((stack, kept), theirs):
            return False
    return True


def climb_task() -> Task:
    """08-greedy-climb's function for the contract and the search: a machine per call whose sessions sit at
    the keep rules' thresholds."""
    from helpers.train import ladder

    def draw(rng: random.Random) -> _Climb:
        n = rng.randrange(5, len(ladder.RUNGS) + 1)
        return _Climb(rng.randrange(2 ** 31), tuple(rng.sample(ladder.RUNGS, n)))

    return Task(reference("08_bert_finetuning/greedy_climb.py", "greedy_climb"), draw=draw,
                arguments=_climb_arguments, agree=_climb_agree, show=repr, observe=_climb_observe,
                name="greedy_climb", result="(your stack, kept)", validate=_climb_validate,
                hint="for each rung: candidate = rung.on(best); t_c, t_b = time_side_by_side(candidate, "
                     "best); keep when t_b.median_s / t_c.median_s > 1 + the larger relative IQR, then "
                     "best = candidate")


def greedy_climb(answer: Callable, seed: int) -> str:
    """08-greedy-climb: answer(baseline, rungs, time_side_by_side) -> (your stack, [kept?]) on simulated
    machines drawn from `seed`."""
    from helpers.train import ladder

    the_task = climb_task()
    rng = random.Random(seed)
    contract(answer, the_task, the_task.draw(rng))
    climbs = _climbs(seed, 6)
    runs, rights = [], []
    for m_seed, rungs in climbs:
        runs.append(_run_climb(answer, m_seed, rungs))
        m = _Machine(random.Random(m_seed), ladder.BASELINE)
        m.draw_effects(rungs)
        stack, kept = _climb("greedy", "right", ladder.BASELINE, rungs, m.time_pair)
        rights.append((stack, kept, m.calls))
    def same(a: tuple, r: tuple) -> bool:
        return (a[0], a[1], _sessions(a[2])) == (r[0], r[1], _sessions(r[2]))

    if all(same(a, r) for a, r in zip(runs, rights)):
        n_kept = sum(sum(r[1]) for r in rights)
        n_rungs = sum(len(r[1]) for r in rights)
        searched = search(answer, the_task, rng, draws=20, name=_climb_name, key="climb")
        return (f"the same stacks, timings and decisions as the greedy ladder in {len(climbs)} simulated "
                f"climbs ({n_rungs} rungs, {n_kept} kept; the machine's load changing between sessions), "
                f"keep rule included, and in {searched} more whose sessions sit a hair either side of the "
                "keep rules' thresholds")
    matched = []
    for how, rule in _HYPOTHESES[1:]:
        ok = True
        for (m_seed, rungs), a in zip(climbs, runs):
            m = _Machine(random.Random(m_seed), ladder.BASELINE)
            m.draw_effects(rungs)
            stack, kept = _climb(how, rule, ladder.BASELINE, rungs, m.time_pair)
            if not same(a, (stack, kept, m.calls)):
                ok = False
                break
        if ok:
            matched.append((how, rule))
    if len(matched) == 1 and _confirmed(answer, *matched[0], random.Random(seed + 1)):
        how, rule = matched[0]
        key, (what, hint) = (how, _CLIMB_HINTS[how]) if how != "greedy" else (rule, _RULE_HINTS[rule])
        raise Wrong(key, f"{what}, in all {len(climbs)} simulated climbs", hint)
    _check_sessions(runs, climbs)
    i = next(i for i, (a, r) in enumerate(zip(runs, rights)) if not same(a, r))
    raise Wrong("climb", _first_difference(runs[i], rights[i], *climbs[i]),
                "for each rung: candidate = rung.on(best); t_c, t_b = time_side_by_side(candidate, best); "
                "keep "
                "when t_b.median_s / t_c.median_s > 1 + the larger relative IQR, and then best = candidate")


# --- 08-new-rung: a rung of your own, measured ------------------------------------------------------------

_NO_EFFECT = {  # switch -> (when it changes nothing, why)
    "init_scale": (lambda spec: spec.precision != "fp16",
                   "init_scale is the GradScaler's first loss scale: only precision='fp16' has a GradScaler"),
}


def _form(answer: Any) -> Any:
    """The checks that need no measurement; -> the stack the rung makes from the baseline."""
    from helpers.train import ladder

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
    if answer.switch in _NO_EFFECT and _NO_EFFECT[answer.switch][0](ladder.BASELINE):
        raise Wrong("no-effect", f"RunSpec.{answer.switch}={answer.value!r} changes nothing on the baseline: "
                    f"{_NO_EFFECT[answer.switch][1]}", "pick a switch that changes what the step computes or "
                                                       "how")
    if not isinstance(answer.name, str) or not answer.name.strip():
        raise Wrong("no-name", f"its name is {answer.name!r}", 'name it as the ladder\'s rungs are named, '
                    'e.g. "+ activation checkpointing": the ladder\'s table prints it')
    if not isinstance(answer.claim, str) or len(answer.claim.split()) < 2:
        raise Wrong("no-claim", f"its claim is {answer.claim!r}, not a sentence", "say what is commonly "
                    "claimed for it, in a few words: the ladder prints it next to what this machine measured")
    return stack


def _tiny_ladder(rng: random.Random, device: Any) -> tuple[Callable, dict, dict]:
    """A tiny random-weight BERT (each copy on `device`) and batches for every padding: the ladder in well
    under a second."""
    import copy

    import torch
    import transformers

    from helpers.train import ladder
    from helpers.train.runspec import PADDINGS

    vocab, seq = 1200, rng.choice((32, 40, 48))
    torch.manual_seed(rng.randrange(2 ** 31))
    config = transformers.BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                                     num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    with contextlib.redirect_stderr(io.StringIO()):
        pristine = transformers.BertForSequenceClassification(config)
    g = torch.Generator().manual_seed(rng.randrange(2 ** 31))
    lengths = torch.randint(6, seq, (16,), generator=g).tolist()
    data_seed = rng.randrange(2 ** 20)
    batches, check = ladder.sample_batches(lengths, batch_size=4, n_batches=2, seq_len=seq, vocab=vocab,
                                           n_classes=3, seed=data_seed, check_size=4)
    for padding in PADDINGS:  # the ladder's batches lack paddings no rung sets; a learner's rung may set one
        if padding not in batches:
            batches[padding] = [_repadded(b, padding, seq) for b in batches["fixed"]]
            check[padding] = _repadded(check["fixed"], padding, seq)

    def make_model() -> Any:
        return copy.deepcopy(pristine).to(device)

    return make_model, batches, check


def _repadded(batch: dict, padding: str, seq: int) -> dict:
    """The same samples, in the same order, batched as `padding` does."""
    from helpers.data.text import TokenizedDataset
    from helpers.train.runspec import RunSpec

    ids = [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
    ds = TokenizedDataset(ids, batch["labels"].tolist())
    loader = RunSpec(padding=padding).dataloader(ds, len(ds), max_length=seq, shuffle=False, device="cpu")
    return next(iter(loader))


@time_limit(None)  # no code of the learner's runs: the course's ladder measures a value
def new_rung(answer: Any, seed: int, device: Any = None) -> str:
    """08-new-rung: answer is a helpers.train.ladder.Rung the ladder does not have yet; it is measured on a
    tiny
    BERT (checked against the baseline, timed beside it, judged by the keep rule) on `device`: the lesson's
    (None: the one `helpers.core.device.get_device` picks, as the lesson does), so a rung a GPU runs is
    measured
    on the GPU."""
    import torch

    from helpers.core.device import get_device
    from helpers.train import ladder

    stack = _form(answer)
    device = get_device() if device is None else torch.device(device)
    make_model, batches, check = _tiny_ladder(random.Random(seed), device)
    import transformers

    quiet: list[str] = []
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its notes on switches (checkpointing sets use_cache=False)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            climbed = ladder.climb_stacks(make_model, batches, check, device=device, rungs=(answer,),
                                          repeats=3, log=quiet.append)
    except Exception as err:  # noqa: BLE001 - the ladder could not measure this switch value here
        raise Wrong("not-measured", f"the ladder could not measure {stack.describe()!r} here: "
                    f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                    f"pick a switch value this device ({device}) runs (RunSpec.check(device) says which)") \
            from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    row = climbed["rows"][1]
    if "samples_per_s" not in row:
        why = row.get("why", "")
        if "failed its check" in why:
            raise Wrong("disagrees", f"it was not timed: {why}", "a faster rung must compute what the "
                                                                 "baseline "
                        "does, within the looser precision's tolerance (helpers.measure.agreement)")
        raise Wrong("cannot-run-here", f"it was not timed on this device ({device}): {why}",
                    "pick a switch value this device can run (another device may run this one)")
    verdict = "kept" if row["kept"] else "dropped"
    return (f"{answer.name!r} (RunSpec.{answer.switch}={answer.value!r}) ran on a tiny BERT on {device}, "
            f"agreed with the baseline (logits {row.get('check_logits', 'checked')}), and was timed beside "
            f"it: {row['vs_below']:.2f}x its speed, {verdict} by the keep rule here; on the lesson's model: "
            "ladder.climb_stacks(make_model, batches, check, device=device, rungs=(*ladder.RUNGS, NEW_RUNG), "
            "...)")
