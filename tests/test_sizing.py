"""course.sizing: one sizing rule for every lesson, decided from what a device reports (faked GPUs, no
allocation); and the capability-driven choices beside it (training precision, FP8, check_precision's
device)."""

from __future__ import annotations

import pytest
import torch
from fakegpu import GPU_CLASSES, GPUClass, fake_gpu, gpu_class

from course.sizing import MARGIN, Size, SizingError, device_memory, fit_sizes
from helpers.core.precision import check_precision, precision_runs, training_precision
from helpers.core.units import GiB
from helpers.model.fp8 import fp8_capable


def usable(key: str) -> int:
    return int(GPU_CLASSES[key].total_memory * (1 - MARGIN))


def two_steps(unit: int) -> dict:
    # step "a": A x B units (fits while A*B <= 512); step "b": B alone (fits while B <= 16)
    return {"a": lambda s: s["A"] * s["B"] * unit, "b": lambda s: s["B"] * 32 * unit}


SIZES = {"A": Size(full=64, smoke=2, floor=1), "B": Size(full=64, smoke=4, floor=8)}


def test_fit_halves_in_the_stated_order_then_gives_back_what_the_later_cut_freed(monkeypatch):
    fake_gpu(monkeypatch, "T4")
    unit = usable("T4") // 512
    fit = fit_sizes(SIZES, two_steps(unit), shrink=["A", "B"], profile="fit", device="cuda")
    # A is halved to its floor (step b does not care about A), then B to 16, then A doubled back to 32:
    # without the give-back A would stay at 1; in the other order A would never shrink
    assert fit.sizes == {"A": 32, "B": 16} and fit.profile == "fit"
    assert all(p <= usable("T4") for p in fit.peaks.values())
    assert fit.binding == "a"  # the step furthest over at full size
    other = fit_sizes(SIZES, two_steps(unit), shrink=["B", "A"], profile="fit", device="cuda")
    assert other.sizes == {"A": 64, "B": 8}  # B first: halved to 8, both fit, A never shrinks


def test_fit_keeps_full_sizes_where_they_fit_and_says_so(monkeypatch):
    fake_gpu(monkeypatch, "H200")
    fit = fit_sizes(SIZES, two_steps(usable("T4") // 512), shrink=["A", "B"], profile="fit", device="cuda")
    assert fit.sizes == {"A": 64, "B": 64} and not fit.shrunk()
    line = fit.line()
    assert "NVIDIA H200" in line and "full sizes" in line and "\n" not in line and "bf16" in line


def test_the_line_names_the_device_the_cut_sizes_and_the_step_that_needed_it(monkeypatch):
    fake_gpu(monkeypatch, "T4")
    fit = fit_sizes(SIZES, two_steps(usable("T4") // 512), shrink=["A", "B"], profile="fit", device="cuda",
                    notes=["something skipped"])
    line = fit.line()
    assert line.startswith("fit profile on Tesla T4, 14.8 GiB: A 32 of 64, B 16 of 64")
    assert "a needs 100.3 GiB" in line and f"of the {usable('T4') / GiB:.1f} usable" in line
    assert "fp16 (sm_75: fp16 tensor cores, no bf16 ones)" in line and line.endswith("; something skipped")


def test_full_profile_is_refused_with_the_memory_it_needs_and_the_device_s(monkeypatch):
    fake_gpu(monkeypatch, "T4")
    with pytest.raises(SizingError) as err:
        fit_sizes(SIZES, two_steps(usable("T4") // 512), shrink=["A", "B"], profile="full", device="cuda")
    text = str(err.value)
    assert "Tesla T4, 14.8 GiB" in text and "12.5 GiB usable" in text  # the device
    assert "a 100.3 GiB, b 50.1 GiB" in text and "PROFILE" in text  # each step, what it needs, and the fix
    fake_gpu(monkeypatch, "H200")  # where it fits, full is the full sizes
    fit = fit_sizes(SIZES, two_steps(usable("T4") // 512), shrink=["A", "B"], profile="full", device="cuda")
    assert fit.sizes == {"A": 64, "B": 64} and fit.profile == "full"


def test_a_step_that_cannot_fit_even_at_the_floors_is_an_error_never_dropped(monkeypatch):
    fake_gpu(monkeypatch, "T4")
    steps = {**two_steps(usable("T4") // 512), "huge": lambda s: 20 * GiB}
    with pytest.raises(SizingError, match=r"even at its smallest sizes .*huge 20\.0 GiB"):
        fit_sizes(SIZES, steps, shrink=["A", "B"], profile="fit", device="cuda")


def test_smoke_takes_the_smoke_sizes_and_refuses_nothing(monkeypatch):
    fake_gpu(monkeypatch, "T4")
    fit = fit_sizes(SIZES, {"huge": lambda s: 20 * GiB}, shrink=["A"], profile="smoke", device="cuda")
    assert fit.sizes == {"A": 2, "B": 4} and "smoke sizes" in fit.line()


def test_the_profile_is_the_cell_s_value_then_the_environment_then_the_device(monkeypatch):
    monkeypatch.setenv("COURSE_PROFILE", "smoke")
    fake_gpu(monkeypatch, "T4")
    sizes = fit_sizes(SIZES, two_steps(1), shrink=["A"], profile=None, device="cuda").sizes
    assert sizes == {"A": 2, "B": 4}  # $COURSE_PROFILE
    assert fit_sizes(SIZES, two_steps(1), shrink=["A"], profile="fit", device="cuda").profile == "fit"
    monkeypatch.delenv("COURSE_PROFILE")
    assert fit_sizes(SIZES, two_steps(1), shrink=["A"], device="cuda").profile == "fit"  # a GPU's default


def test_precision_can_be_fixed_by_the_lesson(monkeypatch):
    fake_gpu(monkeypatch, "H100")
    fit = fit_sizes(SIZES, two_steps(1), shrink=["A"], profile="fit", device="cuda", precision="fp32")
    assert fit.precision == "fp32" and "this lesson's" in fit.line()


def test_bad_input_names_the_mistake():
    with pytest.raises(ValueError, match="floor"):
        Size(full=4, smoke=1, floor=8)
    with pytest.raises(ValueError, match="positive integer"):
        Size(full=0, smoke=1)
    with pytest.raises(ValueError, match="not among the sizes"):
        fit_sizes(SIZES, two_steps(1), shrink=["C"], profile="fit")
    with pytest.raises(ValueError, match="twice"):
        fit_sizes(SIZES, two_steps(1), shrink=["A", "A"], profile="fit")
    with pytest.raises(ValueError, match="at least one step"):
        fit_sizes(SIZES, {}, shrink=["A"], profile="fit")
    with pytest.raises(ValueError, match="must return bytes"):
        fit_sizes(SIZES, {"x": lambda s: -1}, shrink=["A"], profile="smoke")
    with pytest.raises(ValueError, match="unknown course profile 'huge'"):
        fit_sizes(SIZES, two_steps(1), shrink=["A"], profile="huge")
    with pytest.raises(ValueError, match="margin"):
        device_memory("cpu", margin=1.5)


def test_device_memory_reads_what_the_device_reports(monkeypatch):
    g = fake_gpu(monkeypatch, "L4")
    mem = device_memory("cuda")
    assert mem.total_bytes == g.total_memory and mem.usable_bytes == int(g.total_memory * (1 - MARGIN))
    assert mem.name == "NVIDIA L4"
    cpu = device_memory("cpu")
    assert cpu.total_bytes > 2**30 and "RAM" in cpu.name  # the machine's RAM


# --- choices from the capability -------------------------------------------------------------------------

@pytest.mark.parametrize("key", list(GPU_CLASSES))
def test_training_precision_follows_the_capability(monkeypatch, key):
    g = fake_gpu(monkeypatch, key)
    precision, why = training_precision("cuda")
    assert precision == ("bf16" if g.capability >= (8, 0) else "fp16")
    assert f"sm_{g.capability[0]}{g.capability[1]}" in why
    check_precision(precision, "cuda")  # what it picks, the device runs
    assert precision_runs("bf16", "cuda") == (g.capability >= (8, 0))


def test_training_precision_elsewhere(monkeypatch):
    assert training_precision("cpu")[0] == "fp32"
    fake_gpu(monkeypatch, GPUClass("P100", "Tesla P100-PCIE-16GB", (6, 0), 16 * GiB, 56, 4 * 2**20))
    assert training_precision("cuda") == ("fp32", "fp32 (sm_60: no tensor cores)")


def test_check_precision_asks_its_device_not_the_current_one(monkeypatch):
    # a T4 beside an A100: torch.cuda.is_bf16_supported() asks cuda:0 (the A100) and said yes for the T4
    fake_gpu(monkeypatch, ("A100-40", "T4"))
    check_precision("bf16", "cuda:0")
    with pytest.raises(ValueError, match="Tesla T4 is 7.5: use fp16"):
        check_precision("bf16", "cuda:1")
    assert training_precision("cuda:1")[0] == "fp16" and training_precision("cuda:0")[0] == "bf16"


@pytest.mark.parametrize("key", list(GPU_CLASSES))
def test_fp8_is_decided_from_the_capability_alone(monkeypatch, key):
    g = fake_gpu(monkeypatch, key)  # nothing can be allocated on the fake: a probe would raise
    ok, why = fp8_capable("cuda")
    assert ok == (g.capability >= (8, 9)) and g.name in why
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")  # the fake still allocates nothing


def test_a_mixed_box_sizes_the_device_asked(monkeypatch):
    fake_gpu(monkeypatch, ("H100", gpu_class("T4")))
    unit = usable("T4") // 512
    assert fit_sizes(SIZES, two_steps(unit), shrink=["A", "B"], profile="fit",
                     device="cuda:1").sizes == {"A": 32, "B": 16}
    assert fit_sizes(SIZES, two_steps(unit), shrink=["A", "B"], profile="fit",
                     device="cuda:0").sizes == {"A": 32, "B": 64}  # the H100: A alone was over
