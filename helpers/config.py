"""The course profile (smoke or full), seeding, and sizes picked per profile."""

from __future__ import annotations

import os
import random
from typing import TypeVar

__all__ = ["PROFILES", "get_profile", "pick", "seed_everything"]

PROFILES = ("smoke", "full")  # smoke: tiny sizes, CI and CPUs; full: the real sizes, for a GPU
T = TypeVar("T")


def get_profile(value: str | None = None) -> str:
    """The profile: `value`, else $COURSE_PROFILE, else "full" on a CUDA machine and "smoke" elsewhere."""
    value = value if value is not None else os.environ.get("COURSE_PROFILE", "").strip()
    if not value:
        import torch

        return "full" if torch.cuda.is_available() else "smoke"
    value = value.lower()
    if value not in PROFILES:
        raise ValueError(f"unknown course profile {value!r}: use one of {', '.join(PROFILES)} "
                         "(set COURSE_PROFILE, or leave it unset for the default)")
    return value


def pick(profile: str, *, smoke: T, full: T) -> T:
    """The value for `profile`: one code path, only the sizes differ."""
    if profile not in PROFILES:
        raise ValueError(f"unknown course profile {profile!r}: use one of {', '.join(PROFILES)}")
    return smoke if profile == "smoke" else full


def seed_everything(seed: int = 0) -> None:
    """Seed Python, NumPy and torch (CPU and every GPU) so runs repeat."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
