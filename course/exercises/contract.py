"""The contract every check runs before its own tests, and the differential search that follows them (every
lesson; docs/exercises.md, "The contract and the search").

A check describes the learner's function once, as a `Task`: the course's solution (the reference), how a case
of inputs is drawn, built into fresh arguments, shown, and made smaller. Then:
- `contract(answer, task, case)` calls the answer on one case and names each breach in its own line: it
  changed what it was given, it left a global switch set (autocast, grad mode, ...), it changed state kept
  outside itself, it returned another type, dtype, device or shape than the solution, or two calls on fresh
  copies of the same inputs disagree;
- `search(answer, task, rng, draws=N)` compares the answer with the solution on N drawn cases (across the
  dtypes, sizes and regimes the task admits), shrinks the first failing case to the smallest it can, lets the
  check name a known mistake on it, and otherwise shows that input and the two outputs.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import math
import numbers
import runpy
import types
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from course.exercises.core import Wrong
from course.paths import solutions_dir

__all__ = ["Task", "contract", "search", "reference", "snapshot", "difference", "describe", "like",
           "same", "switches", "switch_changes", "restore_switches", "outer_state", "outer_changes",
           "case_note", "CASE_NOTE", "left_by_earlier_runs"]

# the input the search found an error on, named by core's "raised" line ("" outside a search)
CASE_NOTE: contextvars.ContextVar[str] = contextvars.ContextVar("course_exercise_case", default="")

_INPUT_HINT = ("leave what you were given as it was: work on a copy (list(x), dict(x), x.clone()) or on new "
               "objects; the code that called yours uses them again after it returns")
_STATE_HINT = ("keep what one call needs inside the function (a list made in its body, a counter set to 0 "
               "at its start): the lesson calls it again, and the next call would start from what this one "
               "left")
_SWITCH_HINT = ("set it inside a `with` block (torch.autocast(...), torch.no_grad(), ...), or put it back "
                "before returning: a switch set inside a function stays set for every later cell")


# --- the solution a check compares with ------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def reference(solution: str, name: str) -> Callable[..., Any]:
    """The course's solution `name`, from course/solutions/<solution> (read once per process): the reference
    of a check's differential search (every lesson)."""
    path = solutions_dir() / solution
    if not path.is_file():
        raise FileNotFoundError(f"no solution file at {path}: course/solutions/ ships with the course; "
                                "reinstall it (the set-up cell at the top of the lesson)")
    return runpy.run_path(str(path), run_name=f"course_solution_{name}")[name]


# --- describing values in one line -----------------------------------------------------------------------

def _torch() -> Any:
    import torch

    return torch


def _numpy() -> Any:
    import sys

    return sys.modules.get("numpy")


def _is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and isinstance(x, _torch().Tensor)


def _is_numpy(x: Any) -> bool:
    np = _numpy()
    return np is not None and isinstance(x, (np.generic, np.ndarray))


def describe(value: Any, width: int = 90) -> str:
    """What a value is, in one line: its kind, dtype and shape, and the values when there are few (every
    lesson's lines)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if _is_tensor(value):
        shown = ""
        if value.numel() <= 6:
            shown = " " + repr(value.detach().cpu().tolist())
        shape = "a 0-d" if value.dim() == 0 else f"a {tuple(value.shape)}"
        return f"{shape} {str(value.dtype).replace('torch.', '')} tensor{shown}"[:width]
    if _is_numpy(value):
        if getattr(value, "ndim", 0) == 0:
            return f"a numpy {value.dtype} ({value!r})"[:width]
        return f"a numpy {value.dtype} array of shape {value.shape}"
    if isinstance(value, numbers.Number):
        return f"{value:.6g}" if isinstance(value, float) else repr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(describe(v, 30) for v in value[:4]) + (", ..." if len(value) > 4 else "")
        kind = type(value).__name__
        return f"a {kind} of {len(value)}: [{inner}]"[:width]
    shown = " ".join(repr(value).split())
    return (shown if len(shown) <= width else shown[:width - 3] + "...")


# --- the kind of a result: type, dtype, device, shape ------------------------------------------------------

def _number_kind(x: Any) -> str | None:
    """"int", "float" or "bool" for Python numbers (numpy's float64 is a float), else None."""
    if isinstance(x, bool):
        return "bool"
    if _is_numpy(x) and not isinstance(x, float):
        return None
    if isinstance(x, int):
        return "int"
    if isinstance(x, float):
        return "float"
    return None


def like(got: Any, want: Any, name: str = "the result", *, exact_numbers: bool = False) -> Wrong | None:
    """Wrong("output-dtype", "output-type" or "return-shape") when `got` is not of the kind of `want`, the
    solution's result: a tensor's dtype, device and shape; a Python number (an int or a float, either unless
    `exact_numbers`), not a numpy scalar or a tensor; a sequence (a tuple's length too: a list's may differ,
    which is the values' business) of items of the same kinds; a string; None (every lesson)."""
    if _is_tensor(want):
        if not _is_tensor(got):
            return Wrong("output-type", f"{name} is {describe(got)}, not a tensor like the solution's "
                         f"({describe(want)})", "return a tensor, as the task says")
        if got.dtype != want.dtype:
            return Wrong("output-dtype", f"{name} is {_dt(got.dtype)}, the solution's {_dt(want.dtype)}: "
                         "the code that uses it (the next layer, the optimizer, the loss) expects that "
                         "dtype, and a float64 tensor meeting a float32 one is refused or silently promoted",
                         "compute in any precision you like, then return the dtype the task implies "
                         "(`.to(x.dtype)` for the dtype you were given)")
        if got.device.type != want.device.type:
            return Wrong("output-type", f"{name} is on {got.device.type}, the solution's on "
                         f"{want.device.type}", "make new tensors on the device of the inputs "
                         "(device=x.device)")
        if tuple(got.shape) != tuple(want.shape):
            return Wrong("output-type", f"{name} has shape {tuple(got.shape)}, the solution's "
                         f"{tuple(want.shape)}", "return the shape the task gives")
        return None
    if isinstance(want, (list, tuple)):
        fixed = isinstance(want, tuple)  # a tuple has a structure: so many values; a list any length
        if not isinstance(got, (list, tuple)) or (fixed and len(got) != len(want)):
            return Wrong("return-shape", f"{name} is {describe(got)}, not a {type(want).__name__}"
                         + (f" of {len(want)}" if fixed else "") + " like the solution's",
                         "return what the task names, in its order")
        for i, (g, w) in enumerate(zip(got, want)):
            wrong = like(g, w, f"item {i} of {name}", exact_numbers=exact_numbers)
            if wrong is not None:
                return wrong
        return None
    kind = _number_kind(want)
    if kind is not None:
        mine = _number_kind(got)
        if mine is None or mine == "bool" and kind != "bool" or (exact_numbers and mine != kind):
            fix = ("int(...)" if kind == "int" else "float(...)") + (
                " or .item()" if _is_tensor(got) or _is_numpy(got) else "")
            return Wrong("output-type", f"{name} is {describe(got)}, the solution's a Python {kind} "
                         f"({describe(want)})", f"return a Python {kind}: {fix}")
        return None
    if isinstance(want, str) and not isinstance(got, str):
        return Wrong("output-type", f"{name} is {describe(got)}, not a string like the solution's "
                     f"({want!r})", "return the name as a string")
    if want is None and got is not None:
        return Wrong("output-type", f"{name} is {describe(got)}; the solution returns None",
                     "return nothing")
    return None


# --- what was given, before and after the call -------------------------------------------------------------

@dataclass(frozen=True)
class _Snap:
    kind: str
    data: Any = None
    extra: Any = None


def snapshot(value: Any, depth: int = 0) -> _Snap:
    """A copy of `value` to compare with after a call: tensors (values, dtype, shape, requires_grad), modules
    (mode, parameters and buffers), lists, tuples, dicts and dataclasses item by item, numbers and strings;
    anything else by identity (every lesson)."""
    torch = _torch()
    if depth > 6:
        return _Snap("opaque", id(value))
    if _is_tensor(value):
        return _Snap("tensor", value.detach().clone(), (value.dtype, tuple(value.shape), value.requires_grad,
                                                        value.device.type))
    if isinstance(value, torch.nn.Module):
        params = {n: snapshot(p, depth + 1) for n, p in value.named_parameters()}
        buffers = {n: snapshot(b, depth + 1) for n, b in value.named_buffers()}
        return _Snap("module", (params, buffers), value.training)
    if isinstance(value, (list, tuple)):
        return _Snap(type(value).__name__, [snapshot(v, depth + 1) for v in value], [id(v) for v in value])
    if isinstance(value, dict):
        return _Snap("dict", {k: snapshot(v, depth + 1) for k, v in value.items()}, list(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _Snap("dataclass", {f.name: snapshot(getattr(value, f.name), depth + 1)
                                   for f in dataclasses.fields(value)})
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return _Snap("value", value)
    return _Snap("opaque", id(value))


def _tensor_change(before: _Snap, now: Any, name: str) -> str | None:
    torch = _torch()
    dtype, shape, grad, device = before.extra
    if not _is_tensor(now):
        return f"`{name}` is now {describe(now)} (it was a tensor)"
    if now.dtype != dtype:
        return f"`{name}` is now {_dt(now.dtype)} (it was {_dt(dtype)})"
    if tuple(now.shape) != shape:
        return f"`{name}` now has shape {tuple(now.shape)} (it had {shape})"
    if now.requires_grad != grad:
        return f"`{name}.requires_grad` is now {now.requires_grad} (it was {grad})"
    old = before.data
    if not torch.equal(torch.nan_to_num(old.detach().cpu(), nan=0.5),
                       torch.nan_to_num(now.detach().cpu(), nan=0.5)):
        changed = int((old.cpu() != now.detach().cpu()).sum())
        extra = ""
        if old.is_floating_point() and bool((old != 0).all()):
            ratio = (now.detach().cpu().double() / old.cpu().double()).flatten()
            if bool(torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-5)):
                extra = f": every value is now {ratio[0].item():.4g} times what it was"
        return f"it changed {changed} of the {old.numel()} values of `{name}` in place{extra}"
    return None


def _dt(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _module_change(before: _Snap, now: Any, name: str, values: bool) -> str | None:
    torch = _torch()
    if not isinstance(now, torch.nn.Module):
        return f"`{name}` is now {describe(now)} (it was a model)"
    if now.training != before.extra:
        mode = {True: "training", False: "eval"}
        return f"it put `{name}` in {mode[now.training]} mode (it was in {mode[before.extra]} mode)"
    params, buffers = before.data
    mine, now_buffers = dict(now.named_parameters()), dict(now.named_buffers())
    if set(mine) != set(params):
        return f"it changed the parameters of `{name}` (now {len(mine)}, before {len(params)})"
    for n, snap in params.items():
        if mine[n].dtype != snap.extra[0]:
            return f"it converted `{name}` to {_dt(mine[n].dtype)} (its parameters were {_dt(snap.extra[0])})"
    if not values:
        return None
    changes = [_tensor_change(snap, mine[n], f"{name}.{n}") for n, snap in params.items()]
    changes += [_tensor_change(snap, now_buffers.get(n), f"{name}.{n}") for n, snap in buffers.items()]
    return next((c for c in changes if c is not None), None)


def _sequence_change(before: _Snap, now: Any, name: str, values: bool) -> str | None:
    kind, items, ids = before.kind, before.data, before.extra
    if not isinstance(now, (list, tuple)):
        return f"`{name}` is now {describe(now)} (it was a {kind})"
    if len(now) != len(items):
        if not now:
            return f"it emptied the {kind} `{name}` it was given ({len(items)} items before the call)"
        what = "removed" if len(now) < len(items) else "added"
        return (f"it {what} {abs(len(now) - len(items))} item(s) of the {kind} `{name}` it was given "
                f"({len(items)} before the call, {len(now)} after)")
    if sorted(ids) == sorted(id(v) for v in now) and ids != [id(v) for v in now]:
        return f"it reordered the {kind} `{name}` it was given"
    changes = (difference(snap, v, f"{name}[{i}]", values=values)
               for i, (snap, v) in enumerate(zip(items, now)))
    return next((c for c in changes if c is not None), None)


def _dict_change(before: _Snap, now: Any, name: str, values: bool) -> str | None:
    if not isinstance(now, dict):
        return f"`{name}` is now {describe(now)} (it was a dict)"
    gone = [k for k in before.data if k not in now]
    if gone:
        return f"it removed the key {gone[0]!r} from the dict `{name}` it was given"
    new = [k for k in now if k not in before.data]
    if new:
        return f"it added the key {new[0]!r} to the dict `{name}` it was given"
    changes = (difference(snap, now[k], f"{name}[{k!r}]", values=values) for k, snap in before.data.items())
    return next((c for c in changes if c is not None), None)


def difference(before: _Snap, now: Any, name: str, *, values: bool = True) -> str | None:
    """How `now` differs from what `before` recorded, in plain words ("it emptied the list `batches` it was
    given (5 items before the call)"); None when it is as it was. `values=False`: a model the function is
    meant to train (its weights may change, not its mode, dtype or set of parameters) (every lesson)."""
    if before.kind == "tensor":
        return _tensor_change(before, now, name) if values else None
    if before.kind == "module":
        return _module_change(before, now, name, values)
    if before.kind in ("list", "tuple"):
        return _sequence_change(before, now, name, values)
    if before.kind == "dict":
        return _dict_change(before, now, name, values)
    if before.kind == "dataclass":
        changes = (difference(snap, getattr(now, f, None), f"{name}.{f}", values=values)
                   for f, snap in before.data.items())
        return next((c for c in changes if c is not None), None)
    if before.kind == "value" and not (type(now) is type(before.data) and now == before.data):
        return f"`{name}` is now {describe(now)} (it was {describe(before.data)})"
    return None


# --- state outside the function ----------------------------------------------------------------------------

def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def _outer_objects(fn: Any) -> dict[str, Any]:
    """The objects `fn` reaches outside itself, by the name it uses: the globals its code (and that of the
    functions of its own module it calls, and of functions defined inside it) names, its closure's cells,
    and its attributes; modules, classes and functions left out (their state is not the learner's)."""
    fn = inspect.unwrap(fn)
    found: dict[str, Any] = {}
    todo, seen = [fn], set()
    while todo:
        f = todo.pop()
        if not isinstance(f, types.FunctionType) or id(f) in seen:
            continue
        seen.add(id(f))
        for k, v in vars(f).items():
            if not k.startswith("__"):
                found[f"{f.__name__}.{k}"] = v
        cells = f.__closure__ or ()
        for n, cell in zip(f.__code__.co_freevars, cells):
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell: a name bound later
                continue
            if isinstance(v, types.FunctionType):
                todo.append(v)
            else:
                found[n] = v
        g = f.__globals__
        for code in _codes(f.__code__):
            for n in code.co_names:
                if n not in g:
                    continue
                v = g[n]
                if isinstance(v, types.FunctionType):
                    if v.__globals__ is g:  # a helper of the learner's, in the same cell or file
                        todo.append(v)
                elif not isinstance(v, (types.ModuleType, type, types.BuiltinFunctionType)) \
                        and not callable(v):
                    found[n] = v
    return found


def _light(value: Any) -> Any:
    """A cheap record of outside state: a container's length and items' identities, a tensor's version."""
    torch = _torch()
    if isinstance(value, (list, tuple, set, frozenset)) or type(value).__name__ == "deque":
        return (type(value).__name__, len(value), [id(v) for v in list(value)[:1000]])
    if isinstance(value, dict):
        return ("dict", len(value), list(value)[:1000], [id(v) for v in list(value.values())[:1000]])
    if _is_tensor(value):
        from helpers.core.compat import tensor_version  # here: torch is imported only once a tensor is met

        return ("tensor", tuple(value.shape), value.dtype, tensor_version(value))
    if isinstance(value, torch.nn.Module):
        return ("module", value.training)
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return ("value", value)
    return ("object", id(value))


def outer_state(fn: Any) -> dict[str, tuple[Any, Any]]:
    """What `fn` can reach outside itself, by name: (the object, a cheap record of it) (every lesson)."""
    return {n: (v, _light(v)) for n, v in _outer_objects(fn).items()}


def outer_changes(before: dict[str, tuple[Any, Any]], fn: Any) -> str | None:
    """The first change a call made to state outside the function, in plain words; None if none."""
    now = _outer_objects(fn)
    for name, (obj, record) in before.items():
        if name not in now:
            continue
        value = now[name]
        mine = _light(value)
        if mine == record:
            continue
        if record[0] in ("list", "tuple", "set", "frozenset", "deque", "dict") and mine[0] == record[0] \
                and mine[1] != record[1]:
            items = list(value.values()) if isinstance(value, dict) else list(value)
            errors = " (exceptions: each holds its traceback, and the objects of its frames)" \
                if any(isinstance(v, BaseException) for v in items) else ""
            return f"it changed `{name}`, a {record[0]} defined outside it ({record[1]} items before the " \
                   f"call, {mine[1]} after{errors})"
        if record[0] == "value":
            return f"it changed `{name}`, defined outside it, from {describe(record[1])} to {describe(value)}"
        if record[0] == "tensor":
            return f"it changed the tensor `{name}`, defined outside it"
        return f"it changed `{name}`, defined outside it"
    for name in now:
        if name not in before:
            return f"it defined `{name}` outside itself"
    return None


# What each answer reached outside itself when a check first called it, by the function object (a cell run
# again defines a new one, with fresh state): a later run of a check in the same kernel compares, since state
# an earlier run left (a dict filled, a `global` set once) changes what the next run sees.
_FIRST_MET: weakref.WeakKeyDictionary[Any, dict[str, tuple[Any, Any]]] = weakref.WeakKeyDictionary()


def _globals_set(fn: Any) -> set[str]:
    """The names `fn`'s code (and the code defined inside it) assigns with `global`."""
    import dis

    code = getattr(inspect.unwrap(fn), "__code__", None)
    if not isinstance(code, types.CodeType):
        return set()
    return {ins.argval for c in _codes(code) for ins in dis.get_instructions(c)
            if ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL")}


def left_by_earlier_runs(fn: Any) -> str | None:
    """What earlier calls of `fn` (in an earlier run of a check) left in the state outside it, in plain
    words; None when it is as when a check first met `fn` (the first time, it records it) (every lesson)."""
    target = inspect.unwrap(fn)
    if not isinstance(target, types.FunctionType):
        return None
    now = outer_state(target)
    try:
        first = _FIRST_MET.setdefault(target, now)
    except TypeError:  # not weakly referable
        return None
    assigned = _globals_set(target)
    for name, (obj, record) in first.items():
        if name not in now or now[name][1] == record:
            continue
        value, mine = now[name]
        if value is obj and record[0] in ("list", "set", "deque", "dict") and mine[1] != record[1]:
            return (f"`{name}`, a {record[0]} defined outside it, held {record[1]} item(s) when a check "
                    f"first called it and holds {mine[1]} now: earlier calls left them, and this run starts "
                    "from them")
        if value is obj and record[0] == "tensor":
            return f"the tensor `{name}`, defined outside it, was changed by earlier calls"
        if name in assigned:
            return (f"`{name}`, which it sets with `global`, was {describe(obj)} when a check first called "
                    f"it and is {describe(value)} now: this run starts from what earlier calls left")
    return None


# --- global switches -------------------------------------------------------------------------------------

def switches() -> dict[str, Any]:
    """torch's global switches a function could leave set: grad mode, inference mode, autocast (CPU, CUDA),
    the default dtype, float32 matmul precision, deterministic algorithms, anomaly detection, TF32 and
    cuDNN's benchmark (every lesson: a check saves them, and puts them back)."""
    torch = _torch()
    out: dict[str, Any] = {
        "grad mode (torch.is_grad_enabled())": torch.is_grad_enabled(),
        "inference mode": torch.is_inference_mode_enabled(),
        "the default dtype (torch.get_default_dtype())": torch.get_default_dtype(),
        "float32 matmul precision (torch.get_float32_matmul_precision())":
            torch.get_float32_matmul_precision(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "anomaly detection (torch.autograd.set_detect_anomaly)": torch.is_anomaly_enabled(),
        "TF32 matmuls (torch.backends.cuda.matmul.allow_tf32)": torch.backends.cuda.matmul.allow_tf32,
        "cuDNN benchmark (torch.backends.cudnn.benchmark)": torch.backends.cudnn.benchmark,
    }
    for device in ("cpu", "cuda"):
        try:
            out[f"autocast on {device} (torch.is_autocast_enabled({device!r}))"] = \
                torch.is_autocast_enabled(device)
        except (TypeError, RuntimeError):  # a torch without per-device autocast queries
            pass
    return out


def switch_changes(before: Mapping[str, Any]) -> list[str]:
    """The switches now other than in `before`, as "name: before -> now"."""
    now = switches()
    return [f"{name} is {now[name]!r} (it was {value!r})" for name, value in before.items()
            if name in now and now[name] != value]


def restore_switches(saved: Mapping[str, Any]) -> None:
    """Put every switch of `switches()` back as `saved` has it."""
    torch = _torch()
    for name, value in saved.items():
        if name.startswith("grad mode"):
            torch.set_grad_enabled(value)
        elif name.startswith("the default dtype"):
            torch.set_default_dtype(value)
        elif name.startswith("float32 matmul"):
            torch.set_float32_matmul_precision(value)
        elif name.startswith("deterministic"):
            torch.use_deterministic_algorithms(value)
        elif name.startswith("anomaly"):
            torch.autograd.set_detect_anomaly(value)
        elif name.startswith("TF32"):
            torch.backends.cuda.matmul.allow_tf32 = value
        elif name.startswith("cuDNN"):
            torch.backends.cudnn.benchmark = value
        elif name.startswith("autocast on"):
            device = "cuda" if "cuda" in name else "cpu"
            if torch.is_autocast_enabled(device) != value:
                torch.set_autocast_enabled(device, value)
        # inference mode is only ever entered as a context: it ends with its block


# --- the task: one exercise's function, for the contract and the search ------------------------------------

def _identity(returned: Any, arguments: Mapping[str, Any]) -> Any:
    return returned


@dataclass(frozen=True)
class Task:
    """One exercise's function as the contract and the search see it. A case is whatever `draw` returns: small
    and printable (`show`); `arguments(case)` builds fresh arguments from it on every call, by the skeleton's
    parameter names, in its order; the names in `keywords` are passed by keyword, the others by position."""

    reference: Callable[..., Any]  # the course's solution (or the given code it must agree with)
    draw: Callable[[Any], Any]  # rng (random.Random) -> a case, across the dtypes, sizes and regimes
    arguments: Callable[[Any], dict[str, Any]]  # case -> fresh arguments
    agree: Callable[[Any, Any, Any], str | None]  # (answer's observation, solution's, case) -> what differs
    show: Callable[[Any], str] = repr  # case -> the input in one line
    shrink: Callable[[Any], Iterable[Any]] = lambda case: ()  # case -> smaller cases, most promising first
    observe: Callable[[Any, Mapping[str, Any]], Any] = _identity  # (returned, arguments) -> what a call gave
    keywords: tuple[str, ...] = ()
    changes: tuple[str, ...] = ()  # arguments the function is meant to change (a model it trains)
    name: str = "your function"
    result: str = "the result"  # how the returned value is named in a line
    exact_numbers: bool = False  # an int where the solution returns a float (or back) is a breach
    validate: Callable[[Any, Any], None] | None = None  # (returned, case): the exercise's own type checks
    guard: Callable[[], Any] | None = None  # a context around each call (an op budget, a quick collector)
    hint: str = "run it on that input beside the task's rule, step by step"  # the search's generic hint
    outputs: tuple[str, ...] = field(default=())  # names of the returned values, for lines

    def call(self, fn: Callable[..., Any], arguments: Mapping[str, Any]) -> Any:
        positional = [v for k, v in arguments.items() if k not in self.keywords]
        keywords = {k: arguments[k] for k in self.keywords if k in arguments}
        if self.guard is None:
            return fn(*positional, **keywords)
        with self.guard():
            return fn(*positional, **keywords)


def _same(a: Any, b: Any) -> bool:
    """Whether two observations are the same, bit for bit (NaN equal to NaN; a list and a tuple alike)."""
    torch = _torch()
    if _is_tensor(a) or _is_tensor(b):
        if not (_is_tensor(a) and _is_tensor(b)) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        return bool(torch.equal(torch.nan_to_num(a.detach().cpu(), nan=0.25),
                                torch.nan_to_num(b.detach().cpu(), nan=0.25)))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if _is_numpy(a) or _is_numpy(b):
        return type(a) is type(b) and bool((a == b).all() if hasattr(a, "all") else a == b)
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:  # noqa: BLE001 - an object whose == does not answer a bool: not the same
        return a is b


same = _same



# --- the contract ----------------------------------------------------------------------------------------

def contract(answer: Callable[..., Any], task: Task, case: Any) -> tuple[Any, Any]:
    """Call `answer` on `case` and hold it to the contract, raising Wrong with one plain line per breach:
    "switch-left" (a global switch left set; put back), "hidden-state" (state outside it changed, or a second
    call on fresh copies of the same inputs gives another result), "input-changed" (it changed what it was
    given), "output-dtype" / "output-type" (not the solution's kind of result), after the exercise's own
    `validate`; -> (the answer's observation, the solution's) on that case (every lesson)."""
    earlier = left_by_earlier_runs(answer)
    if earlier is not None:
        raise Wrong("hidden-state", f"{earlier} (this check ran your {task.name} before, in this kernel)",
                    _STATE_HINT)
    arguments = task.arguments(case)
    before = {name: snapshot(value) for name, value in arguments.items()}
    outside = outer_state(answer)
    saved = switches()
    try:
        returned = task.call(answer, arguments)
    finally:
        left = switch_changes(saved)
        restore_switches(saved)
    if left:
        raise Wrong("switch-left", f"{task.name} left a global switch set: {left[0]} after it returned "
                    f"(on {task.show(case)})", _SWITCH_HINT)
    changed = outer_changes(outside, answer)
    if changed is not None:
        raise Wrong("hidden-state", f"{changed} (one call, on {task.show(case)})", _STATE_HINT)
    for name, value in arguments.items():
        change = difference(before[name], value, name, values=name not in task.changes)
        if change is not None:
            raise Wrong("input-changed", f"{change} (on {task.show(case)})", _INPUT_HINT)
    if task.validate is not None:
        task.validate(returned, case)
    want_returned = task.call(task.reference, task.arguments(case))
    mismatch = like(returned, want_returned, task.result, exact_numbers=task.exact_numbers)
    if mismatch is not None:
        raise Wrong(mismatch.mistake, f"{mismatch.what} (on {task.show(case)})", mismatch.hint)
    got = task.observe(returned, arguments)
    outside = outer_state(answer)
    second = task.call(answer, again := task.arguments(case))
    changed = outer_changes(outside, answer)
    if changed is not None:
        raise Wrong("hidden-state", f"{changed} (a second call, on {task.show(case)})", _STATE_HINT)
    if not _same(got, task.observe(second, again)):
        raise Wrong("hidden-state", f"called twice on the same input ({task.show(case)}, fresh copies each "
                    f"time), it gave {describe(got)}, then {describe(task.observe(second, again))}",
                    _STATE_HINT)
    return got, task.observe(want_returned, arguments)


# --- the differential search -----------------------------------------------------------------------------

@dataclass
class _Failure:
    got: Any = None
    want: Any = None
    what: str = ""  # what differs (agree's words, or like's)
    error: BaseException | None = None  # what the answer raised on the case
    wrong: Wrong | None = None  # a kind mismatch (like) found on the case


def _try(answer: Callable[..., Any], task: Task, case: Any) -> _Failure | None:
    """None when the answer agrees with the solution on `case`; else how it fails (an error it raised).
    Wrong("hidden-state") when the call changed state outside the answer."""
    outside = outer_state(answer)
    try:
        returned = task.call(answer, arguments := task.arguments(case))
    except (Wrong, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001 - the answer's error: shrunk, then raised again on the case
        return _Failure(error=err)
    changed = outer_changes(outside, answer)
    if changed is not None:
        raise Wrong("hidden-state", f"{changed} (on {task.show(case)})", _STATE_HINT)
    if task.validate is not None:
        try:
            task.validate(returned, case)
        except Wrong as wrong:
            return _Failure(returned, None, wrong.what, wrong=wrong)
    want_returned = task.call(task.reference, want_args := task.arguments(case))
    mismatch = like(returned, want_returned, task.result, exact_numbers=task.exact_numbers)
    if mismatch is not None:
        return _Failure(returned, want_returned, mismatch.what, wrong=mismatch)
    got, want = task.observe(returned, arguments), task.observe(want_returned, want_args)
    what = task.agree(got, want, case)
    return None if what is None else _Failure(got, want, what)


def _way(failure: _Failure) -> tuple[Any, ...]:
    """How a case fails: an error (of which type), a kind mismatch (which), or a difference (of what: the
    first words of `agree`'s line)."""
    if failure.error is not None:
        return ("error", type(failure.error))
    if failure.wrong is not None:
        return ("wrong", failure.wrong.mistake)
    return ("differs", tuple(failure.what.split(" ")[:2]))


def _shrink(answer: Callable[..., Any], task: Task, case: Any, failure: _Failure,
            budget: int = 60) -> tuple[Any, _Failure, int]:
    """The smallest case still failing the same way (`_way`), by greedy steps; the tries it made."""
    tries = 0
    improved = True
    while improved and tries < budget:
        improved = False
        for smaller in task.shrink(case):
            tries += 1
            again = _try(answer, task, smaller)
            if again is not None and _way(again) == _way(failure):
                case, failure, improved = smaller, again, True
                break
            if tries >= budget:
                break
    return case, failure, tries


class case_note:  # noqa: N801 - a context manager used like a function
    """While it is active, a "raised" line names the input the error came from (core._raised)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __enter__(self) -> None:
        self.token = CASE_NOTE.set(self.text)

    def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
        CASE_NOTE.reset(self.token)
        if err is not None and not getattr(err, "course_case", ""):
            try:
                err.course_case = self.text  # read by core's "raised" line, after this block has ended
            except AttributeError:  # an exception type that takes no attributes
                pass


def search(answer: Callable[..., Any], task: Task, rng: Any, *, draws: int,
           name: Callable[[Any, Any, Any], None] | None = None, key: str = "differs") -> int:
    """Compare `answer` with the solution on `draws` cases drawn from `rng`; on the first that fails, shrink
    it, then let `name(case, got, want)` raise Wrong naming a known mistake, and otherwise raise Wrong(`key`)
    with the smallest input found and the two outputs; an error the answer raises is raised again on the
    smallest input that raises, and its line names that input. -> the cases tried (every lesson)."""
    for i in range(draws):
        case = task.draw(rng)
        failure = _try(answer, task, case)
        if failure is None:
            continue
        if name is not None and failure.error is None and failure.wrong is None:
            name(case, failure.got, failure.want)  # a known mistake, named on the case as drawn
        case, failure, _ = _shrink(answer, task, case, failure)
        shown = task.show(case)
        if failure.error is not None:
            with case_note(shown):
                task.call(answer, task.arguments(case))  # raises again, with the input in the line
            failure = _try(answer, task, case) or failure  # it did not raise this time: compare instead
            if failure.error is not None:
                raise failure.error
        if failure.wrong is not None:
            raise Wrong(failure.wrong.mistake, f"{failure.wrong.what} (on {shown}, found among {i + 1} drawn "
                        "inputs)", failure.wrong.hint)
        if name is not None:
            name(case, failure.got, failure.want)
        raise Wrong(key, f"on {shown} (the smallest failing input found, after {i + 1} drawn) {task.name} "
                    f"gives {describe(failure.got)}, the course's solution {describe(failure.want)}: "
                    f"{failure.what}", task.hint)
    return draws
