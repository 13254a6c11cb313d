"""The check of exercise 03-largest-batch (lesson 03, `03_memory`): the largest batch that fits, searched
on a simulated device whose failed tries keep their memory in reference cycles until the garbage
collector frees them; doubling then bisecting, memory released, other errors propagated.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from typing import Any

import torch

from helpers.exercises.core import Wrong

__all__ = ["largest_batch"]


class _Memory:
    """A simulated device: `capacity` units; a try uses n units until the tensors of that try are freed."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.live, self.calls = capacity, 0, []


class _Block:
    """The tensors of one try. `cycle`: they sit in a reference cycle, as a failed step's often do, so only
    the garbage collector frees them once nothing else holds them."""

    def __init__(self, mem: _Memory, n: int, cycle: bool) -> None:
        self.mem, self.n = mem, n
        self.me = self if cycle else None
        mem.live += n

    def __del__(self) -> None:
        self.mem.live -= self.n


def _sim_step(mem: _Memory, cycle: bool, poison: int | None = None) -> Callable[[int], None]:
    def step(n: int) -> None:  # a training step on a batch of n, on the simulated device
        mem.calls.append(n)
        if poison is not None and n >= poison:
            raise ValueError("simulated: a bug in the step itself, not an out-of-memory error")
        block = _Block(mem, n, cycle)
        if mem.live > mem.capacity:
            raise torch.cuda.OutOfMemoryError(f"simulated: tried to allocate {n} units; {mem.live - n} in "
                                              f"use, capacity {mem.capacity}")
        block.me = None  # a step that finished frees its tensors

    return step


def _search(answer: Callable, capacity: int, limit: int, cycle: bool,
            poison: int | None = None) -> tuple[Any, _Memory]:
    mem = _Memory(capacity)
    enabled = gc.isenabled()
    gc.disable()  # only the learner's gc.collect() may free cycles, so the result does not depend on luck
    gc.freeze()  # and it looks at the objects made since: milliseconds, not a scan of all of torch
    try:
        got = answer(_sim_step(mem, cycle, poison), limit)
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()
    return got, mem


def _diagnose_search(answer: Callable, capacity: int, limit: int, got: Any, want: int) -> None:
    got_plain, mem_plain = _search(answer, capacity, limit, cycle=False)
    if got_plain == want:
        raise Wrong("no-gc", f"with capacity {capacity} it returned {got}, not {want}: after the first "
                    "failure every try failed, the failed try's memory was never released",
                    "after an out-of-memory error, run gc.collect(): the failed step's tensors sit in "
                    "reference cycles that only the garbage collector frees (then torch.cuda.empty_cache())")
    if mem_plain.live > 0 or (isinstance(got_plain, int) and got_plain < want and mem_plain.calls
                              and max(mem_plain.calls) <= want):
        raise Wrong("kept-error", f"with capacity {capacity} it returned {got_plain}, not {want}: the "
                    "memory of a failed try stayed in use", "do not keep the exception (`last = err`, a "
                    "list of errors): its traceback holds the failed step's tensors")
    power = 2 ** int(math.log2(want)) if want >= 1 else 0
    if got_plain == power and power != want:
        raise Wrong("no-bisect", f"with capacity {capacity} it returned {got_plain}, not {want}",
                    "after the first failure, bisect between the last size that fitted and the first that "
                    "did not")
    if got_plain == want + 1:
        raise Wrong("off-by-one", f"with capacity {capacity} it returned {got_plain}, which does not fit",
                    "return the largest size that fitted, not the first that failed")
    raise Wrong("wrong-size", f"with capacity {capacity} and limit {limit} it returned {got_plain!r}, "
                f"expected {want}", "double from 1 while it fits (up to the limit), then bisect; 0 if 1 "
                "fails")


def largest_batch(answer: Callable) -> str:
    """03-largest-batch: answer(step_fn, limit) -> the largest n <= limit with step_fn(n) fitting."""
    tries = []
    for capacity, limit in ((37, 256), (300, 256), (0, 64), (64, 64), (1, 10), (1000, 1000)):
        got, mem = _search(answer, capacity, limit, cycle=True)
        bad = [n for n in mem.calls if not 1 <= n <= limit]
        if bad:
            raise Wrong("beyond-limit", f"it tried batch size {bad[0]} with limit {limit}",
                        "try sizes from 1 to the limit only")
        want = min(capacity, limit)
        if got != want:
            _diagnose_search(answer, capacity, limit, got, want)
        allowed = 2 * math.ceil(math.log2(limit)) + 2
        if len(mem.calls) > allowed:
            raise Wrong("linear-search", f"{len(mem.calls)} tries to find {want} (limit {limit})",
                        "double, then bisect: about 2·log2(limit) tries, each one a whole training step")
        tries.append(len(mem.calls))
    try:  # a step that fails for another reason than memory: its error must propagate
        _search(answer, 100, 64, cycle=False, poison=3)
    except ValueError:
        pass
    else:
        raise Wrong("swallowed-error", "a step that failed with a ValueError (a bug, not out of memory) was "
                    "treated as 'does not fit'", "catch torch.cuda.OutOfMemoryError only; let other errors "
                    "propagate")
    return (f"right for six capacities and limits on a simulated device (in {min(tries)} to {max(tries)} "
            "tries), memory of failed tries released, other errors propagated")
