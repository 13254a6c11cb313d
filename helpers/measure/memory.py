"""Where training memory goes (lesson 03): a block's peak measured, a step's estimated (the course's formula,
or a dry run of any model with lesson 10's levers), the allocator's history, the largest batch that runs.
Guide: docs/library/measure.md#helpersmeasurememory"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import pickle
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from helpers.core import compat
from helpers.core.adapt import adapter_hint, as_batch, loss_of, takes_course_batches, vocab_size
from helpers.core.precision import autocast_context
from helpers.core.units import GiB, MiB
from helpers.measure import levers as lv
from helpers.measure.flops import matmul_params
from helpers.measure.levers import OPTIMIZER_STATE_BYTES, AdamW8bitState, Levers, LoRA, add_lora, local_bytes

_LORA_BASE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

__all__ = ["GiB", "MARGIN", "MemoryReport", "track_peak_memory", "peak_increase_bytes", "peak_rss_bytes",
           "tensor_bytes", "fake_copy",
           "MemoryEstimate", "FORMULA_ASSUMES", "DRY_RUN_ASSUMES", "DRY_RUN_OPTIMIZERS",
           "estimate_training_memory", "estimate_step_memory", "Levers", "LoRA", "local_bytes_of",
           "MemoryTimeline", "memory_timeline",
           "record_memory_history", "find_max_batch_size"]

# The share of a device's memory a plan or a fit leaves free: the CUDA context (0.3-0.5 GiB, outside PyTorch's
# allocator), the caching allocator's rounding and fragmentation, library workspaces (cuBLAS, cuDNN), and the
# estimators' error (lesson 03 checks the training estimator within 25 % of a measured step's peak).
MARGIN = 0.15


@dataclass
class MemoryReport:
    """Peak memory of one block of code, filled in when the block ends (lessons 01–03)."""

    device: str
    method: str  # how it was measured (one line, shown in tables)
    peak_bytes: int = 0  # the most bytes held at any moment: baseline + peak increase
    peak_increase_bytes: int = 0  # above what was held when the block began
    end_increase_bytes: int = 0  # still held when the block ended, above the start

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / MiB


def tensor_bytes(*things: Any) -> int:
    """Bytes of the distinct storages in modules, optimizers, tensors and containers of them (lesson 03):
    shared storage once, a DTensor's local shard; numbers and None in a container skipped, else ValueError."""
    storages: dict[int, int] = {}  # data pointer -> bytes: a storage shared by several tensors counts once

    def walk(thing: Any, top: bool) -> None:
        for t in _tensors_in(thing, top, walk):
            storage = _local(t).untyped_storage()
            if storage.nbytes():
                storages[storage.data_ptr()] = storage.nbytes()

    for thing in things:
        walk(thing, True)
    return sum(storages.values())


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this process holds: a DTensor's local shard (its own storage is a wrapper without data)."""
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor  # 0.5 s to import (2-core CPU), and needs distributed

        if isinstance(t, DTensor):
            return t.to_local()
    return t


def _tensors_in(thing: Any, top: bool, walk: Callable[[Any, bool], None]) -> list[torch.Tensor]:
    """The tensors `thing` holds directly; containers go back to `walk`, item by item."""
    if isinstance(thing, torch.Tensor):
        return [thing]
    if isinstance(thing, nn.Module):
        params = list(thing.parameters())
        return params + [p.grad for p in params if p.grad is not None] + list(thing.buffers())
    if isinstance(thing, torch.optim.Optimizer):
        walk(list(thing.state.values()), False)
    elif isinstance(thing, Mapping):  # a state_dict, an optimizer's state, a batch
        for value in thing.values():
            walk(value, False)
    elif isinstance(thing, (str, bytes, int, float, complex)) or thing is None:
        if top:
            raise ValueError(f"tensor_bytes counts tensors; got {type(thing).__name__} {thing!r}: pass "
                             "modules, optimizers, tensors, or mappings and sequences of them")
    elif isinstance(thing, Iterable):
        for item in thing:
            walk(item, False)
    else:
        raise ValueError(f"tensor_bytes cannot count a {type(thing).__name__}: pass modules, optimizers, "
                         "tensors, or mappings and sequences of them")
    return []


def _cpu_peak_from_events(events: Iterable) -> tuple[int, int]:
    """(peak, final) running sum of the profiler's CPU memory events, in time order."""
    deltas = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    current = peak = 0
    for _, nbytes in deltas:
        current += nbytes
        peak = max(peak, current)
    return peak, current


def _unmeasured(device: torch.device, what: str) -> str:
    """Why `what` cannot measure `device`, and the fix, in one line."""
    fix = "measure on the CPU (device 'cpu')"
    if device.type == "mps":
        fix = ("torch keeps no peak-memory statistics for Apple's GPU (MPS): " + fix
               + ", which get_device('auto') picks on a Mac unless COURSE_DEVICE=mps")
    return (f"{what} measures 'cuda' (allocator statistics) or 'cpu' (profiler memory events), not {device}: "
            f"{fix}")


@contextlib.contextmanager
def track_peak_memory(device: torch.device | str = "cpu", *,
                      baseline_bytes: int = 0) -> Iterator[MemoryReport]:
    """Peak memory of the `with` block, in the yielded MemoryReport at exit (lessons 01–03): CUDA allocator
    stats, or a CPU's profiler memory events plus `baseline_bytes` (bytes held before, unseen by them)."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("track_peak_memory was asked for a CUDA device, but torch sees no GPU")
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        report = MemoryReport(str(device), "torch.cuda.max_memory_allocated (caching allocator stats)")
        yield report
        torch.cuda.synchronize(device)
        report.peak_bytes = torch.cuda.max_memory_allocated(device)
        report.peak_increase_bytes = report.peak_bytes - start
        report.end_increase_bytes = torch.cuda.memory_allocated(device) - start
        return
    if device.type != "cpu":
        raise ValueError(_unmeasured(device, "track_peak_memory"))
    if compat.profiler_enabled():
        raise ValueError("track_peak_memory on CPU uses the profiler, and a profiler is already running: "
                         "measure memory outside it")

    report = MemoryReport(str(device), "torch.profiler memory events (CPU allocator), plus the baseline")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield report
    peak, final = _cpu_peak_from_events(prof.profiler.kineto_results.events())
    report.peak_increase_bytes = peak
    report.end_increase_bytes = final
    report.peak_bytes = baseline_bytes + peak


def peak_increase_bytes(fn: Callable[[], Any], device: torch.device | str = "cpu") -> int:
    """Peak bytes allocated while `fn()` runs, above what was held before: inputs not counted, output counted
    (lesson 01)."""
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(_unmeasured(device, "peak_increase_bytes"))
    with track_peak_memory(device) as report:
        fn()
    return int(report.peak_increase_bytes)


def peak_rss_bytes() -> int:
    """The process's peak resident set size in bytes, as the operating system counts it (lessons 03, 07)."""
    import resource  # Unix only (Windows has none): imported here, so the module imports everywhere

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS reports bytes, Linux KiB


# --- the estimator ----------------------------------------------------------------------------------

ACT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}  # bytes of a matmul output per precision
OPTIMIZERS = {"adamw": 8, "adam": 8, "sgd_momentum": 4, "sgd": 0}  # float32 state bytes per parameter
# the dry run's optimizers: these and bitsandbytes' 8-bit AdamW (helpers.measure.levers)
DRY_RUN_OPTIMIZERS = tuple(OPTIMIZER_STATE_BYTES)


@dataclass(frozen=True)
class MemoryEstimate:
    """Training memory in bytes, term by term (lesson 03)."""

    parameters: int
    gradients: int
    optimizer: int
    weight_copies: int  # autocast's 16-bit copies of the matmul weights, alive until the backward
    activations: int  # saved for the backward pass
    temporary: int  # the largest short-lived buffer: the logits and their gradient
    precision: str
    batch_size: int
    seq_len: int
    method: str = "formula"  # "formula" (the course's, for its own Transformer) or "dry run" (any model)
    assumes: tuple[str, ...] = ()  # what the method takes for granted, one sentence each
    dry_run_peak: int | None = None  # the dry run's high-water mark (the formula has none: see `peak`)
    host: int = 0  # bytes kept in the CPU's memory, not the device's (offload: shards, gradients, state)
    at_peak: Mapping[str, int] = field(default_factory=dict, compare=False)  # the tracker's categories then
    levers: Any = None  # the dry run's helpers.measure.levers.Levers

    @property
    def total(self) -> int:
        """Every term at once: an upper bound of the step's peak."""
        return (self.parameters + self.gradients + self.optimizer + self.weight_copies
                + self.activations + self.temporary)

    @property
    def peak(self) -> int:
        """The step's expected high-water mark in bytes (a dry run's, or the formula's)."""
        if self.dry_run_peak is not None:
            return self.dry_run_peak
        # gradients appear (zero_grad(set_to_none=True)) while activations are freed: the larger counts
        return (self.parameters + self.optimizer + self.weight_copies
                + max(self.activations + self.temporary, self.gradients))

    def breakdown(self) -> dict[str, int]:
        """The terms by name, in bytes (for tables and stacked bars); with offload, what the CPU keeps."""
        terms = {"parameters": self.parameters, "gradients": self.gradients,
                 "optimizer state": self.optimizer, "autocast weight copies": self.weight_copies,
                 "activations": self.activations,
                 "temporary (logits)": self.temporary}
        return {**terms, "on the CPU (offloaded)": self.host} if self.host else terms


def _config_and_counts(model: Any) -> tuple[Any, int, int, int]:
    """(TransformerConfig, parameters, parameter tensors, matmul parameters) of a model or a config."""
    # duck-typed (a module with a `.cfg`; a config that builds one): measure does not import helpers.model
    if not isinstance(model, nn.Module) and callable(getattr(model, "build", None)):
        with torch.device("meta"):  # build it without allocating: exact counts for free
            model = model.build()
    cfg = getattr(model, "cfg", None)
    if not isinstance(model, nn.Module) or not all(hasattr(cfg, a) for a in ("d_model", "n_heads", "attn")):
        raise ValueError(f"the course's formula takes a SmallTransformer or a TransformerConfig, got "
                         f"{type(model).__name__}: estimate another model with method='dry run' (any "
                         "nn.Module), or describe it with a TransformerConfig of its shape")
    params = list({id(p): p for p in model.parameters()}.values())
    return cfg, sum(p.numel() for p in params), len(params), matmul_params(model)


FORMULA_ASSUMES = (
    "the pre-norm block of helpers.model.models: LayerNorm, attention, residual; LayerNorm, MLP, residual",
    "the MLP keeps its hidden before and after an exact GELU (2·F values per token); an unfused tanh GELU "
    "(GPT-2's gelu_new) keeps about four more tensors of F per token, which are not counted",
    "naive attention keeps its H×T probabilities per token (float32, CUDA's autocast policy); an SDPA "
    "kernel keeps a log-sum-exp per head",
    "weights, gradients and optimizer state in float32; under autocast a 16-bit copy of each matmul weight",
    "the largest temporary is the token head's logits and their gradient (B·T·vocab), none for a classifier",
    "gradients appear while activations are freed: the peak counts the larger of the two",
    "no allocator rounding, library workspaces or fragmentation",
)
DRY_RUN_ASSUMES = (
    "one training step (forward, loss, backward, optimizer step) after a first one that made the optimizer "
    "state, run on fake tensors on the CPU: every tensor's bytes, none allocated (torch's MemTracker)",
    "the CPU's kernels and autocast policy: on a GPU, SDPA's flash or memory-efficient kernels and CUDA's "
    "autocast (softmax in float32) can keep different intermediates",
    "no allocator rounding, library workspaces (cuBLAS, cuDNN) or fragmentation: leave a margin on a GPU",
    "levers (helpers.measure.levers): accumulation from its second micro-batch on (gradients held); FSDP2 "
    "on a fake process group of `shards` ranks, this rank counted, the CPU's FSDP2 (no CUDA streams: a GPU's "
    "prefetch may hold one more gathered block); with offload the device's peak is read at the step's peak",
)
METHODS = ("auto", "formula", "dry run")


def _is_course_model(model: Any) -> bool:
    """A SmallTransformer (a module with a `.cfg`) or a TransformerConfig (it builds one)."""
    if isinstance(model, nn.Module):
        target = getattr(model, "cfg", None)
    elif callable(getattr(model, "build", None)):
        target = model
    else:
        return False
    return all(hasattr(target, a) for a in ("d_model", "n_heads", "attn"))


def estimate_training_memory(model: Any, batch_size: int, seq_len: int, *, precision: str = "fp32",
                             optimizer: str = "adamw", activation_checkpointing: bool = False,
                             attn_probs_dropout: bool = False, method: str = "auto",
                             batch: Any = None) -> MemoryEstimate:
    """A training step's memory in bytes (lesson 03): the formula for a SmallTransformer or TransformerConfig,
    else a dry run; `method` forces one. `attn_probs_dropout`: attention keeps T×T dropout masks (BERT's)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: use one of {METHODS}")
    if precision not in ACT_BYTES:
        raise ValueError(f"unknown precision {precision!r}: use one of {tuple(ACT_BYTES)}")
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"need batch_size >= 1 and seq_len >= 1, got {batch_size}, {seq_len}")
    course = _is_course_model(model)
    if method == "dry run" or (method == "auto" and not course and isinstance(model, nn.Module)):
        if not isinstance(model, nn.Module):  # a TransformerConfig: its model, built on fake tensors
            with compat.fake_tensor_mode():
                model = model.build()
        if batch is None:
            batch = _default_batch(model, batch_size, seq_len)
        return estimate_step_memory(model, batch, precision=precision, optimizer=optimizer,
                                    checkpointing=activation_checkpointing)
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r} for the formula: use one of {tuple(OPTIMIZERS)} "
                         f"(the dry run, method='dry run', takes {DRY_RUN_OPTIMIZERS})")
    return _formula(model, batch_size, seq_len, precision=precision, optimizer=optimizer,
                    activation_checkpointing=activation_checkpointing, attn_probs_dropout=attn_probs_dropout)


def _formula(model: Any, batch_size: int, seq_len: int, *, precision: str, optimizer: str,
             activation_checkpointing: bool, attn_probs_dropout: bool) -> MemoryEstimate:
    """The course's formula, term by term (docs/library/measure.md)."""
    cfg, n_params, n_tensors, n_matmul = _config_and_counts(model)
    if seq_len > cfg.max_len:
        raise ValueError(f"seq_len={seq_len} is longer than the model's max_len={cfg.max_len}")
    a = ACT_BYTES[precision]
    autocast = a == 2
    d, f, h, t, v = cfg.d_model, cfg.d_ff, cfg.n_heads, seq_len, cfg.vocab_size
    tokens = batch_size * seq_len

    # bytes per token of one block, saved for its backward
    residuals = 2 * 4 * d  # the block's input and the stream after attention, float32
    norms = 2 * 2 * 4  # mean and 1/std of both LayerNorms
    matmul_inputs = (d + 3 * d + d + d) * a  # LN1 out, Q/K/V, attention out, LN2 out
    mlp = 2 * f * a  # hidden before and after GELU
    if cfg.attn == "naive":
        # softmax output (float32), and under autocast its 16-bit copy for the matmul with V. This is
        # CUDA's autocast policy (softmax in float32); a CPU's keeps softmax in 16 bits, so there the
        # estimate is high by 4·H·T bytes per token and layer.
        attention = h * t * (4 + (a if autocast else 0))
    else:
        attention = h * 4  # the kernel's log-sum-exp per head
    masks = 2 * d if cfg.dropout > 0 else 0  # two residual dropout masks, 1 byte per element
    if attn_probs_dropout and cfg.dropout > 0:
        attention += h * t * (1 + a)  # the probabilities' dropout mask and the dropped copy
    block = residuals + norms + matmul_inputs + mlp + attention + masks

    if cfg.n_classes:  # final LayerNorm input and output, pooled vector
        head, temporary = 4 * d + 8 + 4 * d, 0
    else:  # final LayerNorm, its output into the head, log-softmax output (float32)
        head = 4 * d + 8 + a * d + 4 * v
        temporary = tokens * v * (4 + a)  # the logits' gradient and the log-softmax output's
    if activation_checkpointing:  # each block's input kept; one block at a time recomputed
        activations = tokens * (cfg.n_layers * 4 * d + block + head)
    else:
        activations = tokens * (cfg.n_layers * block + head)
    return MemoryEstimate(
        parameters=4 * n_params, gradients=4 * n_params,
        optimizer=OPTIMIZERS[optimizer] * n_params + (4 * n_tensors if optimizer.startswith("adam") else 0),
        weight_copies=2 * n_matmul if autocast else 0, activations=activations, temporary=temporary,
        precision=precision, batch_size=batch_size, seq_len=seq_len, assumes=FORMULA_ASSUMES)


def _default_batch(model: nn.Module, batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
    """Token ids (batch_size, seq_len) and labels: one per row for a classifier, else one per token."""
    inner = compat.unwrap_model(model)
    inner = getattr(inner, "model", inner) if type(inner).__name__ == "CourseModel" else inner
    per_row = (type(inner).__name__.endswith("ForSequenceClassification")
               or bool(getattr(getattr(inner, "cfg", None), "n_classes", 0)))
    vocab = vocab_size(inner, fix="give the dry run a batch, estimate_training_memory(..., batch=(x, y))")
    ids = torch.randint(vocab, (batch_size, seq_len))
    labels = torch.zeros(batch_size, dtype=torch.long) if per_row else ids.clone()
    return {"input_ids": ids, "labels": labels}


def _fake_like(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """`t`'s shape, strides and dtype (or `dtype`) on `device`: no memory inside a fake mode."""
    return torch.empty_strided(t.size(), t.stride(), dtype=dtype or t.dtype, device=device)


def fake_copy(model: nn.Module, device: torch.device, dtype: torch.dtype | None = None) -> nn.Module:
    """`model` with fake parameters and buffers (inside the fake mode; on meta, a meta copy), floats in
    `dtype` if given, tied weights tied: the dry run's and the op count's copy (lessons 03, 04, 09)."""
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in memo:
            fake = _fake_like(t, device, dtype if t.is_floating_point() else None)
            memo[id(t)] = nn.Parameter(fake, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) \
                else fake
    # tensors a module keeps as plain attributes (Llama's rotary `original_inv_freq`, left in fp32 when a
    # cast to 16 bits made a new `inv_freq` buffer): copied as fakes too, not cloned by deepcopy inside the
    # fake mode (torch 2.7 refuses a real tensor there)
    for m in model.modules():
        for t in vars(m).values():
            if isinstance(t, torch.Tensor) and id(t) not in memo:
                memo[id(t)] = _fake_like(t, device, None)
    return copy.deepcopy(model, memo)


def _optimizer(name: str, params: list[nn.Parameter], fused: bool, kernels: str) -> torch.optim.Optimizer:
    if name in ("adamw", "adam"):
        opt = compat.make_adamw([{"params": params}], 1e-3, fused)
        return opt if name == "adamw" else torch.optim.Adam(params, lr=1e-3)
    if name == "adamw8bit":
        return AdamW8bitState(params, kernels=kernels)
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9 if name == "sgd_momentum" else 0.0)


def _with_levers(model: nn.Module, levers: Levers, mesh: Any) -> nn.Module:
    """The fake copy with checkpointing and FSDP2 (LoRA's adapters are on it already)."""
    if levers.checkpointing:
        lv.turn_on_checkpointing(model)
    if levers.sharded:
        model = lv.shard(model, mesh, offload=levers.offload)
    return model


def _dry_run_levers(accumulation: int, checkpointing: bool, shards: int, offload: bool, weights16: bool,
                    optimizer: str, lora: LoRA | None) -> Levers:
    """The dry run's levers, each checked (Levers does), and the combinations the dry run cannot count."""
    if lora is not None and not isinstance(lora, LoRA):
        raise ValueError(f"lora must be a LoRA(...) or None, got {type(lora).__name__}")
    levers = Levers(accumulation=accumulation, checkpointing=checkpointing, gpus=shards,
                    sharding="full" if shards > 1 else "none", offload=offload, weights16=weights16,
                    optimizer=optimizer, lora_rank=lora.rank if lora is not None else 0)
    if optimizer == "adamw8bit" and levers.sharded:
        raise ValueError("optimizer='adamw8bit' with shards > 1 or offload: the dry run counts bitsandbytes' "
                         "8-bit AdamW on whole parameters, not on FSDP2's shards (not measured here): use "
                         "optimizer='adamw' with sharding, or shards=1")
    return levers


def estimate_step_memory(model: nn.Module, batch: Any, *, precision: str = "fp32", optimizer: str = "adamw",
                         fused: bool = True, accumulation: int = 1, checkpointing: bool = False,
                         shards: int = 1, offload: bool = False, lora: LoRA | None = None,
                         weights16: bool = False, kernels: str = "cuda") -> MemoryEstimate:
    """One training step's memory in bytes of any nn.Module on `batch` (a dict or (x, y)), from a dry run on
    fake tensors with lesson 10's levers; `model(**batch)` must return `.loss` (lessons 03, 10)."""
    levers = _dry_run_levers(accumulation, checkpointing, shards, offload, weights16, optimizer, lora)
    if kernels not in ("cuda", "cpu"):
        raise ValueError(f"kernels={kernels!r}: use 'cuda' (a GPU's kernels) or 'cpu'")
    if not isinstance(model, nn.Module):
        raise ValueError(f"estimate_step_memory takes an nn.Module, got {type(model).__name__}")
    if not takes_course_batches(model):
        raise ValueError(adapter_hint(model))
    host = as_batch(batch)
    ids = host.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() < 1:
        raise ValueError("the dry run's batch needs `input_ids` (or x of an (x, y) pair) as a tensor")
    device = torch.device("cpu")  # a fake CUDA tensor needs CUDA; the CPU's kernels stand in (assumes)
    if lora is not None:  # peft moves its adapters with .to(), which fake tensors refuse: adapters on meta
        model = add_lora(fake_copy(model, torch.device("meta"), _LORA_BASE[lora.base_dtype]), lora)
    elif weights16:  # weights, gradients and Adam's state in bf16: the model's own copy cast
        model = fake_copy(model, torch.device("meta"), torch.bfloat16)
    group = compat.fake_process_group(shards) if levers.sharded else contextlib.nullcontext()
    # the batch's values known to the fake mode: see compat.fake_step
    with group as mesh, compat.fake_step(host, device) as fake_batch:
        fake = _with_levers(fake_copy(model, device).train(), levers, mesh)
        params = [p for p in fake.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters: nothing to train")
        opt = _optimizer(optimizer, params, fused, kernels)
        micro = min(accumulation, 2)  # from the second micro-batch on, each one holds what the second does

        def step(next_pass: Callable[[], None]) -> None:
            opt.zero_grad(set_to_none=True)
            for i in range(micro):
                if i:
                    next_pass()
                with autocast_context(precision, device):
                    loss = loss_of(fake(**fake_batch))
                if loss is None:
                    raise ValueError("the model returned no loss for the dry run's batch: give it labels")
                (loss / micro).backward()
            opt.step()

        for p in params:  # the optimizer's state appears at its first step: make it without a pass
            p.grad = torch.zeros_like(p)
        opt.step()
        if levers.sharded:  # a step as the second of a run: the state held
            peak = compat.tracked_peak_sharded(step, fake, opt, passes=True)
        else:
            peak = compat.tracked_peak(step, fake, opt, passes=True)
        grads = local_bytes_of(params)
        state = local_bytes_of(t for s in opt.state.values() for t in s.values())
        kept = local_bytes_of(fake.parameters())  # this rank's parameters (a shard each under FSDP2)
    inputs = tensor_bytes([v for v in host.values() if isinstance(v, torch.Tensor)])
    rows, width = (int(ids.shape[0]), int(ids.shape[-1]) if ids.dim() > 1 else 1)
    return _dry_run_estimate(peak, levers, grads=grads, state=state, kept=kept, inputs=inputs,
                             precision=precision, rows=rows, width=width)


def local_bytes_of(tensors: Iterable[Any]) -> int:
    """helpers.measure.levers.local_bytes (the bytes of the tensors this rank holds, each once)."""
    return local_bytes(list(tensors))


def _dry_run_estimate(peak: Mapping[str, int], levers: Levers, *, grads: int, state: int, kept: int,
                      inputs: int, precision: str, rows: int, width: int) -> MemoryEstimate:
    """The tracker's categories at the peak, as the estimate's terms (see `estimate_step_memory`)."""
    common = dict(precision=precision, batch_size=rows, seq_len=width, method="dry run",
                  assumes=DRY_RUN_ASSUMES, at_peak=dict(peak), levers=levers, weight_copies=0)
    if not levers.sharded:
        return MemoryEstimate(
            parameters=peak.get("Parameter", 0) + peak.get("Buffer", 0), gradients=grads,
            optimizer=peak.get("Optstate", 0), activations=peak.get("Activation", 0),
            temporary=peak.get("Temp", 0) + peak.get("Other", 0), dry_run_peak=peak.get("Total", 0) + inputs,
            **common)
    # FSDP2: this rank's shards, the blocks gathered whole at the peak, and what the collectives hold
    on_cpu = (peak.get("Sharded Param", 0) + peak.get("Sharded Grad", 0) + peak.get("OptState", 0)
              if levers.offload else 0)
    device_peak = peak.get("Total", 0) - on_cpu + inputs
    parameters = (0 if levers.offload else peak.get("Sharded Param", 0)) + peak.get("Unsharded Param", 0) \
        + peak.get("Buffer", 0)
    optimizer = 0 if levers.offload else peak.get("OptState", 0)
    activations = peak.get("Activation", 0)
    return MemoryEstimate(
        parameters=parameters, gradients=0 if levers.offload else grads, optimizer=optimizer,
        activations=activations,
        temporary=max(device_peak - inputs - parameters - optimizer - activations, 0),
        dry_run_peak=device_peak, host=kept + grads + state if levers.offload else 0, **common)


# --- memory over time -------------------------------------------------------------------------------

CATEGORIES = ("parameter", "optimizer state", "input", "temporary", "activation", "gradient",
              "autograd detail", "unknown")


@dataclass
class MemoryTimeline:
    """Bytes held over time, by category (from torch's memory profiler) (lesson 03)."""

    times_s: list[float]  # from the first event
    bytes_by_category: dict[str, list[int]] = field(default_factory=dict)
    device: str = "cpu"

    def total(self) -> list[int]:
        """Bytes held at each time, all categories together."""
        return [sum(col) for col in zip(*self.bytes_by_category.values())]

    @property
    def peak_bytes(self) -> int:
        return max(self.total(), default=0)


def memory_timeline(fn: Callable[[], Any], device: torch.device | str = "cpu") -> MemoryTimeline:
    """Run `fn()` once under the profiler and return its bytes over time, by category (lesson 03)."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("memory_timeline was asked for a CUDA device, but torch sees no GPU")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        # torch marks export_memory_timeline deprecated in favour of a CUDA-only tool; on a CPU it is
        # still the only categorised timeline there is
        warnings.simplefilter("ignore", FutureWarning)
        out = Path(tmp) / "timeline.json"
        prof.export_memory_timeline(str(out), device=str(device))
        times_us, sizes = json.loads(out.read_text())
    if not times_us:
        return MemoryTimeline([], {c: [] for c in CATEGORIES}, str(device))
    # sizes[i] = [unused, one column per category in CATEGORIES' order]
    t0 = times_us[0]
    columns = list(zip(*sizes))[1:1 + len(CATEGORIES)]
    return MemoryTimeline([(t - t0) / 1e6 for t in times_us],
                          {c: list(col) for c, col in zip(CATEGORIES, columns)}, str(device))


def record_memory_history(fn: Callable[[], Any], path: str | Path, *,
                          max_entries: int = 100_000) -> dict[str, Path]:
    """GPU only: the CUDA allocator's history while `fn()` runs, as `<path>.pickle` (pytorch.org/memory_viz)
    and `<path>.html`; returns both paths (lesson 03)."""
    if not torch.cuda.is_available():
        raise ValueError("record_memory_history needs a CUDA GPU (it records the CUDA caching allocator); "
                         "on a CPU use memory_timeline")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    snapshot = compat.cuda_memory_snapshot(fn, max_entries)
    pickle_path, html_path = path.with_suffix(".pickle"), path.with_suffix(".html")

    with open(pickle_path, "wb") as f:
        pickle.dump(snapshot, f)
    html_path.write_text(compat.memory_snapshot_html(snapshot))
    return {"snapshot": pickle_path, "html": html_path}


# --- the largest batch that fits --------------------------------------------------------------------

def _is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "out of memory" in str(err).lower())


def find_max_batch_size(step_fn: Callable[[int], Any], *, start: int = 1, limit: int = 4096,
                        device: torch.device | str | None = None, verbose: bool = True) -> int:
    """The largest batch `step_fn(n)` runs on this device, by running steps until out of memory (lesson 03);
    predict_max_batch_size asks the dry run instead. At most `limit`; 0 when `start` does not fit."""
    if start < 1 or limit < start:
        raise ValueError(f"need 1 <= start <= limit, got start={start}, limit={limit}")
    # whose cache to empty after a failure: the given device, or any GPU torch sees
    cuda = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")

    def fits(n: int) -> bool:
        try:
            step_fn(n)
            ok = True
        except Exception as err:  # noqa: BLE001 - out-of-memory is told apart below
            if not _is_oom(err):
                raise
            ok = False
            del err  # the traceback pins the failed step's tensors: let them go
        if not ok:
            gc.collect()  # frames of the failed step may sit in reference cycles
            if cuda:
                torch.cuda.empty_cache()  # hand the failed attempt's cached blocks back
        if verbose:
            print(f"batch {n:>5}: {'fits' if ok else 'out of memory'}")
        return ok

    good, bad = 0, None
    n = start
    while n <= limit:  # double until out of memory, then bisect between the last fit and the first failure
        if fits(n):
            good, n = n, n * 2
        else:
            bad = n
            break
    if good == 0:
        return 0
    if bad is None:  # doubling passed the limit without a failure: try the limit itself
        if good == limit or fits(limit):
            return limit
        bad = limit
    return _bisect(fits, good, bad)


def _bisect(fits: Callable[[int], bool], good: int, bad: int) -> int:
    """Largest n in [good, bad) that fits, knowing `good` fits and `bad` does not."""
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
