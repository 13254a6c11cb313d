"""Seeding, so that runs repeat (every lesson, and your own training code)."""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["seed_everything"]


def seed_everything(seed: int = 0) -> None:
    """Seed Python, NumPy and torch (CPU and every GPU) so runs repeat (every lesson)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
