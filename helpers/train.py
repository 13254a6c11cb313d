"""One training loop with switches: precision, gradient accumulation, activation checkpointing, fused
AdamW, a learning-rate schedule, atomic checkpoints that resume; it reports the loss curve, tokens/s,
MFU and peak memory (lessons 02-08). `train_step` is one optimizer step, for a loop of your own.

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

Keeping a GPU fed (lesson 06)
-----------------------------
The loop waits for the device only where it needs a number: every `log_every` steps, at checkpoints
and at the end. In between, each step's loss stays a tensor on the device (the curve is read back in
one copy at the next log point), step times come from CUDA events, tokens are counted on the host
before the batch is copied, and the copy to the GPU is `non_blocking`: asynchronous when the batch is
in pinned memory, which is the DataLoader's job (`RunSpec.dataloader` pins in its pin thread; pinning
here, on the main thread, would be a blocking copy plus a copy). (On a CPU there is nothing to overlap:
step times are wall-clock times.)

The switches: a RunSpec
-----------------------
Precision (with its TF32 rule), FP8, attention, compile, fused AdamW and padding are one frozen
`helpers.runspec.RunSpec`, given as `train(..., spec=spec)`: `spec.step_context(device)` (TF32) wraps
each whole step, `spec.autocast(device)` each forward pass and loss only (PyTorch's AMP guide: backward
runs in the dtypes autocast chose for the forward ops; the optimizer step is outside autocast).
`TrainConfig` holds the rest: steps, optimizer, schedule, accumulation, checkpoints. Under DDP (or FSDP2)
with accumulation, gradients are all-reduced once per step, on the last micro-batch
(`helpers.distributed.grad_sync`).

Checkpoints
-----------
With `checkpoint_dir` and `checkpoint_every=K` (0 = never), the state after every K-th step and after
the last is written atomically to `<checkpoint_dir>/step_NNNNNN.pt` (`helpers.checkpoint`), keeping the
newest `keep_checkpoints`. `train` resumes from the newest when there is one: model, optimizer, scaler,
learning-rate schedule, RNG states, step and loss history, so nothing but the steps after it is lost.
Under DDP rank 0 writes (the replicas are equal) and every rank reads.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from helpers.checkpoint import is_due, resume_latest, save_step, unwrap_model
from helpers.config import seed_everything
from helpers.distributed import grad_sync
from helpers.precision import make_scaler
from helpers.runspec import RunSpec

__all__ = ["LR_SCHEDULES", "TrainConfig", "TrainResult", "StepOutput", "make_optimizer", "make_lr_scheduler",
           "set_activation_checkpointing", "count_tokens", "train_step", "train", "evaluate",
           "synthetic_batch_fn"]

LR_SCHEDULES = ("constant", "linear")


def _check_max_grad_norm(value: Any) -> None:
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if value is not None and not (number and value > 0):
        raise ValueError(f"max_grad_norm={value!r}: clipping needs a positive norm (a negative one reverses "
                         "the gradient); use None for no clipping")


@dataclass
class TrainConfig:
    """Steps, optimizer, schedule, accumulation and checkpoints of one run (lessons 02-08); the switches
    (precision, attention, compile, fused AdamW, padding) are a `helpers.runspec.RunSpec`.

    `steps=0` is a run of no steps: it returns at once (with a resumed run's loss history) and reports
    no throughput (None, never NaN). Throughput leaves out the run's first step (warm-up), so it needs
    at least 2 steps in this call."""

    steps: int  # optimizer steps in total (a resumed run counts the steps done before)
    lr: float = 3e-4  # peak learning rate
    weight_decay: float = 0.01
    grad_accum: int = 1  # micro-batches per optimizer step
    activation_checkpointing: bool = False  # recompute each block's activations in the backward pass
    max_grad_norm: float | None = 1.0  # clip the global gradient norm to this (> 0); None: no clipping
    lr_schedule: str = "constant"  # "constant" or "linear" (decay to 0 at the last step), after warm-up
    warmup_steps: int = 0  # steps of linear warm-up from 0 to lr ...
    warmup_frac: float = 0.0  # ... or this fraction of `steps` (give one of the two)
    checkpoint_dir: str | None = None  # where step_NNNNNN.pt go; None: no checkpoints, no resuming
    checkpoint_every: int = 0  # steps; 0 = never
    keep_checkpoints: int = 2  # the newest ones kept: a damaged last one still leaves the one before
    log_every: int = 10  # steps between reads of the loss (a device sync) and progress-bar updates
    progress: bool = True  # tqdm.auto bar
    seed: int = 0
    resume: bool = True  # continue from the newest checkpoint in checkpoint_dir when there is one
    track_memory: bool = True  # peak memory (CUDA stats; on CPU the profiler during the first step)
    peak_flops: float | None = None  # FLOP/s for MFU; None: helpers.hardware.mfu_peak for the device
    init_scale: float = 2.0 ** 16  # GradScaler's first scale (fp16)

    def __post_init__(self) -> None:
        ints = ("steps", "grad_accum", "warmup_steps", "checkpoint_every", "keep_checkpoints", "log_every")
        for name in ints:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise ValueError(f"{name} must be an int, got {value!r}")
            setattr(self, name, int(value))  # numpy ints too
        if self.steps < 0 or self.grad_accum < 1:
            raise ValueError(f"need steps >= 0 and grad_accum >= 1, got steps={self.steps}, "
                             f"grad_accum={self.grad_accum}")
        if not self.lr > 0 or not self.weight_decay >= 0:
            raise ValueError(f"need lr > 0 and weight_decay >= 0, got lr={self.lr}, "
                             f"weight_decay={self.weight_decay}")
        _check_max_grad_norm(self.max_grad_norm)
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"unknown lr_schedule {self.lr_schedule!r}: use one of {LR_SCHEDULES}")
        if self.warmup_steps < 0 or not 0 <= self.warmup_frac < 1 or (self.warmup_steps and self.warmup_frac):
            raise ValueError(f"give warmup_steps >= 0 or 0 <= warmup_frac < 1, not both; got "
                             f"warmup_steps={self.warmup_steps}, warmup_frac={self.warmup_frac}")
        if self.checkpoint_every < 0 or (self.checkpoint_every and not self.checkpoint_dir):
            raise ValueError(f"checkpoint_every={self.checkpoint_every} needs a checkpoint_dir and must be "
                             ">= 0 (0 = never)")
        if self.keep_checkpoints < 1 or self.log_every < 1:
            raise ValueError(f"need keep_checkpoints >= 1 and log_every >= 1, got {self.keep_checkpoints}, "
                             f"{self.log_every}")
        if self.peak_flops is not None and not self.peak_flops > 0:
            raise ValueError(f"peak_flops must be a positive FLOP/s or None, got {self.peak_flops}")

    @property
    def warmup(self) -> int:
        """Warm-up steps: `warmup_steps`, or `warmup_frac` of `steps` rounded."""
        return self.warmup_steps or round(self.warmup_frac * self.steps)


@dataclass
class TrainResult:
    """What a run measured (lessons 02-08).

    Throughput leaves out the first step of the call (warm-up: allocator growth, lazy optimizer state,
    compilation, the memory profiler on CPU); it is None when no later step ran.

    MFU (one definition for the course): useful model FLOPs per second over the device's peak,
    `sum over timed batches (real tokens × model_flops_per_token(model, batch width)) / time / peak`,
    i.e. real (non-padding) tokens/s × FLOPs per token / peak. Padding the device computed is not
    useful work. FLOPs per token come from `helpers.flops.model_flops_per_token`, the ratio from
    `helpers.flops.mfu`, the peak from `helpers.hardware.mfu_peak` (the device's fastest dense rate among
    the training precisions: datasheet, else lesson 00's saved roofline) or `TrainConfig.peak_flops`.
    Under DDP it is this process's MFU on its own device."""

    losses: list[float]  # mean loss of each optimizer step, from step 0 (resumed runs keep the history)
    step_times_s: list[float]  # time of each step this call: CUDA events on a GPU, wall clock on a CPU
    tokens_per_s: float | None  # real tokens per second, steps after the first; None: not measured
    samples_per_s: float | None
    mfu: float | None  # None when no peak FLOP/s is known for the device, or nothing was timed
    peak_memory_bytes: int | None  # None when not tracked
    steps_done: int  # optimizer steps done in total, resumed ones included
    resumed_from: int | None  # the step the run resumed from, None for a fresh start
    skipped_steps: list[int] = field(default_factory=list)  # fp16: steps the GradScaler skipped
    scales: list[float] = field(default_factory=list)  # fp16: the loss scale used at each step
    lrs: list[float] = field(default_factory=list)  # learning rate of each step (first group), from step 0
    flops_per_token: float | None = None  # model FLOPs per real token (token-weighted over batch widths)
    peak_flops: float | None = None  # the peak MFU divides by, FLOP/s
    peak_source: str = ""  # where that peak comes from
    memory_method: str = ""

    @property
    def final_loss(self) -> float:
        return self.losses[-1] if self.losses else math.nan


@dataclass
class StepOutput:
    """What one optimizer step returns (lesson 06: tensors stay on the device; reading one waits for it)."""

    loss: torch.Tensor  # 0-d float32: the mean loss over the step's micro-batches
    tokens: int | torch.Tensor  # real tokens (an int when the batches were counted on the host)
    samples: int
    widths: list[tuple[int | torch.Tensor, int]]  # (real tokens, padded width T) of each micro-batch
    grad_norm: torch.Tensor | None = None  # the global gradient norm before clipping (None: no clipping)
    scale: torch.Tensor | None = None  # fp16: the loss scale this step used (compare after: skipped?)


# --- model and optimizer ----------------------------------------------------------------------------

def make_optimizer(model: nn.Module, lr: float, weight_decay: float, fused: bool = True) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not biases, norms); the fused kernel where torch has it
    for the device (CUDA; CPU since torch 2.4: 37 ms vs 188 ms a step for MiniLM here) (lessons 03, 08)."""
    if not lr > 0 or not weight_decay >= 0:
        raise ValueError(f"need lr > 0 and weight_decay >= 0, got lr={lr}, weight_decay={weight_decay}")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    devices = {p.device.type for p in params}
    floating = all(p.is_floating_point() for p in params)
    use_fused = fused and floating and len(devices) == 1 and devices <= {"cuda", "cpu", "mps", "xpu"}
    try:
        return torch.optim.AdamW(groups, lr=lr, fused=use_fused or None)
    except (RuntimeError, TypeError):  # an older torch without the fused kernel on this device
        return torch.optim.AdamW(groups, lr=lr)


def make_lr_scheduler(optimizer: torch.optim.Optimizer, steps: int, schedule: str = "constant",
                      warmup_steps: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over `warmup_steps`, then the lr held ("constant") or decayed linearly to 0 at
    `steps` ("linear", as transformers' get_linear_schedule_with_warmup) (lesson 08)."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: use one of {LR_SCHEDULES}")
    if steps < 0 or not 0 <= warmup_steps <= max(steps, 0):
        raise ValueError(f"need 0 <= warmup_steps <= steps, got warmup_steps={warmup_steps}, steps={steps}")

    def factor(step: int) -> float:  # the multiplier of the lr for optimizer step `step` (0-based)
        if step < warmup_steps:
            return step / warmup_steps
        if schedule == "constant":
            return 1.0
        return max(0.0, (steps - step) / max(1, steps - warmup_steps))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def set_activation_checkpointing(model: nn.Module, enabled: bool) -> None:
    """Turn activation checkpointing on or off: SmallTransformer's switch, or Hugging Face's (lesson 03)."""
    if hasattr(model, "set_activation_checkpointing"):
        model.set_activation_checkpointing(enabled)
    elif hasattr(model, "gradient_checkpointing_enable"):  # Hugging Face PreTrainedModel
        # transformers 5 renamed the switch to activation_checkpointing_*; 4.x has gradient_checkpointing_*
        prefix = "activation" if hasattr(type(model), "activation_checkpointing_enable") else "gradient"
        if not enabled and not getattr(model, f"is_{prefix}_checkpointing", False):
            return  # already off
        if enabled:
            kwargs = {f"{prefix}_checkpointing_kwargs": {"use_reentrant": False}}
            getattr(model, f"{prefix}_checkpointing_enable")(**kwargs)
        else:
            getattr(model, f"{prefix}_checkpointing_disable")()
    elif enabled:
        raise ValueError(f"{type(model).__name__} has no activation-checkpointing switch: wrap its blocks "
                         "with torch.utils.checkpoint.checkpoint, or use SmallTransformer / a HF model")



# --- batches ----------------------------------------------------------------------------------------

def count_tokens(batch: Mapping[str, Any]) -> int:
    """Real tokens of a batch: the attention mask's sum when present, else input_ids.numel() (lesson 06).

    Count a batch while it is still on the host: on a GPU, `int(mask.sum())` waits for the device."""
    if "input_ids" not in batch:
        raise ValueError(f"a batch needs `input_ids`; got keys {sorted(batch)}")
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else batch["input_ids"].numel()


def _tokens(batch: Mapping[str, Any]) -> int | torch.Tensor:
    """count_tokens without a device sync: an int for a host mask, a device tensor otherwise."""
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.device.type != "cpu":
        return mask.sum()
    return count_tokens(batch)


def _to_device(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """Tensors to `device`, asynchronously on a GPU when the DataLoader pinned them (`RunSpec.dataloader`).

    No pinning here: `t.pin_memory()` on the main thread is a blocking copy before the copy (PyTorch's
    pin_memory / non_blocking guide); the DataLoader's pin thread does it while the GPU computes."""
    if not isinstance(batch, Mapping) or "input_ids" not in batch:
        raise ValueError(f"each batch must be a dict with `input_ids` (and optionally attention_mask, "
                         f"labels), got {type(batch).__name__}")
    non_blocking = device.type == "cuda"
    return {k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) and v.device != device
            else v for k, v in batch.items()}


def _micro_batches(batches: Any, start_step: int, grad_accum: int) -> Iterator[dict]:
    """Micro-batches in order from optimizer step `start_step` on (see the module docstring)."""
    indexable = isinstance(batches, Sequence) or (hasattr(batches, "__getitem__")
                                                  and hasattr(batches, "__len__"))
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



# --- one step ----------------------------------------------------------------------------------------

def _step(model: nn.Module, micro: Sequence[Mapping[str, Any]], optimizer: torch.optim.Optimizer,
          scaler: torch.amp.GradScaler | None, spec: RunSpec, device: torch.device,
          max_grad_norm: float | None, scheduler: Any) -> StepOutput:
    """One optimizer step over `micro` (already checked): TF32 (`spec.step_context`) around all of it,
    autocast (`spec.autocast`) around each forward pass and loss only; under DDP the gradients are
    all-reduced on the last micro-batch only; no device sync unless fp16's scaler needs one."""
    accum = len(micro)
    optimizer.zero_grad(set_to_none=True)
    step_loss = torch.zeros((), device=device)
    tokens: int | torch.Tensor = 0
    widths: list[tuple[int | torch.Tensor, int]] = []  # (real tokens, padded width T) per micro-batch
    with spec.step_context(device):
        for i, host in enumerate(micro):
            n = _tokens(host)  # counted before the copy: no sync
            batch = _to_device(host, device)
            with grad_sync(model, sync=i == accum - 1):  # DDP's no_sync on all but the last micro-batch
                with spec.autocast(device):  # forward and loss; backward runs in the dtypes chosen here
                    loss = model(**batch).loss
                if loss is None:
                    raise ValueError("the model returned no loss: give the batches `labels`")
                # average over micro-batches, so accumulation gives the gradient of one big batch
                (scaler.scale(loss / accum) if scaler is not None else loss / accum).backward()
            step_loss += loss.detach().float() / accum
            tokens = tokens + n
            widths.append((n, batch["input_ids"].shape[-1]))
        scale = _scale_tensor(scaler)  # the scale this step used (compared after: skipped?)
        grad_norm = None
        if max_grad_norm is not None:
            if scaler is not None:
                scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        if scaler is not None:
            scaler.step(optimizer)  # skipped when an inf/NaN gradient was found
            scaler.update()
        else:
            optimizer.step()
    if scheduler is not None:
        with warnings.catch_warnings():  # fp16: a skipped first step makes torch warn about the order
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)`")
            scheduler.step()
    samples = sum(b["input_ids"].shape[0] for b in micro)
    return StepOutput(step_loss, tokens, samples, widths, grad_norm, scale)


def _scale_tensor(scaler: torch.amp.GradScaler | None) -> torch.Tensor | None:
    """fp16: the scaler's current scale as a tensor (get_scale() would wait for the device); else None."""
    if scaler is None or not scaler.is_enabled():
        return None
    scale = getattr(scaler, "_scale", None)  # torch keeps it on the device
    return scale.clone() if isinstance(scale, torch.Tensor) else torch.tensor(scaler.get_scale())


def train_step(model: nn.Module, batch: Mapping[str, Any] | Sequence[Mapping[str, Any]],
               optimizer: torch.optim.Optimizer, *, scaler: torch.amp.GradScaler | None = None,
               spec: RunSpec | None = None, device: torch.device | str | None = None,
               max_grad_norm: float | None = 1.0, scheduler: Any = None) -> StepOutput:
    """One optimizer step, for a loop of your own: forward and loss under `spec.autocast`, backward
    (scaled for fp16), clip, step, schedule, all inside `spec.step_context` (TF32) (lessons 02, 03).
    `batch`: one batch dict, or a list of micro-batches whose gradients are accumulated (averaged). The
    loss is a device tensor."""
    micro = [batch] if isinstance(batch, Mapping) else list(batch)
    if not micro:
        raise ValueError("train_step got an empty list of micro-batches")
    spec = spec if spec is not None else RunSpec()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    spec.check(device)
    _check_max_grad_norm(max_grad_norm)
    if spec.precision == "fp16" and (scaler is None or not scaler.is_enabled()):
        raise ValueError("fp16 needs a GradScaler, kept from step to step: "
                         "scaler = helpers.precision.make_scaler('fp16', device)")
    return _step(model, micro, optimizer, scaler, spec, device, max_grad_norm, scheduler)


# --- the loop ---------------------------------------------------------------------------------------

class _Meter:
    """What a run measures as it goes: step times (CUDA events, or the wall clock on a CPU), losses and
    fp16 scales read back in one copy per log point, real tokens, useful FLOPs, peak memory."""

    def __init__(self, model: nn.Module, device: torch.device, scaler: torch.amp.GradScaler | None,
                 history: dict[str, list], track_memory: bool) -> None:
        self.model, self.device, self.scaler, self.h = model, device, scaler, history
        self.cuda, self.track_memory = device.type == "cuda", track_memory
        self.step_times: list[float] = []
        self.events: list[tuple[Any, Any]] = []  # CUDA: (start, end) events of the steps not yet read back
        self.pending: list[tuple[int, StepOutput]] = []  # steps whose loss has not been read back yet
        self.timed: list[tuple[int | torch.Tensor, int]] = []  # (real tokens, width) of the timed batches
        self.all: list[tuple[int | torch.Tensor, int]] = []  # ... and of every batch
        self.samples, self.peak_memory, self.memory_method, self.t0 = 0, None, "", 0.0
        if track_memory and self.cuda:
            torch.cuda.reset_peak_memory_stats(device)

    def begin(self, lr: float) -> None:
        """A step starts: its learning rate, and the clock (fetching the batches is part of the step)."""
        self.h["lrs"].append(lr)  # a Python float: no sync
        if self.cuda:
            self.events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            self.events[-1][0].record()
        self.t0 = time.perf_counter()

    def memory(self, first: bool, optimizer: torch.optim.Optimizer) -> contextlib.AbstractContextManager:
        """On a CPU, the profiler's peak memory during the first step; nothing otherwise."""
        from helpers.memory import tensor_bytes, track_peak_memory

        if not (first and self.track_memory and not self.cuda and not torch.autograd._profiler_enabled()):
            return contextlib.nullcontext()
        return track_peak_memory(self.device, baseline_bytes=tensor_bytes(self.model, optimizer))

    def end(self, step: int, out: StepOutput, first: bool, report: Any) -> None:
        """A step is done: stop its clock, keep its outputs until the next read-back."""
        if self.cuda:
            self.events[-1][1].record()
        else:
            self.step_times.append(time.perf_counter() - self.t0)  # a CPU computes synchronously
        if report is not None:
            self.peak_memory, self.memory_method = report.peak_bytes, report.method
        self.pending.append((step, out))
        self.all += out.widths
        if not first:  # the run's first step is warm-up: not timed
            self.timed += out.widths
            self.samples += out.samples

    def read_back(self) -> None:
        """Wait for the device once, then read the losses, scales and step times since the last time."""
        if not self.pending:
            return
        if self.cuda:
            self.events[-1][1].synchronize()
            self.step_times.extend(a.elapsed_time(b) / 1e3 for a, b in self.events)
            self.events.clear()
        self.h["losses"].extend(torch.stack([out.loss for _, out in self.pending]).tolist())
        if self.scaler is not None:
            after = [out.scale for _, out in self.pending[1:]] + [_scale_tensor(self.scaler)]
            for (step, out), new in zip(self.pending, after):
                self.h["scales"].append(float(out.scale))
                if float(new) < float(out.scale):  # the scaler halved its scale: the step was skipped
                    self.h["skipped_steps"].append(step)
        self.pending.clear()

    def result(self, start: int, cfg: TrainConfig) -> TrainResult:
        """The run's TrainResult: throughput of the timed steps, MFU through helpers.flops.mfu."""
        from helpers.flops import mfu

        if self.track_memory and self.cuda:
            self.peak_memory = torch.cuda.max_memory_allocated(self.device)
            self.memory_method = "torch.cuda.max_memory_allocated"
        timed_s = sum(self.step_times[1:])
        tokens = int(sum(n for n, _ in self.timed))
        per_token, timed_flops = _useful_flops(self.model, self.all), _useful_flops(self.model, self.timed)
        peak, source = ((cfg.peak_flops, "TrainConfig.peak_flops") if cfg.peak_flops
                        else _peak(self.device) if per_token is not None else (None, ""))
        ok = peak and timed_s > 0 and tokens > 0 and timed_flops is not None
        return TrainResult(
            losses=self.h["losses"], step_times_s=self.step_times,
            tokens_per_s=tokens / timed_s if timed_s > 0 else None,
            samples_per_s=self.samples / timed_s if timed_s > 0 else None,
            mfu=mfu(tokens / timed_s, timed_flops / tokens, peak) if ok else None,
            peak_memory_bytes=self.peak_memory, steps_done=max(start, cfg.steps),
            resumed_from=self.h["resumed_from"], skipped_steps=self.h["skipped_steps"],
            scales=self.h["scales"], lrs=self.h["lrs"], peak_flops=peak, peak_source=source,
            flops_per_token=per_token / int(sum(n for n, _ in self.all)) if per_token else None,
            memory_method=self.memory_method)


def _useful_flops(model: nn.Module, widths: list[tuple[int | torch.Tensor, int]]) -> float | None:
    """Real tokens × model FLOPs per token at each batch's width; None for a model helpers.flops cannot
    read (lesson 08's MFU: padding is not useful work)."""
    from helpers.flops import model_flops_per_token

    per_width: dict[int, float] = {}
    try:
        for _, width in widths:
            if width not in per_width:
                per_width[width] = model_flops_per_token(unwrap_model(model), width)
    except ValueError:
        return None
    return float(sum(int(n) * per_width[w] for n, w in widths))


def _peak(device: torch.device) -> tuple[float | None, str]:
    """The peak FLOP/s MFU divides by: helpers.hardware.mfu_peak, with lesson 00's saved roofline."""
    from helpers.hardware import load_roofline, mfu_peak

    try:
        roofline = load_roofline()
    except Exception:  # a damaged or old roofline file: no measured fallback
        roofline = None
    peak = mfu_peak(device, roofline=roofline)
    return (peak.flops, peak.source) if peak is not None else (None, "no peak known for this device")


def _resume(cfg: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any,
            scheduler: Any) -> tuple[int, dict[str, Any]]:
    """(first step, history): from the newest checkpoint in cfg.checkpoint_dir, else a fresh start."""
    history: dict[str, Any] = {"losses": [], "skipped_steps": [], "scales": [], "lrs": [],
                               "resumed_from": None}
    folder = cfg.checkpoint_dir
    state = (resume_latest(folder, model, optimizer, scaler=scaler, scheduler=scheduler)
             if folder is not None and cfg.resume else None)
    if state is None:
        return 0, history
    history.update({k: list(state["extra"].get(k, [])) for k in ("losses", "skipped_steps", "scales", "lrs")})
    history["resumed_from"] = state["step"]
    return state["step"], history


def _check(model: nn.Module, cfg: TrainConfig, spec: RunSpec | None, device: Any,
           scheduler: Any) -> tuple[RunSpec, torch.device]:
    """ValueError for a wrong argument of `train`; (spec, device) with their defaults filled in."""
    if not isinstance(cfg, TrainConfig):
        raise ValueError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    if spec is not None and not isinstance(spec, RunSpec):
        raise ValueError(f"spec must be a helpers.runspec.RunSpec, got {type(spec).__name__}")
    if scheduler is not None and (cfg.lr_schedule != "constant" or cfg.warmup):
        raise ValueError("give either a scheduler or cfg.lr_schedule/warm-up, not both")
    spec = spec if spec is not None else RunSpec()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    spec.check(device)
    return spec, device


def train(model: nn.Module, batches: Any, cfg: TrainConfig, device: torch.device | str | None = None, *,
          spec: RunSpec | None = None, optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
          on_step: Callable[[int, StepOutput], Any] | None = None) -> TrainResult:
    """Train `model` for `cfg.steps` optimizer steps on `batches` with the switches of `spec` (default
    `RunSpec()`, fp32) (see the module docstring) (lessons 02-08).

    `optimizer`: yours instead of `make_optimizer(model, cfg.lr, cfg.weight_decay, spec.fused_adamw)`;
    `scheduler`: yours instead of `make_lr_scheduler` from cfg (stepped once per optimizer step);
    `on_step(steps_done, StepOutput)`: called after every step (its tensors are on the device)."""
    from tqdm.auto import tqdm

    spec, device = _check(model, cfg, spec, device, scheduler)
    seed_everything(cfg.seed)
    model.to(device).train()
    set_activation_checkpointing(unwrap_model(model), cfg.activation_checkpointing)
    if optimizer is None:
        optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay, spec.fused_adamw)
    if scheduler is None:
        scheduler = make_lr_scheduler(optimizer, cfg.steps, cfg.lr_schedule, cfg.warmup)
    scaler = make_scaler(spec.precision, device, cfg.init_scale)
    start, history = _resume(cfg, model, optimizer, scaler, scheduler)
    source = _micro_batches(batches, start, cfg.grad_accum)
    meter = _Meter(model, device, scaler if scaler.is_enabled() else None, history, cfg.track_memory)
    bar = tqdm(range(start, cfg.steps), desc=f"train {spec.precision}", disable=not cfg.progress,
               initial=start, total=cfg.steps)
    for step in bar:
        meter.begin(optimizer.param_groups[0]["lr"])
        micro = [next(source) for _ in range(cfg.grad_accum)]  # fetching is part of the step's time
        with meter.memory(step == start, optimizer) as report:
            out = _step(model, micro, optimizer, meter.scaler, spec, device, cfg.max_grad_norm, scheduler)
        meter.end(step, out, first=step == start, report=report)
        done = step + 1
        save = cfg.checkpoint_dir is not None and is_due(done, cfg.checkpoint_every, cfg.steps)
        if save or done % cfg.log_every == 0 or done == cfg.steps:
            meter.read_back()  # the one wait for the device between log points
            bar.set_postfix(loss=f"{history['losses'][-1]:.4f}")
        if save:  # under DDP rank 0 writes, and the others wait until it is on disk
            extra = {k: history[k] for k in ("losses", "skipped_steps", "scales", "lrs")}
            save_step(cfg.checkpoint_dir, done, model, optimizer, scaler=scaler, scheduler=scheduler,
                      keep=cfg.keep_checkpoints, extra=extra)
        if on_step is not None:
            on_step(done, out)
    meter.read_back()
    bar.close()
    return meter.result(start, cfg)


# --- evaluation -------------------------------------------------------------------------------------

@torch.no_grad()
def evaluate(model: nn.Module, dataset: Any, *, batch_size: int = 64, spec: RunSpec | None = None,
             device: torch.device | str | None = None,
             pad_token_id: int = 0) -> tuple[float, list[int], list[int]]:
    """(accuracy, predictions, labels) of a sequence classifier over a tokenised dataset
    (`helpers.data.tokenize`), in batches sorted by length (less padding), forward passes under the spec's
    TF32 and autocast (lesson 08)."""
    from helpers.data import PadCollate  # the data layer: imported here, where it is used

    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    spec = spec if spec is not None else RunSpec()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    collate = PadCollate(pad_token_id)
    order = sorted(range(len(dataset)), key=lambda i: dataset.lengths[i])
    preds = [0] * len(dataset)
    with spec.step_context(device), spec.autocast(device):  # forward passes only: no backward here
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            batch = _to_device(collate([dataset[i] for i in idx]), device)
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            for i, p in zip(idx, logits.argmax(-1).tolist()):
                preds[i] = p
    model.train(was_training)
    labels = [int(y) for y in dataset.labels]
    return sum(p == y for p, y in zip(preds, labels)) / max(len(labels), 1), preds, labels


# --- a learnable synthetic task ---------------------------------------------------------------------

def synthetic_batch_fn(vocab_size: int, batch_size: int, seq_len: int, *, seed: int = 0,
                       pad_fraction: float = 0.0) -> Callable[[int, int], dict[str, torch.Tensor]]:
    """A resumable `batch_fn(step, micro)`: a task a Transformer learns in a few dozen steps (lessons 02-05).

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
