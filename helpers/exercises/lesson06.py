"""The check of exercise 06-hidden-syncs (lesson 06, `06_input_pipeline`): the given training loop
(`train_loop_with_syncs`, which the notebook shows as it stands here) without a read of a device value
per step: the reads are counted with a TorchFunctionMode (`READS`), the losses must be the same, and a
planted NaN must still raise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from helpers.exercises.core import Wrong, close, learner_line

__all__ = ["hidden_syncs", "train_loop_with_syncs", "READS"]


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
            and all(close(a, b, 1e-5) for a, b in zip(got, want)))
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
