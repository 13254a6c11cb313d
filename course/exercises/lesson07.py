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

Besides the averaged gradients, it checks the behaviour the lesson teaches, in every step (not the first
only): all-reduces started from the hooks during backward, none of them synchronous or waited for there (a
handle waited for inside the hook is no overlap at all), and messages that follow the cap: the gradients, in
the order backward finished them, filled into buckets of `bucket_cap_bytes` (flushed on reaching the cap, or
before going over it). Each answer runs on a float32 model (the lesson's) and on a float64 one, where a
bucket counted at 4 bytes per element is off. The contract, read from the workers: attach_grad_allreduce
leaves the model as it was, the averaged gradients keep their parameters' dtype, and what the closures keep
between steps (a counter, a list of handles) is the same at the end of every step as at the end of the first.
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


def prefetch_allreduce(answers: Iterable[Callable], seed: int | Iterable[int],
                       timeout_s: float | None = None) -> None:
    """Run several answers in ONE torchrun launch (3 gloo processes: worlds of 2 and of 3) on the inputs drawn
    from `seed` (or from each of several seeds), and keep what each did, so that checking them afterwards with
    that seed launches nothing (tests check the solution and the wrong answers this way; the sweep over 100
    seeds, in one launch). `timeout_s`: 180 s, and 2 s more per answer and seed beyond the first."""
    from helpers.train.distributed import launch

    seeds = [seed] if isinstance(seed, int) else list(seed)
    todo = {}
    for fn in answers:
        source = _source_of(fn)
        if any((source, s) not in _ALLREDUCE_RESULTS for s in seeds):
            todo[source] = fn.__name__
    if not todo:
        return
    if timeout_s is None:
        timeout_s = 180.0 + 2.0 * max(0, len(todo) * len(seeds) - 1)
    with tempfile.TemporaryDirectory(prefix="course-exercise-ddp-") as tmp:
        cands, out = Path(tmp) / "candidates.json", Path(tmp) / "results.json"
        cands.write_text(json.dumps([{"name": f"c{i}", "source": s, "function": f}
                                     for i, (s, f) in enumerate(todo.items())]))
        launch(script("exercise_ddp"),
               ["--candidates", str(cands), "--out", str(out), "--seed", ",".join(map(str, seeds))],
               nproc_per_node=PROCESSES, env={"OMP_NUM_THREADS": "1"}, timeout_s=timeout_s, echo=False)
        results = json.loads(out.read_text())
    by_seed = {str(seeds[0]): results} if len(seeds) == 1 else results
    for s in seeds:
        for source, result in zip(todo, by_seed[str(s)]):
            _ALLREDUCE_RESULTS[source, s] = result


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
        if any(e > 1e-5 for e in r.get("step_grad_errs", [])[1:]):
            _diagnose_steps(r)  # a step's gradients went wrong before the error: that is the first mistake
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
    if r.get("dtype") == "float64":  # buckets counted at 4 bytes an element: twice the cap in bytes
        fours = [sorted(2 * b for b in bucket_sizes([g // 2 for g in ready], cap, rule))
                 for rule in ("reach", "under")]
        if sent in fours:
            raise Wrong("bytes-per-element", f"with a float64 model (8 bytes per element) the messages were "
                        f"{sent} bytes with bucket_cap_bytes={cap}: buckets filled as if each element took 4 "
                        "bytes", "count a gradient's bytes as p.grad.numel() * p.grad.element_size(): 4 for "
                        "float32, 2 for bf16, 8 for float64")
    if r["calls_per_step"] >= r["n_params"]:
        raise Wrong("not-bucketed", f"{r['calls_per_step']} all-reduce calls per step for {r['n_params']} "
                    "parameters", "group gradients into buckets of bucket_cap_bytes: one call per bucket")
    in_elements = sent in (sorted(bucket_sizes(ready, cap * 4, "reach")),
                           sorted(bucket_sizes(ready, cap * 4, "under")))
    if sent == [total] and not in_elements:
        raise Wrong("cap-ignored", f"one all-reduce of all {total} bytes per step, with "
                    f"bucket_cap_bytes={cap}: the gradients make {len(want)} buckets of up to the cap",
                    "flush the bucket as soon as it holds bucket_cap_bytes, from the hook that filled it, "
                    "and start a new one")
    if in_elements and sent != [total]:
        raise Wrong("cap-in-elements", f"messages of {sent} bytes with bucket_cap_bytes={cap}: buckets of "
                    f"{cap} elements (4 bytes each), not bytes", "count a gradient's bytes: "
                    "p.grad.numel() * p.grad.element_size()")
    raise Wrong("buckets-off-cap", f"messages of {sent} bytes with bucket_cap_bytes={cap}; gradients of "
                f"{ready} bytes, filled in the order backward finished them, make buckets of {sorted(want)} "
                "bytes", "add each gradient's bytes to the bucket as its hook runs, and flush when the "
                "bucket reaches the cap (or before it would go over)")


def _diagnose_contract(r: dict[str, Any]) -> None:
    """What the workers saw of the contract: the model left as it was by attach_grad_allreduce; gradients in
    their parameters' dtype."""
    if r.get("attach_changed"):
        raise Wrong("input-changed", f"with a {r.get('dtype', 'float32')} model, {r['attach_changed']}",
                    "leave the model as you were given it: attach_grad_allreduce only registers hooks "
                    "(the training loop and the optimizer keep using the model's own parameters)")
    if r.get("grad_dtypes"):
        raise Wrong("output-dtype", f"after finish(), with a {r.get('dtype', 'float32')} model, "
                    f"{len(r['grad_dtypes'])} gradient(s) had another dtype than their parameter "
                    f"({r['grad_dtypes'][0]})", "write the averages into each param.grad in its own dtype: "
                    "p.grad.copy_(piece.view_as(p.grad)), not p.grad.data = piece")


def _diagnose_state(r: dict[str, Any]) -> None:
    left = r.get("state_left")
    if left:
        raise Wrong("state-left", f"what your closures keep between steps changed: after step "
                    f"{left['step']}, {left['what']} (with {r['world_size']} processes)",
                    "finish() must leave what the hooks keep as the step found it: clear the pending handles "
                    "and the bucket, and reset the byte count, each time; otherwise the next step starts "
                    "from what this one left")


def _diagnose_later_calls(r: dict[str, Any]) -> None:
    """The behaviour of every step after the first: overlap, no blocking, no wait in backward, the same
    messages as the first step's."""
    steps = r.get("steps_calls") or []
    if not steps:
        return
    first = steps[0]
    for k, sc in enumerate(steps[1:], start=2):
        if sc["during_backward"] == 0:
            raise Wrong("no-overlap", f"in step {k} no all-reduce started before backward finished (in step "
                        f"1, {first['during_backward']} did)", "every step must reduce from the hooks "
                        "during its own backward: keep the hooks registered, and let finish() leave them as "
                        "they were")
        if sc["blocking"]:
            raise Wrong("blocking", f"in step {k}, {sc['blocking']} all-reduce(s) during backward blocked it "
                        "(async_op=False)", "dist.all_reduce(flat, async_op=True) in every step")
        if sc["waited"]:
            raise Wrong("waited-in-backward", f"in step {k}, {sc['waited']} all-reduce(s) were waited for "
                        "during backward", "wait for the handles in finish(), after backward, in every step")
        if sc["bytes"] != first["bytes"]:
            raise Wrong("buckets-off-cap", f"in step {k} the messages were {sc['bytes']} bytes, in step 1 "
                        f"{first['bytes']}: the gradients are the same each step, so the buckets must be too",
                        "something the hooks count was not reset at the end of the step: the bucket and its "
                        "byte count start empty in every step")


def _diagnose_steps(r: dict[str, Any]) -> None:
    """The steps after the first, and the parameters they leave: right too?"""
    errs = r["step_grad_errs"]
    later = [i for i, e in enumerate(errs) if i > 0 and e > 1e-5]
    if later:
        raise Wrong("later-steps", f"the first step's gradients were averaged, step {later[0] + 1}'s were "
                    f"not (relative error {errs[later[0]]:.2g} against one process's on the whole batch, "
                    f"with {r['world_size']} processes)" + (f"; a later step then raised {r['error']}"
                                                             if r.get("error") else ""),
                    "every step must go through the same hooks and "
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
    for r in runs:  # float32 (the lesson's), then float64; in each, 2 processes first, then 3
        _diagnose_contract(r)
        _diagnose_allreduce(r)
        _diagnose_calls(r)
        _diagnose_steps(r)
        _diagnose_state(r)
        _diagnose_later_calls(r)
    r = runs[0]
    grads = max(e for run in runs for e in run["step_grad_errs"])
    params = max(run["max_param_err"] for run in runs)
    worlds = " and ".join(sorted({str(run["world_size"]) for run in runs}))
    return (f"{worlds} processes under torchrun, a float32 and a float64 model: in every step the gradients "
            "kept their dtype and the closures' state was the same at its end; "
            f"the gradients of every step equal one process's on the "
            f"whole batch (relative error ≤ {grads:.1g}), {r['calls_per_step']} all-reduces per step of "
            f"{sorted(c['bytes'] for c in r['calls'])} bytes for {r['n_params']} parameters "
            f"(bucket_cap_bytes={r['cap']}), {r['during_backward']} started during backward (async, waited "
            f"for in finish); the parameters after {r['steps']} SGD steps equal one process's (relative "
            f"error ≤ {params:.1g})")
