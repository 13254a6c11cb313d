"""Issue 13, helpers owned by lessons 01/03/05/07: inputs that used to slip through silently or with a bare
error from deep inside a library now get a clear error naming the input and the fix, or the right result."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere in this process

from helpers.data.corpus import read_csv_corpus  # noqa: E402
from helpers.data.text import load_text_classification  # noqa: E402
from helpers.measure.memory import tensor_bytes  # noqa: E402
from helpers.model.attention import naive_attention, padding_mask_mod, sdpa_attention, tiled_attention  # noqa: E402
from helpers.model.models import SmallTransformer, TransformerConfig  # noqa: E402

# --- data -------------------------------------------------------------------------------------------


def test_one_class_csv_is_refused_with_counts(tmp_path):
    f = tmp_path / "one.csv"
    f.write_text("text,label\n" + "".join(f"sentence {i},spam\n" for i in range(12)), encoding="utf-8")
    with pytest.raises(ValueError, match=r"1 class \('spam': 12 examples\).*at least two classes"):
        load_text_classification(csv_path=f, verbose=False)


def test_a_class_too_small_to_split_is_refused_with_counts(tmp_path):
    f = tmp_path / "small.csv"
    rows = "".join(f"sentence {i},{'a' if i < 10 else 'b'}\n" for i in range(12))
    f.write_text("text,label\n" + rows, encoding="utf-8")
    with pytest.raises(ValueError, match=r"\['b'\] have fewer than 3 examples.*'a': 10, 'b': 2"):
        load_text_classification(csv_path=f, verbose=False)


def test_empty_text_fields_are_refused_naming_the_lines(tmp_path):
    f = tmp_path / "nan.csv"
    texts = ["good one", "", "another", "", "   "] * 2  # pandas' to_csv writes NaN and None as empty fields
    rows = "".join(f"{t},{'ab'[i % 2]}\n" for i, t in enumerate(texts))
    f.write_text("text,label\n" + rows, encoding="utf-8")
    with pytest.raises(ValueError, match=r"6 of 10 rows have an empty `text` \(lines 3, 5, 6, 8, 10, 11"):
        read_csv_corpus(f)


# --- memory -----------------------------------------------------------------------------------------


def test_tensor_bytes_counts_state_dicts_and_nested_containers():
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 3))
    expected = 4 * (10 * 20 + 20 + 20 * 3 + 3)
    assert tensor_bytes(model) == expected
    assert tensor_bytes(model.state_dict()) == expected
    assert tensor_bytes({"model": model.state_dict(), "step": 3, "name": "run", "extra": None}) == expected
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 10)).sum().backward()
    opt.step()
    state = opt.state_dict()  # {"state": {i: {"step", "exp_avg", "exp_avg_sq"}}, "param_groups": [...]}
    assert tensor_bytes(state) == tensor_bytes(opt) >= 2 * expected
    assert tensor_bytes([model.state_dict(), model.state_dict()]) == expected  # shared storage counts once


def test_tensor_bytes_refuses_what_it_cannot_count():
    with pytest.raises(ValueError, match="tensor_bytes counts tensors; got int"):
        tensor_bytes(3)
    with pytest.raises(ValueError, match="cannot count a object"):
        tensor_bytes({"x": object()})


# --- attention masks --------------------------------------------------------------------------------


def _qkv_and_masks():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 16, generator=g) for _ in range(3))
    keep = torch.ones(2, 16, dtype=torch.bool)
    keep[0, 10:] = False  # the first sequence has 10 real tokens
    additive = torch.zeros(2, 16).masked_fill(~keep, float("-inf"))  # 0 = keep, -inf = drop
    return q, k, v, keep, additive


def _implementations():
    impls = {"naive": naive_attention, "tiled": tiled_attention, "sdpa": sdpa_attention}
    from helpers.model.kernels import flash_attention, triton_available

    if triton_available():
        impls["triton"] = flash_attention
    return impls


@pytest.mark.parametrize("name", ["naive", "tiled", "sdpa", "triton"])
def test_additive_float_mask_is_refused_naming_the_boolean_convention(name):
    impls = _implementations()
    if name not in impls:
        pytest.skip("triton is not installed")
    q, k, v, keep, additive = _qkv_and_masks()
    with pytest.raises(ValueError, match=r"boolean masks, True \(or 1\) = real token.*pass `mask == 0`"):
        impls[name](q, k, v, key_padding_mask=additive)
    with pytest.raises(ValueError, match="boolean masks"):
        impls[name](q, k, v, key_padding_mask=keep.float())


def test_every_implementation_agrees_on_the_converted_mask():
    from helpers.model.attention import agreement_tolerance, attention_agreement

    q, k, v, keep, additive = _qkv_and_masks()
    reference = naive_attention(q, k, v, key_padding_mask=keep)
    assert not torch.isnan(reference).any()
    # the Triton kernel runs compiled on a GPU (fp32 matmuls in TF32 there), interpreted on a CPU
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name, fn in _implementations().items():
        dev = device if name == "triton" else "cpu"
        for mask in (additive == 0, keep.long()):  # the conversion the message names, and 0/1 integers
            out = fn(q.to(dev), k.to(dev), v.to(dev), key_padding_mask=mask.to(dev))
            err = attention_agreement(out.cpu(), reference)
            assert err < agreement_tolerance(torch.float32, dev), f"{name}: relative error {err:.1e}"
    # the check is real: a mask read the wrong way round changes the output
    flipped = naive_attention(q, k, v, key_padding_mask=~keep | (torch.arange(16) < 1))
    assert attention_agreement(flipped, reference) > 0.1


def test_flex_mask_mod_refuses_a_float_mask():
    _, _, _, _, additive = _qkv_and_masks()
    with pytest.raises(ValueError, match="boolean masks"):
        padding_mask_mod(additive)


def test_small_transformer_refuses_a_float_mask():
    model = SmallTransformer(TransformerConfig(vocab_size=50, max_len=16, d_model=32, n_heads=2, n_layers=1))
    ids = torch.randint(0, 50, (2, 8))
    with pytest.raises(ValueError, match="attention_mask has dtype torch.float32"):
        model(ids, attention_mask=torch.zeros(2, 8))


# --- models -----------------------------------------------------------------------------------------


def test_token_id_beyond_the_vocabulary_names_the_largest_id_and_the_size():
    model = SmallTransformer(TransformerConfig(vocab_size=50, max_len=16, d_model=32, n_heads=2, n_layers=1))
    ids = torch.randint(0, 50, (2, 8))
    ids[1, 3] = 30521  # a BERT token id fed to a model with a 50-token vocabulary
    with pytest.raises(ValueError, match=r"\[0, 50\) \(the vocabulary size\); found ids from \d+ to 30521"):
        model(ids)
    ids[1, 3] = -1
    with pytest.raises(ValueError, match="found ids from -1 to"):
        model(ids)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("entry", ["train", "TrainStep", "evaluate"])
def test_a_device_the_machine_lacks_is_named_with_the_fix(entry):
    """train(..., device="cuda") on a CPU-only machine raised torch's bare "Torch not compiled with CUDA
    enabled" from inside model.to (issue 48): each entry point names the device and what to do instead."""
    from helpers.core.device import DeviceUnavailableError
    from helpers.model.models import TransformerConfig
    from helpers.train.evaluation import evaluate
    from helpers.train.loop import TrainConfig, TrainStep, make_optimizer, train

    model = TransformerConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=1, max_len=8).build()
    batch = {"input_ids": torch.zeros(2, 8, dtype=torch.long), "labels": torch.zeros(2, 8, dtype=torch.long)}
    calls = {"train": lambda: train(model, [batch], TrainConfig(steps=1, progress=False), device="cuda"),
             "TrainStep": lambda: TrainStep(model, make_optimizer(model, 1e-3, 0.0), device="cuda"),
             "evaluate": lambda: evaluate(model, [], device="cuda")}
    with pytest.raises(DeviceUnavailableError, match=r"CUDA was requested .* use device 'auto' or 'cpu'"):
        calls[entry]()
