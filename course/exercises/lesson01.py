"""The check of exercise 01-flash-forward (lesson 01, `01_attention`): FlashAttention's forward in tiles,
(O, logsumexp), on inputs drawn per run.

It checks what the lesson teaches, not only the numbers:
- **values**: O and L against a float64 reference, with N_k keys in blocks of block_k (a partial last block),
  in another block size, in one block, and N keys in whole blocks (self-attention, N_q = N_k);
- **structure**: every op the answer runs is recorded (a `TorchDispatchMode`), and no op's output may hold a
  key dimension longer than block_k: the N×N matrix the lesson says never exists must not exist, nor whole
  rows of it for a block of queries. The check gives N_k ≠ N_q keys (a prime number of them, larger than
  every other size), so that a key dimension can be told from a query one by its length;
- the inputs are left as they were, and the answer is the learner's own: no `scaled_dot_product_attention`
  (which returns the logsumexp too), no course attention code;
- **large scores**: three cases whose scores reach ±10⁴ (exact in float32: integer q and k, d = 16), where an
  answer that skips the running max overflows (exp(s) is inf above s ≈ 88), one whose max starts at 0 instead
  of -inf underflows (every exp(s − 0) is 0 when a row's scores are all far below 0), and one that takes each
  block's own max instead of the running one overflows when a block's scores sit far below an earlier
  block's: each mistake fails its own subset of the three, which names it.
An answer that runs more than 10,000 tensor operations in one call is stopped (a loop that does not end).

A wrong O or L is compared with what each typical mistake gives on the same inputs (no rescale, one of l
and acc rescaled, no normalisation, no or a wrong scale, keys left out by the loop or the slice, L without its
max, ...): a mistake is named only when the answer's output is that mistake's; otherwise the line says which
output differs, where and by how much.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import random
from collections.abc import Callable
from typing import Any

import torch

from course.exercises.contract import Task, contract, reference, search
from course.exercises.core import Halt, Wrong, course_code_running, tensors_in, unpack

__all__ = ["flash_forward", "task"]

_FUSED = ("scaled_dot_product", "flash_attention", "efficient_attention", "flex_attention", "cudnn_attention")
_KEY_COUNTS = (29, 31, 37, 41, 43, 47)  # primes: no product of the other sizes, longer than all of them
_QUERY_COUNTS = (5, 7, 11, 13)  # shorter than any key block a learner would pick by themselves (16, 32, ...)
_HEAD_DIMS = (12, 20, 24)  # not a power of two: a tile of block_q × N_k is not the size of k itself
_MAX_OPS = 10_000  # tensor operations in one call: a right answer runs about 10 per block of keys


# --- the reference and the mistakes, in float64 ------------------------------------------------------------

def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    s = (q.double() @ k.double().transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    return torch.softmax(s, -1) @ v.double(), torch.logsumexp(s, -1)


def _online(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: range, width: int, *,
            scale: float | None = None, rescale: str = "l acc",
            normalise: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The online softmax over key blocks k[start:start + width] for each start: the algorithm, and (with
    other arguments) the mistakes learners make in it."""
    q, k, v = q.double(), k.double(), v.double()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    m = torch.full(q.shape[:3], -math.inf, dtype=torch.float64)
    l = torch.zeros(q.shape[:3], dtype=torch.float64)  # noqa: E741 (the paper's name)
    acc = torch.zeros(q.shape, dtype=torch.float64)
    for start in starts:
        kb, vb = k[:, :, start:start + width], v[:, :, start:start + width]
        if kb.shape[2] == 0:
            continue
        s = (q @ kb.transpose(-2, -1)) * scale
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = (l * alpha if "l" in rescale.split() else l) + p.sum(-1)  # noqa: E741
        acc = (acc * alpha[..., None] if "acc" in rescale.split() else acc) + p @ vb
        m = m_new
    return (acc / l[..., None] if normalise else acc), m + torch.log(l)


def _o_mistakes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: int) -> list[tuple[str, Any, str, str]]:
    """(key, O that mistake gives, what, hint): the mistakes a wrong O is compared with, on these inputs."""
    nq, nk, d = q.shape[2], k.shape[2], q.shape[-1]
    every = range(0, nk, b)
    rescale_hint = ("when a block raises the running max from m to m_new, what was summed so far was "
                    "computed "
                    "with the old max: multiply l and acc by exp(m - m_new) before adding the block")
    out = [
        ("missing-rescale", _online(q, k, v, every, b, rescale=""),
         "O is right with one block of keys, wrong with several: it is what the online softmax gives without "
         "rescaling l and acc", rescale_hint),
        ("rescale-acc-only", _online(q, k, v, every, b, rescale="acc"),
         "O is right with one block of keys, wrong with several: acc was rescaled by exp(m - m_new), l was "
         "not",
         "the running sum l was computed under the old max too: l = l * exp(m - m_new) + p.sum(-1)"),
        ("rescale-l-only", _online(q, k, v, every, b, rescale="l"),
         "O is right with one block of keys, wrong with several: l was rescaled by exp(m - m_new), acc was "
         "not",
         "the accumulator was computed under the old max too: acc = acc * exp(m - m_new)[..., None] + p @ "
         "vb"),
        ("not-normalised", _online(q, k, v, every, b, normalise=False),
         "O is acc itself, the weighted sum before the division (its rows do not average v)",
         "divide by the running sum at the end: O = acc / l[..., None]"),
        ("missing-scale", _reference(q, k, v, scale=1.0),
         "O equals softmax(q·kᵀ)·v, without the scale",
         "multiply the scores by 1/√d (d = q.shape[-1]) before the max and the exp"),
        ("wrong-scale", _reference(q, k, v, scale=1.0 / d),
         f"O equals softmax(q·kᵀ/d)·v: the scores were divided by d = {d}, not by √d",
         "the scale is q.shape[-1] ** -0.5"),
    ]
    if nk % b:
        out.append(("last-partial-block", _online(q, k, v, range(0, nk - nk % b, b), b),
                    f"O is softmax·v over the first {nk - nk % b} of the {nk} keys: the last, partial block "
                    f"(of {nk % b}) was left out",
                    "loop with range(0, k.shape[2], block_k): the last block may be shorter than block_k"))
    else:  # whole blocks (with a partial one, stopping a block early drops just it: the mistake above)
        out.append(("stops-early", _online(q, k, v, range(0, nk - b, b), b),
                    "the keys of the last block were left out: the loop stopped one block early",
                    "loop with range(0, k.shape[2], block_k): its last start is the last block's"))
    out += [
        ("slice-off-by-one", _online(q, k, v, every, b - 1),
         f"each block left out its last key: blocks of {b - 1} keys, one every {b}",
         "k[:, :, start:start + block_k] holds block_k keys (the end of a slice is not included)"),
        ("slice-overlap", _online(q, k, v, every, b + 1),
         f"the first key of each block also counted in the block before: blocks of {b + 1} keys, one every "
         f"{b}",
         "k[:, :, start:start + block_k] holds block_k keys: the next block starts where this one ends"),
    ]
    out += [
        ("per-block-softmax", (torch.stack([_reference(q, k[:, :, i:i + b], v[:, :, i:i + b])[0]
                                            for i in every]).mean(0), None),
         "O is the mean of each block's own softmax·v: every block was normalised alone and the blocks "
         "weighted equally", "a block's share depends on its scores: carry the running max m and sum l "
         "across blocks and divide by l once, at the end"),
        ("last-block-only", _online(q, k, v, every[-1:], b),
         "O is softmax·v over the last block of keys alone: the running max m was never updated, so "
         "exp(m - m_new) = exp(-inf) = 0 wiped every earlier block",
         "after each block, m = m_new: the running max carries from block to block"),
    ]
    if d < nk:
        out.append(("keys-from-d", _online(q, k, v, range(0, d, b), b),
                    f"O attends to the first keys only: the loop ran over d = {d} (k.shape[-1], the head "
                    f"dimension), not over the N_k = {nk} keys (k.shape[2])",
                    "loop over the keys: range(0, k.shape[2], block_k); the last dimension is the head's"))
    if nq < nk:
        out.append(("keys-from-q", _online(q, k, v, range(0, nq, b), b),
                    f"O attends to the first keys only: the loop ran over N_q = {nq} (q's length), not over "
                    f"the "
                    f"N_k = {nk} keys", "loop over the keys: range(0, k.shape[2], block_k)"))
    return out


def _lse_mistakes(q: torch.Tensor, k: torch.Tensor) -> list[tuple[str, torch.Tensor, str, str]]:
    raw = q.double() @ k.double().transpose(-2, -1)
    s = raw * q.shape[-1] ** -0.5
    m, want = s.amax(-1), torch.logsumexp(s, -1)
    return [
        ("lse-is-max", m, "L equals the rows' maxima m", "L = m + log(l): add the log of the running sum"),
        ("lse-without-max", want - m, "L equals log(l) alone", "L = m + log(l): add the running max back"),
        ("lse-not-log", torch.exp(want - m), "L equals the running sum l", "take its log: L = m + log(l)"),
        ("lse-unscaled", torch.logsumexp(raw, -1), "L is the logsumexp of the unscaled scores q·kᵀ",
         "L belongs to the scores the softmax saw: q·kᵀ/√d"),
        ("lse-base-2", want / math.log(2), "L is in base 2 (log2 of the sum of 2^s)",
         "L is the natural logsumexp: divide a base-2 result by log2(e), or use exp and log"),
    ]


# --- running the answer, watching every op ------------------------------------------------------------------

class _Recorder:
    """What the answer did: every op's output shapes, a fused attention kernel it called, course code it
    called (a TorchDispatchMode sees each op the answer runs, below autograd)."""

    def __init__(self, nk: int, b: int) -> None:
        self.outputs: list[tuple[str, tuple[int, ...]]] = []
        self.fused: str | None = None
        self.course: str | None = None
        self.nk, self.b = nk, b

    def mode(self) -> Any:
        from helpers.core.compat import TorchDispatchMode

        rec = self

        class Record(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                name = func.overloadpacket.__name__
                if rec.fused is None and any(f in name for f in _FUSED):
                    rec.fused = name
                if rec.course is None:
                    rec.course = course_code_running()
                if len(rec.outputs) > _MAX_OPS:  # a bound on time and on memory: the check stops it here
                    raise Halt("endless", f"it ran more than {_MAX_OPS:,} tensor operations in one call, for "
                               f"N_k = {rec.nk} keys in blocks of {rec.b} (a right answer runs about 10 per "
                               "block): a loop that does not end", "loop over the key blocks once: for start "
                               "in range(0, k.shape[2], block_k) (a while loop must add block_k to start)")
                out = func(*args, **(kwargs or {}))
                rec.outputs += [(name, tuple(t.shape)) for t in tensors_in(out)]
                return out

        return Record()


def _run(answer: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
         block_k: int) -> tuple[torch.Tensor, torch.Tensor, _Recorder]:
    rec = _Recorder(k.shape[2], block_k)
    given = [t.clone() for t in (q, k, v)]
    with rec.mode():
        got = answer(q, k, v, block_k=block_k)
    if rec.fused is not None:
        raise Wrong("uses-sdpa", f"it calls a fused attention kernel (aten.{rec.fused})",
                    "write the loop over key blocks yourself: the fused kernels do this tiling for you "
                    "(scaled_dot_product_attention computes the logsumexp too), which is what the exercise "
                    "asks")
    if rec.course is not None:
        raise Wrong("uses-course-code", f"it calls the course's {rec.course}",
                    "write the tiles yourself: the lesson's version is printed above to read, not to call")
    for name, before, now in zip("qkv", given, (q, k, v)):
        if not torch.equal(before, now):
            ratio = (now.double() / before.double()).flatten()
            same = bool(torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-5))
            extra = f": every value is now {ratio[0].item():.4g} times what it was" if same else ""
            raise Wrong("input-changed", f"{name} was changed in place{extra}",
                        "leave the inputs as they were: compute on new tensors (q * scale, not q *= scale or "
                        "q.mul_(scale)); the caller still holds q, k and v")
    o, lse = _shapes(got, q)
    return o.detach(), lse.detach(), rec


def _shapes(got: Any, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, L) when the answer returned two tensors of the task's shapes; Wrong naming what it returned
    else."""
    o, lse = unpack(got, 2, "O, L")
    for what, t, shape in (("O", o, q.shape), ("L", lse, q.shape[:3])):
        if not isinstance(t, torch.Tensor):
            raise Wrong("return-type", f"{what} is a {type(t).__name__}", f"return {what} as a tensor")
        if tuple(t.shape) != tuple(shape):
            extra = " (keepdim=True left a last dimension of 1: squeeze it)" if t.shape == (*shape, 1) else ""
            raise Wrong("wrong-shape", f"{what} has shape {tuple(t.shape)}, expected {tuple(shape)}{extra}",
                        "O is (B, H, N_q, d) like q; L holds one number per query row, (B, H, N_q); "
                        "squeeze() drops every dimension of size 1, a batch or a head of 1 too")
    return o, lse


def _o_error(o: torch.Tensor, want: torch.Tensor) -> float:
    """The largest relative error of any (batch, head), ‖o − want‖ / ‖want‖ over its (N_q, d) values, as
    `helpers.model.attention.attention_agreement` measures it; inf when either holds NaN/inf or `want` is all
    zeros."""
    o, want = o.double().flatten(2), want.double().flatten(2)
    norm = want.norm(dim=-1)
    if not (bool(torch.isfinite(o).all()) and bool(torch.isfinite(want).all()) and bool((norm > 0).all())):
        return math.inf
    return ((o - want).norm(dim=-1) / norm).max().item()


def _check_values(answer: Callable, case: tuple, one_block_ok: bool | None,
                  other_blocks: tuple[int, ...] = ()) -> _Recorder:
    q, k, v, b = case
    o, lse, rec = _run(answer, q, k, v, b)
    want_o, want_l = _reference(q, k, v)
    if _o_error(o, want_o) > 1e-5:
        _diagnose_o(answer, o, q, k, v, b, one_block_ok, other_blocks)
    if not torch.allclose(lse.double(), want_l, rtol=1e-5, atol=1e-4):
        _diagnose_lse(lse, q, k)
    return rec


def _matching(o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: int) -> dict:
    return {key: (what, hint) for key, (sim_o, _), what, hint in _o_mistakes(q, k, v, b)
            if _o_error(o, sim_o) < 1e-4}


def _diagnose_o(answer: Callable, o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: int,
                one_block_ok: bool | None, other_blocks: tuple[int, ...] = (), first: bool = False) -> None:
    """Name the mistake whose O is the answer's; `first`: when two still coincide on every block size tried
    (the inputs cannot tell them apart), the first in `_o_mistakes`' order (the search's smallest case)."""
    matched = _matching(o, q, k, v, b)
    for other in other_blocks:  # two mistakes giving this very O: another block size tells them apart
        if len(matched) <= 1:
            break
        o_other = _run(answer, q, k, v, other)[0]
        if _o_error(o_other, _reference(q, k, v)[0]) <= 1e-5:
            continue  # right with this block size: it tells nothing apart
        again = _matching(o_other, q, k, v, other)
        matched = {key: m for key, m in matched.items() if key in again}
    if len(matched) == 1 or (first and matched):
        key, (what, hint) = next(iter(matched.items()))
        raise Wrong(key, what, hint)
    want = _reference(q, k, v)[0]
    nq, nk = q.shape[2], k.shape[2]
    where = f"N_q={nq} queries, N_k={nk} keys in blocks of {b}"
    if not bool(torch.isfinite(o).all()):
        bad = int((~torch.isfinite(o)).any(-1).sum())
        raise Wrong("not-finite", f"O holds NaN or inf in {bad} query row(s) ({where})",
                    "a running max starting at -inf gives exp(-inf - (-inf)) = NaN if a block leaves it at "
                    "-inf; print m, l and acc after each block for one row")
    err = (o.double() - want).abs().amax(-1)  # (B, H, N_q): the largest error of each query row
    bb, hh, row = (int(i) for i in torch.nonzero(err == err.max())[0])
    rows = int((err > 1e-4 * want.abs().max()).sum())
    one = {True: "; with one block of keys it is right", False: "; with one block of keys it is wrong too",
           None: ""}[one_block_ok]
    raise Wrong("o-wrong", f"O differs from softmax(q·kᵀ/√d)·v ({where}) by up to {err.max().item():.3g} "
                f"(batch {bb}, head {hh}, query row {row}), in {rows} of {err.numel()} rows{one}",
                "try one block first (block_k ≥ N_k: then it is the plain softmax), then two; print m, l and "
                "acc after each block for one query row and redo them by hand, as step 5 does")


def _diagnose_lse(lse: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
    lse = lse.double()
    for key, value, what, hint in _lse_mistakes(q, k):
        if torch.allclose(lse, value, rtol=1e-4, atol=1e-4):
            raise Wrong(key, what, hint)
    want = torch.logsumexp((q.double() @ k.double().transpose(-2, -1)) * q.shape[-1] ** -0.5, -1)
    err = (lse - want).abs()
    bb, hh, row = (int(i) for i in torch.nonzero(err == err.max())[0])
    raise Wrong("lse-wrong", f"O is right; L differs from logsumexp(q·kᵀ/√d) by up to {err.max().item():.3g} "
                f"(batch {bb}, head {hh}, query row {row}; mean difference "
                f"{(lse - want).mean().item():+.3g})",
                "with the final running max m and running sum l of each row, L = m + log(l)")


# --- structure: no tensor with more than block_k keys -----------------------------------------------------

def _check_tiles(rec: _Recorder, q: torch.Tensor, k: torch.Tensor, b: int) -> None:
    bsz, h, nq, d = q.shape
    nk = k.shape[2]
    # what a right answer's tensors are made of: batch, heads, queries and d, flattened in any way, and a
    # block of keys alone or flattened with the queries or d (never with the batch or heads alone: 2 heads
    # x block_k 8 is not a block of 16 keys)
    sizes = [bsz, h, nq, d]
    subsets = [c for r in range(len(sizes) + 1) for c in itertools.combinations(range(len(sizes)), r)]
    allowed = {math.prod(sizes[i] for i in c) for c in subsets}
    allowed |= {b * math.prod(sizes[i] for i in c) for c in subsets if not c or {2, 3} & set(c)}
    relayouts = {k.numel(), q.numel()}  # k, v, q themselves cast, transposed or reshaped: no new scores
    for op, shape in rec.outputs:
        numel = math.prod(shape)
        if numel in relayouts:
            continue
        if nk in shape:
            shown = f"`aten.{op}` made a tensor of shape {shape}"
            if nq in shape:
                raise Wrong("whole-score-matrix", f"{shown}: the whole N_q × N_k = {nq} × {nk} matrix of "
                                                  f"scores "
                            f"(block_k was {b})", "loop over the keys in blocks of block_k, as step 5 does, "
                            "carrying m, l and acc from block to block: only N_q × block_k scores may exist "
                            "at a time")
            raise Wrong("whole-score-rows", f"{shown}: whole rows of all N_k = {nk} scores for a block of "
                        f"queries (block_k was {b})", "tiling the queries bounds one side only: the keys "
                                                      "must "
                        "come in blocks of block_k too, with the online softmax carrying m, l and acc")
        big = [n for n in shape if n > b and n > nq and n not in allowed]
        if big:
            raise Wrong("block-size-ignored", f"`aten.{op}` made a tensor of shape {shape}: a block of "
                                              f"{big[0]} "
                        f"keys, with block_k={b}", "slice k and v in blocks of block_k, the argument, not a "
                        "block size of your own")


# --- the check ------------------------------------------------------------------------------------------

def _draw(rng: random.Random, b: int, h: int, nq: int, nk: int, d: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(rng.randrange(2 ** 31))
    q = torch.randn(b, h, nq, d, generator=g) * 3 ** 0.5  # scores q·k/√d of std 3: softmax far from uniform
    k = torch.randn(b, h, nk, d, generator=g) * 3 ** 0.5 + torch.randn(b, h, 1, d, generator=g)
    return q, k, torch.randn(b, h, nk, d, generator=g)


# --- large scores: the cases that break the numerically naive forward ---------------------------------------

_LARGE = {  # case -> what its scores are like
    "high": "rows whose scores are all about +10⁴",
    "low": "rows whose scores are all about -10⁴",
    "steps": "keys in three runs: the middle one 3,000 below the others, so blocks' maxima differ by 3,000",
}
_LARGE_MISTAKES = {  # the cases a mistake fails -> (key, what, hint)
    frozenset({"high", "low"}): (
        "overflow", "O or L is NaN or inf when the scores are large (about ±10⁴): exp(s) overflowed to "
        "inf (float32's exp does above s ≈ 88), or underflowed to 0 in every term of a row",
        "subtract the running max before exp: p = exp(s - m_new[..., None]) is at most 1, and every row "
        "keeps a term equal to 1"),
    frozenset({"low"}): (
        "max-from-zero", "O or L is NaN or inf in rows whose scores are all far below 0 (about -10⁴), and "
        "right elsewhere: the running max started at 0, so every exp(s - 0) underflowed to 0 and O = 0 / 0",
        'start the running max at -inf (torch.full(..., float("-inf"))): then m is the largest score seen'),
    frozenset({"steps"}): (
        "max-not-running", "O or L is NaN or inf when a block's scores sit 3,000 below an earlier block's: "
        "the block's own max replaced the running max, so exp(m - m_block) = exp(3000) overflowed",
        "m_new = torch.maximum(m, s.amax(-1)): the running max never goes down, so exp(m - m_new) is at "
        "most 1"),
}


def _draw_large(rng: random.Random, kind: str, nq: int, nk: int) -> tuple[torch.Tensor, ...]:
    """q, k, v whose scores are exact in float32 (integer q and k, d = 16: the scale 1/4 is exact):
    s = a_i + b_j + e_ij, a per-row offset a, a per-key offset b, and a spread e of up to about ±10."""
    g = torch.Generator().manual_seed(rng.randrange(2 ** 31))
    bsz, h, d = 2, 2, 16
    q = torch.randint(-2, 3, (bsz, h, nq, d), generator=g).float()
    k = torch.randint(-2, 3, (bsz, h, nk, d), generator=g).float()
    big = torch.randint(8000, 12001, (bsz, h, nq), generator=g).float()
    rows = {"high": big, "low": -big, "steps": torch.randint(-5, 6, (bsz, h, nq), generator=g).float()}[kind]
    keys = torch.zeros(nk)
    if kind == "steps":
        keys[nk // 3:2 * nk // 3] = -3000.0
    q[..., 0], k[..., 0] = rows, 4.0  # q·k / 4 gets a_i from these ...
    q[..., 1], k[..., 1] = 4.0, keys  # ... and b_j from these
    return q, k, torch.randn(bsz, h, nk, d, generator=g)


def _large_ok(answer: Callable, case: tuple) -> tuple[bool, str]:
    """Whether O and L are right on a large-score case (within float32's precision at scores of 10⁴: 1 %
    for O, 0.05 for L); and what went wrong if not."""
    q, k, v, b = case
    o, lse, _ = _run(answer, q, k, v, b)
    want_o, want_l = _reference(q, k, v)
    bad = int((~torch.isfinite(o)).any(-1).sum() + (~torch.isfinite(lse)).sum())
    if bad:
        return False, f"{bad} row(s) of O or L NaN or inf"
    err = _o_error(o, want_o)
    l_err = (lse.double() - want_l).abs().max().item()
    # float32 is 1e-3 apart at 10⁴: a right answer that keeps a rounded L (or s·log2 e) there is off by up to
    # about 1e-3, while the mistakes these cases catch give NaN or inf
    if err > 1e-2 or l_err > 0.05:
        return False, f"O off by up to {err:.2g} (relative), L by up to {l_err:.2g}"
    return True, ""


def _check_large(answer: Callable, rng: random.Random) -> str:
    nq, nk = rng.choice(_QUERY_COUNTS), rng.choice(_KEY_COUNTS)
    b = rng.randrange(3, nk // 6 + 1)  # several blocks in each run of keys of the "steps" case
    failed, cases = {}, {}
    for kind in _LARGE:
        cases[kind] = _draw_large(rng, kind, nq, nk)
        ok, why = _large_ok(answer, (*cases[kind], b))
        if not ok:
            failed[kind] = why
    if not failed:
        return f"scores of ±10⁴ ({nk} keys in blocks of {b})"
    if frozenset(failed) in _LARGE_MISTAKES:
        key, what, hint = _LARGE_MISTAKES[frozenset(failed)]
        raise Wrong(key, what, hint)
    for kind, (q, k, v) in cases.items():  # a mistake of the tiling that these sizes happened to show
        if kind in failed:
            o = _run(answer, q, k, v, b)[0]
            if bool(torch.isfinite(o).all()):
                matched = _matching(o, q, k, v, b)
                if len(matched) == 1:
                    ((key, (what, hint)),) = matched.items()
                    raise Wrong(key, f"{what} ({nk} keys in blocks of {b}, with large scores)", hint)
    shown = "; ".join(f"{_LARGE[kind]}: {why}" for kind, why in failed.items())
    raise Wrong("large-scores", f"O and L are right on the scores above, wrong on large ones ({nk} keys in "
                f"blocks of {b}): {shown}", "keep every exp's argument at most 0: subtract the running max m "
                "(it starts at -inf and never goes down), and rescale by exp(m - m_new)")


# --- the contract and the differential search ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Case:
    bsz: int
    h: int
    nq: int
    nk: int
    d: int
    block_k: int
    dtype: torch.dtype
    data: int  # the seed of q, k and v

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.data)
        q = torch.randn(self.bsz, self.h, self.nq, self.d, generator=g) * 3 ** 0.5
        k = torch.randn(self.bsz, self.h, self.nk, self.d, generator=g) * 3 ** 0.5
        return q.to(self.dtype), k.to(self.dtype), torch.randn(self.bsz, self.h, self.nk, self.d,
                                                               generator=g).to(self.dtype)

    def __repr__(self) -> str:
        return (f"q ({self.bsz}, {self.h}, {self.nq}, {self.d}), k and v ({self.bsz}, {self.h}, {self.nk}, "
                f"{self.d}), {str(self.dtype).replace('torch.', '')}, block_k={self.block_k}")


def _draw_case(rng: random.Random) -> _Case:
    """One case: float32 (or float64, as gradcheck runs it), a batch or a head of 1, from 1 key on, and block
    sizes in every relation to N_k: 1, a divisor (whole blocks), one that leaves a last block of 1 key, a
    random one, N_k itself, and far more than N_k. At least 2 keys: with one, every mistake of the tiling
    gives O = v, and only L could tell them apart."""
    nk = rng.randint(2, 40)
    divisors = [b for b in range(2, nk + 1) if nk % b == 0]
    rest_one = [b for b in range(2, nk) if nk % b == 1]
    block = rng.choice([1, nk, nk + rng.randint(1, 8), rng.randint(2 * nk, 3 * nk + 2),
                        rng.choice(divisors or [nk]), rng.choice(rest_one or [nk]), rng.randint(1, nk)])
    return _Case(rng.choice((1, 2, 3)), rng.choice((1, 2, 3)), rng.randint(1, 13), nk,
                 rng.choice((1, 2, 3, 4, 8, 12, 16, 20)), block,
                 torch.float64 if rng.random() < 0.25 else torch.float32, rng.randrange(2 ** 31))


def _shrink(c: _Case) -> list[_Case]:
    changes = [{"bsz": 1}, {"h": 1}, {"nq": 1}, {"nq": c.nq // 2}, {"d": 1}, {"d": c.d // 2},
               {"nk": c.nk - 1}, {"nk": c.nk // 2}, {"nk": c.nk - c.block_k}, {"block_k": c.block_k // 2}]
    out = [dataclasses.replace(c, **change) for change in changes]
    return [x for x in out if x != c and min(x.bsz, x.h, x.nq, x.d, x.block_k) >= 1 and x.nk >= 2]


def _agree(got: tuple, want: tuple, c: _Case) -> str | None:
    q, k, v = c.tensors()
    o, lse = got
    want_o, want_l = _reference(q, k, v)
    tol = 1e-10 if c.dtype == torch.float64 else 1e-5
    err = _o_error(o, want_o)
    # and beyond rounding: O is a weighted mean of v's rows, so an error below tol x max|v| is the dtype's
    # rounding, which a relative error blows up where the mean nearly cancels (one query, d = 1)
    beyond = (o.double() - want_o).abs().max().item() > tol * v.double().abs().max().item()
    if err > tol and beyond:
        return f"O differs from softmax(q·kᵀ/√d)·v by {err:.3g} (relative; float64 reference)"
    if not torch.allclose(lse.double(), want_l, rtol=tol, atol=tol * 10):
        return f"L differs from the logsumexp by up to {(lse.double() - want_l).abs().max().item():.3g}"
    return None


def _name_case(answer: Callable, c: _Case, got: tuple, want: tuple) -> None:
    """The known mistake whose O (or L) is the answer's on this case (other block sizes telling apart two
    that coincide), or the line of `_diagnose_o` saying where O differs."""
    q, k, v = c.tensors()
    o, lse = got
    if _o_error(o, _reference(q, k, v)[0]) > (1e-10 if c.dtype == torch.float64 else 1e-5):
        others = tuple(x for x in (3, 4, c.nk - 1, c.nq, c.d, c.block_k + 1) if x != c.block_k and x >= 1)
        _diagnose_o(answer, o, q, k, v, c.block_k, None, others, first=True)
    for key, value, what, hint in _lse_mistakes(q, k):
        if torch.allclose(lse.double(), value, rtol=1e-4, atol=1e-4):
            raise Wrong(key, f"{what} (on {c})", hint)


def task() -> Task:
    """01-flash-forward's function for the contract and the search."""
    def arguments(c: _Case) -> dict[str, Any]:
        q, k, v = c.tensors()
        return {"q": q, "k": k, "v": v, "block_k": c.block_k}

    return Task(reference("01_attention/flash_forward.py", "flash_forward"), draw=_draw_case,
                arguments=arguments, agree=_agree, show=repr, shrink=_shrink,
                observe=lambda got, args: tuple(t.detach() for t in got), keywords=("block_k",),
                name="flash_forward", result="(O, L)",
                validate=lambda got, c: _shapes(got, c.tensors()[0]),
                guard=lambda: _Recorder(64, 1).mode(),  # an op budget: a loop that does not end is stopped
                hint="run your function on that input beside the plain softmax; print m, l and acc after "
                     "each block for one query row")


def flash_forward(answer: Callable, seed: int) -> str:
    """01-flash-forward: answer(q, k, v, block_k) -> (O, L), on inputs drawn from `seed`: values at several
    block sizes, no tensor holding more than block_k keys, inputs unchanged."""
    rng = random.Random(seed)
    bsz, h, d = rng.choice((1, 3)), rng.choice((1, 2, 3)), rng.choice(_HEAD_DIMS)
    nq, nk = rng.choice(_QUERY_COUNTS), rng.choice(_KEY_COUNTS)
    q, k, v = _draw(rng, bsz, h, nq, nk, d)
    small, mid, whole = rng.randrange(3, nq), rng.randrange(10, nk // 2), nk + rng.randrange(0, 9)
    the_task = task()
    contract(answer, the_task, _Case(bsz, h, nq, nk, d, mid, torch.float32, rng.randrange(2 ** 31)))
    one_block_ok = None
    try:  # one block first: if it is right, a wrong answer with several blocks is said to be so
        _check_values(answer, (q, k, v, whole), None)
        one_block_ok = True
    except Wrong as w:
        if w.mistake in ("uses-sdpa", "uses-course-code", "input-changed", "return-shape", "return-type",
                         "wrong-shape"):
            raise
        one_block_ok = False
    for b in (small, mid):  # several blocks, the last one partial (N_k is prime)
        others = tuple(x for x in (small, mid, 3, 4, nk - 1, nq, d) if x != b)  # nq, d: keys-from-q or -d
        rec = _check_values(answer, (q, k, v, b), one_block_ok, others)
        _check_tiles(rec, q, k, b)
    _check_values(answer, (q, k, v, whole), None)  # one block: the plain softmax (the error, if any)
    per = rng.choice((4, 5, 6))  # self-attention, N = per·m keys in whole blocks, more keys than d (a loop
    m = rng.choice([n for n in (3, 4, 5, 6, 7) if per * n > d][:3])  # over d must show wrong, not raise)
    qs, ks, vs = _draw(rng, bsz, h, per * m, per * m, d)
    _check_values(answer, (qs, ks, vs, per), True, tuple(x for x in (3, 5, 7, per + 1) if x != per))
    large = _check_large(answer, rng)
    searched = search(answer, the_task, rng, draws=40, name=functools.partial(_name_case, answer),
                      key="o-wrong")
    return (f"O and L agree with softmax(q·kᵀ/√d)·v and its logsumexp (float64 reference, relative error "
            f"< 1e-5) for N_q={nq} queries and N_k={nk} keys in blocks of {small}, {mid} and {whole}, and "
            f"N={per * m} in whole blocks of {per}, and with {large}; no op made a tensor holding more than "
            f"block_k keys; q, k, v unchanged; and as the course's solution on {searched} more drawn inputs "
            "(float32 and float64, from 1 key, blocks from 1 key to past N_k)")
