"""A GPT written the way most people write one, for the tests of `helpers.core.adapt` (issue 33): its own
config class, its own attention, `forward(idx, targets=None) -> (logits, loss)`, `(x, y)` batches. Nothing in
it knows the course.

    from owngpt import GPT, GPTConfig, batches   # tests/ is on sys.path under pytest
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["GPTConfig", "GPT", "batches", "OddConfig", "OddGPT"]


@dataclass
class GPTConfig:
    block_size: int = 32
    vocab_size: int = 96  # below 1000: a vocabulary the ladder's random batches must fit
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        mask = torch.tril(torch.ones(config.block_size, config.block_size))
        self.register_buffer("bias", mask.view(1, 1, config.block_size, config.block_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._attend(x, self.n_head, self.n_embd)

    def _attend(self, x: torch.Tensor, n_head: int, n_embd: int) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(n_embd, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(config.n_embd), CausalSelfAttention(config)
        self.ln_2, self.mlp = nn.LayerNorm(config.n_embd), MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout), h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


@dataclass
class OddConfig:  # sizes under names no FLOP counter knows
    tokens: int = 96
    blocks: int = 2
    attention_groups: int = 2
    features: int = 32
    context: int = 32


class OddAttention(CausalSelfAttention):
    """The same attention, its sizes under names of its own."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config)
        self.groups, self.width = self.n_head, self.n_embd
        del self.n_head, self.n_embd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._attend(x, self.groups, self.width)


class OddGPT(GPT):
    """The same GPT whose config and attention keep their sizes under names no FLOP counter knows."""

    def __init__(self, odd: OddConfig) -> None:
        cfg = GPTConfig(block_size=odd.context, vocab_size=odd.tokens, n_layer=odd.blocks,
                        n_head=odd.attention_groups, n_embd=odd.features)
        super().__init__(cfg)
        self.config = odd
        for block in self.transformer.h:
            block.attn = OddAttention(cfg)


def batches(cfg: GPTConfig, n: int, batch_size: int = 4,
            seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`n` (x, y) batches of next-token prediction on a learnable sequence: y is x shifted by one."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        start = torch.randint(0, cfg.vocab_size, (batch_size, 1), generator=g)
        seq = (start + torch.arange(cfg.block_size + 1)) % cfg.vocab_size
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out
