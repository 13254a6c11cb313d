"""Train the course's small Transformer with DDP or FSDP2 on 1..N processes, launched by torchrun.

    python course/scripts/train_ddp.py --steps 20                                   # one plain process
    torchrun --standalone --nproc-per-node=2 course/scripts/train_ddp.py            # DDP, 2 processes
    torchrun --standalone --nproc-per-node=2 course/scripts/train_ddp.py --fsdp     # FSDP2 `fully_shard`
    torchrun --standalone --nproc-per-node=2 --max-restarts=1 course/scripts/train_ddp.py --ckpt-dir runs/ck

One global batch of `--global-batch` sequences per optimizer step, whatever the number of processes:
each rank runs `accum = global_batch / (micro_batch * world_size)` micro-steps. Gradients are averaged
so that the update equals one process training on the whole global batch (checked by the tests):
every micro-batch has the same number of tokens, so the mean over the global batch is the mean over
micro-steps (loss / accum) of the mean over ranks (DDP and FSDP divide by world_size).

The data is a learnable synthetic task from a seeded generator (arithmetic sequences: next token =
this token + a per-sequence stride, mod vocab), so runs are exactly repeatable and need no download.
On start, the script resumes from the newest checkpoint in `--ckpt-dir` (`helpers.train.checkpoint`: DDP, one
file rank 0 writes atomically; FSDP, a `torch.distributed.checkpoint` folder of every rank's shards).
The run's switches are one `helpers.train.runspec.RunSpec` (`--precision`, `--compile`, `--fused-adamw`,
`--activation-checkpointing`: its flags, `args.spec`), applied to the model before parallelism; parallelism
is applied to the prepared model by `helpers.train.distributed.apply_ddp` / `apply_fsdp`.

`--precision fp16` (a T4, Kaggle's 2xT4: fp16 tensor cores, no bf16 ones) trains with a GradScaler
(`spec.make_scaler`, `torch.amp.GradScaler`), for DDP and FSDP2 alike: under DDP every rank unscales the same
averaged gradients, so all skip an overflowed step together; under FSDP2 the gradients are DTensor shards and
DTensor's handler of the unscale op all-reduces the overflow flag over the mesh (torch >= 2.5,
torch/distributed/tensor/_dispatch.py `found_inf_reduce_handler`; torch's own FSDP2 scaler test uses
`torch.amp.GradScaler`). `ShardedGradScaler` is FSDP1's, for its flat plain-tensor shards. The test hook
COURSE_OVERFLOW_AT_STEP=k plants an overflow on rank 1 in step k (DDP: in its loss, before the all-reduce
spreads it; FSDP: in its own gradient shard, after the reduce-scatter): every rank must skip that step.

`--profile-step k` records step k with `torch.profiler` on every rank and reports how much of the gradient
all-reduce ran while backward was still computing (`helpers.train.distributed.comm_overlap`); `--trace-dir`
keeps each rank's trace (chrome://tracing, Perfetto).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DistributedSampler

from helpers.core.compat import exit_now
from helpers.measure.memory import peak_rss_bytes
from helpers.model.models import SmallTransformer, TransformerConfig
from helpers.train.checkpoint import is_due, resume_latest, save_step
from helpers.train.distributed import (
    DistEnv,
    apply_ddp,
    apply_fsdp,
    comm_overlap,
    print0,
    setup,
    teardown,
)
from helpers.train.loop import TrainStep, make_optimizer
from helpers.train.runspec import RunSpec, flag_parser, spec_flags, spec_from_arguments

FAULT_ENV = "COURSE_FAULT_AT_STEP"  # test hook: rank 1 SIGKILLs itself in this step, first attempt only
OVERFLOW_ENV = "COURSE_OVERFLOW_AT_STEP"  # test hook: rank 1's gradients overflow in this step (fp16)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = flag_parser(spec_flags(("precision", "compile", "fused_adamw", "activation_checkpointing")),
                    description=__doc__.split("\n")[0])  # the spec's flags: transformers.HfArgumentParser
    p.add_argument("--steps", type=int, default=20, help="optimizer steps in total")
    p.add_argument("--global-batch", type=int, default=16, help="sequences per optimizer step, all ranks")
    p.add_argument("--micro-batch", type=int, default=0, help="sequences per rank per micro-step "
                   "(0: global_batch / world_size, no accumulation)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--dataset-size", type=int, default=0, help="sequences (0: 8 global batches)")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                   help="adamw: helpers.train.loop.make_optimizer (fused where supported); sgd: SGD with "
                        "momentum "
                   "0.9, whose update is linear in the gradient (the tests compare parameters with it)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fsdp", action="store_true", help="shard with FSDP2 fully_shard instead of DDP")
    p.add_argument("--sync-every-micro-step", action="store_true",
                   help="all-reduce after every micro-step (turns off no_sync), for comparison")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP gradient bucket size")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--ckpt-dir", default="", help="resume from / save checkpoints here ('' = none)")
    p.add_argument("--ckpt-every", type=int, default=0, help="save every N steps and the last (0: never)")
    p.add_argument("--keep", type=int, default=2, help="checkpoints kept")
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--warmup-steps", type=int, default=2, help="steps left out of the throughput")
    p.add_argument("--out", default="", help="rank 0 writes a JSON summary here")
    p.add_argument("--save-params", default="", help="rank 0 saves the final full state_dict here")
    p.add_argument("--profile-step", type=int, default=0,
                   help="profile this step (1-based) and report the all-reduce's overlap with backward")
    p.add_argument("--trace-dir", default="", help="with --profile-step: each rank's trace goes here")
    args = p.parse_args(argv)
    if min(args.steps, args.global_batch, args.seq_len, args.vocab, args.keep) < 1 or args.micro_batch < 0:
        p.error("steps, global-batch, seq-len, vocab and keep must be positive, micro-batch >= 0")
    if args.ckpt_every < 0:
        p.error("--ckpt-every must be >= 0 (0: never)")
    if args.profile_step < 0 or args.profile_step > args.steps:
        p.error(f"--profile-step must be 0 (off) or a step 1..{args.steps}")
    args.spec = spec_from_arguments(args)  # the switches, nested: one RunSpec
    return args


# --- data: a seeded, learnable synthetic task ---------------------------------------------------------

def make_dataset(n: int, seq_len: int, vocab: int, seed: int) -> torch.Tensor:
    """(n, seq_len) int64 tokens: x[t] = (start + stride * t) mod vocab, stride in 1..7 per sequence."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    stride = torch.randint(1, 8, (n, 1), generator=g)
    return (start + stride * torch.arange(seq_len)) % vocab


class Batches:
    """Indices of micro-batch `m` of step `s` on this rank, reproducible from (seed, epoch) alone, so a
    resumed run reads exactly the data the lost run would have read."""

    def __init__(self, n: int, env: DistEnv, micro: int, accum: int, seed: int) -> None:
        # drop_last: every rank gets n // world samples; n is a multiple of the global batch (checked)
        self.sampler = DistributedSampler(range(n), num_replicas=env.world_size, rank=env.rank,
                                          shuffle=True, seed=seed, drop_last=True)
        self.micro, self.accum = micro, accum
        self.steps_per_epoch = len(self.sampler) // (micro * accum)
        self._epoch, self._indices = -1, []

    def __call__(self, step: int, m: int) -> list[int]:
        epoch, s = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self.sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
            self._epoch, self._indices = epoch, list(self.sampler)
        pos = (s * self.accum + m) * self.micro
        return self._indices[pos:pos + self.micro]


# --- optimizer ------------------------------------------------------------------------

def build_optimizer(model: nn.Module, kind: str, lr: float, weight_decay: float,
                    spec: RunSpec) -> torch.optim.Optimizer:
    """AdamW (helpers.train.loop.make_optimizer: no decay on biases and norms, fused as the spec says), or
    SGD.

    AdamW divides each gradient by its own running RMS: a weight whose true gradient is zero (the key
    bias: adding a constant to every score of a query leaves softmax unchanged) sees only rounding
    noise, and AdamW turns that noise into steps of about ±lr. Two runs that sum gradients in a
    different order then differ there by ~lr, though they train identically (same loss). SGD's update
    is linear in the gradient, so rounding differences stay rounding-sized: the tests compare with it.
    """
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)
    return make_optimizer(model, lr, weight_decay, fused=spec.fused_adamw)


# --- measurements ------------------------------------------------------------------------------------

def local_bytes(t: torch.Tensor) -> int:
    """Bytes this rank stores for `t` (its shard, for an FSDP DTensor)."""
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def model_state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    """Parameters, gradients and optimizer state held by this rank, in bytes."""
    params = list(model.parameters())
    return {"params": sum(local_bytes(p) for p in params),
            "grads": sum(local_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(local_bytes(v) for s in opt.state.values() for v in s.values()
                             if torch.is_tensor(v) and v.dim() > 0)}


def bytes_written() -> int | None:
    """Bytes this process has written to files and sockets so far (Linux /proc/self/io), else None."""
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        return None
    m = re.search(r"^wchar:\s*(\d+)", text, re.M)
    return int(m.group(1)) if m else None


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated GPU memory, or on a CPU the process's peak resident set (a coarser measure)."""
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else peak_rss_bytes()


def median(xs: list[float] | list[int]) -> float | None:
    """The middle value (upper median), or None for no values."""
    return sorted(xs)[len(xs) // 2] if xs else None


# --- training ------------------------------------------------------------------------------------------

def _plant_overflow_in_shard(model: nn.Module) -> None:
    """The test hook's FSDP half: an inf in this rank's own shard of the first gradient (a DTensor)."""
    for p in model.parameters():
        grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        if grad is not None and grad.numel():
            grad.view(-1)[0] = float("inf")
            return


@dataclasses.dataclass
class Faults:
    """The test hooks of the step about to run on this rank: `crash_in` > 0, this process SIGKILLs itself in
    that step (after the last forward pass); `overflow`, its gradients overflow (fp16's test)."""

    crash_in: int = 0
    overflow: bool = False


def make_step(model: nn.Module, opt: torch.optim.Optimizer, spec: RunSpec, env: DistEnv, *, no_sync: bool,
              scaler: torch.amp.GradScaler | None = None, fsdp: bool = False,
              faults: Faults | None = None) -> TrainStep:
    """The run's optimizer step, checked once: `helpers.train.loop.TrainStep`, the step `train` and lesson
    08's ladder run (TF32 around all of it, autocast around each forward pass and loss only, fp16's
    GradScaler; with `no_sync` gradients are averaged over ranks once, on the last micro-batch), no clipping;
    `faults`
    (read at every step) plants the test hooks' crash and overflow."""
    faults = faults if faults is not None else Faults()
    scaler = scaler if scaler is not None else torch.amp.GradScaler(env.device.type, enabled=False)

    def after_forward(i: int, n: int, loss: torch.Tensor) -> torch.Tensor:
        last = i == n - 1
        if faults.crash_in and last:
            print(f"rank {env.rank}: simulated crash in step {faults.crash_in} (SIGKILL)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if faults.overflow and last and not fsdp:
            loss = loss * float("inf")  # DDP's all-reduce spreads it to every rank
        return loss

    def before_update() -> None:
        if faults.overflow and fsdp:
            _plant_overflow_in_shard(model)  # only this rank's shard: the scaler must tell the others

    return TrainStep(model, opt, spec=spec, device=env.device, scaler=scaler, max_grad_norm=None,
                     sync_every_micro_batch=not no_sync, after_forward=after_forward,
                     before_update=before_update)


def one_step(model: nn.Module, opt: torch.optim.Optimizer, xs: list[torch.Tensor], spec: RunSpec,
             env: DistEnv, *, no_sync: bool, scaler: torch.amp.GradScaler | None = None, crash_in: int = 0,
             overflow: bool = False, fsdp: bool = False) -> torch.Tensor:
    """One optimizer step over the micro-batches `xs` (each (micro, T), the model trained as
    `model(input_ids=x, labels=x)`), through `make_step`: the mean loss over them (a device tensor). A loop
    makes its step once (`train_steps`); this is for one step alone."""
    step = make_step(model, opt, spec, env, no_sync=no_sync, scaler=scaler, fsdp=fsdp,
                     faults=Faults(crash_in, overflow))
    return step([{"input_ids": x, "labels": x} for x in xs]).loss


def mean_over_ranks(x: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """The mean of `x` over all ranks (gloo has no AVG: a sum, divided)."""
    if not env.distributed:
        return x
    dist.all_reduce(x, op=dist.ReduceOp.AVG if env.backend == "nccl" else dist.ReduceOp.SUM)
    return x if env.backend == "nccl" else x / env.world_size


def build(args: argparse.Namespace,
          env: DistEnv) -> tuple[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler, dict[str, int]]:
    """(model, optimizer, scaler, all-reduce stats): the small Transformer with the spec's switches, wrapped
    in DDP or FSDP2 as asked; the scaler is enabled for fp16 only (`RunSpec.make_scaler`)."""
    args.spec.check(env.device)
    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    cfg = TransformerConfig(vocab_size=args.vocab, max_len=args.seq_len, d_model=args.d_model,
                            n_heads=args.n_heads, n_layers=args.n_layers, causal=True)
    model: nn.Module = args.spec.apply(SmallTransformer(cfg).to(env.device))  # compile, checkpointing
    stats = {"allreduce_calls": 0, "allreduce_bytes": 0}
    if args.fsdp:
        if not env.distributed:
            raise ValueError("--fsdp needs a process group: launch with torchrun")
        model = apply_fsdp(model, env)
    elif env.distributed:
        model = apply_ddp(model, env, bucket_cap_mb=args.bucket_cap_mb, stats=stats)
    opt = build_optimizer(model, args.optimizer, args.lr, args.weight_decay, args.spec)
    return model, opt, args.spec.make_scaler(env.device), stats


def resume(args: argparse.Namespace, model: nn.Module, opt: torch.optim.Optimizer,
           scaler: torch.amp.GradScaler) -> int:
    """The step to start from: the newest checkpoint's in --ckpt-dir, else 0 (fp16: the scale comes back
    too: in the file for DDP, in each rank's own file of the sharded folder for FSDP)."""
    if not args.ckpt_dir:
        return 0
    Path(args.ckpt_dir).mkdir(parents=True, exist_ok=True)
    state = resume_latest(args.ckpt_dir, model, opt, scaler=scaler, sharded=args.fsdp, restore_rng=False,
                          log=print0)
    if state is None:
        return 0
    print0(f"resumed from {state['path'].name}: step {state['step']}")
    return state["step"]


def split(args: argparse.Namespace, env: DistEnv) -> tuple[int, int, int]:
    """(micro-batch, accumulation steps, dataset size), checked against the global batch."""
    world = env.world_size
    micro = args.micro_batch or args.global_batch // world
    if micro * world == 0 or args.global_batch % (micro * world):
        raise ValueError(f"--global-batch {args.global_batch} must be a multiple of micro-batch {micro} "
                         f"x world size {world}")
    n = args.dataset_size or 8 * args.global_batch
    if n % args.global_batch:
        raise ValueError(f"--dataset-size {n} must be a multiple of --global-batch {args.global_batch}")
    return micro, args.global_batch // (micro * world), n


def _profiler(device: torch.device) -> Any:
    """torch.profiler over one step: CPU ops (backward, gloo's all-reduce threads) and, on a GPU, kernels."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=acts)


def train_steps(args: argparse.Namespace, env: DistEnv, model: nn.Module, opt: torch.optim.Optimizer,
                scaler: torch.amp.GradScaler, stats: dict[str, int], start_step: int, *, micro: int,
                accum: int, n: int, attempt: int) -> dict[str, Any]:
    """Steps start_step..args.steps; what they measured: losses, step times, bytes written, state bytes, the
    GradScaler's scale after each step and the steps it skipped, the profiled step's overlap."""
    faults = Faults()  # the test hooks, set for each step below
    run_step = make_step(model, opt, args.spec, env, no_sync=not args.sync_every_micro_step, scaler=scaler,
                         fsdp=args.fsdp, faults=faults)  # checked once, here
    data = make_dataset(n, args.seq_len, args.vocab, args.seed).to(env.device)
    batches = Batches(n, env, micro, accum, args.seed)
    fault_at = int(os.environ.get(FAULT_ENV, "0") or 0)
    overflow_at = int(os.environ.get(OVERFLOW_ENV, "0") or 0)
    out: dict[str, Any] = {"losses": [], "step_s": [], "wire": [], "mem": {}, "scales": [], "skipped": [],
                           "overlap": None}
    model.train()
    for step in range(start_step, args.steps):
        prof = _profiler(env.device) if step + 1 == args.profile_step else contextlib.nullcontext()
        t0, w0 = time.perf_counter(), bytes_written()
        calls_before, bytes_before = stats["allreduce_calls"], stats["allreduce_bytes"]
        faults.crash_in = step + 1 if fault_at == step + 1 and env.rank == 1 and attempt == 0 else 0
        faults.overflow = overflow_at == step + 1 and env.rank == 1
        xs = [data[batches(step, m)] for m in range(accum)]  # x: (micro, T), trained as labels=x
        scale_before = scaler.get_scale()
        with prof:
            loss_sum = run_step([{"input_ids": x, "labels": x} for x in xs]).loss  # the mean over xs
            if env.device.type == "cuda":
                torch.cuda.synchronize(env.device)  # the profile holds the step's kernels to their end
        if step == start_step:  # gradients exist between backward and zero_grad: measure here
            out["mem"] = model_state_bytes(model, opt)
            stats["calls_per_step"] = stats["allreduce_calls"] - calls_before
            stats["bytes_per_step"] = stats["allreduce_bytes"] - bytes_before
        opt.zero_grad(set_to_none=True)
        out["losses"].append(mean_over_ranks(loss_sum, env).item())  # .item() waits: the step is done
        out["step_s"].append(time.perf_counter() - t0)
        out["scales"].append(scaler.get_scale())  # fp16: halved when the step was skipped; else 1.0
        if out["scales"][-1] < scale_before:
            out["skipped"].append(step + 1)
            print0(f"step {step + 1}: a gradient overflowed (inf/NaN), the GradScaler skipped the step and "
                   f"halved its scale to {out['scales'][-1]:g}")
        if step + 1 == args.profile_step:
            out["overlap"] = dataclasses.asdict(comm_overlap(prof.events()))
            if args.trace_dir:
                Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
                prof.export_chrome_trace(str(Path(args.trace_dir) / f"rank{env.rank}.json"))
        w1 = bytes_written()
        if w0 is not None and w1 is not None:
            out["wire"].append(w1 - w0)
        done = step + 1
        if done % args.log_every == 0 or done == args.steps:
            last = out["step_s"][-1]
            print0(f"step {done}/{args.steps} loss {out['losses'][-1]:.6f} step_ms {last * 1e3:.1f} "
                   f"tok/s {args.global_batch * args.seq_len / last:,.0f}")
        if args.ckpt_dir and is_due(done, args.ckpt_every, args.steps):
            path = save_step(args.ckpt_dir, done, model, opt, scaler=scaler, sharded=args.fsdp,
                             keep=args.keep)
            print0(f"checkpoint saved: {path.name} (step {done})")
    return out


def full_state_dict(model: nn.Module, fsdp: bool) -> dict[str, torch.Tensor]:
    """The whole model's parameters on every rank (FSDP gathers its shards)."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return getattr(model, "module", model).state_dict()  # DDP keeps the model in .module


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = setup(args.device)
    world, attempt = env.world_size, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    micro, accum, n = split(args, env)
    print(f"rank {env.rank}/{world} pid {os.getpid()} device {env.device} backend {env.backend} "
          f"threads {torch.get_num_threads()} attempt {attempt}", flush=True)
    model, opt, scaler, stats = build(args, env)
    n_params = sum(p.numel() for p in model.parameters())
    start_step = resume(args, model, opt, scaler)
    mode = "fsdp" if args.fsdp else ("ddp" if env.distributed else "single")
    no_sync = not args.sync_every_micro_step
    print0(f"start: mode {mode} world {world} params {n_params:,} global_batch {args.global_batch} "
           f"micro_batch {micro} accum {accum} no_sync {no_sync} precision {args.spec.precision} "
           f"steps {start_step}->{args.steps} attempt {attempt}")
    run = train_steps(args, env, model, opt, scaler, stats, start_step, micro=micro, accum=accum, n=n,
                      attempt=attempt)
    losses, step_s = run["losses"], run["step_s"]

    # measurements from every rank, gathered on rank 0
    median_step = median(step_s[args.warmup_steps:] or step_s)
    mine = {"rank": env.rank, "model_state_bytes": run["mem"],
            "peak_memory_bytes": peak_memory_bytes(env.device), "median_step_s": median_step,
            "wire_bytes_per_step": median(run["wire"][args.warmup_steps:] or run["wire"]),
            "scales": run["scales"], "skipped_steps": run["skipped"], "overlap": run["overlap"]}
    per_rank = [mine]
    if env.distributed:
        per_rank = [None] * world  # type: ignore[list-item]
        dist.all_gather_object(per_rank, mine)
    full_sd = full_state_dict(model, args.fsdp) if args.save_params else None
    summary: dict[str, Any] = {}
    if env.is_main:
        tokens_per_step = args.global_batch * args.seq_len
        summary = {
            "mode": mode, "world_size": world, "optimizer": args.optimizer, "accum": accum,
            "micro_batch": micro, "no_sync": no_sync, "precision": args.spec.precision,
            "spec": dataclasses.asdict(args.spec),
            "global_batch": args.global_batch, "seq_len": args.seq_len, "params": n_params,
            "threads_per_process": torch.get_num_threads(), "device": str(env.device),
            "attempt": attempt, "resumed_from": start_step, "first_step": start_step + 1,
            "losses": losses, "final_loss": losses[-1] if losses else None,
            "step_s": step_s, "median_step_s": median_step, "tokens_per_s": tokens_per_step / median_step,
            "tokens_per_s_per_process": tokens_per_step / median_step / world,
            "allreduce_calls_per_step": stats.get("calls_per_step"),
            "allreduce_bytes_per_step": stats.get("bytes_per_step"),
            "grad_bytes": n_params * 4, "per_rank": per_rank,
            "skipped_steps": run["skipped"], "scales": run["scales"], "overlap": run["overlap"],
            "bucket_cap_mb": args.bucket_cap_mb,
        }
        write_summary(args, env, summary, per_rank, full_sd)
    del model, opt, scaler, full_sd  # teardown collects them while the process group is still alive
    teardown()
    return summary


def write_summary(args: argparse.Namespace, env: DistEnv, summary: dict[str, Any], per_rank: list[dict],
                  full_sd: dict[str, torch.Tensor] | None) -> None:
    """Rank 0: print the final line, write --out's JSON and --save-params' state dict."""
    state_mb = sum(summary["per_rank"][0]["model_state_bytes"].values()) / 1e6
    peak_mb = max(r["peak_memory_bytes"] for r in per_rank) / 1e6
    print0(f"final loss {summary['final_loss']:.8f} median step {summary['median_step_s'] * 1e3:.1f} ms "
           f"tokens/s "
           f"{summary['tokens_per_s']:,.0f} ({summary['tokens_per_s_per_process']:,.0f} per process) "
           f"model state {state_mb:.2f} MB/rank, peak {'GPU' if env.device.type == 'cuda' else 'RSS'} "
           f"{peak_mb:,.0f} MB (largest rank)")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(summary, indent=1))
    if full_sd is not None:
        Path(args.save_params).parent.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().cpu() for k, v in full_sd.items()}, args.save_params)


if __name__ == "__main__":
    main()
    exit_now()  # its results are written: skip the interpreter's teardown (1-2 s per process here)
