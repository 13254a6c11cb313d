"""The course's training loop (lessons 02-08): `train` runs a RunSpec's switches with accumulation, a
learning-rate schedule and resumable checkpoints, reporting loss, tokens/s, MFU and peak memory;
`TrainStep` is its one optimizer step, for a loop of your own.
Guide: docs/library/train.md#helperstrainloop"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
from torch import nn
from tqdm.auto import tqdm

from helpers.core.adapt import adapter_hint, as_batch, is_batch, loss_of, takes_course_batches
from helpers.core.compat import grad_scaler_scale, make_adamw, profiler_enabled
from helpers.core.device import get_device
from helpers.core.seeding import seed_everything
from helpers.train.checkpoint import ON_CHANGED_SETTINGS, is_due, resume_latest, save_step
from helpers.train.distributed import grad_sync, is_sharded
from helpers.train.meter import Meter, TrainResult
from helpers.train.runspec import FUSED_ADAMW_DEVICES, RunSpec

__all__ = ["LRSchedule", "LR_SCHEDULES", "TrainConfig", "StepOutput", "make_optimizer", "make_lr_scheduler",
           "count_tokens", "TrainStep", "train"]

LRSchedule = Literal["constant", "linear"]  # after the warm-up: held, or decayed to 0 at the last step
LR_SCHEDULES: tuple[str, ...] = get_args(LRSchedule)


def _check_max_grad_norm(value: Any) -> None:
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if value is not None and not (number and value > 0):
        raise ValueError(f"max_grad_norm={value!r}: clipping needs a positive norm (a negative one reverses "
                         "the gradient); use None for no clipping")


@dataclass
class TrainConfig:
    """Steps, optimizer, schedule, accumulation and checkpoints of one run; the switches are a RunSpec
    (lessons 02-08). Throughput skips the first step: it needs 2 steps or more in a call, else None."""

    steps: int  # optimizer steps in total (a resumed run counts the steps done before)
    lr: float = 3e-4  # peak learning rate
    weight_decay: float = 0.01
    grad_accum: int = 1  # micro-batches per optimizer step
    max_grad_norm: float | None = 1.0  # clip the global gradient norm to this (> 0); None: no clipping
    lr_schedule: LRSchedule = "constant"
    warmup_steps: int = 0  # steps of linear warm-up from 0 to lr ...
    warmup_frac: float = 0.0  # ... or this fraction of `steps` (give one of the two)
    checkpoint_dir: str | None = None  # where step_NNNNNN.pt go; None: no checkpoints, no resuming
    checkpoint_every: int = 0  # steps; 0 = never
    keep_checkpoints: int = 2  # the newest ones kept: a damaged last one still leaves the one before
    log_every: int = 10  # steps between reads of the loss (a device sync) and progress-bar updates
    progress: bool = True  # tqdm.auto bar
    seed: int = 0
    resume: bool = True  # continue from the newest checkpoint in checkpoint_dir when there is one
    # where the optimizer's settings differ from the checkpoint's: "refuse", keep the "checkpoint"'s, or
    # "this run"'s (a new learning rate, say)
    on_changed_settings: str = "refuse"
    track_memory: bool = True  # peak memory (CUDA stats; on CPU the profiler during the first step)
    peak_flops: float | None = None  # FLOP/s for MFU; None: helpers.measure.roofline.mfu_peak for the device

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
        if self.on_changed_settings not in ON_CHANGED_SETTINGS:
            raise ValueError(f"on_changed_settings must be one of {ON_CHANGED_SETTINGS}, got "
                             f"{self.on_changed_settings!r}")
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
        """Warm-up steps: `warmup_steps`, or `warmup_frac` of `steps` rounded (lesson 08)."""
        return self.warmup_steps or round(self.warmup_frac * self.steps)


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
    """AdamW, weight decay on matrices only, the fused kernel where torch has one (lessons 03, 08)."""
    # fused on a CPU too (torch >= 2.4): 37 ms vs 188 ms a step for MiniLM, measured on a CPU
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
    use_fused = fused and floating and len(devices) == 1 and devices <= set(FUSED_ADAMW_DEVICES)
    return make_adamw(groups, lr, use_fused)  # the default kernel where this torch has no fused one


def make_lr_scheduler(optimizer: torch.optim.Optimizer, steps: int, schedule: LRSchedule = "constant",
                      warmup_steps: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up, then the lr held ("constant") or decayed linearly to 0 at `steps` ("linear")
    (lesson 08)."""
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


# --- batches ----------------------------------------------------------------------------------------

def count_tokens(batch: Mapping[str, Any] | Sequence[torch.Tensor]) -> int:
    """Real tokens of a batch: the attention mask's sum, else input_ids.numel() (lesson 06). Count on the
    host: on a GPU, `int(mask.sum())` waits for the device."""
    batch = as_batch(batch)
    if "input_ids" not in batch:
        raise ValueError(f"a batch needs `input_ids`; got keys {sorted(batch)}")
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else batch["input_ids"].numel()


def _tokens(batch: Mapping[str, Any]) -> int | torch.Tensor:
    # count_tokens without a device sync: an int for a host mask, a device tensor otherwise
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.device.type != "cpu":
        return mask.sum()
    return count_tokens(batch)


def _to_device(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    # asynchronous where the DataLoader pinned the batch; pinning here would be one more blocking copy
    if "input_ids" not in batch:
        raise ValueError(f"each batch must have `input_ids` (and optionally attention_mask, labels), got "
                         f"keys {sorted(batch)}")
    non_blocking = device.type == "cuda"
    return {k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) and v.device != device
            else v for k, v in batch.items()}


def _micro_batches(batches: Any, start_step: int, grad_accum: int) -> Iterator[dict]:
    # micro-batches in order from optimizer step `start_step` on (docs/library/train.md: Batches)
    indexable = isinstance(batches, Sequence) or (hasattr(batches, "__getitem__")
                                                  and hasattr(batches, "__len__"))
    if isinstance(batches, Mapping) or not (callable(batches) or indexable or isinstance(batches, Iterable)):
        raise ValueError(f"batches must be a callable batch_fn(step, micro), a sequence or an iterable of "
                         f"batches, got {type(batches).__name__}")
    if is_batch(batches):
        raise ValueError("batches is one (x, y) pair: give a list of them, [(x, y)], or a "
                         "batch_fn(step, micro)")
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

class TrainStep:
    """One optimizer step, checked once when made; `train`, lesson 08's ladder and train_ddp.py run it
    (lessons 02-08). Hooks for fault tests: `after_forward(i, n, loss)` -> loss, `before_update()`."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *,
                 spec: RunSpec | None = None, device: torch.device | str | None = None,
                 scaler: torch.amp.GradScaler | None = None, max_grad_norm: float | None = 1.0,
                 scheduler: Any = None, sync_every_micro_batch: bool = False,
                 after_forward: Callable[[int, int, torch.Tensor], torch.Tensor] | None = None,
                 before_update: Callable[[], None] | None = None) -> None:
        self.spec = spec if spec is not None else RunSpec()
        if not isinstance(self.spec, RunSpec):
            raise ValueError(f"spec must be a helpers.train.runspec.RunSpec, got {type(self.spec).__name__}")
        _check_model(model)
        # a device the machine lacks: a clear error naming it and the fix (helpers.core.device.get_device)
        self.device = get_device(str(device)) if device is not None else next(model.parameters()).device
        self._step_context, self._autocast = self.spec.step_contexts(self.device)  # checks the spec, once
        _check_max_grad_norm(max_grad_norm)
        if self.spec.precision == "fp16" and (scaler is None or not scaler.is_enabled()):
            raise ValueError("fp16 needs a GradScaler, kept from step to step: "
                             "scaler = spec.make_scaler(device)")
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.max_grad_norm = max_grad_norm
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self.sync_every_micro_batch = sync_every_micro_batch
        self.after_forward, self.before_update = after_forward, before_update

    def __call__(self, batch: Any) -> StepOutput:
        """One optimizer step over a batch (a dict or an (x, y) pair), or a list of micro-batches."""
        micro = [as_batch(b, self.model) for b in ([batch] if is_batch(batch) else batch)]
        if not micro:
            raise ValueError("a training step got an empty list of micro-batches")
        model, optimizer, scaler, device = self.model, self.optimizer, self.scaler, self.device
        accum = len(micro)
        optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), device=device)
        tokens: int | torch.Tensor = 0
        widths: list[tuple[int | torch.Tensor, int]] = []  # (real tokens, padded width T) per micro-batch
        with self._step_context():
            for i, host in enumerate(micro):
                n = _tokens(host)  # counted before the copy: no sync
                batch_i = _to_device(host, device)
                last = i == accum - 1
                with grad_sync(model, sync=last or self.sync_every_micro_batch):  # DDP's no_sync, FSDP2's
                    with self._autocast():  # forward and loss; backward runs in the dtypes chosen here
                        loss = _loss(model, model(**batch_i))
                    if self.after_forward is not None:
                        loss = self.after_forward(i, accum, loss)
                    # average over micro-batches, so accumulation gives the gradient of one big batch
                    (scaler.scale(loss / accum) if scaler is not None else loss / accum).backward()
                step_loss += loss.detach().float() / accum
                tokens = tokens + n
                widths.append((n, batch_i["input_ids"].shape[-1]))
            if self.before_update is not None:
                self.before_update()
            scale = _scale_tensor(scaler)  # the scale this step used (compared after: skipped?)
            grad_norm = None
            if self.max_grad_norm is not None:
                if scaler is not None:
                    scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_grad_norm)
            if scaler is not None:
                scaler.step(optimizer)  # skipped when an inf/NaN gradient was found
                scaler.update()
            else:
                optimizer.step()
        if self.scheduler is not None:
            with warnings.catch_warnings():  # fp16: a skipped first step makes torch warn about the order
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)`")
                self.scheduler.step()
        samples = sum(b["input_ids"].shape[0] for b in micro)
        return StepOutput(step_loss, tokens, samples, widths, grad_norm, scale)


def _loss(model: nn.Module, out: Any) -> torch.Tensor:
    if not hasattr(out, "loss"):  # a tuple, a bare tensor: a model of one's own, not wrapped
        raise ValueError(f"{type(model).__name__} returned a {type(out).__name__}, not an object with "
                         ".loss: wrap it once, model = helpers.core.adapt.as_course_model(model) (it reads a "
                         "loss, logits or (logits, loss); pass loss_fn= when it returns logits)")
    loss = loss_of(out)
    if loss is None:
        raise ValueError("the model returned no loss: give the batches `labels` (or an (x, y) pair)")
    return loss


def _scale_tensor(scaler: torch.amp.GradScaler | None) -> torch.Tensor | None:
    # a tensor: get_scale() would wait for the device
    return grad_scaler_scale(scaler)


# --- the loop ---------------------------------------------------------------------------------------

def _resume(cfg: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any,
            scheduler: Any, sharded: bool) -> tuple[int, dict[str, Any]]:
    # (first step, history): from the newest checkpoint in cfg.checkpoint_dir, else a fresh start
    history: dict[str, Any] = {"losses": [], "skipped_steps": [], "scales": [], "lrs": [],
                               "resumed_from": None}
    folder = cfg.checkpoint_dir
    state = (resume_latest(folder, model, optimizer, scaler=scaler, scheduler=scheduler, sharded=sharded,
                           on_changed_settings=cfg.on_changed_settings)
             if folder is not None and cfg.resume else None)
    if state is None:
        return 0, history
    history.update({k: list(state["extra"].get(k, [])) for k in ("losses", "skipped_steps", "scales", "lrs")})
    history["resumed_from"] = state["step"]
    return state["step"], history


def _check_model(model: nn.Module) -> None:
    # lesson 02's model contract: model(**batch).loss
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be an nn.Module, got {type(model).__name__}")
    if not takes_course_batches(model):
        raise ValueError(adapter_hint(model))


def _check(model: nn.Module, cfg: TrainConfig, spec: RunSpec | None, device: Any,
           scheduler: Any) -> tuple[RunSpec, torch.device]:
    # (spec, device) with their defaults; the spec on the device is checked once, by the run's TrainStep
    if not isinstance(cfg, TrainConfig):
        raise ValueError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    if spec is not None and not isinstance(spec, RunSpec):
        raise ValueError(f"spec must be a helpers.train.runspec.RunSpec, got {type(spec).__name__}")
    if scheduler is not None and (cfg.lr_schedule != "constant" or cfg.warmup):
        raise ValueError("give either a scheduler or cfg.lr_schedule/warm-up, not both")
    spec = spec if spec is not None else RunSpec()
    _check_model(model)
    device = get_device(str(device)) if device is not None else next(model.parameters()).device
    if not spec.applied_to(model):
        raise ValueError(f"{spec} changes the model (attention, FP8, compile, activation checkpointing or "
                         "packing): train the model it returns, model = spec.apply(model)")
    return spec, device


def train(model: nn.Module, batches: Any, cfg: TrainConfig, device: torch.device | str | None = None, *,
          spec: RunSpec | None = None, optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
          on_step: Callable[[int, StepOutput], Any] | None = None) -> TrainResult:
    """Train `model` for `cfg.steps` optimizer steps on `batches` with `spec`'s switches (lessons 02-08).
    `optimizer`, `scheduler`: yours instead of cfg's; `on_step(steps_done, StepOutput)` after every step."""
    spec, device = _check(model, cfg, spec, device, scheduler)
    seed_everything(cfg.seed)
    model.to(device).train()
    if optimizer is None:
        optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay, spec.fused_adamw)
    if scheduler is None:
        scheduler = make_lr_scheduler(optimizer, cfg.steps, cfg.lr_schedule, cfg.warmup)
    scaler = spec.make_scaler(device)
    run_step = TrainStep(model, optimizer, spec=spec, device=device, scaler=scaler,
                         max_grad_norm=cfg.max_grad_norm, scheduler=scheduler)  # checked here, once
    sharded = is_sharded(model)  # FSDP2: every rank saves and loads its own shards (a DCP folder)
    start, history = _resume(cfg, model, optimizer, scaler, scheduler, sharded)
    source = _micro_batches(batches, start, cfg.grad_accum)
    meter = Meter(model, device, run_step.scaler, history, cfg.track_memory)
    # a CPU's peak memory is read with the profiler over one step: the second of this call, the first that
    # starts with the optimizer's state in place (AdamW makes its two moments in the first step, after the
    # step's peak); that step runs slower under the profiler and is left out of the throughput too
    memory_step = start + 1 if cfg.steps - start >= 2 else start
    bar = tqdm(range(start, cfg.steps), desc=f"train {spec.precision}", disable=not cfg.progress,
               initial=start, total=cfg.steps)
    for step in bar:
        meter.begin(optimizer.param_groups[0]["lr"])
        micro = [next(source) for _ in range(cfg.grad_accum)]  # fetching is part of the step's time
        # the profiler measures the CPU's peak memory: not while one of the caller's runs (they cannot nest)
        profiled = meter.profiles(step == memory_step and not profiler_enabled())
        if profiled:  # the profiler sees no frees of blocks made before it: the old gradients go first
            optimizer.zero_grad(set_to_none=True)
        with meter.memory(profiled, optimizer) as report:
            out = run_step(micro)
        meter.end(step, out, timed=step != start and not profiled, report=report)
        done = step + 1
        save = cfg.checkpoint_dir is not None and is_due(done, cfg.checkpoint_every, cfg.steps)
        if save or done % cfg.log_every == 0 or done == cfg.steps:
            meter.read_back(_scale_tensor(meter.scaler))  # the one wait for the device between log points
            bar.set_postfix(loss=f"{history['losses'][-1]:.4f}")
        if save:  # DDP: rank 0 writes, the others wait until it is on disk; FSDP2: every rank its shards
            extra = {k: history[k] for k in ("losses", "skipped_steps", "scales", "lrs")}
            save_step(cfg.checkpoint_dir, done, model, optimizer, scaler=scaler, scheduler=scheduler,
                      keep=cfg.keep_checkpoints, extra=extra, sharded=sharded)
        if on_step is not None:
            on_step(done, out)
    meter.read_back(_scale_tensor(meter.scaler))
    bar.close()
    return meter.result(start, cfg.steps, cfg.peak_flops)
