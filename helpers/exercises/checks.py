"""The check of each exercise (every lesson): run the learner's answer on small cases against the course's own
reference, and when it is wrong, find which mistake explains what came out (`Wrong(mistake, what, hint)`).

A diagnosis is made the way a teacher makes one: the answer's output is compared with what each typical
mistake would give (a missing rescale, clipping before unscaling, a sum instead of an average, ...); the
first that matches names the mistake. Every check runs on the CPU in about a second (the torchrun one
launches once), whatever the device the lesson runs on.
"""

from __future__ import annotations

import copy
import gc
import json
import math
import tempfile
import types
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from helpers.exercises.core import Wrong, learner_line

__all__ = ["roofline_regime", "flash_forward", "fp16_step", "largest_batch", "predict_time", "graph_break",
           "loss_with_breaks", "hidden_syncs", "train_loop_with_syncs", "bucketed_allreduce",
           "prefetch_allreduce", "keep_rule", "new_rung", "READS"]


def _close(a: float, b: float, rtol: float = 1e-6) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rtol, abs_tol=1e-30)


def _tuple(got: Any, n: int, names: str) -> tuple:
    if not isinstance(got, (tuple, list)) or len(got) != n:
        kind = type(got).__name__ + (f" of {len(got)}" if isinstance(got, (tuple, list)) else "")
        raise Wrong("return-shape", f"it returned a {kind}, not the {n} values ({names})",
                    f"end with `return {names}`")
    return tuple(got)


# --- 00: FLOPs, bytes, arithmetic intensity and regime -----------------------------------------------------

_OPS = {  # op -> (FLOPs, bytes moved in fp32, bytes of the output alone), each tensor read or written once
    "matmul": lambda n: (2 * n ** 3, 3 * n * n * 4, n * n * 4),  # (n, n) @ (n, n)
    "add": lambda n: (n, 3 * n * 4, n * 4),  # x + y, n elements each
    "matvec": lambda n: (2 * n * n, (n * n + 2 * n) * 4, n * 4),  # (n, n) @ (n,)
}
_HALF_FLOPS = {"matmul": lambda n: n ** 3, "matvec": lambda n: n * n, "add": lambda n: n / 2}


def _regime(intensity: float, ridge: float) -> str:
    return "compute-bound" if intensity >= ridge else "memory-bound"


def _check_costs(op: str, n: int, flops: float, bytes_: float, intensity: float) -> None:
    want_f, want_b, out_b = _OPS[op](n)
    if not _close(flops, want_f):
        if _close(flops, _HALF_FLOPS[op](n)):
            raise Wrong("flops-multiply-add", f"{op} at n={n}: {flops:g} FLOPs, half of {want_f:g}",
                        "a multiply-add is two FLOPs (2n³ for the matmul, 2n² for the matrix-vector product)")
        raise Wrong("flops", f"{op} at n={n}: {flops:g} FLOPs, expected {want_f:g}",
                    "count one FLOP per multiply and one per add")
    if not _close(bytes_, want_b):
        if _close(bytes_, want_b - out_b):
            raise Wrong("bytes-output", f"{op} at n={n}: {bytes_:g} bytes, which leaves out the output's "
                        f"{out_b:g}", "the output is written to memory: count its bytes too")
        for size in (2, 8):
            if _close(bytes_, want_b / 4 * size):
                raise Wrong("bytes-per-element", f"{op} at n={n}: {bytes_:g} bytes, {size} per element",
                            "an fp32 element is 4 bytes")
        raise Wrong("bytes", f"{op} at n={n}: {bytes_:g} bytes, expected {want_b:g}",
                    "count every input read once and the output written once, 4 bytes per fp32 element")
    if not _close(intensity, want_f / want_b):
        raise Wrong("intensity", f"{op} at n={n}: intensity {intensity:g}, expected {want_f / want_b:g}",
                    "arithmetic intensity = FLOPs / bytes moved")


def _check_regime(op: str, n: int, regime: Any, roof: Any, label: str) -> None:
    want_f, want_b, _ = _OPS[op](n)
    intensity, ridge = want_f / want_b, roof.matmul_flops["fp32"] / roof.bandwidth
    want = _regime(intensity, ridge)
    if regime == want:
        return
    if regime not in ("compute-bound", "memory-bound"):
        raise Wrong("regime-name", f"regime {regime!r}", 'answer "compute-bound" or "memory-bound"')
    if regime in (_regime(intensity, roof.matmul_flops["fp32"]), _regime(intensity, roof.bandwidth)):
        raise Wrong("ridge", f"{op} at n={n} ({intensity:.3g} FLOP/byte) on {label} (ridge {ridge:.3g}): "
                    f"{regime}", "compare the intensity with the ridge point, peak FLOP/s / bandwidth "
                    "(FLOP per byte), not with the peak or the bandwidth alone")
    raise Wrong("regime", f"{op} at n={n} ({intensity:.3g} FLOP/byte) on {label} (ridge {ridge:.3g} "
                f"FLOP/byte): {regime}, expected {want}",
                "at or above the ridge point an op is compute-bound, below it memory-bound")


def roofline_regime(answer: Callable, roof: Any) -> str:
    """00-roofline: answer(op, n, roof) -> (FLOPs, bytes, intensity, regime) for matmul, add and matvec."""
    from helpers.roofline import Roofline

    made_up = [Roofline("made-up device", {"fp32": 1e12}, bw, 0, 0) for bw in (1e13, 1e12, 1e10, 1e8)]
    roofs = [(roof, "this machine's roofline"), *((r, f"a made-up roofline, ridge {r.ridge_point():g}")
                                                    for r in made_up)]
    for op in _OPS:
        for n in (64, 1000, 4096):
            for r, label in roofs:
                got = _tuple(answer(op, n, r), 4, "flops, bytes_moved, intensity, regime")
                _check_costs(op, n, *got[:3])
                _check_regime(op, n, got[3], r, label)
    ridge = roof.matmul_flops["fp32"] / roof.bandwidth
    here = ", ".join(f"{op} {_regime(_OPS[op](4096)[0] / _OPS[op](4096)[1], ridge)}" for op in _OPS)
    return (f"FLOPs, bytes, intensity and regime of matmul, add and matvec at n = 64, 1000, 4096 agree, on "
            f"this machine's roofline (ridge {ridge:.3g} FLOP/byte) and on four made-up ones; at n=4096 "
            f"here: {here}")


# --- 01: FlashAttention's forward, (O, logsumexp) ----------------------------------------------------------

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
    o, lse = _tuple(answer(q, k, v, block_k=block_k), 2, "O, L")
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


# --- 02: one fp16 step with a GradScaler -----------------------------------------------------------------

class _Tiny(nn.Module):
    """Two linear layers and a loss: `model(**batch).loss`, as the course's models answer."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(8, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> Any:
        logits = self.lin2(torch.relu(self.lin1(x)))
        return types.SimpleNamespace(logits=logits, loss=F.cross_entropy(logits.float(), labels))


class _Log(list):
    """What the learner's step did, in order: ("forward", autocast on?), ("scale",), ("unscale", by), ..."""

    def names(self) -> list[str]:
        return [e[0] for e in self]


def _spies(log: _Log, lr: float, params: Iterable[nn.Parameter], init_scale: float) -> tuple[Any, Any]:
    class SpyScaler(torch.amp.GradScaler):
        in_step = False

        def scale(self, outputs: Any) -> Any:
            log.append(("scale",))
            return super().scale(outputs)

        def unscale_(self, optimizer: Any) -> None:
            log.append(("unscale", "scaler.step" if self.in_step else "you"))
            super().unscale_(optimizer)

        def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            log.append(("scaler.step",))
            self.in_step = True
            try:
                return super().step(optimizer, *args, **kwargs)
            finally:
                self.in_step = False

        def update(self, new_scale: Any = None) -> None:
            log.append(("update",))
            super().update(new_scale)

    scaler = SpyScaler("cpu", init_scale=init_scale)

    class SpySGD(torch.optim.SGD):
        def step(self, closure: Any = None) -> Any:
            log.append(("optimizer.step", scaler.in_step))
            return super().step(closure)

    return scaler, SpySGD(params, lr=lr)


_FP16 = dict(device_type="cpu", dtype=torch.float16)


def _fp16_case(answer: Callable, model0: nn.Module, batch: dict, max_norm: float, *, plant_inf: bool = False,
               stale: bool = False) -> tuple[_Log, nn.Module, Any, Any]:
    """Run the learner's step on a copy of model0, spied on; -> (log, model after, scaler, returned loss)."""
    model, log = copy.deepcopy(model0), _Log()
    model.register_forward_pre_hook(
        lambda m, a, kw: log.append(("forward", torch.is_autocast_enabled("cpu"))), with_kwargs=True)
    model.lin1.weight.register_hook(lambda g: log.append(("backward", torch.is_autocast_enabled("cpu"))))
    if plant_inf:  # one gradient overflows, as with a scale set too high
        model.lin2.bias.register_hook(lambda g: torch.full_like(g, float("inf")))
    if stale:  # gradients left over from an earlier step: the step must clear them
        for p in model.parameters():
            p.grad = torch.full_like(p, float("nan"))
    scaler, opt = _spies(log, 0.1, model.parameters(), init_scale=2.0 ** 12)
    loss = answer(model, batch, opt, scaler, torch.device("cpu"), max_norm=max_norm)
    return log, model, scaler, loss


def _check_fp16_order(log: _Log) -> None:
    names = log.names()
    forwards = [e[1] for e in log if e[0] == "forward"]
    if not forwards or not all(forwards):
        raise Wrong("no-autocast", "the forward pass did not run under autocast",
                    "wrap the forward pass and the loss in torch.autocast(device_type=device.type, "
                    "dtype=torch.float16)")
    if any(e[1] for e in log if e[0] == "backward"):
        raise Wrong("backward-in-autocast", "backward ran inside the autocast block",
                    "autocast wraps forward and loss only: close the `with` block before calling backward "
                    "(backward ops already run in the dtypes autocast chose for their forward ops)")
    if "scale" not in names:
        raise Wrong("no-scale", "the loss was not scaled before backward",
                    "scaler.scale(loss).backward(): small fp16 gradients would underflow to zero otherwise")
    steps = [e for e in log if e[0] == "optimizer.step"]
    if not steps:
        raise Wrong("no-step", "the optimizer never stepped", "scaler.step(optimizer) steps it")
    if not all(e[1] for e in steps):
        raise Wrong("direct-step", "optimizer.step() was called directly",
                    "call scaler.step(optimizer): it skips the step when a gradient is inf or NaN")
    if "update" not in names:
        raise Wrong("no-update", "scaler.update() was never called",
                    "after scaler.step(optimizer), scaler.update() lowers the scale after an overflow "
                    "(and raises it after many clean steps)")
    if names.index("update") < names.index("scaler.step"):
        raise Wrong("update-before-step", "scaler.update() ran before scaler.step()",
                    "update the scale after the step it judged")


def _clip(grads: list[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    return [g * min(1.0, max_norm / (norm.item() + 1e-6)) for g in grads]


def _diagnose_update(update: list[torch.Tensor], grads: list[torch.Tensor], max_norm: float,
                     scale: float) -> None:
    """Name the mistake whose update matches the learner's (updates are lr x the gradient SGD used)."""
    hypotheses = (
        (None, _clip(grads, max_norm)),
        ("no-clip", grads),
        ("clip-before-unscale", [g / scale for g in _clip([g * scale for g in grads], max_norm)]),
    )
    flat = torch.cat([u.flatten() for u in update])
    for mistake, g in hypotheses:
        want = torch.cat([x.flatten() for x in g]) * 0.1
        if torch.allclose(flat, want, rtol=2e-2, atol=1e-7 + 2e-2 * want.abs().max().item()):
            if mistake == "no-clip":
                raise Wrong(mistake, "the gradients were not clipped",
                            "after scaler.unscale_(optimizer), torch.nn.utils.clip_grad_norm_(model."
                            "parameters(), max_norm)")
            if mistake == "clip-before-unscale":
                raise Wrong(mistake, f"the update is {scale:.0f}x too small: the gradients were clipped "
                            "while still scaled", "clip the true gradients: scaler.unscale_(optimizer) "
                            "first, then clip_grad_norm_, then scaler.step(optimizer) (which will not "
                            "unscale twice)")
            return
    raise Wrong("update", "the parameters moved, but not by the clipped gradient times the learning rate",
                "zero the gradients, autocast the forward and loss, scale(loss).backward(), unscale_, clip, "
                "scaler.step, scaler.update: in that order")


def fp16_step(answer: Callable) -> str:
    """02-fp16-step: answer(model, batch, optimizer, scaler, device, max_norm) -> loss; a clean step, a step
    with stale gradients, and a step with a planted inf."""
    torch.manual_seed(0)
    model0 = _Tiny()
    batch = {"x": torch.randn(16, 8) * 4, "labels": torch.randint(4, (16,))}
    ref = copy.deepcopy(model0)
    with torch.autocast(**_FP16):
        ref_loss = ref(**batch).loss
    ref_loss.backward()  # unscaled: the true gradients of the fp16 forward
    grads = [p.grad.detach().clone() for p in ref.parameters()]
    max_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item() / 10  # clipping bites
    log, model, scaler, loss = _fp16_case(answer, model0, batch, max_norm)
    _check_fp16_order(log)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise Wrong("return-loss", f"it returned {type(loss).__name__}", "return the loss tensor")
    if _close(loss.item(), ref_loss.item() * scaler.get_scale(), 1e-2):
        raise Wrong("returned-scaled", "it returned the scaled loss", "return the loss itself, not "
                    "scaler.scale(loss)")
    update = [(p0 - p).detach() for p0, p in zip(model0.parameters(), model.parameters())]
    _diagnose_update(update, grads, max_norm, 2.0 ** 12)
    stale_log, stale_model, _, _ = _fp16_case(answer, model0, batch, max_norm, stale=True)
    if all(torch.equal(a, b) for a, b in zip(model0.parameters(), stale_model.parameters())):
        raise Wrong("no-zero-grad", "with gradients left over from before the step (NaN, on purpose), the "
                    "step was skipped", "start with optimizer.zero_grad(set_to_none=True): backward adds to "
                    "whatever .grad holds")
    inf_log, inf_model, inf_scaler, _ = _fp16_case(answer, model0, batch, max_norm, plant_inf=True)
    if not all(torch.equal(a, b) for a, b in zip(model0.parameters(), inf_model.parameters())):
        raise Wrong("inf-not-skipped", "a step with an inf gradient changed the parameters",
                    "let the scaler decide: scaler.step(optimizer) skips a step whose gradients hold inf/NaN")
    if inf_scaler.get_scale() >= 2.0 ** 12:
        raise Wrong("no-backoff", "after an inf gradient the scale did not come down",
                    "scaler.update() after scaler.step(optimizer) halves it")
    return ("forward and loss under fp16 autocast, backward outside it, scaled; unscaled before clipping; "
            "the update is the clipped gradient's; stale gradients cleared; a planted inf skipped the step "
            "and halved the scale")


# --- 03: the largest batch that fits -----------------------------------------------------------------------

class _Memory:
    """A simulated device: `capacity` units; a try uses n units until the tensors of that try are freed."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.live, self.calls = capacity, 0, []


class _Block:
    """The tensors of one try. `cycle`: they sit in a reference cycle, as a failed step's often do, so only
    the garbage collector frees them once nothing else holds them."""

    def __init__(self, mem: _Memory, n: int, cycle: bool) -> None:
        self.mem, self.n = mem, n
        self.me = self if cycle else None
        mem.live += n

    def __del__(self) -> None:
        self.mem.live -= self.n


def _sim_step(mem: _Memory, cycle: bool, poison: int | None = None) -> Callable[[int], None]:
    def step(n: int) -> None:  # a training step on a batch of n, on the simulated device
        mem.calls.append(n)
        if poison is not None and n >= poison:
            raise ValueError("simulated: a bug in the step itself, not an out-of-memory error")
        block = _Block(mem, n, cycle)
        if mem.live > mem.capacity:
            raise torch.cuda.OutOfMemoryError(f"simulated: tried to allocate {n} units; {mem.live - n} in "
                                              f"use, capacity {mem.capacity}")
        block.me = None  # a step that finished frees its tensors

    return step


def _search(answer: Callable, capacity: int, limit: int, cycle: bool,
            poison: int | None = None) -> tuple[Any, _Memory]:
    mem = _Memory(capacity)
    enabled = gc.isenabled()
    gc.disable()  # only the learner's gc.collect() may free cycles, so the result does not depend on luck
    gc.freeze()  # and it looks at the objects made since: milliseconds, not a scan of all of torch
    try:
        got = answer(_sim_step(mem, cycle, poison), limit)
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()
    return got, mem


def _diagnose_search(answer: Callable, capacity: int, limit: int, got: Any, want: int) -> None:
    got_plain, mem_plain = _search(answer, capacity, limit, cycle=False)
    if got_plain == want:
        raise Wrong("no-gc", f"with capacity {capacity} it returned {got}, not {want}: after the first "
                    "failure every try failed, the failed try's memory was never released",
                    "after an out-of-memory error, run gc.collect(): the failed step's tensors sit in "
                    "reference cycles that only the garbage collector frees (then torch.cuda.empty_cache())")
    if mem_plain.live > 0 or (isinstance(got_plain, int) and got_plain < want and mem_plain.calls
                              and max(mem_plain.calls) <= want):
        raise Wrong("kept-error", f"with capacity {capacity} it returned {got_plain}, not {want}: the "
                    "memory of a failed try stayed in use", "do not keep the exception (`last = err`, a "
                    "list of errors): its traceback holds the failed step's tensors")
    power = 2 ** int(math.log2(want)) if want >= 1 else 0
    if got_plain == power and power != want:
        raise Wrong("no-bisect", f"with capacity {capacity} it returned {got_plain}, not {want}",
                    "after the first failure, bisect between the last size that fitted and the first that "
                    "did not")
    if got_plain == want + 1:
        raise Wrong("off-by-one", f"with capacity {capacity} it returned {got_plain}, which does not fit",
                    "return the largest size that fitted, not the first that failed")
    raise Wrong("wrong-size", f"with capacity {capacity} and limit {limit} it returned {got_plain!r}, "
                f"expected {want}", "double from 1 while it fits (up to the limit), then bisect; 0 if 1 "
                "fails")


def largest_batch(answer: Callable) -> str:
    """03-largest-batch: answer(step_fn, limit) -> the largest n <= limit with step_fn(n) fitting."""
    tries = []
    for capacity, limit in ((37, 256), (300, 256), (0, 64), (64, 64), (1, 10), (1000, 1000)):
        got, mem = _search(answer, capacity, limit, cycle=True)
        bad = [n for n in mem.calls if not 1 <= n <= limit]
        if bad:
            raise Wrong("beyond-limit", f"it tried batch size {bad[0]} with limit {limit}",
                        "try sizes from 1 to the limit only")
        want = min(capacity, limit)
        if got != want:
            _diagnose_search(answer, capacity, limit, got, want)
        allowed = 2 * math.ceil(math.log2(limit)) + 2
        if len(mem.calls) > allowed:
            raise Wrong("linear-search", f"{len(mem.calls)} tries to find {want} (limit {limit})",
                        "double, then bisect: about 2·log2(limit) tries, each one a whole training step")
        tries.append(len(mem.calls))
    try:  # a step that fails for another reason than memory: its error must propagate
        _search(answer, 100, 64, cycle=False, poison=3)
    except ValueError:
        pass
    else:
        raise Wrong("swallowed-error", "a step that failed with a ValueError (a bug, not out of memory) was "
                    "treated as 'does not fit'", "catch torch.cuda.OutOfMemoryError only; let other errors "
                    "propagate")
    return (f"right for six capacities and limits on a simulated device (in {min(tries)} to {max(tries)} "
            "tries), memory of failed tries released, other errors propagated")


# --- 04: predict an op's regime and the time it needs at least --------------------------------------------

_REGIMES = ("compute", "memory", "overhead")  # the names of lesson 04 (helpers.regimes.REGIMES)
_TIME_CASES = (  # flops, bytes, peak FLOP/s, bandwidth bytes/s, overhead s per call
    (1e12, 1e9, 1e13, 1e12, 1e-5),  # 0.1 s compute
    (1e9, 1e11, 1e13, 1e12, 1e-5),  # 0.1 s memory
    (1e5, 1e5, 1e13, 1e12, 1e-5),  # 10 µs overhead
    (4e9, 4e6, 2e14, 3e12, 5e-6),  # 20 µs compute
    (1e6, 5e7, 2e14, 3e12, 5e-6),  # 17 µs memory
)


def _expected_regime(flops: float, bytes_: float, peak: float, bw: float, over: float) -> str:
    from helpers.regimes import classify  # lesson 04's own rule: the largest of the three times

    return classify(flops, bytes_, 1, peak_flops=peak, bandwidth=bw, overhead_s=over)


def _diagnose_time(case: str, seconds: float, terms: dict[str, float]) -> None:
    (compute, memory, over), want = terms.values(), max(terms.values())
    if _close(seconds, sum(terms.values()), 1e-6):
        raise Wrong("sum", f"{case}: {seconds:g} s is the sum of the three times",
                    "the roofline model's bound is the largest of the three, not their sum (which assumes "
                    "that nothing overlaps)")
    if _close(seconds, max(compute, memory), 1e-6) and over == want:
        raise Wrong("no-overhead", f"{case}: {seconds:g} s leaves out the overhead of {over:g} s",
                    "every call costs at least its fixed overhead (dispatch, launch): take it into the max")
    raise Wrong("seconds", f"{case}: {seconds:g} s, expected {want:g} s",
                "the time is at least the largest of FLOPs / peak FLOP/s, bytes / bandwidth and the "
                "overhead")


def predict_time(answer: Callable) -> str:
    """04-predict-time: answer(flops, bytes_moved, peak_flops, bandwidth, overhead_s) -> (regime, seconds)."""
    for flops, bytes_, peak, bw, over in _TIME_CASES:
        terms = dict(zip(_REGIMES, (flops / peak, bytes_ / bw, over)))
        want_regime = _expected_regime(flops, bytes_, peak, bw, over)
        regime, seconds = _tuple(answer(flops, bytes_, peak, bw, over), 2, "regime, seconds")
        if isinstance(regime, (int, float)) and isinstance(seconds, str):
            raise Wrong("order", "it returned (seconds, regime)", "return (regime, seconds)")
        if regime not in _REGIMES:
            raise Wrong("regime-name", f"regime {regime!r}", f"answer one of {_REGIMES}, lesson 04's names")
        case = f"{flops:g} FLOPs, {bytes_:g} bytes on {peak:g} FLOP/s, {bw:g} B/s, {over:g} s per call"
        if _close(seconds, max(flops / bw, bytes_ / peak, over), 1e-6) and \
                not _close(seconds, terms[want_regime], 1e-6):
            raise Wrong("units", f"{case}: {seconds:g} s divides FLOPs by bandwidth or bytes by FLOP/s",
                        "compute time = FLOPs / peak FLOP/s; memory time = bytes / bandwidth")
        if not _close(seconds, terms[want_regime], 1e-6):
            _diagnose_time(case, seconds, terms)
        if regime != want_regime:
            raise Wrong("regime", f"{case}: {regime}, expected {want_regime}",
                        "the regime is the term that sets the bound: the largest of the three")
    return f"regime and time bound right in {len(_TIME_CASES)} cases: compute-, memory- and overhead-bound"


# --- 05: remove the graph breaks -------------------------------------------------------------------------

def loss_with_breaks(model: nn.Module, batch: Mapping[str, torch.Tensor], max_loss: float) -> torch.Tensor:
    """The training loss, scaled down to max_loss when it is larger (a guard some training loops use)."""
    loss = model(**batch).loss
    if loss.item() > max_loss:  # .item() copies the value to Python and `if` branches on it: graph break
        print(f"loss {loss.item():.2f} above {max_loss}: scaled down")  # print: another graph break
        loss = loss * (max_loss / loss.item())
    return loss


def _loss_and_grads(fn: Callable, model: nn.Module, batch: dict, max_loss: float) -> tuple[Any, list]:
    model.zero_grad(set_to_none=True)
    out = fn(model, batch, max_loss)
    if not isinstance(out, torch.Tensor) or out.numel() != 1:
        raise Wrong("return-loss", f"it returned {type(out).__name__}",
                    "return the loss, a one-element tensor")
    out.backward()
    return out.detach(), [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                          for p in model.parameters()]


def _tiny_transformer() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from helpers.models import SmallTransformer, TransformerConfig

    torch.manual_seed(0)
    model = SmallTransformer(TransformerConfig(vocab_size=64, d_model=32, n_heads=2, n_layers=1, max_len=16))
    ids = torch.randint(64, (2, 8), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "labels": ids.roll(1, dims=1)}


def _compare_losses(answer: Callable, model: nn.Module, batch: dict, plain: float) -> None:
    import contextlib
    import io

    for max_loss in (plain / 2, plain * 2):  # the guard scales the first down, leaves the second alone
        with contextlib.redirect_stdout(io.StringIO()):  # the given function prints
            want, want_g = _loss_and_grads(loss_with_breaks, model, batch, max_loss)
        got, got_g = _loss_and_grads(answer, model, batch, max_loss)
        scaled = max_loss < plain
        if not torch.allclose(got, want, rtol=1e-5):
            if torch.allclose(got, torch.tensor(plain), rtol=1e-5):
                raise Wrong("branch-dropped", f"with max_loss={max_loss:.3g} below the loss it returned the "
                            "loss unscaled", "keep the guard, as a tensor operation: "
                            "torch.where(loss > max_loss, <scaled loss>, loss)")
            raise Wrong("loss-differs", f"with max_loss={max_loss:.3g} ({'below' if scaled else 'above'} the "
                        f"loss {plain:.3g}) it returned {got.item():.4g}, the given function "
                        f"{want.item():.4g}",
                        "the value must stay the same: max_loss when the loss is larger, else the loss")
        if not all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(got_g, want_g)):
            raise Wrong("gradient", f"with max_loss={max_loss:.3g} the loss is right, its gradients are not",
                        "loss.item() was a constant for autograd: scale by max_loss / loss.detach(), not by "
                        "max_loss / loss (whose gradient is zero)")


def graph_break(answer: Callable) -> str:
    """05-graph-break: answer(model, batch, max_loss) -> the loss of loss_with_breaks, in one graph."""
    model, batch = _tiny_transformer()
    with torch.no_grad():
        plain = model(**batch).loss.item()
    _compare_losses(answer, model, batch, plain)
    from helpers.compat import explain_graphs

    explained = explain_graphs(answer, model, batch, plain / 2)
    breaks = explained.break_reasons
    if breaks or explained.graph_count != 1:
        first = breaks[0] if breaks else None
        where = f" at `{first.user_stack[-1].line}`" if first is not None and first.user_stack else ""
        reason = first.reason.splitlines()[0] if first is not None else ""
        raise Wrong("graph-break", f"{explained.graph_count} graph(s), {len(breaks)} break(s); the "
                    f"first{where}: {reason}", "no .item(), no `if` on a tensor's value (torch.where "
                    "instead), no print: torch._dynamo.explain(your_function)(model, batch, max_loss) "
                    "lists what is left")
    return ("the same loss and gradients as the given function, above and below max_loss, in one graph with "
            "no break (torch._dynamo.explain)")


# --- 06: a training loop without hidden syncs -------------------------------------------------------------

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "__format__",
         "__repr__", "__str__")  # Tensor methods that bring a value to the host: a wait for the device


def train_loop_with_syncs(train_step: Callable, batches: Iterable) -> list[float]:
    """Train on every batch; -> the losses as Python floats. Stops at the first loss that is not finite."""
    losses = []
    for i, batch in enumerate(batches):
        loss = train_step(batch)  # on the device, which may still be computing it
        if not torch.isfinite(loss):  # `if` on a device value: the CPU waits for the device
            raise FloatingPointError(f"step {i}: the loss is {loss.item()}")
        losses.append(loss.item())  # .item(): the CPU waits again
    return losses


def _reads_of(answer: Callable, train_step: Callable, batches: list) -> tuple[Any, list[tuple[str, str]]]:
    """Run the loop, counting every read of a tensor's value: (result, [(method, the learner's line)])."""
    from torch.overrides import TorchFunctionMode

    reads: list[tuple[str, str]] = []

    class CountReads(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = getattr(func, "__name__", "")
            if name in READS:
                reads.append((name, learner_line(answer)))
            return func(*args, **(kwargs or {}))

    with CountReads():
        result = answer(train_step, batches)
    return result, reads


def _sync_setup(n: int, nan_at: int | None = None) -> tuple[Callable, list]:
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    batches = [{"x": torch.randn(4, 8, generator=g), "y": torch.randint(3, (4,), generator=g)}
               for _ in range(n)]
    if nan_at is not None:
        batches[nan_at]["x"][0, 0] = float("nan")

    def train_step(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        loss = F.cross_entropy(model(batch["x"]), batch["y"])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return train_step, batches


def hidden_syncs(answer: Callable) -> str:
    """06-hidden-syncs: answer(train_step, batches) -> losses (floats), no read of a device value per step."""
    want = train_loop_with_syncs(*_sync_setup(3))
    got, reads3 = _reads_of(answer, *_sync_setup(3))
    if isinstance(got, torch.Tensor) or (isinstance(got, list) and got and isinstance(got[0], torch.Tensor)):
        raise Wrong("not-floats", "it returned tensors", "return Python floats: stack the losses and read "
                    "them once, at the end (.tolist())")
    same = (isinstance(got, list) and len(got) == len(want)
            and all(_close(a, b, 1e-5) for a, b in zip(got, want)))
    if not same:
        raise Wrong("losses-differ", f"it returned {got!r}, the given loop {want!r}",
                    "train on every batch in order and return every loss, as floats")
    _, reads6 = _reads_of(answer, *_sync_setup(6))
    if len(reads6) > len(reads3):
        per_step = (len(reads6) - len(reads3)) / 3
        method, line = reads6[-1]
        raise Wrong("per-step-sync", f"{per_step:g} read(s) of a device value per step remain; the last: "
                    f"Tensor.{method} at `{line}`", "keep each loss on the device (append the tensor) and "
                    "read them all once after the loop; check for NaN/inf once too, on the stacked losses")
    try:
        answer(*_sync_setup(4, nan_at=1))
    except FloatingPointError:
        pass
    else:
        raise Wrong("nan-unnoticed", "a NaN loss (planted in step 1) went unnoticed",
                    "after the loop: if not torch.isfinite(stacked).all(), raise FloatingPointError")
    given = len(_reads_of(train_loop_with_syncs, *_sync_setup(3))[1])
    return (f"same losses as the given loop; {len(reads3)} read(s) of a device value in all, whether 3 or 6 "
            f"steps (the given loop: {given} for 3 steps, 2 per step); a planted NaN raised "
            "FloatingPointError")


# --- 07: bucketed all-reduce, overlapped with backward (torchrun, 2 processes) ----------------------------

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "exercise_ddp.py"
_ALLREDUCE_RESULTS: dict[str, dict[str, Any]] = {}  # source text -> what the workers measured


def _source_of(fn: Callable) -> str:
    import inspect
    import textwrap

    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as err:
        raise ValueError(f"cannot read the source of {fn!r} ({err}): define it in a notebook cell or a "
                         "file") from None


def prefetch_allreduce(answers: Iterable[Callable], timeout_s: float = 180.0) -> None:
    """Run several answers in ONE torchrun launch (2 gloo processes) and keep what each did, so that checking
    them afterwards launches nothing (tests check the solution and its mutants this way)."""
    from helpers.distributed import launch

    todo = {}
    for fn in answers:
        source = _source_of(fn)
        if source not in _ALLREDUCE_RESULTS:
            todo[source] = fn.__name__
    if not todo:
        return
    with tempfile.TemporaryDirectory(prefix="course-exercise-ddp-") as tmp:
        cands, out = Path(tmp) / "candidates.json", Path(tmp) / "results.json"
        cands.write_text(json.dumps([{"name": f"c{i}", "source": s, "function": f}
                                     for i, (s, f) in enumerate(todo.items())]))
        launch(_SCRIPT, ["--candidates", str(cands), "--out", str(out)], nproc_per_node=2,
               env={"OMP_NUM_THREADS": "1"}, timeout_s=timeout_s, echo=False)
        results = json.loads(out.read_text())
    for source, result in zip(todo, results):
        _ALLREDUCE_RESULTS[source] = result


def _diagnose_allreduce(r: dict[str, Any]) -> None:
    """Name the mistake from what the workers saw; the first step's gradients first (a later error in the run
    often follows from them), then errors, then how the all-reduces were made."""
    if "unreduced" in r:
        _diagnose_grads(r)
    if r["status"] == "error":
        raise Wrong("raised", f"your function raised in the worker processes: {r['error']}",
                    "it runs in each process with `torch` and `dist` (torch.distributed) imported: write "
                    "every other import and helper inside the function")


def _diagnose_grads(r: dict[str, Any]) -> None:
    if r["unreduced"]:
        raise Wrong("last-bucket", f"the gradients of {', '.join(r['unreduced'])} were never averaged (each "
                    "process kept its own)", "finish() must also reduce the last bucket, the one that never "
                    "filled up, before waiting for every all-reduce")
    if abs(r["grad_norm_ratio"] - r["world_size"]) < 0.05 * r["world_size"]:
        raise Wrong("summed", f"the gradients are {r['grad_norm_ratio']:.2f}x one process's: summed, not "
                    "averaged", "all_reduce sums: divide by dist.get_world_size()")
    if r["max_grad_err"] > 1e-5:
        raise Wrong("grads-differ", f"the averaged gradients differ from one process's on the whole batch "
                    f"(relative error {r['max_grad_err']:.2g})", "each bucket: flatten its gradients into "
                    "one tensor, all-reduce, divide by the world size, copy the pieces back into each "
                    "param.grad")


def _diagnose_calls(r: dict[str, Any]) -> None:
    if r["during_backward"] == 0:
        raise Wrong("no-overlap", "no all-reduce started before backward finished",
                    "start a bucket's all-reduce from the hook that fills it "
                    "(param.register_post_accumulate_grad_hook), while backward computes the earlier layers")
    if r["blocking_during_backward"]:
        raise Wrong("blocking", f"{r['blocking_during_backward']} all-reduce(s) during backward blocked it",
                    "dist.all_reduce(flat, async_op=True) returns a handle at once; wait for the handles in "
                    "finish()")
    if r["calls_per_step"] >= r["n_params"]:
        raise Wrong("not-bucketed", f"{r['calls_per_step']} all-reduce calls per step for {r['n_params']} "
                    "parameters", "group gradients into buckets of bucket_cap_bytes: one call per bucket")


def bucketed_allreduce(answer: Callable) -> str:
    """07-bucketed-allreduce: answer(model, bucket_cap_bytes) -> finish; run under torchrun, 2 processes."""
    from helpers.distributed import LaunchError

    try:
        prefetch_allreduce([answer])
    except LaunchError as err:
        raise Wrong("launch-failed", f"torchrun failed: {str(err).splitlines()[0]}",
                    "every process must make the same all-reduce calls in the same order, or they wait for "
                    "each other forever") from None
    r = _ALLREDUCE_RESULTS[_source_of(answer)]
    if r["status"] == "not attempted":
        raise NotImplementedError  # reported as not attempted by core
    _diagnose_allreduce(r)
    _diagnose_calls(r)
    return (f"2 processes under torchrun: gradients equal one process's on the whole batch (relative error "
            f"{r['max_grad_err']:.1g}), {r['calls_per_step']} all-reduces per step for {r['n_params']} "
            f"parameters, {r['during_backward']} started during backward (async), parameters after "
            f"{r['steps']} SGD steps equal")


# --- 08: the greedy keep rule; a new rung -------------------------------------------------------------------

def _timing(median_s: float, iqr_s: float) -> Any:
    from helpers.timing import Timing

    return Timing("arm", median_s, iqr_s, runs=5, calls_per_run=1)


_KEEP_CASES = (  # (candidate median, IQR), (best median, IQR)
    ((1.0, 0.01), (1.5, 0.01)),  # clearly faster: keep
    ((1.0, 0.2), (1.1, 0.01)),  # faster, within the candidate's spread: drop
    ((1.0, 0.01), (1.1, 0.22)),  # faster, within the best arm's spread: drop
    ((1.2, 0.01), (1.0, 0.01)),  # slower: drop
    ((1.0, 0.0), (1.0, 0.0)),  # the same: drop
    ((0.5, 0.1), (1.0, 0.05)),  # twice as fast, noisy: keep
    ((0.01, 0.002), (0.0115, 0.0001)),  # small times: the spread must be relative, drop
    ((1.0, 0.05), (1.3, 0.1)),  # faster than both spreads together: keep
)


def _keep_hypotheses(c: tuple[float, float], b: tuple[float, float]) -> dict[str | None, bool]:
    (cm, ci), (bm, bi) = c, b
    ratio, rel = bm / cm, max(ci / cm, bi / bm)
    return {None: ratio > 1 + rel, "inverted": cm / bm > 1 + rel,
            "candidate-spread-only": ratio > 1 + ci / cm,
            "best-spread-only": ratio > 1 + bi / bm, "absolute-spread": ratio > 1 + max(ci, bi),
            "no-spread": ratio > 1, "sum-of-spreads": ratio > 1 + ci / cm + bi / bm}


_KEEP_HINTS = {
    "inverted": "the ratio is upside down: best median / candidate median > 1 means the candidate is faster",
    "candidate-spread-only": "the threshold takes the larger relative spread of *both* arms",
    "best-spread-only": "the threshold takes the larger relative spread of *both* arms",
    "absolute-spread": "the spread must be relative: IQR / median, a fraction like the ratio's excess over 1",
    "no-spread": "faster by less than the noise is not faster: ratio > 1 + the larger relative IQR",
    "sum-of-spreads": "the rule takes the larger of the two relative spreads, not their sum",
}


def keep_rule(answer: Callable) -> str:
    """08-keep-rule: answer(candidate, best) -> keep? (a bool, or an object with `.keep`)."""
    got = []
    for c, b in _KEEP_CASES:
        out = answer(_timing(*c), _timing(*b))
        out = getattr(out, "keep", out)
        if not isinstance(out, (bool, torch.Tensor)) and type(out).__name__ != "bool_":
            raise Wrong("return-type", f"it returned {type(out).__name__}", "return True (keep) or False")
        got.append(bool(out))
    hyps = [_keep_hypotheses(c, b) for c, b in _KEEP_CASES]
    if got == [h[None] for h in hyps]:
        return f"keeps and drops as ladder.keeps does in {len(_KEEP_CASES)} cases (noise of both arms)"
    for mistake, hint in _KEEP_HINTS.items():
        if got == [h[mistake] for h in hyps]:
            raise Wrong(mistake, "its decisions differ from the rule's", hint)
    i = next(i for i, (g, h) in enumerate(zip(got, hyps)) if g != h[None])
    (cm, ci), (bm, bi) = _KEEP_CASES[i]
    raise Wrong("keep-rule", f"candidate {cm} s (IQR {ci}) vs best {bm} s (IQR {bi}): it said "
                f"{'keep' if got[i] else 'drop'}", "keep when best.median_s / candidate.median_s > 1 + "
                "max(candidate.iqr_s / candidate.median_s, best.iqr_s / best.median_s)")


def new_rung(answer: Any) -> str:
    """08-new-rung: answer is a helpers.ladder.Rung the ladder does not have yet."""
    from helpers import ladder

    if not isinstance(answer, ladder.Rung):
        raise Wrong("not-a-rung", f"NEW_RUNG is a {type(answer).__name__}",
                    "ladder.Rung(name, switch, value, claim): switch is a RunSpec field")
    try:
        stack = answer.on(ladder.BASELINE)
    except (ValueError, TypeError) as err:
        raise Wrong("bad-value", f"RunSpec refuses it: {err}",
                    "pick a value RunSpec accepts for that switch") from None
    same = [r.name for r in ladder.RUNGS if (r.switch, r.value) == (answer.switch, answer.value)]
    if same:
        raise Wrong("duplicate", f"the ladder has it already: {same[0]!r}",
                    "choose a switch value no rung sets (RunSpec's fields and their choices)")
    if stack == ladder.BASELINE:
        raise Wrong("no-change", "it sets the baseline's own value: nothing changes",
                    "a rung changes one switch away from the baseline")
    if not answer.claim.strip():
        raise Wrong("no-claim", "its claim is empty", "say what is commonly claimed for it: the ladder "
                    "prints it next to what this machine measured")
    return (f"{answer.name!r} sets RunSpec.{answer.switch}={answer.value!r}, which no rung sets; add it with "
            "ladder.climb_stacks(..., rungs=(*ladder.RUNGS, NEW_RUNG))")
