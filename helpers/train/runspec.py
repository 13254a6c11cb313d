"""A run's switches in one frozen `RunSpec`, each applied in exactly one place, and a script's flags for
them (lessons 02-08). Guide: docs/library/train.md#helperstrainrunspec"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shutil
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
from torch import nn
from torch.utils.data import DataLoader

from helpers.core import compat
from helpers.core.compat import (
    hf_activation_checkpointing,
    hf_model_in,
    is_peft_model,
    set_attn_implementation,
    unwrap_model,
)
from helpers.core.precision import (
    PRECISIONS,
    Precision,
    autocast_context,
    autocast_factory,
    check_precision,
    make_scaler,
    tf32_matmuls,
    uses_tf32,
)
from helpers.data.packing import PackCollate
from helpers.data.text import make_dataloader
from helpers.measure.flops import transformer_blocks
from helpers.model.fp8 import convert_to_float8, fp8_supported
from helpers.model.packed_model import PackedModel, use_varlen, varlen_available

# transformers is imported inside the two functions that use it (its attention registry, HfArgumentParser):
# about 3 s with its model classes (2-core CPU, `python -X importtime`), which a RunSpec never needs otherwise

__all__ = ["Padding", "Attn", "PADDINGS", "ATTNS", "FUSED_ADAMW_DEVICES", "RunSpec",
           "set_activation_checkpointing", "dataclass_flags", "spec_flags", "flag_parser",
           "spec_from_arguments"]

Padding = Literal["dynamic", "fixed", "bucketed", "packed"]  # "fixed": to max_length (lesson 06)
# Hugging Face attention: "flex" is FlexAttention, "varlen" FlashAttention over the documents of packed rows
Attn = Literal["eager", "sdpa", "flex", "varlen"]
PADDINGS: tuple[str, ...] = get_args(Padding)
ATTNS: tuple[str, ...] = get_args(Attn)
FUSED_ADAMW_DEVICES = ("cuda", "cpu", "mps", "xpu")  # devices torch has a fused AdamW kernel for
_HF_ATTN = {"eager": "eager", "sdpa": "sdpa", "flex": "flex_attention"}  # varlen: packed_model.use_varlen
ContextFactory = Callable[[], contextlib.AbstractContextManager]  # makes a fresh context at each call
_DEFAULT_MODEL = (None, False, False, False, False)  # what `_model_switches` gives for an untouched model


@dataclass(frozen=True)
class RunSpec:
    """The switches of one training run (lessons 02-08); each field's help says what it does and needs."""

    precision: Precision = field(default="fp32", metadata={"help": (
        "fp32; tf32 (TF32 matmuls); bf16 or fp16 autocast (fp16 with a GradScaler). TF32 stays on from "
        "tf32 up; on a GPU bf16 needs compute capability 8.0 (Ampere) or newer")})
    fp8: bool = field(default=False, metadata={"help": (
        "FP8 matmuls in the Linear layers (helpers.model.fp8) under bf16 autocast: GPUs of compute "
        "capability 8.9 or newer")})
    attn: Attn | None = field(default=None, metadata={"help": (
        "a Hugging Face model's attention: eager, sdpa, flex (FlexAttention: transformers 5, a GPU to "
        "train) or varlen (FlashAttention within packed documents: padding packed, bf16 or fp16, an "
        "Ampere+ GPU); unset keeps the model's own")})
    compile: bool = field(default=False, metadata={"help": (
        "torch.compile each Transformer layer (regional compilation, lesson 05): needs triton on a GPU, a "
        "C++ compiler on a CPU")})
    fused_adamw: bool = field(default=True, metadata={"help": (
        "the fused AdamW kernel, one kernel for all parameters (devices: cuda, cpu, mps, xpu)")})
    padding: Padding = field(default="dynamic", metadata={"help": (
        "batch padding: dynamic (each batch to its longest), fixed (to max_length), bucketed (length "
        "buckets), packed (documents packed whole into rows; a BERT-like or SmallTransformer classifier)")})
    activation_checkpointing: bool = field(default=False, metadata={"help": (
        "recompute each block's activations in the backward pass: less memory, more time (lesson 03)")})
    init_scale: float = field(default=2.0 ** 16, metadata={"help": (
        "fp16 only: the GradScaler's first loss scale")})

    def __post_init__(self) -> None:
        allowed = {"precision": PRECISIONS, "attn": (None, *ATTNS), "padding": PADDINGS}
        for name, choices in allowed.items():
            if getattr(self, name) not in choices:
                hint = " (FP8 is its own switch: fp8=True)" if getattr(self, name) == "fp8" else ""
                raise ValueError(f"RunSpec.{name}={getattr(self, name)!r}: use one of {choices}{hint}")
        for name in ("fp8", "compile", "fused_adamw", "activation_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"RunSpec.{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.init_scale, bool) or not isinstance(self.init_scale, (int, float)) \
                or not self.init_scale > 0:
            raise ValueError(f"RunSpec.init_scale must be a positive loss scale, got {self.init_scale!r}")
        if self.attn == "varlen" and self.padding != "packed":
            raise ValueError(f"RunSpec.attn='varlen' attends within the documents of packed rows: use "
                             f"padding='packed' (got {self.padding!r}), or attn='sdpa'")
        if self.attn == "varlen" and self.autocast_precision not in ("bf16", "fp16"):
            raise ValueError(f"RunSpec.attn='varlen' runs FlashAttention, which needs bf16 or fp16 "
                             f"activations: use precision='bf16' (got {self.precision!r})")

    def replace(self, **switches: object) -> RunSpec:
        """This spec with some switches changed: one rung of lesson 08's ladder."""
        return dataclasses.replace(self, **switches)

    @property
    def autocast_precision(self) -> str:
        """The precision autocast runs in: FP8 linears run under bf16 autocast (lessons 02, 08)."""
        return "bf16" if self.fp8 else self.precision

    @property
    def effective_precision(self) -> str:
        """The precision a run's numbers carry: "fp8" with FP8 linears, else `precision` (lesson 08)."""
        return "fp8" if self.fp8 else self.precision

    # --- can this device run it? ---------------------------------------------------------------------

    def check(self, device: torch.device | str) -> None:
        """ValueError naming the switch when `device` cannot run it (lessons 02-08)."""
        device = torch.device(device)
        fp8 = self._fp8_problem(device)  # before the precision: FP8's bf16 autocast fails where FP8 does
        if fp8:
            raise ValueError(f"RunSpec.{fp8} (device {device})")
        check_precision(self.autocast_precision, device)
        why = self._attn_problem(device) or self._compile_problem(device) or self._fused_problem(device)
        if why:
            raise ValueError(f"RunSpec.{why} (device {device})")

    def check_model(self, model: nn.Module) -> None:
        """ValueError naming the switch `model` cannot take, and the fix (lessons 03, 08)."""
        why = self._model_problem(model)
        if why:
            raise ValueError(f"RunSpec.{why}")

    def _model_problem(self, model: nn.Module) -> str | None:
        inner = unwrap_model(model)
        name = type(inner).__name__
        if name == "CourseModel":  # helpers.core.adapt's wrapper of a model of one's own
            name = f"CourseModel({type(inner.model).__name__})"
        hf = hf_model_in(inner) is not None  # a peft model's base model counts: its switches are the base's
        if hf and hf_model_in(inner) is not inner:
            name = f"{name}({type(hf_model_in(inner)).__name__})"
        if self.attn is not None and not hf:
            return (f"attn={self.attn!r} switches a Hugging Face model's attention implementation; {name} "
                    "has attention of its own: use attn=None to keep it (lesson 08's ladder does, for such a "
                    "model)")
        if self.padding == "packed" and not ((hasattr(inner, "bert") and hasattr(inner, "classifier"))
                                             or (hasattr(inner, "blocks") and hasattr(inner, "cfg"))):
            return (f"padding='packed' runs a packed forward that knows BERT-like classifiers and the "
                    f"course's SmallTransformer, not {name}: use padding='bucketed' (or 'dynamic') for it")
        if self.activation_checkpointing and not (hasattr(inner, "set_activation_checkpointing") or hf):
            return (f"activation_checkpointing=True: {name} has no switch for it; wrap its blocks in "
                    "torch.utils.checkpoint.checkpoint yourself and leave the switch off")
        return None

    def _fp8_problem(self, device: torch.device) -> str | None:
        if not self.fp8:
            return None

        ok, why = fp8_supported(device)
        return None if ok else f"fp8=True: {why}"

    def _attn_problem(self, device: torch.device) -> str | None:
        if self.attn == "flex":
            if "flex_attention" not in compat.bert_attn_implementations():
                return (f"attn='flex': this transformers' BERT runs {compat.bert_attn_implementations()} "
                        "(FlexAttention needs transformers >= 5)")
            ok, why = compat.flex_trains(device)
            return None if ok else f"attn='flex': {why}"
        if self.attn == "varlen":
            ok, why = varlen_available(device)
            return None if ok else f"attn='varlen': {why}"
        return None

    def _compile_problem(self, device: torch.device) -> str | None:
        if not self.compile:
            return None
        if device.type == "cuda" and importlib.util.find_spec("triton") is None:
            return "compile=True: torch.compile's GPU kernels are Triton kernels, and triton is not installed"
        compilers = [os.environ.get("CXX", ""), "c++", "g++", "clang++"]
        if device.type == "cpu" and not any(c and shutil.which(c) for c in compilers):
            return "compile=True: torch.compile's CPU kernels are C++, and no C++ compiler is on the PATH"
        return None

    def _fused_problem(self, device: torch.device) -> str | None:
        if self.fused_adamw and device.type not in FUSED_ADAMW_DEVICES:
            return (f"fused_adamw=True: torch has a fused AdamW for {FUSED_ADAMW_DEVICES}, not "
                    f"{device.type!r}: use fused_adamw=False")
        return None

    # --- the step ------------------------------------------------------------------------------------

    def step_context(self, device: torch.device | str) -> contextlib.AbstractContextManager:
        """TF32 as the spec says, around the WHOLE step: forward, backward, optimizer step (lesson 02)."""
        return tf32_matmuls(uses_tf32(self.effective_precision))

    def autocast(self, device: torch.device | str) -> contextlib.AbstractContextManager:
        """Autocast as the spec says, around the forward pass and the loss ONLY (lesson 02)."""
        return autocast_context(self.autocast_precision, device)

    def step_contexts(self, device: torch.device | str) -> tuple[ContextFactory, ContextFactory]:
        """(step context, autocast) factories, the spec checked on `device` once, here (lessons 02-08)."""
        self.check(device)
        tf32 = uses_tf32(self.effective_precision)
        return (lambda: tf32_matmuls(tf32)), autocast_factory(self.autocast_precision, device, check=False)

    def make_scaler(self, device: torch.device | str) -> torch.amp.GradScaler:
        """The run's GradScaler, kept from step to step: enabled for fp16 only (lessons 02, 03)."""
        return make_scaler(self.precision, device, self.init_scale)

    # --- the data ------------------------------------------------------------------------------------

    def dataloader(self, dataset: Any, batch_size: int, *, pad_token_id: int = 0,
                   max_length: int | None = None, shuffle: bool = True, seed: int = 0,
                   device: torch.device | str | None = None) -> DataLoader:
        """The DataLoader of this spec's padding over a TokenizedDataset, pinned for a CUDA `device` (lessons
        06, 08). `max_length`: fixed padding's and packed rows' width (default: the longest example)."""
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

    # --- the model -----------------------------------------------------------------------------------

    def _model_switches(self) -> tuple:
        return (self.attn, self.fp8, self.compile, self.activation_checkpointing, self.padding == "packed")

    def apply(self, model: nn.Module) -> nn.Module:
        """`model` with the spec's model switches applied: train what it returns, and optimize its
        parameters (transformers 4.x switches attention by rebuilding the model) (lessons 03, 08)."""
        self.check_model(model)
        if self.attn == "varlen":
            model = use_varlen(model)  # checks the device; SDPA for padded batches through the same model
        elif self.attn is not None and is_peft_model(model):  # switched in the base model, adapters kept
            base = hf_model_in(model)
            if set_attn_implementation(base, _HF_ATTN[self.attn]) is not base:
                raise ValueError(f"RunSpec.attn={self.attn!r}: this transformers switches attention by "
                                 "rebuilding the model, which would leave peft's adapters behind: apply the "
                                 "spec to the base model first, base = spec.apply(base), then "
                                 "get_peft_model(base, config)")
        elif self.attn is not None:
            model = set_attn_implementation(model, _HF_ATTN[self.attn])
        if self.activation_checkpointing:
            set_activation_checkpointing(model, True)
        if self.fp8:
            convert_to_float8(model)
        base = model
        if self.compile:
            model = _compile_layers(model)
        if self.padding == "packed":
            model = PackedModel(model)
        for m in {id(base): base, id(model): model}.values():  # what `train` checks (`applied_to`)
            m.course_spec_model_switches = self._model_switches()
        return model

    def applied_to(self, model: nn.Module) -> bool:
        """Whether `model` came out of `apply` with this spec's model switches (or needs none) (lesson 08)."""
        if self._model_switches() == _DEFAULT_MODEL:
            return True
        return getattr(unwrap_model(model), "course_spec_model_switches", None) == self._model_switches()

    def describe(self) -> str:
        """The spec as the code that reproduces it: "your stack" (lesson 08, benchmarks/ladder.py)."""
        changed = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                   if getattr(self, f.name) != f.default]
        pad = {"fixed": "every batch max_length wide", "dynamic": "each batch to its longest",
               "bucketed": "length buckets, each batch to its longest",
               "packed": "documents packed whole into rows"}[self.padding]
        model = ([f"attention {self.attn or 'as loaded'}"] + ["activation checkpointing"]
                 * self.activation_checkpointing + ["FP8 linears"] * self.fp8
                 + ["each layer compiled"] * self.compile + ["packed forward"] * (self.padding == "packed"))
        steps = [f"spec = RunSpec({', '.join(changed)})",
                 "model = spec.apply(model)  # " + ", ".join(model),
                 f"loader = spec.dataloader(dataset, batch_size, max_length=MAX_LENGTH)  # {pad}",
                 f"train(model, loader, TrainConfig(...), spec=spec)  # {self.precision}"
                 + (" + FP8" if self.fp8 else "") + (", fused AdamW" if self.fused_adamw else ", AdamW")]
        return "\n".join(steps)


def dataclass_flags(defaults: Any, fields: Sequence[str] | None = None) -> type:
    """A dataclass of the (named) fields of the dataclass instance `defaults`, its values as the defaults,
    for `flag_parser`; --help shows a field's metadata help (course/scripts)."""
    cls = type(defaults)
    known = [f.name for f in dataclasses.fields(cls)]
    for name in fields or ():
        if name not in known:
            raise ValueError(f"{name!r} is not a {cls.__name__} field: use one of {sorted(known)}")
    hints = typing.get_type_hints(cls)
    own_help = {f.name: f.metadata.get("help") for f in dataclasses.fields(cls)}

    def flag(name: str) -> tuple[str, Any, Any]:
        help_text = {"help": own_help[name] or f"{cls.__name__}.{name}"}  # else where the flag lands
        return name, hints[name], dataclasses.field(default=getattr(defaults, name), metadata=help_text)

    return dataclasses.make_dataclass(f"{cls.__name__}Flags",
                                      [flag(name) for name in (fields if fields is not None else known)])


def spec_flags(fields: Sequence[str] | None = None, defaults: RunSpec | None = None) -> type:
    """The RunSpec switches a script offers (all, or the named `fields`) as a dataclass for `flag_parser`
    (course/scripts)."""
    return dataclass_flags(defaults if defaults is not None else RunSpec(), fields)


def flag_parser(*flags: type, **kwargs: Any) -> Any:
    """`transformers.HfArgumentParser` over the dataclasses `flags`, with --no-name for every bool
    (course/scripts); `kwargs` go to argparse."""
    from transformers import HfArgumentParser

    parser = HfArgumentParser(list(flags), **kwargs)
    for cls in flags:
        for f in dataclasses.fields(cls):
            # HfArgumentParser adds --no-name only for a True default; argparse keeps the first default
            if f.default is False:
                owner = cls.__name__.removesuffix("Flags")
                parser.add_argument(f"--no-{f.name.replace('_', '-')}", f"--no_{f.name}",
                                    action="store_false", dest=f.name, help=f"{owner}.{f.name} = False")
    return parser


def spec_from_arguments(args: Any) -> RunSpec:
    """The RunSpec of a parsed command line (a Namespace, or the `spec_flags` dataclass); switches a script
    did not offer keep their defaults (course/scripts)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunSpec) if hasattr(args, f.name)}
    return RunSpec(**given)


def _layers(model: nn.Module) -> Any:
    return transformer_blocks(model)


def _compile_layers(model: nn.Module) -> nn.Module:
    # regional compilation: the layers share one graph, compiled once; no list of layers: compiled whole
    layers = _layers(model)
    if layers is None:
        return torch.compile(model)
    for layer in layers:
        layer.compile()
    return model


def set_activation_checkpointing(model: nn.Module, enabled: bool) -> None:
    """Activation checkpointing on or off: SmallTransformer's switch, or Hugging Face's (lesson 03)."""
    if hasattr(model, "set_activation_checkpointing"):
        model.set_activation_checkpointing(enabled)
    elif hf_model_in(model) is not None:  # a Hugging Face PreTrainedModel, or the base model of a peft one
        hf_activation_checkpointing(hf_model_in(model), enabled)
    elif enabled:
        raise ValueError(f"{type(model).__name__} has no activation-checkpointing switch: wrap its blocks "
                         "with torch.utils.checkpoint.checkpoint, or use SmallTransformer / a HF model")
