"""Lesson 07's set-up and plumbing (`07_distributed`): the sizes of the multi-process runs (CPU processes on
gloo, or GPUs), the launches of the training script, the lesson's checks and its tables.

Each `check_*` raises AssertionError naming what is wrong and prints one line saying what it checked.
The tables are `helpers.core.tables.Table`s; the figures come from `course.plots`.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Sequence
from typing import Any

import torch
from matplotlib.figure import Figure

from course.claims import CLAIMS
from course.lessons import LessonSetup
from course.paths import output_dir, script
from course.plots import bar_chart
from course.profile import get_profile, pick
from course.sizing import Size, fit_sizes
from course.verdicts import AtLeast, AtMost, MeasuredTable
from helpers.core.device import get_device
from helpers.core.precision import training_precision
from helpers.core.tables import Table
from helpers.core.timing import LoadProbe, busy
from helpers.measure.memory import estimate_training_memory
from helpers.model.models import SmallTransformer, TransformerConfig
from helpers.train.distributed import LaunchResult, Overlap, free_port, launch

__all__ = ["SIZES", "PARAM_RTOL", "PARAM_ATOL", "LOSS_RTOL", "script_args", "setup", "max_diffs",
           "sent_per_rank", "check_same_training", "check_ddp_run", "check_no_sync", "check_overlap",
           "check_fsdp", "check_fault", "check_two_nodes", "launch_two_nodes", "gpu_run", "loss_table",
           "no_sync_table", "traffic_table", "overlap_table", "model_state", "model_state_table",
           "model_state_chart", "fsdp_traffic_table", "scaling_table", "scaling_chart", "fault_table",
           "summary_table"]

SIZES = {"GPU_BATCH": Size(full=16, smoke=8, floor=2)}  # sequences per GPU per step

# fp32: rounding differences grow slowly with the number of steps; a wrong average (a sum, a missing
# micro-step) would move the weights by about lr x gradient per step, orders of magnitude more
PARAM_RTOL, PARAM_ATOL = 1e-4, 1e-5
LOSS_RTOL = 1e-5
FINAL_LOSS_RTOL = 1e-6  # a resumed run, or two torchrun nodes, against the undisturbed run's final loss

Summary = dict[str, Any]  # rank 0's JSON summary of a run (course/scripts/train_ddp.py), plus launch facts


def script_args(sizes: dict[str, int]) -> list[str]:
    """train_ddp.py's model flags from a dict of sizes: ["--vocab", "256", ...] (lesson 07)."""
    return [arg for k, v in sizes.items() for arg in (f"--{k.replace('_', '-')}", str(v))]


def setup(profile: str | None = None, *, nproc: int = 2, accum: int = 2) -> LessonSetup:
    """Lesson 07's sizes on this device; prints what it chose and why (lesson 07)."""
    profile = get_profile(profile)
    device = get_device()
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    steps = pick(profile, smoke=8, full=30)  # optimizer steps per run
    global_batch = pick(profile, smoke=16, full=32)  # sequences per optimizer step, summed over processes
    micro = global_batch // (nproc * accum)  # sequences per forward pass, the same in every run
    # the small causal Transformer of the CPU runs, on a synthetic learnable task
    model = pick(profile, smoke=dict(vocab=256, seq_len=64, d_model=64, n_layers=2, n_heads=4),
                 full=dict(vocab=1024, seq_len=128, d_model=128, n_layers=4, n_heads=4))
    # the GPU cells: BERT-base-sized layers at full size
    gpu_model = pick(profile, smoke=model,
                     full=dict(vocab=30522, seq_len=512, d_model=768, n_layers=12, n_heads=12))
    with torch.device("meta"):  # the GPU cells' model shapes, for the estimate: nothing is allocated
        shape = SmallTransformer(TransformerConfig(
            vocab_size=gpu_model["vocab"], max_len=gpu_model["seq_len"], d_model=gpu_model["d_model"],
            n_layers=gpu_model["n_layers"], n_heads=gpu_model["n_heads"], causal=True))
    estimates = {  # per GPU, fp32 (the largest precision), DDP's gradient buckets beside the gradients
        "DDP, one rank": lambda s: estimate_training_memory(
            shape, s["GPU_BATCH"], gpu_model["seq_len"]).peak + 4 * shape.num_params()}
    fit = fit_sizes(SIZES, estimates, shrink=["GPU_BATCH"], profile=profile, device=device,
                    notes=[f"{gpus} GPU(s); CPU runs: {nproc} gloo processes, {steps} steps, global batch "
                           f"{global_batch} = micro-batch {micro} x {accum} micro-steps x {nproc} processes"])
    print(fit.line())
    return LessonSetup(
        PROFILE=fit.profile, DEVICE=device, FIT=fit, GPUS=gpus, STEPS=steps, GLOBAL_BATCH=global_batch,
        MICRO=micro, NPROC=nproc, ACCUM=accum, MODEL=model, GPU_MODEL=gpu_model,
        MODEL_ARGS=script_args(model), GPU_ARGS=script_args(gpu_model), **fit.sizes,
        # the flags every CPU run shares: steps, batches, the model (the optimizer comes from the lesson)
        CPU_ARGS=["--steps", str(steps), "--global-batch", str(global_batch), "--micro-batch", str(micro),
                  "--log-every", str(max(1, steps // 4)), "--device", "cpu", *script_args(model)],
        FAULT_AT=steps // 2 + 1,  # the fault-tolerance run's rank 1 is killed with SIGKILL in this step
        TIMEOUT_S=pick(fit.profile, smoke=240, full=900),  # per launch: a hung run is stopped and reported
        CORES=os.cpu_count() or 1,
        SCRIPT=script("train_ddp"),  # the one training script every step launches
        WORK=output_dir("07_distributed", fresh=True),  # JSON summaries, parameters, checkpoints of this run
        LOAD=LoadProbe(children=True).start())  # what other programs take of the CPUs from here on: summary


# --- launching the script ---------------------------------------------------------------------------------

def launch_two_nodes(S: LessonSetup, opt_args: Sequence[str]) -> tuple[dict[int, LaunchResult], Summary]:
    """Two torchruns on this machine, one process each, as on two machines: node 0 hosts the c10d
    rendezvous on 127.0.0.1 (lesson 07). Returns each node's launch and rank 0's summary."""
    port = free_port()
    nodes: dict[int, Any] = {}

    def start_node(i: int) -> None:
        try:
            nodes[i] = launch(S.SCRIPT, [*S.CPU_ARGS, *opt_args, "--out", str(S.WORK / f"node{i}.json")],
                              nproc_per_node=1, nnodes=2, rdzv_endpoint=f"127.0.0.1:{port}",
                              rdzv_conf=f"is_host={int(i == 0)}",
                              extra_torchrun_args=["--local-addr=127.0.0.1"],
                              env={"OMP_NUM_THREADS": str(max(1, S.CORES // 2))}, timeout_s=S.TIMEOUT_S)
        except Exception as err:  # re-raised below, in the caller's thread
            nodes[i] = err

    threads = [threading.Thread(target=start_node, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        if isinstance(nodes[i], Exception):
            raise nodes[i]
    summary_file = next(p for i in range(2) if (p := S.WORK / f"node{i}.json").exists())
    return nodes, json.loads(summary_file.read_text())


def gpu_run(S: LessonSetup, name: str, nproc: int, extra: Sequence[str] = ()) -> Summary:
    """The script on `nproc` GPUs with NCCL, AdamW and the course's precision for this GPU
    (`helpers.core.precision.training_precision`: bf16 from compute capability 8.0, fp16 with a GradScaler on
    a
    T4); rank 0's summary (lesson 07)."""
    precision = training_precision("cuda")[0]
    out = S.WORK / f"{name}.json"
    launch(S.SCRIPT, ["--steps", str(max(S.STEPS, 20)), "--global-batch", str(S.GPU_BATCH * nproc),
                      "--micro-batch", str(S.GPU_BATCH), "--device", "cuda", "--precision", precision,
                      "--log-every", "10", *S.GPU_ARGS, *extra, "--out", str(out)],
           nproc_per_node=nproc, timeout_s=S.TIMEOUT_S)
    return json.loads(out.read_text())


# --- numbers read from the summaries ----------------------------------------------------------------------

def max_diffs(a: dict, b: dict) -> dict[str, float]:
    """Largest absolute difference of each parameter tensor between two state dicts (lesson 07)."""
    return {k: (a[k] - b[k]).abs().max().item() for k in a}


def sent_per_rank(s: Summary) -> float:
    """Median bytes rank 0 wrote to its sockets per step (gloo's all-reduces, plus a tiny loss all-reduce);
    NaN where the OS does not count them (the script reads Linux's /proc/self/io) (lesson 07)."""
    value = s["per_rank"][0]["wire_bytes_per_step"]
    return float("nan") if value is None else float(value)


def _ring(s: Summary) -> float:
    """A ring all-reduce's bytes sent per process and step: 2(N-1)/N x the gradient bytes."""
    n = s["world_size"]
    return 2 * (n - 1) / n * s["grad_bytes"]


def _overlaps(s: Summary) -> list[Overlap]:
    return [Overlap(**r["overlap"]) for r in s["per_rank"]]


def model_state(ddp: Summary, fsdp: Summary) -> dict[str, float]:
    """KiB of parameters + gradients + optimizer state each rank holds, "DDP rank 0" ... (lesson 07)."""
    kinds = ("params", "grads", "optimizer")
    return {f"{name} rank {r['rank']}": sum(r["model_state_bytes"][k] for k in kinds) / 1024
            for name, s in (("DDP", ddp), ("FSDP", fsdp)) for r in s["per_rank"]}


def _fsdp_ratio(ddp: Summary, fsdp: Summary) -> float:
    totals = model_state(ddp, fsdp)
    return max(v for k, v in totals.items() if k.startswith("FSDP")) / totals["DDP rank 0"]


# --- checks -----------------------------------------------------------------------------------------------

def check_same_training(a: Summary, b: Summary, what: str) -> None:
    """Same loss at every step and the same final parameters, within fp32's tolerances (lesson 07)."""
    if len(a["losses"]) != len(b["losses"]):
        raise AssertionError(f"{what}: {len(a['losses'])} steps vs {len(b['losses'])}")
    for step, (x, y) in enumerate(zip(a["losses"], b["losses"]), start=a["first_step"]):
        assert abs(x - y) <= LOSS_RTOL * abs(y), f"{what}: loss differs at step {step}: {x} vs {y}"
    if set(a["params_sd"]) != set(b["params_sd"]):
        raise AssertionError(f"{what}: the runs have different parameters")
    for k in a["params_sd"]:
        try:
            torch.testing.assert_close(a["params_sd"][k], b["params_sd"][k], rtol=PARAM_RTOL, atol=PARAM_ATOL)
        except AssertionError as err:
            raise AssertionError(f"{what}: parameter {k} differs: {err}") from None
    worst = max(max_diffs(a["params_sd"], b["params_sd"]).values())
    print(f"{what}: same loss at every step (rel. tol. {LOSS_RTOL:g}); "
          f"largest parameter difference {worst:.2e}")


def check_ddp_run(ddp: Summary, single: Summary, S: LessonSetup) -> None:
    """The DDP run is the one asked for (NPROC processes, ACCUM micro-steps each, no_sync on by default),
    the single process ran all NPROC x ACCUM micro-steps, and the model learned (lesson 07)."""
    got = (ddp["world_size"], ddp["accum"], ddp["no_sync"])
    assert got == (S.NPROC, S.ACCUM, True), (
        f"DDP ran (processes, micro-steps, no_sync) = {got}, expected ({S.NPROC}, {S.ACCUM}, True): "
        "no_sync is the script's default")
    assert single["accum"] == S.NPROC * S.ACCUM, (
        f"one process ran {single['accum']} micro-steps per step, expected {S.NPROC * S.ACCUM}")
    first, last = single["losses"][0], single["losses"][-1]
    assert last < first, f"the model did not learn: loss {first:.4f} -> {last:.4f}"
    print(f"DDP: {S.NPROC} processes x {S.ACCUM} micro-steps, no_sync on (the default); one process: "
          f"{single['accum']} micro-steps; the loss fell from {first:.3f} to {last:.3f}")


def check_no_sync(ddp: Summary, ddp_sync: Summary, accum: int) -> None:
    """no_sync trains as syncing at every micro-step does, with one all-reduce per optimizer step instead of
    `accum`; each carries every gradient byte, so the bytes per step are the gradient's once, and `accum`
    times that without no_sync (lesson 07)."""
    check_same_training(ddp, ddp_sync, "no_sync vs all-reduce every micro-step")
    calls = (ddp["allreduce_calls_per_step"], ddp_sync["allreduce_calls_per_step"])
    assert calls == (1, accum), f"all-reduce calls per step (no_sync, sync every micro-step) = {calls}, " \
                                f"expected (1, {accum})"
    sent, synced = ddp["allreduce_bytes_per_step"], ddp_sync["allreduce_bytes_per_step"]
    grad = ddp["grad_bytes"]
    assert sent == grad == synced // accum, (
        f"bytes to all-reduce per step: {sent} with no_sync, {synced} without; gradient {grad} bytes: "
        f"expected the gradient once with no_sync and {accum} times without")
    print(f"no_sync: 1 all-reduce of {grad:,} bytes per step (the whole gradient); "
          f"syncing every micro-step: {accum} of them")


def check_overlap(ddp: Summary, ddp_buckets: Summary) -> float:
    """Buckets of 25 MiB (the script's --bucket-cap-mb) hold this model's gradients in one all-reduce, small
    buckets in several, and some of the small buckets' communication ran while backward was computing
    (lesson 07). Returns the largest share hidden behind backward on one rank, with the small buckets. The
    small buckets' run must train as the default's: the same sums, grouped otherwise."""
    check_same_training(ddp_buckets, ddp, "0.05 MB buckets vs one bucket")
    one, small = _overlaps(ddp), _overlaps(ddp_buckets)
    # the structure, decided by DDP (not by the machine's load): the calls DDP made, one per bucket (gloo's
    # own events of an all-reduce can end after the profiled window on a loaded machine)
    assert all(o.calls == 1 for o in one) and all(o.calls >= 3 for o in small), (
        f"all-reduces per profiled step: {[o.calls for o in one]} with one bucket, "
        f"{[o.calls for o in small]} with small buckets (expected 1 each, and 3 or more)")
    # the effect, measured
    assert max(o.hidden_s for o in small) > 0, "no all-reduce ran beside backward: DDP's overlap was not seen"
    hidden = max(o.hidden_fraction for o in small)
    print(f"one bucket: one all-reduce per rank; {small[0].calls} small buckets: up to {hidden:.0%} of "
          "their communication hidden behind backward")
    return hidden


def check_fsdp(fsdp: Summary, single: Summary, ddp: Summary) -> float:
    """FSDP trains as one process does, and its largest rank holds less model state than a DDP rank;
    returns their ratio (lesson 07)."""
    check_same_training(fsdp, single, f"FSDP ({fsdp['world_size']} processes) vs 1 process")
    ratio = _fsdp_ratio(ddp, fsdp)
    assert ratio < 1, (f"the largest FSDP rank holds {ratio:.2f}x a DDP rank's model state: FSDP should hold "
                       "less")
    print(f"the largest FSDP rank holds {ratio:.2f}x the model state of a DDP rank "
          f"(1/N = {1 / fsdp['world_size']:.2f})")
    return ratio


def check_fault(fault: Summary, ddp: Summary, S: LessonSetup, ckpt_every: int) -> int:
    """Rank 1 died in step FAULT_AT, torchrun restarted the workers once, they resumed from the last
    checkpoint written and trained the later steps once each, to the undisturbed run's parameters and final
    loss (lesson 07). Returns the completed steps that were redone."""
    result = fault["result"]
    assert any(f"simulated crash in step {S.FAULT_AT}" in line for line in result.rank_lines(1)), \
        f"rank 1 did not crash in step {S.FAULT_AT}"
    assert fault["attempt"] == 1, f"torchrun did not restart the workers (attempt {fault['attempt']})"
    rank0 = result.rank_lines(0)
    resume_at = next((i for i, line in enumerate(rank0) if line.startswith("resumed from")), len(rank0))
    saved = [int(line.split("(step ")[1].rstrip(")")) for line in rank0[:resume_at]
             if line.startswith("checkpoint saved")]
    assert saved and fault["resumed_from"] == saved[-1], (
        f"resumed from step {fault['resumed_from']}, but the last checkpoint written was {saved[-1:]}")
    lost = S.FAULT_AT - 1 - saved[-1]  # steps completed after the last checkpoint, redone after the restart
    assert 0 <= lost < ckpt_every, f"{lost} completed steps redone with a checkpoint every {ckpt_every}"
    # the restart trained the steps after its checkpoint, once each, to the weights of the undisturbed run
    assert fault["first_step"] == fault["resumed_from"] + 1, (
        f"the restart began at step {fault['first_step']}, not right after its checkpoint")
    assert len(fault["losses"]) == S.STEPS - fault["resumed_from"], (
        f"the restart trained {len(fault['losses'])} steps, expected {S.STEPS - fault['resumed_from']}")
    for k, v in fault["params_sd"].items():
        try:
            torch.testing.assert_close(v, ddp["params_sd"][k], rtol=PARAM_RTOL, atol=PARAM_ATOL)
        except AssertionError as err:
            raise AssertionError(f"the restarted run's {k} differs from the undisturbed run's: {err}") \
                from None
    assert math.isclose(fault["final_loss"], ddp["final_loss"], rel_tol=FINAL_LOSS_RTOL), (
        f"final loss {fault['final_loss']} after the restart, {ddp['final_loss']} undisturbed")
    print(f"rank 1 killed in step {S.FAULT_AT}; restarted once, resumed from step {fault['resumed_from']} "
          f"(the last checkpoint), {lost} completed step(s) redone; same parameters and final loss as the "
          "undisturbed run")
    return lost


def check_two_nodes(nodes: dict[int, LaunchResult], two_nodes: Summary, ddp: Summary) -> None:
    """Two torchrun nodes formed one world of two ranks, each node printed only its own worker's lines, and
    they trained as step 2's DDP run did (lesson 07)."""
    ranks = {r["rank"] for r in two_nodes["per_rank"]}
    assert two_nodes["world_size"] == 2 and ranks == {0, 1}, (
        f"world size {two_nodes['world_size']}, ranks {sorted(ranks)}: expected 2 ranks, 0 and 1")
    printed = sorted([r for r in range(2) if nodes[i].rank_lines(r)] for i in range(2))
    assert printed == [[0], [1]], f"ranks printed by each node: {printed}, expected one rank each"
    assert math.isclose(two_nodes["final_loss"], ddp["final_loss"], rel_tol=FINAL_LOSS_RTOL), (
        f"final loss {two_nodes['final_loss']} on two nodes, {ddp['final_loss']} in step 2's DDP run")
    print(f"two torchrun nodes: world size 2, rank 0 on one node and rank 1 on the other; final loss "
          f"{two_nodes['final_loss']:.6f}, as step 2's DDP run ({ddp['final_loss']:.6f})")


# --- tables and figures -----------------------------------------------------------------------------------

def loss_table(single: Summary, ddp: Summary) -> Table:
    """The training loss per step, one process beside DDP (lesson 07)."""
    table = Table(["step", "loss, 1 process", f"loss, DDP x{ddp['world_size']}", "difference"],
                  title="Training loss per step")
    steps = len(single["losses"])
    for i in range(0, steps, max(1, steps // 8)):
        table.add(i + 1, f"{single['losses'][i]:.7f}", f"{ddp['losses'][i]:.7f}",
                  abs(single["losses"][i] - ddp["losses"][i]))
    return table


def no_sync_table(ddp: Summary, ddp_sync: Summary) -> Table:
    """All-reduce calls, bytes and step time with and without no_sync (lesson 07)."""
    table = Table(["variant", "all-reduce calls / step", "bytes to all-reduce / step",
                   "bytes sent / rank / step", "median step ms"],
                  title=f"DDP x{ddp['world_size']}, {ddp['accum']} micro-steps per optimizer step")
    for name, s in (("no_sync (default)", ddp), ("sync every micro-step", ddp_sync)):
        table.add(name, s["allreduce_calls_per_step"], float(s["allreduce_bytes_per_step"]), sent_per_rank(s),
                  s["median_step_s"] * 1e3)
    return table


def traffic_table(ddp: Summary) -> Table:
    """Bytes one process sends per step: the gradient, the claim, the ring formula, measured (lesson 07)."""
    grad = ddp["grad_bytes"]
    table = Table(["quantity", "bytes per process per step", "x gradient bytes"],
                  title=f"All-reduce traffic, {ddp['world_size']} processes, {ddp['params']:,} parameters")
    for name, b in (("gradient (fp32)", grad), ("claim: half the parameter count", 0.5 * ddp["params"] * 4),
                    ("ring all-reduce: 2(N-1)/N x gradient", _ring(ddp)),
                    ("measured: bytes written by rank 0", sent_per_rank(ddp))):
        table.add(name, float(b), b / grad)
    return table


def overlap_table(ddp: Summary, ddp_buckets: Summary) -> Table:
    """Each rank's profiled all-reduces against its backward pass, for both bucket sizes (lesson 07)."""
    table = Table(["buckets of", "rank", "all-reduces", "ran beside backward", "communication ms",
                   "hidden behind backward ms", "hidden"],
                  title="Step 2's all-reduces against its backward pass")
    for s in (ddp, ddp_buckets):
        for r, o in zip(s["per_rank"], _overlaps(s)):
            table.add(f"{s['bucket_cap_mb']:g} MB", r["rank"], o.allreduces, o.overlapped, o.comm_s * 1e3,
                      o.hidden_s * 1e3, f"{o.hidden_fraction:.0%}")
    return table


def model_state_table(ddp: Summary, fsdp: Summary) -> Table:
    """Parameters, gradients and optimizer state each rank holds after the first step (lesson 07)."""
    table = Table(["run", "rank", "parameters KiB", "gradients KiB", "optimizer state KiB", "total KiB"],
                  title="Model state held by each rank (after the first step)")
    for name, s in (("DDP", ddp), ("FSDP", fsdp)):
        for r in s["per_rank"]:
            m = {k: v / 1024 for k, v in r["model_state_bytes"].items()}
            table.add(name, r["rank"], m["params"], m["grads"], m["optimizer"],
                      m["params"] + m["grads"] + m["optimizer"])
    return table


def model_state_chart(ddp: Summary, fsdp: Summary) -> Figure:
    """One bar per rank: the model state it holds, DDP beside FSDP (lesson 07)."""
    return bar_chart(model_state(ddp, fsdp), title=f"Model state per rank, DDP vs FSDP "
                     f"({ddp['world_size']} processes)", ylabel="model state (KiB)", xlabel="run and rank",
                     annotate="{:,.0f}")


def fsdp_traffic_table(ddp: Summary, fsdp: Summary) -> Table:
    """Bytes sent per step by DDP with no_sync and by FSDP, next to their textbook formulas (lesson 07)."""
    n, accum, grad = fsdp["world_size"], fsdp["accum"], ddp["grad_bytes"]
    # all-gathers in each micro-step's forward and backward, one reduce-scatter
    textbook = (2 * accum + 1) * (n - 1) / n * grad
    table = Table(["run", "bytes sent / rank / step", "x gradient bytes", "textbook x gradient bytes"],
                  title=f"Traffic per optimizer step ({accum} micro-steps, {n} processes)")
    table.add("DDP + no_sync", sent_per_rank(ddp), sent_per_rank(ddp) / grad, _ring(ddp) / grad)
    table.add("FSDP + no gradient sync", sent_per_rank(fsdp), sent_per_rank(fsdp) / grad, textbook / grad)
    return table


def scaling_table(single: Summary, ddp: Summary, fsdp: Summary) -> Table:
    """Throughput of one worker and of N, same global batch and micro-batch, and the scaling efficiency
    (lesson 07)."""
    n = ddp["world_size"]
    table = Table(["workers", "threads each", "tokens/s (all)", "tokens/s per process", "scaling efficiency"],
                  title="Throughput, same global batch, same micro-batch")
    for name, s in (("1", single), (f"{n} (DDP)", ddp), (f"{n} (FSDP)", fsdp)):
        table.add(name, s["threads_per_process"], s["tokens_per_s"], s["tokens_per_s_per_process"],
                  s["tokens_per_s"] / (s["world_size"] * single["tokens_per_s"]))
    return table


def scaling_chart(single: Summary, ddp: Summary, fsdp: Summary) -> Figure:
    """Tokens/s per process of one worker, DDP and FSDP, each bar's ratio to one worker (lesson 07)."""
    n = ddp["world_size"]
    return bar_chart({"1 worker": single["tokens_per_s_per_process"],
                      f"{n} workers (DDP)": ddp["tokens_per_s_per_process"],
                      f"{n} workers (FSDP)": fsdp["tokens_per_s_per_process"]},
                     title="Throughput per process (CPU, gloo)", ylabel="tokens/s per process", xlabel="run",
                     annotate="{:,.0f}", baseline="1 worker")


def fault_table(ddp: Summary, fault: Summary, S: LessonSetup, ckpt_every: int, lost: int) -> Table:
    """The undisturbed run beside the killed-and-restarted one (lesson 07)."""
    table = Table(["run", "attempts", "resumed from step", "completed steps redone", "final loss", "wall s"],
                  title=f"Rank 1 killed in step {S.FAULT_AT} of {S.STEPS}; checkpoints every {ckpt_every} "
                        "steps")
    table.add("undisturbed (step 2)", 1, 0, 0, f"{ddp['final_loss']:.7f}", ddp["launch_s"])
    table.add("killed and restarted", fault["attempt"] + 1, fault["resumed_from"], lost,
              f"{fault['final_loss']:.7f}", fault["launch_s"])
    return table


def summary_table(S: LessonSetup, runs: dict[str, Summary], overlap_hidden: float, lost: int,
                  gpu_results: dict[str, Any]) -> MeasuredTable:
    """"What we measured on this machine": this run's numbers next to the claims (lesson 07). `runs` holds
    the summaries "single", "ddp", "ddp_sync", "fsdp" and "fault". The timed claims (scaling, overlap) are
    "too busy to judge" where other programs took the CPUs while the lesson ran (S.LOAD,
    helpers.core.timing.busy's
    rule; the course's own processes count as its own)."""
    probe = getattr(S, "LOAD", None)
    state = busy(load=probe.read()) if probe is not None else None
    single, ddp, ddp_sync, fsdp, fault = (runs[k] for k in ("single", "ddp", "ddp_sync", "fsdp", "fault"))
    n = S.NPROC
    wire = not math.isnan(sent_per_rank(ddp))
    efficiency = ddp["tokens_per_s"] / (n * single["tokens_per_s"])
    summary = MeasuredTable(f"Lesson 07: claims vs this run ({n} processes)")
    worst = max(max_diffs(ddp["params_sd"], single["params_sd"]).values())
    summary.add("DDP vs 1 process: losses and parameters (checked in step 2)",
                f"same losses, parameters within {worst:.1e}",
                CLAIMS["ddp-averages"], verdict="holds")
    summary.add("bytes sent per rank and step / 'half the parameter count'",
                sent_per_rank(ddp) / (0.5 * ddp["params"] * 4) if wire else None,
                CLAIMS["ddp-traffic"], needs="Linux's /proc/self/io",
                why=f"{sent_per_rank(ddp) / _ring(ddp):.2f}x the ring formula 2(N-1)/N x the gradient")
    saving = 1 - sent_per_rank(ddp) / sent_per_rank(ddp_sync)
    summary.add("all-reduce calls per optimizer step with no_sync", ddp["allreduce_calls_per_step"],
                f"one, not {S.ACCUM}: no_sync skips the others", rule=AtMost(1),
                why=f"{saving:.0%} fewer bytes sent than syncing every micro-step" if wire else "")
    summary.add("all-reduce time hidden behind backward, 0.05 MB buckets (best rank; checked in step 4)",
                overlap_hidden, "DDP overlaps the all-reduce with backward (step 1)",
                verdict="holds" if overlap_hidden > 0 else "does not hold", busy=state,
                why="in buckets of 25 MiB, one bucket holds this model's gradients: nothing to overlap")
    summary.add("model state of the largest FSDP rank / a DDP rank", _fsdp_ratio(ddp, fsdp),
                f"~1/N = {1 / n:.2f}: at most 1.1/N", rule=AtMost(1.1 / n))
    shared = efficiency < 0.8 and not (state and state.too_busy)  # why it is low, on a quiet machine only
    summary.add(f"scaling efficiency, {n} CPU workers", efficiency,
                "N workers give ~N x the throughput: ≥ 0.8", rule=AtLeast(0.8), busy=state,
                why="the workers share this CPU (step 6)" if shared else "")
    summary.add(f"rank 1 killed in step {S.FAULT_AT}: resumed from step (checked in step 7)",
                fault["resumed_from"], "torchrun --max-restarts resumes from the last checkpoint",
                verdict="holds", why=f"{lost} completed step(s) redone, same final loss")
    for key, value in gpu_results.items():
        summary.add(f"GPU: {key}", value)
    if not any("efficiency" in key for key in gpu_results):
        summary.add("GPU: DDP scaling efficiency", None, "~N x the throughput on N GPUs: ≥ 0.8",
                    rule=AtLeast(0.8), needs="2 or more CUDA GPUs (step 9)")
    return summary
