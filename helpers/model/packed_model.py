"""Sequence packing, the model side: a classifier's forward on packed batches (`helpers.data.packing`),
with the attention that keeps documents apart, varlen attention, and what packing saves (lessons 06, 08).
Guide: docs/library/model.md#helpersmodelpacked_model"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers.core import compat
from helpers.core.adapt import ModelOutput
from helpers.data.packing import check_packed_batch, document_block_mask, document_mask, varlen_segments
from helpers.measure.flops import model_flops_per_token

# transformers is imported inside the functions that use it: about 3 s with its model classes (2-core CPU,
# `python -X importtime`), which importing this module for a model of your own should not pay

__all__ = ["VARLEN", "FLEX_BLOCK", "varlen_available", "use_varlen", "packed_forward", "PackedModel",
           "base_model", "PackingStats", "packed_padding_stats"]

FLEX_BLOCK = 128  # FlexAttention's default block: packed rows are padded to whole blocks for it
VARLEN = "course_varlen"  # name of the varlen attention registered with Hugging Face (use_varlen)


# --- varlen attention for Hugging Face models --------------------------------------------------------

def varlen_available(device: torch.device | str) -> tuple[bool, str]:
    """Whether `torch.nn.attention.varlen` can run on `device`, and why not in one line (lesson 08)."""
    device = torch.device(device)
    if compat.varlen_attn() is None:
        return False, f"torch {torch.__version__} has no torch.nn.attention.varlen (added in 2.9)"
    if device.type != "cuda" or not torch.cuda.is_available():
        return False, "varlen_attn runs FlashAttention kernels: CUDA only"
    if torch.cuda.get_device_capability(device) < (8, 0):
        name = torch.cuda.get_device_name(device)
        return False, f"{name} is older than Ampere (FlashAttention needs compute capability 8.0)"
    return True, "varlen_attn available"


def _varlen_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor,
                   max_len: int) -> torch.Tensor:
    varlen_attn = compat.varlen_attn()
    if varlen_attn is None:
        raise RuntimeError(f"torch {torch.__version__} has no torch.nn.attention.varlen (added in 2.9)")
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"varlen attention (FlashAttention) needs bf16 or fp16 activations, got {q.dtype}: "
                         "train with bf16 autocast, or keep attn_implementation='sdpa'")
    return varlen_attn(q, k, v, cu, cu, max_len, max_len)  # non-causal, default 1/sqrt(d) scale


def _varlen_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    # a Hugging Face attention function: varlen on a packed call (cu_seq_lens_q given), SDPA otherwise
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:  # an ordinary padded batch through the same model
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if dropout > 0:
        raise ValueError("varlen attention has no dropout: call helpers.core.compat.disable_dropout(model, "
                         "attention_only=True) (in every arm of a comparison) or model.eval()")
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
    ValueError where varlen cannot run (CPU, pre-Ampere GPU); check_device=False is for tests."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"use_varlen needs a Hugging Face model, got {type(model).__name__}")
    compat.require("transformers", compat.TRANSFORMERS_V5, "varlen attention for a Hugging Face BERT")
    if check_device:
        ok, why = varlen_available(next(model.parameters()).device)
        if not ok:
            raise ValueError(f"varlen attention cannot run here: {why}; keep attn_implementation='sdpa'")
    _register_varlen()
    return compat.set_attn_implementation(model, VARLEN)


# --- packed forward ----------------------------------------------------------------------------------

def _hf_packed_forward(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> Any:
    from transformers.modeling_outputs import SequenceClassifierOutput

    impl = compat.attn_implementation(model)
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
    # SmallTransformer's Block.forward with a document mask (R, 1, T, T) in place of its padding mask
    a, (r, t, _) = block.attn, x.shape
    q, k, v = a.qkv(block.ln1(x)).view(r, t, 3, a.cfg.n_heads, -1).permute(2, 0, 3, 1, 4)  # 3 x (R, H, T, d)
    drop = a.cfg.dropout if a.training else 0.0
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop)
    x = x + block.drop(a.proj(y.transpose(1, 2).reshape(r, t, -1)))
    return x + block.drop(block.mlp(block.ln2(x)))


def _small_packed_forward(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> Any:
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
    """Per-document logits (D, C) and loss of a packed batch: a BERT or SmallTransformer classifier (lessons
    06, 08)."""
    check_packed_batch(batch)
    if hasattr(model, "bert") and hasattr(model, "classifier"):
        return _hf_packed_forward(model, batch)
    if hasattr(model, "blocks") and hasattr(model, "cfg"):
        return _small_packed_forward(model, batch)
    raise TypeError(f"packed_forward knows BertForSequenceClassification-like models and "
                    f"SmallTransformer, got {type(model).__name__}")


class PackedModel(nn.Module):
    """`PackedModel(model)(**packed_batch)` runs `packed_forward`; `config`, `cfg` stay the model's
    (lesson 08)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        for attr in ("config", "cfg"):
            if hasattr(model, attr):
                object.__setattr__(self, attr, getattr(model, attr))

    def forward(self, **batch: torch.Tensor) -> Any:
        return packed_forward(self.model, batch)


def base_model(model: nn.Module) -> nn.Module:
    """The model inside PackedModel, torch.compile and DDP: the one to save or inspect (lesson 08)."""
    while True:
        inner = compat.unwrap_model(model)
        if not isinstance(inner, PackedModel):
            return inner
        model = inner.model  # its forward takes packed batches only


# --- what packing saves ------------------------------------------------------------------------------

@dataclass(frozen=True)
class PackingStats:
    """Counts over packed (or padded) batches; useful_flops counts real tokens only (lessons 06, 08)."""

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
    """Rows, documents, real tokens and padding of batches; with `model`, useful training FLOPs (each
    document attending to itself) (lessons 06, 08)."""
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
        inner = base_model(model)  # model_flops_per_token counts the model, not its packed forward
        flops = sum(count * n * model_flops_per_token(inner, n) for n, count in doc_lengths.items())
    return PackingStats(n_batches, rows, documents, real, slots, flops)
