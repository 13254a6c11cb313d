"""FLOPs per token (6·N + 12·L·H·Q·T) of every model family the helpers support, executed FLOPs and MFU."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers.measure.flops import (
    executed_flops,
    matmul_params,
    mfu,
    model_flops_per_token,
    transformer_flops_per_token,
)
from helpers.measure.roofline import peak_flops
from helpers.model.models import SmallTransformer, TransformerConfig

transformers = pytest.importorskip("transformers")


def gpt2_small_params() -> int:
    """GPT-2 124M counted by hand: 12 layers, d=768, vocab 50257; the tied wte counts (it is the head),
    the position table wpe does not."""
    d, layers, vocab = 768, 12, 50257
    per_layer = (2 * d                      # ln_1
                 + d * 3 * d + 3 * d        # c_attn
                 + d * d + d                # attn c_proj
                 + 2 * d                    # ln_2
                 + d * 4 * d + 4 * d        # mlp c_fc
                 + 4 * d * d + d)           # mlp c_proj
    return vocab * d + layers * per_layer + 2 * d  # wte + blocks + ln_f


def bert_base_encoder_matmul_params() -> int:
    """BERT-base's matmul weights run per token, by hand: 12 layers of Q, K, V, output (768² + 768 each)
    and the MLP (768·3072 + 3072, 3072·768 + 768). The pooler and classifier run once per sequence."""
    d, ff = 768, 3072
    return 12 * (4 * (d * d + d) + d * ff + ff + ff * d + d)


def test_gpt2_124m_flops_per_token_match_the_hand_count():
    n = gpt2_small_params()
    assert n == 123_653_376  # nanoGPT prints "number of parameters: 123.65M"
    # 6·N = 741,920,256; 12·L·H·Q·T = 12·12·12·64·1024 = 113,246,208
    assert transformer_flops_per_token(n, 12, 12, 64, 1024) == 855_166_464
    assert transformer_flops_per_token(n, 12, 12, 64, 1024, backward=False) == pytest.approx(855_166_464 / 3)


def test_hf_gpt2_model_counts_its_conv1d_layers():
    """HF GPT-2's layers are Conv1D, not nn.Linear: counting only Linear gave ~40 % of the FLOPs."""
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config())  # random weights, no download
    assert model_flops_per_token(model, 1024) == pytest.approx(855_166_464, rel=0.01)


def test_hf_bert_base_matches_the_hand_count():
    model = transformers.BertForSequenceClassification(transformers.BertConfig(num_labels=2))
    per_seq = 768 * 768 + 768 + 768 * 2 + 2  # pooler + classifier, once per sequence
    hand = 6 * bert_base_encoder_matmul_params() + 6 * per_seq / 512 + 12 * 12 * 12 * 64 * 512
    assert model_flops_per_token(model, 512) == pytest.approx(hand, rel=0.01)
    # 6 · 85,017,600 + 12·12·12·64·512 = 510,105,600 + 56,623,104
    assert model_flops_per_token(model, 512) == pytest.approx(566_728_704 + 6 * per_seq / 512, rel=1e-9)


def _counted_flops(model: torch.nn.Module, input_ids: torch.Tensor, **kw) -> int:
    """FLOPs torch counts for one forward + backward (matmuls and attention)."""
    with FlopCounterMode(display=False) as counter:
        out = model(input_ids, **kw)
        loss = out.loss if getattr(out, "loss", None) is not None else out.logits.float().pow(2).mean()
        loss.backward()
    return counter.get_total_flops()


# Small models, long sequences: the attention term is a large share, so a wrong one would show.
FAMILIES = {
    "small-lm": lambda: SmallTransformer(TransformerConfig(vocab_size=256, max_len=128, d_model=64, n_heads=4,
                                                           n_layers=2, attn="naive")),
    "small-classifier": lambda: SmallTransformer(TransformerConfig(vocab_size=256, max_len=128, d_model=64,
                                                                   n_heads=4, n_layers=2, attn="naive",
                                                                   n_classes=3)),
    "bert": lambda: transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
        max_position_embeddings=128, num_labels=3, attn_implementation="eager")),
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=0, eos_token_id=0,
        attn_implementation="eager")),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_flops_per_token_agree_with_torch_flop_counter(family):
    torch.manual_seed(0)
    model = FAMILIES[family]()
    batch, seq = 2, 128
    ids = torch.randint(0, 256, (batch, seq))
    labels = torch.randint(0, 3, (batch,)) if "classifier" in family or family == "bert" else ids
    counted = _counted_flops(model, ids, labels=labels)
    ours = model_flops_per_token(model, seq) * batch * seq
    assert ours == pytest.approx(counted, rel=0.10), f"{family}: ours {ours:.4g}, torch counted {counted:.4g}"


def test_model_flops_count_matmul_weights_once():
    cfg = TransformerConfig(vocab_size=1000, max_len=64, d_model=64, n_heads=4, n_layers=2)
    model = SmallTransformer(cfg)
    linears = 2 * (64 * 192 + 192 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64)
    assert matmul_params(model) == linears + 1000 * 64  # the tied head counts once, positions do not
    assert model_flops_per_token(model, 64) == 6 * (linears + 64_000) + 12 * 2 * 4 * 16 * 64
    compiled_like = torch.nn.Module()
    compiled_like._orig_mod = model  # what torch.compile wraps a model in
    assert model_flops_per_token(compiled_like, 64) == model_flops_per_token(model, 64)
    with pytest.raises(ValueError, match="seq_len must be a positive integer"):
        model_flops_per_token(model, 0)


def test_executed_flops_count_padding_at_each_batch_width():
    model = SmallTransformer(TransformerConfig(vocab_size=100, max_len=64, d_model=32, n_heads=2, n_layers=1))
    batches = [{"input_ids": torch.zeros(4, 16, dtype=torch.long)}, (2, 64)]
    want = 4 * 16 * model_flops_per_token(model, 16) + 2 * 64 * model_flops_per_token(model, 64)
    assert executed_flops(model, batches) == pytest.approx(want)
    assert executed_flops(model, batches, backward=False) == pytest.approx(want / 3)
    with pytest.raises(TypeError, match="batch 0"):
        executed_flops(model, [torch.zeros(4, 16)])


def test_mfu_from_a_given_throughput():
    # nanoGPT's example: GPT-2 124M at T=1024 on an A100 (312 TFLOPS bf16)
    per_token = transformer_flops_per_token(gpt2_small_params(), 12, 12, 64, 1024)
    tokens_per_s = 150_000.0
    assert mfu(tokens_per_s, per_token, 312e12) == pytest.approx(150_000 * 855_166_464 / 312e12)
    assert mfu(tokens_per_s, per_token, 312e12) == pytest.approx(0.4111, abs=1e-4)
    peak = peak_flops(precision="bf16", gpu_name="NVIDIA A100-SXM4-80GB")
    assert mfu(tokens_per_s, per_token, peak) == mfu(tokens_per_s, per_token, 312e12)
    with pytest.raises(ValueError, match="peak > 0"):
        mfu(1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="non-negative integers"):
        transformer_flops_per_token(-1, 1, 1, 1, 1)


def test_peaks_have_one_home():
    """Issue 14: the peak table and peak_flops live in helpers.measure.roofline only."""
    from helpers.measure import flops

    assert not hasattr(flops, "peak_flops") and not hasattr(flops, "GPU_PEAK_FLOPS")
