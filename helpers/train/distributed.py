"""Distributed training (lesson 07): join torchrun's process group, apply DDP or FSDP2 to an unchanged
model, print and log from rank 0, measure all-reduce overlap, and `launch` torchrun from a notebook.
Guide: docs/library/train.md#helperstraindistributed"""

from __future__ import annotations

import gc
import logging
import os
import queue
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Mapping, Sequence

import psutil
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.core import compat
from helpers.core.device import get_device

__all__ = ["DistEnv", "backend_for", "setup", "teardown", "apply_ddp", "apply_fsdp", "grad_sync", "is_main",
           "print0", "get_logger", "free_port", "torchrun_command", "launch", "LaunchResult", "LaunchError",
           "RANK_PREFIX", "Overlap", "comm_overlap", "is_sharded"]

RANK_PREFIX = "[rank{rank}]:"  # how `launch` prefixes each line a worker prints (its global rank)
_PREFIX_RE = re.compile(r"^\[rank(\d+)\]:")
_BACKENDS = {"cuda": "nccl", "cpu": "gloo"}  # NCCL talks GPU to GPU (NVLink, InfiniBand); gloo uses TCP


@dataclass(frozen=True)
class DistEnv:
    """Who this process is in the job, and where it computes (lesson 07)."""

    rank: int  # 0..world_size-1 over every machine
    local_rank: int  # 0..local_world_size-1 on this machine; picks the GPU
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str  # "nccl" or "gloo"
    distributed: bool  # False: a plain single process (no torchrun, no process group)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def backend_for(device: torch.device | str) -> str:
    """The collective backend for a device type: "nccl" for CUDA GPUs, "gloo" for CPUs (lesson 07)."""
    kind = torch.device(device).type
    if kind not in _BACKENDS:
        raise ValueError(f"no distributed backend chosen for device type {kind!r}; "
                         f"supported: {sorted(_BACKENDS)}")
    return _BACKENDS[kind]


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer; "
                         "launch with torchrun, which sets it") from None


def _pick_device(device: str, local_rank: int) -> torch.device:
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return get_device("cpu")
    if torch.cuda.is_available() and local_rank >= torch.cuda.device_count():
        raise ValueError(f"LOCAL_RANK={local_rank} but this machine has {torch.cuda.device_count()} GPU(s): "
                         "start at most one process per GPU (--nproc-per-node)")
    return get_device(f"cuda:{local_rank}")  # says why when there is no usable GPU


def _attempt_store(timeout_s: float) -> dist.Store | None:
    """torchrun's key-value store with a prefix per restart attempt, or None when not under torchrun."""
    # the store outlives a restart: without the prefix a restarted rank can read a dead peer's address
    # ("Connection refused"; pytorch/pytorch#135712, #167288)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    base = dist.TCPStore(os.environ["MASTER_ADDR"], _env_int("MASTER_PORT", 0), is_master=False,
                         timeout=timedelta(seconds=timeout_s))
    return dist.PrefixStore(f"course/attempt_{_env_int('TORCHELASTIC_RESTART_COUNT', 0)}", base)


def setup(device: str = "auto", timeout_s: float = 600.0) -> DistEnv:
    """Join the process group torchrun's environment describes (RANK, LOCAL_RANK, WORLD_SIZE...); without
    torchrun, one process (lesson 07)."""
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank, local_world = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", 1)
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} must lie in [0, WORLD_SIZE={world})")
    dev = _pick_device(device, local_rank)
    backend = backend_for(dev)
    launched = "RANK" in os.environ and "MASTER_ADDR" in os.environ  # torchrun (or Slurm + env) set these
    if launched and not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)  # before any CUDA work, so NCCL binds this process to its GPU
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s),
                                store=_attempt_store(timeout_s), rank=rank, world_size=world,
                                device_id=dev if dev.type == "cuda" else None)
    return DistEnv(rank, local_rank, world, local_world, dev, backend, distributed=launched)


def teardown() -> None:
    """Leave the process group once all ranks arrive (lesson 07). Drop your references to the wrapped model
    and optimizer first: their reference cycles are collected here, not at exit, where they can abort."""
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


# --- parallelism applied to an unchanged model (as torchtitan does) -----------------------------------

def apply_ddp(model: nn.Module, env: DistEnv, *, bucket_cap_mb: float = 25.0,
              stats: dict[str, int] | None = None) -> nn.Module:
    """Wrap `model` in DDP (lesson 07). `stats` counts the buckets handed to all-reduce:
    stats["allreduce_calls"] and stats["allreduce_bytes"]."""
    if not env.distributed:
        raise ValueError("DDP needs a process group: launch the script with torchrun")
    ddp = DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None,
              bucket_cap_mb=bucket_cap_mb)
    if stats is not None:
        stats.setdefault("allreduce_calls", 0)
        stats.setdefault("allreduce_bytes", 0)

        def counting_allreduce(state, bucket):  # (dict, GradBucket) -> Future; unannotated: DDP checks types
            buf = bucket.buffer()  # one flat bucket of gradients
            state["allreduce_calls"] += 1
            state["allreduce_bytes"] += buf.numel() * buf.element_size()
            return default_hooks.allreduce_hook(None, bucket)  # the default: divide by world, all-reduce

        ddp.register_comm_hook(stats, counting_allreduce)
    return ddp


def apply_fsdp(model: nn.Module, env: DistEnv, blocks: Sequence[nn.Module] | None = None, *,
               offload: bool = False) -> nn.Module:
    """FSDP2 (lessons 07, 10): shard each block (default `model.blocks`), then the root; each rank holds
    1/N of the parameters. `offload`: shards, gradients and optimizer step in the CPU's memory."""
    if not env.distributed:
        raise ValueError("FSDP needs a process group: launch the script with torchrun")
    blocks = list(blocks if blocks is not None else getattr(model, "blocks", []))
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no `blocks`: pass the layers to shard one by one "
                         "(e.g. model.bert.encoder.layer)")
    fully_shard = compat.fully_shard()
    mesh = init_device_mesh(env.device.type, (env.world_size,))
    policy = {}
    if offload:
        from torch.distributed.fsdp import CPUOffloadPolicy  # 0.5 s to import (2-core CPU): offload only

        policy["offload_policy"] = CPUOffloadPolicy(pin_memory=env.device.type == "cuda")
    for block in blocks:
        fully_shard(block, mesh=mesh, **policy)  # its parameters are all-gathered just before its forward
    fully_shard(model, mesh=mesh, **policy)
    # gradients are averaged over ranks, as one process over the whole batch would have them; torch 2.7's
    # gloo sums in the reduce-scatter where FSDP asks for the average, so each shard is divided after it
    compat.average_fsdp_gradients([*blocks, model], env.world_size)
    return model


def grad_sync(model: nn.Module, sync: bool) -> AbstractContextManager:
    """A context for one micro-step: without `sync`, gradients only accumulate locally (lesson 07)."""
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(sync)
        return nullcontext()
    if not sync and hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    return nullcontext()


# --- communication against computation, from a profile --------------------------------------------------

@dataclass(frozen=True)
class Overlap:
    """How a profiled step's gradient all-reduces sat against its backward pass (lesson 07)."""

    allreduces: int  # all-reduces run in the step (DDP: one per bucket)
    launched_in_backward: int  # all-reduce calls made (c10d::allreduce_) before backward's last op ended
    overlapped: int  # all-reduces that ran at least in part while backward was computing
    comm_s: float  # time at least one all-reduce was running (the union of their intervals)
    hidden_s: float  # of that time, while backward was computing too
    # c10d::allreduce_ calls made in the step (DDP: one per bucket), recorded on the thread that makes them:
    # unlike gloo's worker-thread events, a loaded machine cannot leave one outside the profiled window
    calls: int = 0

    @property
    def hidden_fraction(self) -> float:
        """The share of the communication time hidden behind backward (0 when there was none) (lesson 07)."""
        return self.hidden_s / self.comm_s if self.comm_s > 0 else 0.0


def _union(intervals: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _intersection(xs: Sequence[tuple[float, float]], ys: Sequence[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in xs for c, d in ys)  # ys disjoint (a union)


def comm_overlap(events: Sequence[object]) -> Overlap:
    """The overlap of all-reduces with backward in a profiled step's events (lesson 07)."""
    # gloo: its worker threads' gloo:all_reduce events against backward's evaluate_function ops; a GPU:
    # NCCL's all-reduce kernels against every other kernel. The c10d::allreduce_ calls are judged against
    # backward's ops on both: when DDP asks, not when the bytes move. Event times are µs.
    def span(e: object) -> tuple[float, float]:
        return e.time_range.start, e.time_range.end  # type: ignore[attr-defined]

    def on_gpu(e: object) -> bool:
        return "cuda" in str(getattr(e, "device_type", "")).lower()

    def name(e: object) -> str:
        return str(getattr(e, "name", "")).lower()

    gpu = [e for e in events if on_gpu(e)]
    comm = [e for e in gpu if "nccl" in name(e) and "allreduce" in name(e).replace("_", "")]
    if comm:
        compute = [e for e in gpu if "nccl" not in name(e)]
    else:
        comm = [e for e in events if name(e) == "gloo:all_reduce"]
        compute = [e for e in events if name(e).startswith("autograd::engine::evaluate_function")]
    compute_u = _union([span(e) for e in compute])
    backward_end = max((span(e)[1] for e in events
                        if name(e).startswith("autograd::engine::evaluate_function")), default=float("-inf"))
    calls = [e for e in events if name(e) == "c10d::allreduce_"]
    return Overlap(allreduces=len(comm), launched_in_backward=sum(span(e)[0] < backward_end for e in calls),
                   overlapped=sum(_intersection([span(e)], compute_u) > 0 for e in comm),
                   comm_s=sum(b - a for a, b in _union([span(e) for e in comm])) / 1e6,
                   hidden_s=_intersection(_union([span(e) for e in comm]), compute_u) / 1e6, calls=len(calls))


# --- rank 0 ---------------------------------------------------------------------------------------------

def _rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return _env_int("RANK", 0)


def is_main() -> bool:
    """True on global rank 0 (and in a plain single process) (lesson 07)."""
    return _rank() == 0


def print0(*args: object, **kwargs: object) -> None:
    """`print` on rank 0 only, flushed at once so the line reaches torchrun's log at once (lesson 07)."""
    if is_main():
        print(*args, **{"flush": True, **kwargs})  # type: ignore[arg-type]


def get_logger(name: str = "course", all_ranks: bool = False) -> logging.Logger:
    """A logger writing INFO on rank 0 (every rank with `all_ranks`), warnings everywhere (lesson 07)."""
    logger = logging.getLogger(name)
    rank = _rank()
    if not any(getattr(h, "_course_handler", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler._course_handler = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter(f"%(asctime)s rank {rank} %(levelname)s %(message)s",
                                               datefmt="%H:%M:%S"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO if (all_ranks or rank == 0) else logging.WARNING)
    return logger


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it), for a rendezvous endpoint (lesson 07)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def torchrun_command(script: str | Path, args: Sequence[str] = (), *, nproc_per_node: int = 2,
                     nnodes: int = 1, rdzv_endpoint: str | None = None, rdzv_id: str = "course",
                     rdzv_conf: str | None = None, max_restarts: int = 0, monitor_interval: float = 0.1,
                     log_dir: str | Path | None = None, local_addr: str | None = None,
                     extra: Sequence[str] = ()) -> list[str]:
    """The torchrun command: one machine (--standalone) or `nnodes` meeting at `rdzv_endpoint` (lesson 07)."""
    if nproc_per_node < 1 or nnodes < 1 or max_restarts < 0:
        raise ValueError(f"need nproc_per_node >= 1, nnodes >= 1, max_restarts >= 0; got {nproc_per_node}, "
                         f"{nnodes}, {max_restarts}")
    if nnodes > 1 and not rdzv_endpoint:
        raise ValueError(f"nnodes={nnodes} needs rdzv_endpoint='host:port', the address every node can "
                         "reach (the first node's), for the c10d rendezvous")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}",
           f"--max-restarts={max_restarts}", f"--monitor-interval={monitor_interval}"]
    if rdzv_endpoint:
        cmd += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                f"--rdzv-id={rdzv_id}"]
        if rdzv_conf:
            cmd.append(f"--rdzv-conf={rdzv_conf}")
    else:
        cmd.append("--standalone")  # a private rendezvous on a free local port
    if local_addr:
        cmd.append(f"--local-addr={local_addr}")
    if log_dir is not None:  # each rank's stdout+stderr go to files there and, prefixed, to our stdout
        cmd += [f"--log-dir={log_dir}", "--tee=3"]
    return cmd + [*map(str, extra), str(script), *map(str, args)]


@dataclass
class LaunchResult:
    """What a finished torchrun printed, line by line, and how it ended (lesson 07)."""

    command: list[str]
    returncode: int
    seconds: float
    lines: list[str] = field(repr=False)

    def rank_lines(self, rank: int) -> list[str]:
        """The lines printed by one global rank, without their prefix (lesson 07)."""
        prefix = RANK_PREFIX.format(rank=rank)
        return [line[len(prefix):] for line in self.lines if line.startswith(prefix)]


class LaunchError(RuntimeError):
    """torchrun failed (or timed out); the message holds the failing rank's last lines (lesson 07)."""

    def __init__(self, message: str, result: LaunchResult) -> None:
        super().__init__(message)
        self.result = result


def _failed_ranks(lines: Sequence[str]) -> list[int]:
    # global ranks named in torchrun's failure summary ("rank : 1 (local_rank: 1)"), root cause first
    found, root = [], None
    for i, line in enumerate(lines):
        if m := re.search(r"^\s*rank\s*:\s*(\d+)", line):
            found.append(int(m.group(1)))
            if any("Root Cause" in earlier for earlier in lines[max(0, i - 4):i]):
                root = int(m.group(1))
    ordered = ([root] if root is not None else []) + found
    return list(dict.fromkeys(ordered))


def _kill_tree(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    # the workers run in sessions of their own: SIGTERM each, then SIGKILL
    try:
        workers = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        workers = []
    for p in [proc, *workers]:
        try:
            p.terminate()
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    try:
        proc.wait(timeout=grace_s)  # reaped by subprocess, which keeps its exit code
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace_s)
    _, alive = psutil.wait_procs(workers, timeout=grace_s)  # not our children: polled, not reaped
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def launch(script: str | Path, args: Sequence[str] = (), *, nproc_per_node: int = 2, nnodes: int = 1,
           rdzv_endpoint: str | None = None, rdzv_conf: str | None = None, max_restarts: int = 0,
           env: Mapping[str, str] | None = None, timeout_s: float = 300.0, echo: bool = True,
           tail: int = 25, extra_torchrun_args: Sequence[str] = ()) -> LaunchResult:
    """Run `torchrun script args` in a subprocess, printing every rank's lines live ("[rankN]:") (lesson 07);
    raise `LaunchError` with the failing rank's last `tail` lines if it fails or runs past `timeout_s`."""
    if not Path(script).is_file():
        raise ValueError(f"no script at {script!r}; pass the path of a Python file for torchrun to run")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    with tempfile.TemporaryDirectory(prefix="course-torchrun-") as log_dir:
        cmd = torchrun_command(script, args, nproc_per_node=nproc_per_node, nnodes=nnodes,
                               rdzv_endpoint=rdzv_endpoint, rdzv_conf=rdzv_conf, max_restarts=max_restarts,
                               log_dir=log_dir, extra=extra_torchrun_args)
        # the workers import the same `helpers` (and `course`) as this process, installed or not
        package_root = str(Path(__file__).resolve().parents[2])
        python_path = os.pathsep.join(p for p in (package_root, (env or {}).get("PYTHONPATH",
                                                  os.environ.get("PYTHONPATH", ""))) if p)
        full_env = {**os.environ, **(env or {}), "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1",
                    "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": RANK_PREFIX.replace("{rank}", "${rank}")}
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1, env=full_env, start_new_session=True)
        lines: list[str] = []
        recent: deque[str] = deque(maxlen=400)
        q: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:  # a thread, so the main loop can watch the clock while lines arrive
            assert proc.stdout is not None
            for line in proc.stdout:
                q.put(line.rstrip("\n"))
            q.put(None)

        threading.Thread(target=pump, daemon=True).start()
        timed_out = False
        try:  # torchrun's output ends (EOF) when it exits
            while True:
                left = timeout_s - (time.perf_counter() - start)
                if left <= 0:
                    timed_out = True
                    break
                try:
                    line = q.get(timeout=min(left, 1.0))
                except queue.Empty:
                    continue
                if line is None:
                    proc.wait(timeout=max(1.0, timeout_s - (time.perf_counter() - start)))
                    break
                lines.append(line)
                recent.append(line)
                if echo:
                    print(line, flush=True)
        finally:  # a timeout, or the learner interrupting the cell: leave no process behind
            if proc.poll() is None:
                _kill_tree(proc)
        rc = proc.wait()
    result = LaunchResult(cmd, rc, time.perf_counter() - start, lines)
    if timed_out or rc != 0:
        seen = sorted({int(m.group(1)) for line in lines if (m := _PREFIX_RE.match(line))})
        ranks = [] if timed_out else _failed_ranks(lines)
        if timed_out:
            head = f"torchrun timed out after {timeout_s:.0f} s and was stopped; ranks that printed: {seen}"
        else:
            head = f"torchrun exited with code {rc}; " + (
                f"first failing rank: {ranks[0]}" + (f"; also stopped: {ranks[1:]}" if ranks[1:] else "")
                if ranks else "no rank named in its summary")
        parts = [head]
        for r in (ranks or seen)[:2]:
            own = result.rank_lines(r)[-tail:]
            parts.append(f"--- last {len(own)} lines of rank {r} ---\n" + "\n".join(own))
        if not (ranks or seen):
            parts.append("--- last lines ---\n" + "\n".join(list(recent)[-tail:]))
        raise LaunchError("\n".join(parts), result)
    return result


def is_sharded(model: nn.Module) -> bool:
    """Whether FSDP2 shards `model` (DTensor parameters): its checkpoint is then a DCP folder (lessons 07,
    08)."""
    if hasattr(model, "set_requires_gradient_sync"):  # an FSDPModule
        return True
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor  # 0.5 s to import (2-core CPU), and needs distributed

    return any(isinstance(p, DTensor) for p in model.parameters())
