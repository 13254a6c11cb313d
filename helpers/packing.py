"""Sequence packing: documents share rows instead of being padded (lessons 06 and 08).

Documents of different lengths are packed, whole, into rows of `seq_len` tokens. Inside a row each
document keeps its own position ids (0, 1, 2, ... restarting at every document) and attends only to
itself; each document is classified from its own first token ([CLS]). So a packed batch computes, for
every document, what a padded batch computes, without spending FLOPs on padding.

A document longer than `seq_len` is truncated to its first `seq_len` tokens (its [SEP] is then lost,
as with the tokenizer's own truncation). Rows are filled first-fit (each document goes into the first
row with room for it, longest first) or sequentially (in order; a new row when one is full).

Which attention keeps documents apart follows the model's attention implementation, as Hugging Face
models choose it (`model.config._attn_implementation`):

- "sdpa" / "eager": a dense block-diagonal mask (rows, 1, T, T), made by one broadcast comparison of
  document ids; exact, dropout included, on every device. SDPA then cannot use its flash kernel.
- "flex_attention": a FlexAttention `BlockMask` from `create_block_mask` with a document mask_mod;
  fully masked blocks are skipped. Compiles on first use (~25 s on a CPU). No attention dropout.
  A GPU path for training: on a CPU FlexAttention has no backward pass (torch >= 2.11), so a packed
  forward that would train there is refused; on a CPU it serves to check results (under torch.no_grad).
  BERT runs it with transformers >= 5.0 only (4.x BERT has eager and sdpa).
- VARLEN ("course_varlen", set by `use_varlen(model)`): the rows are flattened into one sequence and
  `torch.nn.attention.varlen.varlen_attn` (FlashAttention on cumulative sequence lengths, CUDA with
  bf16/fp16 only) attends within each document; nothing is masked because nothing crosses. No
  attention dropout: HF's flex path and this one refuse to train with attention dropout > 0 (set it
  to 0 in every arm of a comparison with `disable_attention_dropout(model)`).

Hugging Face's `DataCollatorWithFlattening` (one row, position ids restarting per document) is not
enough for BERT on its own: with "sdpa" or "eager" attention, transformers 5.x builds BERT's mask
without looking at position ids, so the documents of a flattened row attend to each other (checked
with transformers 5.24, see tests/test_packing.py). Here the boundaries travel as `doc_ids` and every
path above honours them.

The course's SmallTransformer is packed with the dense mask and pools each document's own tokens (its
classifier averages the real tokens of a sequence).

Example (lessons 06 and 08):

    from torch.utils.data import DataLoader
    from helpers.packing import PackCollate, PackedBatchSampler, PackedModel, packed_padding_stats
    loader = DataLoader(train_ds, batch_size=32, shuffle=True,   # 32 documents per batch, packed
                        collate_fn=PackCollate(seq_len=512, pad_token_id=tokenizer.pad_token_id))
    packed = PackedModel(model)                 # model from load_bert(), or a SmallTransformer classifier
    out = packed(**next(iter(loader)))          # out.logits (documents, classes), out.loss
    stats = packed_padding_stats(loader, model) # rows, real tokens, padding fraction, useful FLOPs

For the least padding, pack the whole epoch and take a fixed number of rows per batch:

    sampler = PackedBatchSampler(train_ds.lengths, seq_len=512, rows_per_batch=8)
    loader = DataLoader(train_ds, batch_sampler=sampler,
                        collate_fn=PackCollate(512, tokenizer.pad_token_id, strategy="sequential"))

`helpers.train.train(PackedModel(model), loader, cfg)` trains on packed batches unchanged: a packed
batch's `attention_mask` (rows, T) marks real tokens, as a padded batch's does, so tokens are counted
the same way. Its documents are `labels.shape[0]`, not the number of rows.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import Sampler

from helpers import compat

__all__ = ["STRATEGIES", "VARLEN", "pack_lengths", "PackCollate", "PackedBatchSampler", "document_mask",
           "document_block_mask", "varlen_segments", "packed_forward", "PackedModel", "PackingStats",
           "packed_padding_stats", "use_varlen", "varlen_available", "disable_attention_dropout"]

STRATEGIES = ("first_fit", "sequential")
FLEX_BLOCK = 128  # FlexAttention's default block: packed rows are padded to whole blocks for it
VARLEN = "course_varlen"  # name of the varlen attention registered with Hugging Face (use_varlen)
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


# --- varlen attention for Hugging Face models --------------------------------------------------------

def varlen_available(device: torch.device | str) -> tuple[bool, str]:
    """Whether `torch.nn.attention.varlen` can run on `device`, and why not in one line (lesson 08)."""
    device = torch.device(device)
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False, f"torch {torch.__version__} has no torch.nn.attention.varlen (added in 2.9)"
    if device.type != "cuda" or not torch.cuda.is_available():
        return False, "varlen_attn runs FlashAttention kernels: CUDA only"
    if torch.cuda.get_device_capability(device) < (8, 0):
        name = torch.cuda.get_device_name(device)
        return False, f"{name} is older than Ampere (FlashAttention needs compute capability 8.0)"
    return True, "varlen_attn available"


def _varlen_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor,
                   max_len: int) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"varlen attention (FlashAttention) needs bf16 or fp16 activations, got {q.dtype}: "
                         "train with bf16 autocast, or keep attn_implementation='sdpa'")
    return varlen_attn(q, k, v, cu, cu, max_len, max_len)  # non-causal, default 1/sqrt(d) scale


def _varlen_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """HF attention function: varlen on a packed call (cu_seq_lens_q given), SDPA otherwise."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:  # an ordinary padded batch through the same model
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if dropout > 0:
        raise ValueError("varlen attention has no dropout: call disable_attention_dropout(model) "
                         "(in every arm of a comparison) or model.eval()")
    if scaling is not None and abs(scaling - query.shape[-1] ** -0.5) > 1e-6:
        raise ValueError(f"varlen path uses the default 1/sqrt(head_dim) scale, the model asks {scaling}")
    # query/key/value (1, H, total, d) -> (total, H, d), the layout varlen_attn takes
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))
    out = _varlen_kernel(q, k, v, cu, int(kwargs["max_length_q"]))  # (total, H, d)
    return out[None], None  # (1, total, H, d), as HF's attention functions return


@functools.cache
def _register_varlen() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: F401
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(VARLEN, _varlen_attention)
    AttentionMaskInterface.register(VARLEN, sdpa_mask)  # padded batches keep SDPA's padding mask


def use_varlen(model: nn.Module, *, check_device: bool = True) -> nn.Module:
    """Switch a Hugging Face model to varlen attention for packed batches, SDPA for padded ones (lesson 08).

    Raises ValueError where varlen cannot run (CPU, pre-Ampere GPU); check_device=False is for tests."""
    if not hasattr(model, "config") or not hasattr(type(model), "_from_config"):
        raise TypeError(f"use_varlen needs a Hugging Face model, got {type(model).__name__}")
    compat.require("transformers", compat.TRANSFORMERS_V5, "varlen attention for a Hugging Face BERT")
    if check_device:
        ok, why = varlen_available(next(model.parameters()).device)
        if not ok:
            raise ValueError(f"varlen attention cannot run here: {why}; keep attn_implementation='sdpa'")
    _register_varlen()
    return compat.set_attn_implementation(model, VARLEN)


def disable_attention_dropout(model: nn.Module) -> nn.Module:
    """Attention-probability dropout of a HF BERT set to 0: flex and varlen kernels have none (lesson 08)."""
    n = 0
    for name, module in model.named_modules():
        if name.endswith("attention.self") and isinstance(getattr(module, "dropout", None), nn.Dropout):
            module.dropout.p = 0.0
            if hasattr(module, "dropout_prob"):  # transformers 4.x SDPA attention reads this rate instead
                module.dropout_prob = 0.0
            n += 1
    if n == 0:
        raise ValueError(f"found no attention.self dropout in {type(model).__name__} (not a HF BERT?)")
    if hasattr(model, "config") and hasattr(model.config, "attention_probs_dropout_prob"):
        model.config.attention_probs_dropout_prob = 0.0
    return model


# --- packed forward ----------------------------------------------------------------------------------

def _check_batch(batch: Mapping[str, Any]) -> None:
    missing = [k for k in PACKED_KEYS if k not in batch]
    if missing:
        raise ValueError(f"not a packed batch (missing {missing}): build it with PackCollate")


def _hf_packed_forward(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> Any:
    from transformers.modeling_outputs import SequenceClassifierOutput

    impl = model.config._attn_implementation
    ids, pos, doc = batch["input_ids"], batch["position_ids"], batch["doc_ids"]
    kwargs: dict[str, Any] = {}
    if impl == VARLEN:  # rows flattened to one sequence (1, R*T); documents kept apart by cu_seqlens
        cu, longest = varlen_segments(doc)
        ids, pos, mask = ids.reshape(1, -1), pos.reshape(1, -1), None
        kwargs = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    elif impl == "flex_attention":
        trains = torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters())
        ok, why = compat.flex_trains(doc.device)
        if trains and not ok:
            raise RuntimeError(f"packing with attn_implementation='flex_attention' cannot train here: {why}. "
                               "Run it under torch.no_grad() to check results")
        # Guard (torch 2.11 on a CPU gave NaN documents for rows of T not a multiple of FlexAttention's
        # 128-token block): rows padded to whole blocks, the padding its own document, cut off after
        ids, pos, doc = (F.pad(x, (0, -ids.shape[1] % FLEX_BLOCK), value=v)
                         for x, v in ((ids, model.config.pad_token_id or 0), (pos, 0), (doc, -1)))
        mask = document_block_mask(doc)
    elif impl in ("sdpa", "eager"):  # the form (3-D or 4-D, bool or additive) depends on transformers
        dtype = model.bert.embeddings.word_embeddings.weight.dtype
        mask = compat.packing_attention_mask(document_mask(doc), impl, dtype)
    else:
        raise ValueError(f"packing supports attn_implementation 'sdpa', 'eager', 'flex_attention' or "
                         f"{VARLEN!r} (use_varlen), got {impl!r}")
    hidden = model.bert(ids, attention_mask=mask, position_ids=pos, **kwargs).last_hidden_state
    hidden = hidden[:, :batch["input_ids"].shape[1]] if impl == "flex_attention" else hidden  # (R, T, H)
    first = hidden.reshape(-1, hidden.shape[-1])[batch["first_index"]]  # (D, H): each document's [CLS]
    logits = model.classifier(model.dropout(model.bert.pooler(first[:, None, :])))  # pooler reads [:, 0]
    labels = batch.get("labels")
    loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
    return SequenceClassifierOutput(loss=loss, logits=logits)


def _small_block(block: nn.Module, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """SmallTransformer's Block.forward with a document mask (R, 1, T, T) in place of its padding mask."""
    a, (r, t, _) = block.attn, x.shape
    q, k, v = a.qkv(block.ln1(x)).view(r, t, 3, a.cfg.n_heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (R, H, T, d)
    drop = a.cfg.dropout if a.training else 0.0
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
    x = x + block.drop(a.proj(y.transpose(1, 2).reshape(r, t, -1)))
    return x + block.drop(block.mlp(block.ln2(x)))


def _small_packed_forward(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> Any:
    from helpers.models import ModelOutput

    cfg = model.cfg
    if not cfg.n_classes or cfg.causal:
        raise ValueError("packing a SmallTransformer needs a bidirectional classifier (n_classes > 0)")
    ids, doc = batch["input_ids"], batch["doc_ids"]
    r, t = ids.shape
    x = model.tok_emb(ids) + model.pos_emb(batch["position_ids"])  # (R, T, D)
    mask = document_mask(doc)  # (R, 1, T, T)
    for block in model.blocks:
        if model.activation_checkpointing and model.training and torch.is_grad_enabled():
            x = checkpoint(_small_block, block, x, mask, use_reentrant=False)
        else:
            x = _small_block(block, x, mask)
    x = model.ln_f(x).reshape(r * t, -1)
    # mean of each document's own tokens, as the model pools a padded sequence: (D, D_model)
    n_docs = batch["first_index"].numel()
    real = doc.reshape(-1) >= 0
    seg = doc.reshape(-1)[real]
    sums = torch.zeros(n_docs, x.shape[-1], dtype=x.dtype, device=x.device).index_add_(0, seg, x[real])
    counts = torch.bincount(seg, minlength=n_docs).clamp(min=1).to(x.dtype)
    logits = model.head(sums / counts[:, None])
    labels = batch.get("labels")
    loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
    return ModelOutput(logits, loss)


def packed_forward(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> Any:
    """Per-document logits (D, C) and loss of a packed batch, for a HF BERT classifier or a
    SmallTransformer classifier (lessons 06 and 08)."""
    _check_batch(batch)
    if hasattr(model, "bert") and hasattr(model, "classifier"):
        return _hf_packed_forward(model, batch)
    if hasattr(model, "blocks") and hasattr(model, "cfg"):
        return _small_packed_forward(model, batch)
    raise TypeError(f"packed_forward knows BertForSequenceClassification-like models and "
                    f"SmallTransformer, got {type(model).__name__}")


class PackedModel(nn.Module):
    """Wraps a classifier so that `PackedModel(model)(**packed_batch)` runs `packed_forward` (lesson 08).

    `config` / `cfg` are the wrapped model's, so FLOP counters read the same sizes."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        for attr in ("config", "cfg"):
            if hasattr(model, attr):
                object.__setattr__(self, attr, getattr(model, attr))

    def forward(self, **batch: torch.Tensor) -> Any:
        return packed_forward(self.model, batch)


# --- what packing saves ------------------------------------------------------------------------------

@dataclass(frozen=True)
class PackingStats:
    """Counts over packed (or padded) batches; useful_flops counts real tokens only (lessons 06 and 08)."""

    batches: int
    rows: int
    documents: int
    real_tokens: int
    slots: int  # rows x T: token positions computed
    useful_flops: float | None  # training FLOPs of the real tokens, each attending to its own document

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.real_tokens / self.slots

    @property
    def real_tokens_per_row(self) -> float:
        return self.real_tokens / self.rows


def packed_padding_stats(batches: Iterable[Mapping[str, torch.Tensor]],
                         model: nn.Module | None = None) -> PackingStats:
    """Rows, documents, real tokens and padding of packed or padded batches; with `model`, the useful
    training FLOPs (6·N per token + attention over each document's own length) (lessons 06 and 08)."""
    from helpers.flops import model_flops_per_token

    n_batches = rows = documents = real = slots = 0
    doc_lengths: dict[int, int] = {}  # length -> how many documents have it
    for batch in batches:
        mask = batch["attention_mask"]
        n_batches += 1
        rows += mask.shape[0]
        slots += mask.numel()
        real += int(mask.sum())
        if "doc_ids" in batch:  # packed: lengths of each document
            lengths = torch.bincount(batch["doc_ids"][batch["doc_ids"] >= 0]).tolist()
        else:  # padded: one document per row
            lengths = mask.sum(1).tolist()
        documents += len(lengths)
        for n in lengths:
            doc_lengths[int(n)] = doc_lengths.get(int(n), 0) + 1
    if n_batches == 0 or slots == 0:
        raise ValueError("packed_padding_stats got no batches")
    flops = None
    if model is not None:
        inner = model.model if isinstance(model, PackedModel) else model
        flops = sum(count * n * model_flops_per_token(inner, n) for n, count in doc_lengths.items())
    return PackingStats(n_batches, rows, documents, real, slots, flops)
