"""helpers.core.device: the device "auto" picks (and why, on a Mac), the environment report, GPU facts."""

import pytest
import torch

from helpers.core import device as dev_mod
from helpers.core.device import (
    DeviceUnavailableError,
    EnvironmentReport,
    GPUInfo,
    device_facts,
    device_report,
    get_device,
)


def test_auto_device_is_usable():
    dev = get_device("auto")
    assert torch.zeros(2, device=dev).sum().item() == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_gpu_is_one_clear_sentence():
    with pytest.raises(DeviceUnavailableError) as err:
        get_device("cuda")
    msg = str(err.value)
    assert "CUDA was requested" in msg and "'cpu'" in msg and "\n" not in msg


def test_unknown_device_name():
    with pytest.raises(ValueError, match="unknown device"):
        get_device("tpu-please")


def test_report_describes_this_machine():
    r = device_report()
    assert isinstance(r, EnvironmentReport)
    assert r.torch == torch.__version__ and r.cpu.cores >= 1
    assert len(r.gpus) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    md = r._repr_markdown_()
    assert "torch" in md and r.cpu.model in md
    assert "CPU-only" in str(r) or torch.version.cuda in str(r)


def test_gpu_memory_is_what_the_device_reports_in_gib():
    from types import SimpleNamespace

    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=80 * 2**30,
                            multi_processor_count=132)
    g = GPUInfo.from_properties(0, props)
    assert g.memory_gib == 80.0 and g.capability == (9, 0) and g.sm_count == 132  # GiB, not 85.9 GB
    report = EnvironmentReport("3", "p", "t", "12", None, None, None, None, device_report().cpu, (g,))
    assert "memory GiB (device)" in report.hardware().columns and 80.0 in report.hardware().column(
        "memory GiB (device)")
    if torch.cuda.is_available():
        real = device_report().gpus[0]
        assert real.memory_gib == torch.cuda.get_device_properties(0).total_memory / 2**30


def test_gpu_capabilities_and_core_counts():
    a100 = GPUInfo(0, "NVIDIA A100-SXM4-40GB", (8, 0), 42.4, 108)
    assert a100.cuda_cores == 6912  # the datasheet's figure: 108 SMs x 64
    assert a100.accelerates == {"FP16": True, "TF32": True, "BF16": True, "FP8": False}
    rtx3090 = GPUInfo(0, "NVIDIA GeForce RTX 3090", (8, 6), 25.4, 82)
    assert rtx3090.cuda_cores == 10496
    t4 = GPUInfo(0, "Tesla T4", (7, 5), 15.8, 40)
    assert t4.accelerates["FP16"] and not t4.accelerates["BF16"]
    assert GPUInfo(0, "H100", (9, 0), 85, 132).accelerates["FP8"]


def test_device_facts_read_the_cpu_info_lesson_00_prints():
    facts = device_facts("cpu")
    cpu = device_report().cpu
    assert facts == {"type": "cpu", "cpu_capability": cpu.torch_capability, "amx": cpu.isa["AMX-BF16"],
                     "avx512_bf16": cpu.isa["AVX512-BF16"]}


# --- a Mac: MPS available, faked (issue 24) -------------------------------------------------------

@pytest.fixture
def mac(monkeypatch):
    """This machine as an Apple-silicon Mac: no CUDA, MPS available, no device chosen, no note said yet."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.delenv(dev_mod.DEVICE_ENV, raising=False)
    monkeypatch.setattr(dev_mod, "_SAID", set())


def test_auto_on_a_mac_picks_the_cpu_and_says_why_once(mac, capsys):
    assert get_device("auto") == torch.device("cpu")
    said = capsys.readouterr().out
    assert said.count("\n") == 1 and "MPS" in said and "COURSE_DEVICE=mps" in said
    assert get_device() == torch.device("cpu") and capsys.readouterr().out == ""  # once per process
    assert get_device("mps") == torch.device("mps")  # asked by name, it is given


def test_course_device_opts_in_to_mps_and_names_itself_in_errors(mac, monkeypatch, capsys):
    monkeypatch.setenv(dev_mod.DEVICE_ENV, "mps")
    assert get_device("auto") == torch.device("mps") and capsys.readouterr().out == ""
    monkeypatch.setenv(dev_mod.DEVICE_ENV, "tpu")
    with pytest.raises(ValueError, match="COURSE_DEVICE='tpu'.*unknown device"):
        get_device()
    monkeypatch.setenv(dev_mod.DEVICE_ENV, "cuda")
    with pytest.raises(DeviceUnavailableError, match="CUDA was requested"):
        get_device()


def test_without_mps_auto_says_nothing(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.delenv(dev_mod.DEVICE_ENV, raising=False)
    monkeypatch.setattr(dev_mod, "_SAID", set())
    assert get_device() == torch.device("cpu") and capsys.readouterr().out == ""


@pytest.mark.parametrize("call", ["track_peak_memory", "peak_increase_bytes"])
def test_memory_helpers_refuse_mps_naming_it_and_the_fix(call):
    from helpers.measure import memory

    with pytest.raises(ValueError) as err:
        if call == "track_peak_memory":
            with memory.track_peak_memory("mps"):
                pass
        else:
            memory.peak_increase_bytes(lambda: None, "mps")
    msg = str(err.value)
    assert call in msg and "mps" in msg and "MPS" in msg and "device 'cpu'" in msg and "\n" not in msg


def test_flash_attention_refuses_a_device_triton_cannot_run_naming_it_and_the_fix(monkeypatch):
    """Tensors on a device Triton has no backend for (mps; "meta" stands in for it here) are refused
    before triton is needed; without triton (macOS, Windows) the error says it is Linux-only."""
    import importlib

    fa = importlib.import_module("helpers.model.kernels.flash_attention")  # the module, not the function

    q = torch.empty(1, 2, 16, 16, device="meta")
    with pytest.raises(ValueError, match=r"not meta: move q, k, v to the CPU \(\.cpu\(\)\)"):
        fa.flash_attention(q, q, q)
    monkeypatch.setattr(fa, "triton_available", lambda: False)
    cpu = torch.zeros(1, 2, 16, 16)
    with pytest.raises(RuntimeError, match="built for Linux only.*macOS"):
        fa.flash_attention(cpu, cpu, cpu)
