"""Byte units, defined once so every module that reports memory divides by the same number."""

from __future__ import annotations

__all__ = ["GiB", "MiB"]

MiB = 2**20
GiB = 2**30  # what CUDA, nvidia-smi and the datasheets' "80 GB" memories count in, not 10⁹
