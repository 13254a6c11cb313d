"""The levers that make a training step fit, as data, and as the dry run applies them to a model (lesson 10).

When a step runs out of memory, one of four parts is too large: the parameters, the gradients, the
optimizer state or the activations. Each lever cuts one or more of them, at a cost in time:

| lever                     | what it cuts                                 | what it costs                |
|---------------------------|----------------------------------------------|------------------------------|
| `accumulation=k`          | activations: a micro-batch of B/k rows       | k passes per optimizer step  |
| `checkpointing=True`      | activations: each block keeps its input      | a second forward per block   |
| `shards=N` (FSDP2)        | parameters, gradients, optimizer state: 1/N  | all-gathers, reduce-scatters |
| `offload=True` (FSDP2)    | parameters, gradients, optimizer state: CPU  | PCIe copies, a CPU optimizer |
| `optimizer="adamw8bit"`   | optimizer state: 2 bytes a parameter, not 8  | (de)quantising the state     |
| `lora=LoRA(...)` (`peft`) | gradients and optimizer state: adapters only | the base stays frozen        |

With accumulation the batch given to the dry run is one micro-batch, and the gradients live through the whole
step: they add to the activations instead of replacing them. `Levers` holds one combination;
`helpers.measure.memory.estimate_step_memory(model, batch, **levers.kwargs())` counts its memory on fake
tensors. `AdamW8bitState` is bitsandbytes' 8-bit AdamW as the dry run counts it (bitsandbytes itself cannot
be built on fake tensors); `add_lora`, `turn_on_checkpointing` and `shard` apply the levers to a model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from helpers.core import compat
from helpers.measure.flops import transformer_blocks

__all__ = ["OPTIMIZER_STATE_BYTES", "LoRA", "Levers", "AdamW8bitState", "EIGHT_BIT_MIN_SIZE",
           "EIGHT_BIT_BLOCK", "optimizer_state_bytes", "add_lora", "turn_on_checkpointing", "shard",
           "local_bytes"]

# optimizer state bytes per trainable parameter: AdamW's two float32 moments; bitsandbytes' two 8-bit ones
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "adamw8bit": 2, "sgd_momentum": 4, "sgd": 0}
EIGHT_BIT_MIN_SIZE = 4096  # bitsandbytes keeps a smaller tensor's state in float32 (its min_8bit_size)
EIGHT_BIT_BLOCK = 256  # elements per quantisation block: one float32 absmax each
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_CPU_KERNEL_COPIES = 5  # float32 copies of a tensor bitsandbytes' CPU kernel holds during its update


@dataclass(frozen=True)
class LoRA:
    """LoRA adapters through `peft` (lesson 10): rank, scale, the layers they go on (None: peft's default for
    the architecture, e.g. q_proj and v_proj of a Llama), and the precision of the frozen base weights."""

    rank: int = 8
    alpha: int = 16
    targets: tuple[str, ...] | str | None = None  # layer names; "all-linear" (peft's word); None
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


@dataclass(frozen=True)
class Levers:
    """One combination of the memory levers (see the module docstring) (lesson 10); `Levers()` is a plain
    step: no accumulation, no checkpointing, one device, AdamW's float32 state, every weight trained."""

    accumulation: int = 1  # micro-batches per optimizer step: the batch is one of them
    checkpointing: bool = False  # activation checkpointing of every Transformer block
    shards: int = 1  # FSDP2 ranks sharing parameters, gradients and optimizer state
    offload: bool = False  # FSDP2's CPUOffloadPolicy: this rank's shards and the optimizer on the CPU
    optimizer: str = "adamw"  # a key of OPTIMIZER_STATE_BYTES; "adamw8bit": bitsandbytes' 8-bit AdamW
    lora: LoRA | None = None  # adapters through peft, the base frozen in lora.base_dtype

    def __post_init__(self) -> None:
        for name in ("accumulation", "shards"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Levers.{name} must be an int >= 1, got {value!r}")
        for name in ("checkpointing", "offload"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Levers.{name} must be True or False, got {getattr(self, name)!r}")
        if self.optimizer not in OPTIMIZER_STATE_BYTES:
            raise ValueError(f"unknown optimizer {self.optimizer!r}: use one of "
                             f"{tuple(OPTIMIZER_STATE_BYTES)}")
        if self.lora is not None and not isinstance(self.lora, LoRA):
            raise ValueError(f"Levers.lora must be a LoRA(...) or None, got {type(self.lora).__name__}")
        if self.optimizer == "adamw8bit" and (self.shards > 1 or self.offload):
            raise ValueError("optimizer='adamw8bit' with shards > 1 or offload: the dry run counts "
                             "bitsandbytes' 8-bit AdamW on whole parameters, not on FSDP2's shards (not "
                             "measured here): use optimizer='adamw' with sharding, or shards=1")

    @property
    def sharded(self) -> bool:
        """Whether the step runs under FSDP2 (several shards, or offload on one)."""
        return self.shards > 1 or self.offload

    def kwargs(self) -> dict[str, Any]:
        """The levers as `estimate_step_memory`'s keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def describe(self) -> str:
        """The levers in a few words, e.g. "LoRA r=8 + 8-bit AdamW + checkpointing" ("none" for none)."""
        words = ([f"accumulation x{self.accumulation}"] * (self.accumulation > 1)
                 + ["checkpointing"] * self.checkpointing
                 + [f"FSDP2 x{self.shards}"] * (self.shards > 1) + ["offload"] * self.offload
                 + ["8-bit AdamW"] * (self.optimizer == "adamw8bit")
                 + ([f"LoRA r={self.lora.rank}"] if self.lora is not None else []))
        if self.optimizer not in ("adamw", "adamw8bit"):
            words.append(self.optimizer)
        return " + ".join(words) or "none"


class AdamW8bitState(torch.optim.Optimizer):
    """bitsandbytes' AdamW8bit as the dry run counts it (lesson 10): for a tensor of EIGHT_BIT_MIN_SIZE
    elements or more, two uint8 moments and a float32 absmax per EIGHT_BIT_BLOCK elements for each, the two
    256-value quantisation maps shared by all; a smaller tensor keeps two float32 moments. Its update writes
    in place (bitsandbytes' CUDA kernel holds nothing more); `kernels="cpu"` holds what bitsandbytes' CPU
    kernel holds while it updates one tensor: five float32 copies of it. It computes no real update: it
    stands in for bitsandbytes' optimizer on fake tensors, which bitsandbytes cannot be built on."""

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
    """Bytes of `optimizer`'s state for the trainable parameters of `model`, laid out as it keeps it: AdamW's
    two float32 moments, or bitsandbytes' 8-bit AdamW (AdamW8bitState's layout; its two shared quantisation
    maps aside) (lesson 10)."""
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
    """`model` with `lora`'s adapters (peft's `get_peft_model`), its base weights cast to lora.base_dtype
    (where they are not already) and frozen, the adapters float32 (lesson 10)."""
    peft = compat.optional_import("peft", "LoRA")
    if compat.is_peft_model(model):
        raise ValueError("the model already has peft adapters: leave lora=None (the dry run counts them as "
                         "they are)")
    dtype = _DTYPES[lora.base_dtype]
    if any(p.is_floating_point() and p.dtype != dtype for p in model.parameters()):
        model = model.to(dtype)
    return peft.get_peft_model(model, lora.config())


def turn_on_checkpointing(model: nn.Module) -> None:
    """Activation checkpointing of every block, non-reentrant: SmallTransformer's switch, or the Hugging Face
    model's (a peft model's base model) (lessons 03, 10)."""
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
    """FSDP2 (`fully_shard`) on each Transformer block, then on the whole model (embeddings, head); with
    `offload`, CPUOffloadPolicy: each rank's shards, their gradients and the optimizer step on the CPU
    (lessons 07, 10)."""
    fully_shard = compat.fully_shard()
    policy = {}
    if offload:
        from torch.distributed.fsdp import CPUOffloadPolicy

        policy = {"offload_policy": CPUOffloadPolicy(pin_memory=False)}
    blocks = transformer_blocks(model)
    if not blocks:
        raise ValueError(f"{type(model).__name__} has no list of Transformer blocks to shard one by one")
    for block in blocks:
        fully_shard(block, mesh=mesh, **policy)  # gathered whole just before its forward and backward
    fully_shard(model, mesh=mesh, **policy)
    return model


def local_bytes(tensors: Any) -> int:
    """Bytes of the tensors this rank holds (a DTensor's local shard), each tensor once: what fake tensors
    count (they have no storage to tell shared ones apart) (lesson 10)."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            local = t.to_local() if hasattr(t, "to_local") else t
            total += local.numel() * local.element_size()
    return total
