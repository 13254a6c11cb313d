"""Attention for teaching: the naive formula first; lesson 01 grows this module."""

from __future__ import annotations

import math

import torch

__all__ = ["naive_attention"]


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                    key_padding_mask: torch.Tensor | None = None,
                    scale: float | None = None) -> torch.Tensor:
    """softmax(Q Kᵀ / √d) V, materialising the full (Tq, Tk) score matrix.

    q: (B, H, Tq, d); k, v: (B, H, Tk, d); key_padding_mask: (B, Tk) bool, True for real tokens.
    """
    if q.dim() != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"need q (B, H, Tq, d) and k, v (B, H, Tk, d) with equal B, H, d; got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, Tq, Tk): the O(N²) matrix
    if causal:
        tq, tk = scores.shape[-2:]
        future = torch.ones(tq, tk, dtype=torch.bool, device=q.device).triu(tk - tq + 1)
        scores = scores.masked_fill(future, float("-inf"))
    if key_padding_mask is not None:
        if key_padding_mask.shape != (k.shape[0], k.shape[2]):
            raise ValueError(f"key_padding_mask must be (B, Tk) = {(k.shape[0], k.shape[2])}, "
                             f"got {tuple(key_padding_mask.shape)}")
        scores = scores.masked_fill(~key_padding_mask.bool()[:, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
