"""The check of exercise 01-flash-forward (lesson 01, `01_attention`): FlashAttention's forward in
tiles, (O, logsumexp), against a float64 reference at several block sizes; a wrong O or L is matched
to the mistake that gives it (a missing rescale, no normalisation, no 1/√d, L without the max, ...).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.exercises.core import Wrong, unpack

__all__ = ["flash_forward"]


def _qkv(n: int, *, b: int = 1, h: int = 2, d: int = 16, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    return q * 3 ** 0.5, k * 3 ** 0.5, v  # scores q·k/√d of std 3: softmax far from uniform


def _attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    s = (q.double() @ k.double().transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    return (torch.softmax(s, -1) @ v.double()).float(), torch.logsumexp(s, -1).float()


def _o_ok(o: torch.Tensor, ref: torch.Tensor) -> bool:
    from helpers.attention import attention_agreement

    return o.shape == ref.shape and bool(torch.isfinite(o).all()) and attention_agreement(o, ref) < 1e-5


def _flash_pair(answer: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                block_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    o, lse = unpack(answer(q, k, v, block_k=block_k), 2, "O, L")
    for name, t, shape in (("O", o, q.shape), ("L", lse, q.shape[:3])):
        if not isinstance(t, torch.Tensor):
            raise Wrong("return-type", f"{name} is a {type(t).__name__}", f"return {name} as a tensor")
        if t.shape != shape:
            extra = " (keepdim=True left a last dimension of 1: squeeze it)" if t.shape == (*shape, 1) else ""
            raise Wrong("wrong-shape", f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}{extra}",
                        "O is (B, H, N, d) like q; L holds one number per query row, (B, H, N)")
    return o, lse


def _diagnose_o(answer: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    n = q.shape[2]
    if _o_ok(_flash_pair(answer, q, k, v, block_k=n + 8)[0], _attention_ref(q, k, v)[0]):
        q2, k2, v2 = _qkv(32, seed=1)  # whole blocks only
        if _o_ok(_flash_pair(answer, q2, k2, v2, block_k=8)[0], _attention_ref(q2, k2, v2)[0]):
            raise Wrong("last-partial-block", f"O is right when N={n} splits into whole blocks, wrong when "
                        "the last block is partial", "the last block of keys may be shorter than block_k: "
                        "slice k[:, :, start:start + block_k], and do not stop one block early")
        raise Wrong("missing-rescale", "O is right with one block of keys, wrong with several",
                    "when a block raises the running max from m to m_new, what was summed so far was "
                    "computed with the old max: multiply l and acc by exp(m - m_new) before adding the block")
    ones = torch.ones_like(v)
    if not torch.allclose(_flash_pair(answer, q, k, ones, block_k=8)[0], ones, atol=1e-4):
        raise Wrong("not-normalised", "with v = 1 everywhere O should be 1 everywhere (softmax weights sum "
                    "to 1), and it is not",
                    "divide the accumulator by the running sum at the end: O = acc / l")
    o = _flash_pair(answer, q, k, v, block_k=8)[0]
    if _o_ok(o, _attention_ref(q, k, v, scale=1.0)[0]):
        raise Wrong("missing-scale", "O equals softmax(q·kᵀ)·v, without the scale",
                    "multiply the scores by 1/√d (d = q.shape[-1]) before the softmax's max and exp")
    from helpers.attention import attention_agreement

    raise Wrong("o-wrong", f"O differs from softmax(q·kᵀ/√d)·v (relative error "
                f"{attention_agreement(o, _attention_ref(q, k, v)[0]):.2g})",
                "try one block first (block_k ≥ N): then it is the plain softmax; then two blocks by hand")


def _diagnose_lse(lse: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
    s = (q.double() @ k.double().transpose(-2, -1)) * q.shape[-1] ** -0.5
    m, want = s.amax(-1), torch.logsumexp(s, -1)
    raw = torch.logsumexp(q.double() @ k.double().transpose(-2, -1), -1)
    lse = lse.double()
    mistakes = (
        (m, "lse-is-max", "L equals the rows' maxima m", "L = m + log(l): add the log of the running sum"),
        (want - m, "lse-without-max", "L equals log(l) alone", "L = m + log(l): add the running max back"),
        (torch.exp(want - m), "lse-not-log", "L equals the running sum l", "take its log: L = m + log(l)"),
        (raw, "lse-unscaled", "L is the logsumexp of the unscaled scores q·kᵀ",
         "L belongs to the scores the softmax saw: q·kᵀ/√d"),
    )
    for value, key, what, hint in mistakes:
        if torch.allclose(lse, value, rtol=1e-4, atol=1e-4):
            raise Wrong(key, what, hint)
    err = (lse - want).abs().max().item()
    raise Wrong("lse-wrong", f"L differs from logsumexp(q·kᵀ/√d) by up to {err:.2g}",
                "with the final running max m and running sum l of each row, L = m + log(l)")


def flash_forward(answer: Callable) -> str:
    """01-flash-forward: answer(q, k, v, block_k) -> (O, L), checked at several block sizes."""
    q, k, v = _qkv(37)
    want_o, want_lse = _attention_ref(q, k, v)
    for block_k in (8, 5, 64):  # several blocks with a partial last one; one block
        o, lse = _flash_pair(answer, q, k, v, block_k)
        if not _o_ok(o, want_o):
            _diagnose_o(answer, q, k, v)
        if not torch.allclose(lse.double(), want_lse.double(), rtol=1e-5, atol=1e-4):
            _diagnose_lse(lse, q, k)
    return ("O and L agree with softmax(q·kᵀ/√d)·v and logsumexp(q·kᵀ/√d) (float64 reference; relative "
            "error < 1e-5) for N=37 in blocks of 8, 5 and 64 keys")
