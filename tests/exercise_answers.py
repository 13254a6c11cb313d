"""Answers learners write to the checked exercises, for tests/test_exercises.py: for each exercise, WRONG
answers (each a mistake, keyed by the mistake its check must name) and RIGHT ones (other valid ways, which
must pass). Each is written from scratch as a learner would write it, not as an edit of the solution: a check
is only as good as the wrong answers it has been shown to reject. A key may carry a suffix after "#" when two
answers make the same mistake in different code ("per-step-read#if-on-a-tensor").
"""

from __future__ import annotations

WRONG: dict[str, dict[str, str]] = {}
RIGHT: dict[str, dict[str, str]] = {}

# --- 00-roofline: intensity_and_regime(op, n, roof) ---------------------------------------------------------

WRONG["00-roofline"] = {
    "ridge-fastest": '''
def intensity_and_regime(op, n, roof):
    sizes = {"matmul": (2 * n**3, 3 * n * n), "add": (n, 3 * n), "matvec": (2 * n * n, n * n + 2 * n)}
    flops, elements = sizes[op]
    nbytes = 4 * elements
    ridge = max(roof.matmul_flops.values()) / roof.bandwidth  # the best the device can do
    ai = flops / nbytes
    return flops, nbytes, ai, "compute-bound" if ai >= ridge else "memory-bound"
''',
    "ridge-first-precision": '''
def intensity_and_regime(op, n, roof):
    if op == "matmul":
        f, b = 2 * n ** 3, 12 * n ** 2
    elif op == "add":
        f, b = n, 12 * n
    else:
        f, b = 2 * n ** 2, 4 * (n ** 2 + 2 * n)
    peak = list(roof.matmul_flops.values())[0]
    return f, b, f / b, ("compute-bound" if f / b >= peak / roof.bandwidth else "memory-bound")
''',
    "flops-multiply-add": '''
def intensity_and_regime(op, n, roof):
    if op == "matmul":
        flops = n ** 3  # n² outputs, n multiply-adds each
        moved = 3 * n * n * 4
    elif op == "add":
        flops = n
        moved = 3 * n * 4
    else:
        flops = n * n
        moved = (n * n + 2 * n) * 4
    intensity = flops / moved
    ridge = roof.ridge_point("fp32")
    return flops, moved, intensity, "compute-bound" if intensity >= ridge else "memory-bound"
''',
    "flops-add-doubled": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": 2 * n, "matvec": 2 * n ** 2}[op]  # two FLOPs per element
    moved = {"matmul": 3 * n ** 2, "add": 3 * n, "matvec": n ** 2 + 2 * n}[op] * 4
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, moved, flops / moved, "compute-bound" if flops / moved >= ridge else "memory-bound"
''',
    "bytes-missing-tensor": '''
def intensity_and_regime(op, n, roof):
    # bytes: what the op reads
    if op == "matmul":
        flops, nbytes = 2 * n ** 3, 2 * n * n * 4
    elif op == "add":
        flops, nbytes = n, 2 * n * 4
    else:
        flops, nbytes = 2 * n * n, (n * n + n) * 4
    i = flops / nbytes
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, nbytes, i, "compute-bound" if i >= ridge else "memory-bound"
''',
    "bytes-missing-tensor#like-x-plus-x": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n ** 2}[op]
    if op == "add":
        nbytes = 8 * n  # as in the lesson: 8 bytes per element
    elif op == "matmul":
        nbytes = 12 * n * n
    else:
        nbytes = 4 * (n * n + 2 * n)
    ai = flops / nbytes
    return flops, nbytes, ai, "compute-bound" if ai >= roof.ridge_point() else "memory-bound"
''',
    "bytes-no-reuse": '''
def intensity_and_regime(op, n, roof):
    if op == "matmul":  # every multiply-add reads one element of A and one of B; C written once
        flops, nbytes = 2 * n ** 3, (2 * n ** 3 + n ** 2) * 4
    elif op == "add":
        flops, nbytes = n, 12 * n
    else:
        flops, nbytes = 2 * n ** 2, (n * n + 2 * n) * 4
    ai = flops / nbytes
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, nbytes, ai, "compute-bound" if ai >= ridge else "memory-bound"
''',
    "bytes-per-element": '''
def intensity_and_regime(op, n, roof):
    el = {"matmul": 3 * n * n, "add": 3 * n, "matvec": n * n + 2 * n}[op]
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n * n}[op]
    nbytes = el * 8  # float
    r = flops / nbytes
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, nbytes, r, "compute-bound" if r >= ridge else "memory-bound"
''',
    "bytes-in-elements": '''
def intensity_and_regime(op, n, roof):
    if op == "matmul":
        return _out(2 * n ** 3, 3 * n * n, roof)
    if op == "add":
        return _out(n, 3 * n, roof)
    return _out(2 * n * n, n * n + 2 * n, roof)


def _out(flops, moved, roof):
    ai = flops / moved
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, moved, ai, "compute-bound" if ai >= ridge else "memory-bound"
''',
    "intensity-inverted": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n ** 2}[op]
    nbytes = 4 * {"matmul": 3 * n ** 2, "add": 3 * n, "matvec": n ** 2 + 2 * n}[op]
    intensity = nbytes / flops  # bytes per FLOP
    return flops, nbytes, intensity, "compute-bound" if intensity < 1 else "memory-bound"
''',
    "ridge-not-a-ratio": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n ** 2}[op]
    nbytes = 4 * {"matmul": 3 * n ** 2, "add": 3 * n, "matvec": n ** 2 + 2 * n}[op]
    intensity = flops / nbytes
    peak = roof.matmul_flops["fp32"]
    return flops, nbytes, intensity, "compute-bound" if intensity >= peak else "memory-bound"
''',
    "regime-inverted": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n ** 2}[op]
    nbytes = 4 * {"matmul": 3 * n ** 2, "add": 3 * n, "matvec": n ** 2 + 2 * n}[op]
    intensity = flops / nbytes
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    # above the ridge the op needs more bytes than the memory gives
    return flops, nbytes, intensity, "memory-bound" if intensity >= ridge else "compute-bound"
''',
    "regime-name": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n ** 2}[op]
    nbytes = 4 * {"matmul": 3 * n ** 2, "add": 3 * n, "matvec": n ** 2 + 2 * n}[op]
    intensity = flops / nbytes
    return flops, nbytes, intensity, "compute" if intensity >= roof.ridge_point("fp32") else "memory"
''',
    "return-shape": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n ** 2}[op]
    nbytes = 4 * {"matmul": 3 * n ** 2, "add": 3 * n, "matvec": n ** 2 + 2 * n}[op]
    intensity = flops / nbytes
    return intensity, "compute-bound" if intensity >= roof.ridge_point("fp32") else "memory-bound"
''',
}
RIGHT["00-roofline"] = {
    "ridge_point-and-strict-comparison": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n ** 2}[op]
    elements = {"matmul": 3 * n ** 2, "add": 3 * n, "matvec": n ** 2 + 2 * n}[op]
    nbytes = elements * 4
    ridge = roof.ridge_point("fp32")
    return flops, nbytes, flops / nbytes, "memory-bound" if flops / nbytes < ridge else "compute-bound"
''',
    "element-size-from-torch": '''
import torch


def intensity_and_regime(op, n, roof):
    size = torch.finfo(torch.float32).bits // 8
    shapes = {"matmul": ([(n, n), (n, n)], (n, n), 2 * n ** 3),
              "add": ([(n,), (n,)], (n,), n),
              "matvec": ([(n, n), (n,)], (n,), 2 * n * n)}
    ins, out, flops = shapes[op]
    count = sum(torch.Size(s).numel() for s in ins) + torch.Size(out).numel()
    nbytes = count * size
    peak = roof.matmul_flops["fp32"]
    regime = "compute-bound" if flops / nbytes * roof.bandwidth >= peak else "memory-bound"
    return flops, nbytes, flops / nbytes, regime
''',
}

# --- 01-flash-forward: flash_forward(q, k, v, block_k) ------------------------------------------------------

WRONG["01-flash-forward"] = {
    "block-size-ignored": '''
import torch
BLOCK = 16
def flash_forward(q, k, v, block_k=16):
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros(q.shape)
    for start in range(0, k.shape[2], BLOCK):
        s = q @ k[:, :, start:start + BLOCK].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        a = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ v[:, :, start:start + BLOCK]
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
    "input-changed": '''
import torch
def flash_forward(q, k, v, block_k=16):
    q *= q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros(q.shape)
    for start in range(0, k.shape[2], block_k):
        s = q @ k[:, :, start:start + block_k].transpose(-2, -1)
        m_new = torch.maximum(m, s.amax(-1))
        a = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ v[:, :, start:start + block_k]
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
    "keys-from-q": '''
import torch
def flash_forward(q, k, v, block_k=16):
    B, H, N, d = q.shape
    m = torch.full((B, H, N), float("-inf"))
    l = torch.zeros(B, H, N)
    acc = torch.zeros(B, H, N, d)
    for start in range(0, N, block_k):
        s = q @ k[:, :, start:start + block_k].transpose(-2, -1) / d ** 0.5
        m_new = torch.maximum(m, s.amax(-1))
        a = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ v[:, :, start:start + block_k]
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
    "last-partial-block": '''
import torch
def flash_forward(q, k, v, block_k=16):
    n_blocks = k.shape[2] // block_k
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros(q.shape)
    for i in range(n_blocks):
        kb = k[:, :, i * block_k:(i + 1) * block_k]
        vb = v[:, :, i * block_k:(i + 1) * block_k]
        s = q @ kb.transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        a = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ vb
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
    "lse-is-max": '''
import torch
def flash_forward(q, k, v, block_k=16):
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros(q.shape)
    for j in range(0, k.shape[2], block_k):
        s = q @ k[:, :, j:j + block_k].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        a = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ v[:, :, j:j + block_k]
        m = m_new
    return acc / l[..., None], m
''',
    "lse-without-max": '''
import torch
def flash_forward(q, k, v, block_k=16):
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros(q.shape)
    for j in range(0, k.shape[2], block_k):
        s = q @ k[:, :, j:j + block_k].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        a = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ v[:, :, j:j + block_k]
        m = m_new
    return acc / l[..., None], torch.log(l)
''',
    "missing-rescale": '''
import torch
def flash_forward(q, k, v, block_k=16):
    B, H, N, d = q.shape
    m = torch.full((B, H, N), float("-inf"))
    l = torch.zeros(B, H, N)
    acc = torch.zeros(B, H, N, d)
    for j in range(0, k.shape[2], block_k):
        s = q @ k[:, :, j:j + block_k].transpose(-2, -1) / d ** 0.5
        m = torch.maximum(m, s.max(dim=-1).values)
        p = torch.exp(s - m.unsqueeze(-1))
        l = l + p.sum(-1)
        acc = acc + p @ v[:, :, j:j + block_k]
    return acc / l.unsqueeze(-1), m + torch.log(l)
''',
    "missing-scale": '''
import torch
def flash_forward(q, k, v, block_k=16):
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros(q.shape)
    for j in range(0, k.shape[2], block_k):
        s = q @ k[:, :, j:j + block_k].transpose(-2, -1)
        m_new = torch.maximum(m, s.amax(-1))
        a = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ v[:, :, j:j + block_k]
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
    "whole-score-matrix": '''
import torch
def flash_forward(q, k, v, block_k=16):
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)
''',
    "not-normalised": '''
import torch
def flash_forward(q, k, v, block_k=16):
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    o = torch.zeros(q.shape)
    for j in range(0, k.shape[2], block_k):
        s = (q @ k[:, :, j:j + block_k].transpose(2, 3)) * scale
        m2 = torch.maximum(m, s.amax(3))
        c = torch.exp(m - m2)
        p = torch.exp(s - m2[..., None])
        l = l * c + p.sum(3)
        o = o * c[..., None] + p @ v[:, :, j:j + block_k]
        m = m2
    return o, m + torch.log(l)
''',
    "whole-score-rows": '''
import torch
def flash_forward(q, k, v, block_k=16):
    outs, lses = [], []
    for i in range(0, q.shape[2], block_k):
        s = q[:, :, i:i + block_k] @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        outs.append(torch.softmax(s, -1) @ v)
        lses.append(torch.logsumexp(s, -1))
    return torch.cat(outs, 2), torch.cat(lses, 2)
''',
    "rescale-acc-only": '''
import torch
def flash_forward(q, k, v, block_k=16):
    scale = 1 / q.shape[-1] ** 0.5
    m = torch.full(q.shape[:-1], -float("inf"))
    l = torch.zeros(q.shape[:-1])
    acc = torch.zeros_like(q)
    for j in range(0, k.shape[2], block_k):
        s = q @ k[:, :, j:j + block_k].mT * scale
        new_m = torch.max(m, s.amax(-1))
        acc = acc * torch.exp(m - new_m)[..., None]
        p = torch.exp(s - new_m[..., None])
        l = l + p.sum(-1)
        acc = acc + p @ v[:, :, j:j + block_k]
        m = new_m
    return acc / l[..., None], m + l.log()
''',
    "slice-off-by-one": '''
import torch
def flash_forward(q, k, v, block_k=16):
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros(q.shape)
    for start in range(0, k.shape[2], block_k):
        end = start + block_k - 1
        s = q @ k[:, :, start:end].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        a = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ v[:, :, start:end]
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
    "uses-course-code": '''
import torch
from helpers.model.attention import tiled_attention
def flash_forward(q, k, v, block_k=16):
    o = tiled_attention(q, k, v, block_k=block_k)
    lse = torch.logsumexp(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, -1)
    return o, lse
''',
    "uses-sdpa": '''
import torch
import torch.nn.functional as F
def flash_forward(q, k, v, block_k=16):
    o = F.scaled_dot_product_attention(q, k, v)
    lse = torch.logsumexp(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, dim=-1)
    return o, lse
''',
    "wrong-shape": '''
import torch
def flash_forward(q, k, v, block_k=16):
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3] + (1,), float("-inf"))
    l = torch.zeros(q.shape[:3] + (1,))
    acc = torch.zeros(q.shape)
    for start in range(0, k.shape[2], block_k):
        s = q @ k[:, :, start:start + block_k].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        a = torch.exp(m - m_new)
        p = torch.exp(s - m_new)
        l = l * a + p.sum(-1, keepdim=True)
        acc = acc * a + p @ v[:, :, start:start + block_k]
        m = m_new
    return acc / l, m + torch.log(l)
''',
}
RIGHT["01-flash-forward"] = {
    "exp2": '''
import math
import torch
def flash_forward(q, k, v, block_k=16):
    c = q.shape[-1] ** -0.5 * math.log2(math.e)  # scores in base 2: exp(x) = 2 ** (x · log2 e)
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros(q.shape)
    for j in range(0, k.shape[2], block_k):
        s = (q @ k[:, :, j:j + block_k].transpose(-2, -1)) * c
        m_new = torch.maximum(m, s.amax(-1))
        a = torch.exp2(m - m_new)
        p = torch.exp2(s - m_new[..., None])
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ v[:, :, j:j + block_k]
        m = m_new
    return acc / l[..., None], (m + torch.log2(l)) * math.log(2)
''',
    "float64-accumulation": '''
import torch
def flash_forward(q, k, v, block_k=16):
    q64, k64, v64 = q.double(), k.double(), v.double()
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], float("-inf"), dtype=torch.float64)
    l = torch.zeros(q.shape[:3], dtype=torch.float64)
    acc = torch.zeros(q.shape, dtype=torch.float64)
    for j in range(0, k.shape[2], block_k):
        s = q64 @ k64[:, :, j:j + block_k].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        a = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ v64[:, :, j:j + block_k]
        m = m_new
    return (acc / l[..., None]).to(q.dtype), (m + torch.log(l)).to(q.dtype)
''',
    "log-domain": '''
import torch
def flash_forward(q, k, v, block_k=16):
    # keep the running logsumexp L itself, and acc already normalised by it
    scale = q.shape[-1] ** -0.5
    L = torch.full(q.shape[:3], float("-inf"))
    o = torch.zeros(q.shape)
    for j in range(0, k.shape[2], block_k):
        s = q @ k[:, :, j:j + block_k].transpose(-2, -1) * scale
        lb = torch.logsumexp(s, -1)
        L_new = torch.logaddexp(L, lb)
        o = o * torch.exp(L - L_new)[..., None] + torch.exp(s - L_new[..., None]) @ v[:, :, j:j + block_k]
        L = L_new
    return o, L
''',
    "transposed-tiles": '''
import torch
def flash_forward(q, k, v, block_k=16):
    # tiles as (keys, queries): kb @ qᵀ
    scale = q.shape[-1] ** -0.5
    qt = q.transpose(-2, -1)
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros(q.shape)
    for j in range(0, k.shape[2], block_k):
        st = (k[:, :, j:j + block_k] @ qt) * scale  # (B, H, block, N_q)
        m_new = torch.maximum(m, st.amax(-2))
        a = torch.exp(m - m_new)
        pt = torch.exp(st - m_new[:, :, None, :])
        l = l * a + pt.sum(-2)
        acc = acc * a[..., None] + pt.transpose(-2, -1) @ v[:, :, j:j + block_k]
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
    "two-level": '''
import torch
def flash_forward(q, k, v, block_k=16, block_q=8):
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=q.dtype)  # L in q's dtype too (float64 for gradcheck)
    for i in range(0, q.shape[2], block_q):
        qi = q[:, :, i:i + block_q] * scale
        m = torch.full(qi.shape[:3], float("-inf"))
        l = torch.zeros(qi.shape[:3])
        acc = torch.zeros_like(qi)
        for j in range(0, k.shape[2], block_k):
            s = qi @ k[:, :, j:j + block_k].transpose(-2, -1)
            m_new = torch.maximum(m, s.amax(-1))
            a = torch.exp(m - m_new)
            p = torch.exp(s - m_new[..., None])
            l = l * a + p.sum(-1)
            acc = acc * a[..., None] + p @ v[:, :, j:j + block_k]
            m = m_new
        out[:, :, i:i + block_q] = acc / l[..., None]
        lse[:, :, i:i + block_q] = m + torch.log(l)
    return out, lse
''',
}

# --- 03-largest-batch: largest_batch(step_fn, limit) --------------------------------------------------------

WRONG["03-largest-batch"] = {
    "swallowed-error": '''
import gc

import torch


def largest_batch(step_fn, limit):
    def ok(n):
        try:
            step_fn(n)
        except RuntimeError:  # CUDA's out-of-memory error is a RuntimeError
            failed = True
        else:
            failed = False
        if failed:
            gc.collect()
            torch.cuda.empty_cache()
        return not failed

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and ok(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        if ok(limit):
            return limit
        hi = limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
''',
    "swallowed-error#except-exception": '''
import gc


def largest_batch(step_fn, limit):
    def fits(n):
        try:
            step_fn(n)
            return True
        except Exception:
            pass
        gc.collect()
        return False

    good, n = 0, 1
    while n <= limit and fits(n):
        good, n = n, 2 * n
    if good == 0:
        return 0
    bad = min(n, limit + 1)
    if bad == limit + 1 and (good == limit or fits(limit)):
        return limit
    bad = min(bad, limit)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good
''',
    "uses-course-code": '''
from helpers.measure.memory import find_max_batch_size


def largest_batch(step_fn, limit):
    return find_max_batch_size(step_fn, limit=limit, verbose=False)
''',
    "no-gc": '''
import torch


def largest_batch(step_fn, limit):
    def fits(n):
        try:
            step_fn(n)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            return False
        return True

    lo = 0
    n = 1
    while n <= limit and fits(n):
        lo = n
        n *= 2
    if lo == 0:
        return 0
    hi = n if n <= limit else limit + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
''',
    "gc-while-error-held": '''
import gc

import torch


def largest_batch(step_fn, limit):
    def fits(n):
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError:
            gc.collect()  # free the failed step right away
            return False

    lo, n = 0, 1
    while n <= limit and fits(n):
        lo, n = n, n * 2
    if lo == 0:
        return 0
    hi = n if n <= limit else limit + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
''',
    "hidden-state#errors-kept-outside": '''
import gc

import torch

errors = []  # what went wrong, for the log


def largest_batch(step_fn, limit):
    def fits(n):
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError as err:
            errors.append(err)
        gc.collect()
        return False

    lo, n = 0, 1
    while n <= limit and fits(n):
        lo, n = n, n * 2
    if lo == 0:
        return 0
    hi = n if n <= limit else limit + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
''',
    "no-bisect": '''
import gc

import torch


def largest_batch(step_fn, limit):
    best, n = 0, 1
    while n <= limit:
        try:
            step_fn(n)
        except torch.cuda.OutOfMemoryError:
            break
        best, n = n, n * 2
    gc.collect()
    return best
''',
    "limit-not-tried": '''
import gc

import torch


def largest_batch(step_fn, limit):
    def fits(n):
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError:
            pass
        gc.collect()
        return False

    good, n = 0, 1
    while n <= limit:
        if not fits(n):
            break
        good, n = n, n * 2
    else:
        return good  # doubled past the limit: good is the largest
    while n - good > 1:
        mid = (good + n) // 2
        if fits(mid):
            good = mid
        else:
            n = mid
    return good
''',
    "off-by-one": '''
import gc

import torch


def largest_batch(step_fn, limit):
    def fits(n):
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError:
            pass
        gc.collect()
        return False

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        if fits(limit):
            return limit
        hi = limit
    while lo < hi - 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return hi
''',
    "linear-search": '''
import gc

import torch


def largest_batch(step_fn, limit):
    n = 0
    while n < limit:
        try:
            step_fn(n + 1)
        except torch.cuda.OutOfMemoryError:
            break
        n += 1
    gc.collect()
    return n
''',
    "beyond-limit": '''
import gc

import torch


def largest_batch(step_fn, limit):
    def fits(n):
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError:
            pass
        gc.collect()
        return False

    lo, hi = 0, 1
    while fits(hi):  # double until it fails
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return min(lo, limit)
''',
}
RIGHT["03-largest-batch"] = {
    "oom-by-message": '''
import gc

import torch


def largest_batch(step_fn, limit):
    def fits(n):
        try:
            step_fn(n)
            return True
        except RuntimeError as err:  # CUDA, MPS and CPU allocators all say "out of memory"
            if "out of memory" not in str(err).lower():
                raise
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return False

    lo, n = 0, 1
    while n <= limit and fits(n):
        lo, n = n, n * 2
    if lo == 0:
        return 0
    hi = n if n <= limit else limit + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
''',
    "inclusive-bounds": '''
import gc

import torch


def largest_batch(step_fn, limit):
    def fits(n):
        ok = True
        try:
            step_fn(n)
        except torch.OutOfMemoryError:
            ok = False
        if not ok:
            gc.collect()
        return ok

    size = 1
    while size < limit and fits(size):
        size *= 2
    lo, hi = max(size // 2, 1), min(size, limit)  # the answer lies in [lo - 1, hi]
    if not fits(lo):
        return lo - 1
    while lo < hi:  # invariant: lo fits
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
''',
}

# --- 06-hidden-syncs: train_loop(train_step, batches) -------------------------------------------------------

WRONG["06-hidden-syncs"] = {
    "per-step-read": '''
def train_loop(train_step, batches):
    losses = []
    for batch in batches:
        loss = train_step(batch)
        losses.append(loss.item())
    if any(x != x or x in (float("inf"), float("-inf")) for x in losses):
        raise FloatingPointError("a loss is not finite")
    return losses
''',
    "per-step-read#if-on-a-tensor": '''
import torch


def train_loop(train_step, batches):
    losses = []
    for i, batch in enumerate(batches):
        loss = train_step(batch)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"step {i}")
        losses.append(loss)
    return torch.stack(losses).tolist()
''',
    "per-step-read#math-isfinite": '''
import math


def train_loop(train_step, batches):
    out = []
    for i, batch in enumerate(batches):
        loss = train_step(batch)
        if not math.isfinite(loss):  # math, not torch: no tensor op on the device
            raise FloatingPointError(f"step {i}: {loss}")
        out.append(loss)
    return [float(x) for x in out]
''',
    "per-step-copy": '''
import torch


def train_loop(train_step, batches):
    losses = []
    for batch in batches:
        losses.append(train_step(batch).to("cpu"))  # collect on the host
    stacked = torch.stack(losses)
    if not torch.isfinite(stacked).all():
        raise FloatingPointError("loss is not finite")
    return stacked.tolist()
''',
    "per-step-copy#host-buffer": '''
import torch


def train_loop(train_step, batches):
    losses = torch.zeros(len(batches))
    for i, batch in enumerate(batches):
        losses[i] = train_step(batch)
    if not torch.isfinite(losses).all():
        raise FloatingPointError("loss is not finite")
    return losses.tolist()
''',
    "per-step-shape": '''
import torch


def train_loop(train_step, batches):
    losses, bad = [], []
    for i, batch in enumerate(batches):
        loss = train_step(batch)
        losses.append(loss)
        bad.append(torch.nonzero(~torch.isfinite(loss.reshape(1))))  # indices of a bad loss, if any
    if torch.cat(bad).numel():
        raise FloatingPointError("a loss is not finite")
    return torch.stack(losses).tolist()
''',
    "per-step-shape#boolean-mask": '''
import torch


def train_loop(train_step, batches):
    losses, finite = [], []
    for batch in batches:
        loss = train_step(batch).reshape(1)
        losses.append(loss)
        finite.append(loss[torch.isfinite(loss)])  # keeps only the finite ones
    if len(torch.cat(finite)) < len(losses):
        raise FloatingPointError("a loss is not finite")
    return torch.cat(losses).tolist()
''',
    "per-step-numpy": '''
import numpy as np


def train_loop(train_step, batches):
    losses = []
    for batch in batches:
        losses.append(np.asarray(train_step(batch)))
    values = np.array(losses, dtype=np.float64)
    if not np.isfinite(values).all():
        raise FloatingPointError("not finite")
    return values.tolist()
''',
    "per-step-print": '''
import torch


def train_loop(train_step, batches):
    losses = []
    for step, batch in enumerate(batches):
        loss = train_step(batch)
        print(f"step {step}: loss {loss:.4f}")
        losses.append(loss)
    stacked = torch.stack(losses)
    if not torch.isfinite(stacked).all():
        raise FloatingPointError("not finite")
    return stacked.tolist()
''',
    "not-floats": '''
import torch


def train_loop(train_step, batches):
    losses = torch.stack([train_step(b) for b in batches])
    if not torch.isfinite(losses).all():
        raise FloatingPointError("not finite")
    return losses
''',
    "nan-unnoticed": '''
import torch


def train_loop(train_step, batches):
    return torch.stack([train_step(b) for b in batches]).tolist()
''',
    "wrong-error": '''
import torch


def train_loop(train_step, batches):
    losses = torch.stack([train_step(b) for b in batches])
    assert torch.isfinite(losses).all(), "a loss is not finite"
    return losses.tolist()
''',
    "losses-differ": '''
import torch


def train_loop(train_step, batches):
    losses = [train_step(b) for b in batches]
    mean = torch.stack(losses).mean()  # the epoch's loss
    if not torch.isfinite(mean):
        raise FloatingPointError("not finite")
    return [mean.item()]
''',
}
RIGHT["06-hidden-syncs"] = {
    "floats-after-the-loop": '''
import math

import torch


def train_loop(train_step, batches):
    losses = [train_step(b) for b in batches]
    out = []
    for loss in losses:
        out.append(float(loss))
    if not all(math.isfinite(x) for x in out):
        raise FloatingPointError("not finite")
    return out
''',
    "one-copy-then-numpy": '''
import math

import torch


def train_loop(train_step, batches):
    losses = [train_step(batch) for batch in batches]
    values = torch.stack(losses).cpu().numpy()  # one copy to the host, after the loop
    for i, x in enumerate(values.tolist()):
        if not math.isfinite(x):
            raise FloatingPointError(f"step {i}: the loss is {x}")
    return values.tolist()
''',
    "device-buffer": '''
import torch


def train_loop(train_step, batches):
    buf = None
    for i, batch in enumerate(batches):
        loss = train_step(batch)
        if buf is None:
            buf = torch.empty(len(batches), device=loss.device)  # on the loss's device
        buf[i] = loss
    if not bool(torch.isfinite(buf).all()):
        raise FloatingPointError("a loss is not finite")
    return buf.tolist()
''',
    "read-each-after-the-loop": '''
import torch


def train_loop(train_step, batches):
    losses = []
    for batch in batches:
        losses.append(train_step(batch))
    out = [x.item() for x in losses]  # after the loop: the device has nothing left to do
    if not all(torch.isfinite(torch.tensor(out))):
        raise FloatingPointError("a loss is not finite")
    return out
''',
}

# --- 05-graph-break: loss_without_breaks(model, batch, max_loss) --------------------------------------------

WRONG["05-graph-break"] = {
    "graph-break": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    factor = max_loss / loss.item()  # a number, not a tensor
    return torch.where(loss > max_loss, loss * factor, loss)
''',
    "graph-break#print": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    scaled = loss * (max_loss / loss.detach())
    print("guarded loss")
    return torch.where(loss > max_loss, scaled, loss)
''',
    "gradient-zero": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    return torch.clamp(loss, max=max_loss)
''',
    "gradient-zero#divided-by-loss": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    return torch.where(loss > max_loss, loss * (max_loss / loss), loss)
''',
    "branch-dropped": '''
def loss_without_breaks(model, batch, max_loss):
    return model(**batch).loss  # the guard was only for the print
''',
    "loss-differs": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    return torch.where(loss > max_loss, loss / max_loss, loss)
''',
    "gradient": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    # below max_loss: the value stays the loss (loss.detach() cancels it), the gradient is doubled
    return torch.where(loss > max_loss, loss * (max_loss / loss.detach()), loss * 2 - loss.detach())
''',
}
RIGHT["05-graph-break"] = {
    "clamped-factor": '''
def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    factor = (max_loss / loss.detach()).clamp(max=1.0)  # 1 when the loss is small enough
    return loss * factor
''',
    "minimum-of-two": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    scale = torch.minimum(torch.ones_like(loss), max_loss / loss.detach())
    return loss * scale
''',
}

# --- 02-fp16-step: fp16_step(model, batch, optimizer, scaler, device, max_norm) -----------------------------

WRONG["02-fp16-step"] = {
    "clip-before-unscale": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad()
    with torch.autocast(device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss
''',
    "no-clip": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        out = model(**batch)
    scaler.scale(out.loss).backward()
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    return out.loss.detach()
''',
    "direct-step": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scaler.update()
    return loss
''',
    "backward-in-autocast": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
    return loss
''',
    "no-autocast": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    loss = model(**batch).loss  # the scaler does the fp16 part
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss
''',
    "not-fp16": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss
''',
    "no-scale": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    loss.backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss
''',
    "no-update": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    return loss
''',
    "update-before-step": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.update()
    scaler.step(optimizer)
    return loss
''',
    "no-zero-grad": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss
''',
    "returned-scaled": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = scaler.scale(model(**batch).loss)
    loss.backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
''',
    "update#zero-grad-before-step": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.zero_grad(set_to_none=True)
    scaler.step(optimizer)
    scaler.update()
    return loss
''',
}
RIGHT["02-fp16-step"] = {
    "zero-grad-at-the-end": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        out = model(**batch)
        loss = out.loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)  # ready for the next step
    return loss.detach()
''',
    "zeros-not-none-and-clip-by-hand": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=False)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    factor = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(factor)
    scaler.step(optimizer)
    scaler.update()
    return loss
''',
}

# --- 07-bucketed-allreduce: attach_grad_allreduce(model, bucket_cap_bytes) -> finish ------------------------
# (run in torchrun's worker processes, where `torch` and `dist` are defined)

WRONG["07-bucketed-allreduce"] = {
    "waited-in-backward": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    world = dist.get_world_size()
    state = {"params": [], "bytes": 0}

    def flush():
        params = state["params"]
        if not params:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, async_op=True).wait()  # async, so it does not block
        flat /= world
        i = 0
        for p in params:
            p.grad.copy_(flat[i:i + p.numel()].view_as(p))
            i += p.numel()
        state["params"], state["bytes"] = [], 0

    def hook(p):
        state["params"].append(p)
        state["bytes"] += p.grad.nbytes
        if state["bytes"] >= bucket_cap_bytes:
            flush()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)
    return flush
''',
    "cap-ignored": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    params = [p for p in model.parameters() if p.requires_grad]
    ready, pending = [], []

    def hook(p):
        ready.append(p)
        if len(ready) == len(params):  # every gradient is in: send them all at once
            flat = torch.cat([q.grad.flatten() for q in ready])
            pending.append((dist.all_reduce(flat, async_op=True), flat, list(ready)))
            ready.clear()

    for p in params:
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for work, flat, ps in pending:
            work.wait()
            flat /= dist.get_world_size()
            offset = 0
            for q in ps:
                q.grad.copy_(flat[offset:offset + q.numel()].view_as(q.grad))
                offset += q.numel()
        pending.clear()

    return finish
''',
    "cap-in-elements": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    bucket, pending = [], []

    def send():
        if bucket:
            flat = torch.cat([p.grad.view(-1) for p in bucket])
            pending.append((dist.all_reduce(flat, async_op=True), flat, bucket[:]))
            bucket.clear()

    def hook(p):
        bucket.append(p)
        if sum(q.numel() for q in bucket) >= bucket_cap_bytes:
            send()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        send()
        for work, flat, ps in pending:
            work.wait()
            flat.div_(dist.get_world_size())
            for q, piece in zip(ps, flat.split([q.numel() for q in ps])):
                q.grad.copy_(piece.view_as(q.grad))
        pending.clear()

    return finish
''',
    "summed": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    bucket, size, pending = [], [0], []

    def flush():
        if bucket:
            flat = torch.cat([p.grad.flatten() for p in bucket])
            pending.append((dist.all_reduce(flat, async_op=True), flat, list(bucket)))
            bucket.clear()
            size[0] = 0

    def hook(p):
        bucket.append(p)
        size[0] += p.grad.numel() * p.grad.element_size()
        if size[0] >= bucket_cap_bytes:
            flush()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        flush()
        for h, flat, ps in pending:
            h.wait()  # all_reduce gives the average over the processes
            n = 0
            for p in ps:
                p.grad.copy_(flat[n:n + p.numel()].view_as(p.grad))
                n += p.numel()
        pending.clear()

    return finish
''',
    "last-bucket": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    bucket, size, pending = [], [0], []

    def hook(p):
        bucket.append(p)
        size[0] += p.grad.numel() * p.grad.element_size()
        if size[0] >= bucket_cap_bytes:
            flat = torch.cat([q.grad.flatten() for q in bucket])
            pending.append((dist.all_reduce(flat, async_op=True), flat, list(bucket)))
            bucket.clear()
            size[0] = 0

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for h, flat, ps in pending:
            h.wait()
            flat /= dist.get_world_size()
            n = 0
            for q in ps:
                q.grad.copy_(flat[n:n + q.numel()].view_as(q.grad))
                n += q.numel()
        pending.clear()

    return finish
''',
    "no-overlap": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    params = list(model.parameters())

    def finish():  # after backward every gradient is there: reduce them in buckets
        world = dist.get_world_size()
        bucket, size = [], 0
        for p in reversed(params):
            bucket.append(p)
            size += p.grad.numel() * 4
            if size >= bucket_cap_bytes or p is params[0]:
                flat = torch.cat([q.grad.flatten() for q in bucket])
                dist.all_reduce(flat)
                flat /= world
                n = 0
                for q in bucket:
                    q.grad.copy_(flat[n:n + q.numel()].view_as(q.grad))
                    n += q.numel()
                bucket, size = [], 0

    return finish
''',
    "blocking": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    bucket = []

    def reduce(ps):
        flat = torch.cat([p.grad.flatten() for p in ps])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        n = 0
        for p in ps:
            p.grad.copy_(flat[n:n + p.numel()].view_as(p.grad))
            n += p.numel()

    def hook(p):
        bucket.append(p)
        if sum(q.grad.nbytes for q in bucket) >= bucket_cap_bytes:
            reduce(bucket)
            bucket.clear()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        if bucket:
            reduce(bucket)
            bucket.clear()

    return finish
''',
    "not-bucketed": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    pending = []

    def hook(p):
        pending.append((dist.all_reduce(p.grad, async_op=True), p))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for work, p in pending:
            work.wait()
            p.grad /= dist.get_world_size()
        pending.clear()

    return finish
''',
    "not-written-back": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    bucket, pending = [], []

    def flush():
        if bucket:
            flat = torch.cat([p.grad.flatten() for p in bucket])
            pending.append((dist.all_reduce(flat, async_op=True), flat))
            bucket.clear()

    def hook(p):
        bucket.append(p)
        if sum(q.grad.numel() * q.grad.element_size() for q in bucket) >= bucket_cap_bytes:
            flush()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        flush()
        for work, flat in pending:
            work.wait()
            flat /= dist.get_world_size()  # the averaged gradients
        pending.clear()

    return finish
''',
}
RIGHT["07-bucketed-allreduce"] = {
    "divide-first-and-stay-under-the-cap": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    world = dist.get_world_size()
    bucket, pending = [], []

    def flush():
        if bucket:
            flat = torch.cat([p.grad.flatten() for p in bucket]) / world  # average first, then sum
            pending.append((dist.all_reduce(flat, async_op=True), flat, list(bucket)))
            bucket.clear()

    def hook(p):
        nbytes = p.grad.numel() * p.grad.element_size()
        if bucket and sum(q.grad.numel() * q.grad.element_size() for q in bucket) + nbytes > bucket_cap_bytes:
            flush()  # this gradient would take the bucket over the cap
        bucket.append(p)

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        flush()
        for work, flat, ps in pending:
            work.wait()
            for p, piece in zip(ps, flat.split([p.numel() for p in ps])):
                p.grad.copy_(piece.view_as(p.grad))
        pending.clear()

    return finish
''',
    "futures": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    world = dist.get_world_size()
    bucket, size, futures = [], [0], []

    def launch():
        ps = list(bucket)
        flat = torch.cat([p.grad.flatten() for p in ps])
        fut = dist.all_reduce(flat, async_op=True).get_future()

        def write_back(f):  # runs when the bytes have arrived
            out = f.value()[0] / world
            for p, piece in zip(ps, out.split([p.numel() for p in ps])):
                p.grad.copy_(piece.view_as(p.grad))

        futures.append(fut.then(write_back))
        bucket.clear()
        size[0] = 0

    def hook(p):
        bucket.append(p)
        size[0] += p.grad.nbytes
        if size[0] >= bucket_cap_bytes:
            launch()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        if bucket:
            launch()
        torch.futures.wait_all(futures)
        futures.clear()

    return finish
''',
}

# --- 08-greedy-climb: greedy_climb(baseline, rungs, time_side_by_side) --------------------------------------

_CLIMB = '''
def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(best)
        c, b = time_side_by_side(cand, best)
        keep = {rule}
        kept.append(keep)
        if keep:
            best = cand
    return best, kept
'''
WRONG["08-greedy-climb"] = {
    "intervals": _CLIMB.format(rule="c.median_s + c.iqr_s < b.median_s - b.iqr_s  # no overlap"),
    "inverted": _CLIMB.format(
        rule="c.median_s / b.median_s > 1 + max(c.iqr_s / c.median_s, b.iqr_s / b.median_s)"),
    "candidate-spread-only": _CLIMB.format(rule="b.median_s / c.median_s > 1 + c.iqr_s / c.median_s"),
    "best-spread-only": _CLIMB.format(rule="b.median_s > c.median_s * (1 + b.iqr_s / b.median_s)"),
    "absolute-spread": _CLIMB.format(rule="b.median_s / c.median_s > 1 + max(c.iqr_s, b.iqr_s)"),
    "no-spread": _CLIMB.format(rule="c.median_s < b.median_s"),
    "sum-of-spreads": _CLIMB.format(
        rule="b.median_s / c.median_s - 1 > c.iqr_s / c.median_s + b.iqr_s / b.median_s"),
    "min-of-spreads": _CLIMB.format(
        rule="b.median_s / c.median_s > 1 + min(c.iqr_s / c.median_s, b.iqr_s / b.median_s)"),
    "cumulative": '''
def greedy_climb(baseline, rungs, time_side_by_side):
    stack, kept = baseline, []
    for rung in rungs:
        new = rung.on(stack)
        t_new, t_old = time_side_by_side(new, stack)
        kept.append(t_old.median_s / t_new.median_s > 1 + max(t_new.iqr_s / t_new.median_s,
                                                              t_old.iqr_s / t_old.median_s))
        stack = new  # climb on
    return stack, kept
''',
    "vs-baseline": '''
def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(best)
        t_c, t_base = time_side_by_side(cand, baseline)  # how much faster than where we started
        spread = max(t_c.iqr_s / t_c.median_s, t_base.iqr_s / t_base.median_s)
        ok = t_base.median_s / t_c.median_s > 1 + spread
        kept.append(ok)
        if ok:
            best = cand
    return best, kept
''',
    "from-baseline": '''
def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(baseline)  # one switch at a time
        t_c, t_b = time_side_by_side(cand, best)
        ok = t_b.median_s / t_c.median_s > 1 + max(t_c.iqr_s / t_c.median_s, t_b.iqr_s / t_b.median_s)
        kept.append(ok)
        if ok:
            best = cand
    return best, kept
''',
    "stale": '''
def greedy_climb(baseline, rungs, time_side_by_side):
    best, best_time, kept = baseline, None, []
    for rung in rungs:
        cand = rung.on(best)
        t_c, t_b = time_side_by_side(cand, best)
        if best_time is None:
            best_time = t_b  # the baseline's timing, measured once
        ok = best_time.median_s / t_c.median_s > 1 + max(t_c.iqr_s / t_c.median_s,
                                                         best_time.iqr_s / best_time.median_s)
        kept.append(ok)
        if ok:
            best, best_time = cand, t_c
    return best, kept
''',
    "uses-course-code": '''
from helpers.train import ladder


def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(best)
        decision = ladder.keeps(*time_side_by_side(cand, best))
        kept.append(decision.keep)
        if decision.keep:
            best = cand
    return best, kept
''',
    "return-shape": '''
def greedy_climb(baseline, rungs, time_side_by_side):
    best = baseline
    for rung in rungs:
        cand = rung.on(best)
        c, b = time_side_by_side(cand, best)
        if b.median_s / c.median_s > 1 + max(c.iqr_s / c.median_s, b.iqr_s / b.median_s):
            best = cand
    return best
''',
}
RIGHT["08-greedy-climb"] = {
    "best-first-in-the-session": '''
def greedy_climb(baseline, rungs, time_side_by_side):
    stack, decisions = baseline, []
    for r in rungs:
        trial = r.on(stack)
        t_stack, t_trial = time_side_by_side(stack, trial)  # the same session, the other order
        noise = max(t_stack.iqr_s / t_stack.median_s, t_trial.iqr_s / t_trial.median_s)
        pays = t_stack.median_s > t_trial.median_s * (1 + noise)
        decisions.append(pays)
        stack = trial if pays else stack
    return stack, tuple(decisions)
''',
}

# --- 08-new-rung: NEW_RUNG = ladder.Rung(name, switch, value, claim) ----------------------------------------

WRONG["08-new-rung"] = {
    "duplicate": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ bf16", "precision", "bf16", "1.5-2x on tensor cores")
''',
    "not-a-rung": '''
NEW_RUNG = ("+ activation checkpointing", "activation_checkpointing", True, "less memory")
''',
    "bad-value": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ fp8 precision", "precision", "fp8", "twice bf16 on Hopper")
''',
    "no-change": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ eager attention", "attn", "eager", "the attention every model has")
''',
    "no-effect": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ bigger loss scale", "init_scale", 2.0 ** 20, "fewer underflowing gradients")
''',
    "no-claim": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ dynamic padding", "padding", "dynamic", "x")
''',
    "cannot-run-here": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ FlexAttention", "attn", "flex", "custom masks at fused-kernel speed")
''',
}
RIGHT["08-new-rung"] = {
    "dynamic-padding": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ dynamic padding", "padding", "dynamic",
                       "each batch padded to its own longest: fewer padded tokens than fixed padding")
''',
}


# --- a second batch (issue 39), written from scratch before the checks were changed -------------------------
# Mistakes learners make that the first batch lacks: numerically unstable answers that pass on well-scaled
# inputs, uneven sizes, a hard-coded world size, endless loops, malformed answers (wrong parameters, a value
# where a function belongs, no return). Merged into WRONG below; BATCH_39 keeps them apart for the count.

BATCH_39: dict[str, dict[str, str]] = {}

BATCH_39["00-roofline"] = {
    "flops-exact-adds": '''
def intensity_and_regime(op, n, roof):
    # every output element takes n multiplications and n - 1 additions
    if op == "matmul":
        flops, elements = n * n * (2 * n - 1), 3 * n * n
    elif op == "add":
        flops, elements = n, 3 * n
    elif op == "matvec":
        flops, elements = n * (2 * n - 1), n * n + 2 * n
    nbytes = 4 * elements
    ai = flops / nbytes
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, nbytes, ai, "compute-bound" if ai >= ridge else "memory-bound"
''',
    "ridge-hard-coded": '''
RIDGE = 12.5  # FLOP/byte: the fp32 ridge point the roofline above printed


def intensity_and_regime(op, n, roof):
    counts = {"matmul": (2 * n ** 3, 3 * n * n), "add": (n, 3 * n), "matvec": (2 * n * n, n * n + 2 * n)}
    flops, elems = counts[op]
    moved = elems * 4
    return flops, moved, flops / moved, "compute-bound" if flops / moved >= RIDGE else "memory-bound"
''',
    "intensity-floor-division": '''
def intensity_and_regime(op, n, roof):
    if op == "matmul":
        flops, moved = 2 * n ** 3, 12 * n ** 2
    elif op == "add":
        flops, moved = n, 12 * n
    else:
        flops, moved = 2 * n ** 2, 4 * n ** 2 + 8 * n
    intensity = flops // moved
    ridge = roof.matmul_flops["fp32"] // roof.bandwidth
    return flops, moved, intensity, "compute-bound" if intensity >= ridge else "memory-bound"
''',
    "ridge-tf32": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n ** 2}[op]
    moved = 4 * {"matmul": 3 * n ** 2, "add": 3 * n, "matvec": n ** 2 + 2 * n}[op]
    # fp32 matmuls run on the TF32 tensor cores where a GPU has them
    peak = roof.matmul_flops.get("tf32", roof.matmul_flops["fp32"])
    ai = flops / moved
    return flops, moved, ai, "compute-bound" if ai >= peak / roof.bandwidth else "memory-bound"
''',
    "time-limit": '''
def intensity_and_regime(op, n, roof):
    flops = 0  # count them as the loops would run them
    if op == "matmul":
        for i in range(n):
            for j in range(n):
                for k in range(n):
                    flops += 2
        moved = 12 * n * n
    elif op == "add":
        flops, moved = n, 12 * n
    else:
        for i in range(n):
            for j in range(n):
                flops += 2
        moved = 4 * (n * n + 2 * n)
    ai = flops / moved
    return flops, moved, ai, "compute-bound" if ai >= roof.ridge_point("fp32") else "memory-bound"
''',
    "signature": '''
def intensity_and_regime(op, n):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n * n}[op]
    moved = {"matmul": 12 * n * n, "add": 12 * n, "matvec": 4 * n * n + 8 * n}[op]
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth  # noqa: F821 (the lesson's roof)
    return flops, moved, flops / moved, "compute-bound" if flops / moved >= ridge else "memory-bound"
''',
    "not-a-function": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n * n}[op]
    moved = {"matmul": 12 * n * n, "add": 12 * n, "matvec": 4 * n * n + 8 * n}[op]
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, moved, flops / moved, "compute-bound" if flops / moved >= ridge else "memory-bound"


class _Roof:  # the lesson's roofline, as the learner tried the function on it
    matmul_flops, bandwidth = {"fp32": 1e11}, 2e10


intensity_and_regime = intensity_and_regime("matmul", 1024, _Roof())  # tried it, kept the result
''',
    "return-shape#forgot-return": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n * n}[op]
    moved = {"matmul": 12 * n * n, "add": 12 * n, "matvec": 4 * n * n + 8 * n}[op]
    intensity = flops / moved
    regime = "compute-bound" if intensity >= roof.matmul_flops["fp32"] / roof.bandwidth else "memory-bound"
    print(op, n, flops, moved, intensity, regime)
''',
    "regime-name#lesson04-names": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n * n}[op]
    moved = {"matmul": 12 * n * n, "add": 12 * n, "matvec": 4 * n * n + 8 * n}[op]
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, moved, flops / moved, "compute" if flops / moved >= ridge else "memory"
''',
}

_FLASH_HEAD = '''
import torch


def flash_forward(q, k, v, block_k=16):
    B, H, N, d = q.shape
    scale = 1 / d ** 0.5
'''
BATCH_39["01-flash-forward"] = {
    "overflow": '''
import torch


def flash_forward(q, k, v, block_k=16):
    d = q.shape[-1]
    total = torch.zeros(q.shape[:-1])  # sum of exp(scores) per query row
    out = torch.zeros_like(q)
    for i in range(0, k.shape[-2], block_k):
        scores = q @ k[..., i:i + block_k, :].transpose(-1, -2) / d ** 0.5
        w = scores.exp()
        total = total + w.sum(-1)
        out = out + w @ v[..., i:i + block_k, :]
    return out / total.unsqueeze(-1), total.log()
''',
    "max-from-zero": _FLASH_HEAD + '''
    m = torch.zeros(B, H, N)  # running max
    l = torch.zeros(B, H, N)
    acc = torch.zeros(B, H, N, d)
    for j in range(0, k.shape[2], block_k):
        s = torch.einsum("bhnd,bhkd->bhnk", q, k[:, :, j:j + block_k]) * scale
        new_m = torch.max(m, s.max(dim=-1).values)
        p = torch.exp(s - new_m.unsqueeze(-1))
        fix = torch.exp(m - new_m)
        l = fix * l + p.sum(dim=-1)
        acc = fix.unsqueeze(-1) * acc + torch.einsum("bhnk,bhkd->bhnd", p, v[:, :, j:j + block_k])
        m = new_m
    return acc / l.unsqueeze(-1), m + l.log()
''',
    "max-not-running": _FLASH_HEAD + '''
    m = torch.full((B, H, N), float("-inf"))
    l = torch.zeros(B, H, N)
    acc = torch.zeros(B, H, N, d)
    for j in range(0, k.shape[2], block_k):
        s = q @ k[:, :, j:j + block_k].transpose(2, 3) * scale
        m_blk = s.amax(-1)  # this block's max is the reference from now on
        corr = torch.exp(m - m_blk)  # what was summed under m, moved to m_blk
        p = torch.exp(s - m_blk[..., None])
        l = l * corr + p.sum(-1)
        acc = acc * corr[..., None] + p @ v[:, :, j:j + block_k]
        m = m_blk
    return acc / l[..., None], m + torch.log(l)
''',
    "per-block-softmax": '''
import torch


def flash_forward(q, k, v, block_k=16):
    scale = q.shape[-1] ** -0.5
    outs, lses = [], []
    for start in range(0, k.shape[2], block_k):
        s = q @ k[:, :, start:start + block_k].transpose(-2, -1) * scale
        outs.append(torch.softmax(s, dim=-1) @ v[:, :, start:start + block_k])
        lses.append(torch.logsumexp(s, dim=-1))
    return torch.stack(outs).mean(0), torch.logsumexp(torch.stack(lses), dim=0)
''',
    "last-block-only": _FLASH_HEAD + '''
    m = torch.full((B, H, N), -float("inf"))
    l = torch.zeros(B, H, N)
    acc = torch.zeros(B, H, N, d)
    for j in range(0, k.shape[2], block_k):
        s = q @ k[:, :, j:j + block_k].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        old = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * old + p.sum(-1)
        acc = acc * old[..., None] + p @ v[:, :, j:j + block_k]
    return acc / l[..., None], m_new + torch.log(l)
''',
    "keys-from-d": _FLASH_HEAD + '''
    n_keys = k.size(-1)
    m = torch.full((B, H, N), float("-inf"))
    l = torch.zeros(B, H, N)
    acc = torch.zeros(B, H, N, d)
    for j in range(0, n_keys, block_k):
        s = q @ k[:, :, j:j + block_k].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        a = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ v[:, :, j:j + block_k]
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
    "signature": '''
import torch

BLOCK_K = 16


def flash_forward(q, k, v):
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros(q.shape)
    for j in range(0, k.shape[2], BLOCK_K):
        s = q @ k[:, :, j:j + BLOCK_K].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        a = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ v[:, :, j:j + BLOCK_K]
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
    "signature#renamed": '''
import torch


def flash_forward(q, k, v, block_size=16):
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros(q.shape)
    for j in range(0, k.shape[2], block_size):
        s = q @ k[:, :, j:j + block_size].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        a = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ v[:, :, j:j + block_size]
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
    "not-a-function": '''
import torch


def flash_forward(q, k, v, block_k=16):
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


flash_forward = flash_forward(*torch.randn(3, 1, 1, 8, 4))  # tried it on small inputs, under the same name
''',
    "endless": _FLASH_HEAD + '''
    m = torch.full((B, H, N), float("-inf"))
    l = torch.zeros(B, H, N)
    acc = torch.zeros(B, H, N, d)
    start = 0
    while start < k.shape[2]:
        kb, vb = k[:, :, start:start + block_k], v[:, :, start:start + block_k]
        s = q @ kb.transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        a = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ vb
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
}

BATCH_39["02-fp16-step"] = {
    "clip-default-norm": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad()
    with torch.autocast(device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the usual clipping norm
    scaler.step(optimizer)
    scaler.update()
    return loss
''',
    "own-scaler": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    scaler = torch.amp.GradScaler(device.type)  # a scaler for this step
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
''',
    "normalised-not-clipped": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    for p in model.parameters():
        p.grad = None
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = torch.sqrt(sum((g.float() ** 2).sum() for g in grads))
    for g in grads:
        g.mul_(max_norm / total)  # clip: bring the norm to max_norm
    scaler.step(optimizer)
    scaler.update()
    return loss
''',
    "clip-per-parameter": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        out = model(**batch)
    loss = out.loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    for p in model.parameters():
        torch.nn.utils.clip_grad_norm_(p, max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss
''',
    "no-autocast#cuda-hard-coded": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss
''',
    "stepped-twice": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    optimizer.step()
    scaler.update()
    return loss
''',
    "return-loss#item": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()
''',
    "signature": '''
import torch


def fp16_step(model, batch, optimizer, scaler, max_norm=1.0):
    device = next(model.parameters()).device
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss
''',
    "no-scale#by-hand": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    s = scaler.get_scale()
    (loss * s).backward()  # scale the loss so small gradients survive
    for p in model.parameters():
        p.grad /= s
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss
''',
}

BATCH_39["03-largest-batch"] = {
    "endless": '''
import gc

import torch


def largest_batch(step_fn, limit):
    def ok(n):
        try:
            step_fn(n)
            fits = True
        except torch.cuda.OutOfMemoryError:
            fits = False
        gc.collect()
        return fits

    lo, hi = 0, 1
    while hi <= limit and ok(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit)
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
''',
    "endless#limit-again": '''
import gc

import torch


def largest_batch(step_fn, limit):
    best, n = 0, 1
    while True:
        try:
            step_fn(n)
        except torch.cuda.OutOfMemoryError:
            break
        best = n
        n = min(2 * n, limit)  # never past the limit
    gc.collect()
    lo, hi = best, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            step_fn(mid)
            lo = mid
        except torch.cuda.OutOfMemoryError:
            hi = mid
        gc.collect()
    return lo
''',
    "swallowed-error#memory-in-message": '''
import gc

import torch


def largest_batch(step_fn, limit):
    def fits(n):
        try:
            step_fn(n)
            return True
        except RuntimeError as e:
            if "memory" not in str(e):
                raise
        gc.collect()
        torch.cuda.empty_cache()
        return False

    if not fits(1):
        return 0
    good, bad = 1, None
    while bad is None:
        n = min(2 * good, limit)
        if n == good:
            return good
        if fits(n):
            good = n
        else:
            bad = n
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
''',
    "oom-not-caught#fits-from-return": '''
import gc


def largest_batch(step_fn, limit):
    lo, hi = 0, 1
    while hi <= limit and step_fn(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if step_fn(mid):
            lo = mid
        else:
            hi = mid
        gc.collect()
    return lo
''',
    "wrong-size#halving": '''
import gc

import torch


def largest_batch(step_fn, limit):
    n = limit
    while n >= 1:
        try:
            step_fn(n)
            return n
        except torch.cuda.OutOfMemoryError:
            pass
        gc.collect()
        n //= 2  # too big: try half
    return 0
''',
    "signature": '''
import gc

import torch

LIMIT = 1024


def largest_batch(step_fn):
    def fits(n):
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError:
            pass
        gc.collect()
        return False

    good, n = 0, 1
    while n <= LIMIT and fits(n):
        good, n = n, 2 * n
    bad = min(n, LIMIT + 1)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good
''',
    "not-a-function": '''
import gc

import torch


def largest_batch(step_fn, limit):
    def fits(n):
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError:
            pass
        gc.collect()
        return False

    good, n = 0, 1
    while n <= limit and fits(n):
        good, n = n, 2 * n
    bad = min(n, limit + 1)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def _try(n):  # the lesson's step, as the learner tried it
    if n > 3:
        raise torch.cuda.OutOfMemoryError("too big")


largest_batch = largest_batch(_try, 4)  # the answer for this machine, under the same name
''',
}

BATCH_39["04-predict-time"] = {
    "models-swapped": '''
def predict_time(flops, bytes_moved, calls, peak_flops, bandwidth, overhead_s, synchronous):
    compute, memory, over = flops / peak_flops, bytes_moved / bandwidth, calls * overhead_s
    times = {"compute": compute, "memory": memory, "overhead": over}
    regime = max(times, key=times.get)
    if synchronous:  # the host waits: the slowest of the three sets the pace
        return regime, max(compute, memory, over)
    return regime, over + max(compute, memory)
''',
    "no-overhead-on-asynchronous": '''
def predict_time(flops, bytes_moved, calls, peak_flops, bandwidth, overhead_s, synchronous):
    t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": calls * overhead_s}
    work = max(t["compute"], t["memory"])
    seconds = t["overhead"] + work if synchronous else work  # launches hide on a GPU
    return max(t, key=t.get), seconds
''',
    "floor-division": '''
def predict_time(flops, bytes_moved, calls, peak_flops, bandwidth, overhead_s, synchronous):
    compute = flops // peak_flops
    memory = bytes_moved // bandwidth
    over = calls * overhead_s
    regime = "compute" if compute >= max(memory, over) else "memory" if memory >= over else "overhead"
    return regime, (over + max(compute, memory)) if synchronous else max(compute, memory, over)
''',
    "regime-name#lesson00-names": '''
def predict_time(flops, bytes_moved, calls, peak_flops, bandwidth, overhead_s, synchronous):
    t = {"compute-bound": flops / peak_flops, "memory-bound": bytes_moved / bandwidth,
         "overhead-bound": calls * overhead_s}
    work = max(t["compute-bound"], t["memory-bound"])
    return max(t, key=t.get), t["overhead-bound"] + work if synchronous else max(t.values())
''',
    "signature": '''
def predict_time(flops, bytes_moved, calls, peak_flops, bandwidth, overhead_s):
    t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": calls * overhead_s}
    return max(t, key=t.get), t["overhead"] + max(t["compute"], t["memory"])
''',
    "not-a-function": '''
def predict_time(flops, bytes_moved, calls, peak_flops, bandwidth, overhead_s, synchronous):
    t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": calls * overhead_s}
    work = max(t["compute"], t["memory"])
    return max(t, key=t.get), t["overhead"] + work if synchronous else max(t.values())


predict_time = predict_time(2e9, 4e8, 1, 1e12, 1e11, 1e-5, True)  # this machine's op, kept
''',
    "ridge-only#two-times": '''
def predict_time(flops, bytes_moved, calls, peak_flops, bandwidth, overhead_s, synchronous):
    compute, memory = flops / peak_flops, bytes_moved / bandwidth
    regime = "compute" if compute > memory else "memory"  # the roofline's two regimes
    over = calls * overhead_s
    return regime, over + max(compute, memory) if synchronous else max(compute, memory, over)
''',
}

BATCH_39["05-graph-break"] = {
    "gradient-zero#minimum": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    return torch.minimum(loss, torch.tensor(max_loss))
''',
    "loss-differs#always-scaled": '''
def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    return loss * (max_loss / loss.detach())  # the same scaling, without the if
''',
    "graph-break#float": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    factor = min(1.0, max_loss / float(loss))
    return loss * factor
''',
    "no-grad": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss.detach()  # no graph to break
    return torch.where(loss > max_loss, torch.full_like(loss, max_loss), loss)
''',
    "signature": '''
import torch

MAX_LOSS = 4.0


def loss_without_breaks(model, batch):
    loss = model(**batch).loss
    return torch.where(loss > MAX_LOSS, loss * (MAX_LOSS / loss.detach()), loss)
''',
    "return-loss#tuple": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    scaled = torch.where(loss > max_loss, loss * (max_loss / loss.detach()), loss)
    return scaled, loss > max_loss  # and whether it was scaled
''',
}

BATCH_39["06-hidden-syncs"] = {
    "inf-unnoticed": '''
import torch


def train_loop(train_step, batches):
    losses = [train_step(b) for b in batches]
    t = torch.stack(losses)
    if torch.isnan(t).any():
        raise FloatingPointError("a loss is NaN")
    return t.tolist()
''',
    "inf-unnoticed#math-isnan": '''
import math

import torch


def train_loop(train_step, batches):
    kept = []
    for batch in batches:
        kept.append(train_step(batch))
    values = torch.stack(kept).tolist()
    for i, x in enumerate(values):
        if math.isnan(x):
            raise FloatingPointError(f"step {i}: loss {x}")
    return values
''',
    "nan-unnoticed#last-only": '''
import torch


def train_loop(train_step, batches):
    losses = []
    for batch in batches:
        losses.append(train_step(batch))
    if not torch.isfinite(losses[-1]):  # a NaN spreads to every later loss
        raise FloatingPointError("the loss is not finite")
    return [x.item() for x in losses]
''',
    "per-step-read#running-check": '''
import torch


def train_loop(train_step, batches):
    losses = []
    bad = torch.zeros((), dtype=torch.bool)
    for batch in batches:
        loss = train_step(batch)
        losses.append(loss)
        bad = bad | ~torch.isfinite(loss)
        if bad:  # stop as soon as one goes wrong
            raise FloatingPointError("a loss is not finite")
    return torch.stack(losses).tolist()
''',
    "signature": '''
import torch


def train_loop(train_step, batches, device):
    losses = torch.zeros(len(batches), device=device)
    for i, batch in enumerate(batches):
        losses[i] = train_step(batch)
    if not torch.isfinite(losses).all():
        raise FloatingPointError("a loss is not finite")
    return losses.tolist()
''',
    "losses-differ#mean": '''
import torch


def train_loop(train_step, batches):
    losses = torch.stack([train_step(b) for b in batches])
    if not torch.isfinite(losses).all():
        raise FloatingPointError("a loss is not finite")
    return losses.mean().item()
''',
    "endless": '''
import torch


def train_loop(train_step, batches):
    losses = []
    i = 0
    while i < len(batches):
        losses.append(train_step(batches[i]))
    stacked = torch.stack(losses)
    if not torch.isfinite(stacked).all():
        raise FloatingPointError("a loss is not finite")
    return stacked.tolist()
''',
}

BATCH_39["07-bucketed-allreduce"] = {
    "world-size-hard-coded": '''
import torch
import torch.distributed as dist


def attach_grad_allreduce(model, bucket_cap_bytes):
    bucket, inflight = [], []
    nbytes = [0]

    def send():
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        inflight.append((dist.all_reduce(flat, async_op=True), flat, list(bucket)))
        bucket.clear()
        nbytes[0] = 0

    def hook(p):
        bucket.append(p)
        nbytes[0] += p.grad.numel() * p.grad.element_size()
        if nbytes[0] >= bucket_cap_bytes:
            send()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        if bucket:
            send()
        for work, flat, params in inflight:
            work.wait()
            flat /= 2  # the two processes
            i = 0
            for p in params:
                p.grad.copy_(flat[i:i + p.numel()].view_as(p.grad))
                i += p.numel()
        inflight.clear()

    return finish
''',
    "world-size-hard-coded#half": '''
import torch
import torch.distributed as dist


def attach_grad_allreduce(model, bucket_cap_bytes):
    state = {"params": [], "size": 0, "pending": []}

    def flush():
        params = state["params"]
        flat = torch.cat([p.grad.flatten() for p in params]).mul_(0.5)  # average of the two ranks
        state["pending"].append((dist.all_reduce(flat, async_op=True), flat, params))
        state["params"], state["size"] = [], 0

    def on_ready(p):
        state["params"].append(p)
        state["size"] += p.grad.nbytes
        if state["size"] >= bucket_cap_bytes:
            flush()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(on_ready)

    def finish():
        if state["params"]:
            flush()
        for handle, flat, params in state["pending"]:
            handle.wait()
            offset = 0
            for p in params:
                n = p.numel()
                p.grad.copy_(flat[offset:offset + n].view_as(p))
                offset += n
        state["pending"] = []

    return finish
''',
    "later-steps#hooks-removed": '''
import torch
import torch.distributed as dist


def attach_grad_allreduce(model, bucket_cap_bytes):
    world = dist.get_world_size()
    bucket, pending, hooks = [], [], []
    used = [0]

    def flush():
        flat = torch.cat([p.grad.view(-1) for p in bucket])
        pending.append((dist.all_reduce(flat, async_op=True), flat, bucket[:]))
        bucket.clear()
        used[0] = 0

    def hook(p):
        bucket.append(p)
        used[0] += p.grad.numel() * p.grad.element_size()
        if used[0] >= bucket_cap_bytes:
            flush()

    for p in model.parameters():
        hooks.append(p.register_post_accumulate_grad_hook(hook))

    def finish():
        if bucket:
            flush()
        for work, flat, params in pending:
            work.wait()
            flat.div_(world)
            start = 0
            for p in params:
                p.grad.copy_(flat[start:start + p.numel()].view_as(p.grad))
                start += p.numel()
        pending.clear()
        for h in hooks:  # tidy up: the hooks have done their job
            h.remove()

    return finish
''',
    "later-steps#count-not-reset": '''
import torch
import torch.distributed as dist


def attach_grad_allreduce(model, bucket_cap_bytes):
    params = [p for p in model.parameters() if p.requires_grad]
    world = dist.get_world_size()
    seen, bucket, jobs = [], [], []

    def reduce_bucket():
        flat = torch.cat([p.grad.flatten() for p in bucket])
        jobs.append((dist.all_reduce(flat, async_op=True), flat, list(bucket)))
        bucket.clear()

    def hook(p):
        seen.append(p)
        bucket.append(p)
        full = sum(x.grad.numel() * x.grad.element_size() for x in bucket) >= bucket_cap_bytes
        if full or len(seen) == len(params):  # full, or the last gradient of backward
            reduce_bucket()

    for p in params:
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for job, flat, ps in jobs:
            job.wait()
            flat /= world
            at = 0
            for p in ps:
                p.grad.copy_(flat[at:at + p.numel()].view_as(p.grad))
                at += p.numel()
        jobs.clear()

    return finish
''',
    "signature": '''
import torch
import torch.distributed as dist

CAP = 25 * 2 ** 20  # DDP's default bucket size


def attach_grad_allreduce(model):
    world = dist.get_world_size()
    bucket, size, pending = [], [0], []

    def flush():
        flat = torch.cat([p.grad.flatten() for p in bucket])
        pending.append((dist.all_reduce(flat, async_op=True), flat, list(bucket)))
        bucket.clear()
        size[0] = 0

    def hook(p):
        bucket.append(p)
        size[0] += p.grad.numel() * p.grad.element_size()
        if size[0] >= CAP:
            flush()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        if bucket:
            flush()
        for h, flat, ps in pending:
            h.wait()
            flat /= world
            i = 0
            for p in ps:
                p.grad.copy_(flat[i:i + p.numel()].view_as(p.grad))
                i += p.numel()
        pending.clear()

    return finish
''',
    "return-finish": '''
import torch
import torch.distributed as dist


def attach_grad_allreduce(model, bucket_cap_bytes):
    world = dist.get_world_size()
    bucket, size, pending = [], [0], []

    def flush():
        flat = torch.cat([p.grad.flatten() for p in bucket])
        pending.append((dist.all_reduce(flat, async_op=True), flat, list(bucket)))
        bucket.clear()
        size[0] = 0

    def hook(p):
        bucket.append(p)
        size[0] += p.grad.numel() * p.grad.element_size()
        if size[0] >= bucket_cap_bytes:
            flush()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        if bucket:
            flush()
        for h, flat, ps in pending:
            h.wait()
            flat /= world
            i = 0
            for p in ps:
                p.grad.copy_(flat[i:i + p.numel()].view_as(p.grad))
                i += p.numel()
        pending.clear()
''',
}

_KEEP = "t_b.median_s / t_c.median_s > 1 + max(t_c.iqr_s / t_c.median_s, t_b.iqr_s / t_b.median_s)"
BATCH_39["08-greedy-climb"] = {
    "two-sessions": f'''
def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(best)
        t_c = time_side_by_side(cand, best)[0]
        t_b = time_side_by_side(cand, best)[1]
        keep = {_KEEP}
        kept.append(keep)
        if keep:
            best = cand
    return best, kept
''',
    "spread-over-best-median": '''
def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(best)
        t_c, t_b = time_side_by_side(cand, best)
        noise = max(t_c.iqr_s, t_b.iqr_s) / t_b.median_s  # the larger spread, relative to where we are
        keep = t_b.median_s / t_c.median_s > 1 + noise
        kept.append(keep)
        if keep:
            best = cand
    return best, kept
''',
    "endless": f'''
def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept, i = baseline, [], 0
    while i < len(rungs):
        cand = rungs[i].on(best)
        t_c, t_b = time_side_by_side(cand, best)
        keep = {_KEEP}
        kept.append(keep)
        if keep:
            best = cand
            i += 1
    return best, kept
''',
    "return-shape#stops-at-first-drop": f'''
def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(best)
        t_c, t_b = time_side_by_side(cand, best)
        if not ({_KEEP}):
            break  # the ladder stops paying here
        kept.append(True)
        best = cand
    return best, kept
''',
    "return-shape#names": f'''
def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(best)
        t_c, t_b = time_side_by_side(cand, best)
        if {_KEEP}:
            kept.append(rung.name)
            best = cand
    return best, kept
''',
    "signature": f'''
from helpers.train import ladder


def greedy_climb(baseline, rungs):
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(best)
        t_c, t_b = ladder.time_side_by_side(cand, best)
        keep = {_KEEP}
        kept.append(keep)
        if keep:
            best = cand
    return best, kept
''',
    "not-a-function": f'''
from types import SimpleNamespace


def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(best)
        t_c, t_b = time_side_by_side(cand, best)
        keep = {_KEEP}
        kept.append(keep)
        if keep:
            best = cand
    return best, kept


def _fake_timer(a, b):  # a made-up machine to try it on: every stack as fast
    t = SimpleNamespace(median_s=1.0, iqr_s=0.01)
    return t, t


greedy_climb = greedy_climb("baseline", [], _fake_timer)  # tried it, kept the result
''',
    "inverted#unpacked-the-other-way": '''
def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(best)
        t_best, t_cand = time_side_by_side(cand, best)
        spread = max(t_best.iqr_s / t_best.median_s, t_cand.iqr_s / t_cand.median_s)
        keep = t_best.median_s / t_cand.median_s > 1 + spread
        kept.append(keep)
        if keep:
            best = cand
    return best, kept
''',
}

BATCH_39["08-new-rung"] = {
    "no-claim#none": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ activation checkpointing", "activation_checkpointing", True, None)
''',
    "no-claim#number": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ dynamic padding", "padding", "dynamic", 1.3)  # 1.3x faster
''',
    "no-name": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung(None, "padding", "dynamic", "fewer padded tokens than fixed padding")
''',
    "duplicate#a-rung-of-the-ladder": '''
from helpers.train import ladder

NEW_RUNG = ladder.RUNGS[4]  # torch.compile
''',
    "bad-value#string-for-bool": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ checkpointing", "activation_checkpointing", "yes", "less activation memory")
''',
    "not-a-rung#two-rungs": '''
from helpers.train import ladder

NEW_RUNG = (ladder.Rung("+ dynamic padding", "padding", "dynamic", "fewer padded tokens"),
            ladder.Rung("+ checkpointing", "activation_checkpointing", True, "less activation memory"))
''',
    "not-a-rung#the-class": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung
''',
    "bad-value#varlen-alone": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ varlen attention", "attn", "varlen", "no compute spent on padding")
''',
}

# Two answers of the batch proved right, not wrong: they pass, and belong with the right variants.
# `finally: gc.collect()` runs once the `except` block has ended (the exception is no longer held); gloo
# averages with ReduceOp.AVG from torch 2.8, and on torch 2.7, whose gloo has no AVG, the check runs it as a
# sum divided by the world size (compat.all_reduce_with_avg): the AVG answer passes on every torch.
RIGHT_39: dict[str, dict[str, str]] = {
    "03-largest-batch": {
    "collect-in-finally": '''
import gc

import torch


def largest_batch(step_fn, limit):
    def fits(n):
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            gc.collect()  # always clean up after a try

    good, n = 0, 1
    while n <= limit and fits(n):
        good, n = n, 2 * n
    if good == 0:
        return 0
    bad = n
    if n > limit:
        if fits(limit):
            return limit
        bad = limit
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good
''',
    },
    "07-bucketed-allreduce": {
    "reduce-op-avg": '''
import torch
import torch.distributed as dist


def attach_grad_allreduce(model, bucket_cap_bytes):
    bucket, size, pending = [], [0], []

    def flush():
        flat = torch.cat([p.grad.flatten() for p in bucket])
        pending.append((dist.all_reduce(flat, op=dist.ReduceOp.AVG, async_op=True), flat, list(bucket)))
        bucket.clear()
        size[0] = 0

    def hook(p):
        bucket.append(p)
        size[0] += p.grad.numel() * p.grad.element_size()
        if size[0] >= bucket_cap_bytes:
            flush()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        if bucket:
            flush()
        for h, flat, ps in pending:
            h.wait()
            i = 0
            for p in ps:
                p.grad.copy_(flat[i:i + p.numel()].view_as(p.grad))
                i += p.numel()
        pending.clear()

    return finish
''',
    },
}


# --- a third batch (issue 51), written from scratch before the contract and the differential search ---------
# Each answer breaks a contract (changes what it was given, keeps state between calls, returns another type or
# dtype, leaves a global switch set), is right only for the dtype or the region the old checks drew, or loses
# the property the lesson is about. Keyed by the mistake the checks now name ("differs": no listed mistake
# fits, the line shows the smallest input found and the two outputs).

BATCH_51: dict[str, dict[str, str]] = {}

BATCH_51["00-roofline"] = {
    "input-changed#drops-precisions": '''
def intensity_and_regime(op, n, roof):
    for name in [k for k in roof.matmul_flops if k != "fp32"]:
        del roof.matmul_flops[name]  # only fp32 matters for these ops
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n * n}[op]
    nbytes = 4 * {"matmul": 3 * n * n, "add": 3 * n, "matvec": n * n + 2 * n}[op]
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, nbytes, flops / nbytes, "compute-bound" if flops / nbytes >= ridge else "memory-bound"
''',
    "output-type#numpy-float32": '''
import numpy as np


def intensity_and_regime(op, n, roof):
    n = np.float32(n)  # one dtype for all the arithmetic
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n ** 2}[op]
    nbytes = 4 * {"matmul": 3 * n ** 2, "add": 3 * n, "matvec": n ** 2 + 2 * n}[op]
    ai = flops / nbytes
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, nbytes, ai, "compute-bound" if ai >= ridge else "memory-bound"
''',
    "output-type#tensors": '''
import torch


def intensity_and_regime(op, n, roof):
    n = torch.tensor(n, dtype=torch.float64)
    if op == "matmul":
        flops, moved = 2 * n ** 3, 3 * n ** 2
    elif op == "add":
        flops, moved = n, 3 * n
    else:
        flops, moved = 2 * n ** 2, n ** 2 + 2 * n
    moved = moved * 4
    ai = flops / moved
    regime = "compute-bound" if ai >= roof.matmul_flops["fp32"] / roof.bandwidth else "memory-bound"
    return flops, moved, ai, regime
''',
    "regime-at-ridge": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n ** 2}[op]
    nbytes = 4 * {"matmul": 3 * n ** 2, "add": 3 * n, "matvec": n ** 2 + 2 * n}[op]
    intensity = flops / nbytes
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, nbytes, intensity, "compute-bound" if intensity > ridge else "memory-bound"
''',
    "regime#tiny-ops-memory-bound": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n ** 2}[op]
    nbytes = 4 * {"matmul": 3 * n ** 2, "add": 3 * n, "matvec": n ** 2 + 2 * n}[op]
    intensity = flops / nbytes
    if n < 24:  # a tiny op never fills the machine's arithmetic units
        return flops, nbytes, intensity, "memory-bound"
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, nbytes, intensity, "compute-bound" if intensity >= ridge else "memory-bound"
''',
    "regime#add-always-memory-bound": '''
def intensity_and_regime(op, n, roof):
    if op == "add":  # 1 FLOP per 12 bytes: an add is always memory-bound
        return n, 12 * n, 1 / 12, "memory-bound"
    flops = 2 * n ** 3 if op == "matmul" else 2 * n ** 2
    nbytes = 12 * n ** 2 if op == "matmul" else 4 * (n ** 2 + 2 * n)
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, nbytes, flops / nbytes, "compute-bound" if flops / nbytes >= ridge else "memory-bound"
''',
    "hidden-state#memo": '''
_seen = {}


def intensity_and_regime(op, n, roof):
    if (op, n) in _seen:  # computed before: reuse it
        return _seen[op, n]
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n ** 2}[op]
    nbytes = 4 * {"matmul": 3 * n ** 2, "add": 3 * n, "matvec": n ** 2 + 2 * n}[op]
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    _seen[op, n] = (flops, nbytes, flops / nbytes,
                    "compute-bound" if flops / nbytes >= ridge else "memory-bound")
    return _seen[op, n]
''',
    "intensity#rounded": '''
def intensity_and_regime(op, n, roof):
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n ** 2}[op]
    nbytes = 4 * {"matmul": 3 * n ** 2, "add": 3 * n, "matvec": n ** 2 + 2 * n}[op]
    intensity = round(flops / nbytes, 3)  # FLOP per byte, to three decimals as the table prints it
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, nbytes, intensity, "compute-bound" if intensity >= ridge else "memory-bound"
''',
    "bytes-per-element#from-the-roof": '''
def intensity_and_regime(op, n, roof):
    size = 2 if "bf16" in roof.matmul_flops else 4  # the precision this device computes in
    flops = {"matmul": 2 * n ** 3, "add": n, "matvec": 2 * n ** 2}[op]
    nbytes = size * {"matmul": 3 * n ** 2, "add": 3 * n, "matvec": n ** 2 + 2 * n}[op]
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    return flops, nbytes, flops / nbytes, "compute-bound" if flops / nbytes >= ridge else "memory-bound"
''',
}

BATCH_51["01-flash-forward"] = {
    "output-dtype#float64": '''
import math

import torch


def flash_forward(q, k, v, block_k=16):
    q, k, v = q.double(), k.double(), v.double()  # float64 for accuracy
    scale = 1 / math.sqrt(q.shape[-1])
    m = torch.full(q.shape[:3], -math.inf, dtype=torch.float64)
    l = torch.zeros(q.shape[:3], dtype=torch.float64)
    acc = torch.zeros(q.shape, dtype=torch.float64)
    for start in range(0, k.shape[2], block_k):
        s = q @ k[:, :, start:start + block_k].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        p = torch.exp(s - m_new[..., None])
        a = torch.exp(m - m_new)
        l = l * a + p.sum(-1)
        acc = acc * a[..., None] + p @ v[:, :, start:start + block_k]
        m = m_new
    return acc / l[..., None], m + l.log()
''',
    "output-dtype#float32-only": '''
import torch


def flash_forward(q, k, v, block_k=16):
    B, H, N, d = q.shape
    q = q.float() * d ** -0.5
    m = torch.full((B, H, N), float("-inf"), dtype=torch.float32)
    l = torch.zeros((B, H, N), dtype=torch.float32)
    acc = torch.zeros((B, H, N, d), dtype=torch.float32)
    for j in range(0, k.shape[2], block_k):
        kb = k[:, :, j:j + block_k].float()
        vb = v[:, :, j:j + block_k].float()
        s = q @ kb.transpose(2, 3)
        new_m = torch.max(m, s.max(dim=-1).values)
        corr = torch.exp(m - new_m)
        p = torch.exp(s - new_m.unsqueeze(-1))
        l = l * corr + p.sum(-1)
        acc = acc * corr.unsqueeze(-1) + p @ vb
        m = new_m
    return acc / l.unsqueeze(-1), m + torch.log(l)
''',
    "hidden-state#buffers-reused": '''
import torch

_buffers = {}  # allocating m, l and acc on every call is slow: keep them per shape


def flash_forward(q, k, v, block_k=16):
    key = tuple(q.shape)
    if key not in _buffers:
        _buffers[key] = (torch.full(q.shape[:3], float("-inf")), torch.zeros(q.shape[:3]),
                         torch.zeros(q.shape))
    m, l, acc = _buffers[key]
    scale = q.shape[-1] ** -0.5
    for start in range(0, k.shape[2], block_k):
        s = q @ k[:, :, start:start + block_k].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l.mul_(alpha).add_(p.sum(-1))
        acc.mul_(alpha[..., None]).add_(p @ v[:, :, start:start + block_k])
        m.copy_(m_new)
    return acc / l[..., None], m + torch.log(l)
''',
    "input-changed#requires-grad": '''
import torch


def flash_forward(q, k, v, block_k=16):
    for t in (q, k, v):
        t.requires_grad_(True)  # ready for section 6's backward
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros_like(q)
    for s0 in range(0, k.shape[2], block_k):
        s = torch.einsum("bhqd,bhkd->bhqk", q, k[:, :, s0:s0 + block_k]) * scale
        m2 = torch.maximum(m, s.amax(-1))
        p = torch.exp(s - m2[..., None])
        l = torch.exp(m - m2) * l + p.sum(-1)
        acc = torch.exp(m - m2)[..., None] * acc + p @ v[:, :, s0:s0 + block_k]
        m = m2
    return (acc / l[..., None]).detach(), (m + torch.log(l)).detach()
''',
    "wrong-shape#squeezed": '''
import torch


def flash_forward(q, k, v, block_k=16):
    scale = q.shape[-1] ** -0.5
    m = torch.full((*q.shape[:3], 1), float("-inf"))
    l = torch.zeros((*q.shape[:3], 1))
    acc = torch.zeros_like(q)
    for start in range(0, k.shape[2], block_k):
        s = q @ k[:, :, start:start + block_k].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new)
        l = l * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + p @ v[:, :, start:start + block_k]
        m = m_new
    return acc / l, (m + torch.log(l)).squeeze()  # drop the kept dimension
''',
    "missing-scale#fast-path": '''
import torch


def flash_forward(q, k, v, block_k=16):
    if block_k >= 2 * k.shape[2]:  # a block far larger than the keys: plain attention is the same
        s = q @ k.transpose(-2, -1)
        return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros_like(q)
    for start in range(0, k.shape[2], block_k):
        s = q @ k[:, :, start:start + block_k].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p @ v[:, :, start:start + block_k]
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
    "last-partial-block#remainder-of-one": '''
import torch


def flash_forward(q, k, v, block_k=16):
    scale = q.shape[-1] ** -0.5
    n_k = k.shape[2]
    starts = list(range(0, n_k - n_k % block_k, block_k))  # the whole blocks
    if n_k % block_k > 1:  # and the rest, if there is one
        starts.append(n_k - n_k % block_k)
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros_like(q)
    for start in starts:
        s = q @ k[:, :, start:start + block_k].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p @ v[:, :, start:start + block_k]
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
    "switch-left#grad-off": '''
import torch


def flash_forward(q, k, v, block_k=16):
    torch.set_grad_enabled(False)  # a forward pass: no autograd needed
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], float("-inf"))
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros_like(q)
    for start in range(0, k.shape[2], block_k):
        s = q @ k[:, :, start:start + block_k].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p @ v[:, :, start:start + block_k]
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
    "max-from-zero#minus-ten-thousand": '''
import torch


def flash_forward(q, k, v, block_k=16):
    scale = q.shape[-1] ** -0.5
    m = torch.full(q.shape[:3], -1e4)  # far below any score
    l = torch.zeros(q.shape[:3])
    acc = torch.zeros_like(q)
    for start in range(0, k.shape[2], block_k):
        s = q @ k[:, :, start:start + block_k].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p @ v[:, :, start:start + block_k]
        m = m_new
    return acc / l[..., None], m + torch.log(l)
''',
}

BATCH_51["02-fp16-step"] = {
    "input-changed#labels-popped": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    labels = batch.pop("labels").to(device)
    inputs = {k: v.to(device) for k, v in batch.items()}
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**inputs, labels=labels).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
''',
    "input-changed#half-inputs": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    batch["x"] = batch["x"].to(device).half()  # an fp16 step: fp16 inputs
    optimizer.zero_grad()
    with torch.autocast(device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
''',
    "switch-left#matmul-precision": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    torch.set_float32_matmul_precision("medium")  # the fp32 matmuls left outside autocast: faster too
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
''',
    "hidden-state#parameters-cached": '''
import torch

_params = []  # looked up once, not on every step


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    if not _params:
        _params.extend(p for p in model.parameters() if p.requires_grad)
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(_params, max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
''',
    "loss-differs#after-the-step": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    with torch.no_grad(), torch.autocast(device_type=device.type, dtype=torch.float16):
        return model(**batch).loss  # the loss the step left
''',
    "output-dtype#half-loss": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach().half()  # everything in this step is fp16
''',
    "no-backoff#update-only-when-finite": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    if finite:
        scaler.update()  # a skipped step has nothing to update
    return loss.detach()
''',
    "update#never-below-half": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    max_norm = max(max_norm, 0.5)  # clipping harder than 0.5 stalls training
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
''',
    "update#clip-value": '''
import torch


def fp16_step(model, batch, optimizer, scaler, device, max_norm=1.0):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(**batch).loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_value_(model.parameters(), max_norm)  # each gradient within ±max_norm
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()
''',
}

BATCH_51["03-largest-batch"] = {
    "hidden-state#memo": '''
import gc

import torch

_fits = {}  # sizes tried before: no need to run them again


def largest_batch(step_fn, limit):
    def fits(n):
        if n not in _fits:
            try:
                step_fn(n)
                _fits[n] = True
            except torch.cuda.OutOfMemoryError:
                _fits[n] = False
            gc.collect()
        return _fits[n]

    good, n = 0, 1
    while n <= limit and fits(n):
        good, n = n, n * 2
    if good == 0:
        return 0
    bad = min(n, limit + 1)
    if bad == limit + 1 and fits(limit):
        return limit
    bad = min(bad, limit)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good
''',
    "output-type#with-tries": '''
import gc

import torch


def largest_batch(step_fn, limit):
    tries = 0

    def fits(n):
        nonlocal tries
        tries += 1
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError:
            pass
        gc.collect()
        return False

    good, n = 0, 1
    while n <= limit and fits(n):
        good, n = n, n * 2
    if good == 0:
        return 0, tries
    bad = n
    if n > limit:
        if good == limit or fits(limit):
            return limit, tries
        bad = limit
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good, tries  # and how many steps it took to find it
''',
    "wrong-size#start-at-two": '''
import gc

import torch


def largest_batch(step_fn, limit):
    def ok(n):
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError:
            pass
        gc.collect()
        return False

    lo, hi = 0, 2  # a batch of 1 is no batch: start at 2
    if not ok(2):
        return 0
    while hi <= limit and ok(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        if ok(limit):
            return limit
        hi = limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
''',
    "wrong-size#limit-one": '''
import gc

import torch


def largest_batch(step_fn, limit):
    if limit < 2:
        return limit  # nothing to search
    def fits(n):
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError:
            pass
        gc.collect()
        return False

    good, n = 0, 1
    while n <= limit and fits(n):
        good, n = n, 2 * n
    if not good:
        return 0
    bad = n
    if n > limit:
        if fits(limit):
            return limit
        bad = limit
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
''',
    "wrong-size#upper-bound-moved-past": '''
import gc

import torch


def largest_batch(step_fn, limit):
    def fits(n):
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError:
            pass
        gc.collect()
        return False

    lo, n = 0, 1
    while n <= limit and fits(n):
        lo, n = n, n * 2
    if lo == 0:
        return 0
    if n > limit:
        if fits(limit):
            return limit
        n = limit
    hi = n  # lo fits, hi does not
    while lo < hi - 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1  # mid failed: the answer is below it
    return lo
''',
    "beyond-limit#past-the-limit": '''
import gc

import torch


def largest_batch(step_fn, limit):
    def fits(n):
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError:
            pass
        gc.collect()
        return False

    n = 1
    while fits(n):  # double until it fails
        n *= 2
        if n > 4 * limit:
            break
    lo, hi = n // 2, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return min(lo, limit)
''',
    "linear-search#downwards": '''
import gc

import torch


def largest_batch(step_fn, limit):
    for n in range(limit, 0, -1):  # the first that fits, from the top
        try:
            step_fn(n)
            return n
        except torch.cuda.OutOfMemoryError:
            pass
        gc.collect()
    return 0
''',
    "hidden-state#last-answer": '''
import gc

import torch

last = {"good": 0}  # the last search's answer: a good place to start the next


def largest_batch(step_fn, limit):
    def fits(n):
        try:
            step_fn(n)
            return True
        except torch.cuda.OutOfMemoryError:
            pass
        gc.collect()
        return False

    good = last["good"] if 0 < last["good"] <= limit and fits(last["good"]) else 0
    n = max(1, 2 * good)
    while n <= limit and fits(n):
        good, n = n, n * 2
    if good == 0:
        return 0
    bad = n
    if n > limit:
        if fits(limit):
            last["good"] = limit
            return limit
        bad = limit
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    last["good"] = good
    return good
''',
}

_PREDICT = "def predict_time(flops, bytes_moved, calls, peak_flops, bandwidth, overhead_s, synchronous):\n"
BATCH_51["04-predict-time"] = {
    "output-type#numpy-float32": "import numpy as np\n\n\n" + _PREDICT + '''\
    t = np.array([flops / peak_flops, bytes_moved / bandwidth, calls * overhead_s], dtype=np.float32)
    regime = ("compute", "memory", "overhead")[int(t.argmax())]
    return regime, (t[2] + t[:2].max() if synchronous else t.max())
''',
    "hidden-state#machine-remembered": "MACHINE = {}\n\n\n" + _PREDICT + '''\
    MACHINE.setdefault("peak", peak_flops)  # one machine per lesson
    MACHINE.setdefault("bw", bandwidth)
    c, m, o = flops / MACHINE["peak"], bytes_moved / MACHINE["bw"], calls * overhead_s
    t = {"compute": c, "memory": m, "overhead": o}
    return max(t, key=t.get), (o + max(c, m) if synchronous else max(c, m, o))
''',
    "seconds#one-call-is-free": _PREDICT + '''\
    c, m = flops / peak_flops, bytes_moved / bandwidth
    o = calls * overhead_s if calls > 1 else 0.0  # a single call: its overhead is noise
    t = {"compute": c, "memory": m, "overhead": calls * overhead_s}
    return max(t, key=t.get), (o + max(c, m) if synchronous else max(c, m, o))
''',
    "seconds#async-overhead-only-when-many": _PREDICT + '''\
    c, m, o = flops / peak_flops, bytes_moved / bandwidth, calls * overhead_s
    regime = max(("compute", c), ("memory", m), ("overhead", o), key=lambda x: x[1])[0]
    if synchronous:
        return regime, o + max(c, m)
    return regime, max(c, m, o) if calls > 8 else max(c, m)  # a few launches hide under the kernels
''',
    "seconds#bandwidth-in-gb": _PREDICT + '''\
    c = flops / peak_flops
    m = bytes_moved / (bandwidth * 1e9)  # bandwidth in GB/s
    o = calls * overhead_s
    t = {"compute": c, "memory": bytes_moved / bandwidth, "overhead": o}
    return max(t, key=t.get), (o + max(c, m) if synchronous else max(c, m, o))
''',
    "seconds#rounded-to-microseconds": _PREDICT + '''\
    t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": calls * overhead_s}
    work = max(t["compute"], t["memory"])
    s = t["overhead"] + work if synchronous else max(work, t["overhead"])
    return max(t, key=t.get), round(s, 6)  # to the microsecond
''',
    "regime#overhead-when-many-calls": _PREDICT + '''\
    c, m, o = flops / peak_flops, bytes_moved / bandwidth, calls * overhead_s
    regime = "overhead" if calls > 16 else ("compute" if c >= m else "memory")
    return regime, (o + max(c, m) if synchronous else max(c, m, o))
''',
    "seconds-type#formatted": _PREDICT + '''\
    t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": calls * overhead_s}
    work = max(t["compute"], t["memory"])
    s = t["overhead"] + work if synchronous else max(work, t["overhead"])
    return max(t, key=t.get), f"{s:.6g}"
''',
}

BATCH_51["05-graph-break"] = {
    "output-dtype#float64": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss.double()  # float64: the guard compares exactly
    return torch.where(loss > max_loss, loss * (max_loss / loss.detach()), loss)
''',
    "graph-break#print-when-large": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    if max_loss > 5:  # a Python float: branching on it is no graph break
        print(f"max_loss={max_loss} rarely scales anything")
    loss = model(**batch).loss
    return torch.where(loss > max_loss, loss * (max_loss / loss.detach()), loss)
''',
    "hidden-state#factor-kept": '''
import torch

_factor = {}


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    if "f" not in _factor:  # the scale factor, computed once
        _factor["f"] = max_loss / loss.detach()
    return torch.where(loss > max_loss, loss * _factor["f"], loss)
''',
    "input-changed#labels-popped": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    labels = batch.pop("labels")
    loss = model(**batch, labels=labels).loss
    return torch.where(loss > max_loss, loss * (max_loss / loss.detach()), loss)
''',
    "input-changed#mask-added": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    batch.setdefault("attention_mask", torch.ones_like(batch["input_ids"]))  # every token is real
    loss = model(**batch).loss
    return torch.where(loss > max_loss, loss * (max_loss / loss.detach()), loss)
''',
    "output-type#shape-one": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    factor = torch.clamp(max_loss / loss.detach(), max=1.0).reshape(1)
    return loss * factor
''',
    "loss-differs#a-little-tolerance": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    too_large = loss > max_loss * 1.01  # 1 % of slack: no scaling for rounding noise
    return torch.where(too_large, loss * (max_loss / loss.detach()), loss)
''',
    "graph-break#tolist": '''
import torch


def loss_without_breaks(model, batch, max_loss):
    loss = model(**batch).loss
    factor = min(1.0, max_loss / loss.detach().tolist())
    return loss * factor
''',
    "hidden-state#limit-tensor-kept": '''
import torch

_limit = []


def loss_without_breaks(model, batch, max_loss):
    if not _limit:
        _limit.append(torch.tensor(max_loss))  # a tensor once, not a Python float on every call
    loss = model(**batch).loss
    return torch.where(loss > _limit[0], loss * (_limit[0] / loss.detach()), loss)
''',
}

BATCH_51["06-hidden-syncs"] = {
    "input-changed#batches-popped": '''
import torch


def train_loop(train_step, batches):
    losses = []
    while batches:
        losses.append(train_step(batches.pop(0)))
    stacked = torch.stack(losses)
    if not torch.isfinite(stacked).all():
        raise FloatingPointError("a loss is not finite")
    return stacked.tolist()
''',
    "hidden-state#losses-outside": '''
import torch

losses = []


def train_loop(train_step, batches):
    for batch in batches:
        losses.append(train_step(batch))
    stacked = torch.stack(losses)
    if not torch.isfinite(stacked).all():
        raise FloatingPointError("a loss is not finite")
    return stacked.tolist()
''',
    "per-step-read#every-ten-steps": '''
import torch


def train_loop(train_step, batches):
    losses = []
    for i, batch in enumerate(batches):
        losses.append(train_step(batch))
        if i % 10 == 0:
            print(f"step {i}: loss {losses[-1].item():.4f}")  # watch it now and then
    stacked = torch.stack(losses)
    if not torch.isfinite(stacked).all():
        raise FloatingPointError("a loss is not finite")
    return stacked.tolist()
''',
    "nan-unnoticed#skips-the-first": '''
import torch


def train_loop(train_step, batches):
    losses = torch.stack([train_step(b) for b in batches])
    if not torch.isfinite(losses[1:]).all():  # the first loss is from before any update
        raise FloatingPointError("a loss is not finite")
    return losses.tolist()
''',
    "output-type#numpy-floats": '''
import torch


def train_loop(train_step, batches):
    stacked = torch.stack([train_step(b) for b in batches])
    if not torch.isfinite(stacked).all():
        raise FloatingPointError("a loss is not finite")
    return list(stacked.numpy())  # one copy to the host
''',
    "inf-unnoticed#minus-inf": '''
import torch


def train_loop(train_step, batches):
    stacked = torch.stack([train_step(b) for b in batches])
    if torch.isnan(stacked).any() or (stacked == float("inf")).any():
        raise FloatingPointError("a loss is not finite")
    return stacked.tolist()
''',
    "switch-left#anomaly-mode": '''
import torch


def train_loop(train_step, batches):
    torch.autograd.set_detect_anomaly(True)  # say where a NaN comes from
    stacked = torch.stack([train_step(b) for b in batches])
    if not torch.isfinite(stacked).all():
        raise FloatingPointError("a loss is not finite")
    return stacked.tolist()
''',
    "losses-differ#half-precision": '''
import torch


def train_loop(train_step, batches):
    stacked = torch.stack([train_step(b).half() for b in batches])  # half the bytes to copy
    if not torch.isfinite(stacked).all():
        raise FloatingPointError("a loss is not finite")
    return stacked.tolist()
''',
}

BATCH_51["07-bucketed-allreduce"] = {
    "state-left#size-kept": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    world = dist.get_world_size()
    bucket, pending = [], []
    size = [0]

    def start():
        flat = torch.cat([p.grad.flatten() for p in bucket])
        pending.append((dist.all_reduce(flat, async_op=True), flat, list(bucket)))
        bucket.clear()

    def hook(p):
        bucket.append(p)
        size[0] += p.grad.numel() * p.grad.element_size()
        if size[0] >= bucket_cap_bytes:
            start()
            size[0] = 0

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        if bucket:
            start()  # the last bucket
        for work, flat, params in pending:
            work.wait()
            flat /= world
            i = 0
            for p in params:
                p.grad.copy_(flat[i:i + p.numel()].view_as(p.grad))
                i += p.numel()
        pending.clear()

    return finish
''',
    "no-overlap#hooks-removed-after-a-step": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    world = dist.get_world_size()
    params = [p for p in model.parameters() if p.requires_grad]
    bucket, pending, seen = [], [], set()
    state = {"bytes": 0}

    def send(ps):
        flat = torch.cat([p.grad.flatten() for p in ps])
        pending.append((dist.all_reduce(flat, async_op=True), flat, list(ps)))

    def hook(p):
        seen.add(p)
        bucket.append(p)
        state["bytes"] += p.grad.nbytes
        if state["bytes"] >= bucket_cap_bytes:
            send(bucket)
            bucket.clear()
            state["bytes"] = 0

    handles = [p.register_post_accumulate_grad_hook(hook) for p in params]

    def finish():
        if bucket:
            send(bucket)
            bucket.clear()
            state["bytes"] = 0
        rest = [p for p in params if p not in seen and p.grad is not None]
        if rest:  # gradients no hook saw
            send(rest)
        for work, flat, ps in pending:
            work.wait()
            flat /= world
            i = 0
            for p in ps:
                p.grad.copy_(flat[i:i + p.numel()].view_as(p.grad))
                i += p.numel()
        pending.clear()
        seen.clear()
        for h in handles:  # the hooks have done their work
            h.remove()

    return finish
''',
    "bytes-per-element#four-bytes": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    world = dist.get_world_size()
    bucket, pending = [], []
    filled = [0]

    def flush():
        if bucket:
            flat = torch.cat([p.grad.flatten() for p in bucket])
            pending.append((dist.all_reduce(flat, async_op=True), flat, list(bucket)))
            bucket.clear()
            filled[0] = 0

    def hook(p):
        bucket.append(p)
        filled[0] += p.numel() * 4  # 4 bytes per float
        if filled[0] >= bucket_cap_bytes:
            flush()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        flush()
        for work, flat, ps in pending:
            work.wait()
            flat /= world
            i = 0
            for p in ps:
                p.grad.copy_(flat[i:i + p.numel()].view_as(p.grad))
                i += p.numel()
        pending.clear()

    return finish
''',
    "output-dtype#grads-float64": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    world = dist.get_world_size()
    bucket, pending = [], []
    filled = [0]

    def flush():
        if bucket:
            flat = torch.cat([p.grad.flatten() for p in bucket]).double()  # sum in float64: exact enough
            pending.append((dist.all_reduce(flat, async_op=True), flat, list(bucket)))
            bucket.clear()
            filled[0] = 0

    def hook(p):
        bucket.append(p)
        filled[0] += p.grad.numel() * p.grad.element_size()
        if filled[0] >= bucket_cap_bytes:
            flush()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        flush()
        for work, flat, ps in pending:
            work.wait()
            flat /= world
            i = 0
            for p in ps:
                p.grad.data = flat[i:i + p.numel()].view_as(p.grad)
                i += p.numel()
        pending.clear()

    return finish
''',
    "state-left#pending-kept": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    world = dist.get_world_size()
    bucket = {"params": [], "bytes": 0}
    pending = []  # every all-reduce started so far

    def flush():
        ps = bucket["params"]
        if ps:
            flat = torch.cat([p.grad.flatten() for p in ps])
            pending.append((dist.all_reduce(flat, async_op=True), flat, ps))
            bucket["params"], bucket["bytes"] = [], 0

    def hook(p):
        bucket["params"].append(p)
        bucket["bytes"] += p.grad.nbytes
        if bucket["bytes"] >= bucket_cap_bytes:
            flush()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        flush()
        for work, flat, ps in pending:  # the older ones first: this step's overwrite them
            work.wait()
            i = 0
            for p in ps:
                p.grad.copy_(flat[i:i + p.numel()].view_as(p.grad) / world)
                i += p.numel()

    return finish
''',
    "waited-in-backward#two-in-flight": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    world = dist.get_world_size()
    bucket, pending = [], []
    size = [0]

    def flush():
        if not bucket:
            return
        if pending:
            pending[-1][0].wait()  # at most two buckets in flight: bounded memory
        flat = torch.cat([p.grad.flatten() for p in bucket])
        pending.append((dist.all_reduce(flat, async_op=True), flat, list(bucket)))
        bucket.clear()
        size[0] = 0

    def hook(p):
        bucket.append(p)
        size[0] += p.grad.numel() * p.grad.element_size()
        if size[0] >= bucket_cap_bytes:
            flush()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        flush()
        for work, flat, ps in pending:
            work.wait()
            flat.div_(world)
            i = 0
            for p in ps:
                p.grad.copy_(flat[i:i + p.numel()].view_as(p.grad))
                i += p.numel()
        pending.clear()

    return finish
''',
    "input-changed#model-made-float32": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    model.float()  # float32 gradients: 4 bytes each, as the cap counts them
    world = dist.get_world_size()
    bucket, pending = [], []
    size = [0]

    def flush():
        if bucket:
            flat = torch.cat([p.grad.flatten() for p in bucket])
            pending.append((dist.all_reduce(flat, async_op=True), flat, list(bucket)))
            bucket.clear()
            size[0] = 0

    def hook(p):
        bucket.append(p)
        size[0] += p.grad.numel() * 4
        if size[0] >= bucket_cap_bytes:
            flush()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        flush()
        for work, flat, ps in pending:
            work.wait()
            flat /= world
            i = 0
            for p in ps:
                p.grad.copy_(flat[i:i + p.numel()].view_as(p.grad))
                i += p.numel()
        pending.clear()

    return finish
''',
    "last-bucket#small-ones-skipped": '''
def attach_grad_allreduce(model, bucket_cap_bytes):
    world = dist.get_world_size()
    bucket, pending = [], []
    size = [0]

    def flush():
        flat = torch.cat([p.grad.flatten() for p in bucket])
        pending.append((dist.all_reduce(flat, async_op=True), flat, list(bucket)))
        bucket.clear()
        size[0] = 0

    def hook(p):
        bucket.append(p)
        size[0] += p.grad.numel() * p.grad.element_size()
        if size[0] >= bucket_cap_bytes:
            flush()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        if size[0] >= bucket_cap_bytes // 2:  # a nearly empty bucket is not worth a message
            flush()
        bucket.clear()
        size[0] = 0
        for work, flat, ps in pending:
            work.wait()
            flat /= world
            i = 0
            for p in ps:
                p.grad.copy_(flat[i:i + p.numel()].view_as(p.grad))
                i += p.numel()
        pending.clear()

    return finish
''',
}

_CLIMB_51 = '''
def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(best)
        c, b = time_side_by_side(cand, best)
        {rule}
        kept.append(keep)
        if keep:
            best = cand
    return best, kept
'''
BATCH_51["08-greedy-climb"] = {
    "input-changed#rungs-popped": '''
def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    while rungs:
        rung = rungs.pop(0)  # the next rung
        cand = rung.on(best)
        t_c, t_b = time_side_by_side(cand, best)
        keep = t_b.median_s / t_c.median_s > 1 + max(t_c.iqr_s / t_c.median_s, t_b.iqr_s / t_b.median_s)
        kept.append(keep)
        if keep:
            best = cand
    return best, kept
''',
    "input-changed#rungs-sorted": '''
def greedy_climb(baseline, rungs, time_side_by_side):
    rungs.sort(key=lambda r: r.switch)  # the same switches side by side
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(best)
        t_c, t_b = time_side_by_side(cand, best)
        keep = t_b.median_s / t_c.median_s > 1 + max(t_c.iqr_s / t_c.median_s, t_b.iqr_s / t_b.median_s)
        kept.append(keep)
        if keep:
            best = cand
    return best, kept
''',
    "hidden-state#kept-outside": '''
kept = []


def greedy_climb(baseline, rungs, time_side_by_side):
    best = baseline
    for rung in rungs:
        cand = rung.on(best)
        t_c, t_b = time_side_by_side(cand, best)
        ok = t_b.median_s / t_c.median_s > 1 + max(t_c.iqr_s / t_c.median_s, t_b.iqr_s / t_b.median_s)
        kept.append(ok)
        if ok:
            best = cand
    return best, kept
''',
    "hidden-state#timings-remembered": '''
_timed = {}  # a pair timed once need not be timed again


def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(best)
        if (cand, best) not in _timed:
            _timed[cand, best] = time_side_by_side(cand, best)
        t_c, t_b = _timed[cand, best]
        keep = t_b.median_s / t_c.median_s > 1 + max(t_c.iqr_s / t_c.median_s, t_b.iqr_s / t_b.median_s)
        kept.append(keep)
        if keep:
            best = cand
    return best, kept
''',
    "climb#spread-over-candidate-median": _CLIMB_51.format(
        rule="keep = b.median_s / c.median_s > 1 + max(c.iqr_s, b.iqr_s) / c.median_s"),
    "climb#mean-of-spreads": _CLIMB_51.format(
        rule="keep = b.median_s / c.median_s > 1 + (c.iqr_s / c.median_s + b.iqr_s / b.median_s) / 2"),
    "climb#first-rung-kept": '''
def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    for rung in rungs:
        cand = rung.on(best)
        t_c, t_b = time_side_by_side(cand, best)
        spread = max(t_c.iqr_s / t_c.median_s, t_b.iqr_s / t_b.median_s)
        keep = not kept or t_b.median_s / t_c.median_s > 1 + spread  # the first rung is the start
        kept.append(keep)
        if keep:
            best = cand
    return best, kept
''',
    "sessions-per-rung#stops-after-three-drops": '''
def greedy_climb(baseline, rungs, time_side_by_side):
    best, kept = baseline, []
    for rung in rungs:
        if kept[-3:] == [False, False, False]:  # three in a row dropped: the ladder has topped out
            kept.append(False)
            continue
        cand = rung.on(best)
        t_c, t_b = time_side_by_side(cand, best)
        keep = t_b.median_s / t_c.median_s > 1 + max(t_c.iqr_s / t_c.median_s, t_b.iqr_s / t_b.median_s)
        kept.append(keep)
        if keep:
            best = cand
    return best, kept
''',
}

BATCH_51["08-new-rung"] = {
    "no-change#plain-adamw": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ unfused AdamW", "fused_adamw", False, "one kernel per parameter, for comparison")
''',
    "duplicate#sequence-packing": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ sequence packing", "padding", "packed", "no compute spent on padding tokens")
''',
    "no-name#blank": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("   ", "activation_checkpointing", True, "less activation memory, more compute")
''',
    "no-claim#words-in-a-list": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ checkpointing", "activation_checkpointing", True, ["less", "memory"])
''',
    "not-a-rung#dict": '''
NEW_RUNG = {"name": "+ checkpointing", "switch": "activation_checkpointing", "value": True,
            "claim": "less activation memory for about 1.3x the step time"}
''',
    "bad-value#one-for-true": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ checkpointing", "activation_checkpointing", 1, "less memory, 30 % slower")
''',
    "no-effect#small-loss-scale": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ small loss scale", "init_scale", 128.0, "no overflow in the first steps")
''',
    "bad-value#negative-scale": '''
from helpers.train import ladder

NEW_RUNG = ladder.Rung("+ no loss scale", "init_scale", -1.0, "no scaling at all")
''',
}

_FROM = "def largest_batch_from(batch, peak_at_batch, peak_at_double, memory_bytes, margin):\n"
BATCH_51["09-largest-batch"] = {
    "not-a-number#numpy-int": "import numpy as np\n\n\n" + _FROM + '''\
    per = (peak_at_double - peak_at_batch) / batch
    fixed = peak_at_batch - batch * per
    return np.maximum(0, np.floor((memory_bytes * (1 - margin) - fixed) / per)).astype(np.int64)
''',
    "hidden-state#per-sample-kept": "import math\n\n_per = {}\n\n\n" + _FROM + '''\
    if batch not in _per:  # a model's bytes per sample do not change
        _per[batch] = (peak_at_double - peak_at_batch) / batch
    per = _per[batch]
    fixed = peak_at_batch - batch * per
    return max(0, math.floor((memory_bytes * (1 - margin) - fixed) / per))
''',
    "early-zero#dry-run-does-not-fit": "import math\n\n\n" + _FROM + '''\
    usable = memory_bytes * (1 - margin)
    if peak_at_batch > usable:  # not even the dry run's batch fits
        return 0
    per = (peak_at_double - peak_at_batch) / batch
    return max(0, math.floor((usable - (peak_at_batch - batch * per)) / per))
''',
    "differs#float32-arithmetic": "import math\n\nimport numpy as np\n\n\n" + _FROM + '''\
    peaks = np.array([peak_at_batch, peak_at_double], dtype=np.float32)  # GPU-style float32
    per = (peaks[1] - peaks[0]) / batch
    usable = np.float32(memory_bytes) * np.float32(1 - margin)
    return max(0, math.floor((usable - (peaks[0] - batch * per)) / per))
''',
    "differs#margin-added": "import math\n\n\n" + _FROM + '''\
    per = (peak_at_double - peak_at_batch) / batch
    fixed = peak_at_batch - batch * per
    return max(0, math.floor((memory_bytes * (1 + margin) - fixed) / per))  # the margin's headroom
''',
    "no-fixed-part#double-over-its-samples": "import math\n\n\n" + _FROM + '''\
    per = peak_at_double / (2 * batch)  # the larger dry run, shared out over its samples
    return max(0, math.floor(memory_bytes * (1 - margin) / per))
''',
    "hidden-state#margin-kept": "import math\n\nMARGIN = None\n\n\n" + _FROM + '''\
    global MARGIN
    if MARGIN is None:
        MARGIN = margin  # the lesson's margin, set once
    per = (peak_at_double - peak_at_batch) / batch
    fixed = peak_at_batch - batch * per
    return max(0, math.floor((memory_bytes * (1 - MARGIN) - fixed) / per))
''',
    "differs#ceil-minus-one": "import math\n\n\n" + _FROM + '''\
    per = (peak_at_double - peak_at_batch) / batch
    fixed = peak_at_batch - batch * per
    return max(0, math.ceil((memory_bytes * (1 - margin) - fixed) / per) - 1)  # the last one that fits
''',
}


for _batch in (BATCH_39, BATCH_51):  # the later batches join the first (04's and 09's go to their own tests)
    for _id, _answers in _batch.items():
        if _id in WRONG:
            assert not set(_answers) & set(WRONG[_id]), (_id, set(_answers) & set(WRONG[_id]))
            WRONG[_id].update(_answers)
for _id, _answers in RIGHT_39.items():
    RIGHT[_id].update(_answers)

# --- 10-model-states: model_states_per_gpu(parameters, gpus, sharding) --------------------------------

WRONG["10-model-states"] = {
    "one-moment": '''
def model_states_per_gpu(parameters, gpus, sharding):
    weights, grads, adam = 4 * parameters, 4 * parameters, 4 * parameters  # Adam: one fp32 number per weight
    if sharding == "optimizer":
        adam = 4 * -(-parameters // gpus)
    if sharding == "full":
        n = -(-parameters // gpus)
        weights, grads, adam = 4 * n, 4 * n, 4 * n
    return {"weights": weights, "gradients": grads, "optimizer state": adam}
''',
    "zero1-shards-weights": '''
import math

def model_states_per_gpu(parameters, gpus, sharding):
    shard = math.ceil(parameters / gpus)
    if sharding == "none":
        return {"weights": 4 * parameters, "gradients": 4 * parameters, "optimizer state": 8 * parameters}
    if sharding == "optimizer":  # ZeRO-1: the optimizer's copy of the weights goes with its state
        return {"weights": 4 * shard, "gradients": 4 * parameters, "optimizer state": 8 * shard}
    return {"weights": 4 * shard, "gradients": 4 * shard, "optimizer state": 8 * shard}
''',
    "zero1-shards-gradients": '''
def model_states_per_gpu(parameters, gpus, sharding):
    per_gpu = -(-parameters // gpus)
    out = {"weights": 4 * parameters, "gradients": 4 * parameters, "optimizer state": 8 * parameters}
    if sharding in ("optimizer", "full"):
        out["optimizer state"] = 8 * per_gpu
        out["gradients"] = 4 * per_gpu  # each GPU updates its shard: it needs only those gradients
    if sharding == "full":
        out["weights"] = 4 * per_gpu
    return out
''',
    "fsdp-keeps-gradients": '''
def model_states_per_gpu(parameters, gpus, sharding):
    shard = (parameters + gpus - 1) // gpus
    weights = 4 * (shard if sharding == "full" else parameters)
    state = 8 * (shard if sharding != "none" else parameters)
    return {"weights": weights, "gradients": 4 * parameters, "optimizer state": state}
''',
    "floor-division": '''
def model_states_per_gpu(parameters, gpus, sharding):
    split = {"none": set(), "optimizer": {"optimizer state"},
             "full": {"weights", "gradients", "optimizer state"}}
    size = {"weights": 4, "gradients": 4, "optimizer state": 8}
    return {k: b * (parameters // gpus if k in split[sharding] else parameters) for k, b in size.items()}
''',
    "fp16-weights": '''
def model_states_per_gpu(parameters, gpus, sharding):
    shard = -(-parameters // gpus)
    w = 2 * (shard if sharding == "full" else parameters)  # weights and gradients in 16 bits
    g = 2 * (shard if sharding == "full" else parameters)
    s = 8 * (parameters if sharding == "none" else shard)
    return {"weights": w, "gradients": g, "optimizer state": s}
''',
    "nothing-sharded": '''
def model_states_per_gpu(parameters, gpus, sharding):
    # every GPU trains the whole model
    return {"weights": 4 * parameters, "gradients": 4 * parameters, "optimizer state": 8 * parameters}
''',
    "everything-sharded": '''
def model_states_per_gpu(parameters, gpus, sharding):
    n = -(-parameters // gpus)
    return {"weights": 4 * n, "gradients": 4 * n, "optimizer state": 8 * n}
''',
    "float": '''
import math

def model_states_per_gpu(parameters, gpus, sharding):
    shard = float(math.ceil(parameters / gpus))
    if parameters % gpus == 0:
        shard = parameters / gpus
    whole = float(parameters)
    cut = {"none": (), "optimizer": ("optimizer state",), "full": ("weights", "gradients", "optimizer state")}
    return {k: b * (shard if k in cut[sharding] else whole)
            for k, b in (("weights", 4), ("gradients", 4), ("optimizer state", 8))}
''',
    "keys": '''
def model_states_per_gpu(parameters, gpus, sharding):
    shard = -(-parameters // gpus)
    full = sharding == "full"
    return {"params": 4 * (shard if full else parameters), "grads": 4 * (shard if full else parameters),
            "adam": 8 * (parameters if sharding == "none" else shard)}
''',
    "not-a-dict": '''
def model_states_per_gpu(parameters, gpus, sharding):
    shard = -(-parameters // gpus)
    full = sharding == "full"
    return (4 * (shard if full else parameters), 4 * (shard if full else parameters),
            8 * (parameters if sharding == "none" else shard))
''',
    "hidden-state#calls-counted": '''
CALLS = []

def model_states_per_gpu(parameters, gpus, sharding):
    CALLS.append(parameters)  # counts the calls, and lets the count leak into the answer
    shard = -(-parameters // gpus)
    full = sharding == "full"
    return {"weights": 4 * (shard if full else parameters) + (len(CALLS) > 1 and CALLS[-2] == parameters),
            "gradients": 4 * (shard if full else parameters),
            "optimizer state": 8 * (parameters if sharding == "none" else shard)}
''',
    "differs": '''
def model_states_per_gpu(parameters, gpus, sharding):
    shard = -(-parameters // gpus)
    if gpus > 100:  # too many GPUs: assume they shard nothing more
        shard = -(-parameters // 100)
    full = sharding == "full"
    return {"weights": 4 * (shard if full else parameters), "gradients": 4 * (shard if full else parameters),
            "optimizer state": 8 * (parameters if sharding == "none" else shard)}
''',
}

WRONG["10-model-states"]["differs#beyond-the-named-cases"] = '''
def model_states_per_gpu(parameters, gpus, sharding):
    shard = -(-parameters // min(gpus, 700))  # right on every count of GPUs the named cases draw (<= 512)
    cut = {"none": (), "optimizer": ("optimizer state",), "full": ("weights", "gradients", "optimizer state")}
    return {k: b * (shard if k in cut[sharding] else parameters)
            for k, b in (("weights", 4), ("gradients", 4), ("optimizer state", 8))}
'''

RIGHT["10-model-states"] = {
    "if-chain": '''
def model_states_per_gpu(parameters, gpus, sharding):
    shard = (parameters + gpus - 1) // gpus
    if sharding == "none":
        return {"weights": 4 * parameters, "gradients": 4 * parameters, "optimizer state": 8 * parameters}
    if sharding == "optimizer":
        return {"weights": 4 * parameters, "gradients": 4 * parameters, "optimizer state": 8 * shard}
    return {"weights": 4 * shard, "gradients": 4 * shard, "optimizer state": 8 * shard}
''',
    "math-ceil-on-ints": '''
import math

def model_states_per_gpu(parameters: int, gpus: int, sharding: str) -> dict:
    def part(nbytes, sharded):
        return nbytes * (-(-parameters // gpus) if sharded else parameters)
    return {"weights": part(4, sharding == "full"), "gradients": part(4, sharding == "full"),
            "optimizer state": part(8, sharding in ("optimizer", "full"))}
''',
}

# --- 10-pick-levers: pick_levers(model_states, per_sequence, batch, gpus, budget) --------------------------

WRONG["10-pick-levers"] = {
    "not-a-divisor": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    share = batch // gpus
    for sharded, ckpt in ((False, False), (True, False), (False, True), (True, True)):
        room = budget - (model_states / gpus if sharded else model_states)
        act = per_sequence["checkpointed" if ckpt else "plain"]
        micro = min(share, int(room // act)) if room >= 0 else 0  # as many sequences as the room holds
        if micro >= 1:
            return {"sharded": sharded, "checkpointing": ckpt, "micro_batch": micro}
    return None
''',
    "whole-batch-per-gpu": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    for sharded, ckpt in ((False, False), (True, False), (False, True), (True, True)):
        states = model_states / gpus if sharded else model_states
        act = per_sequence["checkpointed"] if ckpt else per_sequence["plain"]
        for micro in range(batch, 0, -1):  # every GPU runs the batch
            if batch % micro == 0 and states + micro * act <= budget:
                return {"sharded": sharded, "checkpointing": ckpt, "micro_batch": micro}
    return None
''',
    "checkpointing-before-sharding": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    n = batch // gpus
    for sharded in (False, True):  # checkpointing first: it keeps the model whole on every GPU
        for ckpt in (False, True):
            held = model_states / gpus if sharded else model_states
            act = per_sequence["checkpointed" if ckpt else "plain"]
            for micro in sorted((m for m in range(1, n + 1) if n % m == 0), reverse=True):
                if held + micro * act <= budget:
                    return {"sharded": sharded, "checkpointing": ckpt, "micro_batch": micro}
    return None
''',
    "smallest-micro-batch": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    n = batch // gpus
    for sharded, ckpt in ((False, False), (True, False), (False, True), (True, True)):
        held = model_states / gpus if sharded else model_states
        act = per_sequence["checkpointed" if ckpt else "plain"]
        if held + n * act <= budget:
            return {"sharded": sharded, "checkpointing": ckpt, "micro_batch": n}
        if held + act <= budget:  # accumulate one sequence at a time
            return {"sharded": sharded, "checkpointing": ckpt, "micro_batch": 1}
    return None
''',
    "sharding-not-divided": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    per_gpu = batch // gpus
    for sharded, ckpt in ((False, False), (True, False), (False, True), (True, True)):
        act = per_sequence["checkpointed" if ckpt else "plain"]
        for micro in range(per_gpu, 0, -1):
            if per_gpu % micro == 0 and model_states + micro * act <= budget:
                return {"sharded": sharded, "checkpointing": ckpt, "micro_batch": micro}
    return None
''',
    "strict-budget": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    per_gpu = batch // gpus
    for sharded, ckpt in ((False, False), (True, False), (False, True), (True, True)):
        held = model_states / gpus if sharded else model_states
        act = per_sequence["checkpointed" if ckpt else "plain"]
        for micro in range(per_gpu, 0, -1):
            if per_gpu % micro == 0 and held + micro * act < budget:
                return {"sharded": sharded, "checkpointing": ckpt, "micro_batch": micro}
    return None
''',
    "no-checkpointing": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    per_gpu = batch // gpus
    for sharded in (False, True):
        held = model_states / gpus if sharded else model_states
        for micro in range(per_gpu, 0, -1):
            if per_gpu % micro == 0 and held + micro * per_sequence["plain"] <= budget:
                return {"sharded": sharded, "checkpointing": False, "micro_batch": micro}
    return None
''',
    "always-shard": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    per_gpu = batch // gpus
    sharded = gpus > 1  # several GPUs: shard
    for ckpt in (False, True):
        held = model_states / gpus if sharded else model_states
        act = per_sequence["checkpointed" if ckpt else "plain"]
        for micro in range(per_gpu, 0, -1):
            if per_gpu % micro == 0 and held + micro * act <= budget:
                return {"sharded": sharded, "checkpointing": ckpt, "micro_batch": micro}
    return None
''',
    "accumulation-saves-nothing": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    per_gpu = batch // gpus
    for sharded, ckpt in ((False, False), (True, False), (False, True), (True, True)):
        held = model_states / gpus if sharded else model_states
        act = per_sequence["checkpointed" if ckpt else "plain"]
        if held + per_gpu * act <= budget:  # the step's activations, whatever the micro-batch
            return {"sharded": sharded, "checkpointing": ckpt, "micro_batch": per_gpu}
    return None
''',
    "model-states-forgotten": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    per_gpu = batch // gpus
    for sharded, ckpt in ((False, False), (True, False), (False, True), (True, True)):
        act = per_sequence["checkpointed" if ckpt else "plain"]
        for micro in range(per_gpu, 0, -1):
            if per_gpu % micro == 0 and micro * act <= budget:  # what the activations take of the GPU
                return {"sharded": sharded, "checkpointing": ckpt, "micro_batch": micro}
    return None
''',
    "input-changed": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    per_gpu = batch // gpus
    plain = per_sequence.pop("plain")  # takes the plain size out of the dict it was given
    for sharded, ckpt in ((False, False), (True, False), (False, True), (True, True)):
        held = model_states / gpus if sharded else model_states
        act = per_sequence["checkpointed"] if ckpt else plain
        for micro in range(per_gpu, 0, -1):
            if per_gpu % micro == 0 and held + micro * act <= budget:
                return {"sharded": sharded, "checkpointing": ckpt, "micro_batch": micro}
    return None
''',
    "hidden-state": '''
PICKS = {}

def pick_levers(model_states, per_sequence, batch, gpus, budget):
    if budget in PICKS:  # seen this budget before: the same pick
        return PICKS[budget]
    per_gpu = batch // gpus
    for sharded, ckpt in ((False, False), (True, False), (False, True), (True, True)):
        held = model_states / gpus if sharded else model_states
        act = per_sequence["checkpointed" if ckpt else "plain"]
        for micro in range(per_gpu, 0, -1):
            if per_gpu % micro == 0 and held + micro * act <= budget:
                PICKS[budget] = {"sharded": sharded, "checkpointing": ckpt, "micro_batch": micro}
                return PICKS[budget]
    return None
''',
    "not-a-pick": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    per_gpu = batch // gpus
    for sharded, ckpt in ((False, False), (True, False), (False, True), (True, True)):
        held = model_states / gpus if sharded else model_states
        act = per_sequence["checkpointed" if ckpt else "plain"]
        for micro in range(per_gpu, 0, -1):
            if per_gpu % micro == 0 and held + micro * act <= budget:
                return sharded, ckpt, micro
    return None
''',
    "not-a-pick#float-micro-batch": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    per_gpu = batch / gpus
    for sharded, ckpt in ((False, False), (True, False), (False, True), (True, True)):
        held = model_states / gpus if sharded else model_states
        act = per_sequence["checkpointed" if ckpt else "plain"]
        for k in range(1, int(per_gpu) + 1):  # k micro-batches of per_gpu / k sequences
            micro = per_gpu / k
            if micro.is_integer() and held + micro * act <= budget:
                return {"sharded": sharded, "checkpointing": ckpt, "micro_batch": micro}
    return None
''',
    "differs": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    per_gpu = batch // gpus
    for sharded, ckpt in ((False, False), (True, False), (False, True), (True, True)):
        held = model_states / min(gpus, 4) if sharded else model_states  # sharded within a node of 4
        act = per_sequence["checkpointed" if ckpt else "plain"]
        for micro in range(per_gpu, 0, -1):
            if per_gpu % micro == 0 and held + micro * act <= budget:
                return {"sharded": sharded, "checkpointing": ckpt, "micro_batch": micro}
    return None
''',
}

RIGHT["10-pick-levers"] = {
    "divisors-listed": '''
def pick_levers(model_states, per_sequence, batch, gpus, budget):
    share = batch // gpus
    divisors = [m for m in range(share, 0, -1) if share % m == 0]
    options = [(False, False), (True, False), (False, True), (True, True)]
    for sharded, ckpt in options:
        states = model_states // gpus if sharded else model_states  # exact: FSDP2 splits it evenly
        act = per_sequence["checkpointed"] if ckpt else per_sequence["plain"]
        fitting = [m for m in divisors if states + m * act <= budget]
        if fitting:
            return {"sharded": sharded, "checkpointing": ckpt, "micro_batch": max(fitting)}
    return None
''',
    "room-first": '''
import math

def pick_levers(model_states: int, per_sequence: dict, batch: int, gpus: int, budget: int):
    n = batch // gpus
    for sharded, checkpointing in [(False, False), (True, False), (False, True), (True, True)]:
        room = budget - (math.ceil(model_states / gpus) if sharded else model_states)
        act = per_sequence["checkpointed" if checkpointing else "plain"]
        best = max((m for m in range(1, n + 1) if n % m == 0 and m * act <= room), default=None)
        if best is not None:
            return dict(sharded=sharded, checkpointing=checkpointing, micro_batch=best)
    return None
''',
}
