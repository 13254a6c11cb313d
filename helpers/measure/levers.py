"""The levers that make a training step fit, as data (`Levers`), and as the dry run applies them to a model:
LoRA's adapters, checkpointing, FSDP2's shards, bitsandbytes' 8-bit state (lesson 10).
Guide: docs/library/measure.md#helpersmeasurelevers"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from helpers.core import compat
from helpers.measure.flops import transformer_blocks

__all__ = ["LEVERS", "SHARDINGS", "OPTIMIZER_STATE_BYTES", "LoRA", "Levers", "AdamW8bitState",
           "EIGHT_BIT_MIN_SIZE", "EIGHT_BIT_BLOCK", "optimizer_state_bytes", "add_lora",
           "turn_on_checkpointing", "shard", "local_bytes"]

# optimizer state bytes per trainable parameter: AdamW's two float32 moments; bitsandbytes' two 8-bit ones
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "adamw8bit": 2, "sgd_momentum": 4, "sgd": 0}
EIGHT_BIT_MIN_SIZE = 4096  # bitsandbytes keeps a smaller tensor's state in float32 (its min_8bit_size)
EIGHT_BIT_BLOCK = 256  # elements per quantisation block: one float32 absmax each
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_CPU_KERNEL_COPIES = 5  # float32 copies of a tensor bitsandbytes' CPU kernel holds during its update


@dataclass(frozen=True)
class LoRA:
    """LoRA adapters through `peft` (lesson 10): rank, scale, target layers, the frozen base's precision."""

    rank: int = 8
    alpha: int = 16
    targets: tuple[str, ...] | str | None = None  # layer names; "all-linear"; None: peft's default
    base_dtype: str = "bf16"  # the frozen base model's weights; the adapters stay float32

    def __post_init__(self) -> None:
        if not (isinstance(self.rank, int) and self.rank >= 1 and isinstance(self.alpha, (int, float))):
            raise ValueError(f"LoRA needs a rank >= 1 and a numeric alpha, got rank={self.rank!r}, "
                             f"alpha={self.alpha!r}")
        if self.base_dtype not in _DTYPES:
            raise ValueError(f"LoRA.base_dtype={self.base_dtype!r}: use one of {tuple(_DTYPES)}")

    def config(self) -> Any:
        """peft's LoraConfig for these adapters."""
        peft = compat.optional_import("peft", "LoRA")
        targets = self.targets
        targets = list(targets) if isinstance(targets, tuple) else targets  # a str: "all-linear" as it is
        return peft.LoraConfig(r=self.rank, lora_alpha=self.alpha, target_modules=targets, lora_dropout=0.0)


LEVERS = ("accumulation", "checkpointing", "sharding", "offload", "16-bit weights", "8-bit state", "LoRA")
SHARDINGS = ("none", "optimizer", "full")  # DDP; ZeRO-1 (the optimizer state sharded); FSDP2 (everything)


@dataclass(frozen=True)
class Levers:
    """One combination of the memory levers for a step of `micro_batch` sequences per GPU (lesson 10);
    `Levers()` is a plain step: one sequence, one GPU, AdamW, every weight."""

    micro_batch: int = 1  # sequences per forward and backward on one GPU
    accumulation: int = 1  # micro-batches per optimizer step
    checkpointing: bool = False  # activations recomputed in the backward instead of kept
    gpus: int = 1  # data-parallel GPUs
    sharding: str = "none"  # SHARDINGS: what the GPUs share
    offload: bool = False  # FSDP2's CPUOffloadPolicy: the shards and the optimizer's step on the CPU
    weights16: bool = False  # weights, gradients and Adam's state in bf16 (no fp32 copy), as torchtune trains
    optimizer: str = "adamw"  # a key of OPTIMIZER_STATE_BYTES; "adamw8bit": bitsandbytes' 8-bit AdamW
    lora_rank: int = 0  # 0: every weight trains; r: LoRA adapters of rank r, the base frozen in bf16

    def __post_init__(self) -> None:
        for name in ("micro_batch", "accumulation", "gpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Levers.{name} must be a whole number >= 1, got {value!r}")
        for name in ("checkpointing", "offload", "weights16"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Levers.{name} must be True or False, got {getattr(self, name)!r}")
        if self.sharding not in SHARDINGS:
            raise ValueError(f"Levers.sharding must be one of {SHARDINGS}, got {self.sharding!r}")
        if self.sharding != "none" and self.gpus == 1:
            raise ValueError(f"sharding={self.sharding!r} needs gpus >= 2: one GPU has nothing to share")
        if self.offload and self.gpus > 1 and self.sharding != "full":
            raise ValueError("offload is FSDP2's: with gpus >= 2 it needs sharding='full'")
        if self.optimizer not in OPTIMIZER_STATE_BYTES:
            known = tuple(OPTIMIZER_STATE_BYTES)
            raise ValueError(f"unknown optimizer {self.optimizer!r}: use one of {known}")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ValueError(f"Levers.lora_rank must be a whole number >= 0, got {self.lora_rank!r}")

    @property
    def shards(self) -> int:
        """FSDP2's ranks: the GPUs with sharding='full', one with offload alone, else none (1)."""
        return self.gpus if self.sharding == "full" else 1

    @property
    def sharded(self) -> bool:
        """Whether the step runs under FSDP2 (several shards, or offload on one)."""
        return self.shards > 1 or self.offload

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accumulation * self.gpus

    def used(self) -> list[str]:
        """The levers this combination pulls, in LEVERS' words."""
        on = {"accumulation": self.accumulation > 1, "checkpointing": self.checkpointing,
              "sharding": self.sharding != "none", "offload": self.offload, "16-bit weights": self.weights16,
              "8-bit state": self.optimizer == "adamw8bit", "LoRA": self.lora_rank > 0}
        return [name for name in LEVERS if on[name]]

    def describe(self) -> str:
        """The combination in words: "micro-batch 2 x 8 accumulated, checkpointing"."""
        parts = [f"micro-batch {self.micro_batch}"
                 + (f" x {self.accumulation} accumulated" if self.accumulation > 1 else "")]
        parts += ["checkpointing"] * self.checkpointing
        if self.gpus > 1:
            shard = {"none": "DDP", "optimizer": "ZeRO-1", "full": "FSDP2"}[self.sharding]
            parts.append(f"{shard} over {self.gpus} GPUs")
        parts += ["optimizer offloaded to the CPU"] * self.offload
        parts += ["bf16 weights"] * self.weights16
        parts += ["8-bit AdamW state"] * (self.optimizer == "adamw8bit")
        parts += [f"LoRA r={self.lora_rank}"] * (self.lora_rank > 0)
        if self.optimizer not in ("adamw", "adamw8bit"):
            parts.append(self.optimizer)
        return ", ".join(parts)

    def dry_run_kwargs(self, lora_targets: tuple[str, ...] | str | None = None) -> dict[str, Any]:
        """The levers as `estimate_step_memory`'s keyword arguments (the batch given is one micro-batch)."""
        lora = LoRA(rank=self.lora_rank, alpha=2 * self.lora_rank, targets=lora_targets) if self.lora_rank \
            else None
        return dict(accumulation=self.accumulation, checkpointing=self.checkpointing, shards=self.shards,
                    offload=self.offload, optimizer=self.optimizer, lora=lora, weights16=self.weights16)


class AdamW8bitState(torch.optim.Optimizer):
    """bitsandbytes' AdamW8bit on fake tensors, as the dry run counts it: its state's layout, no real update;
    `kernels="cpu"` holds the CPU kernel's five float32 copies of a tensor as it updates it (lesson 10)."""

    def __init__(self, params: Any, lr: float = 1e-3, *, kernels: str = "cuda") -> None:
        if kernels not in ("cuda", "cpu"):
            raise ValueError(f"kernels={kernels!r}: use 'cuda' or 'cpu'")
        super().__init__(params, {"lr": lr})
        self.kernels = kernels
        self.qmaps: tuple[torch.Tensor, torch.Tensor] | None = None

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(self._new_state(p))
                state["step"] += 1
                if self.kernels == "cpu" and state["state1"].dtype == torch.uint8:
                    held = [torch.empty(p.shape, dtype=torch.float32, device=p.device)
                            for _ in range(_CPU_KERNEL_COPIES)]
                    del held

    def _new_state(self, p: torch.Tensor) -> dict[str, Any]:
        if p.numel() < EIGHT_BIT_MIN_SIZE:
            return {"step": 0, "state1": torch.zeros_like(p, dtype=torch.float32),
                    "state2": torch.zeros_like(p, dtype=torch.float32)}
        if self.qmaps is None:
            self.qmaps = (torch.zeros(256, device=p.device), torch.zeros(256, device=p.device))
        blocks = -(-p.numel() // EIGHT_BIT_BLOCK)
        return {"step": 0, "state1": torch.zeros_like(p, dtype=torch.uint8), "qmap1": self.qmaps[0],
                "state2": torch.zeros_like(p, dtype=torch.uint8), "qmap2": self.qmaps[1],
                "absmax1": torch.zeros(blocks, device=p.device),
                "absmax2": torch.zeros(blocks, device=p.device)}


def optimizer_state_bytes(model: nn.Module, optimizer: str) -> int:
    """Bytes of `optimizer`'s state for `model`'s trainable parameters, in its own layout (lesson 10)."""
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"unknown optimizer {optimizer!r}: use one of {tuple(OPTIMIZER_STATE_BYTES)}")
    total = 0
    for p in model.parameters():
        if not p.requires_grad:
            continue
        n = p.numel()
        if optimizer == "adamw8bit" and n >= EIGHT_BIT_MIN_SIZE:
            total += 2 * (n + 4 * -(-n // EIGHT_BIT_BLOCK))  # two uint8 moments, a float32 absmax per block
        elif optimizer == "adamw8bit":
            total += 2 * 4 * n  # a small tensor keeps float32 moments
        else:
            total += OPTIMIZER_STATE_BYTES[optimizer] * n
    return total


def add_lora(model: nn.Module, lora: LoRA) -> nn.Module:
    """`model` with `lora`'s peft adapters (float32), its base weights cast to lora.base_dtype and frozen
    (lesson 10)."""
    peft = compat.optional_import("peft", "LoRA")
    if compat.is_peft_model(model):
        raise ValueError("the model already has peft adapters: leave lora=None (the dry run counts them as "
                         "they are)")
    dtype = _DTYPES[lora.base_dtype]
    if any(p.is_floating_point() and p.dtype != dtype for p in model.parameters()):
        model = model.to(dtype)
    with warnings.catch_warnings():  # peft reads transformers' old name for it (deprecated in transformers 5)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing. is deprecated",
                                category=FutureWarning)
        return peft.get_peft_model(model, lora.config())


def turn_on_checkpointing(model: nn.Module) -> None:
    """Non-reentrant activation checkpointing of every block, by the model's own switch (lessons 03, 10)."""
    inner = compat.unwrap_model(model)
    target = getattr(inner, "model", inner) if type(inner).__name__ == "CourseModel" else inner
    if hasattr(target, "set_activation_checkpointing"):
        target.set_activation_checkpointing(True)
    elif compat.hf_model_in(target) is not None:
        compat.hf_activation_checkpointing(compat.hf_model_in(target), True)
    else:
        raise ValueError(f"checkpointing=True: {type(target).__name__} has no activation-checkpointing "
                         "switch (a SmallTransformer's or a Hugging Face model's): apply it to the model "
                         "yourself, torch.utils.checkpoint in its blocks, and leave checkpointing=False")


def shard(model: nn.Module, mesh: Any, *, offload: bool = False) -> nn.Module:
    """FSDP2 (`fully_shard`) on each Transformer block, then the whole model; `offload`: CPUOffloadPolicy, the
    shards, gradients and optimizer step on the CPU (lessons 07, 10)."""
    fully_shard = compat.fully_shard()
    policy = {}
    if offload:
        from torch.distributed.fsdp import CPUOffloadPolicy  # 0.5 s to import (2-core CPU): offload only

        policy = {"offload_policy": CPUOffloadPolicy(pin_memory=False)}
    blocks = transformer_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no list of Transformer blocks to shard one by one")
    for block in blocks:
        fully_shard(block, mesh=mesh, **policy)  # gathered whole just before its forward and backward
    fully_shard(model, mesh=mesh, **policy)
    return model


def local_bytes(tensors: Any) -> int:
    """Bytes of the tensors this rank holds (a DTensor's local shard), each tensor once (lesson 10)."""
    seen: set[int] = set()  # by id: fake tensors have no storage to tell shared ones apart
    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            local = t.to_local() if hasattr(t, "to_local") else t
            total += local.numel() * local.element_size()
    return total
