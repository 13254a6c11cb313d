"""helpers.core.precision: one vocabulary, clear refusals, the TF32 switch restores what it found, and the
course-wide rule "TF32 stays on for what runs in float32 after the tf32 rung". CPU."""

from __future__ import annotations

import pytest
import torch

from helpers.core import precision as hp


def test_vocabulary_is_one_and_maps_to_torch_dtypes():
    assert hp.PRECISIONS == ("fp32", "tf32", "fp16", "bf16")
    assert hp.PRECISION_DTYPE["tf32"] is torch.float32  # tf32 computes on float32 tensors
    assert hp.PRECISION_DTYPE["bf16"] is torch.bfloat16 and hp.PRECISION_DTYPE["fp16"] is torch.float16
    assert set(hp.PRECISIONS) <= set(hp.PRECISION_DTYPE)
    assert "tfloat32" not in hp.PRECISION_DTYPE


@pytest.mark.parametrize("bad", ["float32", "tfloat32", "FP16", None, 16])
def test_unknown_precision_names_the_choices(bad):
    with pytest.raises(ValueError, match="use one of"):
        hp.check_precision(bad, "cpu")


def test_fp8_is_sent_to_its_own_switch():
    with pytest.raises(ValueError, match="helpers.model.fp8"):
        hp.check_precision("fp8", "cpu")


def test_a_device_that_cannot_run_it_says_what_to_use():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="no CUDA GPU.*device='cpu'"):
        hp.check_precision("bf16", "cuda")
    with pytest.raises(ValueError, match="not a torch device"):
        hp.check_precision("fp32", "gpu0")


def test_uses_tf32_is_on_for_every_rung_after_fp32():
    rungs = ("fp32", "tf32", "fp16", "bf16", "fp8")
    assert [hp.uses_tf32(p) for p in rungs] == [False, True, True, True, True]
    with pytest.raises(ValueError):
        hp.uses_tf32("tfloat32")


def test_autocast_context_casts_matmuls_only_for_mixed_precisions():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with hp.autocast_context("bf16", "cpu"):
        assert (a @ b).dtype is torch.bfloat16
    for p in ("fp32", "tf32"):
        with hp.autocast_context(p, "cpu"):
            assert (a @ b).dtype is torch.float32


def test_tf32_switch_sets_both_flags_and_restores_them():
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    try:
        hp.set_tf32(False)
        torch.backends.cudnn.allow_tf32 = False
        with hp.tf32_matmuls(True):
            assert hp.tf32_enabled() and torch.backends.cuda.matmul.allow_tf32
            assert torch.backends.cudnn.allow_tf32
            # torch's own readers (inductor's autotuner) still read the setting without error
            assert torch.get_float32_matmul_precision() == "high"
        assert not hp.tf32_enabled() and not torch.backends.cudnn.allow_tf32  # restored
        with pytest.raises(RuntimeError), hp.tf32_matmuls(True):
            raise RuntimeError("fails inside")
        assert not hp.tf32_enabled()  # restored on error too
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]
    with pytest.raises(TypeError):
        hp.set_tf32("yes")


def test_scaler_is_enabled_for_fp16_only():
    assert hp.make_scaler("fp16", "cpu").is_enabled()
    assert not any(hp.make_scaler(p, "cpu").is_enabled() for p in ("fp32", "tf32", "bf16"))
    with pytest.raises(ValueError, match="init_scale"):
        hp.make_scaler("fp16", "cpu", init_scale=0)
