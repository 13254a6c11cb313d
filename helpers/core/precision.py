"""Precision names ("fp32", "tf32", "fp16", "bf16") and their switches: autocast, TF32, the GradScaler
(lesson 02 teaches them; 03-08 use them). Guide: docs/library/core.md#helperscoreprecision
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Literal, get_args

import torch

from helpers.core import compat

__all__ = ["Precision", "PRECISIONS", "PRECISION_DTYPE", "AUTOCAST_DTYPES", "check_precision",
           "precision_runs", "training_precision", "autocast_context", "autocast_factory", "uses_tf32",
           "set_tf32", "tf32_enabled", "tf32_matmuls", "make_scaler"]

Precision = Literal["fp32", "tf32", "fp16", "bf16"]  # the training precisions, in the order of the ladder
PRECISIONS: tuple[str, ...] = get_args(Precision)
# The dtype the tensors a precision computes with are stored in ("tf32" computes on float32 tensors;
# "fp8" is helpers.model.fp8's switch, listed so that every table keyed by precision uses these names).
PRECISION_DTYPE: dict[str, torch.dtype] = {
    "fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
    "fp8": torch.float8_e4m3fn,
}
AUTOCAST_DTYPES: dict[str, torch.dtype] = {"fp16": torch.float16, "bf16": torch.bfloat16}
_TF32_RUNGS = ("tf32", "fp16", "bf16", "fp8")  # precisions that keep TF32 on for float32 leftovers


def _check_name(precision: object, choices: tuple[str, ...] = PRECISIONS) -> str:
    if not isinstance(precision, str) or precision not in choices:
        hint = " (FP8 is a separate switch: helpers.model.fp8)" if precision == "fp8" else ""
        raise ValueError(f"unknown precision {precision!r}: use one of {choices}{hint}")
    return precision


def check_precision(precision: str, device: torch.device | str) -> None:
    """ValueError if `precision` is unknown or `device` cannot run it, saying what to use (lesson 02)."""
    _check_name(precision)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a torch device (try 'cpu' or 'cuda')") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"precision {precision!r} was asked for on {device}, but torch sees no CUDA GPU: "
                         "use device='cpu'")
    if precision in AUTOCAST_DTYPES and not torch.amp.is_autocast_available(device.type):
        raise ValueError(f"{precision} needs torch.autocast, which is not available on {device.type!r}: "
                         "use fp32")
    if device.type != "cuda":
        return
    # `device`'s own capability (torch.cuda.is_bf16_supported asks the current device, which may be another)
    name, cap = torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)
    if precision == "bf16" and cap < (8, 0):
        raise ValueError(f"bf16 needs a GPU of compute capability 8.0 or newer (Ampere); "
                         f"{name} is {cap[0]}.{cap[1]}: use fp16")
    if precision == "fp16" and cap < (5, 3):
        raise ValueError(f"fp16 needs a GPU of compute capability 5.3 or newer; {name} is "
                         f"{cap[0]}.{cap[1]}: use fp32")


def precision_runs(precision: str, device: torch.device | str) -> bool:
    """Whether `device` can run `precision` (check_precision without the error) (lessons 02, 08)."""
    try:
        check_precision(precision, device)
    except ValueError:
        return False
    return True


def training_precision(device: torch.device | str) -> tuple[str, str]:
    """(precision, why) a lesson trains in on `device`, from its compute capability alone (lessons 01-08)."""
    device = torch.device(device)
    if device.type != "cuda":
        return "fp32", f"fp32 (a {device.type.upper()}: 16-bit autocast is slower without bf16 units)"
    if not torch.cuda.is_available():
        raise ValueError(f"{device} was asked for, but torch sees no CUDA GPU: use device='cpu'")
    cap = torch.cuda.get_device_capability(device)
    if cap >= (8, 0):
        return "bf16", f"bf16 (sm_{cap[0]}{cap[1]}: bf16 tensor cores)"
    if cap >= (7, 0):
        return "fp16", f"fp16 (sm_{cap[0]}{cap[1]}: fp16 tensor cores, no bf16 ones)"
    return "fp32", f"fp32 (sm_{cap[0]}{cap[1]}: no tensor cores)"


def autocast_context(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The context for the forward pass: autocast to float16/bfloat16, nothing for fp32/tf32 (lesson 02)."""
    check_precision(precision, device)
    device = torch.device(device)
    if precision in AUTOCAST_DTYPES:
        return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[precision])
    return contextlib.nullcontext()


def autocast_factory(precision: str, device: torch.device | str, *,
                     check: bool = True) -> Callable[[], contextlib.AbstractContextManager]:
    """A maker of `autocast_context`, checked once (`check=False`: by the caller) (lessons 02, 08)."""
    if check:
        check_precision(precision, device)
    device_type, dtype = torch.device(device).type, AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device_type, dtype=dtype)


def uses_tf32(precision: str) -> bool:
    """Whether a run at `precision` keeps TF32 on for what still runs in float32: all but fp32 (lesson 02)."""
    return _check_name(precision, (*PRECISIONS, "fp8")) in _TF32_RUNGS


def tf32_enabled() -> bool:
    """Whether float32 CUDA matmuls may use TF32 tensor cores now (lesson 02)."""
    return compat.tf32_matmul_enabled()


def set_tf32(enabled: bool) -> None:
    """TF32 for float32 matmuls and cuDNN on or off, globally: prefer `tf32_matmuls` (lesson 02)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"set_tf32 takes True or False, got {enabled!r}")
    # "high": TF32 (or bf16x3) where fast units exist; CPUs without them keep exact float32.
    compat.set_tf32_settings("high" if enabled else "highest", enabled)


@contextlib.contextmanager
def tf32_matmuls(enabled: bool) -> Iterator[None]:
    """TF32 on (or off) inside the block; the matmul and cuDNN settings found come back after (lesson 02)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"tf32_matmuls takes True or False, got {enabled!r}")
    old = compat.tf32_settings()  # mixed per-backend settings come back as the defaults
    set_tf32(enabled)
    try:
        yield
    finally:
        compat.set_tf32_settings(*old)


def make_scaler(precision: str, device: torch.device | str,
                init_scale: float = 2.0 ** 16) -> torch.amp.GradScaler:
    """A GradScaler, enabled for fp16 only: bf16 and fp32 do not need one (lesson 02)."""
    _check_name(precision)
    if not init_scale > 0:
        raise ValueError(f"init_scale must be > 0, got {init_scale}")
    device = torch.device(device)
    return torch.amp.GradScaler(device.type, init_scale=init_scale, enabled=precision == "fp16")
