"""The benchmark command lines at tiny sizes on a CPU: thin over helpers, checked before timed, files
named after the device; and their verdict logic on planted numbers."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SCRIPTS = ["attention_sweep.py", "mixed_precision_gpu.py", "update_results.py"]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """A script run as a learner would, from another folder: helpers must import without path tricks."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize("script", SCRIPTS)
def test_scripts_are_thin_command_lines(script):
    text = (BENCH / script).read_text()
    assert "sys.path" not in text, f"{script} manipulates sys.path: helpers is installed (pip install -e .)"
    assert not re.search(r"^__all__", text, flags=re.M), f"{script} is a command line, not a library"
    assert "def _stamp" not in text and "def _slug" not in text  # course.results stamps and names


def test_attention_sweep_cli_checks_times_and_writes_stamped_files(tmp_path):
    out = tmp_path / "out"
    _run(tmp_path, str(BENCH / "attention_sweep.py"), "--device", "cpu", "--seq-lens", "32", "64",
         "--batch", "1", "--heads", "2", "--head-dim", "16", "--impls", "naive", "sdpa-math", "triton",
         "--min-run-time", "0.01", "--out", str(out))
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"attention_sweep-cpu.{e}" for e in ("json", "md", "png")]
    data = json.loads((out / "attention_sweep-cpu.json").read_text())
    assert data["stamp"]["slug"] == "cpu" and data["stamp"]["torch"] and data["config"]["dtype"] == "fp32"
    rows = {(r["impl"], r["seq_len"]): r for r in data["rows"]}
    assert rows[("naive", 64)]["status"] == "ok" and rows[("naive", 64)]["max_abs_err"] < 1e-4
    assert rows[("naive", 64)]["median_s"] > 0
    assert rows[("triton", 32)]["status"] == "checked" and rows[("triton", 32)]["median_s"] is None
    assert "| 64 |" in (out / "attention_sweep-cpu.md").read_text()


def test_attention_sweep_budget_reports_cases_not_run():
    import torch

    bench = _load("attention_sweep")
    result = bench.sweep([32, 64], impls=["naive"], batch=1, heads=1, head_dim=8, dtype="fp32", causal=True,
                         device=torch.device("cpu"), min_run_time=0.01, verbose=False, deadline=0.0)
    assert [r["status"] for r in result["rows"]] == ["not run", "not run"]
    assert all(r["median_s"] is None and "budget" in r["reason"] for r in result["rows"])


def _row(impl: str, ms: float, n: int = 4096) -> dict:
    return dict(impl=impl, seq_len=n, median_s=ms / 1e3, tflops=100.0 / ms)


def test_gpu_target_verdict_on_planted_times():
    bench = _load("attention_sweep")
    peak = {"dtype": "bf16", "measured_flops": 700e12, "datasheet_flops": 989.4e12, "datasheet_source": "x"}
    fast = bench.gpu_target({"rows": [_row("sdpa-flash", 1.0), _row("sdpa-math", 5.0), _row("triton", 1.2)]},
                            peak)
    assert fast["best_sdpa"] == "sdpa-flash" and fast["triton_over_best"] == pytest.approx(1.2)
    assert "within the 1.3x target" in fast["verdict"] and "NOT" not in fast["verdict"]
    assert fast["triton_fraction_of_measured_peak"] == pytest.approx(100 / 1.2 * 1e12 / 700e12)
    slow = bench.gpu_target({"rows": [_row("sdpa-flash", 1.0), _row("triton", 1.5)]}, peak)
    assert "NOT within" in slow["verdict"]
    missing = bench.gpu_target({"rows": [_row("sdpa-flash", 1.0), _row("triton", 1.0, n=1024)]}, peak)
    assert missing["verdict"].startswith("not measured")


def test_mixed_precision_cli_smoke_writes_stamped_files(tmp_path):
    out = tmp_path / "out"
    _run(tmp_path, str(BENCH / "mixed_precision_gpu.py"), "--smoke", "--device", "cpu", "--only", "small",
         "--out", str(out))
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"mixed_precision-cpu-smoke.{e}" for e in ("json", "md", "png")]
    data = json.loads((out / "mixed_precision-cpu-smoke.json").read_text())
    assert data["stamp"]["device_type"] == "cpu" and data["profile"] == "smoke"
    assert [r["precision"] for r in data["rows"]] == ["fp32", "tf32", "fp16", "bf16"]
    assert all(r["correct"] and r["median_step_s"] > 0 and not r["compiled"] for r in data["rows"])
    assert all("not a GPU" in c["verdict"] or c["verdict"] == "not measured" for c in data["checks"])


def test_mixed_precision_targets_on_planted_numbers():
    bench = _load("mixed_precision_gpu")
    rows = [dict(workload="w", precision="fp32", compiled=False, speedup_vs_fp32=1.0, memory_vs_fp32=1.0),
            dict(workload="w", precision="bf16", compiled=False, speedup_vs_fp32=3.0, memory_vs_fp32=0.5),
            dict(workload="w", precision="bf16", compiled=True, speedup_vs_bf16_eager=1.1)]
    got = {c["check"]: c["verdict"] for c in bench.targets(rows, "w")}
    assert got == {"bf16 speed-up over fp32": "met", "bf16 peak memory / fp32's": "met",
                   "compiled bf16 speed-up over bf16 eager": "missed by 15%"}
    rows[1]["speedup_vs_fp32"] = 2.0
    assert bench.targets(rows, "w")[0]["verdict"] == "missed by 20%"


def test_mixed_precision_budget_keeps_the_baseline_and_reports_the_rest_not_run():
    import torch

    bench = _load("mixed_precision_gpu")
    spec = bench.workloads(smoke=True)["small"]
    rows = bench.run_workload("small", spec, torch.device("cpu"), with_compile=True, deadline=0.0)
    assert rows[0]["precision"] == "fp32" and rows[0]["median_step_s"] > 0  # the baseline always runs
    assert [(r["precision"], r["compiled"]) for r in rows[1:]] == [("tf32", False), ("fp16", False),
                                                                  ("bf16", False), ("bf16", True)]
    assert all(r["skipped"].startswith("not run") for r in rows[1:])


def test_readme_block_copies_gpu_results_and_not_cpu_ones(tmp_path):
    update = _load("update_results")
    res = tmp_path / "benchmarks" / "results"
    res.mkdir(parents=True)
    (res / "ladder-cpu.md").write_text("# Ladder\nladder table\n")
    for name, kind in (("attention_sweep-cpu", "cpu"), ("attention_sweep-h200-causal", "cuda"),
                       ("mixed_precision-h200", "cuda")):
        (res / f"{name}.md").write_text(f"# {name}\n{name} table\n")
        (res / f"{name}.json").write_text(json.dumps({"stamp": {"device_type": kind}}))
    block = update.results_block(tmp_path)
    assert "ladder table" in block and "attention_sweep-h200-causal table" in block
    assert "mixed_precision-h200 table" in block and "attention_sweep-cpu table" not in block


# --- the GPU check's steps: Triton first, the target always, every finished case kept on a kill ----------

class Killed(Exception):
    """A step stopped at its time limit, from outside."""


def _fake_case(calls: list, stop_at: int):
    def run_case(impl, seq_len, **_):
        calls.append((seq_len, impl))
        if len(calls) == stop_at:
            raise Killed
        return dict(impl=impl, seq_len=seq_len, status="ok", reason="", median_s=1e-3, iqr_s=0.0,
                    peak_bytes=2**20, tflops=1.0, max_abs_err=0.0, first_call_s=None)
    return run_case


def test_attention_sweep_runs_triton_first_and_keeps_finished_cases_when_stopped(tmp_path, monkeypatch):
    bench = _load("attention_sweep")
    calls: list = []
    monkeypatch.setattr(bench, "run_case", _fake_case(calls, stop_at=4))
    with pytest.raises(Killed):
        bench.main(["--device", "cpu", "--seq-lens", "64", "32", "--impls", "naive", "sdpa-math", "triton",
                    "--out", str(tmp_path)])
    assert calls == [(64, "triton"), (64, "naive"), (64, "sdpa-math"), (32, "triton")]
    data = json.loads((tmp_path / "attention_sweep-cpu.json").read_text())
    assert [(r["seq_len"], r["impl"]) for r in data["rows"]] == calls[:3]  # written as each case finished
    table = (tmp_path / "attention_sweep-cpu.md").read_text()
    assert "| naive | sdpa-math | triton |" in table  # columns in IMPLS order, whatever ran first


def test_attention_sweep_budget_spares_the_protected_cases(monkeypatch):
    import torch

    bench = _load("attention_sweep")
    calls: list = []
    monkeypatch.setattr(bench, "run_case", _fake_case(calls, stop_at=0))
    result = bench.sweep([64, 32], impls=["naive", "sdpa-math", "triton"], batch=1, heads=1, head_dim=8,
                         dtype="fp32", causal=False, device=torch.device("cpu"), min_run_time=0.01,
                         verbose=False, deadline=0.0, protect={(64, "triton"), (64, "sdpa-math")})
    assert calls == [(64, "triton"), (64, "sdpa-math")]
    assert [r["status"] for r in result["rows"]] == ["ok", "not run", "ok", "not run", "not run", "not run"]


def test_mixed_precision_keeps_every_finished_arm_when_stopped(tmp_path, monkeypatch):
    bench = _load("mixed_precision_gpu")
    done = []

    def run(name, spec, precision, device, init, *, compiled=False):
        if len(done) == 2:
            raise Killed
        done.append(precision)
        return dict(workload=name, precision=precision, compiled=compiled,
                    median_step_s=0.1 / (1 + len(done)), first_step_s=0.2, step_times_s=[0.2, 0.1],
                    tokens_per_s=1.0, peak_memory_bytes=2**20, memory_method="x", estimate_bytes=None,
                    mfu=None, first_loss=1.0, last_loss=0.9)

    monkeypatch.setattr(bench, "_run", run)
    with pytest.raises(Killed):
        bench.main(["--smoke", "--device", "cpu", "--only", "small", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "mixed_precision-cpu-smoke.json").read_text())
    assert [r["precision"] for r in data["rows"]] == ["fp32", "tf32"]
    assert data["rows"][1]["speedup_vs_fp32"] == pytest.approx(1.5)  # compared as soon as it finished


def test_mixed_precision_compiles_through_the_run_spec(monkeypatch):
    """The compiled arm is RunSpec(compile=True).apply (regional compilation), not a finder of its own,
    and the spec applied is the one trained with."""
    import types

    import torch

    import helpers.train.loop
    from helpers.train.runspec import RunSpec

    bench = _load("mixed_precision_gpu")
    applied, trained = [], []
    monkeypatch.setattr(RunSpec, "apply", lambda self, model: applied.append(self) or model)
    result = types.SimpleNamespace(step_times_s=[1.0, 0.5], tokens_per_s=1.0, peak_memory_bytes=1,
                                   memory_method="x", mfu=None, peak_source=None, losses=[2.0, 1.0],
                                   skipped_steps=[])
    monkeypatch.setattr(helpers.train.loop, "train",
                        lambda model, batches, cfg, device, spec: trained.append(spec)
                        or result)
    spec = bench.workloads(smoke=True)["small"]
    init = bench._build(spec).state_dict()
    row = bench._run("small", spec, "bf16", torch.device("cpu"), init, compiled=True)
    assert [(s.precision, s.compile) for s in applied] == [("bf16", True)] and trained == applied
    assert row["compiled"] and row["median_step_s"] == 0.5
