"""The faked GPU classes (tests/fakegpu.py) read as torch would report them, and allocate nothing."""

import pytest
import torch
from fakegpu import GPU_CLASSES, fake_gpu


@pytest.mark.parametrize("key", list(GPU_CLASSES))
def test_fake_gpu_reports_its_class(monkeypatch: pytest.MonkeyPatch, key: str) -> None:
    g = fake_gpu(monkeypatch, key)
    assert torch.cuda.is_available() and torch.cuda.device_count() == g.count
    props = torch.cuda.get_device_properties(torch.device("cuda", g.count - 1))
    assert (props.major, props.minor) == torch.cuda.get_device_capability() == g.capability
    assert props.name == torch.cuda.get_device_name("cuda:0") == g.name
    assert torch.cuda.is_bf16_supported(including_emulation=False) == (g.capability >= (8, 0))
    free, total = torch.cuda.mem_get_info()
    assert 0 < free < total == props.total_memory
    with pytest.raises(RuntimeError, match="ordinal"):
        torch.cuda.get_device_properties(g.count)


def test_fake_gpu_allocates_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu(monkeypatch, "T4")
    with pytest.raises((AssertionError, RuntimeError)):  # this torch has no CUDA: allocation fails loudly
        torch.zeros(1, device="cuda")
