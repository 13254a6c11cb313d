"""The check of exercise 03-largest-batch (lesson 03, `03_memory`): the largest batch that fits, searched on a
simulated device whose failed tries keep their memory in reference cycles until the garbage collector frees
them, for capacities and limits drawn per run: doubling then bisecting, memory released, and an error that is
not out-of-memory (a CUDA fault, which is a RuntimeError like the out-of-memory error itself, and a
ValueError) propagated. A wrong size is named only when it is what a typical mistake gives in every case (no
bisection, the limit never tried, the first size that failed); a memory problem by an experiment that tells
them apart (the same search without reference cycles; whether `gc.collect()` ran at all). A search that tries
one size more than five times, or makes more tries than a linear search would, is stopped there (with the
garbage collector off, its failed tries would hold memory without bound) and told where it loops.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from course.exercises.contract import Task, contract, reference, search
from course.exercises.core import Halt, Wrong, course_code_running

__all__ = ["largest_batch", "task"]

_CUDA_FAULT = ("CUDA error: an illegal memory access was encountered (simulated: a bug in the step, not an "
               "out-of-memory error)")


@dataclass
class _Memory:
    """A simulated device: `capacity` units; a try uses n units until the tensors of that try are freed."""

    capacity: int
    limit: int = 0  # the search's limit: more tries than limit + 64 is a search that does not end
    live: int = 0
    calls: list[int] = field(default_factory=list)
    course: str | None = None  # a course function the learner's search went through


class _Block:
    """The tensors of one try. `cycle`: they sit in a reference cycle, as a failed step's often do, so only
    the garbage collector frees them once nothing else holds them."""

    def __init__(self, mem: _Memory, n: int, cycle: bool) -> None:
        self.mem, self.n = mem, n
        self.me = self if cycle else None
        mem.live += n

    def __del__(self) -> None:
        self.mem.live -= self.n


def _sim_step(mem: _Memory, cycle: bool, poison: tuple[int, type] | None = None) -> Callable[[int], None]:
    def step(n: int) -> None:  # a training step on a batch of n, on the simulated device
        mem.calls.append(n)
        mem.course = mem.course or course_code_running()
        _stop_endless(mem, n)
        if poison is not None and n >= poison[0]:
            raise poison[1](_CUDA_FAULT if poison[1] is RuntimeError else
                            "simulated: a bug in the step itself (a ValueError), not an out-of-memory error")
        block = _Block(mem, n, cycle)
        if mem.live > mem.capacity:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (simulated). Tried to allocate {n} units; "
                                              f"{mem.live - n} in use, capacity {mem.capacity}")
        block.me = None  # a step that finished frees its tensors

    return step


def _stop_endless(mem: _Memory, n: Any) -> None:
    """Halt a search that tries one size again and again, or more sizes than a linear search would."""
    again = mem.calls.count(n) if len(mem.calls) < 10_000 else 6
    if again <= 5 and len(mem.calls) <= mem.limit + 64:
        return
    last = ", ".join(map(str, mem.calls[-8:]))
    if again > 5:
        raise Halt("endless", f"it tried batch size {n} {again} times (the last tries: {last}; limit "
                   f"{mem.limit}): the search does not end", "each try must shrink the range between the "
                   "last size that fitted and the first that failed, and the search stops when they are 1 "
                   "apart; "
                   "with lo = mid after a fit, take mid = (lo + hi + 1) // 2, or lo stays where it is; stop "
                   "doubling at the limit")
    raise Halt("endless", f"{len(mem.calls)} tries with limit {mem.limit} (the last: {last}): more than a "
               "linear search makes, and still going", "double from 1 while it fits (up to the limit), then "
               "bisect: about 2·log2(limit) tries")


@dataclass
class _Search:
    got: Any
    mem: _Memory
    collections: int  # gc.collect() calls the learner made


def _search(answer: Callable, capacity: int, limit: int, cycle: bool,
            poison: tuple[int, type] | None = None) -> _Search:
    mem = _Memory(capacity, limit)
    collections = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(count)
    try:
        with _quick_collector():
            got = answer(_sim_step(mem, cycle, poison), limit)
    finally:
        gc.callbacks.remove(count)
    if mem.course is not None:
        raise Wrong("uses-course-code", f"it searches with the course's {mem.course}",
                    "write the search yourself: doubling, then bisecting, each failure let go of")
    return _Search(got, mem, len(collections))


# --- what each search mistake returns, for fits(n) = n <= capacity ------------------------------------------

def _doubling(capacity: int, limit: int) -> tuple[int, int | None]:
    """(the last power of two that fitted, the first that did not or None) while doubling up to limit."""
    good, n = 0, 1
    while n <= limit:
        if n > capacity:
            return good, n
        good, n = n, n * 2
    return good, None


def _right(capacity: int, limit: int) -> int:
    return max(0, min(capacity, limit))


def _limit_not_tried(capacity: int, limit: int) -> int:
    good, bad = _doubling(capacity, limit)
    return good if bad is None else _right(capacity, limit)


def _first_failure(capacity: int, limit: int) -> int:
    return _right(capacity, limit) + (1 if 0 < capacity < limit else 0)


_SIZE_MISTAKES = (  # key, the size it returns, what, hint
    ("no-bisect", lambda c, lim: _doubling(c, lim)[0], "doubling alone (the last power of two that fitted)",
     "after the first failure, bisect between the last size that fitted and the first that did not"),
    ("limit-not-tried", _limit_not_tried, "a search that never tries the limit itself (when every size "
     "fits: the last power of two below it)",
     "when doubling passes the limit without a failure, try the limit itself (it may fit too)"),
    ("off-by-one", _first_failure, "a search that returns the first size that did not fit",
     "return the largest size that fitted, not the first that failed"),
)


def _diagnose(answer: Callable, cases: list[tuple[int, int]], got: list[Any], collected: int) -> None:
    want = [_right(c, lim) for c, lim in cases]
    plain = [_search(answer, c, lim, cycle=False) for c, lim in cases]
    if [p.got for p in plain] == want:  # right when failed tries hold no reference cycles: memory kept
        i = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
        (c, lim), g, w = cases[i], got[i], want[i]
        if collected == 0:
            raise Wrong("no-gc", f"with capacity {c} it returned {g}, not {w}: after the first failure every "
                                 f"try "
                        "failed, the failed try's memory was never released (it is right when the failed "
                        "tries hold no reference cycles)", "after an out-of-memory error, run gc.collect(): "
                        "the failed step's tensors sit in reference cycles that only the garbage collector "
                        "frees (then torch.cuda.empty_cache())")
        raise Wrong("gc-while-error-held", f"with capacity {c} it returned {g}, not {w}: gc.collect() ran, "
                                           f"but "
                    "the failed try's memory stayed in use (it is right when the failed tries hold no "
                    "reference cycles)", "collect after the `except` block has ended: inside it the "
                                         "exception "
                    "(and its traceback, which holds the failed step's tensors) is still alive")
    if any(p.mem.live > 0 for p in plain):
        i = next(i for i, p in enumerate(plain) if p.mem.live > 0)
        raise Wrong("kept-error", f"with capacity {cases[i][0]} the memory of a failed try "
                                  f"({plain[i].mem.live} "
                    "units) was still in use after the search", "do not keep the exception (`last = err`, a "
                    "list of errors): its traceback holds the failed step's tensors")
    plain_got = [p.got for p in plain]
    matched = [(key, what, hint) for key, fn, what, hint in _SIZE_MISTAKES
               if plain_got == [fn(c, lim) for c, lim in cases]]
    if len(matched) == 1:
        key, what, hint = matched[0]
        i = next(i for i, (g, w) in enumerate(zip(plain_got, want)) if g != w)
        raise Wrong(key, f"in every case it returned what {what} returns; capacity {cases[i][0]}, limit "
                    f"{cases[i][1]}: {plain_got[i]!r}, not {want[i]}", hint)
    i = next(i for i, (g, w) in enumerate(zip(plain_got, want)) if g != w)
    c, lim = cases[i]
    raise Wrong("wrong-size", f"with capacity {c} and limit {lim} it returned {plain_got[i]!r}, expected "
                f"{want[i]} (sizes up to {want[i]} fit, larger ones do not)", "double from 1 while it fits "
                "(up to the limit), then bisect; 0 if 1 does not fit")


def _cases(rng: random.Random) -> list[tuple[int, int]]:
    """(capacity, limit): below the limit, at it, above it, nothing fits; limits that are and are not powers
    of two."""
    cases = []
    for _ in range(4):
        limit = rng.randrange(20, 3000)
        cases.append((rng.randrange(2, limit), limit))
    p = 2 ** rng.randrange(5, 11)
    limit = rng.randrange(20, 3000)
    cases += [(limit + rng.randrange(0, 500), limit), (p + rng.randrange(0, 9), p), (limit, limit),
              (0, rng.randrange(1, 100)), (rng.randrange(p // 2 + 1, p), p), (1, rng.randrange(2, 40))]
    rng.shuffle(cases)
    return cases


def _propagates(answer: Callable, kind: type, at: int) -> bool:
    try:
        _search(answer, 10 ** 6, 4096, cycle=False, poison=(at, kind))
    except kind as err:
        return _CUDA_FAULT in str(err) or "simulated" in str(err)
    except Exception as err:  # noqa: BLE001 - re-raised as another error: it propagated, if it is ours
        chain = [err.__cause__, err.__context__]
        return any(isinstance(e, kind) and "simulated" in str(e) for e in chain)
    return False


# --- the contract and the differential search ---------------------------------------------------------------

@dataclass(frozen=True)
class _Case:
    capacity: int
    limit: int

    def __repr__(self) -> str:
        return f"a device where sizes up to {self.capacity} fit, limit {self.limit}"


def _draw_case(rng: random.Random) -> _Case:
    """One case: limits of 1, 2, 3, small, powers of two and one off them, large; capacities of 0, 1, at the
    limit, one under and one over it, at a power of two and one off it, one under the first size the
    bisection after the doubling tries (where an upper bound moved past a failed size skips the answer),
    anywhere."""
    p = 2 ** rng.randint(1, 11)
    limit = rng.choice((1, 2, 3, rng.randint(4, 64), p, p - 1, p + 1, rng.randint(65, 3000)))
    q = 2 ** rng.randint(0, max(0, limit.bit_length() - 1))
    under_mid = (q + min(2 * q, limit)) // 2 - 1
    capacity = rng.choice((0, 1, limit - 1, limit, limit + 1, q, q - 1, q + 1, under_mid, under_mid,
                           rng.randint(0, limit + 5)))
    return _Case(max(0, capacity), limit)


def _shrink(c: _Case) -> list[_Case]:
    out = [_Case(min(c.capacity, lim), lim) for lim in (c.limit - 1, c.limit // 2) if lim >= 1]
    out += [_Case(cap, c.limit) for cap in (c.capacity - 1, c.capacity // 2) if cap >= 0]
    return [x for x in out if x != c]


def _name_case(seen: list[tuple[int, int]], c: _Case, got: Any, want: Any) -> None:
    """A search mistake whose size is the answer's here and the right one on every case it got right."""
    for key, fn, what, hint in _SIZE_MISTAKES:
        if fn(c.capacity, c.limit) == got and all(fn(cap, lim) == _right(cap, lim) for cap, lim in seen):
            raise Wrong(key, f"with capacity {c.capacity} and limit {c.limit} it returned {got!r}, as "
                        f"{what} does; expected {want}", hint)


@contextlib.contextmanager
def _quick_collector() -> Iterator[None]:
    """gc.collect() in a call looks only at the objects made since (milliseconds, not a scan of all of
    torch), and nothing is collected but by the learner's gc.collect(), as in `_search`; an out-of-memory
    error that escapes the answer is named."""
    enabled = gc.isenabled()
    gc.disable()  # only the learner's gc.collect() may free cycles, so the result does not depend on luck
    gc.freeze()  # and it looks at the objects made since: milliseconds, not a scan of all of torch
    try:
        yield
    except torch.cuda.OutOfMemoryError as err:
        if "(simulated)" not in str(err):
            raise
        raise Wrong("oom-not-caught", f"an out-of-memory error escaped your function "
                    f"({str(err).split('. ')[1]})", "catch torch.cuda.OutOfMemoryError around step_fn(n): "
                    "that is how a size that does not fit shows (step_fn returns nothing when it "
                    "fits)") from None
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def task() -> Task:
    """03-largest-batch's function for the contract and the search: a simulated device per call."""
    return Task(reference("03_memory/largest_batch.py", "largest_batch"), draw=_draw_case,
                arguments=lambda c: {"step_fn": _sim_step(_Memory(c.capacity, c.limit), cycle=False),
                                     "limit": c.limit},
                agree=lambda got, want, c: None if got == want else f"it returned {got!r}, expected {want}",
                show=repr, shrink=_shrink, name="largest_batch", result="the size it returned",
                exact_numbers=True, guard=_quick_collector,
                hint="double from 1 while it fits (up to the limit), then bisect between the last size that "
                     "fitted and the first that did not; 0 if 1 does not fit")


def largest_batch(answer: Callable, seed: int) -> str:
    """03-largest-batch: answer(step_fn, limit) -> the largest n <= limit with step_fn(n) fitting."""
    rng = random.Random(seed)
    cases = _cases(rng)
    the_task = task()
    # the contract on a case where a size fails (capacity under the limit; seven of the ten are): state an
    # answer keeps about failed tries (the errors, the sizes) shows on every run, not only on some seeds
    contract(answer, the_task, _Case(*next(c for c in cases if c[0] < c[1])))
    runs = [_search(answer, c, lim, cycle=True) for c, lim in cases]
    for (c, lim), r in zip(cases, runs):
        bad = [n for n in r.mem.calls if not (isinstance(n, int) and 1 <= n <= lim)]
        if bad and 1 not in r.mem.calls and min((n for n in r.mem.calls if isinstance(n, int)),
                                                 default=0) > 1:
            # not a bound overrun but a start past 1: a limit of 1 shows it first (the search names it too)
            raise Wrong("wrong-size", f"with limit {lim} it tried batch size {bad[0]!r} and never 1: the "
                        "search started above 1", "start at 1: a batch of 1 may be all that fits, and the "
                        "limit may be 1")
        if bad:
            raise Wrong("beyond-limit", f"it tried batch size {bad[0]!r} with limit {lim}",
                        "try whole sizes from 1 to the limit only")
    got = [r.got for r in runs]
    if got != [_right(c, lim) for c, lim in cases]:
        _diagnose(answer, cases, got, sum(r.collections for r in runs))
    for (c, lim), r in zip(cases, runs):
        allowed = 2 * math.ceil(math.log2(max(lim, 2))) + 2
        if len(r.mem.calls) > allowed:
            raise Wrong("linear-search", f"{len(r.mem.calls)} tries to find {_right(c, lim)} (limit {lim})",
                        "double, then bisect: about 2·log2(limit) tries, each one a whole training step")
    at = rng.randrange(3, 200)
    runtime_ok, value_ok = _propagates(answer, RuntimeError, at), _propagates(answer, ValueError, at)
    if not runtime_ok:
        caught = "a ValueError propagated, so it catches RuntimeError" if value_ok else "so did a ValueError"
        raise Wrong("swallowed-error", f"a step that failed with a CUDA fault (a RuntimeError that is not "
                    f"out of memory, from batch {at} on) was treated as 'does not fit' ({caught})",
                    "catch torch.cuda.OutOfMemoryError only (it is a RuntimeError, but not every "
                    "RuntimeError "
                    "is out of memory): let every other error propagate")
    if not value_ok:
        raise Wrong("swallowed-error", f"a step that failed with a ValueError (a bug, from batch {at} on) "
                                       f"was "
                    "treated as 'does not fit'", "catch torch.cuda.OutOfMemoryError only; let other errors "
                    "propagate")
    tries = [len(r.mem.calls) for r in runs]
    searched = search(answer, the_task, rng, draws=100, name=functools.partial(_name_case, cases),
                      key="wrong-size")
    return (f"right for {len(cases)} capacities and limits on a simulated device (in {min(tries)} to "
            f"{max(tries)} tries), memory of failed tries released, a CUDA fault (RuntimeError) and a "
            f"ValueError propagated; and as the course's solution on {searched} more (limits from 1, "
            "capacities at, around and off powers of two)")
