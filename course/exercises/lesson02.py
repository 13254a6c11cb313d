"""The check of exercise 02-fp16-step (lesson 02, `02_mixed_precision`): one fp16 training step with a
GradScaler, run on the CPU with a spied scaler and optimizer, on a model, batch, loss scale and clipping norm
drawn per run: the order of autocast (fp16, forward and loss only), scale, unscale, clip, step and update; the
scaler passed in used (not one of the step's own), the optimizer stepped once; the update's size (clipped
after unscaling, matched to what each mistake's update would be: no clipping, clipping before unscaling, a
norm of 1.0 whatever `max_norm`, each parameter clipped alone); a step whose `max_norm` is above the
gradient's norm, which must not be clipped at all (a step that always scales the gradient to `max_norm` passes
wherever clipping bites); stale gradients cleared (at the start of the step, or at its end); a planted inf
gradient skipped and the scale halved.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import random
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from course.exercises.contract import Task, contract, reference, search
from course.exercises.core import Wrong, close

__all__ = ["fp16_step", "task"]


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
            log.append(("optimizer.step", scaler.in_step or _foreign_scaler(scaler)))
            return super().step(closure)

    return scaler, SpySGD(params, lr=lr)


def _foreign_scaler(ours: Any) -> str | bool:
    """"foreign" when a GradScaler other than `ours` is stepping the optimizer now (one the step made), else
    False."""
    frame = inspect.currentframe().f_back
    while frame is not None:
        if frame.f_code is torch.amp.GradScaler.step.__code__ and frame.f_locals.get("self") is not ours:
            return "foreign"
        frame = frame.f_back
    return False


_FP16 = dict(device_type="cpu", dtype=torch.float16)


def _fp16_case(answer: Callable, model0: nn.Module, batch: dict, max_norm: float, init_scale: float, *,
               plant_inf: bool = False, stale: bool = False) -> tuple[_Log, nn.Module, Any, Any]:
    """Run the learner's step on a copy of model0, spied on; -> (log, model after, scaler, returned loss)."""
    model, log = copy.deepcopy(model0), _Log()
    model.register_forward_pre_hook(
        lambda m, a, kw: log.append(("forward", torch.is_autocast_enabled("cpu"),
                                     torch.get_autocast_dtype("cpu"))), with_kwargs=True)
    model.lin1.weight.register_hook(lambda g: log.append(("backward", torch.is_autocast_enabled("cpu"))))
    if plant_inf:  # one gradient overflows, as with a scale set too high
        model.lin2.bias.register_hook(lambda g: torch.full_like(g, float("inf")))
    if stale:  # gradients left over from an earlier step: the step must clear them
        for p in model.parameters():
            p.grad = torch.full_like(p, float("nan"))
    scaler, opt = _spies(log, 0.1, model.parameters(), init_scale=init_scale)
    made = torch.amp.GradScaler.__init__

    def note_new_scaler(self: Any, *args: Any, **kwargs: Any) -> None:  # a scaler the step makes itself
        log.append(("new-scaler",))
        made(self, *args, **kwargs)

    torch.amp.GradScaler.__init__ = note_new_scaler  # type: ignore[method-assign]
    try:
        loss = answer(model, batch, opt, scaler, torch.device("cpu"), max_norm=max_norm)
    except AssertionError as err:  # the scaler's own: unscale_ or step before any scale()
        if "scale" not in log.names() and "scale" in str(err):
            raise Wrong("no-scale", "the loss was never scaled (scaler.scale was not called), so the scaler "
                        f"refused to go on: {str(err).split('.')[0]}", "scaler.scale(loss).backward(): small "
                        "fp16 gradients would underflow to zero otherwise") from None
        raise
    finally:
        torch.amp.GradScaler.__init__ = made  # type: ignore[method-assign]
    return log, model, scaler, loss


def _check_fp16_order(log: _Log) -> None:
    names = log.names()
    forwards = [e[1] for e in log if e[0] == "forward"]
    if not forwards or not all(forwards):
        raise Wrong("no-autocast", "the forward pass did not run under autocast",
                    "wrap the forward pass and the loss in torch.autocast(device_type=device.type, "
                    "dtype=torch.float16)")
    dtypes = {e[2] for e in log if e[0] == "forward"}
    if dtypes != {torch.float16}:
        raise Wrong("not-fp16", f"the forward pass ran under {', '.join(map(str, dtypes))} autocast",
                    "this is the fp16 step: torch.autocast(device_type=device.type, dtype=torch.float16) "
                    "(bf16 "
                    "needs no GradScaler)")
    if any(e[1] for e in log if e[0] == "backward"):
        raise Wrong("backward-in-autocast", "backward ran inside the autocast block",
                    "autocast wraps forward and loss only: close the `with` block before calling backward "
                    "(backward ops already run in the dtypes autocast chose for their forward ops)")
    steps = [e for e in log if e[0] == "optimizer.step"]
    if "new-scaler" in names or any(e[1] == "foreign" for e in steps):
        raise Wrong("own-scaler", "the optimizer was stepped by a GradScaler the step made itself, not by "
                    "the `scaler` passed in", "use the scaler argument: its loss scale carries from step to "
                    "step (halved after an overflow, grown after clean steps); a new one each step starts "
                    "over every time")
    if "scale" not in names:
        raise Wrong("no-scale", "the loss was not scaled before backward",
                    "scaler.scale(loss).backward(): small fp16 gradients would underflow to zero otherwise")
    if not steps:
        raise Wrong("no-step", "the optimizer never stepped", "scaler.step(optimizer) steps it")
    if len(steps) > 1 and any(e[1] for e in steps):
        raise Wrong("stepped-twice", f"the optimizer stepped {len(steps)} times in one step: through "
                    "scaler.step(optimizer) and by optimizer.step() as well", "scaler.step(optimizer) steps "
                    "it (or skips the step after an overflow): remove the optimizer.step() call")
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
                     scale: float, clipped_elsewhere: bool = False) -> None:
    """Name the mistake whose update matches the learner's (updates are lr x the gradient SGD used).
    `clipped_elsewhere`: the answer clipped right on the check's first step (the search found this case), so
    an unclipped update here is a max_norm it did not honour, not a missing clip."""
    flat = torch.cat([u.flatten() for u in update])
    clipped = torch.cat([g.flatten() for g in _clip(grads, max_norm)]) * 0.1
    if torch.allclose(flat, clipped, rtol=2e-2, atol=1e-7 + 2e-2 * clipped.abs().max().item()):
        return
    # before the hypotheses: a zero update is within their tolerance of one that is tiny (a scale of 2**14)
    if not bool(flat.any()):
        raise Wrong("update", "no parameter moved: the step changed nothing (the gradients were gone, or the "
                    "step skipped)", "zero the gradients first, then autocast the forward and loss, "
                    "scale(loss).backward(), unscale_, clip, scaler.step, scaler.update: in that order")
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item()
    by_value = torch.cat([g.clamp(-max_norm, max_norm).flatten() for g in grads]) * 0.1
    unclipped = torch.cat([g.flatten() for g in grads]) * 0.1
    bites = not torch.allclose(by_value, unclipped)  # the check's own step: some element above max_norm
    if bites and torch.allclose(flat, by_value, rtol=2e-2, atol=1e-7 + 2e-2 * by_value.abs().max().item()):
        raise Wrong("update", f"the update is the gradient with each element clipped to ±{max_norm:.3g} (as "
                    "clip_grad_value_ does), not the gradient scaled to a norm of max_norm",
                    "clip the norm of all the gradients together, as one vector: "
                    "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)")
    if clipped_elsewhere and torch.allclose(flat, unclipped, rtol=2e-2,
                                            atol=1e-7 + 2e-2 * unclipped.abs().max().item()):
        raise Wrong("update", f"with max_norm {max_norm:.3g} below the gradient's norm ({norm:.3g}) the "
                    "update is the unclipped gradient's, though the check's first step was clipped right: "
                    "this max_norm was not honoured", "clip to the max_norm you are given, whatever its "
                    "value: clip_grad_norm_(model.parameters(), max_norm), no floor or ceiling of your own")
    hypotheses = [
        (None, _clip(grads, max_norm)),
        ("no-clip", grads),
        ("clip-before-unscale", [g / scale for g in _clip([g * scale for g in grads], max_norm)]),
        ("clip-per-parameter", [_clip([g], max_norm)[0] for g in grads]),
    ]
    if abs(max_norm - 1.0) > 0.1:  # a norm of 1.0 whatever max_norm: tutorials' usual value
        hypotheses.append(("clip-default-norm", _clip(grads, 1.0)))
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
            if mistake == "clip-per-parameter":
                raise Wrong(mistake, "each parameter's gradient was clipped to max_norm on its own",
                            "clip the norm of all the gradients together, as one vector: "
                            "clip_grad_norm_(model.parameters(), max_norm)")
            if mistake == "clip-default-norm":
                raise Wrong(mistake, f"the gradients were clipped to a norm of 1.0, not max_norm = "
                            f"{max_norm:.3g}", "pass the step's max_norm: "
                            "clip_grad_norm_(model.parameters(), max_norm)")
            return
    want = torch.cat([x.flatten() for x in hypotheses[0][1]]) * 0.1
    ratio = (flat.norm() / want.norm()).item()
    cosine = (flat @ want / (flat.norm() * want.norm()).clamp_min(1e-30)).item()
    raise Wrong("update", f"the update's norm is {ratio:.3g}x that of the learning rate times the clipped "
                f"true gradient, in a direction {cosine:.2f} cosine-similar to it",
                "zero the gradients, autocast the forward and loss, scale(loss).backward(), unscale_, clip, "
                "scaler.step, scaler.update: in that order")


def _check_unclipped(update: list[torch.Tensor], grads: list[torch.Tensor], max_norm: float,
                     norm: float) -> None:
    """With max_norm above the gradient's norm, the update is the learning rate times the gradient itself."""
    flat = torch.cat([u.flatten() for u in update])
    for target, g in ((None, grads), ("normalised", [x * (max_norm / norm) for x in grads]),
                      ("default", _clip(grads, 1.0))):
        want = torch.cat([x.flatten() for x in g]) * 0.1
        if torch.allclose(flat, want, rtol=2e-2, atol=1e-7 + 2e-2 * want.abs().max().item()):
            if target is None:
                return
            if target == "default":
                raise Wrong("clip-default-norm", f"the gradients were clipped to a norm of 1.0, not "
                            f"max_norm = {max_norm:.3g}", "pass the step's max_norm: "
                            "clip_grad_norm_(model.parameters(), max_norm)")
            raise Wrong("normalised-not-clipped", f"with max_norm = {max_norm:.3g} above the gradient's norm "
                        f"({norm:.3g}) the gradients were scaled up to max_norm: they were normalised, not "
                        "clipped", "clipping only shrinks: scale by min(1, max_norm / norm), or call "
                        "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)")
    want = torch.cat([x.flatten() for x in grads]) * 0.1
    ratio = (flat.norm() / want.norm()).item()
    raise Wrong("update", f"with max_norm = {max_norm:.3g} above the gradient's norm ({norm:.3g}), where "
                f"clipping changes nothing, the update's norm is {ratio:.3g}x the learning rate times the "
                "gradient", "clip only when the norm is above max_norm: clip_grad_norm_(model.parameters(), "
                "max_norm) after scaler.unscale_(optimizer)")


# --- the contract and the differential search ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Case:
    """One step's inputs, rebuilt the same from their seeds on every call."""

    weights: int
    data: int
    rows: int
    spread: float  # the inputs' scale: the gradient's norm grows with it
    init_scale: float
    max_norm: float
    stale: bool  # NaN gradients left in .grad from before the step
    inf: bool  # one gradient overflows to inf

    def build(self) -> dict[str, Any]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.weights)
            model = _Tiny()
        g = torch.Generator().manual_seed(self.data)
        batch = {"x": torch.randn(self.rows, 8, generator=g) * self.spread,
                 "labels": torch.randint(4, (self.rows,), generator=g)}
        if self.stale:
            for p in model.parameters():
                p.grad = torch.full_like(p, float("nan"))
        if self.inf:
            model.lin2.bias.register_hook(lambda grad: torch.full_like(grad, float("inf")))
        return {"model": model, "batch": batch, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
                "scaler": torch.amp.GradScaler("cpu", init_scale=self.init_scale),
                "device": torch.device("cpu"), "max_norm": self.max_norm}

    def __repr__(self) -> str:
        extra = "".join((", stale NaN gradients in .grad" if self.stale else "",
                         ", an inf in one gradient" if self.inf else ""))
        return (f"a batch of {self.rows} (inputs × {self.spread:.3g}), loss scale {self.init_scale:g}, "
                f"max_norm {self.max_norm:.4g}{extra}")


def _draw_case(rng: random.Random) -> _Case:
    """One step: max_norm from far below the gradient's norm to far above it (below 0.5 and near 1.0
    included), an inf in a gradient or not. No stale gradients: a step that clears them at its end meets
    none in the lesson's loop (the check's own stale step judges both ways)."""
    return _Case(rng.randrange(2 ** 31), rng.randrange(2 ** 31), rng.randrange(2, 25), rng.uniform(0.5, 8),
                 2.0 ** rng.randrange(8, 16), 10 ** rng.uniform(-1.7, 1.3), False, rng.random() < 0.25)


@contextlib.contextmanager
def _scaled_or_named() -> Iterator[None]:
    """The GradScaler's own refusal (unscale_ or step before any scale()) named as the mistake it is."""
    try:
        yield
    except AssertionError as err:
        if "_scale is None" not in str(err):
            raise
        raise Wrong("no-scale", f"the loss was never scaled (scaler.scale was not called), so the scaler "
                    f"refused to go on: {str(err).split('.')[0]}", "scaler.scale(loss).backward(): small "
                    "fp16 gradients would underflow to zero otherwise") from None


def _observe(returned: Any, arguments: dict) -> tuple:
    """The loss it returned, the weights after the step, the scale after it."""
    one = isinstance(returned, torch.Tensor) and returned.numel() == 1
    loss = float(returned.detach()) if one else returned
    return (loss, [p.detach().clone() for p in arguments["model"].parameters()],
            arguments["scaler"].get_scale())


def _updates(c: _Case, weights: list[torch.Tensor]) -> torch.Tensor:
    start = [p.detach() for p in c.build()["model"].parameters()]
    return torch.cat([(p0 - p).flatten() for p0, p in zip(start, weights)])


def _agree(got: tuple, want: tuple, c: _Case) -> str | None:
    if not close(got[0], want[0], 1e-6):
        return f"the loss it returned, {got[0]:.7g}; the solution's {want[0]:.7g}"
    mine, right = _updates(c, got[1]), _updates(c, want[1])
    norm = right.norm().item()
    if (mine - right).norm().item() > 1e-4 * norm + 1e-9:
        return f"the weights' update has norm {mine.norm().item():.4g}, the solution's {norm:.4g}"
    if got[2] != want[2]:
        return f"the loss scale after the step is {got[2]:g}, the solution's {want[2]:g}"
    return None


def _name_case(c: _Case, got: tuple, want: tuple) -> None:
    if not close(got[0], want[0], 1e-6):
        raise Wrong("loss-differs", f"on {c} it returned the loss {got[0]:.7g}; the loss of the step's "
                    f"forward pass is {want[0]:.7g}", "return the loss the forward pass computed "
                    "(loss.detach()), not a loss computed again after the update, nor a scaled one")
    update = _updates(c, got[1])
    if c.inf:
        if bool(update.any()):
            raise Wrong("inf-not-skipped", f"on {c} the weights changed", "let the scaler decide: "
                        "scaler.step(optimizer) skips a step whose gradients hold inf/NaN")
        raise Wrong("no-backoff", f"on {c} the scale is {got[2]:g} after the step, not {want[2]:g}",
                    "scaler.update() after scaler.step(optimizer) halves it")
    model, batch = _Tiny(), c.build()["batch"]
    model.load_state_dict(c.build()["model"].state_dict())
    with torch.autocast(**_FP16):
        loss = model(**batch).loss
    loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    sizes = [p.numel() for p in model.parameters()]
    _diagnose_update([u.view_as(g) for u, g in zip(update.split(sizes), grads)], grads, c.max_norm,
                     c.init_scale, clipped_elsewhere=True)


def task() -> Task:
    """02-fp16-step's function for the contract and the search: a model, its optimizer and scaler rebuilt per
    call (the step may change them, not the batch)."""
    return Task(reference("02_mixed_precision/fp16_step.py", "fp16_step"), draw=_draw_case,
                arguments=lambda c: c.build(), agree=_agree, show=repr, observe=_observe,
                keywords=("max_norm",), changes=("model", "optimizer", "scaler"), name="fp16_step",
                guard=_scaled_or_named,
                result="the loss it returned",
                validate=lambda got, c: None if isinstance(got, torch.Tensor) and got.numel() == 1 else
                _not_a_loss(got),
                hint="zero the gradients, autocast the forward and loss, scale(loss).backward(), unscale_, "
                     "clip to max_norm, scaler.step, scaler.update: in that order")


def _not_a_loss(got: Any) -> None:
    raise Wrong("return-loss", f"it returned {type(got).__name__}", "return the loss tensor")


def fp16_step(answer: Callable, seed: int) -> str:
    """02-fp16-step: answer(model, batch, optimizer, scaler, device, max_norm) -> loss; a clean step, a step
    with stale gradients, and a step with a planted inf, on a model and batch drawn from `seed`."""
    rng = random.Random(seed)
    the_task = task()
    contract(answer, the_task, _draw_case(rng))
    torch.manual_seed(rng.randrange(2 ** 31))
    model0 = _Tiny()
    init_scale = 2.0 ** rng.randrange(10, 15)
    for _ in range(100):  # a gradient norm above 1.5: clipping to 1.0 (tutorials' norm) changes the update
        rows = rng.randrange(8, 25)
        batch = {"x": torch.randn(rows, 8) * rng.uniform(2, 6), "labels": torch.randint(4, (rows,))}
        ref = copy.deepcopy(model0)
        with torch.autocast(**_FP16):
            ref_loss = ref(**batch).loss
        ref_loss.backward()  # unscaled: the true gradients of the fp16 forward
        grads = [p.grad.detach().clone() for p in ref.parameters()]
        norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item()
        if norm > 1.5:
            break
    else:
        raise RuntimeError(f"02-fp16-step: no batch with a gradient norm above 1.5 for seed {seed}")
    # clipping bites; 1.0, tutorials' usual norm, gives another update than max_norm's; and some element of
    # the gradient is above max_norm, so that clipping each element (clip_grad_value_) is not clipping nothing
    biggest = max(g.abs().max().item() for g in grads)
    max_norm = norm * rng.uniform(0.05, 0.4)
    for _ in range(200):
        if abs(max_norm - 1.0) >= 0.2 and max_norm < 0.8 * biggest:
            break
        max_norm = norm * rng.uniform(0.05, 0.4) * (1 if rng.random() < 0.5 else 0.8 * biggest / norm)
    else:
        raise RuntimeError(f"02-fp16-step: no max_norm fits the gradient drawn with seed {seed}")
    log, model, scaler, loss = _fp16_case(answer, model0, batch, max_norm, init_scale)
    _check_fp16_order(log)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise Wrong("return-loss", f"it returned {type(loss).__name__}", "return the loss tensor")
    if close(loss.item(), ref_loss.item() * scaler.get_scale(), 1e-2):
        raise Wrong("returned-scaled", "it returned the scaled loss", "return the loss itself, not "
                    "scaler.scale(loss)")
    update = [(p0 - p).detach() for p0, p in zip(model0.parameters(), model.parameters())]
    _diagnose_update(update, grads, max_norm, init_scale)
    loose = norm * rng.uniform(2, 5)  # max_norm above the gradient's norm: clipping must change nothing
    _, loose_model, _, _ = _fp16_case(answer, model0, batch, loose, init_scale)
    _check_unclipped([(p0 - p).detach() for p0, p in zip(model0.parameters(), loose_model.parameters())],
                     grads, loose, norm)
    cleared_at_end = all(p.grad is None or not bool(p.grad.any()) for p in model.parameters())
    stale_log, stale_model, _, _ = _fp16_case(answer, model0, batch, max_norm, init_scale, stale=True)
    if not cleared_at_end and all(torch.equal(a, b) for a, b in zip(model0.parameters(),
                                                                     stale_model.parameters())):
        raise Wrong("no-zero-grad", "with gradients left over from before the step (NaN, on purpose), the "
                    "step was skipped, and the clean step left its gradients in .grad", "clear the gradients "
                    "(optimizer.zero_grad(set_to_none=True)) at the start of the step, or at its end: "
                    "backward "
                    "adds to whatever .grad holds")
    inf_log, inf_model, inf_scaler, _ = _fp16_case(answer, model0, batch, max_norm, init_scale,
                                                   plant_inf=True)
    if not all(torch.equal(a, b) for a, b in zip(model0.parameters(), inf_model.parameters())):
        raise Wrong("inf-not-skipped", "a step with an inf gradient changed the parameters",
                    "let the scaler decide: scaler.step(optimizer) skips a step whose gradients hold inf/NaN")
    if inf_scaler.get_scale() >= init_scale:
        raise Wrong("no-backoff", "after an inf gradient the scale did not come down",
                    "scaler.update() after scaler.step(optimizer) halves it")
    searched = search(answer, the_task, rng, draws=12, name=_name_case, key="update")
    return (f"forward and loss under fp16 autocast, backward outside it, scaled (by {init_scale:g}); "
            f"unscaled before clipping to {max_norm:.3g} (the gradient's norm: {norm:.3g}); the update is "
            f"the clipped gradient's, and the gradient's own with max_norm {loose:.3g}; stale gradients "
            f"cleared; a planted inf skipped the step and halved the scale; and as the course's solution on "
            f"{searched} more drawn steps (max_norm from 0.02 to 20, stale gradients, an inf)")
