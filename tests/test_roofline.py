"""helpers.measure.roofline: the measured roofline, the datasheet peaks and the one peak MFU divides by."""

import pytest
import torch
from fakegpu import GPUClass, fake_gpu

from helpers.core.device import device_name
from helpers.measure.gpus import GPU_TABLE, GPUS, gpu, gpu_named, normalise_gpu_name
from helpers.measure.roofline import (
    PeakFlops,
    Roofline,
    datasheet_roofline,
    measure_roofline,
    mfu_peak,
    peak_flops,
)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each test its own course cache: a roofline saved on this machine must not decide what a test sees."""
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path / "cache"))


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


# real `nvidia-smi` / torch.cuda.get_device_name() strings, each with a dense figure from its row's source
@pytest.mark.parametrize("name, precision, tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 PCIe", "bf16", 756.0),
    ("NVIDIA H200", "bf16", 989.4), ("NVIDIA H200", "fp8", 1978.9),
    ("NVIDIA H100 80GB HBM3", "fp8", 1978.9), ("NVIDIA H100 NVL", "bf16", 835.5),
    ("NVIDIA H200 NVL", "bf16", 835.5), ("NVIDIA A100-SXM4-40GB", "tf32", 156.0),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0), ("NVIDIA A100 80GB PCIe", "bf16", 312.0),
    ("NVIDIA A100-PCIE-40GB", "fp32", 19.5), ("NVIDIA L4", "fp16", 121.0),
    ("NVIDIA L40S", "bf16", 366.5), ("NVIDIA L40S", "fp8", 733.0),
    ("Tesla T4", "fp16", 65.0), ("Tesla T4", "fp32", 8.1),
    ("NVIDIA GeForce RTX 4090", "bf16", 165.2), ("NVIDIA GeForce RTX 4090 Laptop GPU", "bf16", 79.4),
    ("NVIDIA GeForce RTX 3090", "fp32", 35.6), ("NVIDIA GeForce RTX 3090 Ti", "bf16", 80.0),
    ("NVIDIA GeForce RTX 5090", "bf16", 209.5), ("NVIDIA RTX A6000", "bf16", 154.8),
    ("NVIDIA A10", "bf16", 125.0), ("NVIDIA A10G", "bf16", 70.0),
    ("NVIDIA GH200 480GB", "bf16", 989.4), ("NVIDIA GH200 144G HBM3e", "fp8", 1978.9),
    ("NVIDIA B200", "bf16", 2250.0), ("Tesla V100-SXM2-16GB", "fp16", 125.0),
    ("Tesla V100-PCIE-32GB", "fp16", 112.0),
    ("Tesla V100-SXM2-16GB", "tf32", 15.7),  # no TF32 units: the fp32 peak
])
def test_peak_table_lookup(name, precision, tflops):
    peak = peak_flops(precision=precision, gpu_name=name)
    assert peak.flops == pytest.approx(tflops * 1e12) and peak.source


@pytest.mark.parametrize("name, gpu", [
    ("NVIDIA GeForce RTX 4090", "RTX4090"), ("NVIDIA GeForce RTX 4090 Laptop GPU", "RTX4090-Laptop"),
    ("NVIDIA GeForce RTX 3090 Ti", "RTX3090Ti"), ("Tesla V100-PCIE-16GB", "V100-PCIe"),
    ("Tesla V100-SXM2-32GB", "V100-32"), ("NVIDIA H100 PCIe", "H100-PCIe"), ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA GH200 480GB", "GH200"), ("NVIDIA H200", "H200"),
    ("NVIDIA L4", "L4"), ("NVIDIA L40S", "L40S"), ("NVIDIA A10", "A10"), ("NVIDIA A10G", "A10G"),
    ("NVIDIA A100-SXM4-80GB", "A100-80"), ("NVIDIA A100-PCIE-40GB", "A100-PCIe"),
    # not a row: another model, a MIG slice, a variant without datasheet figures here
    ("NVIDIA L40", None), ("NVIDIA GeForce RTX 5090 Laptop GPU", None), ("NVIDIA GeForce RTX 4080", None),
    ("Tesla V100S-PCIE-32GB", None), ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", None), ("NVIDIA H800", None),
    ("NVIDIA RTX 6000 Ada Generation", None), ("NVIDIA A40", None),
])
def test_names_match_exactly_laptop_ti_pcie_sxm_nvl_apart(name, gpu):
    row = gpu_named(name)
    assert (row.key if row else None) == gpu


def test_every_row_has_its_source_dense_fp32_and_only_the_units_it_has():
    # the fake matrix's classes (tests/fakegpu.py) and the other GPUs learners rent
    assert {"T4", "V100-16", "RTX3090", "RTX4090", "L4", "A100-80", "H100", "H200", "L40S", "RTXA6000",
            "A10G", "GH200", "B200", "RTX5090"} <= set(GPU_TABLE)
    for row in GPU_TABLE.values():
        assert row.peaks_source and "fp32" in row.peaks, row
        assert set(row.peaks) <= {"fp32", "tf32", "fp16", "bf16", "fp8"}, row
        assert all(row.peaks["fp32"] <= v for v in row.peaks.values()), f"{row.key}: a tensor rate below fp32"
        # each row answers to its own torch name: the table's two halves (peaks, what torch reports) agree
        assert gpu_named(row.name) is row, f"{row.key}: {row.name!r} finds {gpu_named(row.name)}"
    assert peak_flops(precision="bf16", gpu_name="Tesla T4") is None  # no bf16 units, no roofline
    assert peak_flops(precision="fp8", gpu_name="NVIDIA A100-SXM4-80GB") is None  # no FP8 units
    assert normalise_gpu_name("NVIDIA A100-SXM4-80GB") == "a100 sxm4 80gb"
    with pytest.raises(ValueError, match="unknown precision"):
        peak_flops(precision="fp64")
    with pytest.raises(ValueError, match="unknown precision"):
        peak_flops(precision="tfloat32")  # one vocabulary


def test_an_unknown_gpu_gets_the_measured_roofline_and_says_so(monkeypatch):
    fake_gpu(monkeypatch, GPUClass("mystery", "NVIDIA Mystery GPU", (8, 0), 40 * 2**30, 100, 2**25))
    assert peak_flops("cuda", "bf16") is None  # nothing known, nothing measured
    roof = Roofline("NVIDIA Mystery GPU", {"fp32": 2e13, "bf16": 2e14, "fp16": 2.1e14}, 2e12, 8192, 2**30)
    got = mfu_peak("cuda", roofline=roof)
    assert got.flops == 2.1e14 and got.precision == "fp16"
    assert "measured matmul roofline" in got.source and "not in the GPU table" in got.source


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


def test_roofline_measures_fp32_with_tf32_off_and_tf32_with_it_on(monkeypatch):
    from helpers.measure import roofline

    switched, real = [], roofline.tf32_matmuls
    monkeypatch.setattr(roofline, "tf32_matmuls", lambda on: (switched.append(on), real(on))[1])
    r = measure_roofline("cpu", precisions=["fp32", "tf32"], matmul_size=64, copy_mb=1, min_run_time=0.01)
    assert switched == [False, True] and set(r.matmul_flops) == {"fp32", "tf32"}


def test_mfu_has_one_peak_policy_the_fastest_dense_rate():
    # issue 19: MFU was divided by three different peaks (per precision, bf16, the faster of two)
    cpu_roof = Roofline("a test CPU", {"fp32": 1.5e11, "bf16": 3e11}, 1e10, 1024, 2**27)
    assert mfu_peak("cpu", roofline=cpu_roof) == peak_flops("cpu", "bf16", roofline=cpu_roof)
    slow_bf16 = Roofline("a CPU without bf16 units", {"fp32": 1.5e11, "bf16": 3e10}, 1e10, 1024, 2**27)
    assert mfu_peak("cpu", roofline=slow_bf16).precision == "fp32"  # never an MFU above 100 %
    assert mfu_peak("cpu") is None  # nothing known, nothing measured


def test_a_cpus_measured_peak_leaves_out_fp16_which_no_cpu_run_trains_in(monkeypatch):
    # a CPU's fp16 matmuls are emulated (0.8 GFLOP/s on CI's EPYC, 10 s to measure) and the course trains
    # a CPU in fp32 or bf16 only; a GPU's peak still weighs fp16 (a T4's fp16 tensor cores)
    from helpers.measure import roofline

    measured = []

    def fake_roofline(device, precisions):
        measured.extend(precisions)
        return Roofline("a test CPU", {p: 1e11 for p in precisions}, 1e10, 64, 2**20)

    monkeypatch.setattr(roofline, "measure_roofline", fake_roofline)
    assert mfu_peak("cpu", measure=True).precision in roofline.CPU_MFU_PRECISIONS
    assert sorted(measured) == ["bf16", "fp32"]
    fake_gpu(monkeypatch, "T4")  # fp16 tensor cores, no bf16 ones: its peak is the fp16 datasheet rate
    t4 = mfu_peak("cuda")
    assert t4.precision == "fp16" and t4.flops == 65e12, t4


# --- issue 39, point 2: a stamped roofline, never replaced by (nor read from) a measurement under load ----

def _stamped(flops: float, *, others: float = 0.02, spread: float = 0.05) -> Roofline:
    return Roofline("a test CPU", {"fp32": flops, "bf16": flops / 3}, 1e10, 512, 2**26,
                    measured_at="2026-12-03T08:00:00+00:00", threads=2, device_type="cpu", others_load=others,
                    spread=spread)


def test_2_a_roofline_measured_under_load_never_replaces_the_quiet_one_nor_becomes_the_peak(tmp_path,
                                                                                            monkeypatch):
    import dataclasses
    import json
    import os
    import subprocess
    import sys

    from helpers.measure import roofline
    from helpers.train.meter import run_peak

    monkeypatch.setenv("COURSE_CACHE", str(tmp_path))
    monkeypatch.setattr(roofline, "device_name", lambda *a: "a test CPU")
    quiet = _stamped(8e11)
    assert quiet.under_load is None and "with 2 threads" in quiet.stamp() and quiet.save().name == \
        "roofline-a-test-cpu.json"
    # lesson 00 run while two other programs keep both cores busy: its roofline says so
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        busy = measure_roofline("cpu", precisions=["fp32"], matmul_size=128, copy_mb=4, min_run_time=0.2)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    assert busy.stamped and busy.threads == torch.get_num_threads() and busy.device_type == "cpu"
    assert busy.under_load and "other programs took" in busy.under_load, busy.stamp()
    assert busy.save().name == "roofline-a-test-cpu-under-load.json"  # kept apart, said where
    assert roofline.load_roofline() == quiet  # the quiet one stays the saved one
    peak = mfu_peak("cpu")  # the ladder's and train's peak: lesson 00's quiet roofline, not None
    assert peak.flops == 8e11 and "lesson 00's saved one" in peak.source and "2 threads" in peak.source
    assert peak_flops("cpu", "fp32").flops == 8e11 and run_peak(torch.device("cpu"))[0] == 8e11
    # a figure measured under load, or one without its stamp, saved where the quiet one was: not the peak
    for bad, why in ((_stamped(1.68e10, others=0.6), "measured under load"), (_stamped(1.68e10, spread=0.7),
                     "measured under load"), (Roofline("a test CPU", {"fp32": 1.68e10}, 1e9, 512, 2**26),
                                              "unstamped")):
        roofline._roofline_path("a test CPU").write_text(json.dumps(dataclasses.asdict(bad)))
        assert mfu_peak("cpu") is None and roofline.load_roofline() is None
        assert why in run_peak(torch.device("cpu"))[1] and why in roofline.saved_roofline()[1]
    assert roofline.load_roofline(any_load=True).matmul_flops["fp32"] == 1.68e10
    with pytest.raises(ValueError, match="stamp"):  # a hand-made roofline cannot become the saved peak
        Roofline("a test CPU", {"fp32": 1e9}, 1e9, 512, 2**26).save()
    # given by hand, a roofline measured under load is used, and the source says so
    given = peak_flops("cpu", "fp32", roofline=_stamped(1.68e10, others=0.6))
    assert given.flops == 1.68e10 and "measured under load" in given.source


# --- one table of GPU facts, one roof type ---------------------------------------------------------------

def test_the_planned_classes_carry_what_a_plan_needs_each_with_its_source():
    for g in GPUS.values():
        assert g.plannable and g.bandwidth_source and g.link is not None and g.link.source, g.key
        assert g.bandwidth > 0 and 0 < g.link.bandwidth < g.bandwidth, g.key  # a link is slower than HBM
    assert gpu("2xT4").count == 2 and gpu("8xH100").count == 8 and gpu("8xH100").peaks == gpu("H100").peaks
    with pytest.raises(ValueError, match="unknown GPU class 'Z9'"):
        gpu("Z9")


def test_a_datasheet_roofline_is_the_roof_type_of_a_measured_one():
    roof = datasheet_roofline("A100-80", launch_s=5e-6)
    assert isinstance(roof, Roofline) and not roof.synchronous and roof.overhead_s == 5e-6
    assert roof.peak("bf16") == 312e12 and roof.peak("tf32") == 156e12 and roof.bandwidth == 2039e9
    assert datasheet_roofline("T4").peak("tf32") == datasheet_roofline("T4").peak("fp32")  # no TF32 units
    assert roof.vector_rate == 19.5e12 and "A100" in roof.source
    with pytest.raises(ValueError, match="no 'fp8' peak"):
        roof.peak("fp8")
    with pytest.raises(ValueError, match="no memory bandwidth"):
        datasheet_roofline("B200")  # peaks only: the table has not seen what torch reports for it


def test_cache_roofs_by_working_set_never_sit_below_a_larger_set():
    roof = Roofline("cpu", {"fp32": 1e11}, 10e9, device_type="cpu", cache_sizes=(2**16, 2**20),
                    cache_bandwidths=(40e9, 60e9), cache_bytes=2**22)
    assert roof.cache_bandwidths == (60e9, 60e9)  # the smaller set measured slower: the larger set's roof
    assert roof.bandwidth_for(2**10) == 60e9 and roof.bandwidth_for(2**23) == 10e9
    assert roof.where(2**20) == "cache" and roof.where(2**23) == "memory" and roof.synchronous
    assert "working set" in roof._repr_markdown_()
    with pytest.raises(ValueError, match="one bandwidth per working set"):
        Roofline("cpu", {"fp32": 1e11}, 10e9, cache_sizes=(2**20, 2**16), cache_bandwidths=(1e9, 1e9))
