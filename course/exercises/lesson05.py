"""The check of exercise 05-graph-break (lesson 05, `05_compile`): the given function with two graph
breaks (`loss_with_breaks`, which the notebook shows as it stands here) written again in one graph:
the same loss and gradients with `max_loss` below and above the loss, on a small Transformer and a batch drawn
per run, and no break (`torch._dynamo.explain`). A wrong gradient is named by what it is (all zero where the
guard scales the loss, as a clamp or a division by the loss itself gives; none at all, from a detached loss),
or by where it differs. `torch._dynamo.explain` resets Dynamo's cache (a compiled model compiles again on its
next call).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from course.exercises.core import Wrong

__all__ = ["graph_break", "loss_with_breaks"]


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
    if not out.requires_grad:
        raise Wrong("no-grad", "the loss it returned has no gradient (requires_grad is False): it was "
                    "detached, or rebuilt from Python numbers", "compute it from model(**batch).loss with "
                    "tensor operations, so that backward reaches the weights; detach only the factor "
                    "(max_loss / loss.detach())")
    out.backward()
    return out.detach(), [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                          for p in model.parameters()]


def _tiny_transformer(rng: random.Random) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from helpers.model.models import SmallTransformer, TransformerConfig

    torch.manual_seed(rng.randrange(2 ** 31))
    vocab, width = rng.choice((48, 64, 96)), rng.choice((16, 32))
    model = SmallTransformer(TransformerConfig(vocab_size=vocab, d_model=width, n_heads=2, n_layers=1,
                                               max_len=16))
    g = torch.Generator().manual_seed(rng.randrange(2 ** 31))
    ids = torch.randint(vocab, (rng.randrange(1, 4), rng.randrange(4, 13)), generator=g)
    return model, {"input_ids": ids, "labels": ids.roll(1, dims=1)}


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


def graph_break(answer: Callable, seed: int) -> str:
    """05-graph-break: answer(model, batch, max_loss) -> the loss of loss_with_breaks, in one graph."""
    rng = random.Random(seed)
    model, batch = _tiny_transformer(rng)
    with torch.no_grad():
        plain = model(**batch).loss.item()
    below, above = rng.uniform(0.2, 0.8), rng.uniform(1.25, 3.0)
    _compare_losses(answer, model, batch, plain, below, above)
    from helpers.core.compat import explain_graphs

    explained = explain_graphs(answer, model, batch, plain * below)
    breaks = explained.break_reasons
    if breaks or explained.graph_count != 1:
        first = breaks[0] if breaks else None
        where = f" at `{first.user_stack[-1].line}`" if first is not None and first.user_stack else ""
        reason = first.reason.splitlines()[0] if first is not None else ""
        raise Wrong("graph-break", f"{explained.graph_count} graph(s), {len(breaks)} break(s); the "
                    f"first{where}: {reason}", "no .item(), no `if` on a tensor's value (torch.where "
                    "instead), no print: torch._dynamo.explain(your_function)(model, batch, max_loss) "
                    "lists what is left")
    return (f"the same loss and gradients as the given function with max_loss {below:.2f}x and {above:.2f}x "
            f"the loss ({plain:.3g}; a batch of {tuple(batch['input_ids'].shape)} tokens), in one graph with "
            f"no "
            "break (torch._dynamo.explain)")
