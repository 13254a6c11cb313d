"""The course's library: what your own training code can import (docs/architecture.md maps it).

Its folders are its layers, lowest first; a module imports its own layer and the ones below, never one
above, and never the course's own package (`course`): `core` (versions, timing, devices, precision),
`measure` (roofline, FLOPs, memory, op counts), `data`, `model`, `train` (the loop, its switches,
checkpoints, DDP/FSDP, the ladder), `plan` (a run planned on GPUs you do not have).
Import from the module: `from helpers.core.timing import benchmark`.
"""

from __future__ import annotations

import importlib
from typing import Any

LAYERS = ("core", "measure", "data", "model", "train", "plan")  # lowest first: the folders under helpers/

__all__ = [*LAYERS, "LAYERS"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in LAYERS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'helpers' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
