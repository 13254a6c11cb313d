"""The check of exercise 09-largest-batch (lesson 09, `09_plan_your_run`): predict the largest batch that fits
a GPU from two dry runs, before the planner searches it.

The learner writes `largest_batch_from(batch, peak_at_batch, peak_at_double, memory_bytes, margin)`: a step's
peak grows by the same bytes per sample, so two dry runs (at `batch` and at `2 * batch`) give the bytes per
sample, (peak_at_double - peak_at_batch) / batch, and the part that does not grow with the batch (weights,
gradients, AdamW's state), peak_at_batch - batch * per_sample. The largest batch is the whole number of
samples that fits the memory less the margin: floor((memory_bytes * (1 - margin) - fixed) / per_sample), and
0 when not even the fixed part fits.

The cases are drawn per check (a seed per run, shown in the line; `seed=` replays a run): a GPU class's memory
as torch reports it (helpers.measure.gpus), a model's fixed bytes, the bytes per sample, the batch of the
first dry
run, and the margin; one case where nothing fits. A wrong answer is named only when it gives what that mistake
gives on every case; otherwise the hint says which case came out wrong and by how much.
"""

from __future__ import annotations

import functools
import inspect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from course.exercises.contract import Task, contract, reference, search
from course.exercises.core import Wrong
from helpers.measure.gpus import GPUS

__all__ = ["largest_batch_from", "Case", "draw_cases", "expected", "MISTAKES", "task"]

GB = 1e9


@dataclass(frozen=True)
class Case:
    """Two dry runs of one step and the GPU it should fit."""

    gpu: str
    batch: int
    fixed: int  # bytes that do not grow with the batch
    per_sample: int  # bytes each sample adds
    memory_bytes: int
    margin: float

    @property
    def peak_at_batch(self) -> int:
        return self.fixed + self.batch * self.per_sample

    @property
    def peak_at_double(self) -> int:
        return self.fixed + 2 * self.batch * self.per_sample

    @property
    def args(self) -> tuple:
        return self.batch, self.peak_at_batch, self.peak_at_double, self.memory_bytes, self.margin

    def describe(self) -> str:
        return (f"{self.gpu} ({self.memory_bytes / GB:.1f} GB), peaks {self.peak_at_batch / GB:.2f} GB at "
                f"batch {self.batch} and {self.peak_at_double / GB:.2f} GB at {2 * self.batch}, margin "
                f"{self.margin}")


def expected(c: Case) -> int:
    """The answer: the whole samples that fit the memory less the margin, next to the fixed part."""
    room = c.memory_bytes * (1 - c.margin) - c.fixed
    return max(0, math.floor(room / c.per_sample))


# The mistakes a learner makes, each as what it would return: (key, what it gives, hint).
def _no_margin(c: Case) -> int:
    return max(0, math.floor((c.memory_bytes - c.fixed) / c.per_sample))


def _all_per_sample(c: Case) -> int:
    return max(0, math.floor(c.memory_bytes * (1 - c.margin) / (c.peak_at_batch / c.batch)))


def _per_double(c: Case) -> int:
    per = (c.peak_at_double - c.peak_at_batch) / (2 * c.batch)
    fixed = c.peak_at_batch - c.batch * per
    return max(0, math.floor((c.memory_bytes * (1 - c.margin) - fixed) / per))


def _rounded_up(c: Case) -> int:
    return max(0, math.ceil((c.memory_bytes * (1 - c.margin) - c.fixed) / c.per_sample))


def _rounded(c: Case) -> int:
    return max(0, round((c.memory_bytes * (1 - c.margin) - c.fixed) / c.per_sample))


def _negative(c: Case) -> int:
    return math.floor((c.memory_bytes * (1 - c.margin) - c.fixed) / c.per_sample)


def _per_double_peak(c: Case) -> int:
    return max(0, math.floor(c.memory_bytes * (1 - c.margin) / (c.peak_at_double / (2 * c.batch))))


def _margin_of_the_room(c: Case) -> int:
    return max(0, math.floor((c.memory_bytes - c.fixed) * (1 - c.margin) / c.per_sample))


MISTAKES: tuple[tuple[str, Callable[[Case], int], str], ...] = (
    ("no-margin", _no_margin, "the memory is not all yours: leave the margin free, usable = memory_bytes × "
     "(1 − margin) (the CUDA context, the allocator's rounding and workspaces live there)"),
    ("no-fixed-part", _all_per_sample, "the weights, their gradients and AdamW's two moments do not grow "
     "with the batch: the bytes per sample are the difference of the two dry runs over the samples added, "
     "(peak_at_double − peak_at_batch) / batch, and the rest of the first peak is fixed"),
    ("no-fixed-part", _per_double_peak, "the weights, their gradients and AdamW's two moments do not grow "
     "with the batch: the bytes per sample are the difference of the two dry runs over the samples added, "
     "(peak_at_double − peak_at_batch) / batch, and the rest of the first peak is fixed"),
    ("per-sample-over-double", _per_double, "the second dry run adds `batch` samples to the first, not "
     "2 × batch: per sample = (peak_at_double − peak_at_batch) / batch"),
    ("rounded-up", _rounded_up, "a batch that needs more bytes than there are does not fit: round the "
     "number of samples down (math.floor), not up"),
    ("rounded-to-nearest", _rounded, "a batch that needs more bytes than there are does not fit: round the "
     "number of samples down (math.floor), not to the nearest"),
    ("negative", _negative, "when not even the fixed part fits, no batch does: return 0, not a negative "
     "number"),
    ("margin-of-the-room", _margin_of_the_room, "the margin is a share of the GPU's whole memory, kept "
     "free: take it off memory_bytes first, then the fixed part, not off what the fixed part leaves"),
)


def draw_cases(seed: int) -> list[Case]:
    """Six cases from `seed`: five that fit some batch, on different GPU classes, and one where nothing fits;
    drawn again until the answer and every mistake differ from each other on at least one case."""
    rng = random.Random(seed)
    keys = [k for k in GPUS if GPUS[k].count == 1]
    for _ in range(1000):
        cases = []
        for gpu in rng.sample(keys, 5):
            memory = GPUS[gpu].total_memory
            fixed = int(memory * rng.uniform(0.05, 0.45))  # weights, gradients, AdamW: a fair share of it
            per = int(memory * rng.uniform(0.004, 0.05))  # a sample's activations
            margin = rng.choice([0.1, 0.15, 0.2])
            cases.append(Case(gpu, rng.choice([2, 4, 8, 16]), fixed, per, memory, margin))
        gpu = rng.choice(keys)
        memory = GPUS[gpu].total_memory
        cases.append(Case(gpu, rng.choice([4, 8]), int(memory * rng.uniform(0.9, 1.3)),
                          int(memory * rng.uniform(0.01, 0.03)), memory, 0.15))  # nothing fits
        outputs = [[expected(c) for c in cases]] + [[fn(c) for c in cases] for _, fn, _ in MISTAKES]
        names = ["right"] + [key for key, _, _ in MISTAKES]
        apart = all(outputs[i] != outputs[j] for i in range(len(names)) for j in range(i + 1, len(names))
                    if names[i] != names[j])
        if apart and any(outputs[0]):
            return cases
    raise AssertionError(f"no cases from seed {seed} tell every mistake from the answer: one of MISTAKES "
                         "gives the answer itself")


_SEARCHES = {"helpers.plan.planner": ("plan",), "helpers.plan.batch_search": ("predict_max_batch_size",),
             "helpers.measure.memory": ("find_max_batch_size",)}


def _course_searches(answer: Callable[..., int]) -> list[str]:
    """The course's own searches the answer's code names (`_SEARCHES`: plan, predict_max_batch_size, ...)."""
    fn = inspect.unwrap(answer)
    code, names = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    if code is None:
        return []
    found = []
    for name in code.co_names:
        obj = names.get(name)
        module = getattr(obj, "__name__", "") if inspect.ismodule(obj) else getattr(obj, "__module__", "")
        named = inspect.ismodule(obj) or getattr(obj, "__name__", "") in _SEARCHES.get(module, ())
        if module in _SEARCHES and named:
            found.append(f"{module}.{getattr(obj, '__name__', name)}")
    return found


# --- the contract and the differential search ---------------------------------------------------------------

def _early_zero(c: Case) -> int:
    return 0 if c.peak_at_batch > c.memory_bytes * (1 - c.margin) else expected(c)


# mistakes only the search's regions show (a case the six drawn ones may lack): named there
SEARCH_MISTAKES = MISTAKES + (
    ("early-zero", _early_zero, "a first dry run that does not fit says nothing about smaller batches: "
     "compute the line and take the largest batch it allows, even below the dry run's"),
)


def _draw_one(rng: random.Random) -> Case:
    """One case for the search: ordinary ones; ones where the room is a whole number of samples exactly (a
    margin of 1/8 or 1/4 of a memory divisible by 16, so that every way of writing the rule computes it
    exactly, and rounding is all that differs); ones whose first dry run does not fit while a smaller batch
    does; ones where the fixed part fills the memory to the byte, or more."""
    gpu = rng.choice([k for k in GPUS if GPUS[k].count == 1])
    memory = GPUS[gpu].total_memory // 16 * 16
    per = int(memory * rng.uniform(0.002, 0.05))
    batch = rng.choice((1, 2, 3, 4, 8, 16, 32, 64))
    kind = rng.random()
    margin = rng.choice((0.125, 0.25, 0.0625)) if kind < 0.6 else rng.choice((0.05, 0.1, 0.15, 0.2))
    usable = int(memory * (1 - margin)) if kind < 0.6 else math.floor(memory * (1 - margin))
    if kind < 0.3:  # the room is k samples exactly
        fixed = usable - rng.randint(1, 60) * per
    elif kind < 0.45:  # the dry run's batch does not fit; a smaller one does
        k = rng.randint(1, max(1, batch - 1))
        fixed = usable - k * per - rng.randint(0, per - 1)
        batch = max(batch, k + 1)
    elif kind < 0.55:  # the fixed part is all of the room, or more
        fixed = usable + rng.choice((0, 1, per))
    else:
        fixed = int(memory * rng.uniform(0.02, 0.6))
    return Case(gpu, batch, max(fixed, 0), per, memory, margin)


def _shrink(c: Case) -> list[Case]:
    smaller = [b for b in (1, 2, c.batch // 2) if b < c.batch]
    return [Case(c.gpu, b, c.fixed, c.per_sample, c.memory_bytes, c.margin) for b in smaller]


def _validate(value: Any, c: Case) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Wrong("not-a-number", f"it returned {type(value).__name__} {value!r} for {c.describe()}",
                    "return the largest batch as a whole number of samples")


def _name_case(answer: Callable[..., int], seen: list[Case], c: Case, got: Any, want: Any) -> None:
    """A known mistake that gives the answer's number on this case, the right one on every case before, and
    the answer's on 40 more cases of the search's regions."""
    more = [_draw_one(random.Random(i)) for i in range(40)]
    for key, mistake, hint in SEARCH_MISTAKES:
        if mistake(c) == got and all(mistake(s) == expected(s) for s in seen) \
                and all(mistake(m) == answer(*m.args) for m in more):
            raise Wrong(key, f"for {c.describe()} it gives {got}, not {want}", hint)


def task() -> Task:
    """09-largest-batch's function for the contract and the search."""
    return Task(reference("09_plan_your_run/largest_batch_from.py", "largest_batch_from"), draw=_draw_one,
                arguments=lambda c: dict(zip(("batch", "peak_at_batch", "peak_at_double", "memory_bytes",
                                              "margin"), c.args)),
                agree=lambda got, want, c: None if got == want and type(got) is int else
                f"it gives {got!r}, the solution {want}",
                show=lambda c: c.describe() + f" (fixed {c.fixed:,} bytes, {c.per_sample:,} per sample)",
                shrink=_shrink, name="largest_batch_from", result="the batch it returned", validate=_validate,
                hint="per sample = (peak_at_double − peak_at_batch) / batch; fixed = peak_at_batch − batch × "
                     "per sample; the largest batch fills memory_bytes × (1 − margin), rounded down, never "
                     "below 0")


def largest_batch_from(answer: Callable[..., int], seed: int) -> str:
    """Check `answer(batch, peak_at_batch, peak_at_double, memory_bytes, margin)` on the drawn cases
    (lesson 09)."""
    used = _course_searches(answer)
    if used:
        raise Wrong("course-function", f"it calls the course's own search ({', '.join(used)})", "write the "
                    "arithmetic yourself: two dry runs give a line, and the line gives the batch")
    cases = draw_cases(seed)
    the_task = task()
    contract(answer, the_task, cases[0])
    got = []
    for c in cases:
        value = answer(*c.args)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Wrong("not-a-number", f"it returned {type(value).__name__} {value!r} for {c.describe()}",
                        "return the largest batch as a whole number of samples")
        got.append(value)
    want = [expected(c) for c in cases]
    if got == want and all(isinstance(v, int) or float(v).is_integer() for v in got):
        if not all(isinstance(v, int) for v in got):
            raise Wrong("float", "the numbers are right but they are floats", "a batch is a whole number of "
                        "samples: return an int (math.floor gives one)")
        shown = "; ".join(f"{c.gpu}: {w}" for c, w in zip(cases, want))
        searched = search(answer, the_task, random.Random(seed + 1), draws=300,
                          name=functools.partial(_name_case, answer, cases))
        return (f"the largest batch from two dry runs on {len(cases)} cases ({shown}), and as the course's "
                f"solution on {searched} more (rooms of a whole number of samples, first dry runs that do "
                "not fit, fixed parts that fill the memory)")
    for key, mistake, hint in SEARCH_MISTAKES:
        if got == [mistake(c) for c in cases]:
            wrong = next(i for i, c in enumerate(cases) if got[i] != want[i])
            raise Wrong(key, f"for {cases[wrong].describe()} it gives {got[wrong]}, not {want[wrong]}", hint)
    i = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
    raise Wrong("differs", f"for {cases[i].describe()} it gives {got[i]}, not {want[i]} (case {i + 1} of "
                f"{len(cases)})", "per sample = (peak_at_double − peak_at_batch) / batch; fixed = "
                "peak_at_batch − batch × per sample; the largest batch fills memory_bytes × (1 − margin), "
                "rounded down, never below 0")
