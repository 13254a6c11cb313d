"""Host side of the Triton FlashAttention (lesson 01): checks the inputs, picks compiled or interpreted
Triton, launches the kernels with the tiles `configs.tile_configs` chose, ties them together for autograd."""

from __future__ import annotations

import ast
import functools
import importlib.util
import math
import os
import sys
from typing import Any

import torch

from helpers.core import compat
from helpers.model.attention import check_qkv
from helpers.model.kernels import _triton_bwd, _triton_fwd
from helpers.model.kernels import configs as tiles

__all__ = ["flash_attention", "triton_available", "uses_interpreter", "kernel_source", "kernel_refusal",
           "SUPPORTED_HEAD_DIMS", "SUPPORTED_DTYPES"]

# What the kernel takes at all; on a GPU only `configs.GPU_HEAD_DIMS` in fp16/bf16 (`configs.gpu_refusal`)
SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)  # powers of two that tl.dot tiles; 64 and 128 are the usual ones
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # fp32 in the interpreter only
INTERPRETER_BLOCK = 16  # tile edge under the interpreter: small tiles keep the NumPy work small


def triton_available() -> bool:
    """True when the triton package is installed (it is built for Linux only) (lesson 01)."""
    return importlib.util.find_spec("triton") is not None


KERNEL_FILES = {"attn_fwd": "_triton_fwd.py", "attn_bwd_dkdv": "_triton_bwd.py",
                "attn_bwd_dq": "_triton_bwd.py"}  # kernel -> the file that defines it


def kernel_source(name: str = "attn_fwd") -> str:
    """The Triton source of 'attn_fwd', 'attn_bwd_dkdv' or 'attn_bwd_dq', read from its file (lesson 01)."""
    if name not in KERNEL_FILES:
        raise ValueError(f"no kernel named {name!r}: choose one of {sorted(KERNEL_FILES)}")
    path = os.path.join(os.path.dirname(__file__), KERNEL_FILES[name])
    with open(path, encoding="utf-8") as f:
        source = f.read()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(source, node) or ""


def kernel_refusal(device: torch.device | str, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why `flash_attention` cannot run inputs of `dtype` and `head_dim` on `device`, in one line, or None
    (lesson 01)."""
    device = torch.device(device)
    if not triton_available():
        return "needs the triton package, which is built for Linux only (pip install triton on Linux)"
    if device.type not in ("cpu", "cuda"):
        return f"Triton has no backend for {device.type!r}: it runs CUDA tensors, or CPU tensors interpreted"
    if head_dim not in SUPPORTED_HEAD_DIMS or dtype not in SUPPORTED_DTYPES:
        return (f"the kernel takes head dims {SUPPORTED_HEAD_DIMS} in fp16, bf16 or fp32, got {head_dim}, "
                f"{dtype}")
    if uses_interpreter(device):
        return None
    return tiles.gpu_refusal(_capability(device), dtype, head_dim)


def _capability(device: torch.device) -> tuple[int, int]:
    # a function of its own: the tests fake it
    return tuple(torch.cuda.get_device_capability(device))


def uses_interpreter(device: torch.device | str) -> bool:
    """True for CPU tensors or TRITON_INTERPRET=1: kernels run in Triton's interpreter (lesson 01)."""
    env = os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "yes", "on")
    return env or torch.device(device).type != "cuda"


def _ensure_interpreter() -> None:
    # triton decides when first imported whether tl.zeros, tl.max... are interpreted: TRITON_INTERPRET=1
    # must be set before then
    compat.check_triton_interpreter()
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"  # nothing has imported triton yet: safe to choose now
        return
    if not compat.triton_interpret_enabled():
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set, so it cannot interpret "
                           "kernels on CPU tensors in this process: restart, and set "
                           "os.environ['TRITON_INTERPRET'] = '1' before anything imports triton "
                           "(lesson 01's setup cell does this on machines without CUDA)")


@functools.cache
def _fwd_kernel(interpret: bool, configs: tuple[tiles.TileConfig, ...] | None) -> Any:
    # cached: one autotuner per architecture and head dim, each with its own list of configs
    return _triton_fwd.build(interpret, configs)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    key_padding_mask: torch.Tensor | None = None, scale: float | None = None,
                    block_m: int | None = None, block_n: int | None = None) -> torch.Tensor:
    """softmax(Q Kᵀ·scale) V in Triton, differentiable, without the (Tq, Tk) matrix (lesson 01). Shapes and
    masks as in `helpers.model.attention`; on a GPU fp16/bf16 at head dims 64 and 128, blocks autotuned."""
    check_qkv(q, k, v, key_padding_mask)
    d = q.shape[-1]
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dimension {d} (q {tuple(q.shape)}) is not supported by the kernel: "
                         f"need d in {SUPPORTED_HEAD_DIMS}")
    if q.dtype not in SUPPORTED_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype of {[str(t) for t in SUPPORTED_DTYPES]}, got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    for name, block in (("block_m", block_m), ("block_n", block_n)):
        if block is not None and (block < 16 or block & (block - 1)):
            raise ValueError(f"{name} must be a power of two >= 16, got {block}")
    if q.device.type not in ("cpu", "cuda"):  # Triton has no backend for Apple's GPU (mps)
        raise ValueError(f"flash_attention runs CUDA tensors (compiled) or CPU tensors (interpreted), not "
                         f"{q.device}: move q, k, v to the CPU (.cpu()) or to a CUDA GPU")
    if not triton_available():
        raise RuntimeError("flash_attention needs the triton package, which is built for Linux only: on "
                           "Linux pip install triton; on macOS or Windows run this step on a Linux machine")
    interpret = uses_interpreter(q.device)
    if interpret:
        _ensure_interpreter()
    else:
        refusal = tiles.gpu_refusal(_capability(q.device), q.dtype, d)
        if refusal:
            raise ValueError(f"flash_attention on {q.device} (q {tuple(q.shape)}, {q.dtype}): {refusal}")

    if key_padding_mask is not None:
        mask = key_padding_mask.to(device=q.device, dtype=torch.int8).contiguous()  # (B, Tk), 1 = real
    else:
        mask = None
    scale = scale if scale is not None else 1.0 / math.sqrt(d)
    return _FlashAttention.apply(q, k, v, mask, causal, scale, block_m, block_n, interpret)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool,
             scale: float, block_m: int | None, block_n: int | None,
             interpret: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # -> output (B, H, Tq, d), row log-sum-exp (B·H, Tq) fp32 in log2 units
    b, h, tq, d = q.shape
    tk = k.shape[2]
    out = torch.empty_like(q)
    lse = torch.empty(b * h, tq, device=q.device, dtype=torch.float32)
    mask_arg, mask_strides = (mask, (mask.stride(0), mask.stride(1))) if mask is not None else (lse, (0, 0))
    args = (q, k, v, out, lse, mask_arg, scale, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            *mask_strides, h, tq, tk, tk - tq)
    flags = dict(HEAD_DIM=d, CAUSAL=causal, HAS_MASK=mask is not None)
    if interpret:
        bm, bn = block_m or INTERPRETER_BLOCK, block_n or INTERPRETER_BLOCK
        _fwd_kernel(True, None)[(math.ceil(tq / bm), b * h)](*args, BLOCK_M=bm, BLOCK_N=bn,
                                                             EVEN_N=tk % bn == 0, **flags)
    elif block_m is None and block_n is None:  # autotuned over this architecture's plan
        planned = tiles.tile_configs("attn_fwd", _capability(q.device), d)
        grid = lambda meta: (math.ceil(tq / meta["BLOCK_M"]), b * h)  # noqa: E731
        _fwd_kernel(False, planned)[grid](*args, **flags)
    else:  # the caller's block sizes (the other one 64), with the explicit launch's warps and stages
        cfg = tiles.explicit_config(_capability(q.device), d, block_m or 64, block_n or 64)
        _fwd_kernel(False, None)[(math.ceil(tq / cfg.block_m), b * h)](
            *args, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, EVEN_N=tk % cfg.block_n == 0,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **flags)
    return out, lse


@functools.cache
def _bwd_kernels(interpret: bool) -> Any:
    return _triton_bwd.build(interpret)


def _backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
              lse: torch.Tensor, mask: torch.Tensor | None, causal: bool, scale: float,
              interpret: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v, out, do = (t.contiguous() for t in (q, k, v, out, do))  # the kernels index (B, H, T, d) densely
    b, h, tq, d = q.shape
    tk = k.shape[2]
    delta = (do.float() * out.float()).sum(-1).reshape(b * h, tq)  # D = rowsum(dO ∘ O), (B·H, Tq)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    flags = dict(HEAD_DIM=d, CAUSAL=causal, HAS_MASK=mask is not None)
    mask_arg = mask if mask is not None else lse
    dkdv, dq_kernel = _bwd_kernels(interpret)
    launches = {}
    for name in ("attn_bwd_dkdv", "attn_bwd_dq"):
        if interpret:
            launches[name] = dict(BLOCK_M=INTERPRETER_BLOCK, BLOCK_N=INTERPRETER_BLOCK)
        else:  # the first configuration planned for this architecture and head dim
            cfg = tiles.tile_configs(name, _capability(q.device), d)[0]
            launches[name] = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
                                  num_stages=cfg.num_stages)
    kv, qs = launches["attn_bwd_dkdv"], launches["attn_bwd_dq"]
    dkdv[(math.ceil(tk / kv["BLOCK_N"]), b * h)](q, k, v, do, lse, delta, dk, dv, mask_arg, scale, h, tq, tk,
                                                 tk - tq, **flags, **kv)  # one program per block of keys
    dq_kernel[(math.ceil(tq / qs["BLOCK_M"]), b * h)](q, k, v, do, lse, delta, dq, mask_arg, scale, h, tq, tk,
                                                      tk - tq, **flags, **qs)  # one per block of queries
    return dq, dk, dv


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                causal: bool, scale: float, block_m: int | None, block_n: int | None,
                interpret: bool) -> torch.Tensor:
        out, lse = _forward(q, k, v, mask, causal, scale, block_m, block_n, interpret)
        ctx.save_for_backward(q, k, v, out, lse, *(() if mask is None else (mask,)))
        ctx.config = (causal, scale, interpret)
        return out

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse, *mask = ctx.saved_tensors
        causal, scale, interpret = ctx.config
        dq, dk, dv = _backward(do, q, k, v, out, lse, mask[0] if mask else None, causal, scale, interpret)
        return dq, dk, dv, None, None, None, None, None, None
