"""Attention for teaching (lessons 01, 08): the naive formula, the tiled online softmax, SDPA and its
backends, FlexAttention masks, attention maps of a Hugging Face model. Shapes: q (B, H, Tq, d); k, v
(B, H, Tk, d); key_padding_mask (B, Tk) bool, True = real token; causal masks aligned bottom-right.
Guide: docs/library/model.md#helpersmodelattention"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import flex_attention
from torch.profiler import ProfilerActivity, profile

from helpers.core import compat
from helpers.model.packed_model import base_model

__all__ = ["check_qkv", "AGREEMENT_TOL", "agreement_tolerance", "attention_agreement", "check_padding_mask",
           "naive_attention", "tiled_attention", "sdpa_attention", "SDPA_BACKENDS", "probe_sdpa_backends",
           "expected_sdpa_backends", "expected_sdpa_default", "sdpa_backend_used", "flex_refusal",
           "flex_attention_fn", "padding_mask_mod", "sliding_window_mask_mod", "AttentionMaps",
           "capture_attention_maps", "attention_flops", "naive_attention_bytes"]


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               key_padding_mask: torch.Tensor | None) -> None:
    """ValueError naming the shapes got and needed; every implementation here checks with it (lesson 01)."""
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"need q (B, H, Tq, d) and k, v (B, H, Tk, d) with equal B, H, d; got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if key_padding_mask is not None:
        check_padding_mask(key_padding_mask)
        if tuple(key_padding_mask.shape) != (k.shape[0], k.shape[2]):
            raise ValueError(f"key_padding_mask must be (B, Tk) = {(k.shape[0], k.shape[2])}, "
                             f"got {tuple(key_padding_mask.shape)}")


def check_padding_mask(mask: torch.Tensor, name: str = "key_padding_mask") -> None:
    """Refuse a floating-point mask: masks are boolean, True (or 1) = real token (lesson 01)."""
    # an additive float mask (0 = keep, -inf = drop) read as boolean would keep exactly what it drops
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a tensor (B, Tk), got {type(mask).__name__}")
    if mask.is_floating_point() or mask.is_complex():
        raise ValueError(f"{name} has dtype {mask.dtype}; the course uses boolean masks, True (or 1) = real "
                         f"token to attend to, False (or 0) = padding. For an additive float mask "
                         f"(0 = keep, -inf = drop) pass `mask == 0`; for a 1.0/0.0 mask pass `mask.bool()`")


def _causal_allowed(tq: int, tk: int, device: torch.device) -> torch.Tensor:
    # (Tq, Tk) bool, True where query i may see key j (j <= i + Tk - Tq)
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril(tk - tq)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    key_padding_mask: torch.Tensor | None = None,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(Q Kᵀ / √d) V, materialising the full (Tq, Tk) score matrix (lesson 01)."""
    check_qkv(q, k, v, key_padding_mask)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, Tq, Tk): the O(N²) matrix
    if causal:
        tq, tk = scores.shape[-2:]
        scores = scores.masked_fill(~_causal_allowed(tq, tk, q.device), float("-inf"))
    if key_padding_mask is not None:
        scores = scores.masked_fill(~key_padding_mask.bool()[:, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    key_padding_mask: torch.Tensor | None = None, scale: float | None = None,
                    block_q: int = 64, block_k: int = 64) -> torch.Tensor:
    """FlashAttention's online softmax in plain PyTorch: (block_q, block_k) scores at a time (lesson 01)."""
    check_qkv(q, k, v, key_padding_mask)
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be positive, got block_q={block_q}, block_k={block_k}")
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    tq, tk = q.shape[2], k.shape[2]
    out = torch.empty_like(q)
    for qs in range(0, tq, block_q):
        qb = q[:, :, qs:qs + block_q].float() * scale  # (B, H, bq, d); fp32 accumulation, as the kernel does
        rows = torch.arange(qs, qs + qb.shape[2], device=q.device)
        m = torch.full(qb.shape[:3], float("-inf"), device=q.device)  # running max per query row
        row_sum = torch.zeros(qb.shape[:3], device=q.device)  # running sum of exp(score - m)
        acc = torch.zeros(qb.shape, device=q.device)  # running sum of exp(score - m) * v
        for ks in range(0, tk, block_k):
            if causal and ks > rows[-1] + tk - tq:
                break  # every later key block lies in the future of every query in this block
            kb, vb = k[:, :, ks:ks + block_k].float(), v[:, :, ks:ks + block_k].float()
            s = qb @ kb.transpose(-2, -1)  # (B, H, bq, bk): one tile of scores
            cols = torch.arange(ks, ks + kb.shape[2], device=q.device)
            if causal:
                s = s.masked_fill(cols[None, :] > rows[:, None] + tk - tq, float("-inf"))
            if key_padding_mask is not None:
                s = s.masked_fill(~key_padding_mask.bool()[:, None, None, ks:ks + block_k], float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # a row with no key yet: avoid inf - inf
            p = torch.exp(s - m_safe[..., None])  # (B, H, bq, bk)
            alpha = torch.exp(m - m_safe)  # rescales what was summed under the old max
            row_sum = row_sum * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + p @ vb
            m = m_new
        # a row with no real key gives NaN, as naive does
        out[:, :, qs:qs + block_q] = (acc / row_sum[..., None]).to(q.dtype)
    return out


# --- checking one implementation against another ------------------------------------------------------

# Largest per-(batch, head) relative error accepted against an fp32 reference, per input dtype, on
# inputs whose scores spread over several units (std 3). Measured on a CPU, B=1 H=4 N=256 d=64: bf16 naive
# 1.1e-2, bf16 SDPA and tiled 5e-3, fp16 1.3e-3 and below; heads swapped: 1.4. fp32 on a GPU gets TF32's
# tolerance: the Triton kernel's tl.dot multiplies fp32 in TF32 (10-bit mantissa).
AGREEMENT_TOL = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 5e-3, "bf16": 3e-2}


def agreement_tolerance(dtype: torch.dtype, device: torch.device | str = "cpu") -> float:
    """The `attention_agreement` tolerance for inputs of `dtype` on `device` (lesson 01)."""
    names = {torch.float32: "tf32" if torch.device(device).type == "cuda" else "fp32",
             torch.float16: "fp16", torch.bfloat16: "bf16"}
    if dtype not in names:
        raise ValueError(f"no attention tolerance for {dtype}: use float32, float16 or bfloat16")
    return AGREEMENT_TOL[names[dtype]]


def attention_agreement(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest relative error ‖out − ref‖ / ‖ref‖ of any (batch, head) slice, in float64 (lesson 01).
    Two swapped heads give about 1.4."""
    if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor):
        raise TypeError(f"attention_agreement compares two tensors, got {type(out).__name__} and "
                        f"{type(ref).__name__}")
    if out.shape != ref.shape or out.dim() != 4:
        raise ValueError(f"need two (B, H, T, d) tensors of one shape, got {tuple(out.shape)} and "
                         f"{tuple(ref.shape)}")
    ref64 = ref.detach().double().flatten(2)  # (B, H, T·d)
    norm = ref64.norm(dim=-1)  # (B, H)
    if not bool((norm > 0).all()):
        raise ValueError("the reference has a head whose output is all zeros: a relative error is undefined")
    diff = (out.detach().to(ref64.device).double().flatten(2) - ref64).norm(dim=-1)
    return float((diff / norm).max())


# --- SDPA and its backends ---------------------------------------------------------------------------

SDPA_BACKENDS = ("math", "flash", "efficient", "cudnn")  # names used across the course


def _backend(name: str) -> Any:
    table = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    if name not in table:
        raise ValueError(f"unknown SDPA backend {name!r}: use one of {SDPA_BACKENDS} or None "
                         "(let torch pick)")
    return table[name]


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   key_padding_mask: torch.Tensor | None = None, scale: float | None = None,
                   backend: str | None = None) -> torch.Tensor:
    """F.scaled_dot_product_attention with the course's masks, on one `backend` if given (lesson 01)."""
    check_qkv(q, k, v, key_padding_mask)
    tq, tk = q.shape[2], k.shape[2]
    mask, is_causal = None, causal and tq == tk  # SDPA's is_causal is top-left aligned: same only if Tq == Tk
    if key_padding_mask is not None or (causal and not is_causal):
        mask = torch.ones(k.shape[0], 1, tq, tk, dtype=torch.bool, device=q.device)  # (B, 1, Tq, Tk)
        if key_padding_mask is not None:
            mask = mask & key_padding_mask.bool()[:, None, None, :]
        if causal:
            mask = mask & _causal_allowed(tq, tk, q.device)
        is_causal = False  # SDPA takes a mask or is_causal, not both
    ctx = contextlib.nullcontext() if backend is None else _sdpa_kernel(backend)
    with ctx:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale)


def _sdpa_kernel(name: str) -> Any:
    return sdpa_kernel(_backend(name))


def probe_sdpa_backends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                        causal: bool = False) -> dict[str, str | None]:
    """Per SDPA backend: None if it runs these inputs here, else why it refused (lesson 01)."""
    result: dict[str, str | None] = {}
    for name in SDPA_BACKENDS:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                sdpa_attention(q, k, v, causal=causal, backend=name)
                result[name] = None
                continue
            except RuntimeError as err:  # "No available kernel"; torch's reasons come as warnings
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        reasons = [str(w.message).strip() for w in caught if "because" not in str(w.message)]
        result[name] = "; ".join(dict.fromkeys([*reasons, first]))[:300]
    return result


# What torch's dispatcher checks before it runs a backend on a GPU (pytorch/pytorch, file
# aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: check_flash_attention_hardware_support,
# check_dtypes_flash_attention, check_for_attn_mask, check_mem_efficient_hardware_support, the dtypes of
# can_use_mem_efficient_attention, check_cudnn_hardware_support, check_cudnn_tensor_shapes) and on a CPU
# (sdp_utils_cpp.cpp: flash, then math; no other backend).
_HALF = (torch.float16, torch.bfloat16)


def expected_sdpa_backends(device: torch.device | str, dtype: torch.dtype, head_dim: int, *,
                           masked: bool = False, capability: tuple[int, int] | None = None,
                           cudnn_version: int | None = None) -> dict[str, str | None]:
    """Per SDPA backend, by torch's own rules: None where it should run these inputs, else the rule that
    refuses it (lesson 01)."""
    device = torch.device(device)
    out: dict[str, str | None] = {"math": None}
    if device.type != "cuda":
        cpu_flash = (torch.float32, torch.float64, *_HALF)
        out["flash"] = (None if dtype in cpu_flash else
                        f"torch's CPU flash kernel takes fp32, fp64, fp16, bf16: not {dtype}")
        out["efficient"] = "torch has no memory-efficient kernel for a CPU (CUDA GPUs only)"
        out["cudnn"] = "cuDNN attention runs on CUDA GPUs only"
        return out
    cc = capability or tuple(torch.cuda.get_device_capability(device))
    sm = f"sm_{cc[0]}{cc[1]}"
    flash = []
    if not (8, 0) <= cc <= (12, 1):
        flash.append(f"FlashAttention needs sm_80 to sm_121, this GPU is {sm}")
    if dtype not in _HALF:
        flash.append(f"it takes fp16 or bf16, not {dtype}")
    if masked:
        flash.append("it takes no attn_mask (a padding mask)")
    if head_dim > 256:
        flash.append(f"it takes head dims up to 256, not {head_dim}")
    out["flash"] = "; ".join(flash) or None
    efficient = []
    if cc < (5, 0):
        efficient.append(f"memory-efficient attention needs sm_50 or newer, this GPU is {sm}")
    allowed = (torch.float16, torch.float32) + ((torch.bfloat16,) if cc >= (8, 0) else ())
    if dtype not in allowed:
        efficient.append(f"on {sm} it takes {', '.join(str(t).removeprefix('torch.') for t in allowed)}, "
                         f"not {dtype} (bf16 from sm_80)")
    align = 8 if dtype in _HALF else (4 if cc >= (8, 0) else 1)
    if head_dim % align:
        efficient.append(f"it needs a head dim divisible by {align}, not {head_dim}")
    out["efficient"] = "; ".join(efficient) or None
    if cudnn_version is None:
        cudnn_version = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    cudnn = []
    if not (8, 0) <= cc <= (12, 1):
        cudnn.append(f"cuDNN attention needs sm_80 to sm_121, this GPU is {sm}")
    if dtype not in _HALF:
        cudnn.append(f"it takes fp16 or bf16, not {dtype}")
    if head_dim > 128 or head_dim % 8:
        cudnn.append(f"it takes head dims that are multiples of 8 up to 128 (256 on sm_90 with a recent "
                     f"cuDNN), not {head_dim}")
    if not cudnn_version or cudnn_version < 90000:
        cudnn.append(f"it needs torch built with cuDNN 9 or newer (here: {cudnn_version or 'no cuDNN'})")
    out["cudnn"] = "; ".join(cudnn) or None
    return out


def expected_sdpa_default(device: torch.device | str, dtype: torch.dtype, head_dim: int, *,
                          masked: bool = False, capability: tuple[int, int] | None = None,
                          cudnn_version: int | None = None) -> tuple[str, ...]:
    """The backends plain SDPA may pick for these inputs, by torch's priority order (lesson 01)."""
    runs = expected_sdpa_backends(device, dtype, head_dim, masked=masked, capability=capability,
                                  cudnn_version=cudnn_version)
    device = torch.device(device)
    cc = (capability or tuple(torch.cuda.get_device_capability(device))) if device.type == "cuda" else None
    first = next(name for name in ("flash", "efficient", "math") if runs[name] is None)
    # sm_90, sm_100: torch >= 2.10 with cuDNN > 9.15 puts cuDNN first (check_prefer_cudnn_attention)
    if cc is not None and cc[0] in (9, 10) and runs["cudnn"] is None:
        return ("cudnn", first)
    return (first,)


# the aten op each backend's call records, as the profiler names it (CPU and CUDA)
_BACKEND_OPS = {"flash": ("aten::_scaled_dot_product_flash_attention",
                          "aten::_scaled_dot_product_flash_attention_for_cpu"),
                "efficient": ("aten::_scaled_dot_product_efficient_attention",),
                "cudnn": ("aten::_scaled_dot_product_cudnn_attention",),
                "math": ("aten::_scaled_dot_product_attention_math",)}


def sdpa_backend_used(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      key_padding_mask: torch.Tensor | None = None) -> str:
    """The backend plain SDPA ran here ("flash", "efficient", "cudnn", "math"), read by the profiler
    (lesson 01)."""
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        sdpa_attention(q, k, v, key_padding_mask=key_padding_mask)
    names = {e.key for e in prof.key_averages()}
    found = [name for name, ops in _BACKEND_OPS.items() if names & set(ops)]
    if len(found) != 1:
        raise RuntimeError(f"could not tell which SDPA backend ran: the profiler recorded "
                           f"{sorted(n for n in names if 'attention' in n)}")
    return found[0]


# --- FlexAttention -----------------------------------------------------------------------------------

def flex_refusal(device: torch.device | str, capability: tuple[int, int] | None = None) -> str | None:
    """Why FlexAttention is not run on `device`, or None where the course runs it (lesson 01)."""
    # below sm_80 its compile is reported to fail (pytorch/pytorch#164813: RTX 2080 Ti, torch 2.7, triton 3.3)
    device = torch.device(device)
    if device.type != "cuda":
        return None
    cc = capability or tuple(torch.cuda.get_device_capability(device))
    if cc < (8, 0):
        return (f"FlexAttention is reported broken below sm_80 (its Triton kernels fail to compile on an "
                f"sm_75 RTX 2080 Ti: pytorch/pytorch#164813) and this GPU is sm_{cc[0]}{cc[1]}: use SDPA "
                "with a dense mask here")
    return None


@functools.cache
def flex_attention_fn(device: str | None = None) -> Callable[..., torch.Tensor]:
    """`flex_attention` under torch.compile for `device` (uncompiled where torch cannot compile it); the
    first call per shape or mask compiles (lesson 01)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not compat.flex_compiles(device)[0]:
        return flex_attention
    return torch.compile(flex_attention, dynamic=False)


def padding_mask_mod(key_padding_mask: torch.Tensor) -> Callable[..., torch.Tensor]:
    """A FlexAttention mask_mod that hides padded keys (lesson 01)."""
    check_padding_mask(key_padding_mask)
    if key_padding_mask.dim() != 2:
        raise ValueError(f"key_padding_mask must be (B, Tk), got {tuple(key_padding_mask.shape)}")
    keep = key_padding_mask.bool()

    def mask_mod(b, h, q_idx, kv_idx):  # noqa: ANN001 - FlexAttention passes index tensors
        return keep[b, kv_idx]
    return mask_mod


def sliding_window_mask_mod(window: int, causal: bool = True) -> Callable[..., torch.Tensor]:
    """A FlexAttention mask_mod: each query sees keys at most `window` positions away (lesson 01)."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")

    def mask_mod(b, h, q_idx, kv_idx):  # noqa: ANN001
        near = (q_idx - kv_idx).abs() <= window
        return near & (kv_idx <= q_idx) if causal else near
    return mask_mod




def naive_attention_bytes(batch: int, heads: int, tq: int, tk: int, head_dim: int, dtype: torch.dtype) -> int:
    """Peak memory of `naive_attention` above its inputs, bytes: two (B, H, Tq, Tk) matrices and the output
    (lesson 01; measured in tests)."""
    size = torch.empty((), dtype=dtype).element_size()
    return (2 * batch * heads * tq * tk + batch * heads * tq * head_dim) * size


def attention_flops(batch: int, heads: int, tq: int, tk: int, head_dim: int, causal: bool = False) -> float:
    """Matmul FLOPs of one attention forward: 2·B·H·Tq·Tk·d each for QKᵀ and PV, halved when causal
    (lesson 01)."""
    flops = 4.0 * batch * heads * tq * tk * head_dim
    return flops / 2 if causal else flops


# --- attention maps of a Hugging Face model ---------------------------------------------------------

@dataclass
class AttentionMaps:
    """One text's attention weights, maps (layers, heads, tokens, tokens), and its tokens (lessons 01, 08)."""

    maps: torch.Tensor
    tokens: list[str]
    switched_to_naive: bool = False  # True when the model ran SDPA and was switched for the capture

    def __post_init__(self) -> None:
        if self.maps.dim() != 4 or self.maps.shape[-1] != self.maps.shape[-2]:
            raise ValueError(f"maps must be (layers, heads, tokens, tokens), got {tuple(self.maps.shape)}")
        if len(self.tokens) != self.maps.shape[-1]:
            raise ValueError(f"{len(self.tokens)} tokens given for maps over {self.maps.shape[-1]} tokens "
                             f"(maps {tuple(self.maps.shape)}); need one token string per position")

    @property
    def n_layers(self) -> int:
        return self.maps.shape[0]

    @property
    def n_heads(self) -> int:
        return self.maps.shape[1]


def capture_attention_maps(model: Any, tokenizer: Any, text: str | Sequence[str], *, max_length: int = 64,
                           verbose: bool = True) -> AttentionMaps | list[AttentionMaps]:
    """Attention weights of a Hugging Face model: one `AttentionMaps` per text, padding cut off (lessons 01,
    08). A model on SDPA runs "eager" for the capture and is switched back."""
    texts = [text] if isinstance(text, str) else list(text) if isinstance(text, Sequence) else None
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise ValueError(f"capture_attention_maps needs a non-empty text or a non-empty list of non-empty "
                         f"texts, got {text!r}"[:200])

    model = base_model(model)  # the Hugging Face model inside a stack's packing or torch.compile
    impl = compat.attn_implementation(model)
    switched = impl not in (None, "eager")
    was_training = model.training
    run = model  # the model that captures: `model` switched in place, or (transformers 4.x) an eager copy
    try:
        if switched:
            if verbose:
                print(f"capture_attention_maps: the model runs {impl!r}, which returns no attention weights; "
                      "switching it to the naive attention ('eager') for this capture")
            run = compat.set_attn_implementation(model, "eager")
        device = next(run.parameters()).device
        enc = tokenizer(texts, return_tensors="pt", truncation=True, max_length=max_length,
                        padding=True).to(device)
        run.eval()
        with torch.no_grad():
            out = run(**enc, output_attentions=True)
    finally:
        model.train(was_training)
        if switched and run is model and compat.attn_implementation(model) != impl:
            compat.set_attn_implementation(model, impl)  # in place where it switched in place
    if not out.attentions:
        raise RuntimeError("the model returned no attention weights even with the naive attention")
    stacked = torch.stack(out.attentions, dim=1).float().cpu()  # L x (B, H, T, T) -> (B, L, H, T, T)
    result = []
    for i in range(len(texts)):
        real = enc["attention_mask"][i].bool().cpu()  # (T,), True for this text's own tokens
        maps = stacked[i][:, :, real][:, :, :, real]  # (L, H, n, n): padding rows and columns dropped
        tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"][i].cpu()[real].tolist())
        result.append(AttentionMaps(maps=maps, tokens=tokens, switched_to_naive=switched))
    return result[0] if isinstance(text, str) else result
