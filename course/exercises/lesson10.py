"""The check of exercise 10-model-states (lesson 10, `10_make_it_fit`): the bytes of weights, gradients and
AdamW's state each GPU holds, with no sharding (DDP), the optimizer state sharded (ZeRO-1) or everything
sharded (FSDP2, ZeRO-3).

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
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from course.exercises.core import Wrong

__all__ = ["model_states_per_gpu", "Case", "draw_cases", "expected", "MISTAKES", "PARTS", "SHARDINGS"]

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


def model_states_per_gpu(answer: Callable[[int, int, str], dict], seed: int) -> str:
    """Check `answer(parameters, gpus, sharding)` on the drawn cases and on each call's contract: the three
    keys, whole bytes, ints not floats, the same answer twice (lesson 10)."""
    cases = draw_cases(seed)
    got, floats = [], []
    for c in cases:
        value = answer(*c.args)
        if isinstance(value, dict):
            floats += [k for k, v in value.items() if isinstance(v, float)]
        got.append(_as_bytes(value, c))
        again = answer(*c.args)
        if not isinstance(again, dict) or _as_bytes(again, c) != got[-1]:
            raise Wrong("not-the-same-twice", f"two calls for {c.describe()} returned {got[-1]} and {again}",
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
