"""helpers.diagnosis: what is wrong with a GPU set-up and the fix; known CUDA errors explained."""

import pytest

from helpers.diagnosis import SetupFacts, diagnose, explain_error, findings_table


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
