"""The check of exercise 05-graph-break (lesson 05, `05_compile`): the given function with two graph
breaks (`loss_with_breaks`, which the notebook shows as it stands here) written again in one graph:
the same loss and gradients with `max_loss` below and above the loss, on a small Transformer and a batch drawn
per run, and no break with `max_loss` below the loss nor above it (a break in one branch only counts). A wrong
gradient is named by what it is (all zero where the guard scales the loss, as a clamp or a division by the
loss itself gives; none at all, from a detached loss), or by where it differs.

The graphs are counted by compiling a copy of the answer's code with a backend that only counts them: Dynamo's
cache is never reset (`torch._dynamo.explain` resets it, and every compiled cell of the
lesson would compile again), and what it caches belongs to the copy, which goes when the check ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import random
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from course.exercises.contract import Task, contract, reference, search
from course.exercises.core import Wrong

__all__ = ["graph_break", "loss_with_breaks", "graph_breaks", "task"]


def loss_with_breaks(model: nn.Module, batch: Mapping[str, torch.Tensor], max_loss: float) -> torch.Tensor:
    """The training loss, scaled down to max_loss when it is larger (a guard some training loops use)."""
    loss = model(**batch).loss
    if loss.item() > max_loss:  # .item() copies the value to Python and `if` branches on it: graph break
        print(f"loss {loss.item():.2f} above {max_loss}: scaled down")  # print: another graph break
        loss = loss * (max_loss / loss.item())
    return loss


def _loss_and_grads(fn: Callable, model: nn.Module, batch: dict, max_loss: float) -> tuple[Any, list]:
    model.zero_grad(set_to_none=True)
    out = fn(model, dict(batch), max_loss)
    if not isinstance(out, torch.Tensor) or out.numel() != 1:
        raise Wrong("return-loss", f"it returned {type(out).__name__}",
                    "return the loss, a one-element tensor")
    if not out.requires_grad:
        raise Wrong("no-grad", "the loss it returned has no gradient (requires_grad is False): it was "
                    "detached, or rebuilt from Python numbers", "compute it from model(**batch).loss with "
                    "tensor operations, so that backward reaches the weights; detach only the factor "
                    "(max_loss / loss.detach())")
    out.backward()
    return out.detach(), [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                          for p in model.parameters()]


def _tiny_transformer(rng: random.Random) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return _Case.draw(rng, torch.float32, 1.0).build()


@dataclasses.dataclass(frozen=True)
class _Case:
    """A small Transformer, a batch and a max_loss, rebuilt the same from its seeds on every call."""

    vocab: int
    width: int
    rows: int
    tokens: int
    weights: int  # the seed of the weights
    data: int  # the seed of the batch
    dtype: torch.dtype
    factor: float  # max_loss = factor × the loss

    @classmethod
    def draw(cls, rng: random.Random, dtype: torch.dtype, factor: float) -> _Case:
        return cls(rng.choice((48, 64, 96)), rng.choice((16, 32)), rng.randrange(1, 4), rng.randrange(4, 13),
                   rng.randrange(2 ** 31), rng.randrange(2 ** 31), dtype, factor)

    def build(self) -> tuple[nn.Module, dict[str, torch.Tensor]]:
        from helpers.model.models import SmallTransformer, TransformerConfig

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.weights)
            model = SmallTransformer(TransformerConfig(vocab_size=self.vocab, d_model=self.width, n_heads=2,
                                                       n_layers=1, max_len=16)).to(self.dtype)
        g = torch.Generator().manual_seed(self.data)
        ids = torch.randint(self.vocab, (self.rows, self.tokens), generator=g)
        return model, {"input_ids": ids, "labels": ids.roll(1, dims=1)}

    @functools.cached_property
    def loss(self) -> float:
        model, batch = self.build()
        with torch.no_grad():
            return model(**batch).loss.item()

    @property
    def max_loss(self) -> float:
        return self.factor * self.loss

    def __repr__(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        return (f"a {dtype} Transformer (vocab {self.vocab}, width {self.width}), a batch of "
                f"{self.rows}×{self.tokens} tokens, max_loss {self.max_loss:.6g} ({self.factor:.4g}× the "
                "loss)")


def _compare_losses(answer: Callable, model: nn.Module, batch: dict, plain: float,
                    below: float, above: float) -> None:
    import contextlib
    import io

    for max_loss in (plain * below, plain * above):  # the guard scales the first down, leaves the second
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
            _diagnose_gradients(model, got_g, want_g, max_loss, scaled)


def _diagnose_gradients(model: nn.Module, got: list, want: list, max_loss: float, scaled: bool) -> None:
    where = "below" if scaled else "above"
    got_norm = torch.sqrt(sum(g.double().pow(2).sum() for g in got)).item()
    want_norm = torch.sqrt(sum(g.double().pow(2).sum() for g in want)).item()
    if scaled and got_norm <= 1e-5 * want_norm:  # zero up to rounding: d/dθ (loss · max_loss / loss) = 0
        raise Wrong("gradient-zero", f"with max_loss={max_loss:.3g} below the loss the value is right but "
                                     f"every "
                    "gradient is zero: the given function's are the loss's, scaled by max_loss / loss",
                    "keep the loss's gradient, scaled: loss * (max_loss / loss.detach()) (loss.item() was a "
                    "constant for autograd); a clamp, or a division by the loss itself, has zero gradient")
    names = [n for n, _ in model.named_parameters()]
    errs = [((a - b).norm() / b.norm().clamp_min(1e-30)).item() for a, b in zip(got, want)]
    i = max(range(len(errs)), key=errs.__getitem__)
    ratio = (got[i].norm() / want[i].norm().clamp_min(1e-30)).item()
    raise Wrong("gradient", f"with max_loss={max_loss:.3g} ({where} the loss) the value is right, the "
                            f"gradients "
                f"are not: {names[i]}'s differs by {errs[i]:.2g} (relative; its norm is {ratio:.3g}x the "
                f"given "
                "function's)", "the gradient must be the given function's: the loss's, times max_loss / loss "
                "where the guard scales it, and the loss's own elsewhere")


# --- one graph, counted without touching Dynamo's cache ----------------------------------------------------

def graph_breaks(fn: Callable, *args: Any) -> str | None:
    """Compile a copy of `fn`'s code with a backend that counts the graphs and runs each as traced, and call
    it on `args`: None when Dynamo made one graph, else the first break, with its line (lesson 05's check).
    The copy's code is a new object: Dynamo's cache entries (and the resume functions of a break) are the
    copy's, gone with it, and every function compiled before keeps its own: no `torch._dynamo.reset()`.
    Not `fullgraph=True`: it captures `.item()` into the graph where a plain `torch.compile` breaks there."""
    import inspect
    import types

    original = inspect.unwrap(fn)
    if not isinstance(original, types.FunctionType):
        return None
    copy = types.FunctionType(original.__code__.replace(), original.__globals__, original.__name__,
                              original.__defaults__, original.__closure__)
    copy.__kwdefaults__ = original.__kwdefaults__
    reasons: list[Any] = []

    def count(gm: Any, example_inputs: Any) -> Callable:
        reasons.append(getattr(gm, "compile_subgraph_reason", None))
        return gm.forward

    torch.compile(copy, backend=count)(*args)
    breaks = [r for r in reasons if r is None or getattr(r, "graph_break", True)]
    if len(reasons) == 1 and not breaks:
        return None
    first = breaks[0] if breaks else None
    stack = getattr(first, "user_stack", None) or []
    where = f"at `{stack[-1].line}`" if stack and getattr(stack[-1], "line", "") else "somewhere"
    lines = [x.strip() for x in str(getattr(first, "reason", "")).splitlines() if x.strip()]
    reason = lines[0] if lines else f"{len(reasons)} graphs"
    return f"{where} ({len(reasons)} graphs): {reason[:200]}"


class _Stub(nn.Module):
    """A model Dynamo traces in a moment (an embedding and a loss), for counting the answer's own graphs: the
    breaks are the answer's, not the model's (the course's Transformer has none), and tracing the Transformer
    twice took seconds."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(vocab)
            self.emb = nn.Embedding(vocab, vocab)
        # a forward of its own per stub (a copy of the code): Dynamo's cache entries for it go with the stub,
        # so runs of the check with other vocabularies never fill one shared forward's recompile limit
        shared = _Stub.shared_forward
        forward = types.FunctionType(shared.__code__.replace(), shared.__globals__, "forward",
                                     shared.__defaults__)
        self.forward = types.MethodType(forward, self)

    def shared_forward(self, input_ids: torch.Tensor, attention_mask: Any = None, labels: Any = None) -> Any:
        from helpers.model.models import ModelOutput  # what the course's Transformer returns

        logits = self.emb(input_ids)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten()) if labels is not None else None
        return ModelOutput(logits, loss)

    def loss_of(self, batch: dict) -> float:
        with torch.no_grad():
            return self(**batch).loss.item()


# --- the contract and the differential search ---------------------------------------------------------------

def _draw_case(rng: random.Random) -> _Case:
    """One case: float32 (or float64) weights; max_loss far below the loss, just below it (by 0.01-1 %), just
    above, and far above."""
    below = 1 - 10 ** rng.uniform(-4, -2)  # 0.01 % to 1 % below, as likely in each decade
    factor = rng.choice((rng.uniform(0.2, 0.8), below, 1 + rng.uniform(1e-3, 1e-2), rng.uniform(1.25, 3.0)))
    return _Case.draw(rng, torch.float64 if rng.random() < 0.25 else torch.float32, factor)


def _observe(returned: Any, arguments: dict) -> tuple:
    """The loss and the gradients it gives its model (None where it has no graph)."""
    if not isinstance(returned, torch.Tensor):
        return (returned, None)
    if not returned.requires_grad or returned.numel() != 1:
        return (returned.detach(), None)
    model = arguments["model"]
    model.zero_grad(set_to_none=True)
    returned.backward()
    return (returned.detach(), [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                                for p in model.parameters()])


def _agree(got: tuple, want: tuple, c: _Case) -> str | None:
    (loss, grads), (want_loss, want_grads) = got, want
    if not isinstance(loss, torch.Tensor) or not torch.allclose(loss.double(), want_loss.double(), rtol=1e-5):
        return f"its loss {float(loss):.7g}, the given function's {float(want_loss):.7g}"
    if grads is None:
        return "its loss has no gradient"
    if not all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(grads, want_grads)):
        return "its gradients differ from the given function's"
    return None


def _name_case(c: _Case, got: tuple, want: tuple) -> None:
    loss, grads = got
    if grads is not None and torch.allclose(loss.double(), want[0].double(), rtol=1e-5):
        model, _ = c.build()
        _diagnose_gradients(model, grads, want[1], c.max_loss, c.factor < 1)


def _validate(out: Any, c: _Case) -> None:
    if not isinstance(out, torch.Tensor) or out.numel() != 1:
        raise Wrong("return-loss", f"it returned {type(out).__name__}",
                    "return the loss, a one-element tensor")


def task() -> Task:
    """05-graph-break's function for the contract and the search: a model and a batch rebuilt per call."""
    def arguments(c: _Case) -> dict[str, Any]:
        model, batch = c.build()
        return {"model": model, "batch": batch, "max_loss": c.max_loss}

    return Task(reference("05_compile/loss_without_breaks.py", "loss_without_breaks"), draw=_draw_case,
                arguments=arguments, agree=_agree, show=repr, observe=_observe, changes=("model",),
                name="loss_without_breaks", result="the loss", validate=_validate,
                hint="the value: max_loss when the loss is larger, else the loss; the gradient: the loss's, "
                     "times max_loss / loss where the guard scales it")


def graph_break(answer: Callable, seed: int) -> str:
    """05-graph-break: answer(model, batch, max_loss) -> the loss of loss_with_breaks, in one graph."""
    rng = random.Random(seed)
    the_task = task()
    first = _Case.draw(rng, torch.float32, rng.uniform(0.2, 0.8))
    contract(answer, the_task, first)
    model, batch = first.build()
    plain = first.loss
    below, above = first.factor, rng.uniform(1.25, 3.0)
    _compare_losses(answer, model, batch, plain, below, above)
    # a hair either side, and a smaller hair below: a slack of s (loss > max_loss * (1 + s)) shows only
    # where max_loss lies less than s below the loss; 0.01-0.1 % and 0.1-1 % below catch any s >= 0.1 %
    for factor in (1 - rng.uniform(1e-4, 1e-3), 1 - rng.uniform(1e-3, 1e-2), 1 + rng.uniform(1e-3, 1e-2)):
        with contextlib.redirect_stdout(io.StringIO()):  # the given function prints
            want, _ = _loss_and_grads(loss_with_breaks, model, batch, plain * factor)
        got, _ = _loss_and_grads(answer, model, batch, plain * factor)
        if not torch.allclose(got.double(), want.double(), rtol=1e-5):
            side = "below" if factor < 1 else "above"
            raise Wrong("loss-differs", f"with max_loss {abs(1 - factor):.2%} {side} the loss ({plain:.4g}) "
                        f"it returned {got.item():.6g}, the given function {want.item():.6g}", "compare the "
                        "loss with max_loss exactly (loss > max_loss), with no slack: the guard scales a "
                        "loss even a hair above max_loss")
    for factor in (below, above):  # a break in either branch is a break
        stub, batch = _Stub(first.vocab), first.build()[1]
        broken = graph_breaks(answer, stub, batch, stub.loss_of(batch) * factor)
        if broken is not None:
            side = "below" if factor < 1 else "above"
            raise Wrong("graph-break", f"with max_loss {side} the loss, Dynamo did not make one graph; the "
                        f"first break is {broken}", "no .item(), no `if` on a tensor's value (torch.where "
                        "instead), no print, even in a branch taken only for some max_loss: "
                        "torch._dynamo.explain(your_function)(model, batch, max_loss) lists what is left")
    searched = search(answer, the_task, rng, draws=6, name=_name_case, key="loss-differs")
    return (f"the same loss and gradients as the given function with max_loss {below:.2f}x and {above:.2f}x "
            f"the loss ({plain:.3g}; a batch of {tuple(batch['input_ids'].shape)} tokens), in one graph with "
            f"no break either way (torch.compile, graphs counted), and on {searched} more drawn inputs "
            "(float64 weights, max_loss within 1 % of the loss)")
