"""The checks of lesson 10's exercises (`10_make_it_fit`).

10-model-states: the bytes of weights, gradients and AdamW's state each GPU holds, with no sharding (DDP), the
optimizer state sharded (ZeRO-1) or everything sharded (FSDP2, ZeRO-3).

The learner writes `model_states_per_gpu(parameters, gpus, sharding)` -> {"weights", "gradients",
"optimizer state"} in bytes, for fp32 training with AdamW: 4 bytes a weight, 4 a gradient, 8 of state (two
moments). A sharded part is split over the GPUs, each holding ceil(parameters / gpus) of it (the last shard is
padded to the others' size, as FSDP2 does).

The cases are drawn per check (a seed per run, shown in the line; `seed=` replays a run): twelve named cases
(0.1 B to 70 B parameters, odd, on 1 to 512 GPUs, each sharding), then 300 more of any size on 1 to 1,024 GPUs
held to the reference. The
answer must return a dict of those three keys with whole numbers of bytes, the same for the same call. A
wrong answer is named when it gives what that mistake gives on every case; otherwise the hint says which case
came out wrong and by how much.

10-pick-levers: the learner writes `pick_levers(model_states, per_sequence, batch, gpus, budget)` -> the
first combination of (sharded, checkpointing) in the order none, sharding, checkpointing, both, with the
largest micro-batch that divides each GPU's share of the batch and fits the budget; None when none fits. The
check holds it to the contract, to the course's solution on named cases (each branch, a budget met to the
byte, nothing fitting) and on 300 more draws; where a pick does not fit, its line names the part that does
not.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from course.exercises.contract import Task, contract, reference, search
from course.exercises.core import Wrong

__all__ = ["model_states_per_gpu", "Case", "draw_cases", "expected", "MISTAKES", "PARTS", "SHARDINGS",
           "pick_levers", "Budget", "draw_budgets", "picked", "LEVER_MISTAKES"]

PARTS = ("weights", "gradients", "optimizer state")
BYTES = {"weights": 4, "gradients": 4, "optimizer state": 8}  # fp32 weights and gradients; AdamW's 2 moments
SHARDINGS = ("none", "optimizer", "full")  # DDP; ZeRO-1; FSDP2 (ZeRO-3)
SHARDED = {"none": (), "optimizer": ("optimizer state",), "full": PARTS}


@dataclass(frozen=True)
class Case:
    """One model on one box of GPUs with one sharding."""

    parameters: int
    gpus: int
    sharding: str

    @property
    def args(self) -> tuple[int, int, str]:
        return self.parameters, self.gpus, self.sharding

    def describe(self) -> str:
        return f"{self.parameters:,} parameters on {self.gpus} GPU(s), sharding={self.sharding!r}"


def _states(c: Case, bytes_: dict[str, float], sharded: tuple[str, ...], share: Callable[[int, int], float]
            ) -> dict[str, float]:
    return {p: bytes_[p] * (share(c.parameters, c.gpus) if p in sharded else c.parameters) for p in PARTS}


def expected(c: Case) -> dict[str, int]:
    """The answer: each part's bytes per GPU; a sharded part ceil(parameters / gpus) of it."""
    return {k: int(v) for k, v in _states(c, BYTES, SHARDED[c.sharding], lambda n, g: -(-n // g)).items()}


def _ceil(n: int, g: int) -> int:
    return -(-n // g)


# The mistakes a learner makes, each as what it would return: (key, what it gives, hint).
MISTAKES: tuple[tuple[str, Callable[[Case], dict[str, float]], str], ...] = (
    ("one-moment", lambda c: _states(c, {**BYTES, "optimizer state": 4}, SHARDED[c.sharding], _ceil),
     "AdamW keeps two moments per weight (exp_avg and exp_avg_sq), each fp32: 8 bytes of state, not 4"),
    ("zero1-shards-weights", lambda c: _states(c, BYTES, ("weights", "optimizer state") if c.sharding ==
                                               "optimizer" else SHARDED[c.sharding], _ceil),
     "ZeRO-1 shards the optimizer state only: every GPU still holds all the weights to run its forward"),
    ("zero1-shards-gradients", lambda c: _states(c, BYTES, ("gradients", "optimizer state") if c.sharding ==
                                                 "optimizer" else SHARDED[c.sharding], _ceil),
     "sharding the gradients as well is ZeRO-2; ZeRO-1 (sharding='optimizer') keeps them whole, as DDP's "
     "all-reduce leaves them"),
    ("fsdp-keeps-gradients", lambda c: _states(c, BYTES, ("weights", "optimizer state") if c.sharding ==
                                               "full" else SHARDED[c.sharding], _ceil),
     "FSDP2 reduce-scatters the gradients: each GPU keeps its shard of them, not all of them"),
    ("floor-division", lambda c: _states(c, BYTES, SHARDED[c.sharding], lambda n, g: n // g),
     "parameters // gpus drops the remainder: some GPU holds it. Each shard is ceil(parameters / gpus), "
     "the last one padded"),
    ("fp16-weights", lambda c: _states(c, {**BYTES, "weights": 2, "gradients": 2}, SHARDED[c.sharding],
                                       _ceil),
     "this is fp32 training: 4 bytes a weight and 4 a gradient (mixed precision's 16-bit copies are extra, "
     "not instead)"),
    ("nothing-sharded", lambda c: _states(c, BYTES, (), _ceil),
     "a sharded part is split over the GPUs: divide it by `gpus` (rounded up) where `sharding` says so"),
    ("everything-sharded", lambda c: _states(c, BYTES, PARTS, _ceil),
     "only FSDP2 (sharding='full') shards all three; 'none' is DDP, every GPU holds everything, and "
     "'optimizer' is ZeRO-1"),
)


def draw_cases(seed: int) -> list[Case]:
    """Twelve cases from `seed`: each sharding on one GPU, on a few (a power of two), on a count that is no
    power of two and on many (64 to 512); odd parameter counts from 0.1 B to 70 B, so that a division's
    remainder shows; drawn again until every mistake gives a different answer on at least one case."""
    rng = random.Random(seed)
    for _ in range(1000):
        counts = ([1], [2, 4, 8, 16], [3, 6, 12, 24], [64, 256, 512])  # one, few, no power of two, many
        # `| 1`: an odd count of parameters, which no power of two divides
        cases = [Case(int(10 ** rng.uniform(8, 10.85)) | 1, rng.choice(c), sharding)
                 for sharding in SHARDINGS for c in counts]
        rng.shuffle(cases)
        want = [expected(c) for c in cases]
        if all([fn(c) for c in cases] != want for _, fn, _ in MISTAKES):
            return cases
    raise AssertionError(f"no cases from seed {seed} tell every mistake from the answer")


def _as_bytes(value: object, c: Case) -> dict[str, int]:
    """The answer's dict, held to the contract: the three keys, whole non-negative numbers of bytes."""
    if not isinstance(value, dict):
        raise Wrong("not-a-dict", f"it returned {type(value).__name__} {value!r} for {c.describe()}",
                    f"return a dict with the keys {list(PARTS)}, each part's bytes per GPU")
    if set(value) != set(PARTS):
        raise Wrong("keys", f"its keys are {sorted(map(str, value))} for {c.describe()}",
                    f"return exactly the keys {list(PARTS)}")
    for part, v in value.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or not float(v).is_integer():
            raise Wrong("not-bytes", f"its {part!r} is {v!r} for {c.describe()}", "bytes are whole numbers "
                        ">= 0: a shard is ceil(parameters / gpus) parameters, times their bytes")
    return {k: int(v) for k, v in value.items()}


def _draw_state(rng: random.Random) -> Case:
    gpus = rng.choice([1, 2, 3, 8, 24, 512])
    return Case(int(10 ** rng.uniform(8, 10.85)) | 1, gpus, rng.choice(SHARDINGS))


def _validate_states(value: Any, c: Case) -> None:
    _as_bytes(value, c)


def states_task() -> Task:
    """10-model-states' function for the contract: inputs, hidden state, switches, the result's kind."""
    return Task(reference("10_make_it_fit/model_states_per_gpu.py", "model_states_per_gpu"), draw=_draw_state,
                arguments=lambda c: dict(zip(("parameters", "gpus", "sharding"), c.args)),
                agree=lambda got, want, c: None if got == want else f"it gave {got}, the solution {want}",
                show=Case.describe, name="model_states_per_gpu", result="the dict of bytes",
                validate=_validate_states)


def model_states_per_gpu(answer: Callable[[int, int, str], dict], seed: int) -> str:
    """Check `answer(parameters, gpus, sharding)` on the drawn cases after the contract: the three keys,
    whole bytes, ints not floats, the same answer twice (lesson 10)."""
    cases = draw_cases(seed)
    contract(answer, states_task(), cases[0])
    got, floats = [], []
    for c in cases:
        value = answer(*c.args)
        if isinstance(value, dict):
            floats += [k for k, v in value.items() if isinstance(v, float)]
        got.append(_as_bytes(value, c))
        again = answer(*c.args)
        if not isinstance(again, dict) or _as_bytes(again, c) != got[-1]:
            raise Wrong("hidden-state", f"two calls for {c.describe()} returned {got[-1]} and {again}",
                        "keep no state between calls: the answer depends on the arguments only")
    want = [expected(c) for c in cases]
    if got == want:  # then the reference on many more draws: any count of GPUs, any size
        rng = random.Random(seed + 1)
        more = [Case(rng.randint(1, 10**11), rng.randint(1, 1024), rng.choice(SHARDINGS)) for _ in range(300)]
        for c in more:
            mine, right = _as_bytes(answer(*c.args), c), expected(c)
            if mine != right:
                part = next(p for p in PARTS if mine[p] != right[p])
                raise Wrong("differs", f"for {c.describe()} its {part!r} is {mine[part]:,}, not "
                            f"{right[part]:,} (a case beyond the twelve shown)", "the same rule for every "
                            "size and count of GPUs: a shard is ceil(parameters / gpus)")
        if floats:
            raise Wrong("float", "the numbers are right but some are floats", "bytes are a whole number: "
                        "return ints (integer arithmetic, -(-a // b) rounds up, keeps them exact)")
        big = next(c for c in cases if c.sharding == "full")
        return (f"the bytes each GPU holds on {len(cases)} cases (e.g. {big.parameters / 1e9:.1f} B on "
                f"{big.gpus} GPU(s), FSDP2: {sum(expected(big).values()) / 1e9:.2f} GB)")
    for key, mistake, hint in MISTAKES:
        if got == [{k: int(v) for k, v in mistake(c).items()} for c in cases]:
            i = next(i for i, c in enumerate(cases) if got[i] != want[i])
            raise Wrong(key, f"for {cases[i].describe()} it gives {got[i]}, not {want[i]}", hint)
    i = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
    part = next(p for p in PARTS if got[i][p] != want[i][p])
    raise Wrong("differs", f"for {cases[i].describe()} its {part!r} is {got[i][part]:,}, not "
                f"{want[i][part]:,} (case {i + 1} of {len(cases)})",
                "4 bytes a weight, 4 a gradient, 8 of AdamW's state; 'optimizer' shards the state, 'full' "
                "all three; a shard is ceil(parameters / gpus)")


# --- 10-pick-levers: the cheapest levers that fit a budget ------------------------------------------------

MIB = 2**20
# (sharded, checkpointing), cheapest first
ORDER = ((False, False), (True, False), (False, True), (True, True))


@dataclass(frozen=True)
class Budget:
    """One step to fit: the model states (bytes, whole model), one sequence's activations plain and
    checkpointed, the global batch, the data-parallel GPUs and each GPU's budget (bytes)."""

    model_states: int
    plain: int
    checkpointed: int
    batch: int
    gpus: int
    budget: int

    @property
    def args(self) -> tuple[int, dict[str, int], int, int, int]:
        return self.model_states, {"plain": self.plain, "checkpointed": self.checkpointed}, self.batch, \
            self.gpus, self.budget

    def describe(self) -> str:
        return (f"model states {self.model_states / MIB:,.0f} MiB, activations {self.plain / MIB:,.0f} MiB a "
                f"sequence ({self.checkpointed / MIB:,.0f} checkpointed), batch {self.batch} on {self.gpus} "
                f"GPU(s), budget {self.budget / MIB:,.0f} MiB")


def _pick(c: Budget, order: tuple[tuple[bool, bool], ...] = ORDER, per_gpu: int | None = None,
          divides: bool = True, fits: Callable[[float, float], bool] = lambda need, room: need <= room,
          divided: bool = True, micro_of: Callable[[int, list[int]], int] | None = None,
          activations_of: Callable[[int, int], int] | None = None) -> dict | None:
    """The rule, with each of its parts replaceable (the mistakes below change one each)."""
    per_gpu = c.batch // c.gpus if per_gpu is None else per_gpu
    for sharded, checkpointing in order:
        held = c.model_states / c.gpus if sharded and divided else c.model_states
        act = c.checkpointed if checkpointing else c.plain
        ok = [m for m in range(per_gpu, 0, -1) if (not divides or per_gpu % m == 0)
              and fits(held + (activations_of(m, per_gpu) if activations_of else m) * act, c.budget)]
        if ok:
            micro = micro_of(per_gpu, ok) if micro_of else ok[0]
            return {"sharded": sharded, "checkpointing": checkpointing, "micro_batch": micro}
    return None


def picked(c: Budget) -> dict | None:
    """The answer (the course's solution's rule)."""
    return _pick(c)


def _holds(c: Budget, pick: dict) -> tuple[float, int]:
    """(model states, activations) one GPU holds with `pick`."""
    states = c.model_states / c.gpus if pick["sharded"] else c.model_states
    return states, pick["micro_batch"] * (c.checkpointed if pick["checkpointing"] else c.plain)


def _levers(pick: dict | None) -> str:
    if pick is None:
        return "nothing"
    pulled = [w for w, on in (("sharded", pick["sharded"]), ("checkpointing", pick["checkpointing"])) if on]
    return f"micro-batch {pick['micro_batch']}" + "".join(f" + {w}" for w in pulled)


def _what(c: Budget, got: dict | None, want: dict | None) -> str:
    """What differs, in the lesson's words: a pick that does not fit names the part that does not."""
    if got is not None:
        states, acts = _holds(c, got)
        if states + acts > c.budget:
            part = (f"the model states alone ({states / MIB:,.0f} MiB) exceed it" if states > c.budget else
                    f"the activations of {got['micro_batch']} sequence(s) ({acts / MIB:,.0f} MiB) do not fit "
                    f"in the {(c.budget - states) / MIB:,.0f} MiB the model states leave")
            return (f"with {_levers(got)} one GPU holds {(states + acts) / MIB:,.0f} MiB, over the budget of "
                    f"{c.budget / MIB:,.0f}: {part}")
    if want is None:
        return f"it picks {_levers(got)}, which fits, where the solution finds nothing"
    if got is None:
        states, acts = _holds(c, want)
        return (f"it finds nothing that fits, but {_levers(want)} does ({(states + acts) / MIB:,.0f} MiB of "
                f"{c.budget / MIB:,.0f})")
    return f"it picks {_levers(got)}, which fits, where the first in the order is {_levers(want)}"


# The mistakes a learner makes, each as the pick it would return: (key, what it gives, hint).
LEVER_MISTAKES: tuple[tuple[str, Callable[[Budget], dict | None], str], ...] = (
    ("not-a-divisor", lambda c: _pick(c, divides=False),
     "the micro-batch must divide each GPU's share of the batch (batch // gpus): accumulation runs a whole "
     "number of micro-batches per step"),
    ("whole-batch-per-gpu", lambda c: _pick(c, per_gpu=c.batch),
     "data parallelism splits the batch: each GPU runs batch // gpus sequences per step, not the whole "
     "batch"),
    ("checkpointing-before-sharding", lambda c: _pick(c, order=(ORDER[0], ORDER[2], ORDER[1], ORDER[3])),
     "the order is none, sharding, checkpointing, both: try sharding before checkpointing (a recompute costs "
     "a third more compute; sharding's traffic overlaps)"),
    ("smallest-micro-batch", lambda c: _pick(c, micro_of=lambda per_gpu, ok: ok[0] if ok[0] == per_gpu
                                             else ok[-1]),
     "take the largest micro-batch that fits, not 1: each extra pass costs time, and a larger one still "
     "fits"),
    ("sharding-not-divided", lambda c: _pick(c, divided=False),
     "sharded, each GPU holds model_states / gpus: FSDP2 splits weights, gradients and optimizer state"),
    ("strict-budget", lambda c: _pick(c, fits=lambda need, room: need < room),
     "a step that needs exactly the budget fits: compare with <=, not <"),
    ("no-checkpointing", lambda c: _pick(c, order=ORDER[:2]),
     "when nothing fits without it, try checkpointing: it cuts each sequence's activations to "
     "per_sequence['checkpointed']"),
    ("always-shard", lambda c: _pick(c, order=ORDER[1::2] if c.gpus > 1 else ORDER[::2]),
     "shard only when the model states do not fit otherwise: on several GPUs, plain data parallelism comes "
     "first (no gathers)"),
    ("model-states-forgotten", lambda c: _pick(dataclasses.replace(c, model_states=0)),
     "the model states stay on the GPU through the step: a micro-batch fits in what they leave of the "
     "budget"),
    ("accumulation-saves-nothing", lambda c: _pick(c, activations_of=lambda m, per_gpu: per_gpu),
     "a micro-batch of m sequences keeps m sequences' activations: accumulation is what cuts them"),
)


def _draw_one(rng: random.Random) -> Budget:
    """One case: a GPU's budget set by a target combination (or below all of them), often to the byte: sizes
    in MiB, model states divisible by every GPU count, so that every way of writing the rule is exact."""
    gpus = rng.choice((1, 1, 2, 4, 8))
    per_gpu = rng.choice((1, 2, 3, 4, 6, 8, 12, 16, 24))
    plain = rng.randint(8, 2048) * MIB
    checkpointed = max(MIB, plain // rng.randint(3, 12) // MIB * MIB)
    states = rng.randint(1, 2000) * 8 * MIB
    sharded, checkpointing = rng.choice(ORDER)
    held = states // gpus if sharded else states
    micro = rng.choice([m for m in range(1, per_gpu + 1) if per_gpu % m == 0])
    need = held + micro * (checkpointed if checkpointing else plain)
    kind = rng.random()
    if kind < 0.4:
        budget = need  # to the byte
    elif kind < 0.5:
        budget = need - MIB  # a MiB short of it
    elif kind < 0.6:
        budget = rng.randint(1, max(1, held // MIB)) * MIB  # at most the model states: little fits
    else:
        budget = need + rng.randint(0, plain // MIB) * MIB
    return Budget(states, plain, checkpointed, per_gpu * gpus, gpus, max(budget, MIB))


def draw_budgets(seed: int) -> list[Budget]:
    """Ten cases from `seed`, drawn again until every mistake gives another pick than the answer on one."""
    rng = random.Random(seed)
    for _ in range(1000):
        cases = [_draw_one(rng) for _ in range(10)]
        want = [picked(c) for c in cases]
        kinds = {None if w is None else (w["sharded"], w["checkpointing"]) for w in want}
        outputs = [want] + [[fn(c) for c in cases] for _, fn, _ in LEVER_MISTAKES]
        # every mistake gives another pick than the answer, and than every other mistake, on some case
        if len(kinds) >= 4 and all(a != b for i, a in enumerate(outputs) for b in outputs[i + 1:]):
            return cases
    raise AssertionError(f"no cases from seed {seed} tell every mistake from the answer")


_KEYS = ("sharded", "checkpointing", "micro_batch")
_NOTHING = object()  # the solution's None, for the contract's kind check (which reads None as "returns None")


def _validate(value: Any, c: Budget) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or set(value) != set(_KEYS):
        raise Wrong("not-a-pick", f"it returned {value!r} for {c.describe()}", "return a dict with the keys "
                    f"{list(_KEYS)}, or None when nothing fits")
    if not all(isinstance(value[k], bool) for k in _KEYS[:2]) or isinstance(value["micro_batch"], bool) \
            or not isinstance(value["micro_batch"], int) or value["micro_batch"] < 1:
        raise Wrong("not-a-pick", f"it returned {value!r} for {c.describe()}", "'sharded' and "
                    "'checkpointing' are True or False, 'micro_batch' a whole number of sequences >= 1")


def _shrink(c: Budget) -> list[Budget]:
    smaller = [p for p in (1, 2, c.batch // c.gpus // 2) if p < c.batch // c.gpus]
    return [Budget(c.model_states, c.plain, c.checkpointed, p * c.gpus, c.gpus, c.budget) for p in smaller]


def _name_lever_case(answer: Callable[..., Any], seen: list[Budget], c: Budget, got: Any, want: Any) -> None:
    """A known mistake that gives the answer's pick on this case, the right one on every named case, and the
    answer's on 40 more draws."""
    for key, mistake, hint in LEVER_MISTAKES:
        if mistake(c) == got and all(mistake(s) == picked(s) for s in seen) and _same_beyond(answer, mistake):
            raise Wrong(key, _what(c, got, want) + f" (on {c.describe()})", hint)


def _same_beyond(answer: Callable[..., Any], mistake: Callable[[Budget], dict | None]) -> bool:
    """Whether the answer gives what `mistake` gives on 40 draws beyond the named cases (so that a mistake is
    named only when it is the answer's, not when it coincides on a few cases)."""
    return all(mistake(m) == answer(*m.args) for m in (_draw_one(random.Random(i)) for i in range(40)))


def lever_task() -> Task:
    """10-pick-levers' function for the contract and the search."""
    solution = reference("10_make_it_fit/pick_levers.py", "pick_levers")

    def solved(*args: Any) -> Any:
        out = solution(*args)
        return _NOTHING if out is None else out

    return Task(solved, draw=_draw_one,
                arguments=lambda c: dict(zip(("model_states", "per_sequence", "batch", "gpus", "budget"),
                                             c.args)),
                agree=lambda got, want, c: None if got == want else _what(c, got, want),
                observe=lambda returned, arguments: None if returned is _NOTHING else returned,
                show=Budget.describe, shrink=_shrink, name="pick_levers", result="the pick",
                validate=_validate, hint="in the order none, sharding, checkpointing, both: the largest "
                "micro-batch dividing batch // gpus whose model states (/ gpus when sharded) + micro-batch x "
                "activations fit the budget")


def pick_levers(answer: Callable[..., Any], seed: int) -> str:
    """Check `answer(model_states, per_sequence, batch, gpus, budget)` on the drawn cases (lesson 10)."""
    cases = draw_budgets(seed)
    the_task = lever_task()
    contract(answer, the_task, cases[0])
    got = []
    for c in cases:
        value = answer(*c.args)
        _validate(value, c)
        got.append(value)
    want = [picked(c) for c in cases]
    if got == want:
        searched = search(answer, the_task, random.Random(seed + 1), draws=300,
                          name=functools.partial(_name_lever_case, answer, cases))
        kinds = sorted({_levers(w).split(" + ", 1)[1] if w and " + " in _levers(w) else
                        ("nothing fits" if w is None else "accumulation alone") for w in want})
        return (f"the first levers that fit on {len(cases)} cases ({', '.join(kinds)}), and as the course's "
                f"solution on {searched} more")
    for key, mistake, hint in LEVER_MISTAKES:
        if got == [mistake(c) for c in cases] and _same_beyond(answer, mistake):
            i = next(i for i, c in enumerate(cases) if got[i] != want[i])
            raise Wrong(key, _what(cases[i], got[i], want[i]) + f" (on {cases[i].describe()})", hint)
    i = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
    raise Wrong("differs", _what(cases[i], got[i], want[i]) + f" (on {cases[i].describe()}; case {i + 1} of "
                f"{len(cases)})", "in the order none, sharding, checkpointing, both: the largest micro-batch "
                "dividing batch // gpus whose model states (/ gpus when sharded) + micro-batch x activations "
                "fit the budget; None when none does")
