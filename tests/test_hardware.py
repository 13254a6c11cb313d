import pytest
import torch

from helpers.hardware import (
    GPU_PEAK_FLOPS,
    DeviceUnavailableError,
    EnvironmentReport,
    GPUInfo,
    PeakFlops,
    Roofline,
    SetupFacts,
    device_name,
    device_report,
    diagnose,
    explain_error,
    findings_table,
    get_device,
    measure_roofline,
    peak_flops,
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


def test_roofline_is_measured_and_positive():
    r = measure_roofline(matmul_size=256, copy_mb=8, min_run_time=0.05)
    assert set(r.matmul_flops) >= {"fp32"}  # keyed by the course's precision names
    assert all(v > 0 for v in r.matmul_flops.values()) and r.bandwidth > 0
    assert r.ridge_point("fp32") == r.matmul_flops["fp32"] / r.bandwidth
    assert r.device_name == device_name()
    with pytest.raises(ValueError, match="unknown precision"):
        measure_roofline(precisions=["float7"])
    old = measure_roofline(dtypes=["float32"], matmul_size=64, copy_mb=1, min_run_time=0.01)
    assert list(old.matmul_flops) == ["fp32"]  # the old dtype names are read as precisions


def test_roofline_saved_with_old_dtype_names_loads_as_precisions(tmp_path):
    r = Roofline("a test CPU", {"float32": 1e11, "bfloat16": 3e10}, 1e10, 64, 1024)
    assert r.matmul_flops == {"fp32": 1e11, "bf16": 3e10} and r.ridge_point("float32") == 10.0
    with pytest.raises(ValueError, match="not measured"):
        r.ridge_point("fp16")


@pytest.mark.parametrize("name, precision, tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA H200", "bf16", 989.4), ("NVIDIA H200", "fp8", 1978.9), ("NVIDIA H100 80GB HBM3", "fp8", 1978.9),
    ("NVIDIA H100 NVL", "bf16", 835.5), ("NVIDIA A100-SXM4-40GB", "tf32", 156.0),
    ("NVIDIA L4", "fp16", 121.0), ("Tesla T4", "fp16", 65.0), ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
    ("NVIDIA GeForce RTX 3090", "fp32", 35.6), ("Tesla V100-SXM2-16GB", "tf32", 15.7),  # no TF32 units
])
def test_peak_table_lookup(name, precision, tflops):
    peak = peak_flops(precision=precision, gpu_name=name)
    assert peak.flops == pytest.approx(tflops * 1e12) and peak.source


def test_every_gpu_row_names_its_source_and_unknown_gpus_have_no_datasheet_peak():
    assert all(row["source"] for row in GPU_PEAK_FLOPS.values())
    vocabulary = {"fp32", "tf32", "fp16", "bf16", "fp8", "source"}
    assert all(set(row) <= vocabulary for row in GPU_PEAK_FLOPS.values())
    assert peak_flops(precision="bf16", gpu_name="NVIDIA L40S") is None  # not an L4
    assert peak_flops(precision="bf16", gpu_name="Tesla T4") is None  # no bf16 units, no roofline
    assert peak_flops(precision="fp8", gpu_name="NVIDIA A100-SXM4-80GB") is None  # no FP8 units
    with pytest.raises(ValueError, match="unknown precision"):
        peak_flops(precision="fp64")
    with pytest.raises(ValueError, match="unknown precision"):
        peak_flops(precision="tfloat32")  # one vocabulary


def test_peak_falls_back_to_the_measured_roofline():
    roof = Roofline("a test GPU", {"fp32": 5e13, "tf32": 3e14, "bf16": 6e14}, 3e12, 8192, 2**30)
    want = PeakFlops(6e14, "bf16", "measured matmul roofline on a test GPU")
    assert peak_flops("cpu", "bf16", roofline=roof) == want
    # the defect this fixes: "tf32" missed the measured tf32 entry ("tfloat32" vs "tf32") and gave fp32's
    assert peak_flops("cpu", "tf32", roofline=roof).flops == 3e14
    cpu_roof = Roofline("a test CPU", {"fp32": 1.5e11, "bf16": 3e10}, 1e10, 1024, 2**27)
    got = peak_flops("cpu", "tf32", roofline=cpu_roof)  # a CPU has no TF32 units: fp32 matmuls
    assert got.flops == 1.5e11 and got.precision == "fp32" and "no TF32 units" in got.source
    assert peak_flops(torch.device("cpu"), "fp32") is None
    assert peak_flops("cpu", "fp16", roofline=cpu_roof) is None  # not measured, nothing to fall back on
    with pytest.raises(TypeError, match="Roofline"):
        peak_flops("cpu", "fp32", roofline={"fp32": 1e11})


def test_peak_measured_on_request():
    got = peak_flops("cpu", "fp32", measure=True)
    assert got.flops > 0 and got.precision == "fp32" and got.source.startswith("measured")


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
    too_old = "RuntimeError: The NVIDIA driver on your system is too old (found version 11040)"
    assert "driver" in explain_error(too_old)
    assert "LD_LIBRARY_PATH" in explain_error("OSError: libcudart.so.12: cannot open shared object file")
    assert "CPU-only" in explain_error("AssertionError: Torch not compiled with CUDA enabled")
    assert explain_error("something else entirely") is None


def test_roofline_measures_fp32_with_tf32_off_and_tf32_with_it_on(monkeypatch):
    from helpers import hardware

    switched, real = [], hardware.tf32_matmuls
    monkeypatch.setattr(hardware, "tf32_matmuls", lambda on: (switched.append(on), real(on))[1])
    r = measure_roofline("cpu", precisions=["fp32", "tf32"], matmul_size=64, copy_mb=1, min_run_time=0.01)
    assert switched == [False, True] and set(r.matmul_flops) == {"fp32", "tf32"}


def test_mfu_has_one_peak_policy_the_fastest_dense_rate():
    # issue 19: MFU was divided by three different peaks (per precision, bf16, the faster of two)
    from helpers.hardware import mfu_peak

    cpu_roof = Roofline("a test CPU", {"fp32": 1.5e11, "bf16": 3e11}, 1e10, 1024, 2**27)
    assert mfu_peak("cpu", roofline=cpu_roof) == peak_flops("cpu", "bf16", roofline=cpu_roof)
    slow_bf16 = Roofline("a CPU without bf16 units", {"fp32": 1.5e11, "bf16": 3e10}, 1e10, 1024, 2**27)
    assert mfu_peak("cpu", roofline=slow_bf16).precision == "fp32"  # never an MFU above 100 %
    assert mfu_peak("cpu") is None  # nothing known, nothing measured
