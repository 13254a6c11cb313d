"""helpers.core.diagnosis: what is wrong with a GPU set-up and the fix; known CUDA errors explained."""

import re
from pathlib import Path

import pytest

from helpers.core.diagnosis import (
    MIN_DRIVER,
    Compilers,
    SetupFacts,
    compiler_fix,
    diagnose,
    driver_runs,
    explain_error,
    findings_table,
)

A10G = ["GPU 0: NVIDIA A10G"]
CC = Compilers("/usr/bin/gcc", "/usr/bin/g++", "debian")


@pytest.mark.parametrize("facts, problem", [
    (SetupFacts("12.4", False, None, None, None), "CUDA build without a driver"),
    (SetupFacts(None, False, A10G, "12.4", None), "CPU-only torch on a GPU box"),
    (SetupFacts("12.4", False, A10G, "11.8", None), "driver too old for this torch"),
    (SetupFacts("13.0", False, A10G, "12.2", None, driver="535.104.05"), "driver too old for this torch"),
    (SetupFacts("11.8", False, A10G, "11.0", None, driver="450.51.06"), "driver too old for this torch"),
    (SetupFacts("12.4", False, A10G, "12.4", "-1"), "GPUs hidden"),
    (SetupFacts("12.4", False, A10G, "12.4", None), "torch cannot use the GPU"),
    (SetupFacts("13.0", True, ["GPU 0: Tesla V100"], "13.0", None, driver="580.82.07", gpu_caps=[(7, 0)],
                arch_list=["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]),
     "no kernels for this GPU"),
    (SetupFacts(None, False, None, None, None, compilers=Compilers(None, None, "debian")),
     "no C/C++ compiler"),
    (SetupFacts(None, False, None, None, None, compilers=Compilers("/usr/bin/gcc", None, "debian")),
     "no C/C++ compiler"),
])
def test_diagnose_names_the_problem_and_its_fix(facts, problem):
    found = {f.check: f for f in diagnose(facts)}
    assert problem in found and not found[problem].ok and found[problem].fix
    assert "PROBLEM" in findings_table(list(found.values())).to_markdown()


@pytest.mark.parametrize("facts", [
    SetupFacts("12.4", True, ["GPU 0: NVIDIA H100"], "12.6", None, compilers=CC),
    # minor-version compatibility: a 12.6 build on driver 535 (its header says CUDA 12.2) works
    SetupFacts("12.6", True, A10G, "12.2", None, driver="535.104.05", compilers=CC),
    SetupFacts("12.6", True, A10G, "12.2", None),  # the header alone: the majors match
    SetupFacts("12.6", True, A10G, "12.0", None, driver="525.60.13"),  # exactly 12.x's minimum
    SetupFacts("11.8", True, A10G, "11.0", None, driver="450.80.02"),
    SetupFacts("12.6", True, ["GPU 0: L4"], "12.8", None, driver="570.133.20", gpu_caps=[(8, 9), (8, 0)],
               arch_list=["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]),  # 8.9 runs sm_86
    SetupFacts("13.0", True, ["GPU 0: RTX PRO"], "13.0", None, driver="580.82.07", gpu_caps=[(12, 1)],
               arch_list=["sm_75", "sm_120", "compute_120"]),  # a later GPU runs the PTX
])
def test_a_working_box_has_no_problem(facts):
    problems = [f for f in diagnose(facts) if not f.ok]
    assert not problems, problems


def test_a_12x_build_on_driver_535_is_fine_and_says_why():
    found = {f.check: f for f in diagnose(SetupFacts("12.6", True, A10G, "12.2", None, driver="535.104.05"))}
    build = found["driver and torch build"]
    assert build.ok and "fine" in build.detail and "525.60.13" in build.detail, build
    ok, why = driver_runs("12.6", "535.104.05", "12.2")
    assert ok and "minor-version compatibility" in why
    assert not driver_runs("13.0", "535.104.05", "12.2")[0]
    assert not driver_runs("12.6", "525.60.12", "12.0")[0]
    assert driver_runs("10.2", None, "10.2")[0] and not driver_runs("10.2", None, "10.1")[0]  # before CUDA 11


def test_compiler_fix_per_platform():
    assert "build-essential" in compiler_fix("debian")
    assert "dnf install gcc gcc-c++" in compiler_fix("fedora")
    assert "xcode-select --install" in compiler_fix("macos")
    assert "WSL" in compiler_fix("windows")
    assert "conda-forge cxx-compiler" in compiler_fix("linux")
    found = {f.check: f for f in diagnose(SetupFacts(None, False, None, None, None,
                                                     compilers=Compilers(None, None, "macos")))}
    assert "xcode-select" in found["no C/C++ compiler"].fix and "clang++" in found["no C/C++ compiler"].detail


def test_compilers_are_found_as_triton_and_inductor_find_them(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    for var in ("CC", "CXX"):
        monkeypatch.delenv(var, raising=False)
    assert Compilers.find().c is None and Compilers.find().cxx is None
    for name in ("clang", "g++"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    found = Compilers.find()
    assert found.c == str(tmp_path / "clang") and found.cxx == str(tmp_path / "g++")
    monkeypatch.setenv("CXX", "no-such-compiler")  # Inductor would use $CXX, and fail
    assert Compilers.find().cxx is None


def test_min_driver_matches_the_install_script():
    script = (Path(__file__).resolve().parent.parent / "scripts" / "install_torch.sh").read_text()
    rows = re.findall(r"^\S+ cu(\d\d)\d (\d+\.\d+\.\d+) \d+ \d+$", script, re.M)
    assert len(rows) >= 3, rows
    for major, minimum in rows:
        assert MIN_DRIVER[int(major)] == minimum, (major, minimum)
    assert {int(m) for m, _ in rows} == set(MIN_DRIVER)


def test_explain_known_errors():
    too_old = "RuntimeError: The NVIDIA driver on your system is too old (found version 11040)"
    assert "install_torch.sh" in explain_error(too_old) and "525.60.13" in explain_error(too_old)
    assert "LD_LIBRARY_PATH" in explain_error("OSError: libcudart.so.12: cannot open shared object file")
    assert "CPU-only" in explain_error("AssertionError: Torch not compiled with CUDA enabled")
    assert "architecture" in explain_error("CUDA error: no kernel image is available for execution")
    assert "build-essential" in explain_error("RuntimeError: Failed to find C compiler. Please specify")
    assert "build-essential" in explain_error("InvalidCxxCompiler: No working C++ compiler found in "
                                              "torch._inductor.config.cpp.cxx: (None, 'g++')")
    assert explain_error("something else entirely") is None
