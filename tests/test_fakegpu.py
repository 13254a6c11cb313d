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


def test_a_mixed_box_reports_each_gpu_as_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    first = fake_gpu(monkeypatch, ("A100-40", "T4"))  # an A100 as cuda:0, a T4 beside it
    assert first.key == "A100-40" and torch.cuda.device_count() == 2
    assert torch.cuda.get_device_capability("cuda:1") == (7, 5)
    assert torch.cuda.get_device_capability() == (8, 0)
    assert torch.cuda.get_device_properties(1).total_memory == GPU_CLASSES["T4"].total_memory
    assert torch.cuda.mem_get_info(1)[1] == GPU_CLASSES["T4"].total_memory
    assert torch.cuda.is_bf16_supported(including_emulation=False)  # torch asks cuda:0, the A100
