"""One training loop with switches: precision, gradient accumulation, activation checkpointing, fused
AdamW, atomic checkpoints that resume; it reports the loss curve, tokens/s, MFU and peak memory.

Batches: what `train(model, batches, cfg)` accepts
--------------------------------------------------
A batch is a dict with `input_ids` (B, T), optionally `attention_mask` (B, T) (1 = real token) and
`labels`; any other keys are passed to the model too. The loop moves tensors to the device and takes
`model(**batch).loss`, which works for `SmallTransformer` and Hugging Face models alike. Tokens are
counted from `attention_mask` when present (real tokens only), else `input_ids.numel()`.

`batches` is one of:

- a callable `batch_fn(step, micro) -> dict`: micro-batch `micro` (0 … grad_accum-1) of optimizer step
  `step` (0-based). The recommended form: the batch is a pure function of (step, micro), so a run
  resumed from step k sees exactly the batches an uninterrupted run would.
- a sequence (list, tuple, anything with `__len__` and `__getitem__`) of batch dicts: micro-batch
  number i = step·grad_accum + micro is `batches[i % len(batches)]` (epochs repeat in order).
- any other iterable, a `DataLoader` for instance: read in order and restarted when it runs out. On
  resume, the micro-batches already used are drawn again and dropped, so it repeats exactly only if
  the iterable's order is deterministic (for a shuffling DataLoader: a `generator` seeded anew).

Precisions
----------
`cfg.precision` is one of `helpers.precision.PRECISIONS` ("fp32", "tf32", "fp16", "bf16"; see that
module). On a GPU, TF32 stays on for what runs in float32 at every precision but "fp32"
(`helpers.precision.uses_tf32`); on a CPU float32 stays exact.
(`PRECISIONS`, `check_precision` and `autocast_context` are imported here too, for the lessons that
import them from `helpers.train`.)

Checkpoints
-----------
With `checkpoint_dir` and `checkpoint_every=K`, the state after every K-th step (and after the last)
is written to `<checkpoint_dir>/last.pt` atomically: to a temporary file in the same folder, flushed,
then renamed over the old one (`os.replace`), so a run killed at any moment leaves the previous
checkpoint or the new one, never half a file. `train` resumes from that file when it exists: model,
optimizer, scaler, RNG states, step and loss history, so nothing but the steps after it is lost.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from helpers.config import seed_everything
from helpers.precision import (PRECISIONS, autocast_context, check_precision, make_scaler, tf32_matmuls,
                               uses_tf32)
from helpers.timing import synchronize

__all__ = ["TrainConfig", "TrainResult", "make_optimizer", "set_activation_checkpointing",
           "save_checkpoint", "load_checkpoint", "checkpoint_path", "count_tokens", "train",
           "synthetic_batch_fn"]

CHECKPOINT_NAME = "last.pt"
CHECKPOINT_FORMAT = 1


@dataclass
class TrainConfig:
    """Switches of one training run."""

    steps: int  # optimizer steps
    lr: float = 3e-4
    weight_decay: float = 0.01
    precision: str = "fp32"  # one of PRECISIONS
    grad_accum: int = 1  # micro-batches per optimizer step
    activation_checkpointing: bool = False  # recompute each block's activations in the backward pass
    fused_adamw: bool = True  # used where torch supports it on the device
    max_grad_norm: float | None = 1.0  # clip the global gradient norm; None: no clipping
    checkpoint_dir: str | None = None  # where last.pt goes; None: no checkpoints, no resuming
    checkpoint_every: int = 0  # steps; 0 = never
    log_every: int = 10  # steps between loss updates on the progress bar
    progress: bool = True  # tqdm.auto bar
    seed: int = 0
    resume: bool = True  # continue from checkpoint_dir/last.pt when it exists
    track_memory: bool = True  # peak memory (CUDA stats; on CPU the profiler during the first step)
    peak_flops: float | None = None  # FLOP/s for MFU; None: the datasheet table (helpers.flops)
    init_scale: float = 2.0 ** 16  # GradScaler's first scale (fp16)

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}: use one of {PRECISIONS}")
        if self.steps < 0 or self.grad_accum < 1:
            raise ValueError(f"need steps >= 0 and grad_accum >= 1, got steps={self.steps}, "
                             f"grad_accum={self.grad_accum}")
        if self.checkpoint_every < 0 or (self.checkpoint_every and not self.checkpoint_dir):
            raise ValueError(f"checkpoint_every={self.checkpoint_every} needs a checkpoint_dir and must be >= 0")


@dataclass
class TrainResult:
    """What a run measured. Times exclude nothing; throughput excludes the first step of the run
    (warm-up: allocator growth, lazy optimizer state, the memory profiler on CPU)."""

    losses: list[float]  # mean loss of each optimizer step, from step 0 (resumed runs keep the history)
    step_times_s: list[float]  # wall time of each step this run, device synchronised
    tokens_per_s: float
    samples_per_s: float
    mfu: float | None  # None when no peak FLOP/s is known for the device
    peak_memory_bytes: int | None  # None when not tracked
    steps_done: int  # optimizer steps done in total, resumed ones included
    resumed_from: int | None  # the step the run resumed from, None for a fresh start
    skipped_steps: list[int] = field(default_factory=list)  # fp16: steps the GradScaler skipped
    scales: list[float] = field(default_factory=list)  # fp16: the loss scale used at each step
    flops_per_token: float | None = None
    memory_method: str = ""

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else math.nan


# --- model and optimizer ----------------------------------------------------------------------------

def make_optimizer(model: nn.Module, lr: float, weight_decay: float, fused: bool = True) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not biases, norms); fused kernel where supported."""
    if lr <= 0 or weight_decay < 0:
        raise ValueError(f"need lr > 0 and weight_decay >= 0, got lr={lr}, weight_decay={weight_decay}")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    devices = {p.device.type for p in params}
    # The fused AdamW kernel exists for CUDA (and, in recent torch, CPU and MPS) float tensors.
    use_fused = fused and len(devices) == 1 and devices <= {"cuda", "cpu", "mps", "xpu"}
    try:
        return torch.optim.AdamW(groups, lr=lr, fused=use_fused or None)
    except (RuntimeError, TypeError):  # an older torch without the fused kernel on this device
        return torch.optim.AdamW(groups, lr=lr)


def set_activation_checkpointing(model: nn.Module, enabled: bool) -> None:
    """Turn activation checkpointing on or off: SmallTransformer's switch, or Hugging Face's."""
    if hasattr(model, "set_activation_checkpointing"):
        model.set_activation_checkpointing(enabled)
    elif hasattr(model, "gradient_checkpointing_enable"):  # Hugging Face PreTrainedModel
        # transformers 5 renamed the switch to activation_checkpointing_*; 4.x has gradient_checkpointing_*
        prefix = "activation" if hasattr(type(model), "activation_checkpointing_enable") else "gradient"
        if not enabled and not getattr(model, f"is_{prefix}_checkpointing", False):
            return  # already off
        if enabled:
            getattr(model, f"{prefix}_checkpointing_enable")(**{f"{prefix}_checkpointing_kwargs": {"use_reentrant": False}})
        else:
            getattr(model, f"{prefix}_checkpointing_disable")()
    elif enabled:
        raise ValueError(f"{type(model).__name__} has no activation-checkpointing switch: wrap its blocks "
                         "with torch.utils.checkpoint.checkpoint, or use SmallTransformer / a HF model")


# --- checkpoints ------------------------------------------------------------------------------------

def checkpoint_path(checkpoint_dir: str | os.PathLike) -> Path:
    """The file `train` writes and resumes from."""
    return Path(checkpoint_dir) / CHECKPOINT_NAME


def _signature(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the model's state: what a checkpoint must match."""
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def save_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                    scaler: torch.amp.GradScaler | None, step: int, extra: Mapping[str, Any] | None = None) -> None:
    """Write model, optimizer, scaler, RNG states and `step` to `path` atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "format": CHECKPOINT_FORMAT,
        "model_class": type(model).__name__,
        "signature": _signature(model),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scaler": scaler.state_dict() if scaler is not None and scaler.is_enabled() else None,
        "step": int(step),
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None},
        "extra": dict(extra or {}),
    }
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the rename makes them "the" checkpoint
        os.replace(tmp, path)  # atomic on POSIX and Windows: readers see the old file or the new one
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def load_checkpoint(path: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    scaler: torch.amp.GradScaler | None = None, *, restore_rng: bool = True) -> dict[str, Any]:
    """Load a checkpoint into `model` (and `optimizer`, `scaler`); returns it (step, extra, ...).

    Raises ValueError when the file is not a checkpoint of this model (other class, names or shapes)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no checkpoint at {path}")
    state = torch.load(path, map_location="cpu", weights_only=False)  # our own file: RNG states are not tensors
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a checkpoint written by helpers.train.save_checkpoint")
    mine, theirs = _signature(model), state["signature"]
    if state["model_class"] != type(model).__name__ or mine != theirs:
        missing = sorted(set(mine) - set(theirs))[:3]
        unexpected = sorted(set(theirs) - set(mine))[:3]
        shapes = [f"{k}: {theirs[k]} vs {mine[k]}" for k in mine.keys() & theirs.keys() if mine[k] != theirs[k]][:3]
        raise ValueError(f"{path} holds a checkpoint of another model ({state['model_class']}, "
                         f"{len(theirs)} tensors) than this {type(model).__name__} ({len(mine)} tensors); "
                         f"missing {missing}, unexpected {unexpected}, different shapes {shapes}")
    model.load_state_dict(state["model"])
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    if restore_rng:
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        if state["rng"]["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return state


# --- batches ----------------------------------------------------------------------------------------

def count_tokens(batch: Mapping[str, Any]) -> int:
    """Real tokens of a batch: the attention mask's sum when present, else input_ids.numel()."""
    if "input_ids" not in batch:
        raise ValueError(f"a batch needs `input_ids`; got keys {sorted(batch)}")
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else batch["input_ids"].numel()


def _micro_batches(batches: Any, start_step: int, grad_accum: int) -> Iterator[dict]:
    """Micro-batches in order from optimizer step `start_step` on (see the module docstring)."""
    indexable = isinstance(batches, Sequence) or (hasattr(batches, "__getitem__") and hasattr(batches, "__len__"))
    if isinstance(batches, Mapping) or not (callable(batches) or indexable or isinstance(batches, Iterable)):
        raise ValueError(f"batches must be a callable batch_fn(step, micro), a sequence or an iterable of "
                         f"batch dicts, got {type(batches).__name__}")
    if indexable and not callable(batches) and len(batches) == 0:
        raise ValueError("the batch sequence is empty")
    return _generate(batches, start_step, grad_accum, indexable)


def _generate(batches: Any, start_step: int, grad_accum: int, indexable: bool) -> Iterator[dict]:
    if callable(batches):
        step = start_step
        while True:
            for micro in range(grad_accum):
                yield batches(step, micro)
            step += 1
    if indexable:
        n = len(batches)
        i = start_step * grad_accum
        while True:
            yield batches[i % n]
            i += 1
    skip = start_step * grad_accum
    while True:  # any other iterable: epochs in order, restarted when it runs out
        empty = True
        for batch in batches:
            empty = False
            if skip:
                skip -= 1
                continue
            yield batch
        if empty:
            raise ValueError("the batch iterable yielded nothing")


def _to_device(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        raise ValueError(f"each batch must be a dict with `input_ids` (and optionally attention_mask, labels), "
                         f"got {type(batch).__name__}")
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


# --- the loop ---------------------------------------------------------------------------------------

def _flops_and_peak(model: nn.Module, seq_len: int, cfg: TrainConfig, device: torch.device) -> tuple[float | None, float | None]:
    from helpers.flops import model_flops_per_token, peak_flops

    model = getattr(model, "module", model)  # DDP keeps the wrapped model in .module
    model = getattr(model, "_orig_mod", model)  # and torch.compile in ._orig_mod
    try:
        per_token = model_flops_per_token(model, seq_len)
    except ValueError:
        return None, None
    if cfg.peak_flops is not None:
        return per_token, cfg.peak_flops
    peak = peak_flops(device, cfg.precision)
    return per_token, peak.flops if peak is not None else None


def train(model: nn.Module, batches: Any, cfg: TrainConfig, device: torch.device | str | None = None) -> TrainResult:
    """Train `model` for `cfg.steps` optimizer steps on `batches` (see the module docstring)."""
    from tqdm.auto import tqdm

    from helpers.memory import tensor_bytes, track_peak_memory

    if not isinstance(cfg, TrainConfig):
        raise ValueError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    check_precision(cfg.precision, device)
    seed_everything(cfg.seed)
    model.to(device).train()
    set_activation_checkpointing(model, cfg.activation_checkpointing)
    optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay, cfg.fused_adamw)
    scaler = make_scaler(cfg.precision, device, cfg.init_scale)

    start, losses, skipped, scales, resumed_from = 0, [], [], [], None
    path = checkpoint_path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    if path is not None and cfg.resume and path.is_file():
        state = load_checkpoint(path, model, optimizer, scaler)
        start = resumed_from = state["step"]
        losses = list(state["extra"].get("losses", []))
        skipped = list(state["extra"].get("skipped_steps", []))
        scales = list(state["extra"].get("scales", []))

    def save(step: int) -> None:
        save_checkpoint(path, model, optimizer, scaler, step,
                        extra={"losses": losses, "skipped_steps": skipped, "scales": scales})

    source = _micro_batches(batches, start, cfg.grad_accum)
    step_times: list[float] = []
    tokens = samples = 0  # counted after the first step of this run (warm-up)
    seq_len = 0
    peak_memory: int | None = None
    memory_method = ""
    cuda = device.type == "cuda"
    if cfg.track_memory and cuda:
        torch.cuda.reset_peak_memory_stats(device)
    bar = tqdm(range(start, cfg.steps), desc=f"train {cfg.precision}", disable=not cfg.progress,
               initial=start, total=cfg.steps)
    with tf32_matmuls(uses_tf32(cfg.precision) and device.type == "cuda"):
        for step in bar:
            first = step == start
            profile_cpu = first and cfg.track_memory and not cuda and not torch.autograd._profiler_enabled()
            tracker = (track_peak_memory(device, baseline_bytes=tensor_bytes(model, optimizer))
                       if profile_cpu else contextlib.nullcontext())
            synchronize(device)
            t0 = time.perf_counter()
            with tracker as report:
                optimizer.zero_grad(set_to_none=True)
                step_loss = torch.zeros((), device=device)
                step_tokens = step_samples = 0
                for _ in range(cfg.grad_accum):
                    batch = _to_device(next(source), device)
                    with autocast_context(cfg.precision, device):
                        loss = model(**batch).loss
                    if loss is None:
                        raise ValueError("the model returned no loss: give the batches `labels`")
                    # average over micro-batches, so accumulation gives the gradient of one big batch
                    scaler.scale(loss / cfg.grad_accum).backward()
                    step_loss += loss.detach().float() / cfg.grad_accum
                    step_tokens += count_tokens(batch)
                    step_samples += batch["input_ids"].shape[0]
                    seq_len = batch["input_ids"].shape[1]
                scale_before = scaler.get_scale() if scaler.is_enabled() else 1.0
                if cfg.max_grad_norm is not None:
                    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                scaler.step(optimizer)  # skipped when an inf/NaN gradient was found
                scaler.update()
            synchronize(device)
            step_times.append(time.perf_counter() - t0)
            if profile_cpu:
                peak_memory, memory_method = report.peak_bytes, report.method
            losses.append(float(step_loss))
            if scaler.is_enabled():
                scales.append(scale_before)
                if scaler.get_scale() < scale_before:
                    skipped.append(step)
            if not first:
                tokens += step_tokens
                samples += step_samples
            if cfg.progress and (step % max(cfg.log_every, 1) == 0 or step == cfg.steps - 1):
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
            done = step + 1
            if path is not None and cfg.checkpoint_every and (done % cfg.checkpoint_every == 0 or done == cfg.steps):
                save(done)
    bar.close()
    if cfg.track_memory and cuda:
        peak_memory = torch.cuda.max_memory_allocated(device)
        memory_method = "torch.cuda.max_memory_allocated"

    timed = sum(step_times[1:])
    tokens_per_s = tokens / timed if timed > 0 else math.nan
    samples_per_s = samples / timed if timed > 0 else math.nan
    per_token, peak = _flops_and_peak(model, seq_len, cfg, device) if seq_len else (None, None)
    mfu_value = tokens_per_s * per_token / peak if per_token and peak and timed > 0 else None
    return TrainResult(losses=losses, step_times_s=step_times, tokens_per_s=tokens_per_s,
                       samples_per_s=samples_per_s, mfu=mfu_value, peak_memory_bytes=peak_memory,
                       steps_done=max(start, cfg.steps),
                       resumed_from=resumed_from, skipped_steps=skipped, scales=scales,
                       flops_per_token=per_token, memory_method=memory_method)


# --- a learnable synthetic task ---------------------------------------------------------------------

def synthetic_batch_fn(vocab_size: int, batch_size: int, seq_len: int, *, seed: int = 0,
                       pad_fraction: float = 0.0) -> Callable[[int, int], dict[str, torch.Tensor]]:
    """A resumable `batch_fn(step, micro)` for a task a Transformer learns in a few dozen steps.

    A substitution cipher: random tokens in, and for each position the label is a fixed random
    permutation of its token. It is solved by a lookup table, so the loss falls from ln(vocab_size)
    towards 0 within ~40 steps at lr 3e-3, while every step still runs the whole model. Each batch
    comes from its own generator seeded with (seed, step, micro): the same call gives the same batch.
    `pad_fraction` > 0 pads the tail of each row (random lengths) and adds an `attention_mask`.
    """
    if min(vocab_size, batch_size, seq_len) < 2 or not 0 <= pad_fraction < 1:
        raise ValueError(f"need vocab_size, batch_size, seq_len >= 2 and 0 <= pad_fraction < 1, got "
                         f"{vocab_size}, {batch_size}, {seq_len}, {pad_fraction}")
    perm = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))

    def batch_fn(step: int, micro: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + micro)  # one stream per batch
        ids = torch.randint(vocab_size, (batch_size, seq_len), generator=g)
        labels = perm[ids]
        if not pad_fraction:  # no mask: attention takes its fastest path
            return {"input_ids": ids, "labels": labels}
        max_pad = int(seq_len * pad_fraction)
        lengths = seq_len - torch.randint(max_pad + 1, (batch_size,), generator=g)
        mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()  # (B, T), 1 = real token
        labels[mask == 0] = -100
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return batch_fn
