"""FLOPs per token (6·N + 12·L·H·Q·T), the peak-FLOPS table and MFU."""

from __future__ import annotations

import pytest
import torch

from helpers.flops import (GPU_PEAK_FLOPS, PeakFlops, matmul_params, mfu, model_flops_per_token, peak_flops,
                           transformer_flops_per_token)
from helpers.models import SmallTransformer, TransformerConfig


def gpt2_small_non_embedding_params() -> int:
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


def test_gpt2_124m_flops_per_token_match_the_hand_count():
    n = gpt2_small_non_embedding_params()
    assert n == 123_653_376  # nanoGPT prints "number of parameters: 123.65M"
    # 6·N = 741,920,256; 12·L·H·Q·T = 12·12·12·64·1024 = 113,246,208
    assert transformer_flops_per_token(n, 12, 12, 64, 1024) == 855_166_464
    assert transformer_flops_per_token(n, 12, 12, 64, 1024, backward=False) == pytest.approx(855_166_464 / 3)


def test_mfu_from_a_given_throughput():
    # nanoGPT's example: GPT-2 124M at T=1024 on an A100 (312 TFLOPS bf16)
    per_token = transformer_flops_per_token(gpt2_small_non_embedding_params(), 12, 12, 64, 1024)
    tokens_per_s = 150_000.0
    assert mfu(tokens_per_s, per_token, 312e12) == pytest.approx(150_000 * 855_166_464 / 312e12)
    assert mfu(tokens_per_s, per_token, 312e12) == pytest.approx(0.4111, abs=1e-4)
    peak = peak_flops(precision="bf16", device_name="NVIDIA A100-SXM4-80GB")
    assert mfu(tokens_per_s, per_token, peak) == mfu(tokens_per_s, per_token, 312e12)
    with pytest.raises(ValueError, match="peak > 0"):
        mfu(1.0, 1.0, 0.0)


def test_model_flops_count_matmul_weights_once():
    cfg = TransformerConfig(vocab_size=1000, max_len=64, d_model=64, n_heads=4, n_layers=2)
    model = SmallTransformer(cfg)
    linears = 2 * (64 * 192 + 192 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64)
    assert matmul_params(model) == linears + 1000 * 64  # the tied head counts once, positions do not
    assert model_flops_per_token(model, 64) == 6 * (linears + 64_000) + 12 * 2 * 4 * 16 * 64


@pytest.mark.parametrize("name, precision, tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA H200", "bf16", 989.4), ("NVIDIA A100-SXM4-40GB", "tf32", 156.0),
    ("NVIDIA L4", "fp16", 121.0), ("Tesla T4", "fp16", 65.0), ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
    ("NVIDIA GeForce RTX 3090", "fp32", 35.6),
])
def test_peak_table_lookup(name, precision, tflops):
    peak = peak_flops(precision=precision, device_name=name)
    assert peak.flops == pytest.approx(tflops * 1e12) and peak.source


def test_every_gpu_row_names_its_source_and_unknown_devices_fall_back_to_the_roofline():
    assert all(row["source"] for row in GPU_PEAK_FLOPS.values())
    assert peak_flops(precision="bf16", device_name="NVIDIA L40S") is None  # not an L4
    assert peak_flops(precision="bf16", device_name="Tesla T4") is None  # no bf16 units, no roofline

    class Roofline:
        matmul_flops = {"float32": 1.5e11, "bfloat16": 3e10}
        device_name = "a test CPU"

    got = peak_flops("cpu", "bf16", roofline=Roofline())
    assert got == PeakFlops(3e10, "bfloat16", "measured matmul roofline on a test CPU")
    assert peak_flops("cpu", "tf32", roofline=Roofline()).flops == 1.5e11  # no TF32 units: fp32
    assert peak_flops(torch.device("cpu"), "fp32") is None
    with pytest.raises(ValueError, match="unknown precision"):
        peak_flops(precision="fp64")
    with pytest.raises(ValueError, match="non-negative integers"):
        transformer_flops_per_token(-1, 1, 1, 1, 1)
