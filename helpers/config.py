"""The course profile (smoke or full), seeding, sizes picked per profile, and whether the Hugging Face
hub may be used (the one reader of HF_HUB_OFFLINE and the one reachability probe; lessons 01 and 08)."""

from __future__ import annotations

import os
import random
import socket
from typing import TypeVar

__all__ = ["PROFILES", "get_profile", "pick", "seed_everything", "hub_offline", "hub_reachable"]

PROFILES = ("smoke", "full")  # smoke: tiny sizes, CI and CPUs; full: the real sizes, for a GPU
T = TypeVar("T")


def get_profile(value: str | None = None) -> str:
    """The profile: `value`, else $COURSE_PROFILE, else "full" on a CUDA machine and "smoke" elsewhere
    (every lesson's setup)."""
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
    """The value for `profile`: one code path, only the sizes differ (every lesson's setup)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown course profile {profile!r}: use one of {', '.join(PROFILES)}")
    return smoke if profile == "smoke" else full


def seed_everything(seed: int = 0) -> None:
    """Seed Python, NumPy and torch (CPU and every GPU) so runs repeat (every lesson)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


TRUE_WORDS = ("1", "true", "yes", "on")  # how Hugging Face reads a boolean environment variable


def hub_offline() -> bool:
    """True when HF_HUB_OFFLINE asks for no hub access (lessons 01 and 08 fall back to offline assets)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE_WORDS


def hub_reachable(timeout_s: float = 2.0) -> bool:
    """False when HF_HUB_OFFLINE is set or huggingface.co does not answer within `timeout_s` (lesson 08)."""
    if hub_offline():
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout_s):
            return True
    except OSError:
        return False
