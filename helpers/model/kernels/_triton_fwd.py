"""The FlashAttention forward kernel in Triton (lesson 01); only this file and `_triton_bwd.py` import
triton. No `from __future__ import annotations`: Triton reads the `tl.constexpr` annotations as objects."""

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


# One program: one (BLOCK_M, d) output tile of one (batch, head). It streams K/V tiles with a running row
# max `m_i`, row sum `l_i` and fp32 accumulator, as tiled_attention does; exp2 with log2(e) in the scale.
def attn_fwd(Q, K, V, O, L, Mask, sm_scale,  # noqa: E741 - O is the output, named as in the papers
             stride_qb, stride_qh, stride_qt, stride_qd,
             stride_kb, stride_kh, stride_kt, stride_kd,
             stride_vb, stride_vh, stride_vt, stride_vd,
             stride_ob, stride_oh, stride_ot, stride_od,
             stride_mb, stride_mt,
             H, TQ, TK, CAUSAL_OFFSET,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, EVEN_N: tl.constexpr):
    pid_m = tl.program_id(0)  # which block of query rows
    pid_bh = tl.program_id(1)  # which (batch, head)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query rows of this program
    offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,) key columns within a tile
    offs_d = tl.arange(0, HEAD_DIM)

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=offs_m[:, None] < TQ, other=0.0)  # (BLOCK_M, d), loaded once
    k_base = K + b * stride_kb + h * stride_kh + offs_d[:, None] * stride_kd  # Kᵀ tile: (d, BLOCK_N)
    v_base = V + b * stride_vb + h * stride_vh + offs_d[None, :] * stride_vd  # V tile: (BLOCK_N, d)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max of each row's scores
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp(score - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # running sum of exp(score - m_i) · v
    # log2(e), written out: a global float cannot be used inside a compiled kernel
    qk_scale = sm_scale * 1.4426950408889634

    hi = TK
    if CAUSAL:  # key blocks entirely in the future of this query block are skipped, not masked
        hi = tl.minimum(TK, (pid_m + 1) * BLOCK_M + CAUSAL_OFFSET)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n  # (BLOCK_N,)
        if EVEN_N:
            k = tl.load(k_base + cols[None, :] * stride_kt)
            v = tl.load(v_base + cols[:, None] * stride_vt)
        else:
            k = tl.load(k_base + cols[None, :] * stride_kt, mask=cols[None, :] < TK, other=0.0)
            v = tl.load(v_base + cols[:, None] * stride_vt, mask=cols[:, None] < TK, other=0.0)
        s = tl.dot(q, k) * qk_scale  # (BLOCK_M, BLOCK_N) scores, in log2 units
        if not EVEN_N:
            s = tl.where(cols[None, :] < TK, s, float("-inf"))
        if CAUSAL:
            s = tl.where(cols[None, :] <= offs_m[:, None] + CAUSAL_OFFSET, s, float("-inf"))
        if HAS_MASK:
            keep = tl.load(Mask + b * stride_mb + cols * stride_mt, mask=cols < TK, other=0)
            s = tl.where(keep[None, :] != 0, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no visible key yet: no inf - inf
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)  # rescales what was summed under the old max
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new

    acc = acc / l_i[:, None]  # a row with no visible key divides by 0 -> NaN, as the naive formula gives
    # log-sum-exp of each row (log2 units, scale included), kept for the backward pass: P = exp2(S·scale - L)
    tl.store(L + pid_bh * TQ + offs_m, m_i + tl.log2(l_i), mask=offs_m < TQ)
    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=offs_m[:, None] < TQ)


def _even_n(args):
    return args["TK"] % args["BLOCK_N"] == 0


def build(interpret, configs=None):
    """The kernel interpreted (CPU tensors), compiled, or compiled and autotuned over `configs`."""
    if interpret:
        return InterpretedFunction(attn_fwd)
    kernel = triton.jit(attn_fwd)
    if configs:
        kernel = triton.heuristics({"EVEN_N": _even_n})(kernel)
        tried = [triton.Config({"BLOCK_M": c.block_m, "BLOCK_N": c.block_n}, num_warps=c.num_warps,
                               num_stages=c.num_stages) for c in configs]
        keys = ["TQ", "TK", "HEAD_DIM", "CAUSAL", "HAS_MASK"]  # a new tuning run for each new value of these
        kernel = triton.autotune(configs=tried, key=keys)(kernel)
    return kernel
