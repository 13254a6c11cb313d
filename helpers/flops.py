"""FLOPs per token of a Transformer, peak dense FLOP/s of known GPUs, and MFU.

Where 6·N + 12·L·H·Q·T comes from (the PaLM paper's appendix B; nanoGPT's `estimate_mfu`):

- A weight matrix W (n_in × n_out) applied to one token costs n_in·n_out multiply-adds = 2·n_in·n_out
  FLOPs in the forward pass. Summed over every matmul weight: 2·N per token, N = the parameters that
  take part in matmuls (position embeddings are a table look-up and do not count; a token embedding
  tied to the output head does, once).
- The backward pass computes two products per matmul, the gradient of the input (to pass back) and
  the gradient of the weight (to update it): twice the forward, 4·N. Forward + backward: 6·N.
- Attention also multiplies activations by activations, which no parameter count sees: for each of
  the L layers and H heads, a query of head size Q meets T keys (Q·Kᵀ, 2·Q·T FLOPs) and T values
  (weights·V, 2·Q·T FLOPs): 4·L·H·Q·T per token forward, times 3 with the backward: 12·L·H·Q·T.
  T is the full sequence length; a causal mask is ignored, as in PaLM and nanoGPT (it would halve it).

Softmax, layer norms, GELU and the optimizer are left out: a few percent at these sizes.

MFU (model FLOPs utilisation) = the FLOP/s the model needs at the measured throughput, divided by the
device's peak: tokens/s · FLOPs per token / peak FLOP/s. Use the *dense* peak of the dtype the matmuls
run in (datasheets often print the 2× "with sparsity" figure; that is not a peak dense training gets).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

__all__ = ["transformer_flops_per_token", "matmul_params", "model_flops_per_token", "GPU_PEAK_FLOPS",
           "PeakFlops", "peak_flops", "mfu", "PRECISION_DTYPE"]

TFLOPS = 1e12

# Which dtype's peak applies to a training precision (the dtype its matmuls run in).
PRECISION_DTYPE = {"fp32": "float32", "tf32": "tfloat32", "fp16": "float16", "bf16": "bfloat16"}

# Dense peak FLOP/s per dtype ("float16"/"bfloat16": tensor cores with fp32 accumulation, which is
# what autocast training uses). Sparsity figures are halved back to dense. Patterns are matched, in
# order, as whole words against `torch.cuda.get_device_name()` in lower case ("l4" is not "l40s").
GPU_PEAK_FLOPS: dict[str, dict[str, Any]] = {
    "h200": dict(float32=67.0 * TFLOPS, tfloat32=494.7 * TFLOPS, float16=989.4 * TFLOPS,
                 bfloat16=989.4 * TFLOPS,
                 source="NVIDIA H200 Tensor Core GPU datasheet (SXM; dense = half the sparsity figures)"),
    "h100 pcie": dict(float32=51.0 * TFLOPS, tfloat32=378.0 * TFLOPS, float16=756.0 * TFLOPS,
                      bfloat16=756.0 * TFLOPS,
                      source="NVIDIA H100 Tensor Core GPU datasheet (PCIe; dense = half the sparsity figures)"),
    "h100": dict(float32=67.0 * TFLOPS, tfloat32=494.7 * TFLOPS, float16=989.4 * TFLOPS,
                 bfloat16=989.4 * TFLOPS,
                 source="NVIDIA H100 Tensor Core GPU datasheet (SXM; dense = half the sparsity figures)"),
    "a100": dict(float32=19.5 * TFLOPS, tfloat32=156.0 * TFLOPS, float16=312.0 * TFLOPS,
                 bfloat16=312.0 * TFLOPS,
                 source="NVIDIA A100 Tensor Core GPU datasheet (dense figures)"),
    "l4": dict(float32=30.3 * TFLOPS, tfloat32=60.0 * TFLOPS, float16=121.0 * TFLOPS,
               bfloat16=121.0 * TFLOPS,
               source="NVIDIA L4 Tensor Core GPU datasheet (dense = half the sparsity figures)"),
    "a10": dict(float32=31.2 * TFLOPS, tfloat32=62.5 * TFLOPS, float16=125.0 * TFLOPS,
                bfloat16=125.0 * TFLOPS,
                source="NVIDIA A10 Tensor Core GPU datasheet (dense figures)"),
    "t4": dict(float32=8.1 * TFLOPS, float16=65.0 * TFLOPS,  # Turing: no TF32, no bf16 units
               source="NVIDIA T4 Tensor Core GPU datasheet (mixed-precision FP16/FP32 figure)"),
    "v100": dict(float32=15.7 * TFLOPS, float16=125.0 * TFLOPS,  # Volta: no TF32, no bf16 units
                 source="NVIDIA V100 Tensor Core GPU datasheet (SXM2)"),
    "rtx 4090": dict(float32=82.6 * TFLOPS, tfloat32=82.6 * TFLOPS, float16=165.2 * TFLOPS,
                     bfloat16=165.2 * TFLOPS,
                     source="NVIDIA Ada GPU architecture whitepaper, appendix table for the RTX 4090 "
                            "(FP16/BF16 tensor with FP32 accumulate, dense)"),
    "rtx 3090": dict(float32=35.6 * TFLOPS, tfloat32=35.6 * TFLOPS, float16=71.0 * TFLOPS,
                     bfloat16=71.0 * TFLOPS,
                     source="NVIDIA Ampere GA102 GPU architecture whitepaper, table for the RTX 3090 "
                            "(FP16/BF16 tensor with FP32 accumulate, dense)"),
}


def transformer_flops_per_token(n_params: int, n_layers: int, n_heads: int, head_dim: int,
                                 seq_len: int, *, backward: bool = True) -> float:
    """Training FLOPs per token, 6·N + 12·L·H·Q·T (forward only: a third of it, 2·N + 4·L·H·Q·T)."""
    sizes = dict(n_params=n_params, n_layers=n_layers, n_heads=n_heads, head_dim=head_dim, seq_len=seq_len)
    bad = {k: v for k, v in sizes.items() if not isinstance(v, int) or v < 0}
    if bad:
        raise ValueError(f"sizes must be non-negative integers, got {bad}")
    per_token = 6 * n_params + 12 * n_layers * n_heads * head_dim * seq_len
    return float(per_token if backward else per_token / 3)


def matmul_params(model: nn.Module) -> int:
    """Parameters that take part in matmuls: every nn.Linear's weight and bias, a tied weight once."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            for p in (module.weight, module.bias):
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
    return total


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
    """Training FLOPs per token of `model` at sequence length `seq_len` (see the module docstring)."""
    layers, heads, head_dim = _dims(model)
    return transformer_flops_per_token(matmul_params(model), layers, heads, head_dim, int(seq_len),
                                       backward=backward)


@dataclass(frozen=True)
class PeakFlops:
    """A device's peak dense FLOP/s for one dtype, and where the number comes from."""

    flops: float
    dtype: str
    source: str


def peak_flops(device: torch.device | str | None = None, precision: str = "bf16", *,
               roofline: Any = None, device_name: str | None = None) -> PeakFlops | None:
    """The peak for `precision` on `device`: the datasheet table for known GPUs, else a measured
    roofline (`helpers.hardware.measure_roofline`), else None."""
    if precision not in PRECISION_DTYPE:
        raise ValueError(f"unknown precision {precision!r}: use one of {tuple(PRECISION_DTYPE)}")
    dtype = PRECISION_DTYPE[precision]
    device = torch.device(device) if device is not None else None
    if device_name is None and device is not None and device.type == "cuda" and torch.cuda.is_available():
        device_name = torch.cuda.get_device_name(device)
    if device_name:
        name = device_name.lower()
        for pattern, row in GPU_PEAK_FLOPS.items():
            if re.search(rf"\b{re.escape(pattern)}\b", name):
                value = row.get(dtype) or (row.get("float32") if dtype == "tfloat32" else None)
                if value:
                    return PeakFlops(value, dtype, row["source"])
                break  # a known GPU without units for this dtype: fall through to the roofline
    if roofline is not None:
        measured: Mapping[str, float] = getattr(roofline, "matmul_flops", roofline)
        key = dtype if dtype in measured else ("float32" if dtype == "tfloat32" else None)
        if key in measured and measured[key]:
            where = getattr(roofline, "device_name", "this device")
            return PeakFlops(float(measured[key]), key, f"measured matmul roofline on {where}")
    return None


def mfu(tokens_per_s: float, flops_per_token: float, peak: float | PeakFlops) -> float:
    """Model FLOPs utilisation: tokens/s × FLOPs per token ÷ peak FLOP/s (a fraction, 0.4 = 40 %)."""
    peak_value = peak.flops if isinstance(peak, PeakFlops) else float(peak)
    if peak_value <= 0 or tokens_per_s < 0 or flops_per_token < 0:
        raise ValueError(f"need peak > 0 and non-negative throughput and FLOPs, got peak={peak_value}, "
                         f"tokens_per_s={tokens_per_s}, flops_per_token={flops_per_token}")
    return tokens_per_s * flops_per_token / peak_value
