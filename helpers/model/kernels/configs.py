"""Tile configurations of the Triton kernels per GPU architecture (lesson 01): `tile_configs` decides what
fits one thread block's shared memory, `gpu_refusal` says what is not planned (head dims other than 64 and
128, fp32, GPUs below sm_75). Guide: docs/library/model.md#helpersmodelkernelsconfigs"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from helpers.core import compat

__all__ = ["TileConfig", "KERNELS", "COMPILED_TARGETS", "SHARED_MEMORY_PER_BLOCK", "GPU_HEAD_DIMS",
           "GPU_DTYPES", "shared_memory_per_block", "gpu_refusal", "tile_configs", "explicit_config",
           "course_launches"]

KiB = 1024
KERNELS = ("attn_fwd", "attn_bwd_dkdv", "attn_bwd_dq")
# Per-block shared memory, bytes: what Triton checks a launch against (the opt-in maximum per block).
# CUDA C++ Programming Guide, "Compute Capabilities", Table 31 "Memory Information per Compute Capability":
# https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/compute-capabilities.html
SHARED_MEMORY_PER_BLOCK: dict[tuple[int, int], int] = {
    (7, 5): 64 * KiB, (8, 0): 163 * KiB, (8, 6): 99 * KiB, (8, 7): 163 * KiB, (8, 9): 99 * KiB,
    (9, 0): 227 * KiB, (10, 0): 227 * KiB, (10, 3): 227 * KiB, (11, 0): 227 * KiB, (12, 0): 99 * KiB,
    (12, 1): 99 * KiB,
}
UNLISTED_LIMIT = 99 * KiB  # an sm_80+ GPU the table does not list: the smallest limit of any listed one
COMPILED_TARGETS = ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0))  # what the tests compile every config for
GPU_HEAD_DIMS = (64, 128)
GPU_DTYPES = (torch.float16, torch.bfloat16)
EXPLICIT_LAUNCH = dict(num_warps=4, num_stages=2)  # block sizes given by the caller: the rest of the launch


@dataclass(frozen=True)
class TileConfig:
    """One launch of a kernel: tile edges (queries, keys), warps per program, pipeline stages (lesson 01)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def __str__(self) -> str:
        return f"{self.block_m}x{self.block_n}, {self.num_warps} warps, {self.num_stages} stages"


@dataclass(frozen=True)
class _Candidate:
    config: TileConfig
    path: str  # "mma": sm_80 and newer (tensor cores, asynchronous copies); "fma": sm_75
    min_limit: int  # offered only where a block may have at least this much shared memory


def _c(path: str, min_kib: int, bm: int, bn: int, warps: int, stages: int) -> _Candidate:
    return _Candidate(TileConfig(bm, bn, warps, stages), path, min_kib * KiB)


# Candidates per (kernel, head dim), in order of preference: the forward is autotuned over every one
# offered, each backward kernel launches the first. Each is offered where a block may have `min_kib`, what
# it needed compiled as a launch compiles it (aligned, vectorised, pipelined from sm_80 on), triton 3.9;
# tests/test_triton_targets.py measures it again with the installed Triton. Largest forward tiles leave
# about 3 KB of room; the backward ones 26 KB or more.
_CANDIDATES: dict[tuple[str, int], tuple[_Candidate, ...]] = {
    ("attn_fwd", 64): (
        _c("mma", 64, 128, 64, 4, 3),  # 48 KB on sm_80/86/89, 64 KB on sm_90
        _c("mma", 64, 64, 64, 4, 2),  # 24 KB on sm_80/86/89, 40 KB on sm_90
        _c("fma", 64, 64, 64, 8, 2),  # 32 KB on sm_75 (stages change nothing there: no asynchronous copies)
    ),
    ("attn_fwd", 128): (
        _c("mma", 160, 128, 128, 8, 3),  # 160 KB on sm_80, 224 KB on sm_90: where a block may have 160 KB
        _c("mma", 96, 128, 64, 8, 3),  # 96 KB on sm_80/86/89, 128 KB on sm_90
        _c("mma", 64, 64, 64, 4, 2),  # 56 KB on sm_80/86/89, 80 KB on sm_90
        _c("fma", 64, 64, 32, 8, 2),  # 48 KB on sm_75 (64x64 needs all 64 KB there)
    ),
    ("attn_bwd_dkdv", 64): (
        _c("mma", 64, 64, 64, 4, 2),  # 40 KB
        _c("fma", 64, 32, 64, 8, 2),  # 48 KB on sm_75 (64x64 needs all 64 KB there)
    ),
    ("attn_bwd_dq", 64): (
        _c("mma", 64, 64, 64, 4, 2),  # 32 KB on sm_80/86/89, 48 KB on sm_90
        _c("fma", 64, 32, 64, 8, 2),  # 32 KB on sm_75
    ),
    ("attn_bwd_dkdv", 128): (
        _c("mma", 96, 64, 64, 8, 2),  # 72 KB on sm_80/86/89, 80 KB on sm_90
        _c("fma", 64, 16, 32, 4, 2),  # 48 KB on sm_75 (64x64: 128 KB, what did not fit; 32x32: 64 KB)
    ),
    ("attn_bwd_dq", 128): (
        _c("mma", 96, 64, 64, 8, 2),  # 72 KB on sm_80/86/89, 96 KB on sm_90
        _c("fma", 64, 32, 32, 8, 2),  # 48 KB on sm_75 (64x64: 96 KB)
    ),
}


def shared_memory_per_block(capability: tuple[int, int]) -> int:
    """Bytes of shared memory one thread block may use on a GPU of `capability` (lesson 01)."""
    capability = _check_capability(capability)
    if capability in SHARED_MEMORY_PER_BLOCK:
        return SHARED_MEMORY_PER_BLOCK[capability]
    if capability < (8, 0):
        raise ValueError(f"no Triton tile plan for sm_{capability[0]}{capability[1]}: the course's kernels "
                         "are planned for sm_75 and newer")
    return UNLISTED_LIMIT


def gpu_refusal(capability: tuple[int, int], dtype: torch.dtype, head_dim: int) -> str | None:
    """Why the compiled kernel is not launched for these inputs on this GPU, or None (lesson 01)."""
    capability = _check_capability(capability)
    sm = f"sm_{capability[0]}{capability[1]}"
    if capability < (7, 5):
        return (f"the Triton kernel's tiles are planned and compiled for sm_75 and newer, and this GPU is "
                f"{sm} (Triton's own README lists compute capability 8.0+ as supported): use SDPA here")
    compiles, why = compat.triton_compiles_for(capability)
    if not compiles:
        return why
    if dtype not in GPU_DTYPES:
        return (f"on a GPU the Triton kernel takes fp16 or bf16 inputs, got {dtype}: its tiles are planned "
                "for 2-byte elements (fp32 tiles need twice the shared memory); cast q, k, v with .half() "
                "or .bfloat16()")
    if dtype == torch.bfloat16 and capability < (8, 0):
        return (f"{sm} has no bf16 units (bf16 tensor cores start at sm_80), and the course plans and "
                f"compiles the {sm} tiles for fp16: pass fp16 inputs (.half())")
    if head_dim not in GPU_HEAD_DIMS:
        return (f"on a GPU the Triton kernel's tiles are planned for head dims {GPU_HEAD_DIMS}, got "
                f"{head_dim} (16 and 32 run in the interpreter, on CPU tensors)")
    return None


def tile_configs(kernel: str, capability: tuple[int, int], head_dim: int) -> tuple[TileConfig, ...]:
    """The configurations `kernel` launches with on a GPU of `capability` at `head_dim` (lesson 01)."""
    if kernel not in KERNELS:
        raise ValueError(f"no kernel named {kernel!r}: choose one of {KERNELS}")
    capability = _check_capability(capability)
    if head_dim not in GPU_HEAD_DIMS:
        raise ValueError(f"no tile plan for head dim {head_dim}: the compiled kernel is planned for "
                         f"{GPU_HEAD_DIMS}")
    limit = shared_memory_per_block(capability)
    path = "mma" if capability >= (8, 0) else "fma"
    offered = tuple(c.config for c in _CANDIDATES[(kernel, head_dim)]
                    if c.path == path and c.min_limit <= limit)
    assert offered, f"no {kernel} candidate for sm_{capability[0]}{capability[1]}, d={head_dim}"
    return offered


def explicit_config(capability: tuple[int, int], head_dim: int, block_m: int, block_n: int) -> TileConfig:
    """The forward launch for the caller's block sizes: the planned one, else 4 warps and 2 stages (Triton
    refuses it if it does not fit) (lesson 01)."""
    if head_dim in GPU_HEAD_DIMS:
        for config in tile_configs("attn_fwd", capability, head_dim):
            if (config.block_m, config.block_n) == (block_m, block_n):
                return config
    _check_capability(capability)
    return TileConfig(block_m, block_n, **EXPLICIT_LAUNCH)


def course_launches(targets: tuple[tuple[int, int], ...] = COMPILED_TARGETS,
                    ) -> dict[tuple[str, tuple[int, int], int], tuple[TileConfig, ...]]:
    """Every configuration launched on `targets`, per (kernel, capability, head dim), for the tests."""
    return {(kernel, cc, d): tile_configs(kernel, cc, d)
            for cc in targets for d in GPU_HEAD_DIMS for kernel in KERNELS}


def _check_capability(capability: object) -> tuple[int, int]:
    if (not isinstance(capability, tuple) or len(capability) != 2
            or not all(isinstance(x, int) for x in capability)):
        raise ValueError(f"capability must be (major, minor), as torch.cuda.get_device_capability() gives "
                         f"it, got {capability!r}")
    return capability
