import pytest
import torch

from helpers.hardware import (DeviceUnavailableError, EnvironmentReport, GPUInfo, SetupFacts, diagnose,
                            explain_error, device_report, findings_table, get_device, measure_roofline)


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


def test_gpu_capabilities_and_core_counts():
    a100 = GPUInfo(0, "NVIDIA A100-SXM4-40GB", (8, 0), 42.4, 108)
    assert a100.cuda_cores == 6912  # the datasheet's figure: 108 SMs x 64
    assert a100.accelerates == {"FP16": True, "TF32": True, "BF16": True, "FP8": False}
    rtx3090 = GPUInfo(0, "NVIDIA GeForce RTX 3090", (8, 6), 25.4, 82)
    assert rtx3090.cuda_cores == 10496
    t4 = GPUInfo(0, "Tesla T4", (7, 5), 15.8, 40)
    assert t4.accelerates["FP16"] and not t4.accelerates["BF16"]
    assert GPUInfo(0, "H100", (9, 0), 85, 132).accelerates["FP8"]


def test_roofline_is_measured_and_positive():
    r = measure_roofline(matmul_size=256, copy_mb=8, min_run_time=0.05)
    assert set(r.matmul_flops) >= {"float32"}
    assert all(v > 0 for v in r.matmul_flops.values()) and r.bandwidth > 0
    assert r.ridge_point("float32") == r.matmul_flops["float32"] / r.bandwidth
    with pytest.raises(ValueError, match="unknown dtype"):
        measure_roofline(dtypes=["float7"])


@pytest.mark.parametrize("facts, problem", [
    (SetupFacts("12.4", False, None, None, None), "CUDA build without a driver"),
    (SetupFacts(None, False, ["GPU 0: NVIDIA A10G"], "12.4", None), "CPU-only torch on a GPU box"),
    (SetupFacts("12.4", False, ["GPU 0: NVIDIA A10G"], "11.8", None), "driver too old for this torch"),
    (SetupFacts("12.4", False, ["GPU 0: NVIDIA A10G"], "12.4", "-1"), "GPUs hidden"),
    (SetupFacts("12.4", False, ["GPU 0: NVIDIA A10G"], "12.4", None), "torch cannot use the GPU"),
])
def test_diagnose_names_the_problem_and_its_fix(facts, problem):
    found = {f.check: f for f in diagnose(facts)}
    assert problem in found and not found[problem].ok and found[problem].fix
    assert "PROBLEM" in findings_table(list(found.values())).to_markdown()


def test_diagnose_healthy_gpu_box_has_no_problem():
    assert all(f.ok for f in diagnose(SetupFacts("12.4", True, ["GPU 0: NVIDIA H100"], "12.6", None)))


def test_explain_known_errors():
    assert "driver" in explain_error("RuntimeError: The NVIDIA driver on your system is too old (found version 11040)")
    assert "LD_LIBRARY_PATH" in explain_error("OSError: libcudart.so.12: cannot open shared object file")
    assert "CPU-only" in explain_error("AssertionError: Torch not compiled with CUDA enabled")
    assert explain_error("something else entirely") is None
