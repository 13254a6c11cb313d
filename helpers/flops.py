"""FLOPs per token of a Transformer, FLOPs a run executed, and MFU.

Where 6·N + 12·L·H·Q·T comes from (the PaLM paper's appendix B; nanoGPT's `estimate_mfu`):

- A weight matrix W (n_in × n_out) applied to one token costs n_in·n_out multiply-adds = 2·n_in·n_out
  FLOPs in the forward pass. Summed over every matmul weight: 2·N per token, N = the parameters that
  take part in matmuls: every `nn.Linear` and Hugging Face `Conv1D` (GPT-2's layers), a weight tied to
  the token embedding counted once (as the output head); position tables are look-ups and do not count.
- The backward pass computes two products per matmul, the gradient of the input (to pass back) and
  the gradient of the weight (to update it): twice the forward, 4·N. Forward + backward: 6·N.
- Attention also multiplies activations by activations, which no parameter count sees: for each of
  the L layers and H heads, a query of head size Q meets T keys (Q·Kᵀ, 2·Q·T FLOPs) and T values
  (weights·V, 2·Q·T FLOPs): 4·L·H·Q·T per token forward, times 3 with the backward: 12·L·H·Q·T.
  T is the full sequence length; a causal mask is ignored, as in PaLM and nanoGPT (it would halve it).
- A classifier head that reads one vector per sequence (BERT's pooler and classifier, the small
  Transformer's classifier) runs once per sequence, not per token: its parameters count 1/T per token.

Softmax, layer norms, GELU and the optimizer are left out: a few percent at these sizes.

Two numbers, two uses: `model_flops_per_token` × real (non-padding) tokens is the work the model needs,
the numerator of MFU; `executed_flops` is the work a run actually made the device do, padding included
(it measures how busy the device was, and the gap between the two is the padding's cost).

`mfu` is the one place MFU is computed; the peak it divides by is `helpers.roofline.mfu_peak` (the
course's one peak policy: the device's fastest dense rate among the training precisions; datasheet, else
measured roofline).
"""

from __future__ import annotations

import operator
from typing import Iterable, Mapping

import torch
from torch import nn

from helpers.compat import unwrap_model
from helpers.roofline import PeakFlops

__all__ = ["transformer_flops_per_token", "matmul_params", "model_flops_per_token", "executed_flops", "mfu"]


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
    """ids of the layers that run once per sequence: HF poolers and sequence-classifier heads, and the
    small Transformer's classifier (it reads the mean over tokens)."""
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


def _matmul_params_split(model: nn.Module) -> tuple[int, int]:
    """(matmul parameters run per token, those run once per sequence), each parameter counted once."""
    per_sequence = _per_sequence_modules(model)
    seen: set[int] = set()
    counts = [0, 0]
    for module in model.modules():
        if not _is_matmul_layer(module):
            continue
        for p in (module.weight, getattr(module, "bias", None)):
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                counts[id(module) in per_sequence] += p.numel()
    return counts[0], counts[1]


def matmul_params(model: nn.Module) -> int:
    """Parameters in matmuls: nn.Linear and HF Conv1D weights and biases, a tied one once (lesson 03)."""
    return sum(_matmul_params_split(model))


def _dims(model: nn.Module) -> tuple[int, int, int]:
    """(layers, heads, head size) of a SmallTransformer or a Hugging Face model."""
    cfg = getattr(model, "cfg", None) or getattr(model, "config", None)
    if cfg is None:
        raise ValueError(f"cannot read the sizes of a {type(model).__name__}: need a `.cfg` "
                         "(SmallTransformer) or a `.config` (Hugging Face), or call "
                         "transformer_flops_per_token with the sizes")
    layers = getattr(cfg, "n_layers", None) or getattr(cfg, "num_hidden_layers", None)
    heads = getattr(cfg, "n_heads", None) or getattr(cfg, "num_attention_heads", None)
    width = getattr(cfg, "d_model", None) or getattr(cfg, "hidden_size", None)
    if not (layers and heads and width):
        raise ValueError(f"{type(cfg).__name__} lacks layers/heads/width (n_layers, n_heads, d_model or "
                         "num_hidden_layers, num_attention_heads, hidden_size)")
    return int(layers), int(heads), int(width) // int(heads)


def model_flops_per_token(model: nn.Module, seq_len: int, *, backward: bool = True) -> float:
    """Training FLOPs per token of `model` at sequence length `seq_len` (lessons 02, 08; see above)."""
    given = seq_len
    try:
        seq_len = operator.index(seq_len)  # ints, numpy ints, 0-d integer tensors
    except TypeError:
        seq_len = -1
    if seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer (tokens per sequence), got {given!r}")
    model = unwrap_model(model)  # torch.compile and DDP wrappers
    layers, heads, head_dim = _dims(model)
    per_token, per_sequence = _matmul_params_split(model)
    attention = transformer_flops_per_token(per_token, layers, heads, head_dim, seq_len, backward=backward)
    head = 6 * per_sequence / seq_len
    return attention + (head if backward else head / 3)


def executed_flops(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor] | tuple[int, int]], *,
                   backward: bool = True) -> float:
    """FLOPs a run executed on `batches`, padding included, each at its own width (lessons 06, 08).

    A batch is a dict with "input_ids" of shape (batch, seq_len), or a (batch, seq_len) pair."""
    total = 0.0
    for i, b in enumerate(batches):
        if isinstance(b, Mapping) and "input_ids" in b:
            shape = tuple(b["input_ids"].shape)
        elif isinstance(b, tuple) and len(b) == 2:
            shape = b
        else:
            raise TypeError(f"batch {i} must be a dict with 'input_ids' or a (batch, seq_len) pair, got "
                            f"{type(b).__name__}")
        if len(shape) != 2:
            raise ValueError(f"batch {i}: input_ids must be (batch, seq_len), got shape {shape}")
        rows, width = (int(x) for x in shape)
        total += rows * width * model_flops_per_token(model, width, backward=backward)
    return total


def mfu(tokens_per_s: float, flops_per_token: float, peak: float | PeakFlops) -> float:
    """Model FLOPs utilisation (lessons 02, 08): useful FLOPs per second ÷ the peak, a fraction (0.4 = 40 %).

    Useful FLOPs count real tokens only: `tokens_per_s` are non-padding tokens per second and
    `flops_per_token` is `model_flops_per_token` at the padded length the model attended over. Padding
    the device computed is not useful work (see `executed_flops`). `peak`: `helpers.roofline.mfu_peak`,
    the same for every precision (so MFUs compare), or a number you give (FLOP/s)."""
    peak_value = peak.flops if isinstance(peak, PeakFlops) else float(peak)
    if peak_value <= 0 or tokens_per_s < 0 or flops_per_token < 0:
        raise ValueError(f"need peak > 0 and non-negative throughput and FLOPs, got peak={peak_value}, "
                         f"tokens_per_s={tokens_per_s}, flops_per_token={flops_per_token}")
    return tokens_per_s * flops_per_token / peak_value
