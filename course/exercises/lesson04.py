"""The check of exercise 04-predict-time (lesson 04, `04_where_time_goes`): an op's regime and the time the
roofline model gives it, in both time models: on a synchronous device (a CPU) the calls' cost and the work
add, calls × overhead + max(compute, memory); on an asynchronous one (a GPU) the launches hide under the
running kernels, max(compute, memory, calls × overhead). The regime is the largest of the three times in both.

The cases are drawn for each check (`course.exercises.core.draw_seed`: a seed per run, shown in the line;
`seed=` replays a run): a made-up
machine (peak FLOP/s, bandwidth, cost of a call) and ops clearly in each regime, plus ops whose calls cost a
fair part of their work, where the two models differ. The expected values are computed here, apart from
`helpers.measure.regimes`: an answer that calls the course's own `classify_regime`, `roof_times` or
`predicted_time` is refused (it would pass without the learner writing the rule). A wrong time is named only
when it equals what that mistake gives on the case; otherwise the hint says which case, what came out and by
how much it is off.
"""

from __future__ import annotations

import contextlib
import functools
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from course.exercises.contract import Task, contract, reference, search
from course.exercises.core import Wrong, close, draw_seed, unpack
from helpers.measure.regimes import roof_times

__all__ = ["predict_time", "draw_cases", "Case", "task"]

_REGIMES = ("compute", "memory", "overhead")  # the names of lesson 04 (helpers.measure.regimes.LABELS)
_COURSE = ("classify_regime", "roof_times", "predicted_time")  # helpers.measure.regimes' own answers: refused


@dataclass(frozen=True)
class Case:
    """One call of the learner's predict_time, and the three times the answer is made of."""

    flops: float
    bytes_moved: float
    calls: int
    peak_flops: float
    bandwidth: float
    overhead_s: float
    synchronous: bool

    @property
    def args(self) -> tuple:
        return (self.flops, self.bytes_moved, self.calls, self.peak_flops, self.bandwidth, self.overhead_s,
                self.synchronous)

    @property
    def terms(self) -> dict[str, float]:
        return roof_times(self.flops, self.bytes_moved, self.calls, peak_flops=self.peak_flops,
                          bandwidth=self.bandwidth, overhead_s=self.overhead_s)

    @property
    def regime(self) -> str:
        t = self.terms
        return max(t, key=t.get)

    @property
    def seconds(self) -> float:
        t = self.terms
        work = max(t["compute"], t["memory"])
        return t["overhead"] + work if self.synchronous else max(work, t["overhead"])

    def __str__(self) -> str:
        model = "synchronous" if self.synchronous else "asynchronous"
        return (f"{self.flops:.4g} FLOPs, {self.bytes_moved:.4g} bytes, {self.calls} call(s) on "
                f"{self.peak_flops:.3g} FLOP/s, {self.bandwidth:.3g} B/s, {self.overhead_s:.3g} s per call, "
                f"{model}")


def _machine(rng: random.Random) -> tuple[float, float, float]:
    """A made-up device: peak FLOP/s, bandwidth (a ridge of 2 to 500 FLOP per byte), seconds per call."""
    bandwidth = 10 ** rng.uniform(10, 12.7)  # 10 GB/s (a laptop) to 5 TB/s (an H200)
    return bandwidth * 10 ** rng.uniform(0.3, 2.7), bandwidth, 10 ** rng.uniform(-6, -4.5)


def draw_cases(seed: int) -> list[Case]:
    """The cases of one check: on two drawn machines, an op clearly in each regime (its time at least 3x the
    others) and ops whose calls cost 20-60 % of their work; each in both time models, shuffled."""
    rng = random.Random(seed)
    ops = []
    for _ in range(2):
        peak, bw, over = _machine(rng)

        def op(compute_s: float, memory_s: float, calls: int) -> tuple:
            return (compute_s * peak, memory_s * bw, calls, peak, bw, over)

        work = 10 ** rng.uniform(-4.5, -2)  # 30 µs to 10 ms of work
        lead = rng.uniform(3, 30)  # how far the leading time is ahead of the others
        calls_for = max(1, int(work / lead / over))  # as many calls as the lead allows
        ops.append(op(work, work / lead, rng.randint(1, calls_for)))  # compute-bound
        ops.append(op(work / lead, work, rng.randint(1, calls_for)))  # memory-bound
        calls = rng.randint(2, 64)
        ops.append(op(calls * over / lead, calls * over / rng.uniform(3, 30), calls))  # overhead-bound
        # the calls a fair part of the work (20-60 %): the two time models differ by as much
        calls = rng.randint(1, 32)
        share = rng.uniform(0.2, 0.6)
        work = calls * over / share
        ops.append(op(work, work / rng.uniform(2, 10), calls))
        ops.append(op(work / rng.uniform(2, 10), work, calls))
    cases = [Case(*o, synchronous=s) for o in ops for s in (True, False)]
    rng.shuffle(cases)
    return cases


@contextlib.contextmanager
def _watch_course_functions() -> Iterator[list[str]]:
    """Record a call of helpers.measure.regimes' own answer functions (however they were imported) while the
    block
    runs: sys.setprofile sees every Python function call."""
    import helpers.measure.regimes as regimes

    codes = {getattr(regimes, name).__code__: name for name in _COURSE}
    seen: list[str] = []
    previous = sys.getprofile()

    def watch(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in codes:
            seen.append(codes[frame.f_code])
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(watch)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


def _hypotheses(case: Case) -> list[tuple[str, float, str]]:
    """(mistake, the seconds it gives on this case, its hint) for every mistake, on every case: a mistake that
    touches only one time model gives the right time in the other."""
    t = case.terms
    c, m, o = t["compute"], t["memory"], t["overhead"]
    once = case.overhead_s  # the overhead of one call, not of `calls`
    work = max(c, m)
    right = case.seconds
    # FLOPs over bandwidth and bytes over peak: the counts swapped between the two roofs
    roofs_swapped = roof_times(case.bytes_moved, case.flops, 0, peak_flops=case.peak_flops,
                               bandwidth=case.bandwidth, overhead_s=0.0)
    swapped = max(roofs_swapped["compute"], roofs_swapped["memory"])
    floored = max(case.flops // case.peak_flops, case.bytes_moved // case.bandwidth)  # both 0 below 1 s
    sync = case.synchronous
    both = ("compute and memory overlap inside one op's kernel: take the larger of the two; the calls' cost "
            "adds to it on a synchronous device (a CPU) and hides under it on an asynchronous one (a GPU)")
    return [
        ("sum", c + m + o, both),
        ("max-on-synchronous", max(work, o) if sync else right,
         "on a synchronous device (a CPU) each call is paid before its work starts, so the two add: "
         "calls × overhead + max(compute, memory); the largest of the three is the GPU's model"),
        ("additive-on-asynchronous", right if sync else o + work,
         "on an asynchronous device (a GPU) the host launches the next kernels while earlier ones run, so "
         "the calls' cost hides under the work: max(compute, memory, calls × overhead)"),
        ("models-swapped", max(work, o) if sync else o + work,
         "the two time models are swapped: synchronous (a CPU, synchronous=True) adds the calls' cost, "
         "calls × overhead + max(compute, memory); asynchronous (a GPU) takes the largest of the three"),
        ("no-overhead-on-asynchronous", right if sync else work,
         "on a GPU the launches hide under the work only while there is more work than launching: the time "
         "is max(compute, memory, calls × overhead), so an op of many tiny kernels is overhead-bound"),
        ("one-call", once + work if sync else max(work, once),
         "overhead_s is the cost of ONE call: the op pays it `calls` times"),
        ("no-overhead", work, "every call costs at least its fixed overhead (dispatch, launch): take "
                              "calls × overhead_s into the time"),
        ("units", (o + swapped) if sync else max(swapped, o),
         "compute time = FLOPs ÷ peak FLOP/s; memory time = bytes ÷ bandwidth (you divided the other way)"),
        ("floor-division", o + floored if sync else max(floored, o),
         "divide with `/`: `//` rounds each time down to whole seconds, and an op's microseconds become 0"),
        ("milliseconds", right * 1e3, "return seconds, not milliseconds"),
        ("microseconds", right * 1e6, "return seconds, not microseconds"),
    ]


def _diagnose_seconds(answers: list[tuple[Case, float]]) -> None:
    """Name the one mistake whose time equals the answer's on every case (the right ones included: a mistake
    of one time model leaves the other's times right); else say what differs on the first wrong case."""
    tables = [(case, seconds, _hypotheses(case)) for case, seconds in answers]
    keys = [key for key, _, _ in tables[0][2]]
    matched = [i for i, key in enumerate(keys)
               if all(close(seconds, hyps[i][1], 1e-6) for _, seconds, hyps in tables)]
    case, seconds = next((c, s) for c, s in answers if not close(s, c.seconds, 1e-6))
    if len(matched) == 1:
        mistake, _, hint = tables[0][2][matched[0]]
        raise Wrong(mistake, f"for {case}: {seconds:.4g} s, expected {case.seconds:.4g} s", hint)
    t = case.terms
    raise Wrong("seconds", f"for {case}: {seconds:.4g} s, expected {case.seconds:.4g} s "
                f"({seconds / case.seconds:.3g}x); its three times are compute {t['compute']:.3g} s, memory "
                f"{t['memory']:.3g} s, overhead {t['overhead']:.3g} s",
                "synchronous: calls × overhead_s + max(FLOPs ÷ peak, bytes ÷ bandwidth); asynchronous: the "
                "largest of the three; compare your time with these three on this case")


def _ridge_rule(case: Case) -> str:
    return "compute" if case.flops / max(case.bytes_moved, 1e-300) > case.peak_flops / case.bandwidth \
        else "memory"


def _diagnose_regimes(answers: list[tuple[Case, str]]) -> None:
    """Name the rule whose regime is the answer's on every case (the ridge alone, the smallest time);
    otherwise say where the first wrong regime is."""
    case, regime = next((c, r) for c, r in answers if r != c.regime)
    t = case.terms
    times = f"compute {t['compute']:.3g} s, memory {t['memory']:.3g} s, overhead {t['overhead']:.3g} s"
    if all(r == _ridge_rule(c) for c, r in answers):
        raise Wrong("ridge-only", f"for {case}: {regime}, expected overhead ({times})",
                    "the ridge point only tells compute from memory; an op whose calls cost more than its "
                    "work is overhead-bound: compare all three times")
    if all(r == min(c.terms, key=c.terms.get) for c, r in answers):
        raise Wrong("smallest", f"for {case}: {regime}, the smallest of its times ({times})",
                    "the regime is the term that sets the time: the largest of the three")
    raise Wrong("regime", f"for {case}: {regime}, expected {case.regime} ({times})",
                "the regime is the largest of the three times, in both time models")


# --- the contract and the differential search ---------------------------------------------------------------

def _draw_one(rng: random.Random) -> Case:
    """One case for the search: a drawn machine; one call, a few or many; the leading time 1.05-3x ahead of
    the second (any two of the three in either order), the third 1.2-20x behind that."""
    peak, bw, over = _machine(rng)
    calls = rng.choice((1, 1, 2, rng.randint(3, 16), rng.randint(17, 200)))
    order = rng.sample(("compute", "memory", "overhead"), 3)  # leading, second, third
    scale = [1.0, 1 / rng.uniform(1.05, 3.0)]
    scale.append(scale[1] / rng.uniform(1.2, 20))
    x = calls * over / scale[order.index("overhead")]  # the overhead is calls × overhead_s: the rest follow
    t = {name: x * k for name, k in zip(order, scale)}
    return Case(t["compute"] * peak, t["memory"] * bw, calls, peak, bw, over, rng.random() < 0.5)


def _agree(got: tuple, want: tuple, case: Case) -> str | None:
    regime, seconds = got
    if not close(seconds, want[1], 1e-6):
        return f"its time {seconds:.6g} s, the solution's {want[1]:.6g} s"
    return None if regime == want[0] else f"its regime {regime!r}, the solution's {want[0]!r}"


def _name_case(seen: list[tuple[Case, float]], case: Case, got: tuple, want: tuple) -> None:
    """A known mistake whose time (or regime) is the answer's on this case and on every case it got right
    before."""
    if not close(got[1], want[1], 1e-6):
        _diagnose_seconds([(case, float(got[1]))] + seen)
    _diagnose_regimes([(case, got[0])] + [(c, c.regime) for c, _ in seen])


def _validate(returned: Any, case: Case) -> None:
    regime, seconds = unpack(returned, 2, "regime, seconds")
    if isinstance(regime, (int, float)) and isinstance(seconds, str):
        raise Wrong("order", "it returned (seconds, regime)", "return (regime, seconds)")
    if regime not in _REGIMES:
        raise Wrong("regime-name", f"regime {regime!r}", f"answer one of {_REGIMES}, lesson 04's names")
    if isinstance(seconds, (str, bytes)) or not hasattr(seconds, "__float__"):
        raise Wrong("seconds-type", f"seconds is a {type(seconds).__name__}", "return the time as a number")


def task() -> Task:
    """04-predict-time's function for the contract and the search."""
    return Task(reference("04_where_time_goes/predict_time.py", "predict_time"), draw=_draw_one,
                arguments=lambda c: dict(zip(("flops", "bytes_moved", "calls", "peak_flops", "bandwidth",
                                              "overhead_s", "synchronous"), c.args)),
                agree=_agree, show=str, name="predict_time", result="what it returned", validate=_validate,
                hint="synchronous: calls × overhead_s + max(FLOPs ÷ peak, bytes ÷ bandwidth); asynchronous: "
                     "the largest of the three; the regime is the largest of the three times")


def predict_time(answer: Callable, seed: int | None = None, device: Any = None) -> str:
    """04-predict-time: answer(flops, bytes_moved, calls, peak_flops, bandwidth, overhead_s, synchronous) ->
    (regime, seconds), on cases drawn for this run (`seed`: repeat one); `device`: the lesson's, to say which
    model fits it."""
    seed = draw_seed() if seed is None else seed
    cases = draw_cases(seed)
    the_task = task()
    with _watch_course_functions() as used:
        contract(answer, the_task, cases[0])
        results = [answer(*case.args) for case in cases]
    if used:
        raise Wrong("course-function", f"it calls the course's own {sorted(set(used))[0]}(...)",
                    "write the rule yourself: the three times from the counts and the machine, then the time "
                    "model and the largest of the three (the lesson's helpers are the answer key)")
    answers = []
    for case, got in zip(cases, results):
        _validate(got, case)
        regime, seconds = got
        answers.append((case, regime, float(seconds)))
    if any(not close(s, case.seconds, 1e-6) for case, _, s in answers):
        _diagnose_seconds([(case, s) for case, _, s in answers])
    if any(regime != case.regime for case, regime, _ in answers):
        _diagnose_regimes([(case, regime) for case, regime, _ in answers])
    seen = [(case, s) for case, _, s in answers]
    searched = search(answer, the_task, random.Random(seed + 1), draws=200,
                      name=functools.partial(_name_case, seen), key="seconds")
    here = ""
    if device is not None:
        import torch

        sync = torch.device(device).type not in ("cuda", "mps")
        here = (f"; this lesson's {torch.device(device).type} is " +
                ("synchronous: it runs each op before Python issues the next, so the calls' cost adds to the "
                 "work (the additive model)" if sync else
                 "asynchronous: kernels queue while earlier ones run, so the launches hide under the work "
                 "(the largest of the three)"))
    return (f"regime and time right in {len(cases)} drawn cases, both time models, and as the course's "
            f"solution on {searched} more (one call or many, each time just ahead of another){here}")
