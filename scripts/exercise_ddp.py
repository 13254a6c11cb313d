"""Run learners' bucketed all-reduce functions (lesson 07's exercise) in every process of a torchrun job, and
report what each did; `helpers.exercises` launches it and reads the report.

    torchrun --standalone --nproc-per-node=2 scripts/exercise_ddp.py --candidates c.json --out r.json

c.json holds [{"name", "source", "function"}]: the source of a function `function(model, bucket_cap_bytes)`
that registers gradient hooks on `model` and returns `finish()`. For each candidate, every rank builds the
same small model, attaches the candidate, and trains STEPS SGD steps on its own half of each global batch
(forward, backward, finish(), step). Beside it, each rank trains a copy of the model on the whole global batch
as one process would: the reference, which averaged gradients must equal. Every `dist.all_reduce` call is
recorded with the phase it was made in (during backward, or after it in finish) and whether it was async.
Rank 0 writes, per candidate, in order: status ("ok", "not attempted", "error"), all-reduce calls per step,
how many started during backward and how many of those blocked, the gradients' largest relative error and
norm ratio against the reference, the parameters whose gradients stayed each rank's own, and the parameters'
largest difference from the reference after all steps.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers.distributed import setup, teardown

STEPS = 2  # SGD steps per candidate
GLOBAL_BATCH = 8  # rows per step over all ranks
BUCKET_CAP_BYTES = 600  # with the model below: two buckets per step, the first full during backward
LR = 0.1


class _Phase:
    now = "setup"  # "forward" | "backward" | "finish" | "setup"


def _record_all_reduce(calls: list[dict[str, Any]]) -> None:
    """Patch dist.all_reduce so that every call is recorded (the candidate calls it through the module)."""
    original = dist.all_reduce

    def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        is_async = bool(kwargs.get("async_op", args[2] if len(args) > 2 else False))
        calls.append({"phase": _Phase.now, "async": is_async, "numel": tensor.numel()})
        return original(tensor, *args, **kwargs)

    dist.all_reduce = all_reduce


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, GLOBAL_BATCH, 8, generator=g), torch.randn(STEPS, GLOBAL_BATCH, 4, generator=g)


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


def _run(candidate: dict[str, str], calls: list[dict[str, Any]], rank: int, world: int,
         report: dict[str, Any]) -> None:
    """Train with the candidate's hooks, filling `report` as it goes (step 0's findings outlive an error)."""
    namespace: dict[str, Any] = {"torch": torch, "dist": dist, "nn": nn, "math": math,
                                 "__name__": "candidate"}
    exec(compile(candidate["source"], f"<{candidate['function']}>", "exec"), namespace)
    attach = namespace[candidate["function"]]
    model, ref = _model(), _model()
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=LR), torch.optim.SGD(ref.parameters(), lr=LR)
    finish = attach(model, BUCKET_CAP_BYTES)
    xs, ys = _data()
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
        if step == 0:
            mine = calls[first:]
            during = [c for c in mine if c["phase"] == "backward"]
            report.update(_step_report(model, ref, local), calls_per_step=len(mine),
                          during_backward=len(during),
                          blocking_during_backward=sum(not c["async"] for c in during))
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
    args = p.parse_args()
    env = setup("cpu", timeout_s=60)
    calls: list[dict[str, Any]] = []
    _record_all_reduce(calls)
    reports = []
    for candidate in json.loads(args.candidates.read_text()):
        base = {"name": candidate["name"], "world_size": env.world_size, "steps": STEPS,
                "n_params": len(list(_model().parameters()))}
        try:
            _run(candidate, calls, env.rank, env.world_size, base)
            base["status"] = "ok"
        except NotImplementedError:
            base["status"] = "not attempted"
        except Exception as err:  # noqa: BLE001 - a learner's code may raise anything: report it
            base.update(status="error", error=_where(err, candidate))
        _Phase.now = "setup"
        dist.barrier()  # every rank finished this candidate: the next one starts together
        reports.append(base)
    if env.rank == 0:
        args.out.write_text(json.dumps(reports))
    teardown()


if __name__ == "__main__":
    main()
