"""A learnable synthetic task that needs no download: a substitution cipher (lessons 02-05).
Guide: docs/library/data.md#helpersdatasynthetic
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["synthetic_batch_fn"]


def synthetic_batch_fn(vocab_size: int, batch_size: int, seq_len: int, *, seed: int = 0,
                       pad_fraction: float = 0.0) -> Callable[[int, int], dict[str, torch.Tensor]]:
    """A resumable `batch_fn(step, micro)` of the cipher task for `helpers.train.loop.train` (lessons 02-05);
    the same call gives the same batch. `pad_fraction` > 0 pads row tails and adds an `attention_mask`."""
    if min(vocab_size, batch_size, seq_len) < 2 or not 0 <= pad_fraction < 1:
        raise ValueError(f"need vocab_size, batch_size, seq_len >= 2 and 0 <= pad_fraction < 1, got "
                         f"{vocab_size}, {batch_size}, {seq_len}, {pad_fraction}")
    perm = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))

    def batch_fn(step: int, micro: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_009 + micro)  # one stream per batch
        ids = torch.randint(vocab_size, (batch_size, seq_len), generator=g)
        labels = perm[ids]
        if not pad_fraction:  # no mask: attention takes its fastest path
            return {"input_ids": ids, "labels": labels}
        max_pad = int(seq_len * pad_fraction)
        lengths = seq_len - torch.randint(max_pad + 1, (batch_size,), generator=g)
        mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()  # (B, T), 1 = real token
        labels[mask == 0] = -100
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return batch_fn
