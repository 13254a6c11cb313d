"""Companion package of the course: the tools each lesson builds, in polished form.

Import what you need from its module (`from helpers.timing import benchmark`); the submodules
load lazily, so `import helpers` is cheap and does nothing at import time.
"""

from __future__ import annotations

import importlib
from typing import Any

_SUBMODULES = (
    "config", "hardware", "timing", "memory", "flops", "attention", "kernels",
    "plots", "widgets", "data", "models", "train", "distributed",
)
# Shortcuts re-exported at the top level: name -> module that defines it.
_SHORTCUTS = {
    "device_report": "hardware",
    "get_device": "hardware",
    "get_profile": "config",
    "benchmark": "timing",
}

__all__ = [*_SUBMODULES, *_SHORTCUTS]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _SHORTCUTS:
        return getattr(importlib.import_module(f"{__name__}.{_SHORTCUTS[name]}"), name)
    raise AttributeError(f"module 'helpers' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
