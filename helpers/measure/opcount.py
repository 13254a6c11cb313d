"""Counting a training step's ops (lesson 04): per (phase, op) its calls, FLOPs, minimum bytes and class;
`count_step` counts a whole step on fake tensors for the planner (lesson 09).
Guide: docs/library/measure.md#helpersmeasureopcount"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping
from unittest import mock

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from helpers.core.adapt import adapter_hint, as_batch, batch_shape, loss_of, takes_course_batches
from helpers.core.compat import TorchDispatchMode, fake_step, op_schema, storage_identity
from helpers.core.precision import autocast_context
from helpers.measure.memory import fake_copy

__all__ = ["StepFn", "DEFAULT_PHASE", "OPTIMIZER_PHASE", "labelled_step", "check_phase", "op_class",
           "is_communication", "OpCount", "count_ops", "count_step", "gpu_like_attention"]

OPTIMIZER_PHASE = "optimizer"
DEFAULT_PHASE = "step"  # ops outside any `with phase(...)`
StepFn = Callable[[Callable[[str], Any]], Any]  # step(phase): `with phase("forward"): ...`


# --- the step: its phases --------------------------------------------------------------------------------

def labelled_step(model: torch.nn.Module, batch: Mapping[str, Any],
                  optimizer: torch.optim.Optimizer) -> StepFn:
    """A training step in three labelled phases, "forward" (with the loss), "backward", "optimizer", for
    `count_ops`, `time_ops` and `profile_step` (lessons 04, 05)."""
    if not callable(getattr(optimizer, "step", None)):
        raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")

    def step(phase: Callable[[str], Any]) -> None:
        with phase("forward"):
            loss = model(**batch).loss  # a Hugging Face model or SmallTransformer: the output carries .loss
        with phase("backward"):
            loss.backward()
        with phase(OPTIMIZER_PHASE):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return step


def check_phase(name: str) -> str:
    """A phase's name, stripped; a clear error for one that is empty or not a string (lesson 04)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a phase needs a name such as 'forward', 'backward' or 'optimizer', got {name!r}")
    return name.strip()


# --- op classes ------------------------------------------------------------------------------------------

# Op classes, first match wins, on the op's name ("aten::addmm"); views are found from the op's schema too.
_CLASS_PATTERNS = (
    ("communication", r"^c10d::|nccl|gloo|record_param_comms"),
    ("views (no data)", r"::(_unsafe_view|_reshape_alias|alias|detach|lift_fresh)$"),
    ("attention", r"scaled_dot_product|flash_attention|efficient_attention|cudnn_attention|flex_attention"),
    ("matmul", r"::(mm|addmm|bmm|baddbmm|matmul|linear|_scaled_mm|addmv|mv|dot)$"),
    ("LayerNorm", r"layer_norm"),
    ("GELU", r"gelu"),
    ("cross-entropy", r"log_softmax|nll_loss|cross_entropy"),
    ("softmax", r"softmax"),
    ("dropout", r"dropout|bernoulli"),
    ("embedding", r"embedding"),
    ("copies and layout", r"copy|clone|contiguous|::cat$|::stack$|_unsafe_view|index|gather|scatter|fill|"
                          r"zero|ones|empty|full|arange|::where$|narrow|slice|select|split|unbind"),
)


def op_class(op: str, phase: str = DEFAULT_PHASE, *, is_view: bool = False) -> str:
    """The class of an op ("matmul", "LayerNorm", "GELU", ...) from its name and phase (lesson 04)."""
    if not isinstance(op, str) or not op:
        raise ValueError(f"op must be an op name such as 'aten::mm', got {op!r}")
    if phase == OPTIMIZER_PHASE:
        return "optimizer step"
    if is_view and not is_communication(op):
        return "views (no data)"
    for name, pattern in _CLASS_PATTERNS:
        if re.search(pattern, op):
            return name
    return "elementwise and reductions"


def is_communication(name: str) -> bool:
    """Whether an op or profiler event is communication: c10d, NCCL, Gloo (lesson 04)."""
    return re.search(_CLASS_PATTERNS[0][1], name) is not None


# --- counting: calls, FLOPs, bytes -----------------------------------------------------------------------

# Ops that only move or make data: FLOPs 0 under the "one per element written" rule.
_NO_ARITHMETIC = re.compile(r"copy|clone|contiguous|::cat$|::stack$|index|gather|scatter|fill|zero|ones|"
                            r"empty|full|arange|::embedding$|narrow|slice|select|split|unbind|::where$|"
                            r"_unsafe_view|alias|detach|lift_fresh|scalar_tensor|::to$|::resize_$")
# Ops that move no data at all (allocations, metadata): bytes 0 even when their schema is not a view.
_NO_DATA = re.compile(r"::(empty|empty_like|empty_strided|_unsafe_view|_reshape_alias|alias|detach|"
                      r"lift_fresh|resize_|set_)$")
# Mutated arguments these ops overwrite without reading them.
_WRITE_ONLY = re.compile(r"::(fill_|zero_|bernoulli_|normal_|uniform_|random_|exponential_|copy_)$")
# Fused Adam(W)'s schema marks the gradients mutable, but its kernels write them back only when they unscale
# them (a `grad_scale` given: fused_adam_utils.cuh stores the gradient `if (grad_scale_ptr)`, as the CPU
# kernel does): without one the step reads the weight, its gradient and two moments, and writes three.
_GRADS_WRITTEN_WITH_SCALE = re.compile(r"::_fused_adamw?_$")


# SDPA's CPU kernel, counted with the library's own formulas (FlopCounterMode has them for the GPU kernels);
# FlopCounterMode hands a custom formula the shapes of the op's arguments, in the op's order.
def _query_heads(query: Any, kv: Any) -> tuple[int, ...]:
    # grouped-query attention: key/value (b, h_kv, s, d) counted as broadcast to the query's h heads, as
    # torch >= 2.12's formulas count them (torch 2.11's refuse h_kv != h)
    return (kv[0], query[1], *kv[2:])


def _sdpa_cpu_flop(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_flop_count(query, _query_heads(query, key), _query_heads(query, value))


def _sdpa_cpu_backward_flop(grad_out: Any, query: Any, key: Any, value: Any, *args: Any,
                            out_shape: Any = None, **kwargs: Any) -> int:
    return sdpa_backward_flop_count(grad_out, query, _query_heads(query, key), _query_heads(query, value))


_SDPA_CPU = {"_scaled_dot_product_flash_attention_for_cpu": _sdpa_cpu_flop,
             "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_cpu_backward_flop}


@dataclass(frozen=True)
class OpCount:
    """What one op did in one run of a step, all calls together: FLOPs and minimum bytes (lesson 04)."""

    phase: str
    op: str
    calls: int
    flops: float
    bytes_read: float
    bytes_written: float
    flops_source: str  # "FlopCounterMode", "1 per element written" or "none (moves data)"
    is_view: bool = False

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in an argument: a tensor, or lists/tuples/dicts of them (foreach ops take lists)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _stored_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor holds: a broadcast (stride-0) view counts its storage once."""
    try:
        stored = t.untyped_storage().nbytes() // max(t.element_size(), 1)
    except (RuntimeError, NotImplementedError):  # tensors without storage (meta, some subclasses)
        stored = t.numel()
    return min(t.numel(), stored) * t.element_size()


def _key(t: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    return (t.data_ptr(), t.numel(), tuple(t.shape))


# Gathers: (the argument read only where the indices point, how much of it is read). "rows": the distinct rows
# its indices name (an embedding table: one row per distinct token); "out": as many elements as the op
# returns (index, gather, index_select, take); "target": one element per target (nll_loss picks one
# log-probability per row). The other arguments (the indices) are read whole.
_GATHERS = {"aten::embedding": ("weight", "rows"), "aten::embedding_bag": ("weight", "rows"),
            "aten::_embedding_bag": ("weight", "rows"), "aten::index": ("self", "out"),
            "aten::index_select": ("self", "out"), "aten::gather": ("self", "out"),
            "aten::take": ("self", "out"),
            "aten::nll_loss_forward": ("self", "target"), "aten::nll_loss2d_forward": ("self", "target")}
# Arguments an op needs only for their shape: nll_loss_backward writes -1/N at the targets of a zeroed
# tensor shaped like its input, without reading the input's values.
_SHAPE_ONLY = {"aten::nll_loss_backward": ("self",), "aten::nll_loss2d_backward": ("self",)}
# Scatters: (the mutated argument, the argument whose size is what it updates, whether it reads what it
# updates). Only the updated elements of the destination move, not the whole tensor.
_SCATTERS = {"aten::index_put_": ("self", "values", "accumulate"), "aten::_index_put_impl_":
             ("self", "values", "accumulate"), "aten::index_add_": ("self", "source", True),
             "aten::index_copy_": ("self", "source", False), "aten::scatter_add_": ("self", "index", True),
             "aten::scatter_": ("self", "index", False), "aten::scatter_reduce_": ("self", "index", True)}


def _distinct_rows(weight: torch.Tensor, indices: torch.Tensor) -> int:
    """Bytes of the distinct rows of `weight` (a (rows, ...) table) that `indices` name."""
    rows = int(torch.unique(indices).numel()) if indices.numel() else 0
    return min(rows, weight.shape[0]) * (weight[0].numel() if weight.dim() else 1) * weight.element_size()


def _argument(schema: Any, args: tuple, kwargs: dict, name: str) -> Any:
    for i, arg in enumerate(schema.arguments):
        if arg.name == name:
            return args[i] if i < len(args) else kwargs.get(name, arg.default_value)
    return None


def _partial_bytes(name: str, schema: Any, args: tuple, kwargs: dict, out: Any) -> dict[str, tuple[int, int]]:
    """{argument: (bytes read, bytes written)} for the arguments an index op touches only in part."""
    if name in _GATHERS:
        arg, rule = _GATHERS[name]
        table = _argument(schema, args, kwargs, arg)
        if not isinstance(table, torch.Tensor):
            return {}
        if rule == "rows":
            index = _argument(schema, args, kwargs, "indices")
            return {arg: (_distinct_rows(table, index), 0)}
        if rule == "target":
            target = _argument(schema, args, kwargs, "target")
            return {arg: (min(target.numel(), table.numel()) * table.element_size(), 0)}
        result = next(_tensors(out), None)
        n = result.numel() if result is not None else table.numel()
        return {arg: (min(n, table.numel()) * table.element_size(), 0)}
    if name in _SHAPE_ONLY:
        return {arg: (0, 0) for arg in _SHAPE_ONLY[name]}
    if name in _SCATTERS:
        arg, by, reads = _SCATTERS[name]
        dest, size = _argument(schema, args, kwargs, arg), _argument(schema, args, kwargs, by)
        if not isinstance(dest, torch.Tensor) or not isinstance(size, torch.Tensor):
            return {}
        touched = min(size.numel(), dest.numel()) * dest.element_size()
        accumulates = bool(_argument(schema, args, kwargs, reads)) if isinstance(reads, str) else reads
        return {arg: (touched if accumulates else 0, touched)}
    return {}


def _traffic(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple[int, int, int]:
    """(bytes read, bytes written, elements written) of one call; index ops only what they touch."""
    schema = op_schema(func)
    name = schema.name
    if func.is_view or _NO_DATA.search(name):
        return 0, 0, 0
    partial = _partial_bytes(name, schema, args, kwargs, out)
    written: dict[tuple, torch.Tensor] = {}
    read: dict[tuple, torch.Tensor] = {}
    extra_read = extra_written = extra_elements = 0
    write_only = bool(_WRITE_ONLY.search(name))
    grads_kept = bool(_GRADS_WRITTEN_WITH_SCALE.search(name)) and _argument(schema, args, kwargs,
                                                                           "grad_scale") is None
    partial_keys: set[tuple] = set()
    for i, arg in enumerate(schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        mutated = arg.alias_info is not None and arg.alias_info.is_write and not (grads_kept
                                                                                  and arg.name == "grads")
        if arg.name in partial:  # touched in part: its bytes are counted by the rule, not whole
            r, w = partial[arg.name]
            extra_read, extra_written = extra_read + r, extra_written + w
            for t in _tensors(value):
                partial_keys.add(_key(t))
                extra_elements += w // max(t.element_size(), 1)
            continue
        for t in _tensors(value):
            if mutated or arg.is_out:
                written[_key(t)] = t
            if not (arg.is_out or (mutated and write_only)):
                read[_key(t)] = t
    for t in _tensors(out):
        if _key(t) not in partial_keys:  # an in-place scatter returns its destination: counted above
            written[_key(t)] = t
    return (sum(_stored_bytes(t) for t in read.values()) + extra_read,
            sum(_stored_bytes(t) for t in written.values()) + extra_written,
            sum(t.numel() for t in written.values()) + extra_elements)


class _Recorder(TorchDispatchMode):
    """Sees each op below autograd once: its calls, bytes, and the FLOPs FlopCounterMode counted for it."""

    def __init__(self, counter: FlopCounterMode) -> None:
        super().__init__()
        self.counter = counter
        self.phase = DEFAULT_PHASE
        self.calls: dict[tuple[str, str], list] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        before = self.counter.get_total_flops()
        out = func(*args, **kwargs)  # goes on to FlopCounterMode, below this mode on the stack
        name = op_schema(func).name
        if name.startswith("profiler::"):  # record_function's own ops
            return out
        library_flops = self.counter.get_total_flops() - before
        read, written, elements = _traffic(func, args, kwargs, out)
        entry = self.calls.setdefault((self.phase, name), [0, 0, 0, 0, 0, bool(func.is_view)])
        entry[0] += 1
        entry[1] += library_flops
        entry[2] += elements
        entry[3] += read
        entry[4] += written
        return out


def count_ops(step: StepFn, *, warmup: int = 1) -> dict[tuple[str, str], OpCount]:
    """Run `step(phase)` `warmup` times (one-off work such as optimizer state stays out), then once under the
    counters: calls, FLOPs and bytes per (phase, op) (lesson 04)."""
    if not callable(step):
        raise ValueError(f"step must be a function step(phase) that wraps its parts in `with phase(name):`, "
                         f"got {type(step).__name__}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    for _ in range(warmup):
        step(lambda name: contextlib.nullcontext())
    aten = torch.ops.aten
    extra = {getattr(aten, n): f for n, f in _SDPA_CPU.items() if hasattr(aten, n)}
    counter = FlopCounterMode(display=False, custom_mapping=extra)
    recorder = _Recorder(counter)

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        outer, recorder.phase = recorder.phase, check_phase(name)
        try:
            yield
        finally:
            recorder.phase = outer

    with counter, recorder:
        step(phase)
    counts = {}
    for (ph, name), (calls, lib_flops, elements, read, written, is_view) in recorder.calls.items():
        if lib_flops > 0:
            flops, source = float(lib_flops), "FlopCounterMode"
        elif is_view or _NO_ARITHMETIC.search(name) or op_class(name, ph) == "communication":
            flops, source = 0.0, "none (moves data)"
        else:
            flops, source = float(elements), "1 per element written"
        counts[(ph, name)] = OpCount(ph, name, calls, flops, float(read), float(written), source, is_view)
    return counts


# --- a training step counted on fake tensors (the planner, lesson 09) ----------------------------------

def _storage_key(t: torch.Tensor) -> tuple:
    """A tensor's identity that fake tensors have too: its storage, offset, shape and strides."""
    return (storage_identity(t), t.storage_offset(), t.numel(), tuple(t.shape), tuple(t.stride()))


def _rows_at_most(weight: torch.Tensor, indices: torch.Tensor) -> int:
    """Bytes of the rows `indices` can name, at most: one per index (fake indices have no values)."""
    rows = min(indices.numel(), weight.shape[0])
    return rows * (weight[0].numel() if weight.dim() else 1) * weight.element_size()


@contextlib.contextmanager
def gpu_like_attention() -> Iterator[None]:
    """Inside the block SDPA runs without its dropout, keeping no T x T matrix, as a GPU's fused kernels do
    (the CPU's would fall back to the math path): the dry run and the count see a GPU's step (lesson 09)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def without_dropout(*args: Any, **kwargs: Any) -> torch.Tensor:
        if len(args) > 4:
            args = (*args[:4], 0.0, *args[5:])
        kwargs.pop("dropout_p", None)
        return sdpa(*args, **kwargs)

    with mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", without_dropout):
        yield


@contextlib.contextmanager
def _fake_counting() -> Iterator[None]:
    # count_ops keys a tensor by its data pointer, which fake tensors lack (every one reads 0), and reads an
    # embedding's distinct rows with torch.unique, which needs values: on fake tensors it keys by storage and
    # counts an embedding's rows at most once per index. The module's globals are swapped, not count_ops'
    # arguments, so a real step's count keeps the exact rules and no caller can mix the two.
    with mock.patch.dict(globals(), {"_key": _storage_key, "_distinct_rows": _rows_at_most}):
        yield


def count_step(model: nn.Module, batch: Mapping[str, Any], *, precision: str = "fp32",
               fused_adamw: bool = True) -> dict[tuple[str, str], OpCount]:
    """Every op of one AdamW training step of `model` on `batch`, counted on fake tensors as `count_ops`
    counts a real step: nothing allocated, the model unchanged (lesson 09)."""
    if not takes_course_batches(model):
        raise ValueError(adapter_hint(model))
    host = as_batch(batch)
    batch_shape(host)
    cpu = torch.device("cpu")
    # the batch's values stay known: a model that reads one (transformers 4.x BERT: is the mask all ones?)
    # takes the branch a real step takes
    with fake_step(host, cpu) as fake_batch, _fake_counting(), gpu_like_attention():
        fake = _fake_of(model, cpu).train()
        params = [p for p in fake.parameters() if p.requires_grad]
        # fused: one kernel for the update; else torch's default on a GPU, the multi-tensor (foreach) one
        opt = torch.optim.AdamW(params, lr=1e-3, fused=True) if fused_adamw else \
            torch.optim.AdamW(params, lr=1e-3, foreach=True)

        def step(phase: Callable[[str], Any]) -> None:
            with phase("forward"), autocast_context(precision, cpu):
                loss = loss_of(fake(**fake_batch))
            if loss is None:
                raise ValueError("the model returned no loss for the batch: give it labels")
            with phase("backward"):
                loss.backward()
            with phase(OPTIMIZER_PHASE):
                opt.step()
                opt.zero_grad(set_to_none=True)

        for p in params:  # AdamW's state appears at its first step: made on zero gradients, not by a pass
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        counts = count_ops(step, warmup=0)
    # prim:: ops are the fake mode's own questions (a tensor's device), not kernels
    return {k: c for k, c in counts.items() if not k[1].startswith("prim::")}


def _fake_of(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` with fake parameters and buffers: the dry run's copy (helpers.measure.memory.fake_copy)."""
    return fake_copy(model, device)
