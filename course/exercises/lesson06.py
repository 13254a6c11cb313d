"""The check of exercise 06-hidden-syncs (lesson 06, `06_input_pipeline`): the given training loop
(`train_loop_with_syncs`, which the notebook shows as it stands here) without a host-device synchronisation
per step, on step counts and data drawn per run.

What synchronises is counted, not a list of method names: everything the loop does runs under a
`TorchFunctionMode` and a `TorchDispatchMode` that model the device. Every tensor the training step returns
(and everything computed from it) is "on the device"; tensors the loop makes itself without a `device=` are
"on the host". A synchronisation is then any of
- an op whose result is a host value computed from device data (`torch.Tag.data_dependent_output`:
  `.item()`, `bool()` and so `if`, `float()`, `int()`, formatting a 0-d tensor, ...);
- an op whose output *shape* depends on device data (`torch.Tag.dynamic_output_shape`: `nonzero`, boolean-mask
  indexing, `masked_select`, `unique`, one-argument `where`, ...): the host waits to learn the size;
- a copy of device data to the host (`.cpu()`, `.to("cpu")`, writing into a host tensor, `.tolist()`,
  `.numpy()` / `np.asarray`, printing, `torch.tensor` of device tensors).
The reads made while steps are still to come must not grow with the number of steps; reads after the last
step are free (the device has nothing queued behind them). The losses must be the given loop's, and a NaN,
then an inf, planted in a step drawn per run (never the last) must still raise FloatingPointError: the step
skips its update when its loss is not finite, as a GradScaler's step does, so a bad loss stays in its own step
instead of spreading to every later one (where checking the last loss alone would find it), and
`torch.isnan` misses the inf. A loop that calls the training step more than twice per batch is stopped.
"""

from __future__ import annotations

import functools
import math
import random
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from course.exercises.contract import Task, contract, describe, search
from course.exercises.core import Halt, Wrong, close, learner_line, tensors_in

__all__ = ["hidden_syncs", "train_loop_with_syncs", "task"]


def train_loop_with_syncs(train_step: Callable, batches: Iterable) -> list[float]:
    """Train on every batch; -> the losses as Python floats. Stops at the first loss that is not finite."""
    losses = []
    for i, batch in enumerate(batches):
        loss = train_step(batch)  # on the device, which may still be computing it
        if not torch.isfinite(loss):  # `if` on a device value: the CPU waits for the device
            raise FloatingPointError(f"step {i}: the loss is {loss.item()}")
        losses.append(loss.item())  # .item(): the CPU waits again
    return losses


# --- what synchronises -------------------------------------------------------------------------------------

_SYNC_TAGS = {torch.Tag.data_dependent_output: "read", torch.Tag.dynamic_output_shape: "shape"}
_READS = {"tolist": "read", "numpy": "numpy", "__array__": "numpy", "__dlpack__": "copy",
          "__reduce_ex__": "copy",
          "__repr__": "print", "__str__": "print", "__format__": "print", "cpu": "copy"}
_WRITES = {"copy_", "__setitem__", "index_put_", "index_copy_", "masked_scatter_", "put_"}
_FROM_DATA = {"tensor", "as_tensor", "asarray"}  # torch.tensor([loss, ...]) reads each element


@dataclass
class _Sync:
    kind: str  # read | shape | copy | numpy | print
    call: str  # what the learner called ("Tensor.__bool__", "torch.nonzero", ...)
    line: str  # the learner's line
    steps_left: bool  # True: a training step came after it (a sync inside the loop)


def _is_cpu_target(arg: Any) -> bool:
    return (isinstance(arg, str) and arg.split(":")[0] == "cpu") or (isinstance(arg, torch.device)
                                                                     and arg.type == "cpu")


class _Device:
    """The model of a device: which tensors are on the host, and the syncs the loop made."""

    def __init__(self, answer: Callable) -> None:
        self.answer = answer
        self.host: dict[int, weakref.ref] = {}  # id -> the host tensor (by id: == on tensors is elementwise)
        self.syncs: list[_Sync] = []
        self.paused = False  # True while the training step itself runs (that is the device's work)
        self.active = False  # True while a call of the learner's runs (the dispatch mode listens then)
        self.seen: list[str] = []  # what the dispatch mode saw within that call

    def on_device(self, t: torch.Tensor) -> bool:
        ref = self.host.get(id(t))
        return ref is None or ref() is not t

    def modes(self) -> tuple[Any, Any]:
        from torch.overrides import TorchFunctionMode

        from helpers.core.compat import TorchDispatchMode

        dev = self

        class Functions(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                if dev.paused:
                    return func(*args, **kwargs)
                return dev.call(func, args, kwargs)

        class Ops(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                if dev.active and not dev.paused:
                    kinds = [k for tag, k in _SYNC_TAGS.items() if tag in func.tags]
                    if kinds and any(dev.on_device(t) for t in tensors_in((args, kwargs))):
                        dev.seen.append(kinds[0])
                return func(*args, **kwargs)

        return Functions(), Ops()

    def _target(self, args: tuple, kwargs: dict) -> bool | None:
        """Where `.to(...)` sends a tensor: True the host, False the device, None where it is."""
        for a in (*args[1:], kwargs.get("device"), kwargs.get("other")):
            if isinstance(a, str) and a:
                return _is_cpu_target(a)  # "cpu": the host
            if isinstance(a, torch.device):
                return False  # loss.device: where the loop's tensors are
            if isinstance(a, torch.Tensor):
                return not self.on_device(a)
        return None

    def call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """One call of the learner's: run it, record the sync it made (one at most), place its result."""
        name = getattr(func, "__name__", str(func))
        owner = getattr(func, "__qualname__", name).split(".")[0]
        shown = f"Tensor.{name}" if owner in ("Tensor", "TensorBase") else f"torch.{name}"
        inputs = tensors_in((args, kwargs))
        device_in = any(self.on_device(t) for t in inputs)
        target = self._target(args, kwargs) if name == "to" else None
        direct = None
        if device_in:
            if name in _READS:
                direct = _READS[name]
            elif name == "to" and target:
                direct = "copy"
            elif name in _WRITES and isinstance(args[0], torch.Tensor) and not self.on_device(args[0]):
                direct = "copy"  # device data written into a host tensor
            elif name in _FROM_DATA:
                direct = "read"
        self.active, self.seen = True, []
        try:
            out = func(*args, **kwargs)
        finally:
            self.active = False
        kind = direct or (self.seen[0] if self.seen else None)
        if kind is not None:
            self.syncs.append(_Sync(kind, shown, learner_line(self.answer), True))
        if name in ("cpu", "to") and out is args[0] and (direct == "copy" or target is False):
            out = out.clone()  # on a CPU .cpu() returns the tensor itself; across devices it is a copy
        if name == "cpu":
            host = True
        elif name == "to" and target is not None:
            host = target
        elif not inputs:  # a factory: on the host unless given a device (device=loss.device)
            device = kwargs.get("device")
            host = device is None or (isinstance(device, str) and _is_cpu_target(device))
        else:
            host = not device_in
        if host:
            for t in tensors_in(out):
                self.host[id(t)] = weakref.ref(t)
        return out


def _count(answer: Callable, n: int, seed: int) -> tuple[Any, list[_Sync]]:
    """Run the loop over n steps on the modelled device: (its result, the syncs it made)."""
    train_step, batches = _sync_setup(n, seed)
    dev = _Device(answer)
    before_last = [0]  # syncs made before the latest step began

    def step(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        before_last[0] = len(dev.syncs)
        dev.paused = True
        try:
            return train_step(batch)
        finally:
            dev.paused = False

    functions, ops = dev.modes()
    with functions, ops:
        result = answer(step, batches)
    for i, s in enumerate(dev.syncs):  # after the last step the device has nothing queued behind a sync
        s.steps_left = i < before_last[0]
    return result, dev.syncs


def _sync_setup(n: int, seed: int, plant: tuple[int, float] | None = None) -> tuple[Callable, list]:
    """The training step and n batches drawn from `seed`; `plant` = (step, value): that step's loss gets the
    value (NaN or inf) added. A step whose loss is not finite leaves the weights alone (a GradScaler's skip,
    done without a host read), so later losses stay finite. The step stops a loop that calls it more than
    twice per batch."""
    g = torch.Generator().manual_seed(seed)
    width, classes = 4 + seed % 7, 2 + seed % 4
    model = nn.Linear(width, classes)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [{"x": torch.randn(3 + seed % 3, width, generator=g),
                "y": torch.randint(classes, (3 + seed % 3,), generator=g)} for _ in range(n)]
    calls = [0]

    def train_step(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        calls[0] += 1
        if calls[0] > 2 * n + 2:
            raise Halt("endless", f"it called train_step {calls[0]} times for {n} batches: the loop does not "
                       "end", "train on each batch once: for batch in batches (a while loop must advance "
                       "its index)")
        loss = F.cross_entropy(model(batch["x"]), batch["y"])
        if plant is not None and calls[0] == plant[0] + 1:
            loss = loss + plant[1]
        loss.backward()
        finite = torch.isfinite(loss)
        for p in model.parameters():  # a non-finite loss: no update (no read of the value: torch.where)
            p.grad = torch.where(finite, p.grad, torch.zeros_like(p.grad))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return train_step, batches


_HINTS = {
    "read": ("per-step-read", "it reads a device value: the CPU waits for the device to finish everything "
             "queued", "keep each loss on the device (append the tensor) and read them after the loop; check "
             "for NaN/inf once too, on the stacked losses (`if` on a tensor reads it as well)"),
    "shape": ("per-step-shape", "the size of its result depends on the device's values (nonzero, a boolean "
              "mask, unique, ...), so the CPU waits to learn it", "use ops whose output shape is fixed "
              "(torch.isfinite(x).all(), torch.where(cond, a, b)), or do it once after the loop"),
    "copy": ("per-step-copy", "it copies device data to the host (.cpu(), .to('cpu'), writing into a tensor "
             "made without device=), which waits for the value", "keep the losses on the device (a list of "
             "tensors, or a buffer made with device=loss.device) and copy them once, after the loop"),
    "numpy": ("per-step-numpy", "numpy reads host memory: on a GPU np.asarray(loss) raises, on a CPU it "
              "waits for the value", "keep tensors in the loop; convert once, after it"),
    "print": ("per-step-print", "printing a tensor reads its value", "print after the loop: even every k "
              "steps, the reads grow with the number of steps"),
}


# --- the contract and the differential search ---------------------------------------------------------------

@dataclass(frozen=True)
class _Raised:
    """What a loop did instead of returning: raised FloatingPointError (a value to compare, not an error)."""

    kind: str = "FloatingPointError"

    def __repr__(self) -> str:
        return f"raised {self.kind}"


def _catching(loop: Callable) -> Callable:
    """`loop`, returning _Raised() where it raises FloatingPointError (the expected answer to a bad loss)."""
    @functools.wraps(loop)
    def run(train_step: Callable, batches: Iterable) -> Any:
        try:
            return loop(train_step, batches)
        except FloatingPointError:
            return _Raised()

    return run


@dataclass(frozen=True)
class _Case:
    steps: int
    data: int
    plant: tuple[int, float] | None  # (step, value): that step's loss gets a NaN, inf or -inf

    def __repr__(self) -> str:
        bad = f", a loss of {self.plant[1]} planted in step {self.plant[0]}" if self.plant else ""
        return f"{self.steps} step(s) (data seed {self.data}){bad}"


def _draw_case(rng: random.Random) -> _Case:
    """One case: 1, 2, 3 or more steps; no bad loss, or a NaN, an inf or a -inf in any step, the first and
    the last included."""
    steps = rng.choice((1, 2, 3, rng.randint(4, 12)))
    plant = None
    if rng.random() < 0.6:
        at = rng.choice((0, steps - 1, rng.randrange(steps)))
        plant = (at, rng.choice((math.nan, math.inf, -math.inf)))
    return _Case(steps, rng.randrange(2 ** 20), plant)


def _shrink(c: _Case) -> list[_Case]:
    out = []
    for steps in (1, c.steps - 1, c.steps // 2):
        if 1 <= steps < c.steps and (c.plant is None or c.plant[0] < steps):
            out.append(_Case(steps, c.data, c.plant))
    if c.plant is not None and c.plant[0] > 0:  # the bad loss earlier, and the steps after it gone
        out.append(_Case(c.plant[0], c.data, (c.plant[0] - 1, c.plant[1])))
    return out


def _agree(got: Any, want: Any, c: _Case) -> str | None:
    if isinstance(want, _Raised) or isinstance(got, _Raised):
        mine = "raised FloatingPointError" if isinstance(got, _Raised) else f"returned {got!r}"
        return None if type(got) is type(want) else f"it {mine}, the given loop {want!r}"
    if len(got) == len(want) and all(isinstance(x, float) and close(x, y, 1e-6) for x, y in zip(got, want)):
        return None
    return f"it returned {got!r}, the given loop {want!r}"


def _name_case(answer: Callable, c: _Case, got: Any, want: Any) -> None:
    """A bad loss the loop let through: a NaN, or (if a NaN in the same step is caught) an infinity."""
    if isinstance(want, _Raised) and not isinstance(got, _Raised) and c.plant is not None:
        at, value = c.plant
        nan = _Case(c.steps, c.data, (at, math.nan))
        if not isinstance(_catching(answer)(*_sync_setup(nan.steps, nan.data, nan.plant)), _Raised):
            raise Wrong("nan-unnoticed", f"a NaN loss in step {at} of {c.steps} went unnoticed",
                        "after the loop: if not torch.isfinite(stacked).all(), raise FloatingPointError "
                        "(every step's loss, the first and the last included)")
        raise Wrong("inf-unnoticed", f"a loss of {value} in step {at} of {c.steps} went unnoticed, though a "
                    "NaN there was caught", "torch.isfinite catches NaN, inf and -inf; a comparison with "
                    "float('inf') misses -inf, and torch.isnan misses both")


def _validate(got: Any, c: _Case) -> None:
    if isinstance(got, torch.Tensor) or (isinstance(got, (list, tuple)) and got
                                         and isinstance(got[0], torch.Tensor)):
        raise Wrong("not-floats", "it returned tensors", "return Python floats: stack the losses and read "
                    "them once, at the end (.tolist())")
    if not isinstance(got, (list, _Raised)) or (isinstance(got, list) and len(got) != c.steps):
        raise Wrong("losses-differ", f"for {c.steps} steps it returned {describe(got)}",
                    "train on every batch in order and return every loss, as Python floats, in a list")


def task() -> Task:
    """06-hidden-syncs' function for the contract and the search, against the given loop (a loop that raises
    FloatingPointError is compared as having raised it)."""
    return Task(_catching(train_loop_with_syncs), draw=_draw_case,
                arguments=lambda c: dict(zip(("train_step", "batches"),
                                             _sync_setup(c.steps, c.data, c.plant))),
                agree=_agree, show=repr, shrink=_shrink, name="train_loop", result="what it returned",
                validate=_validate, exact_numbers=True,
                hint="train on every batch in order; return every loss as a Python float; raise "
                     "FloatingPointError when any loss is not finite")


def hidden_syncs(answer: Callable, seed: int) -> str:
    """06-hidden-syncs: answer(train_step, batches) -> losses (floats), no host-device sync per step."""
    rng = random.Random(seed)
    few = rng.randrange(3, 6)
    many = few + rng.randrange(3, 7)
    data = rng.randrange(2 ** 20)
    the_task = task()
    contract(_catching(answer), the_task, _Case(few, data, None))
    want = train_loop_with_syncs(*_sync_setup(few, data))
    got, syncs_few = _count(answer, few, data)
    if isinstance(got, torch.Tensor) or (isinstance(got, (list, tuple)) and got
                                         and isinstance(got[0], torch.Tensor)):
        raise Wrong("not-floats", "it returned tensors", "return Python floats: stack the losses and read "
                    "them once, at the end (.tolist())")
    same = (isinstance(got, list) and len(got) == len(want) and all(isinstance(x, float) for x in got)
            and all(close(a, b, 1e-5) for a, b in zip(got, want)))
    if not same:
        kind = type(got[0]).__name__ if isinstance(got, list) and got else type(got).__name__
        raise Wrong("losses-differ", f"for {few} steps it returned {got!r} ({kind}), the given loop {want!r}",
                    "train on every batch in order and return every loss, as Python floats")
    inside_few = [s for s in syncs_few if s.steps_left]
    lots = rng.randrange(21, 41)  # a third count, far beyond: a sync every k steps shows there
    for steps in (many, lots):
        _, syncs_more = _count(answer, steps, data)
        inside_more = [s for s in syncs_more if s.steps_left]
        if len(inside_more) > len(inside_few):
            per_step = (len(inside_more) - len(inside_few)) / (steps - few)
            last = inside_more[-1]
            key, why, hint = _HINTS[last.kind]
            raise Wrong(key, f"{per_step:.3g} synchronisation(s) per step remain inside the loop ("
                        f"{len(inside_few)} for {few} steps, {len(inside_more)} for {steps}); the last: "
                        f"{last.call} at `{last.line}`: {why}", hint)
        if steps == many:
            syncs_many, inside_many = syncs_more, inside_more
    nan_at, inf_at = rng.randrange(0, few - 1), rng.randrange(0, few - 1)  # never the last step
    minus_at = rng.randrange(0, few - 1)
    planted = (("NaN", math.nan, nan_at), ("inf", math.inf, inf_at), ("-inf", -math.inf, minus_at))
    for what, value, at in planted:
        try:
            answer(*_sync_setup(few, data, plant=(at, value)))
        except FloatingPointError:
            continue
        except Exception as err:  # noqa: BLE001 - another error than the one asked for
            raise Wrong("wrong-error", f"a{'n' if what != 'NaN' else ''} {what} loss (planted in step {at}) "
                        f"raised {type(err).__name__}, not FloatingPointError",
                        "raise FloatingPointError(...) when a loss is not finite") from None
        if what == "NaN":
            raise Wrong("nan-unnoticed", f"a NaN loss (planted in step {at} of {few}; the step skipped its "
                        "update, so the later losses stayed finite) went unnoticed",
                        "after the loop: if not torch.isfinite(stacked).all(), raise FloatingPointError "
                        "(every loss, not the last one only)")
        try:  # the inf went through: would a NaN in that very step have too?
            answer(*_sync_setup(few, data, plant=(at, float("nan"))))
        except FloatingPointError:
            raise Wrong("inf-unnoticed", f"a loss of {what} (planted in step {at} of {few}) went unnoticed, "
                        "though a NaN was caught", "torch.isnan (and math.isnan) say False for inf: test "
                        "torch.isfinite(stacked).all(), which catches NaN and ±inf") from None
        raise Wrong("nan-unnoticed", f"a NaN loss, and a loss of {what}, planted in step {at} of {few} went "
                    "unnoticed (a NaN in another step was caught)", "check every step's loss after the loop, "
                    "the first included: if not torch.isfinite(stacked).all(), raise FloatingPointError")
    given = [s for s in _count(train_loop_with_syncs, many, data)[1] if s.steps_left]
    after = len(syncs_many) - len(inside_many)
    searched = search(_catching(answer), the_task, rng, draws=20,
                      name=functools.partial(_name_case, answer), key="losses-differ")
    return (f"same losses as the given loop; {len(inside_many)} synchronisation(s) inside the loop whether "
            f"{few}, {many} or {lots} steps, {after} after it (the given loop: {len(given)} inside for "
            f"{many} steps); a NaN planted in step {nan_at}, an inf in step {inf_at} and a -inf in step "
            f"{minus_at} raised FloatingPointError; and as the given loop on {searched} more drawn inputs "
            "(from 1 step; a NaN, inf or -inf in any step, the first and the last too)")
