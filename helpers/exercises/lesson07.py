"""The check of exercise 07-bucketed-allreduce (lesson 07, `07_distributed`): DDP's core, gradients
all-reduced in buckets and overlapped with backward, run under torchrun in 2 gloo processes by
`scripts/exercise_ddp.py`, which reports what the workers saw; several answers share one launch
(`prefetch_allreduce`, for the tests of the solution and its mutants).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from helpers.exercises.core import Wrong

__all__ = ["bucketed_allreduce", "prefetch_allreduce"]


_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "exercise_ddp.py"
_ALLREDUCE_RESULTS: dict[str, dict[str, Any]] = {}  # source text -> what the workers measured


def _source_of(fn: Callable) -> str:
    import inspect
    import textwrap

    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as err:
        raise ValueError(f"cannot read the source of {fn!r} ({err}): define it in a notebook cell or a "
                         "file") from None


def prefetch_allreduce(answers: Iterable[Callable], timeout_s: float = 180.0) -> None:
    """Run several answers in ONE torchrun launch (2 gloo processes) and keep what each did, so that checking
    them afterwards launches nothing (tests check the solution and its mutants this way)."""
    from helpers.distributed import launch

    todo = {}
    for fn in answers:
        source = _source_of(fn)
        if source not in _ALLREDUCE_RESULTS:
            todo[source] = fn.__name__
    if not todo:
        return
    with tempfile.TemporaryDirectory(prefix="course-exercise-ddp-") as tmp:
        cands, out = Path(tmp) / "candidates.json", Path(tmp) / "results.json"
        cands.write_text(json.dumps([{"name": f"c{i}", "source": s, "function": f}
                                     for i, (s, f) in enumerate(todo.items())]))
        launch(_SCRIPT, ["--candidates", str(cands), "--out", str(out)], nproc_per_node=2,
               env={"OMP_NUM_THREADS": "1"}, timeout_s=timeout_s, echo=False)
        results = json.loads(out.read_text())
    for source, result in zip(todo, results):
        _ALLREDUCE_RESULTS[source] = result


def _diagnose_allreduce(r: dict[str, Any]) -> None:
    """Name the mistake from what the workers saw; the first step's gradients first (a later error in the run
    often follows from them), then errors, then how the all-reduces were made."""
    if "unreduced" in r:
        _diagnose_grads(r)
    if r["status"] == "error":
        raise Wrong("raised", f"your function raised in the worker processes: {r['error']}",
                    "it runs in each process with `torch` and `dist` (torch.distributed) imported: write "
                    "every other import and helper inside the function")


def _diagnose_grads(r: dict[str, Any]) -> None:
    if r["unreduced"]:
        raise Wrong("last-bucket", f"the gradients of {', '.join(r['unreduced'])} were never averaged (each "
                    "process kept its own)", "finish() must also reduce the last bucket, the one that never "
                    "filled up, before waiting for every all-reduce")
    if abs(r["grad_norm_ratio"] - r["world_size"]) < 0.05 * r["world_size"]:
        raise Wrong("summed", f"the gradients are {r['grad_norm_ratio']:.2f}x one process's: summed, not "
                    "averaged", "all_reduce sums: divide by dist.get_world_size()")
    if r["max_grad_err"] > 1e-5:
        raise Wrong("grads-differ", f"the averaged gradients differ from one process's on the whole batch "
                    f"(relative error {r['max_grad_err']:.2g})", "each bucket: flatten its gradients into "
                    "one tensor, all-reduce, divide by the world size, copy the pieces back into each "
                    "param.grad")


def _diagnose_calls(r: dict[str, Any]) -> None:
    if r["during_backward"] == 0:
        raise Wrong("no-overlap", "no all-reduce started before backward finished",
                    "start a bucket's all-reduce from the hook that fills it "
                    "(param.register_post_accumulate_grad_hook), while backward computes the earlier layers")
    if r["blocking_during_backward"]:
        raise Wrong("blocking", f"{r['blocking_during_backward']} all-reduce(s) during backward blocked it",
                    "dist.all_reduce(flat, async_op=True) returns a handle at once; wait for the handles in "
                    "finish()")
    if r["calls_per_step"] >= r["n_params"]:
        raise Wrong("not-bucketed", f"{r['calls_per_step']} all-reduce calls per step for {r['n_params']} "
                    "parameters", "group gradients into buckets of bucket_cap_bytes: one call per bucket")


def bucketed_allreduce(answer: Callable) -> str:
    """07-bucketed-allreduce: answer(model, bucket_cap_bytes) -> finish; run under torchrun, 2 processes."""
    from helpers.distributed import LaunchError

    try:
        prefetch_allreduce([answer])
    except LaunchError as err:
        raise Wrong("launch-failed", f"torchrun failed: {str(err).splitlines()[0]}",
                    "every process must make the same all-reduce calls in the same order, or they wait for "
                    "each other forever") from None
    r = _ALLREDUCE_RESULTS[_source_of(answer)]
    if r["status"] == "not attempted":
        raise NotImplementedError  # reported as not attempted by core
    _diagnose_allreduce(r)
    _diagnose_calls(r)
    return (f"2 processes under torchrun: gradients equal one process's on the whole batch (relative error "
            f"{r['max_grad_err']:.1g}), {r['calls_per_step']} all-reduces per step for {r['n_params']} "
            f"parameters, {r['during_backward']} started during backward (async), parameters after "
            f"{r['steps']} SGD steps equal")
