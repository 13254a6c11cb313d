"""Sequence packing, the data side: documents share rows instead of being padded (lessons 06 and 08).

Documents of different lengths are packed, whole, into rows of `seq_len` tokens. Inside a row each
document keeps its own position ids (0, 1, 2, ... restarting at every document) and attends only to
itself; each document is classified from its own first token ([CLS]). So a packed batch computes, for
every document, what a padded batch computes, without spending FLOPs on padding.

A document longer than `seq_len` is truncated to its first `seq_len` tokens (its [SEP] is then lost,
as with the tokenizer's own truncation). Rows are filled first-fit (each document goes into the first
row with room for it, longest first) or sequentially (in order; a new row when one is full).

This module makes packed batches (`PackCollate`, `PackedBatchSampler`) and the masks that keep documents
apart (`document_mask`, `document_block_mask`, `varlen_segments`); it needs no model. Running a model on
them, the attention each implementation uses, and what packing saves are `helpers.model.packed_model`'s.

Example (lessons 06 and 08):

    from torch.utils.data import DataLoader
    from helpers.data.packing import PackCollate, PackedBatchSampler
    loader = DataLoader(train_ds, batch_size=32, shuffle=True,   # 32 documents per batch, packed
                        collate_fn=PackCollate(seq_len=512, pad_token_id=tokenizer.pad_token_id))

For the least padding, pack the whole epoch and take a fixed number of rows per batch:

    sampler = PackedBatchSampler(train_ds.lengths, seq_len=512, rows_per_batch=8)
    loader = DataLoader(train_ds, batch_sampler=sampler,
                        collate_fn=PackCollate(512, tokenizer.pad_token_id, strategy="sequential"))

A packed batch's `attention_mask` (rows, T) marks real tokens, as a padded batch's does, so tokens are
counted the same way. Its documents are `labels.shape[0]`, not the number of rows.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Sequence

import torch
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
    """collate_fn: a list of {"input_ids": list[int], "labels": int} documents -> one packed batch.

    The batch holds, with R rows of T = seq_len tokens and D documents:
    input_ids (R, T); attention_mask (R, T), 1 = real token; position_ids (R, T), restarting at 0 in
    every document; doc_ids (R, T), the document (0..D-1) of each token, -(row + 1) on a row's padding
    tail; first_index (D,), each document's first token in the flattened (R*T) batch; labels (D,),
    documents in the order they were given (lesson 06).
    """

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
    """batch_sampler: every epoch, packs all documents first-fit into rows of `seq_len`, shuffles the
    rows and yields the documents of `rows_per_batch` rows at a time, row after row (lesson 06).

    Packing the whole epoch leaves far less padding than packing each batch's documents alone. Use
    it with PackCollate(seq_len, strategy="sequential"), which then needs at most `rows_per_batch`
    rows: the documents of each row fit in one row, so filling rows in order never needs more."""

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
    """(R, 1, T, T) bool, True where query and key are in the same document (lesson 06).

    One broadcast comparison; a row's padding tail is its own "document", so no query row is all False
    (an all-masked softmax row would be NaN)."""
    if doc_ids.dim() != 2:
        raise ValueError(f"doc_ids must be (rows, T), got shape {tuple(doc_ids.shape)}")
    return (doc_ids[:, :, None] == doc_ids[:, None, :])[:, None]


def document_block_mask(doc_ids: torch.Tensor) -> Any:
    """FlexAttention BlockMask for `doc_ids` (R, T): a query sees keys of its own document (lesson 06)."""
    from torch.nn.attention.flex_attention import create_block_mask

    if doc_ids.dim() != 2:
        raise ValueError(f"doc_ids must be (rows, T), got shape {tuple(doc_ids.shape)}")

    def same_document(b, h, q_idx, kv_idx):  # noqa: ANN001 - FlexAttention passes index tensors
        return doc_ids[b, q_idx] == doc_ids[b, kv_idx]

    r, t = doc_ids.shape
    return create_block_mask(same_document, B=r, H=None, Q_LEN=t, KV_LEN=t, device=doc_ids.device)


def varlen_segments(doc_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Cumulative segment starts (S+1,) int32 over the flattened rows, and the longest segment (lesson 08).

    Segments are the documents and the padding tails, in order: doc ids change at every boundary."""
    flat = doc_ids.reshape(-1)
    change = torch.nonzero(flat[1:] != flat[:-1]).flatten() + 1
    ends = torch.cat([change, torch.tensor([flat.numel()], device=flat.device)])
    cu = torch.cat([torch.zeros(1, dtype=torch.long, device=flat.device), ends]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())
