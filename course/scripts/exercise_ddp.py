"""Run learners' bucketed all-reduce functions (lesson 07's exercise) in every process of a torchrun job, and
report what each did; `course.exercises` launches it and reads the report.

    torchrun --standalone --nproc-per-node=3 -m course.scripts.exercise_ddp --candidates c.json \
        --out r.json --seed 7[,8,...]

c.json holds [{"name", "source", "function"}]: the source of a function `function(model, bucket_cap_bytes)`
that registers gradient hooks on `model` and returns `finish()`. The model's widths, the bucket cap and the
data are drawn from --seed (the same on every rank). Each candidate runs in two worlds, one after the other:
2 processes (ranks 0 and 1, a process group of their own: the candidate's default-group calls go to it and
`dist.get_world_size()` says 2), then all 3 (an answer that divides by 2 passes the first and fails the
second); with fewer processes, in the one world there is. In each, every rank builds the same small model,
attaches the candidate, and trains STEPS SGD steps on its own share of each global batch (forward, backward,
finish(), step). Beside it, each rank trains a copy of the model on the whole global batch as one process
would: the reference, which averaged gradients must equal. Each candidate runs so on two draws: a float32
model (the lesson's) and a float64 one of other widths and cap (a bucket counted at 4 bytes per element shows
there).
Every `dist.all_reduce` call is recorded
with the phase it was made in (during backward, or after it in finish), whether it was async, its bytes, and
the phase in which its handle was waited for (`wait()` on the handle or on its future); the order in which
gradients became ready (and their bytes) is recorded by a hook registered before the candidate's. Rank 0
writes, per candidate and world, in order: status ("ok", "not attempted", "no finish", "error"), the cap,
all-reduce calls per step, how many started during backward, how many of those blocked (synchronous) and how
many were waited for during backward, each call of the first step (phase, bytes, async, waited), the
gradients' bytes in the order they became ready, the gradients' largest relative error and norm ratio against
the reference, the parameters whose gradients stayed each rank's own (first step), the largest relative error
of each step's gradients, and the parameters' largest difference from the reference after all steps; and,
for the contract: each step's all-reduces (how many, started during backward, blocking, waited for there,
their bytes), the first thing the candidate's closures keep between steps that a later step left otherwise
than the first (a counter not reset, a list that grows: state built in the first step may stay), the
gradients whose dtype is not their parameter's, and what `attach_grad_allreduce` changed in the model. With
several seeds, the report is a dict: seed -> the reports.
"""

from __future__ import annotations

import argparse
import copy
import functools
import inspect
import json
import math
import random
import traceback
import types
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course.exercises.lesson07 import bucket_sizes
from helpers.core import compat
from helpers.train.distributed import setup, teardown

STEPS = 3  # SGD steps per candidate: the later ones show what a step left for the next
DTYPES = (torch.float32, torch.float64)  # each candidate's two draws: the lesson's dtype; 8 bytes per element
GLOBAL_BATCH = 12  # rows per step over all ranks: an even share for 2 and for 3 processes
LR = 0.1
WORLDS = (2, 3)  # the worlds each candidate runs in, when the job has 3 processes


class _World:
    """The world the candidate sees now: the whole job (group None), or its first ranks (a subgroup)."""

    group: object | None = None
    size = 1


class _Phase:
    now = "setup"  # "forward" | "backward" | "finish" | "setup"


class _Handle:
    """What dist.all_reduce(..., async_op=True) returned, with a note of when it was waited for."""

    def __init__(self, work: Any, call: dict[str, Any]) -> None:
        self._work, self._call = work, call

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._call.setdefault("waited", _Phase.now)
        return self._work.wait(*args, **kwargs)

    def get_future(self) -> Any:
        return _Future(self._work.get_future(), self._call)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class _Future:
    def __init__(self, future: Any, call: dict[str, Any]) -> None:
        self._future, self._call = future, call

    def wait(self) -> Any:
        self._call.setdefault("waited", _Phase.now)
        return self._future.wait()

    def value(self) -> Any:
        self._call.setdefault("waited", _Phase.now)
        return self._future.value()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._future, name)


def _in_world(fn: Any) -> Any:
    """`fn` (a collective of torch.distributed) with its group defaulting to the candidate's world."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)  # its signature stays fn's (the recorder binds against it)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if _World.group is not None:
            bound = signature.bind_partial(*args, **kwargs)
            if bound.arguments.get("group") is None:
                bound.arguments["group"] = _World.group
            args, kwargs = bound.args, bound.kwargs
        return fn(*args, **kwargs)

    return collective


def _enter_worlds() -> None:
    """Patch torch.distributed so that the candidate's calls (through the module) stay in its world:
    get_world_size() says the world's size, the collectives default to the world's group (and all_reduce takes
    ReduceOp.AVG on every backend)."""
    size = dist.get_world_size

    def get_world_size(group: Any = None) -> int:
        return _World.size if group is None else size(group)

    dist.get_world_size = get_world_size
    # an answer may average with op=ReduceOp.AVG, which torch 2.7's gloo lacks: there it runs as a sum divided
    # by the world's size (what gloo does from torch 2.8), so a right answer passes on every torch
    dist.all_reduce = compat.all_reduce_with_avg(dist.all_reduce)
    for name in ("all_reduce", "barrier", "broadcast", "all_gather", "all_gather_into_tensor",
                 "reduce_scatter_tensor"):  # all in torch.distributed since torch 2.0
        setattr(dist, name, _in_world(getattr(dist, name)))


def _record_all_reduce(calls: list[dict[str, Any]]) -> None:
    """Patch dist.all_reduce so that every call is recorded (the candidate calls it through the module)."""
    original = dist.all_reduce
    signature = inspect.signature(original)

    def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(tensor, *args, **kwargs)
        is_async = bool(bound.arguments.get("async_op", False))
        call = {"phase": _Phase.now, "async": is_async, "bytes": tensor.numel() * tensor.element_size()}
        calls.append(call)
        work = original(tensor, *args, **kwargs)
        return _Handle(work, call) if is_async and work is not None else work

    dist.all_reduce = all_reduce


def _ready_bytes(widths: list[int], dtype: torch.dtype = torch.float32) -> list[int]:
    """The gradients' bytes in the order backward finishes them, from one backward pass of the model."""
    model, ready = _model(widths, dtype), []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: ready.append(p.grad.numel() * p.grad.element_size()))
    model(torch.zeros(1, widths[0], dtype=dtype)).sum().backward()
    return ready


def _separates(ready: list[int], cap: int) -> bool:
    """Whether this cap tells the mistakes apart: several buckets under both flush rules, a last one left for
    finish(), some bucket of two gradients or more, and other buckets if the cap were counted in elements."""
    reach, under = bucket_sizes(ready, cap, "reach"), bucket_sizes(ready, cap, "under")
    in_elements = [sorted(bucket_sizes(ready, cap * 4, r)) for r in ("reach", "under")]
    return (min(len(reach), len(under)) >= 3 and reach[-1] < cap and max(len(reach), len(under)) < len(ready)
            and all(len(e) >= 2 and e not in (sorted(reach), sorted(under)) for e in in_elements))


def _draw(seed: int, dtype: torch.dtype = torch.float32) -> tuple[list[int], int]:
    """The model's widths and the bucket cap: several buckets per step, some filled during backward, the last
    one not full, and caps that tell the flush rules from the mistakes (the float64 draw: its own, whose last
    bucket holds less than half the cap, so that an answer that drops or delays a small last bucket shows)."""
    rng = random.Random(seed if dtype == torch.float32 else f"{seed}-{dtype}")
    while True:
        widths = [8] + [rng.choice((8, 12, 16, 20)) for _ in range(rng.randrange(3, 5))] + [4]
        ready = _ready_bytes(widths, dtype)
        for _ in range(40):
            cap = int(sum(ready) * rng.uniform(0.08, 0.35)) | 1  # odd: never a sum of fp32 gradients' bytes
            small_last = bucket_sizes(ready, cap, "reach")[-1] < cap // 2
            if _separates(ready, cap) and (small_last or dtype == torch.float32):
                return widths, cap


def _model(widths: list[int], dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1]).to(dtype)


def _data(seed: int, widths: list[int],
          dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(STEPS, GLOBAL_BATCH, widths[0], generator=g).to(dtype),
            torch.randn(STEPS, GLOBAL_BATCH, widths[-1], generator=g).to(dtype))


def _signature(value: Any) -> Any:
    """What the contract compares of a value a closure keeps: a container's kind and length, a number or a
    string itself; None for what it does not follow (tensors, handles, objects)."""
    if isinstance(value, (list, tuple)) and 0 < len(value) <= 8 and all(
            isinstance(v, (bool, int, float)) for v in value):  # a counter kept in a list: `size = [0]`
        return (type(value).__name__, len(value), tuple(value))
    if isinstance(value, (list, tuple, set, dict)) or type(value).__name__ == "deque":
        return (type(value).__name__, len(value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("value", value)
    return None


def _state(fn: Any, attach: Any, model: nn.Module) -> dict[str, Any]:
    """The state the candidate keeps between steps: what the closures of finish() and of the hooks it
    registered on the model (and of the functions they reach) hold, and the mutable defaults of
    attach_grad_allreduce, by name. The hooks are the candidate's when their globals are its own (the
    check's hook that records the order of the gradients is not)."""
    out: dict[str, Any] = {}
    for i, default in enumerate(getattr(attach, "__defaults__", None) or ()):
        if _signature(default) is not None:
            out[f"default argument {i + 1}"] = _signature(default)
    hooks = [h for p in model.parameters()
             for h in compat.post_accumulate_grad_hooks(p)
             if getattr(h, "__globals__", None) is attach.__globals__]
    todo, seen = [fn, *hooks], set()
    while todo:
        f = todo.pop()
        if not isinstance(f, types.FunctionType) or id(f) in seen:
            continue
        seen.add(id(f))
        for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:  # not bound yet
                continue
            if isinstance(value, types.FunctionType):
                todo.append(value)
            elif _signature(value) is not None:
                out[name] = _signature(value)
    return out


def _state_change(before: dict[str, Any], after: dict[str, Any], when: str) -> str | None:
    """The first thing kept between steps that a step left otherwise than it was `when`."""
    def shown(sig: Any) -> str:
        if sig[0] == "value":
            return f"{sig[1]!r}"
        return f"{list(sig[2])!r}" if len(sig) > 2 else f"a {sig[0]} of {sig[1]} item(s)"

    for name, was in before.items():
        now = after.get(name)
        if name in after and now != was:  # a name no longer reached (hooks removed) is another breach's
            return f"`{name}` is {shown(now)}; {when} it was {shown(was)}"
    return None


def _attach_change(model: nn.Module, widths: list[int], dtype: torch.dtype) -> str | None:
    """What attach_grad_allreduce changed in the model: its dtype, or its weights."""
    fresh = _model(widths, dtype)
    for (name, p), q in zip(model.named_parameters(), fresh.parameters()):
        if p.dtype != q.dtype:
            return f"it converted the model to {str(p.dtype).replace('torch.', '')} (its parameters were " \
                   f"{str(q.dtype).replace('torch.', '')})"
        if not torch.equal(p.detach(), q.detach()):
            return f"it changed the model's weights ({name})"
    return None


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _step_report(model: nn.Module, ref: nn.Module, local: nn.Module) -> dict[str, Any]:
    """Compare the averaged gradients with the reference's (whole batch) and with this rank's own."""
    errs, unreduced, norms = [], [], [0.0, 0.0]
    for (name, p), r, own in zip(model.named_parameters(), ref.parameters(), local.parameters()):
        if p.grad is None:
            unreduced.append(name)
            continue
        errs.append(_rel(p.grad, r.grad))
        norms[0] += p.grad.pow(2).sum().item()
        norms[1] += r.grad.pow(2).sum().item()
        if _rel(p.grad, r.grad) > 1e-4 and _rel(p.grad, own.grad) < 1e-6:
            unreduced.append(name)
    return {"max_grad_err": max(errs, default=math.inf), "unreduced": unreduced,
            "grad_norm_ratio": math.sqrt(norms[0] / max(norms[1], 1e-30))}


class _NoFinish(Exception):
    """The candidate returned something that is not callable instead of finish()."""


def _run(candidate: dict[str, str], calls: list[dict[str, Any]], rank: int, world: int, seed: int,
         report: dict[str, Any], dtype: torch.dtype = torch.float32) -> None:
    """Train with the candidate's hooks, filling `report` as it goes (step 0's findings outlive an error)."""
    namespace: dict[str, Any] = {"torch": torch, "dist": dist, "nn": nn, "math": math,
                                 "__name__": "candidate"}
    exec(compile(candidate["source"], f"<{candidate['function']}>", "exec"), namespace)
    attach = namespace[candidate["function"]]
    widths, cap = _draw(seed, dtype)
    model, ref = _model(widths, dtype), _model(widths, dtype)
    ready: list[int] = []  # bytes of each gradient, in the order backward finished them
    def note_ready(p: torch.Tensor) -> None:
        if _Phase.now == "backward":
            ready.append(p.grad.numel() * p.grad.element_size())

    for p in model.parameters():  # registered first: runs before the candidate's hook on each parameter
        p.register_post_accumulate_grad_hook(note_ready)
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=LR), torch.optim.SGD(ref.parameters(), lr=LR)
    finish = attach(model, cap)
    if not callable(finish):
        report["returned"] = "None" if finish is None else f"a {type(finish).__name__}"
        raise _NoFinish()
    changed = _attach_change(model, widths, dtype)
    if changed is not None:
        report["attach_changed"] = changed
    # what every step must leave as it found it: the numbers the closures keep (a byte count, a counter) as
    # attach_grad_allreduce set them; the containers' sizes as the first step left them (a list of the
    # parameters' order filled in the first backward may stay)
    start_state, first_state = _state(finish, attach, model), None
    xs, ys = _data(seed, widths, dtype)
    rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    for step in range(STEPS):
        local = copy.deepcopy(model)  # this rank's own gradients, for telling unreduced ones apart
        F.mse_loss(local(xs[step, rows]), ys[step, rows]).backward()
        first = len(calls)
        opt.zero_grad(set_to_none=True)
        _Phase.now = "forward"
        loss = F.mse_loss(model(xs[step, rows]), ys[step, rows])
        _Phase.now = "backward"
        loss.backward()
        _Phase.now = "finish"
        finish()
        _Phase.now = "setup"
        ref_opt.zero_grad(set_to_none=True)
        F.mse_loss(ref(xs[step]), ys[step]).backward()  # one process, the whole global batch
        report.setdefault("step_grad_errs", []).append(_step_report(model, ref, local)["max_grad_err"])
        mine = calls[first:]
        during = [c for c in mine if c["phase"] == "backward"]
        report.setdefault("steps_calls", []).append({
            "calls": len(mine), "during_backward": len(during),
            "blocking": sum(not c["async"] for c in during),
            "waited": sum(c.get("waited") == "backward" for c in during),
            "bytes": sorted(c["bytes"] for c in mine)})
        state = _state(finish, attach, model)
        first_state = state if first_state is None else first_state
        numbers = {n: sig for n, sig in start_state.items() if sig[0] == "value" or len(sig) > 2}
        left = _state_change(numbers, state, "when attach_grad_allreduce returned") \
            or _state_change({n: sig for n, sig in first_state.items() if n not in numbers}, state,
                             "after the first step")
        if left is not None and "state_left" not in report:
            report["state_left"] = {"step": step + 1, "what": left}
        if step == 0:
            report["grad_dtypes"] = [
                f"{n}: {str(p.grad.dtype).replace('torch.', '')} (the parameter's: "
                f"{str(p.dtype).replace('torch.', '')})" for n, p in model.named_parameters()
                if p.grad is not None and p.grad.dtype != p.dtype]
            mine = calls[first:]
            during = [c for c in mine if c["phase"] == "backward"]
            report.update(_step_report(model, ref, local), calls_per_step=len(mine),
                          during_backward=len(during), cap=cap, ready_bytes=list(ready), calls=mine,
                          blocking_during_backward=sum(not c["async"] for c in during),
                          waited_during_backward=sum(c.get("waited") == "backward" for c in during))
        opt.step()
        ref_opt.step()
    report["max_param_err"] = max(_rel(p.detach(), r.detach()) for p, r in zip(model.parameters(),
                                                                               ref.parameters()))


def _where(err: BaseException, candidate: dict[str, str]) -> str:
    """The error and the line of the candidate's code it came from (its innermost frame there)."""
    lines = candidate["source"].splitlines()
    name = f"<{candidate['function']}>"
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == name]
    where = ""
    if frames and 0 < frames[-1].lineno <= len(lines):
        where = f" (line {frames[-1].lineno} of your function: `{lines[frames[-1].lineno - 1].strip()}`)"
    return f"{type(err).__name__}: {err}{where}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--candidates", type=Path, required=True, help="JSON list of {name, source, function}")
    p.add_argument("--out", type=Path, required=True, help="rank 0 writes the reports here (JSON)")
    p.add_argument("--seed", default="0", help="draws the model's widths, the bucket cap and the data; "
                                               "several, comma-separated: one report per seed")
    args = p.parse_args()
    seeds = [int(x) for x in str(args.seed).split(",")]
    env = setup("cpu", timeout_s=60)
    worlds = [w for w in WORLDS if w <= env.world_size] or [env.world_size]
    groups = {w: None if w == env.world_size else  # every rank makes every group, in the same order
              dist.new_group(list(range(w)), timeout=timedelta(seconds=30)) for w in worlds}
    calls: list[dict[str, Any]] = []
    _enter_worlds()
    _record_all_reduce(calls)
    candidates = json.loads(args.candidates.read_text())
    by_seed = {}
    for seed in seeds:
        by_seed[str(seed)] = [{"name": c["name"], "runs": _runs(c, calls, env, worlds, groups, seed)}
                              for c in candidates]
    if env.rank == 0:
        args.out.write_text(json.dumps(by_seed[str(seeds[0])] if len(seeds) == 1 else by_seed))
    teardown()


def _runs(candidate: dict[str, str], calls: list[dict[str, Any]], env: Any, worlds: list[int],
          groups: dict[int, Any], seed: int) -> list[dict[str, Any]]:
    """The candidate's runs: each draw (float32, float64) in each world (2, then 3 processes)."""
    runs = []
    for dtype in DTYPES:
        n_params = len(list(_model(_draw(seed, dtype)[0]).parameters()))
        for world in worlds:
            _World.group, _World.size = groups[world], world
            base = {"name": candidate["name"], "world_size": world, "steps": STEPS, "seed": seed,
                    "n_params": n_params, "dtype": str(dtype).replace("torch.", "")}
            if env.rank < world:  # the other ranks wait at the barrier below
                try:
                    _run(candidate, calls, env.rank, world, seed, base, dtype)
                    base["status"] = "ok"
                except NotImplementedError:
                    base["status"] = "not attempted"
                except _NoFinish:
                    base["status"] = "no finish"
                except Exception as err:  # noqa: BLE001 - a learner's code may raise anything: report it
                    base.update(status="error", error=_where(err, candidate))
            _Phase.now = "setup"
            _World.group, _World.size = None, env.world_size
            dist.barrier()  # every rank finished this run: the next one starts together
            runs.append(base)
    return runs


if __name__ == "__main__":
    main()
