"""Plan a training run on GPUs you do not have: will it fit, how fast, what it costs (lesson 09). Every figure
is predicted on this CPU from the dry run, the step's ops counted on fake tensors and each class's datasheet
roofs; `ASSUMPTIONS` says what it takes for granted. Guide: docs/plan.md"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from helpers.core import compat
from helpers.core.adapt import as_batch, batch_shape, vocab_size
from helpers.core.precision import precision_runs, training_precision
from helpers.measure.flops import model_flops_per_token, model_shape
from helpers.measure.gpus import GPU, GPUS, gpu, seen_as
from helpers.measure.memory import MARGIN
from helpers.measure.opcount import count_step
from helpers.measure.regimes import is_synchronous
from helpers.measure.roofline import LAUNCH_S, Roofline, datasheet_roofline, mfu_peak
from helpers.model.fp8 import fp8_capable
from helpers.plan.batch_search import DryRuns, check_line, predict_max_batch_size
from helpers.plan.report import EXAMPLE_PRICES, ClassPlan, Plan, Prices
from helpers.plan.steptime import ASSUMED, StepTime, step_time
from helpers.train.runspec import RunSpec

__all__ = ["ASSUMPTIONS", "class_rules", "measured_roofs", "meta_copy", "example_batch", "predict_step",
           "plan"]

# fp16 and bf16 hold the same bytes and run the same ops under autocast: one dry run and one count serve both
_FAMILY = {"fp16": "bf16", "bf16": "bf16", "fp32": "fp32", "tf32": "fp32"}

ASSUMPTIONS = (
    "every op runs at its roof: FLOPs / the datasheet's dense peak for the precision (matmuls and attention; "
    "the other ops at the fp32 CUDA-core peak), or bytes / the datasheet's memory bandwidth, whichever is "
    "slower; a real kernel runs below its roof, so a real step is slower",
    f"one kernel per op call; the host issues one every {LAUNCH_S * 1e6:g} µs (an eager PyTorch step; a "
    "parameter)",
    ASSUMED[0],
    "bytes: each op reads its inputs and writes its outputs once (lesson 04's count); caches (L2) are not "
    "modelled; an embedding's rows are counted as if every token were distinct",
    "the memory and the ops come from a step run on fake tensors on the CPU: the CPU's kernels and autocast "
    "policy stand in for the GPU's (SDPA's CPU flash kernel keeps a log-sum-exp per row, as CUDA's flash and "
    "memory-efficient kernels do); SDPA's dropout runs inside a GPU's kernel, so the CPU step runs SDPA "
    "without it (with it, the CPU would fall back to the math path and keep T x T matrices a GPU does not)",
    "fp16 runs the same ops and holds the same bytes as bf16: one dry run and one count serve both (the "
    "GradScaler's few ops are left out)",
    "the memory margin is the course's (helpers.measure.memory.MARGIN): the CUDA context, the allocator's "
    "rounding and library workspaces, none of which the dry run sees",
    "tokens per step = batch x sequence length (no padding); an epoch = the data set's tokens / tokens per s",
    "decode at batch 1 reads every weight once per token (16-bit weights) and the KV cache of the context: "
    "tokens/s <= bandwidth / (weight bytes + KV bytes); the KV cache holds keys and values of every layer in "
    "16 bits",
)
_FP8 = ("FP8 (RunSpec.fp8): the Linear layers' matmuls at the datasheet FP8 rate on classes that have FP8 "
        "tensor cores; the scaling and casting kernels are not counted")
_COMPILE = "RunSpec.compile is not modelled: the step is predicted as eager PyTorch runs it, op by op"



# --- this machine's roofs, measured ----------------------------------------------------------------------

def measured_roofs(roofline: Roofline, *, overhead_s: float, memory_roofs: Roofline | None = None,
                   device: torch.device | str = "cpu", name: str = "") -> Roofline:
    """This machine's measured roofs (lessons 00, 04): matmul rates, copy bandwidth, `overhead_s` per op call,
    cache roofs; lesson 09 checks the planner against this machine's own step."""
    if not isinstance(roofline, Roofline):
        raise ValueError(f"roofline must be a helpers.measure.roofline.Roofline, got "
                         f"{type(roofline).__name__}")
    if not overhead_s >= 0:
        raise ValueError(f"overhead_s must be >= 0 seconds, got {overhead_s!r}")
    tiers = {} if memory_roofs is None else dict(  # `measure_memory_roofs`' roofs by working set
        cache_sizes=memory_roofs.cache_sizes, cache_bandwidths=memory_roofs.cache_bandwidths,
        cache_bytes=memory_roofs.cache_bytes, by_pattern=memory_roofs.by_pattern)
    return replace(roofline, device_name=name or roofline.device_name, overhead_s=overhead_s,
                   synchronous=is_synchronous(device), **tiers,
                   source=f"measured on {roofline.device_name}: matmul and copy (lessons 00, 04), "
                          f"{overhead_s * 1e6:.3g} µs per op call")


# --- the course's rules, asked of a GPU we do not have -----------------------------------------------------

def class_rules(g: GPU) -> tuple[str, str, list[str], float, str]:
    """(precision, why, techniques, MFU's peak FLOP/s, its source) of class `g`, by the course's rules, asked
    as if torch saw it (lessons 09, 10)."""
    with seen_as(g):
        cuda = torch.device("cuda")
        precision, why = training_precision(cuda)
        found = [name for name, ok in (("bf16", precision_runs("bf16", cuda)),
                                       ("fp16", precision_runs("fp16", cuda)),
                                       ("FP8", fp8_capable(cuda)[0]),
                                       ("FlexAttention", compat.flex_trains(cuda)[0])) if ok]
        peak = mfu_peak(cuda)
    assert peak is not None, f"{g.name}: helpers.measure.roofline has no datasheet row"
    return precision, why, found, peak.flops, f"{peak.precision} {peak.flops / 1e12:,.1f} TFLOP/s"


# --- the model and its batch, without allocating ------------------------------------------------------

def meta_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` whose parameters and buffers are on the meta device: shapes only, nothing allocated,
    the model itself untouched (tied weights stay tied) (lesson 09)."""
    memo: dict[int, Any] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in memo:
            empty = torch.empty_like(t, device="meta")
            memo[id(t)] = nn.Parameter(empty, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) \
                else empty
    return copy.deepcopy(model, memo)


def _per_row_labels(model: nn.Module) -> bool:
    inner = compat.unwrap_model(model)
    inner = getattr(inner, "model", inner) if type(inner).__name__ == "CourseModel" else inner
    return (type(inner).__name__.endswith("ForSequenceClassification")
            or bool(getattr(getattr(inner, "cfg", None), "n_classes", 0)))


def example_batch(model: nn.Module, batch_size: int, seq_len: int, *,
                  seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids (batch_size, seq_len) and labels for `model`'s task: one per row for a classifier
    (a *ForSequenceClassification, a SmallTransformer with classes), one per token otherwise (lesson 09)."""
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"need batch_size >= 1 and seq_len >= 1, got {batch_size}, {seq_len}")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(vocab_size(model, fix="give plan() a batch"), (batch_size, seq_len), generator=g)
    labels = torch.zeros(batch_size, dtype=torch.long) if _per_row_labels(model) else ids.clone()
    return {"input_ids": ids, "labels": labels}




def _prepared(model: nn.Module, spec: RunSpec) -> tuple[nn.Module, list[str]]:
    """A meta copy with the spec's model switches a dry run can take, and notes on those it cannot."""
    notes = []
    copy_ = meta_copy(model)
    attn = spec.attn if spec.attn in ("eager", "sdpa") else None
    if spec.attn in ("flex", "varlen"):
        notes.append(f"RunSpec.attn={spec.attn!r} is counted as the model's own attention (its CPU dry run "
                     "has no backward for it)")
    switches = RunSpec(attn=attn, activation_checkpointing=spec.activation_checkpointing)
    return switches.apply(copy_) if (attn or spec.activation_checkpointing) else copy_, notes



# --- the step's time -------------------------------------------------------------------------------------

def predict_step(model: nn.Module, batch: Mapping[str, Any], roofs: Roofline, *, precision: str = "fp32",
                 spec: RunSpec | None = None) -> StepTime:
    """`count_step` and `step_time` in one call: the predicted time of one training step of `model` on `batch`
    on `roofs` (a GPU class's datasheet roofs, or this machine's measured ones) (lesson 09)."""
    spec = spec or RunSpec()
    prepared, _ = _prepared(model, spec)
    counts = count_step(prepared, batch, precision=precision, fused_adamw=spec.fused_adamw)
    return step_time(counts, roofs, precision, fp8=spec.fp8)



def _kv_bytes_per_token(model: nn.Module) -> int:
    shape = model_shape(model)
    kv_heads = shape.n_heads
    for m in model.modules():
        n = getattr(getattr(m, "config", None), "num_key_value_heads", None)
        if isinstance(n, int) and n > 0:
            kv_heads = n
            break
    return 2 * shape.n_layers * kv_heads * shape.head_dim * 2


def plan(model: nn.Module, batch: Mapping[str, Any] | tuple[int, int], spec: RunSpec | None = None, *,
         gpus: Sequence[str | GPU] | None = None, dataset_tokens: float | None = None,
         prices: Prices | None = EXAMPLE_PRICES, launch_s: float = LAUNCH_S,
         search: bool = True) -> Plan:
    """Plan a training step of `model` on `batch` (a dict, (x, y), or a (batch, seq_len) shape) with `spec` on
    each class of `gpus`: fit, largest batch (`search`), time, cost. Nothing runs on a GPU (lesson 09)."""
    started = time.perf_counter()
    spec = spec or RunSpec()
    if not isinstance(spec, RunSpec):
        raise ValueError(f"spec must be a helpers.train.runspec.RunSpec, got {type(spec).__name__}")
    classes = [gpu(g) for g in (gpus if gpus is not None else list(GPUS))]
    if not classes:
        raise ValueError("give at least one GPU class: plan(..., gpus=['T4', 'A100-80'])")
    if dataset_tokens is not None and not dataset_tokens > 0:
        raise ValueError(f"dataset_tokens must be a positive number of tokens, got {dataset_tokens!r}")
    if isinstance(batch, tuple) and len(batch) == 2 and all(isinstance(x, int) for x in batch):
        batch = example_batch(model, *batch)
    host = as_batch(batch)
    rows, seq = batch_shape(host)
    prepared, notes = _prepared(model, spec)
    per_token = model_flops_per_token(prepared, seq)
    counts: dict[str, dict] = {}
    runs: dict[str, DryRuns] = {}
    misses: dict[str, float | None] = {}  # per precision family: how far the dry runs' line missed its check
    usables = [int(g.total_memory * (1 - MARGIN)) for g in classes]
    out = []
    for g in classes:
        precision, why, techniques, mfu_flops, mfu_source = class_rules(g)
        family = _FAMILY[precision]
        if family not in counts:
            counts[family] = count_step(prepared, host, precision=family, fused_adamw=spec.fused_adamw)
            runs[family] = DryRuns(prepared, host, family, spec.fused_adamw)
        roofs = datasheet_roofline(g, launch_s=launch_s)
        usable = int(g.total_memory * (1 - MARGIN))
        fp8 = spec.fp8 and "FP8" in techniques
        if search and family not in misses:
            misses[family] = check_line(runs[family], rows, usables)
        largest = None
        if search:  # the weights and AdamW's state alone over the memory: no batch fits, none to search
            largest = 0 if runs[family].states > usable else predict_max_batch_size(
                runs[family], usable, start=rows, known=runs[family].peaks, miss=misses[family])
        weights = 2 * sum(p.numel() for p in prepared.parameters())
        # one generated token reads every weight and the keys and values of the whole context once
        kv = 0 if _per_row_labels(model) else seq * _kv_bytes_per_token(prepared)
        decode = None if _per_row_labels(model) else g.bandwidth / (weights + kv)
        out.append(ClassPlan(g, precision, why, tuple(techniques), runs[family](rows), usable, largest,
                             step_time(counts[family], roofs, precision, fp8=fp8), rows * seq, mfu_flops,
                             mfu_source, per_token, prices.of(g.key) if prices else None, dataset_tokens,
                             decode))
    assumptions = list(ASSUMPTIONS)
    assumptions[1] = assumptions[1].replace(f"{LAUNCH_S * 1e6:g} µs", f"{launch_s * 1e6:g} µs")
    assumptions += ([_FP8] if spec.fp8 else []) + ([_COMPILE] if spec.compile else []) + notes
    if prices is not None:
        example = "an EXAMPLE, not current: " if prices is EXAMPLE_PRICES else ""
        assumptions.append(f"prices per GPU-hour: {example}{prices.source} ({prices.date}); prices change: "
                           "pass your own (Prices) with the day you read them")
    lm = not _per_row_labels(model)
    weights = 2 * sum(p.numel() for p in prepared.parameters())
    return Plan(_describe(model), rows, seq, spec, tuple(out), weights,
                _kv_bytes_per_token(prepared) if lm else None, prices, dataset_tokens, launch_s,
                tuple(assumptions), time.perf_counter() - started)


def _describe(model: nn.Module) -> str:
    inner = compat.unwrap_model(model)
    inner = getattr(inner, "model", inner) if type(inner).__name__ == "CourseModel" else inner
    params = sum(p.numel() for p in inner.parameters())
    return f"{type(inner).__name__} ({params / 1e6:,.1f} M parameters)"
