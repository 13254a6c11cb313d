"""Out of memory in the GPU benchmarks: a run or rung that does not fit is reported with the memory it asked
for and what the device held (helpers.core.diagnosis.OOMReport), and the benchmark goes on or stops cleanly.

The errors are planted (raised with the text CUDA's caching allocator writes), at tiny sizes on the CPU.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from helpers.core.diagnosis import OOMReport
from helpers.core.units import GiB

ROOT = Path(__file__).resolve().parents[1]
CUDA_OOM = ("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 14.58 GiB of "
            "which 310.00 MiB is free. Including non-PyTorch memory, this process has 14.27 GiB memory in "
            "use. Of the allocated memory 13.20 GiB is allocated by PyTorch, and 1.02 GiB is reserved by "
            "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_oom_test", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ladder_bench():
    return _load("ladder")


def test_oom_report_reads_the_allocator_message():
    r = OOMReport.parse(torch.OutOfMemoryError(CUDA_OOM))
    assert (r.device, r.asked_bytes, r.allocated_bytes) == ("cuda:0", int(1.5 * GiB), int(13.2 * GiB))
    assert (r.total_bytes, r.free_bytes) == (int(14.58 * GiB), 310 * 2**20)
    assert str(r) == ("out of memory on cuda:0: asked for 1.50 GiB; 13.20 GiB held by PyTorch, 0.30 GiB free "
                      "of 14.58 GiB")
    cpu = OOMReport.parse(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                       "1073741824 bytes. Error code 12 (Cannot allocate memory)"))
    assert (cpu.device, cpu.asked_bytes, cpu.total_bytes) == ("cpu", GiB, None)
    assert OOMReport.parse(RuntimeError("CUDA error: an illegal memory access was encountered")) is None
    assert OOMReport.parse(ValueError("out of memory")) is None  # only the errors torch raises for it


def test_mixed_precision_reports_a_run_that_does_not_fit_and_goes_on(monkeypatch):
    import helpers.train.loop

    real = helpers.train.loop.train

    def fp32_does_not_fit(model, batches, cfg, *, spec, **kw):
        if spec.precision == "fp32":
            raise torch.OutOfMemoryError(CUDA_OOM)
        return real(model, batches, cfg, spec=spec, **kw)

    monkeypatch.setattr(helpers.train.loop, "train", fp32_does_not_fit)
    bench = _load("mixed_precision_gpu")
    monkeypatch.setattr(bench, "PRECISIONS", ("fp32", "tf32"))  # one run after the one that does not fit
    spec = bench.workloads(smoke=True)["small"]
    rows = bench.run_workload("small", spec, torch.device("cpu"))
    fp32 = rows[0]
    assert fp32["precision"] == "fp32" and fp32["oom"]["asked_bytes"] == int(1.5 * GiB)
    assert fp32["skipped"].startswith("out of memory on cuda:0: asked for 1.50 GiB")
    assert [r["precision"] for r in rows[1:]] == ["tf32"]
    assert all(r["median_step_s"] > 0 and "skipped" not in r for r in rows[1:]), "the runs after it went on"
    assert "asked for 1.50 GiB" in bench.to_markdown(rows, {"device": "x", "torch": "t", "cuda": None,
                                                            "driver": None, "transformers": "t", "date": "d"},
                                                     "smoke", [])


@pytest.mark.parametrize("fails", ["baseline", "rung"])
def test_ladder_reports_the_stack_that_ran_out_of_memory(ladder_bench, monkeypatch, tmp_path, fails):
    import helpers.train.ladder

    bench = ladder_bench
    monkeypatch.setattr(bench, "mfu_peak", lambda *a, **k: None)  # no peak measurement: not what is tested
    monkeypatch.setattr(bench, "corpus_lengths", lambda seq_len, log=print: ([seq_len] * 8, "planted"))
    real = helpers.train.ladder.measure_stack

    def planted(stack, reference, **kw):
        if fails == "baseline" or reference is not None:  # the baseline has no reference
            raise torch.OutOfMemoryError(CUDA_OOM)
        return real(stack, reference, **kw)

    monkeypatch.setattr(helpers.train.ladder, "measure_stack", planted)
    args = ["--model", "tiny", "--seq-len", "16", "--batch-size", "2", "--batches", "1", "--repeats", "1",
            "--device", "cpu", "--out", str(tmp_path)]
    try:
        result = bench.main(args)
    except SystemExit as stop:  # the run stopped at the stack that did not fit
        assert stop.code == 3
        saved = json.loads(next(tmp_path.glob("ladder-*.json")).read_text())
        said = saved.get("stopped") or saved["partial"]
        first = bench.RUNGS[0].name
        assert ("the fp32 eager baseline" if fails == "baseline" else f"rung 1 ({first})") in said, said
        assert "asked for 1.50 GiB" in said and "try --batch-size 1" in said, said
        assert saved["oom"]["asked_bytes"] == int(1.5 * GiB)
        if fails == "rung":
            assert saved["rows"][0]["name"] and len(saved["rows"]) == 1  # the baseline it finished is kept
    else:  # helpers.train.ladder.climb reports an out-of-memory rung as skipped: the run went on
        assert fails == "rung"
        # the first rung this device measures (a CPU skips "+ TF32" before measuring: it has no TF32 units)
        measured = [r for r in result["rows"][1:] if "no TF32 units" not in (r.get("why") or "")]
        assert "asked for 1.50 GiB" in measured[0]["why"], measured[0]
