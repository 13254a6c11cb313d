"""One sizing rule for every lesson: the sizes it runs at on the device it finds (every lesson's sizes cell).

A lesson states three things in its sizes cell, the cell after its parameters cell:

- its sizes (`Size`: the full value, the smoke value, the smallest the fit may go to), by the names of the
  variables they set (`BATCH`, `SEQ`, ...);
- the order in which they may shrink (usually batch, then sequence, then width: what the lesson teaches
  shrinks last);
- one peak-memory estimate per step that memory limits, a function of the sizes returning bytes (training
  steps: `helpers.measure.memory.estimate_training_memory`; attention scores, matmuls, copies: plain
  arithmetic).

`fit_sizes` then applies the profile (`course.profile.get_profile`):

- smoke: the smoke sizes (CPUs, CI); nothing is checked.
- fit (the default on a CUDA GPU): the full sizes, each halved in the stated order (down to its floor) until
  every step's estimate fits the device's memory less the margin (`MARGIN`); then the sizes shrunk first are
  doubled back as far as the later cuts made room for. A step that cannot fit even at the floors is an error
  naming it and the memory it needs: a step is never dropped silently.
- full: the full (H100/H200-class) sizes as stated, refused with the memory each step needs and the device's
  where they do not fit.

Nothing is allocated on the device: the decision reads only the device's name and total memory (and, on a
CPU, the machine's RAM), so a test can make it for any GPU class on a CPU (tests/fakegpu.py). The lesson
prints `Fit.line()`: one line saying what it chose and why.

This module is in the base layer: it imports only `course.profile` and `helpers.core.precision` (the estimates
come in as functions, so the lesson's own estimator, from any layer, does the arithmetic).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from course.profile import get_profile
from helpers.core.precision import training_precision
from helpers.core.units import GiB
from helpers.measure.memory import MARGIN

__all__ = ["MARGIN", "Size", "DeviceMemory", "device_memory", "Fit", "fit_sizes", "SizingError"]



class SizingError(ValueError):
    """A lesson's steps do not fit this device at the sizes asked for (full) or at all (fit)."""


@dataclass(frozen=True)
class Size:
    """One size a lesson states: its full and smoke values, and the smallest the fit may shrink it to."""

    full: int
    smoke: int
    floor: int = 1

    def __post_init__(self) -> None:
        for name in ("full", "smoke", "floor"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Size.{name} must be a positive integer, got {value!r}")
        if self.floor > self.full:
            raise ValueError(f"Size.floor ({self.floor}) is above Size.full ({self.full})")


@dataclass(frozen=True)
class DeviceMemory:
    """A device's memory as the fit sees it: its name, total bytes and the bytes the steps may use."""

    name: str
    total_bytes: int
    usable_bytes: int  # total less the margin
    margin: float

    def describe(self) -> str:
        return f"{self.name}, {self.total_bytes / GiB:.1f} GiB"


def _ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # not a POSIX system
        return None


def device_memory(device: torch.device | str, margin: float = MARGIN) -> DeviceMemory | None:
    """The memory `device` has, from what it reports (a GPU's total memory; a CPU's or a Mac's RAM),
    allocating nothing; None where it cannot be read (every lesson's sizes cell)."""
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    device = torch.device(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        total, name = int(props.total_memory), props.name
    else:
        ram = _ram_bytes()
        if ram is None:
            return None
        total, name = ram, f"this machine's RAM ({device.type})"
    return DeviceMemory(name, total, int(total * (1 - margin)), margin)


Estimate = Callable[[Mapping[str, int]], int]  # the sizes -> a step's estimated peak bytes


@dataclass(frozen=True)
class Fit:
    """What a lesson runs at on this device, and why (every lesson's sizes cell)."""

    profile: str
    sizes: dict[str, int]
    full: dict[str, int]
    peaks: dict[str, int]  # step -> its estimated peak bytes at `sizes`
    memory: DeviceMemory | None
    precision: str  # helpers.core.precision.training_precision on this device
    precision_why: str
    steps: Mapping[str, Estimate] = field(repr=False, default_factory=dict)
    notes: tuple[str, ...] = ()
    binding: str | None = None  # the step that made the fit shrink, if any

    def __getitem__(self, name: str) -> int:
        if name not in self.sizes:
            raise KeyError(f"no size {name!r}: this lesson states {sorted(self.sizes)}")
        return self.sizes[name]

    def shrunk(self) -> dict[str, tuple[int, int]]:
        """The sizes the fit made smaller: name -> (chosen, full)."""
        return {k: (v, self.full[k]) for k, v in self.sizes.items() if v < self.full[k]}

    def line(self) -> str:
        """One line: the device, the sizes chosen (a shrunk one as "BATCH 16 of 64") and why, the precision
        (every lesson prints it)."""
        where = self.memory.describe() if self.memory else "memory unknown"
        sizes = ", ".join(f"{k} {v} of {self.full[k]}" if v < self.full[k] and self.profile != "smoke"
                          else f"{k} {v}" for k, v in self.sizes.items())
        if self.profile == "smoke":
            why = "smoke sizes (tiny, for CPUs and CI)"
        elif self.shrunk() and self.memory:
            need = self.peaks_at_full[self.binding] if self.binding else 0
            why = (f"at full size, {self.binding} needs {need / GiB:.1f} GiB of the "
                   f"{self.memory.usable_bytes / GiB:.1f} usable")
        else:
            why = f"full sizes; largest step {max(self.peaks.values(), default=0) / GiB:.1f} GiB"
        head = f"{self.profile} profile on {where}: {sizes} ({why})"
        return "; ".join([head, self.precision_why, *self.notes])

    @property
    def peaks_at_full(self) -> dict[str, int]:
        """Each step's estimated peak bytes at the full sizes."""
        return {name: int(est(self.full)) for name, est in self.steps.items()}


def _peaks(steps: Mapping[str, Estimate], sizes: Mapping[str, int]) -> dict[str, int]:
    peaks = {}
    for name, est in steps.items():
        value = est(dict(sizes))
        if not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"the estimate of step {name!r} returned {value!r}: it must return bytes (>= 0)")
        peaks[name] = int(value)
    return peaks


def _too_big(peaks: Mapping[str, int], usable: int) -> list[str]:
    return [name for name, b in peaks.items() if b > usable]


def _needs(peaks: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {b / GiB:.1f} GiB" for name, b in peaks.items())


class _Estimates:
    """Every step's estimate at a set of sizes, each set computed once."""

    def __init__(self, steps: Mapping[str, Estimate], usable: int) -> None:
        self.steps, self.usable, self.seen = steps, usable, {}

    def peaks(self, sizes: Mapping[str, int]) -> dict[str, int]:
        key = tuple(sorted(sizes.items()))
        if key not in self.seen:
            self.seen[key] = _peaks(self.steps, sizes)
        return self.seen[key]

    def too_big(self, sizes: Mapping[str, int]) -> list[str]:
        return _too_big(self.peaks(sizes), self.usable)


def _shrink(sizes: Mapping[str, Size], order: Sequence[str], est: _Estimates) -> dict[str, int]:
    """Halve each size in `order`, down to its floor, until every step fits; then double the ones shrunk
    before the last back up, first-shrunk first, as far as the later cuts made room for."""
    chosen, touched = {k: s.full for k, s in sizes.items()}, []
    for name in order:
        while est.too_big(chosen) and chosen[name] > sizes[name].floor:
            chosen[name] = max(sizes[name].floor, chosen[name] // 2)
            touched += [name] if name not in touched else []
        if not est.too_big(chosen):
            break
    if est.too_big(chosen):
        return chosen  # the caller reports what still does not fit
    for name in touched[:-1]:
        while chosen[name] < sizes[name].full:
            trial = {**chosen, name: min(sizes[name].full, chosen[name] * 2)}
            if est.too_big(trial):
                break
            chosen = trial
    return chosen


def _check(sizes: Mapping[str, Size], steps: Mapping[str, Estimate], shrink: Sequence[str]) -> None:
    unknown = [name for name in shrink if name not in sizes]
    if unknown:
        raise ValueError(f"shrink names {unknown}, which are not among the sizes {sorted(sizes)}")
    if len(set(shrink)) != len(shrink):
        raise ValueError(f"shrink names a size twice: {list(shrink)}")
    if not steps:
        raise ValueError("give at least one step's peak-memory estimate")


def fit_sizes(sizes: Mapping[str, Size], steps: Mapping[str, Estimate], *, shrink: Sequence[str],
              profile: str | None = None, device: torch.device | str = "cpu", margin: float = MARGIN,
              precision: str | None = None, notes: Sequence[str] = ()) -> Fit:
    """The lesson's sizes for `profile` on `device` (see the module's docstring): `sizes` by variable name,
    `steps` name -> estimate(sizes) in bytes, `shrink` the names in the order they may shrink; `precision`:
    the one a lesson fixes (e.g. "fp32"), else the device's (`training_precision`); `notes` are added to the
    line (other choices, e.g. what is skipped). Every lesson's sizes cell."""
    profile = get_profile(profile)
    _check(sizes, steps, shrink)
    if precision is None:
        precision, why = training_precision(device)
    else:
        why = f"{precision} (this lesson's precision on every device)"
    full = {k: s.full for k, s in sizes.items()}
    memory = device_memory(device, margin)
    common = dict(full=full, memory=memory, precision=precision, precision_why=why, steps=dict(steps),
                  notes=tuple(notes))
    if profile == "smoke":
        chosen = {k: s.smoke for k, s in sizes.items()}
        return Fit("smoke", chosen, peaks=_peaks(steps, chosen), **common)
    est = _Estimates(steps, memory.usable_bytes if memory else 0)
    if memory is None or not est.too_big(full):
        return Fit(profile, dict(full), peaks=est.peaks(full), **common)
    usable, at_full = memory.usable_bytes, est.peaks(full)
    if profile == "full":
        raise SizingError(
            f"the full profile does not fit {memory.describe()} ({usable / GiB:.1f} GiB usable with a "
            f"{margin:.0%} margin): at full size {_needs({k: at_full[k] for k in est.too_big(full)})}. "
            "Leave PROFILE unset (or set it to 'fit') to scale the sizes to this device")
    chosen = _shrink(sizes, shrink, est)
    left = est.too_big(chosen)
    if left:
        raise SizingError(
            f"this lesson does not fit {memory.describe()} ({usable / GiB:.1f} GiB usable) even at its "
            f"smallest sizes {chosen}: {_needs({k: est.peaks(chosen)[k] for k in left})}. Run it on a larger "
            "GPU, or with PROFILE = 'smoke'")
    binding = max(est.too_big(full), key=at_full.get)
    return Fit("fit", chosen, peaks=est.peaks(chosen), binding=binding, **common)
