"""The FlashAttention backward kernels in Triton (lesson 01), imported lazily like the forward. Inputs are
contiguous (B, H, T, d)."""

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


# P is recomputed tile by tile from the forward's row log-sum-exp L (the (T, T) matrix is never stored):
#     dV = Pᵀ dO        dP = dO Vᵀ        dS = P ∘ (dP − D),  D = rowsum(dO ∘ O)
#     dQ = scale · dS K                    dK = scale · dSᵀ Q
# attn_bwd_dkdv: one program per key block; attn_bwd_dq: one per query block; no atomics.
def attn_bwd_dkdv(Q, K, V, DO, L, D, DK, DV, Mask, sm_scale, H, TQ, TK, CAUSAL_OFFSET,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr):
    pid_n = tl.program_id(0)  # which block of keys
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_base = Q + pid_bh * TQ * HEAD_DIM
    do_base = DO + pid_bh * TQ * HEAD_DIM
    kv_off = pid_bh * TK * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]  # (BLOCK_N, d)
    in_k = offs_n[:, None] < TK
    k = tl.load(K + kv_off, mask=in_k, other=0.0)
    v = tl.load(V + kv_off, mask=in_k, other=0.0)
    keep = offs_n < TK  # (BLOCK_N,) keys that exist and are not padding
    if HAS_MASK:
        keep = keep & (tl.load(Mask + b * TK + offs_n, mask=offs_n < TK, other=0) != 0)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): scores in log2 units, as in the forward
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    lo = 0
    if CAUSAL:  # queries before (first key - offset) see none of these keys
        lo = tl.maximum(pid_n * BLOCK_N - CAUSAL_OFFSET, 0) // BLOCK_M * BLOCK_M
    for start_m in range(lo, TQ, BLOCK_M):
        rows = start_m + offs_m  # (BLOCK_M,)
        in_q = rows < TQ
        q = tl.load(q_base + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=in_q[:, None], other=0.0)
        do = tl.load(do_base + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=in_q[:, None], other=0.0)
        lse = tl.load(L + pid_bh * TQ + rows, mask=in_q, other=0.0)
        lse = tl.where(lse == float("-inf"), 0.0, lse)  # a row that saw no key: P = 0, not NaN
        delta = tl.load(D + pid_bh * TQ + rows, mask=in_q, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_M, BLOCK_N)
        visible = keep[None, :] & in_q[:, None]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= rows[:, None] + CAUSAL_OFFSET)
        p = tl.where(visible, tl.exp2(s - lse[:, None]), 0.0)  # the forward's probabilities, recomputed
        dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv)
        dp = tl.dot(do, tl.trans(v))  # (BLOCK_M, BLOCK_N)
        ds = p * (dp - delta[:, None])
        dk = tl.dot(tl.trans(ds.to(q.dtype)), q, dk)
    tl.store(DK + kv_off, (dk * sm_scale).to(DK.dtype.element_ty), mask=in_k)
    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=in_k)


def attn_bwd_dq(Q, K, V, DO, L, D, DQ, Mask, sm_scale, H, TQ, TK, CAUSAL_OFFSET,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr):
    pid_m = tl.program_id(0)  # which block of queries
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    in_q = rows < TQ
    q_off = pid_bh * TQ * HEAD_DIM + rows[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(Q + q_off, mask=in_q[:, None], other=0.0)
    do = tl.load(DO + q_off, mask=in_q[:, None], other=0.0)
    lse = tl.load(L + pid_bh * TQ + rows, mask=in_q, other=0.0)
    lse = tl.where(lse == float("-inf"), 0.0, lse)
    delta = tl.load(D + pid_bh * TQ + rows, mask=in_q, other=0.0)
    k_base = K + pid_bh * TK * HEAD_DIM
    v_base = V + pid_bh * TK * HEAD_DIM
    qk_scale = sm_scale * 1.4426950408889634
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    hi = TK
    if CAUSAL:
        hi = tl.minimum(TK, (pid_m + 1) * BLOCK_M + CAUSAL_OFFSET)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        in_k = cols < TK
        k = tl.load(k_base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=in_k[:, None], other=0.0)
        v = tl.load(v_base + cols[:, None] * HEAD_DIM + offs_d[None, :], mask=in_k[:, None], other=0.0)
        visible = in_k[None, :] & in_q[:, None]
        if HAS_MASK:
            visible = visible & (tl.load(Mask + b * TK + cols, mask=in_k, other=0) != 0)[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + CAUSAL_OFFSET)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        p = tl.where(visible, tl.exp2(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    tl.store(DQ + q_off, (dq * sm_scale).to(DQ.dtype.element_ty), mask=in_q[:, None])


def build(interpret):
    """(dK/dV kernel, dQ kernel), interpreted (CPU tensors) or compiled."""
    if interpret:
        return InterpretedFunction(attn_bwd_dkdv), InterpretedFunction(attn_bwd_dq)
    return triton.jit(attn_bwd_dkdv), triton.jit(attn_bwd_dq)
