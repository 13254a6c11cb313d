"""Sequence packing, the data side: documents share rows instead of being padded, and the masks that keep
them apart (lessons 06, 08). Running a model on packed batches is `helpers.model.packed_model`'s.
Guide: docs/library/data.md#helpersdatapacking
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

import torch
from torch.nn.attention.flex_attention import create_block_mask
from torch.utils.data import Sampler

__all__ = ["STRATEGIES", "PACKED_KEYS", "pack_lengths", "PackCollate", "PackedBatchSampler",
           "check_packed_batch", "document_mask", "document_block_mask", "varlen_segments"]

STRATEGIES = ("first_fit", "sequential")
PACKED_KEYS = ("input_ids", "attention_mask", "position_ids", "doc_ids", "first_index", "labels")


# --- packing ------------------------------------------------------------------------------------

def pack_lengths(lengths: Sequence[int], seq_len: int, strategy: str = "first_fit") -> list[list[int]]:
    """Rows of document indices whose lengths (each capped at `seq_len`) fit in `seq_len` (lesson 06)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    if any(int(n) < 1 for n in lengths):
        raise ValueError("every document needs at least one token (found an empty one)")
    sizes = [min(int(n), seq_len) for n in lengths]
    rows: list[list[int]] = []
    room: list[int] = []  # free tokens left in each row
    if strategy == "sequential":
        for i, n in enumerate(sizes):
            if not rows or room[-1] < n:
                rows.append([])
                room.append(seq_len)
            rows[-1].append(i)
            room[-1] -= n
        return rows
    # first-fit decreasing: longest first, each into the first row with room (ties keep input order)
    for i in sorted(range(len(sizes)), key=lambda j: -sizes[j]):
        n = sizes[i]
        row = next((r for r, free in enumerate(room) if free >= n), None)
        if row is None:
            rows.append([])
            room.append(seq_len)
            row = len(rows) - 1
        rows[row].append(i)
        room[row] -= n
    return rows


class PackCollate:
    """collate_fn: documents {"input_ids": list[int], "labels": int} -> a packed batch (lesson 06): input_ids,
    attention_mask, position_ids, doc_ids (R, T = seq_len); first_index, labels (D documents,)."""

    def __init__(self, seq_len: int, pad_token_id: int = 0, strategy: str = "first_fit") -> None:
        if not isinstance(seq_len, int) or seq_len < 2:
            raise ValueError(f"seq_len must be an int >= 2 (room for [CLS] and [SEP]), got {seq_len!r}")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        self.seq_len = seq_len
        self.pad_token_id = int(pad_token_id)
        self.strategy = strategy

    def __call__(self, batch: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if len(batch) == 0:
            raise ValueError("PackCollate got an empty batch")
        docs = [list(ex["input_ids"])[: self.seq_len] for ex in batch]  # truncate to seq_len
        rows = pack_lengths([len(d) for d in docs], self.seq_len, self.strategy)
        r, t = len(rows), self.seq_len
        input_ids = torch.full((r, t), self.pad_token_id, dtype=torch.long)
        position_ids = torch.zeros((r, t), dtype=torch.long)
        doc_ids = -torch.arange(1, r + 1).repeat_interleave(t).view(r, t)  # padding: -(row + 1)
        first_index = torch.empty(len(docs), dtype=torch.long)
        for row, members in enumerate(rows):  # one slice copy per document, no per-token work
            col = 0
            for d in members:
                n = len(docs[d])
                input_ids[row, col:col + n] = torch.as_tensor(docs[d], dtype=torch.long)
                position_ids[row, col:col + n] = torch.arange(n)
                doc_ids[row, col:col + n] = d
                first_index[d] = row * t + col
                col += n
        labels = torch.as_tensor([int(ex["labels"]) for ex in batch], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": (doc_ids >= 0).long(),
                "position_ids": position_ids, "doc_ids": doc_ids, "first_index": first_index,
                "labels": labels}

    def __repr__(self) -> str:
        return (f"PackCollate(seq_len={self.seq_len}, pad_token_id={self.pad_token_id}, "
                f"strategy={self.strategy!r})")


class PackedBatchSampler(Sampler[list[int]]):
    """batch_sampler: packs the whole epoch into rows, yields `rows_per_batch` rows' documents at a time
    (lesson 06). Pair it with PackCollate(seq_len, strategy="sequential")."""

    def __init__(self, lengths: Sequence[int], seq_len: int, rows_per_batch: int, *, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False) -> None:
        if rows_per_batch < 1:
            raise ValueError(f"rows_per_batch must be positive, got {rows_per_batch}")
        if len(lengths) == 0:
            raise ValueError("PackedBatchSampler needs at least one document length")
        self.lengths = [int(n) for n in lengths]
        self.seq_len, self.rows_per_batch = seq_len, rows_per_batch
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.epoch = 0
        self._cache: tuple[int, list[list[int]]] | None = None  # (epoch, its rows)
        pack_lengths(self.lengths[:1], seq_len)  # checks seq_len early

    def set_epoch(self, epoch: int) -> None:
        """A different (still reproducible) packing and order for each epoch."""
        self.epoch = epoch

    def _rows(self) -> list[list[int]]:
        if self._cache is not None and self._cache[0] == self.epoch:
            return self._cache[1]
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(len(self.lengths), generator=g).tolist() if self.shuffle else \
            list(range(len(self.lengths)))
        rows = [[order[i] for i in row] for row in pack_lengths([self.lengths[i] for i in order],
                                                                self.seq_len, "first_fit")]
        if self.shuffle:  # first-fit groups rows by length: mix them
            rows = [rows[i] for i in torch.randperm(len(rows), generator=g).tolist()]
        self._cache = (self.epoch, rows)
        return rows

    def __iter__(self) -> Iterator[list[int]]:
        rows = self._rows()
        for start in range(0, len(rows), self.rows_per_batch):
            chunk = rows[start:start + self.rows_per_batch]
            if self.drop_last and len(chunk) < self.rows_per_batch:
                return
            yield [d for row in chunk for d in row]

    def __len__(self) -> int:
        n = len(self._rows())
        return n // self.rows_per_batch if self.drop_last else -(-n // self.rows_per_batch)


def check_packed_batch(batch: Mapping[str, Any]) -> None:
    """ValueError unless `batch` has every key PackCollate makes (lessons 06 and 08)."""
    missing = [k for k in PACKED_KEYS if k not in batch]
    if missing:
        raise ValueError(f"not a packed batch (missing {missing}): build it with PackCollate")



# --- masks that keep documents apart -----------------------------------------------------------------

def document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """(R, 1, T, T) bool, True where query and key are in the same document (lesson 06)."""
    if doc_ids.dim() != 2:
        raise ValueError(f"doc_ids must be (rows, T), got shape {tuple(doc_ids.shape)}")
    # a padding tail is its own "document": no query row is all False (its softmax would be NaN)
    return (doc_ids[:, :, None] == doc_ids[:, None, :])[:, None]


def document_block_mask(doc_ids: torch.Tensor) -> Any:
    """FlexAttention BlockMask for `doc_ids` (R, T): a query sees keys of its own document (lesson 06)."""
    if doc_ids.dim() != 2:
        raise ValueError(f"doc_ids must be (rows, T), got shape {tuple(doc_ids.shape)}")

    def same_document(b, h, q_idx, kv_idx):  # noqa: ANN001 - FlexAttention passes index tensors
        return doc_ids[b, q_idx] == doc_ids[b, kv_idx]

    r, t = doc_ids.shape
    return create_block_mask(same_document, B=r, H=None, Q_LEN=t, KV_LEN=t, device=doc_ids.device)


def varlen_segments(doc_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Cumulative starts (S+1,) int32 of the documents and padding tails over the flattened rows, and the
    longest segment (lesson 08)."""
    flat = doc_ids.reshape(-1)
    change = torch.nonzero(flat[1:] != flat[:-1]).flatten() + 1
    ends = torch.cat([change, torch.tensor([flat.numel()], device=flat.device)])
    cu = torch.cat([torch.zeros(1, dtype=torch.long, device=flat.device), ends]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())
