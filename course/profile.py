"""The course's profile (smoke, fit or full) and the sizes picked per profile (every lesson's sizes cell).

smoke: tiny sizes, for CI and CPUs. fit: each lesson's full sizes, scaled down until its steps fit this
device's memory (`course.sizing`; the default on a GPU). full: the H100/H200-class sizes, by name, refused
where they do not fit."""

from __future__ import annotations

import os
from typing import Any, TypeVar

__all__ = ["PROFILES", "PROFILE_ENV", "get_profile", "pick", "small_config"]

PROFILES = ("smoke", "fit", "full")
PROFILE_ENV = "COURSE_PROFILE"
T = TypeVar("T")


def get_profile(value: str | None = None) -> str:
    """The profile: `value` (a lesson's PROFILE), else $COURSE_PROFILE, else "fit" on a CUDA machine and
    "smoke" elsewhere (every lesson's sizes cell)."""
    if value is not None and not isinstance(value, str):
        raise ValueError(f"PROFILE must be one of {', '.join(PROFILES)} or None (the default), got {value!r}")
    value = (value or "").strip() or os.environ.get(PROFILE_ENV, "").strip()
    if not value:
        import torch  # imported here: `course.profile` is read by course_setup-level code that avoids torch

        return "fit" if torch.cuda.is_available() else "smoke"
    value = value.lower()
    if value not in PROFILES:
        raise ValueError(f"unknown course profile {value!r}: use one of {', '.join(PROFILES)} "
                         f"(set PROFILE in the lesson's parameters cell or {PROFILE_ENV}, or leave both "
                         "unset for the default)")
    return value


def pick(profile: str, *, smoke: T, full: T) -> T:
    """The value for `profile`: `smoke`'s, else `full`'s (the fit profile starts from the full sizes and
    course.sizing scales the ones memory depends on) (every lesson's sizes cell)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown course profile {profile!r}: use one of {', '.join(PROFILES)}")
    return smoke if profile == "smoke" else full


def small_config(profile: str, **overrides: Any) -> Any:
    """The small Transformer's `TransformerConfig` for a profile: tiny for smoke, BERT-small-like for full
    (lessons 02–06)."""
    from helpers.model.models import TransformerConfig

    sizes = pick(profile, smoke=dict(d_model=128, n_heads=4, n_layers=2, max_len=256),
                 full=dict(d_model=512, n_heads=8, n_layers=8, max_len=1024))
    return TransformerConfig(**{**sizes, **overrides})
