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

import inspect
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from course.exercises.core import Wrong
from helpers.measure.gpus import GPUS

__all__ = ["largest_batch_from", "Case", "draw_cases", "expected", "MISTAKES"]

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


def _margin_of_the_room(c: Case) -> int:
    return max(0, math.floor((c.memory_bytes - c.fixed) * (1 - c.margin) / c.per_sample))


MISTAKES: tuple[tuple[str, Callable[[Case], int], str], ...] = (
    ("no-margin", _no_margin, "the memory is not all yours: leave the margin free, usable = memory_bytes × "
     "(1 − margin) (the CUDA context, the allocator's rounding and workspaces live there)"),
    ("no-fixed-part", _all_per_sample, "the weights, their gradients and AdamW's two moments do not grow "
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
    drawn again until every mistake gives a different answer on at least one case."""
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
        want = [expected(c) for c in cases]
        if all([fn(c) for c in cases] != want for _, fn, _ in MISTAKES) and any(want):
            return cases
    raise AssertionError(f"no cases from seed {seed} tell every mistake from the answer: one of MISTAKES "
                         "gives the answer itself")


_SEARCHES = {"helpers.plan.planner": ("plan",), "helpers.plan.batch_search": ("largest_batch",),
             "helpers.measure.memory": ("find_max_batch_size",)}


def _course_searches(answer: Callable[..., int]) -> list[str]:
    """The course's own searches the answer's code names (helpers.plan.batch_search.largest_batch, ...)."""
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


def largest_batch_from(answer: Callable[..., int], seed: int) -> str:
    """Check `answer(batch, peak_at_batch, peak_at_double, memory_bytes, margin)` on the drawn cases
    (lesson 09)."""
    used = _course_searches(answer)
    if used:
        raise Wrong("course-function", f"it calls the course's own search ({', '.join(used)})", "write the "
                    "arithmetic yourself: two dry runs give a line, and the line gives the batch")
    cases = draw_cases(seed)
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
        return f"the largest batch from two dry runs on {len(cases)} cases ({shown})"
    for key, mistake, hint in MISTAKES:
        if got == [mistake(c) for c in cases]:
            wrong = next(i for i, c in enumerate(cases) if got[i] != want[i])
            raise Wrong(key, f"for {cases[wrong].describe()} it gives {got[wrong]}, not {want[wrong]}", hint)
    i = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
    raise Wrong("differs", f"for {cases[i].describe()} it gives {got[i]}, not {want[i]} (case {i + 1} of "
                f"{len(cases)})", "per sample = (peak_at_double − peak_at_batch) / batch; fixed = "
                "peak_at_batch − batch × per sample; the largest batch fills memory_bytes × (1 − margin), "
                "rounded down, never below 0")
