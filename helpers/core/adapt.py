"""Your own model in the course's helpers: `as_course_model` wraps it once, and `(x, y)` batches become the
dicts the helpers take (lessons 02-08, and your training code).
Guide: docs/library/core.md#helperscoreadapt
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from helpers.core.compat import is_hf_model, unwrap_model

__all__ = ["ModelShape", "ModelOutput", "CourseModel", "as_course_model", "as_batch", "is_batch",
           "shifts_labels", "loss_of", "logits_of", "takes_course_batches", "follows_course_contract",
           "adapter_hint", "vocab_size", "batch_shape"]

_BATCH_KEYS = ("input_ids", "labels")


@dataclass(frozen=True)
class ModelShape:
    """Layers, heads and head size: the attention's share of FLOPs, 12·L·H·Q·T (lessons 02, 08)."""

    n_layers: int
    n_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        bad = {k: v for k, v in vars(self).items()
               if isinstance(v, bool) or not isinstance(v, int) or v < 1}
        if bad:
            raise ValueError(f"ModelShape needs positive integers, got {bad}")


@dataclass
class ModelOutput:
    """What the course's models and a wrapped model return, named as in Hugging Face (lessons 02-08)."""

    logits: torch.Tensor | None  # None when a model returns only a loss
    loss: torch.Tensor | None = None  # 0-d; None without labels


def is_batch(thing: Any) -> bool:
    """Whether `thing` is one batch: a dict, or an (x, y) pair of tensors (not a list of batches)."""
    if isinstance(thing, Mapping):
        return True
    return (isinstance(thing, (tuple, list)) and len(thing) == 2
            and all(isinstance(t, torch.Tensor) for t in thing))


def shifts_labels(model: nn.Module) -> bool:
    """Whether `model` shifts its labels itself (a causal LM): it takes (x, x), never x moved one ahead
    (lessons 02-08)."""
    inner = unwrap_model(model)
    if isinstance(inner, CourseModel):  # a model of one's own behind the wrapper: its forward(x, y) does not
        return False
    if getattr(inner, "course_contract", False):
        return bool(getattr(getattr(inner, "cfg", None), "causal", False))
    if not is_hf_model(inner):
        return False
    name = type(inner).__name__
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return True
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # 4.52 to 5.x

    return name in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def as_batch(batch: Any, model: nn.Module | None = None) -> dict[str, Any]:
    """A dict as it is, an (x, y) pair as {"input_ids": x, "labels": y} (lessons 02-08). With `model`:
    ValueError for a pair whose y is not x when the model shifts its labels itself."""
    if isinstance(batch, Mapping):
        return dict(batch)
    if is_batch(batch):
        x, y = batch
        if model is not None and y is not x and shifts_labels(model) and not (
                y.shape == x.shape and torch.equal(y, x)):
            raise ValueError(
                f"{type(unwrap_model(model)).__name__} shifts its labels itself (it predicts labels[t + 1] "
                "from the tokens up to t), and this (x, y) pair's y is not x: with y = x moved one ahead, "
                "the usual pair, it would learn the token two ahead. Give it (x, x), or a dict "
                "{'input_ids': x, 'labels': x}")
        return {"input_ids": x, "labels": y}
    raise ValueError(f"a batch is a dict with `input_ids` (and optionally attention_mask, labels) or an "
                     f"(x, y) pair of tensors; got {_describe(batch)}")


def _describe(thing: Any) -> str:
    if isinstance(thing, (tuple, list)):
        return f"a {type(thing).__name__} of {len(thing)} ({', '.join(type(t).__name__ for t in thing[:4])})"
    return f"a {type(thing).__name__}"


def _split(out: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if isinstance(out, torch.Tensor):
        return (None, out) if out.dim() == 0 else (out, None)
    if isinstance(out, (tuple, list)):
        tensors = [t for t in out if isinstance(t, torch.Tensor)]
        loss = next((t for t in tensors if t.dim() == 0), None)
        logits = next((t for t in tensors if t.dim() > 0), None)
        return logits, loss
    if isinstance(out, Mapping):
        return out.get("logits"), out.get("loss")
    if hasattr(out, "loss") or hasattr(out, "logits"):  # Hugging Face's ModelOutput, the course's
        return getattr(out, "logits", None), getattr(out, "loss", None)
    raise ValueError(f"cannot read a loss or logits from a {type(out).__name__}: a forward returns a loss, "
                     "logits, (logits, loss) or an object with .loss / .logits")


def loss_of(out: Any) -> torch.Tensor | None:
    """The loss in what a model returned (`.loss`, or a 0-d tensor); None when it returned none."""
    return _split(out)[1]


def logits_of(out: Any) -> torch.Tensor | None:
    """The logits in what a model returned (`.logits`, or the first tensor that is not 0-d); None if none."""
    return _split(out)[0]


def _forward_of(model: nn.Module) -> Callable[..., Any]:
    return unwrap_model(model).forward  # the model inside torch.compile and DDP wrappers


def takes_course_batches(model: nn.Module) -> bool:
    """Whether `model(**batch)` takes the course's batches: a forward with `input_ids` or **kwargs."""
    try:
        params = inspect.signature(_forward_of(model)).parameters.values()
    except (TypeError, ValueError):  # a forward Python cannot inspect: let the call say
        return True
    return any(p.name == "input_ids" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def vocab_size(model: nn.Module, *, fix: str = "give a batch of your own") -> int:
    """The model's vocabulary: its config's vocab_size, else its first embedding's rows (the dry runs, the
    planner); `fix` ends the ValueError when it has neither."""
    for m in model.modules():
        for cfg in (getattr(m, "cfg", None), getattr(m, "config", None)):
            v = getattr(cfg, "vocab_size", None)
            if isinstance(v, int) and v > 0:
                return v
    emb = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    if emb is None:
        raise ValueError(f"cannot tell the vocabulary of a {type(model).__name__} (no config.vocab_size, no "
                         f"nn.Embedding): {fix}")
    return emb.num_embeddings


def batch_shape(batch: Mapping[str, Any]) -> tuple[int, int]:
    """(rows, sequence length) of a batch of token ids, or a clear error (the planner, the op count)."""
    ids = batch.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ValueError("a plan's batch needs input_ids of shape (batch, seq_len) (or x of an (x, y) pair)")
    return int(ids.shape[0]), int(ids.shape[1])


def follows_course_contract(model: nn.Module) -> bool:
    """Whether `model(**batch).loss` is the loss already: a HF model, or one with `course_contract = True`."""
    inner = unwrap_model(model)
    return bool(getattr(inner, "course_contract", False)) or is_hf_model(inner)


def adapter_hint(model: nn.Module) -> str:
    """The one-line fix for a model the helpers cannot call: wrap it with `as_course_model`."""
    name = type(model).__name__
    try:
        sig = f"{name}.forward{inspect.signature(_forward_of(model))}"
    except (TypeError, ValueError):
        sig = f"{name}.forward"
    return (f"{sig} does not take the course's batches (input_ids=..., labels=...): wrap it once, "
            "model = helpers.core.adapt.as_course_model(model) when forward(x, y) returns (logits, loss) or "
            "the "
            "loss, or as_course_model(model, loss_fn=F.cross_entropy) when forward(x) returns logits")


class CourseModel(nn.Module):
    """Your model behind the course's contract, returning `ModelOutput`; `.model` is yours (lessons 02-08)."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
                 = None, shape: ModelShape | None = None) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        if shape is not None:
            self.course_shape = shape  # helpers.measure.flops reads it before the config and the modules
        try:  # the forward's parameter names and kinds (a plain dict: the wrapper deep-copies)
            self._accepts = {n: p.kind for n, p in inspect.signature(_forward_of(model)).parameters.items()}
        except (TypeError, ValueError):
            self._accepts = {}

    def _extra(self, extra: dict[str, Any]) -> dict[str, Any]:
        # other batch keys go by name to a forward that takes them; dropping one (a mask) would change results
        open_ended = inspect.Parameter.VAR_KEYWORD in self._accepts.values()
        refused = [k for k in extra if k not in self._accepts and not open_ended]
        if refused:
            raise ValueError(f"the batch has {refused}, which {type(self.model).__name__}.forward does not "
                             f"take (its parameters: {list(self._accepts)}): give batches of (x, y) or dicts "
                             "of input_ids and labels only (a dropped attention_mask would change the "
                             "result)")
        return extra

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                **extra: Any) -> ModelOutput:
        kwargs = self._extra(extra)
        if self.loss_fn is not None:
            logits, loss = _split(self.model(input_ids, **kwargs))
            if logits is None:
                raise ValueError(f"as_course_model(loss_fn=...) needs logits, but "
                                 f"{type(self.model).__name__} returned only a 0-d tensor (a loss?): "
                                 "leave loss_fn out when the model computes its own loss")
            if labels is not None:
                flat = logits.dim() == labels.dim() + 1 and labels.dim() > 1
                loss = (self.loss_fn(logits.flatten(0, -2), labels.flatten()) if flat
                        else self.loss_fn(logits, labels))
            return ModelOutput(logits, loss)
        if "input_ids" in self._accepts:  # a forward of the course's names (a Hugging Face model): by name
            given = {"labels": labels} if labels is not None else {}
            out = self.model(input_ids=input_ids, **given, **kwargs)
        else:  # forward(x, y) or forward(x): by position
            out = self.model(input_ids, labels, **kwargs) if labels is not None else self.model(input_ids,
                                                                                                   **kwargs)
        logits, loss = _split(out)
        return ModelOutput(logits, loss)

    def __repr__(self) -> str:
        return f"CourseModel({self.model!r}, loss_fn={self.loss_fn!r})"


def as_course_model(model: nn.Module, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
                    = None, *, shape: ModelShape | None = None) -> nn.Module:
    """`model` behind the course's contract; one that follows it already is returned as it is, with `shape`
    attached when given (lessons 02-08, your own code)."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"as_course_model wraps an nn.Module, got {type(model).__name__}")
    if loss_fn is not None and not callable(loss_fn):
        raise ValueError(f"loss_fn must be callable as loss_fn(logits, labels), got {loss_fn!r}")
    if shape is not None and not isinstance(shape, ModelShape):
        raise ValueError(f"shape must be a helpers.core.adapt.ModelShape(n_layers, n_heads, head_dim), got "
                         f"{shape!r}")
    if isinstance(model, CourseModel):
        return model
    if loss_fn is None and follows_course_contract(model):
        if shape is not None:
            model.course_shape = shape
        return model
    return CourseModel(model, loss_fn, shape)
