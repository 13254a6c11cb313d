"""FLOPs per token of a Transformer (6·N + 12·L·H·Q·T; less for frozen weights), the FLOPs a run executed, and
MFU (lessons 02, 08, 10). Guide: docs/library/measure.md#helpersmeasureflops"""

from __future__ import annotations

import dataclasses
import operator
from typing import Iterable, Mapping

import torch
from torch import nn

from helpers.core.adapt import ModelShape
from helpers.core.compat import unwrap_model
from helpers.measure.roofline import PeakFlops

__all__ = ["transformer_flops_per_token", "matmul_params", "model_shape", "set_model_shape",
           "model_flops_per_token", "executed_flops", "mfu", "transformer_blocks"]


def transformer_flops_per_token(n_params: int, n_layers: int, n_heads: int, head_dim: int,
                                 seq_len: int, *, backward: bool = True) -> float:
    """Training FLOPs per token, 6·N + 12·L·H·Q·T; forward only, a third of it (lesson 02)."""
    sizes = dict(n_params=n_params, n_layers=n_layers, n_heads=n_heads, head_dim=head_dim, seq_len=seq_len)
    bad = {k: v for k, v in sizes.items() if not isinstance(v, int) or v < 0}
    if bad:
        raise ValueError(f"sizes must be non-negative integers, got {bad}")
    per_token = 6 * n_params + 12 * n_layers * n_heads * head_dim * seq_len
    return float(per_token if backward else per_token / 3)


def _is_matmul_layer(module: nn.Module) -> bool:
    # Hugging Face's Conv1D (GPT-2) is a Linear with a transposed weight; matched by name so that
    # counting FLOPs does not import transformers
    return isinstance(module, nn.Linear) or (type(module).__name__ == "Conv1D"
                                             and getattr(module, "weight", None) is not None
                                             and module.weight.dim() == 2)


def _per_sequence_modules(model: nn.Module) -> set[int]:
    """ids of layers run once per sequence: poolers, sequence-classifier heads, a SmallTransformer's head."""
    ids: set[int] = set()
    cfg = getattr(model, "cfg", None)
    if getattr(cfg, "n_classes", 0) and isinstance(getattr(model, "head", None), nn.Module):
        ids.update(id(m) for m in model.head.modules())
    sequence_classifier = type(model).__name__.endswith("ForSequenceClassification")
    for name, module in model.named_modules():
        last = name.rsplit(".", 1)[-1]
        if last == "pooler" or (sequence_classifier and name in ("classifier", "pre_classifier")):
            ids.update(id(m) for m in module.modules())
    return ids


def transformer_blocks(model: nn.Module) -> nn.ModuleList | None:
    """A model's list of Transformer layers (else its longest list of two or more blocks of one class), or
    None (lessons 05, 10)."""
    model = unwrap_model(model)
    layers = getattr(getattr(getattr(model, "base_model", None), "encoder", None), "layer", None)
    layers = layers if isinstance(layers, nn.ModuleList) else getattr(model, "blocks", None)
    if not isinstance(layers, nn.ModuleList):
        lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 1
                 and len({type(block) for block in m}) == 1]
        layers = max(lists, key=len, default=None)
    return layers


@dataclasses.dataclass(frozen=True)
class _MatmulWork:
    """Matmul parameters by the work their backward does, per token and once per sequence."""

    forward: int = 0
    input_grad: int = 0
    weight_grad: int = 0
    forward_seq: int = 0
    input_grad_seq: int = 0
    weight_grad_seq: int = 0
    attention_backward: float = 1.0  # the share of the layers whose attention runs its backward


def _matmul_work(model: nn.Module) -> _MatmulWork:
    """`_MatmulWork` of `model`, each parameter counted once."""
    per_sequence = _per_sequence_modules(model)
    params = list(model.parameters())
    # all trainable: 6·N (every input gradient). Frozen weights: no weight gradient, and an input gradient
    # only after a trainable parameter (the order of registration stands for the forward pass's)
    all_train = all(p.requires_grad for p in params)
    seen: set[int] = set()
    counts = dict.fromkeys(("forward", "input_grad", "weight_grad", "forward_seq", "input_grad_seq",
                            "weight_grad_seq"), 0)
    trains_before = False  # a parameter that trains was registered before this module
    first_training_module: nn.Module | None = None
    for module in model.modules():
        own = list(module.parameters(recurse=False))
        if _is_matmul_layer(module):
            tail = "_seq" if id(module) in per_sequence else ""
            for p in (module.weight, getattr(module, "bias", None)):
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    counts["forward" + tail] += p.numel()
                    counts["input_grad" + tail] += p.numel() if (all_train or trains_before) else 0
                    counts["weight_grad" + tail] += p.numel() if p.requires_grad else 0
        if first_training_module is None and any(p.requires_grad for p in own):
            first_training_module = module
        trains_before = trains_before or any(p.requires_grad for p in own)
    return _MatmulWork(**counts, attention_backward=_attention_backward(model, first_training_module,
                                                                        all_train))


def _attention_backward(model: nn.Module, first: nn.Module | None, all_train: bool) -> float:
    """The share of layers whose attention runs a backward: from the first trainable parameter's layer on."""
    if all_train:
        return 1.0
    if first is None:
        return 0.0
    blocks = transformer_blocks(model)
    if not blocks:
        return 1.0
    inside = {id(m): i for i, block in enumerate(blocks) for m in block.modules()}
    if id(first) not in inside:  # before the layers (an embedding), or after them (a head only)
        after = list(model.modules()).index(first) > list(model.modules()).index(blocks[-1])
        return 0.0 if after else 1.0
    return (len(blocks) - inside[id(first)]) / len(blocks)


def _matmul_params_split(model: nn.Module) -> tuple[int, int]:
    """(matmul parameters run per token, those run once per sequence), each parameter counted once."""
    work = _matmul_work(model)
    return work.forward, work.forward_seq


def matmul_params(model: nn.Module) -> int:
    """Parameters in matmuls: nn.Linear and HF Conv1D weights and biases, a tied one once (lesson 03)."""
    return sum(_matmul_params_split(model))


# the names configs give the three sizes: the course's, Hugging Face's, nanoGPT's and other common ones
_LAYER_NAMES = ("n_layers", "num_hidden_layers", "n_layer", "num_layers", "depth")
_HEAD_NAMES = ("n_heads", "num_attention_heads", "n_head", "num_heads", "heads")
_WIDTH_NAMES = ("d_model", "hidden_size", "n_embd", "dim", "embed_dim", "width")


def _first(obj: object, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(obj, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _from_config(cfg: object) -> ModelShape | None:
    layers, heads, width = (_first(cfg, n) for n in (_LAYER_NAMES, _HEAD_NAMES, _WIDTH_NAMES))
    head_dim = _first(cfg, ("head_dim",)) or (width // heads if width and heads else None)
    return ModelShape(layers, heads, head_dim) if layers and heads and head_dim else None


def _from_modules(model: nn.Module) -> ModelShape | None:
    """Layers, heads and head size from one attention module per layer; None when none or they differ."""
    found = []
    for module in model.modules():
        heads = _first(module, _HEAD_NAMES)
        if heads is None or _first(module, _LAYER_NAMES):  # a module holding the whole shape is no layer
            continue
        width = _first(module, _WIDTH_NAMES + ("all_head_size",))
        head_dim = _first(module, ("head_dim", "attention_head_size")) or (width // heads if width else None)
        if head_dim:
            found.append((heads, head_dim))
    if not found or len(set(found)) > 1:
        return None
    return ModelShape(len(found), *found[0])


def set_model_shape(model: nn.Module, n_layers: int, n_heads: int, head_dim: int) -> nn.Module:
    """Tell the FLOP counter a model's layers, heads and head size it cannot read (lessons 02, 08)."""
    model.course_shape = ModelShape(n_layers, n_heads, head_dim)
    return model


def model_shape(model: nn.Module) -> ModelShape:
    """(layers, heads, head size) of `model`: told (`set_model_shape`), else read from a config or its
    attention modules, outermost first; ValueError if none (lessons 02, 08)."""
    model = unwrap_model(model)
    modules = list(model.modules())
    for m in modules:
        if isinstance(getattr(m, "course_shape", None), ModelShape):
            return m.course_shape
    for m in modules:
        for cfg in (getattr(m, "cfg", None), getattr(m, "config", None)):
            shape = _from_config(cfg) if cfg is not None and not isinstance(cfg, (int, float, str)) else None
            if shape is not None:
                return shape
    shape = _from_modules(model)
    if shape is None:
        inner = getattr(model, "model", None) if type(model).__name__ == "CourseModel" else None
        name = type(model).__name__ + (f"({type(inner).__name__})" if inner is not None else "")
        raise ValueError(
            f"cannot read the layers, heads and head size of a {name} (no config with "
            "n_layers/num_hidden_layers/n_layer, n_heads/n_head, d_model/hidden_size/n_embd, and no "
            "attention modules keeping n_head and n_embd): tell it once, "
            "helpers.measure.flops.set_model_shape(model, n_layers, n_heads, head_dim), or "
            "as_course_model(model, shape=ModelShape(n_layers, n_heads, head_dim))")
    return shape


def model_flops_per_token(model: nn.Module, seq_len: int, *, backward: bool = True) -> float:
    """Training FLOPs per token of `model` at sequence length `seq_len` (lessons 02, 08)."""
    given = seq_len
    try:
        seq_len = operator.index(seq_len)  # ints, numpy ints, 0-d integer tensors
    except TypeError:
        seq_len = -1
    if seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer (tokens per sequence), got {given!r}")
    model = unwrap_model(model)  # torch.compile and DDP wrappers
    layers, heads, head_dim = dataclasses.astuple(model_shape(model))
    work = _matmul_work(model)
    forward = transformer_flops_per_token(work.forward, layers, heads, head_dim, seq_len, backward=False)
    forward += 2 * work.forward_seq / seq_len
    if not backward:
        return forward
    # the backward: each matmul's input gradient and weight gradient (2 FLOPs a parameter each), attention's
    # two products twice over in the layers it runs in
    matmuls = (2 * (work.input_grad + work.weight_grad)
               + 2 * (work.input_grad_seq + work.weight_grad_seq) / seq_len)
    return forward + matmuls + 8 * layers * heads * head_dim * seq_len * work.attention_backward


def executed_flops(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor] | tuple[int, int]], *,
                   backward: bool = True) -> float:
    """FLOPs a run executed on `batches`, padding included, each at its own width (lessons 06, 08): dicts with
    "input_ids" (batch, seq_len), (x, y) tensor pairs, or (batch, seq_len) pairs of numbers."""
    total = 0.0
    for i, b in enumerate(batches):
        if isinstance(b, Mapping) and "input_ids" in b:
            shape = tuple(b["input_ids"].shape)
        elif isinstance(b, (tuple, list)) and len(b) == 2 and isinstance(b[0], torch.Tensor):
            shape = tuple(b[0].shape)
        elif isinstance(b, tuple) and len(b) == 2:
            shape = b
        else:
            raise TypeError(f"batch {i} must be a dict with 'input_ids', an (x, y) pair or a (batch, "
                            f"seq_len) pair, got {type(b).__name__}")
        if len(shape) != 2:
            raise ValueError(f"batch {i}: input_ids must be (batch, seq_len), got shape {shape}")
        rows, width = (int(x) for x in shape)
        total += rows * width * model_flops_per_token(model, width, backward=backward)
    return total


def mfu(tokens_per_s: float, flops_per_token: float, peak: float | PeakFlops) -> float:
    """Model FLOPs utilisation, a fraction (lessons 02, 08): non-padding `tokens_per_s` × `flops_per_token`
    (at the padded length) ÷ `peak` (`mfu_peak`, the same for every precision, or FLOP/s you give)."""
    peak_value = peak.flops if isinstance(peak, PeakFlops) else float(peak)
    if peak_value <= 0 or tokens_per_s < 0 or flops_per_token < 0:
        raise ValueError(f"need peak > 0 and non-negative throughput and FLOPs, got peak={peak_value}, "
                         f"tokens_per_s={tokens_per_s}, flops_per_token={flops_per_token}")
    return tokens_per_s * flops_per_token / peak_value
