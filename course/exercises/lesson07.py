"""The check of exercise 07-bucketed-allreduce (lesson 07, `07_distributed`): DDP's core, gradients
all-reduced in buckets and overlapped with backward, run under torchrun by `course/scripts/exercise_ddp.py`
(the model's widths, the bucket cap and the data drawn per run), which reports what the workers saw; several
answers share one launch (`prefetch_allreduce`, for the tests of the solution and its wrong answers).

One launch of 3 gloo processes runs each answer in two worlds: 2 processes (a process group of ranks 0 and 1,
the lesson's setting), then 3 (an answer that divides by 2 instead of the world size passes the first and
fails the second). Two worlds in one launch: a launch's cost is mostly its processes starting (each imports
torch), and a third process adds about a fifth to it, where a second launch would double it. In each world
the gradients of every step (not the first only) must equal one process's on the whole batch, and so must
the parameters after the last step.

Besides the averaged gradients, it checks the behaviour the lesson teaches: all-reduces started from the hooks
during backward, none of them synchronous or waited for there (a handle waited for inside the hook is no
overlap at all), and messages that follow the cap: the gradients, in the order backward finished them, filled
into buckets of `bucket_cap_bytes` (flushed on reaching the cap, or before going over it).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from course.exercises.core import Wrong, time_limit
from course.paths import script

__all__ = ["bucketed_allreduce", "prefetch_allreduce", "bucket_sizes"]


_ALLREDUCE_RESULTS: dict[tuple[str, int], dict[str, Any]] = {}  # (source, seed) -> what the workers measured


def _source_of(fn: Callable) -> str:
    import inspect
    import textwrap

    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as err:
        raise ValueError(f"cannot read the source of {fn!r} ({err}): define it in a notebook cell or a "
                         "file") from None


PROCESSES = 3  # the launch's processes: worlds of 2 and of 3 (exercise_ddp.WORLDS)


def prefetch_allreduce(answers: Iterable[Callable], seed: int, timeout_s: float = 180.0) -> None:
    """Run several answers in ONE torchrun launch (3 gloo processes: worlds of 2 and of 3) on the inputs drawn
    from `seed`, and keep what each did, so that checking them afterwards with that seed launches nothing
    (tests check the solution and the wrong answers this way)."""
    from helpers.train.distributed import launch

    todo = {}
    for fn in answers:
        source = _source_of(fn)
        if (source, seed) not in _ALLREDUCE_RESULTS:
            todo[source] = fn.__name__
    if not todo:
        return
    with tempfile.TemporaryDirectory(prefix="course-exercise-ddp-") as tmp:
        cands, out = Path(tmp) / "candidates.json", Path(tmp) / "results.json"
        cands.write_text(json.dumps([{"name": f"c{i}", "source": s, "function": f}
                                     for i, (s, f) in enumerate(todo.items())]))
        launch(script("exercise_ddp"),
               ["--candidates", str(cands), "--out", str(out), "--seed", str(seed)], nproc_per_node=PROCESSES,
               env={"OMP_NUM_THREADS": "1"}, timeout_s=timeout_s, echo=False)
        results = json.loads(out.read_text())
    for source, result in zip(todo, results):
        _ALLREDUCE_RESULTS[source, seed] = result


def _diagnose_allreduce(r: dict[str, Any]) -> None:
    """Name the mistake from what the workers saw; the first step's gradients first (a later error in the run
    often follows from them), then errors, then how the all-reduces were made."""
    if r["status"] == "no finish":
        raise Wrong("return-finish", f"attach_grad_allreduce returned {r.get('returned', 'None')}, not a "
                    "function", "end with `return finish`: the training loop calls finish() after "
                    "loss.backward()")
    if "unreduced" in r:
        _diagnose_grads(r)
    if r["status"] == "error":
        imports = ("NameError" in r["error"] or "ModuleNotFoundError" in r["error"]
                   or "ImportError" in r["error"])
        raise Wrong("raised", f"your function raised in the worker processes ({r['world_size']} of them): "
                    f"{r['error']}", "it runs in each process with `torch` and `dist` (torch.distributed) "
                    "imported: write every other import and helper inside the function" if imports else
                    "the error and the line are your function's, run in every worker process: fix that line "
                    "(try your function on a small model first, as the lesson's step 1 does)")


def _diagnose_grads(r: dict[str, Any]) -> None:
    if r["unreduced"] and len(r["unreduced"]) == r["n_params"]:
        raise Wrong("not-written-back", "no gradient was averaged: each process kept its own, although "
                    f"{r['calls_per_step']} all-reduce(s) ran", "all_reduce works on the flattened copy: "
                                                                "after "
                    "waiting, copy its pieces back into each param.grad "
                    "(p.grad.copy_(piece.view_as(p.grad)))")
    if r["unreduced"]:
        raise Wrong("last-bucket", f"the gradients of {', '.join(r['unreduced'])} were never averaged (each "
                    "process kept its own)", "finish() must also reduce the last bucket, the one that never "
                    "filled up, before waiting for every all-reduce")
    if abs(r["grad_norm_ratio"] - r["world_size"]) < 0.05 * r["world_size"]:
        raise Wrong("summed", f"the gradients are {r['grad_norm_ratio']:.2f}x one process's: summed, not "
                    "averaged", "all_reduce sums: divide by dist.get_world_size()")
    if r["world_size"] != 2 and abs(r["grad_norm_ratio"] - r["world_size"] / 2) < 0.025 * r["world_size"]:
        raise Wrong("world-size-hard-coded", f"with {r['world_size']} processes the gradients are "
                    f"{r['grad_norm_ratio']:.2f}x the average, though right with 2: the sum was divided by "
                    "2, not by the number of processes", "divide by dist.get_world_size(): the check runs "
                    "your function with 2 processes and with 3, and a job may have any number")
    if r["max_grad_err"] > 1e-5:
        raise Wrong("grads-differ", f"the averaged gradients differ from one process's on the whole batch "
                    f"(relative error {r['max_grad_err']:.2g}; their norm is {r['grad_norm_ratio']:.3g}x)",
                    "each bucket: flatten its gradients into one tensor, all-reduce, divide by the world "
                    "size, "
                    "copy the pieces back into each param.grad in the order they went in")


def bucket_sizes(ready: list[int], cap: int, rule: str) -> list[int]:
    """The messages' bytes when gradients of `ready` bytes fill buckets of `cap` in that order: flushed on
    reaching the cap ("reach"), or before a gradient would take it over the cap ("under") (lesson 07's check,
    and `course/scripts/exercise_ddp.py`, which draws a cap these tell apart)."""
    out, size = [], 0
    for g in ready:
        if rule == "under" and size and size + g > cap:
            out.append(size)
            size = 0
        size += g
        if rule == "reach" and size >= cap:
            out.append(size)
            size = 0
    return out + ([size] if size else [])


def _diagnose_calls(r: dict[str, Any]) -> None:
    if r["during_backward"] == 0:
        raise Wrong("no-overlap", "no all-reduce started before backward finished",
                    "start a bucket's all-reduce from the hook that fills it "
                    "(param.register_post_accumulate_grad_hook), while backward computes the earlier layers")
    if r["blocking_during_backward"]:
        raise Wrong("blocking", f"{r['blocking_during_backward']} all-reduce(s) during backward blocked it "
                    "(async_op=False)", "dist.all_reduce(flat, async_op=True) returns a handle at once; wait "
                                        "for "
                    "the handles in finish()")
    if r["waited_during_backward"]:
        raise Wrong("waited-in-backward", f"{r['waited_during_backward']} of the {r['during_backward']} "
                    "all-reduce(s) started during backward were waited for during backward: backward stood "
                    "still while their bytes travelled, so nothing overlapped", "keep each handle (with its "
                                                                                "flat "
                    "tensor and parameters) and wait for them all in finish(), after backward")
    sent = sorted(c["bytes"] for c in r["calls"])
    ready, cap = r["ready_bytes"], r["cap"]
    if sent in (sorted(bucket_sizes(ready, cap, "reach")), sorted(bucket_sizes(ready, cap, "under"))):
        return
    total = sum(ready)
    want = bucket_sizes(ready, cap, "reach")
    if r["calls_per_step"] >= r["n_params"]:
        raise Wrong("not-bucketed", f"{r['calls_per_step']} all-reduce calls per step for {r['n_params']} "
                    "parameters", "group gradients into buckets of bucket_cap_bytes: one call per bucket")
    in_elements = sent in (sorted(bucket_sizes(ready, cap * 4, "reach")),
                           sorted(bucket_sizes(ready, cap * 4, "under")))
    if sent == [total] and not in_elements:
        raise Wrong("cap-ignored", f"one all-reduce of all {total} bytes per step, with "
                                   f"bucket_cap_bytes={cap}: "
                    f"the gradients make {len(want)} buckets of up to the cap", "flush the bucket as soon as "
                                                                                "it "
                    "holds bucket_cap_bytes, from the hook that filled it, and start a new one")
    if in_elements and sent != [total]:
        raise Wrong("cap-in-elements", f"messages of {sent} bytes with bucket_cap_bytes={cap}: buckets of "
                    f"{cap} elements (4 bytes each), not bytes", "count a gradient's bytes: "
                    "p.grad.numel() * p.grad.element_size()")
    raise Wrong("buckets-off-cap", f"messages of {sent} bytes with bucket_cap_bytes={cap}; gradients of "
                f"{ready} bytes, filled in the order backward finished them, make buckets of {sorted(want)} "
                "bytes", "add each gradient's bytes to the bucket as its hook runs, and flush when the "
                         "bucket "
                "reaches the cap (or before it would go over)")


def _diagnose_steps(r: dict[str, Any]) -> None:
    """The steps after the first, and the parameters they leave: right too?"""
    errs = r["step_grad_errs"]
    later = [i for i, e in enumerate(errs) if i > 0 and e > 1e-5]
    if later:
        raise Wrong("later-steps", f"the first step's gradients were averaged, step {later[0] + 1}'s were "
                    f"not (relative error {errs[later[0]]:.2g} against one process's on the whole batch, "
                    f"with {r['world_size']} processes)", "every step must go through the same hooks and "
                    "buckets: keep the hooks registered, and let finish() leave nothing behind for the next "
                    "step (clear the pending handles, the bucket and any counter at its end)")
    if r["max_param_err"] > 1e-5:
        raise Wrong("params-differ", f"every step's gradients were averaged, but after {r['steps']} SGD "
                    f"steps the parameters differ from one process's by {r['max_param_err']:.2g} (relative, "
                    f"with {r['world_size']} processes)", "finish() must leave each param.grad as the "
                    "average and change nothing else: no parameter, no gradient left for the next step")


@time_limit(None)  # the answer runs in the workers: the launch's own timeout (180 s) stops them
def bucketed_allreduce(answer: Callable, seed: int) -> str:
    """07-bucketed-allreduce: answer(model, bucket_cap_bytes) -> finish; run under torchrun, with 2 and with 3
    processes."""
    from helpers.train.distributed import LaunchError

    try:
        prefetch_allreduce([answer], seed)
    except LaunchError as err:
        if "timed out" in str(err).splitlines()[0]:
            raise Wrong("time-limit", f"torchrun ran past its time limit and was stopped: "
                        f"{str(err).splitlines()[0]}", "a right answer takes a few seconds: look for a loop "
                        "that never ends, or processes waiting for each other (every process must make the "
                        "same all-reduce calls in the same order)") from None
        raise Wrong("launch-failed", f"torchrun failed: {str(err).splitlines()[0]}",
                    "every process must make the same all-reduce calls in the same order, or they wait for "
                    "each other forever") from None
    runs = _ALLREDUCE_RESULTS[_source_of(answer), seed]["runs"]
    if any(r["status"] == "not attempted" for r in runs):
        raise NotImplementedError  # reported as not attempted by core
    for r in runs:  # 2 processes first (the lesson's), then 3
        _diagnose_allreduce(r)
        _diagnose_calls(r)
        _diagnose_steps(r)
    r = runs[0]
    grads = max(e for run in runs for e in run["step_grad_errs"])
    params = max(run["max_param_err"] for run in runs)
    worlds = " and ".join(str(run["world_size"]) for run in runs)
    return (f"{worlds} processes under torchrun: the gradients of every step equal one process's on the "
            f"whole batch (relative error ≤ {grads:.1g}), {r['calls_per_step']} all-reduces per step of "
            f"{sorted(c['bytes'] for c in r['calls'])} bytes for {r['n_params']} parameters "
            f"(bucket_cap_bytes={r['cap']}), {r['during_backward']} started during backward (async, waited "
            f"for in finish); the parameters after {r['steps']} SGD steps equal one process's (relative "
            f"error ≤ {params:.1g})")
