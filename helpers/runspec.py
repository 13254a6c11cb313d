"""One run specification: the switches of a training run, each applied in exactly one place (lessons 02-08).

A `RunSpec` is frozen: it names *what* a run uses; its methods are the only code that turns a
switch into torch calls:

- `spec.step_context(device)`: TF32 (a global matmul setting, one rule: `helpers.precision.uses_tf32`)
  around the whole step: forward, backward and optimizer step;
- `spec.autocast(device)`: autocast around the forward pass and the loss ONLY. Backward ops run in the
  dtype autocast chose for their forward op, and the optimizer updates float32 weights: PyTorch's AMP
  guide keeps backward and `optimizer.step()` outside autocast;
- `spec.dataloader(dataset, batch_size)`: the batches of its padding (fixed, dynamic, bucketed, packed),
  pinned by the DataLoader's own thread when the batches go to a GPU;
- `spec.apply(model)`: attention implementation, FP8 linears, regional compilation, packed forward;
- `spec.describe()`: the spec as the lines of code that reproduce it ("your stack", lesson 08).

`helpers.train.train(model, batches, cfg, spec=spec)` trains with it; `TrainConfig` keeps what is not a
switch (steps, optimizer, schedule, accumulation, checkpoints). Lesson 08's ladder changes one field of a
spec per rung (`dataclasses.replace`).

    spec = RunSpec(precision="bf16", attn="sdpa", padding="bucketed")
    model = spec.apply(model)
    loader = spec.dataloader(train_ds, 32, pad_token_id=tok.pad_token_id, max_length=512)
    train(model, loader, TrainConfig(steps=1000), spec=spec)
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from helpers.data import PADDINGS as DATA_PADDINGS  # the data layer's paddings, extended here
from helpers.precision import PRECISIONS, autocast_context, check_precision, tf32_matmuls, uses_tf32

__all__ = ["PADDINGS", "ATTNS", "RunSpec"]

PADDINGS = (*DATA_PADDINGS, "packed")  # helpers.data's paddings, and documents packed into rows
ATTNS = ("eager", "sdpa")  # Hugging Face attention implementations the course times


@dataclass(frozen=True)
class RunSpec:
    """The switches of one training run (lessons 02-08); see the module docstring."""

    precision: str = "fp32"  # one of helpers.precision.PRECISIONS; TF32 stays on from "tf32" up
    fp8: bool = False  # FP8 matmuls in the Linear layers (helpers.fp8), run under bf16 autocast
    attn: str | None = None  # "eager" | "sdpa"; None: the model's own (a SmallTransformer has one)
    compile: bool = False  # torch.compile each Transformer layer (regional compilation, lesson 05)
    fused_adamw: bool = True  # the fused AdamW kernel where torch has it for the device
    padding: str = "dynamic"  # "fixed" (to max_length) | "dynamic" | "bucketed" | "packed" (lesson 06)

    def __post_init__(self) -> None:
        allowed = {"precision": PRECISIONS, "attn": (None, *ATTNS), "padding": PADDINGS}
        for name, choices in allowed.items():
            if getattr(self, name) not in choices:
                hint = " (FP8 is its own switch: fp8=True)" if getattr(self, name) == "fp8" else ""
                raise ValueError(f"RunSpec.{name}={getattr(self, name)!r}: use one of {choices}{hint}")
        for name in ("fp8", "compile", "fused_adamw"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"RunSpec.{name} must be True or False, got {getattr(self, name)!r}")

    def replace(self, **switches: object) -> RunSpec:
        """This spec with some switches changed: one rung of lesson 08's ladder."""
        return dataclasses.replace(self, **switches)

    @property
    def autocast_precision(self) -> str:
        """The precision autocast runs in: FP8 linears run under bf16 autocast (lessons 02, 08)."""
        return "bf16" if self.fp8 else self.precision

    @property
    def effective_precision(self) -> str:
        """The precision a run's numbers carry: "fp8" with FP8 linears, else `precision` (lesson 08's
        tolerances, the TF32 rule)."""
        return "fp8" if self.fp8 else self.precision

    def check(self, device: torch.device | str) -> None:
        """ValueError when `device` cannot run this spec's precision (helpers.precision.check_precision)."""
        check_precision(self.autocast_precision, device)

    def step_context(self, device: torch.device | str) -> contextlib.AbstractContextManager:
        """TF32 as the spec says, around the WHOLE step: forward, backward and optimizer step (lesson 02).

        On for "tf32" and every later precision (fp16, bf16, FP8), on every device: a device without TF32
        units (a CPU) computes exact float32 anyway. Restores the previous setting on exit."""
        return tf32_matmuls(uses_tf32(self.effective_precision))

    def autocast(self, device: torch.device | str) -> contextlib.AbstractContextManager:
        """Autocast as the spec says, around the forward pass and the loss ONLY (lesson 02): backward runs
        outside it, in the dtypes autocast chose for the forward ops; so does the optimizer step."""
        return autocast_context(self.autocast_precision, device)

    def dataloader(self, dataset: Any, batch_size: int, *, pad_token_id: int = 0,
                   max_length: int | None = None, shuffle: bool = True, seed: int = 0,
                   device: torch.device | str | None = None) -> DataLoader:
        """The DataLoader of this spec's padding over a `helpers.data.TokenizedDataset` (lessons 06, 08).

        `max_length`: the width of fixed padding and of packed rows (default: the longest example).
        Batches bound for a CUDA `device` (default: CUDA when torch sees a GPU) are pinned in the
        DataLoader's pin thread, so the loop's copy `tensor.to(device, non_blocking=True)` is async."""
        from helpers.data import make_dataloader
        from helpers.packing import PackCollate

        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be a positive number of tokens or None, got {max_length}")
        cuda = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
        if self.padding != "packed":
            return make_dataloader(dataset, batch_size, padding=self.padding, pad_token_id=pad_token_id,
                                   fixed_length=max_length, shuffle=shuffle, seed=seed, pin_memory=cuda)
        rows = max_length or max(dataset.lengths)
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, pin_memory=cuda,
                          generator=torch.Generator().manual_seed(seed),
                          collate_fn=PackCollate(rows, pad_token_id))

    def apply(self, model: nn.Module) -> nn.Module:
        """`model` with the spec's attention, FP8 linears, compiled layers and packed forward; train what
        it returns and optimize its parameters (transformers 4.x switches attention by rebuilding the
        model, helpers.compat) (lesson 08)."""
        from helpers.compat import set_attn_implementation

        if self.attn is not None:
            model = set_attn_implementation(model, self.attn)
        if self.fp8:
            from helpers.fp8 import convert_to_float8

            convert_to_float8(model)
        if self.compile:
            layers = getattr(getattr(getattr(model, "base_model", None), "encoder", None), "layer", None)
            layers = layers if layers is not None else getattr(model, "blocks", None)
            if layers is None:
                model = torch.compile(model)
            else:
                for layer in layers:  # regional compilation: the layers share one graph, compiled once
                    layer.compile()
        if self.padding == "packed":
            from helpers.packing import PackedModel

            model = PackedModel(model)
        return model

    def describe(self) -> str:
        """The spec as the code that reproduces it: "your stack" (lesson 08, benchmarks/ladder.py)."""
        changed = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                   if getattr(self, f.name) != f.default]
        pad = {"fixed": "every batch max_length wide", "dynamic": "each batch to its longest",
               "bucketed": "length buckets, each batch to its longest",
               "packed": "documents packed whole into rows"}[self.padding]
        model = ([f"attention {self.attn or 'as loaded'}"] + ["FP8 linears"] * self.fp8
                 + ["each layer compiled"] * self.compile + ["packed forward"] * (self.padding == "packed"))
        steps = [f"spec = RunSpec({', '.join(changed)})",
                 "model = spec.apply(model)  # " + ", ".join(model),
                 f"loader = spec.dataloader(dataset, batch_size, max_length=MAX_LENGTH)  # {pad}",
                 f"train(model, loader, TrainConfig(...), spec=spec)  # {self.precision}"
                 + (" + FP8" if self.fp8 else "") + (", fused AdamW" if self.fused_adamw else ", AdamW")]
        return "\n".join(steps)
