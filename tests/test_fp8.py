"""FP8 linears: scaling math, agreement with bf16 (forward and backward), conversion that keeps the head."""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertForSequenceClassification

import helpers.model.fp8 as fp8
from helpers.core import compat
from helpers.model.fp8 import E4M3, E5M2, FP8Linear, convert_to_float8, fp8_matmul, fp8_supported, quantize

CPU_FP8 = compat.scaled_mm_supports("cpu", False)[0]  # torch 2.13's CPU build runs _scaled_mm; older may not
needs_cpu_fp8 = pytest.mark.skipif(not CPU_FP8, reason="this torch has no CPU torch._scaled_mm")
CUDA_FP8 = torch.cuda.is_available() and fp8_supported("cuda")[0]
needs_cuda_fp8 = pytest.mark.skipif(not CUDA_FP8, reason="FP8 needs a CUDA GPU of compute capability >= 8.9")
# every CUDA case carries the `cuda` marker: `make gpu-check` selects them with `pytest -m cuda`
DEVICES = [pytest.param("cpu", marks=needs_cpu_fp8),
           pytest.param("cuda", marks=[pytest.mark.cuda, needs_cuda_fp8])]


def needs_recipe(device: str, recipe: str) -> None:
    """Skip, saying why, where this torch's _scaled_mm lacks the recipe's scales (row-wise: torch 2.11 CPU)"""
    ok, why = compat.scaled_mm_supports(device, recipe == "rowwise")
    if not ok and device == "cpu":  # torch's own error may name CUDA: that is no reason to mark this cuda
        pytest.skip(f"torch {torch.__version__} has no {recipe} torch._scaled_mm on this CPU")
    if not ok:
        pytest.skip(why)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).norm() / b.detach().float().norm())


# --- scaling math (no FP8 matmul needed) ---------------------------------------------------------

@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_quantize_maps_amax_to_the_format_maximum_and_round_trips(dtype):
    torch.manual_seed(0)
    x = torch.randn(64, 32) * 3
    x8, scale = quantize(x, dtype)
    assert x8.dtype == dtype and scale.shape == ()
    assert float(x8.float().abs().max()) == torch.finfo(dtype).max  # full range used: 448 or 57344
    mantissa_bits = 3 if dtype == E4M3 else 2
    big = x.abs() > x.abs().max() / 16  # normal numbers: relative rounding error <= 2^-(bits+1)
    err = ((x8.float() * scale - x).abs() / x.abs())[big]
    assert float(err.max()) <= 2.0 ** -(mantissa_bits + 1) + 1e-6


def test_rowwise_scaling_keeps_small_rows_precise_next_to_an_outlier_row():
    torch.manual_seed(0)
    x = torch.randn(8, 64)
    # one outlier row 1e5 times larger: e4m3 spans about 2^-9..448 (~2e5), so one per-tensor scale
    # pushes the other rows down among its few smallest (subnormal) numbers
    x[0] *= 1e5
    x8, s = quantize(x, E4M3)
    err_tensor = rel((x8.float() * s)[1:], x[1:])
    x8r, sr = quantize(x, E4M3, dim=1)
    assert sr.shape == (8, 1)
    err_row = rel((x8r.float() * sr)[1:], x[1:])
    assert err_row < 0.05 and err_tensor > 0.2


def test_quantize_of_zeros_is_zeros():
    x8, scale = quantize(torch.zeros(4, 4))
    assert torch.equal(x8.float(), torch.zeros(4, 4)) and float(scale) > 0


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="recipe"):
        fp8_matmul(torch.ones(16, 16), torch.ones(16, 16), recipe="blockwise")
    with pytest.raises(ValueError, match="M, K"):
        fp8_matmul(torch.ones(16, 16), torch.ones(32, 16))
    with pytest.raises(ValueError, match="float8"):
        quantize(torch.ones(2), torch.bfloat16)
    with pytest.raises(ValueError, match="recipe"):
        convert_to_float8(nn.Sequential(nn.Linear(16, 16)), recipe="x")
    with pytest.raises(ValueError, match="backend"):
        convert_to_float8(nn.Sequential(nn.Linear(16, 16)), backend="te")
    with pytest.raises(ValueError, match="no nn.Linear"):
        convert_to_float8(nn.Sequential(nn.Linear(10, 3)))  # sizes not multiples of 16: kept


def test_torchao_backend_refused_when_missing(monkeypatch):
    monkeypatch.setattr(fp8, "torchao_available", lambda: False)
    with pytest.raises(ValueError, match="pip install torchao"):
        convert_to_float8(nn.Sequential(nn.Linear(16, 16)), backend="torchao")


# --- fp8_supported ---------------------------------------------------------------------------------

def test_fp8_supported_on_cpu_says_why_not():
    ok, why = fp8_supported("cpu")
    assert not ok and "8.9" in why and "\n" not in why


@pytest.mark.parametrize("capability, expected", [((8, 0), False), ((8, 6), False), ((8, 9), True),
                                                  ((9, 0), True), ((10, 0), True)])
def test_fp8_supported_reads_the_compute_capability(monkeypatch, capability, expected):
    _fake_gpu(monkeypatch, capability)
    monkeypatch.setattr(compat, "scaled_mm_supports", lambda device, rowwise: (True, "runs"))
    ok, why = fp8_supported("cuda")
    assert ok is expected and f"{capability[0]}.{capability[1]}" in why


def test_fp8_supported_asks_compat_s_one_probe_whether_this_torch_runs_it(monkeypatch):
    _fake_gpu(monkeypatch, (9, 0))
    asked = []
    monkeypatch.setattr(compat, "scaled_mm_supports",
                        lambda *args: asked.append(args) or (False, "no _scaled_mm here"))
    assert fp8_supported("cuda") == (False, "no _scaled_mm here")
    assert asked == [("cuda", False)]


def _fake_gpu(monkeypatch, capability):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some GPU")


# --- FP8 matmuls agree with bf16 --------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_fp8_matmul_agrees_with_float(device, recipe):
    needs_recipe(device, recipe)
    torch.manual_seed(0)
    a, b = torch.randn(37, 40, device=device), torch.randn(40, 24, device=device)  # not multiples of 16
    out = fp8_matmul(a, b, recipe=recipe)
    assert out.shape == (37, 24) and out.dtype == torch.bfloat16
    assert rel(out, a @ b) < 0.10


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_fp8_linear_forward_and_backward_agree_with_bf16(device, recipe):
    """Output, input gradient, weight and bias gradients within 10 % (relative norm) of a bf16 linear."""
    needs_recipe(device, recipe)
    torch.manual_seed(0)
    ref = nn.Linear(64, 48).to(device)
    fast = FP8Linear.from_linear(nn.Linear(64, 48).to(device), recipe)
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(3, 19, 64, device=device, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    with torch.autocast(device, dtype=torch.bfloat16):
        y, y_ref = fast(x), ref(x_ref)
    assert y.dtype == y_ref.dtype == torch.bfloat16 and y.shape == (3, 19, 48)
    g = torch.randn(y.shape, device=device, dtype=torch.bfloat16)
    y.backward(g)
    y_ref.backward(g)
    assert rel(y, y_ref) < 0.10
    assert rel(x.grad, x_ref.grad) < 0.10
    assert rel(fast.weight.grad, ref.weight.grad) < 0.10
    assert rel(fast.bias.grad, ref.bias.grad) < 0.01  # the bias add is not in FP8
    assert 0 < rel(y, y_ref)  # the FP8 path really ran (a bf16 fallback would give 0)


@needs_cpu_fp8
def test_fp8_linear_in_fp32_returns_fp32():
    needs_recipe("cpu", "rowwise")
    lin = FP8Linear.from_linear(nn.Linear(32, 16), "rowwise")
    assert lin(torch.randn(5, 32)).dtype == torch.float32


# --- converting a model ----------------------------------------------------------------------------

def _bert():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, num_labels=3,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(cfg)


def test_conversion_swaps_linears_and_keeps_the_head():
    model = convert_to_float8(_bert(), backend="scaled_mm")
    info = model.course_fp8
    assert info["backend"] == "scaled_mm" and info["kept"] == ["classifier"]
    assert len(info["converted"]) == 2 * 6 + 1  # q, k, v, out, up, down per layer + the pooler
    assert type(model.classifier) is nn.Linear
    assert all(isinstance(model.get_submodule(n), FP8Linear) for n in info["converted"])
    with pytest.raises(ValueError, match="no nn.Linear"):
        convert_to_float8(model, backend="scaled_mm")  # converting twice: nothing left to convert
    custom = convert_to_float8(_bert(), backend="scaled_mm", skip=lambda name, m: "attention" in name)
    assert all("attention" not in n for n in custom.course_fp8["converted"])


def test_conversion_shares_parameters():
    model = _bert()
    before = {n: p for n, p in model.named_parameters()}
    convert_to_float8(model, backend="scaled_mm")
    assert all(p is before[n] for n, p in model.named_parameters())  # an optimizer made before still works


@needs_cpu_fp8
@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_converted_bert_agrees_with_bf16_and_trains(recipe):
    needs_recipe("cpu", recipe)
    ids = torch.randint(5, 100, (4, 16), generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([0, 1, 2, 1])
    ref, model = _bert(), convert_to_float8(_bert(), recipe=recipe, backend="scaled_mm")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = ref(input_ids=ids, labels=labels), model(input_ids=ids, labels=labels)
    assert rel(b.logits, a.logits) < 0.10
    assert abs(b.loss.item() - a.loss.item()) < 0.05 * a.loss.item()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(5):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_torchao_backend_pads_the_inner_dimension(monkeypatch):
    """torchao's recipes leave pad_inner_dim off, and the weight-gradient matmul's inner dimension is the
    token count: the course must turn padding on (a stand-in torchao.float8 records the config it gets)."""
    @dataclasses.dataclass(frozen=True)
    class Float8LinearConfig:  # the fields of torchao 0.18's that matter here, its defaults
        recipe: str = "tensorwise"
        pad_inner_dim: bool = False

        @staticmethod
        def from_recipe_name(name):
            return Float8LinearConfig(recipe=name)

    got = {}

    def convert_to_float8_training(module, *, module_filter_fn=None, config=None):
        got["config"] = config
        got["chosen"] = [n for n, m in module.named_modules() if n and module_filter_fn(m, n)]
        return module

    ao = types.ModuleType("torchao")
    ao.float8 = types.ModuleType("torchao.float8")
    ao.float8.Float8LinearConfig = Float8LinearConfig
    ao.float8.convert_to_float8_training = convert_to_float8_training
    monkeypatch.setitem(sys.modules, "torchao", ao)
    monkeypatch.setitem(sys.modules, "torchao.float8", ao.float8)
    monkeypatch.setattr(fp8, "torchao_available", lambda: True)
    model = convert_to_float8(_bert(), recipe="rowwise", backend="torchao")
    assert got["config"] == Float8LinearConfig(recipe="rowwise", pad_inner_dim=True)
    assert got["chosen"] == model.course_fp8["converted"] and "classifier" not in got["chosen"]


@pytest.mark.skipif(not fp8.torchao_available(), reason="torchao is not installed")
@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_torchao_config_is_the_recipe_with_padding(recipe):
    from torchao.float8 import Float8LinearConfig

    config = fp8._torchao_config(recipe)
    assert config.pad_inner_dim
    assert dataclasses.replace(config, pad_inner_dim=False) == Float8LinearConfig.from_recipe_name(recipe)


@pytest.mark.skipif(not fp8.torchao_available(), reason="torchao is not installed")
def test_torchao_backend_converts_the_same_layers():
    model = convert_to_float8(_bert(), backend="torchao")
    assert model.course_fp8["backend"] == "torchao" and type(model.classifier) is nn.Linear
    assert all(type(model.get_submodule(n)).__name__ == "Float8Linear" for n in model.course_fp8["converted"])


@pytest.mark.cuda
@needs_cuda_fp8
@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_converted_bert_on_cuda_agrees_with_bf16(recipe):
    ids = torch.randint(5, 100, (8, 32), device="cuda")
    ref = _bert().cuda()
    model = convert_to_float8(_bert().cuda(), recipe=recipe, backend="scaled_mm")
    labels = torch.randint(0, 3, (8,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = ref(input_ids=ids, labels=labels), model(input_ids=ids, labels=labels)
    assert rel(b.logits, a.logits) < 0.10
    a.loss.backward()
    b.loss.backward()  # the FP8 backward (e5m2 or row-wise e4m3 gradients) on the GPU's kernels
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if p.grad is not None and "encoder" in name and p.dim() == 2:
            # looser than one layer's 10 %: each FP8 backward matmul adds its rounding, layer after layer
            # (same math on the CPU, seed 5: worst 0.29 tensorwise with e5m2 gradients, 0.13 rowwise)
            assert rel(p.grad, q.grad) < 0.4, name


@pytest.mark.cuda
@needs_cuda_fp8
@pytest.mark.skipif(not fp8.torchao_available(), reason="torchao is not installed")
@pytest.mark.parametrize("recipe", fp8.RECIPES)
def test_torchao_bert_on_cuda_agrees_with_bf16(recipe):
    # 5 x 27 = 135 tokens and a pooler over 5 rows: no multiple of 16 in the weight-gradient matmuls
    ids = torch.randint(5, 100, (5, 27), device="cuda")
    labels = torch.randint(0, 3, (5,), device="cuda")
    ref = _bert().cuda()
    model = convert_to_float8(_bert().cuda(), recipe=recipe, backend="torchao")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = ref(input_ids=ids, labels=labels), model(input_ids=ids, labels=labels)
    assert rel(b.logits, a.logits) < 0.10
    b.loss.backward()
    assert all(p.grad is not None for p in model.bert.encoder.parameters())
