"""Lesson 04's asserts can fail: each one, run from the notebook's own source (found by cell id) in a
namespace holding what earlier cells define, at small sizes, passes as committed and fails on a planted error.
Timings the assert judges are fixed values where the test is about the rule, not about this machine's speed;
where real timings run, the planted error is too large for any load to hide."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers.opcount import count_ops, labelled_step
from helpers.regimes import (
    EXCESS,
    ROOF_MARGIN,
    TOO_BUSY,
    MemoryRoofs,
    OpRow,
    OpTable,
    check_reconciled,
    fixed_work_s,
)
from helpers.roofline import Roofline
from helpers.tables import Table
from helpers.timing import Timing, benchmark, benchmark_interleaved, time_interleaved, timing_from

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "04_where_time_goes.ipynb"
ROOF = Roofline("test machine", {"fp32": 100e9}, 10e9, 512, 2**20)


def cell_source(cell_id: str) -> str:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return "".join(next(c for c in cells if c.get("id") == cell_id)["source"])


def run_cell(cell_id: str, ns: dict, plant: tuple[str, str] | None = None) -> dict:
    source = cell_source(cell_id)
    if plant is not None:
        assert plant[0] in source, f"the planted bug's target {plant[0]!r} is not in the cell any more"
        source = source.replace(plant[0], plant[1])
    exec(compile(source, f"04:{cell_id}", "exec"), ns)
    return ns


def base_ns(**extra) -> dict:
    from helpers.models import SmallTransformer, small_config

    return {"torch": torch, "F": F, "count_ops": count_ops, "Table": Table, "benchmark": benchmark,
            "small_config": small_config, "SmallTransformer": SmallTransformer,
            "labelled_step": labelled_step,
            "PROFILE": "smoke", "VOCAB": 256, "DROPOUT": 0.0, "BATCH": 2, "SEQ": 16, "SEED": 0,
            "device": torch.device("cpu"), "GPU": False, "MIN_RUN_TIME": 0.02, "ROOF_MARGIN": ROOF_MARGIN,
            "TOO_BUSY": TOO_BUSY, "EXCESS": EXCESS, "PEAK": 1e12, "RIDGE": 100.0, "OVERHEAD_S": 1e-6,
            "SYNCHRONOUS": True, "roof": ROOF, "memory_roofs": MemoryRoofs((), (), 1e12, None),
            "measured": {}, **extra}


# --- step 2: two ops against their formulas and their roofs ------------------------------------------------

def test_two_ops_pass_and_a_roof_too_low_fails():
    run_cell("2cc2e2cb", base_ns())  # roofs far above anything this machine does: nothing beats them
    # planted: roofs in the wrong unit (kFLOP/s, kB/s): beaten however busy the machine is
    with pytest.raises(AssertionError, match="faster than its roof"):
        run_cell("2cc2e2cb", base_ns(PEAK=1e3, memory_roofs=MemoryRoofs((), (), 1e3, None)))


@pytest.mark.parametrize("plant", [
    ("assert mm.flops == 2 * tokens * d * 4 * d", "assert mm.flops == tokens * d * 4 * d"),  # one per FMA
    ("assert mm.bytes == x.nbytes + w.nbytes + h.nbytes", "assert mm.bytes == x.nbytes + w.nbytes"),
    ("assert gelu.bytes == 2 * h.nbytes", "assert gelu.bytes == h.nbytes"),  # its output forgotten
])
def test_the_formulas_of_step_2_fail_on_a_wrong_formula(plant):
    with pytest.raises(AssertionError):
        run_cell("2cc2e2cb", base_ns(), plant=plant)


# --- step 3: the profile against the plain step ------------------------------------------------------------

def _table(pairs, cost, noise=0.0):
    row = OpRow("aten::mm", "forward", "matmul", 1, 0.004, 1e6, 1e4, "compute", 1e-5, "FlopCounterMode",
                0.004, 1e10, "cache", 1e-6, 1e-5)
    return OpTable((row,), sum(p for p, _ in pairs) / len(pairs), "cpu", "fp32", 1e11, 1e10, 1e-6,
                   unprofiled_s=pairs[0][1], profiler_cost_s=cost, pairs=tuple(pairs), noise=noise)


def _step3_ns(table) -> dict:
    return base_ns(PROFILE_STEPS=2, contextlib=__import__("contextlib"), make_optimizer=_optimizer,
                   cfg=__import__("helpers.models", fromlist=["small_config"]).small_config(
                       "smoke", vocab_size=256, n_layers=1, d_model=32, n_heads=2),
                   profile_step=lambda *a, **k: table, check_reconciled=check_reconciled)


def _optimizer(model, lr, weight_decay):
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)


def test_the_profile_must_account_for_the_plain_step(capsys):
    pairs = [(0.0305, 0.0178), (0.031, 0.018), (0.030, 0.0175), (0.0302, 0.0177), (0.0306, 0.0179)]
    run_cell("3911d152", _step3_ns(_table(pairs, cost=0.0127)))  # its events' cost taken out: reconciled
    with pytest.raises(AssertionError, match="does not account for the step"):  # planted: not taken out
        run_cell("3911d152", _step3_ns(_table(pairs, cost=0.0)))
    run_cell("3911d152", _step3_ns(_table(pairs, cost=0.0, noise=TOO_BUSY)))  # too busy: said, not judged
    assert "too busy to judge" in capsys.readouterr().out


# --- step 6: two measures of overhead --------------------------------------------------------------------

def _sweep_ns(overhead_s: float, spread: float = 0.0) -> dict:
    from helpers.models import small_config

    cfg = small_config("smoke", vocab_size=256, n_layers=1, d_model=32, n_heads=2)
    ns = base_ns(cfg=cfg, make_optimizer=_optimizer, BATCHES=[2, 4], SWEEP_ROUNDS=3,
                 fixed_work_s=fixed_work_s, timing_from=timing_from)
    ns.update(profile_step=lambda *a, **k: _table([(1.0, 1.0)] * 5, 0.0), check_reconciled=check_reconciled,
              PROFILE_STEPS=2, contextlib=__import__("contextlib"))
    run_cell("3911d152", ns)  # defines small_transformer_step
    # the steps' times, fixed: 5 ms + 1 ms per sequence (what a CPU shows: a fixed part, then linear); the
    # cell's loop variable `b` says which batch is being timed
    ns["time_once"] = lambda fn: (None, (0.005 + 0.001 * ns["b"]) * (1 + spread))
    ns["tiny_table"] = types.SimpleNamespace(overhead_total_s=lambda: overhead_s, outside_s=overhead_s / 2,
                                             noise=0.0)
    return ns


def test_the_sweep_and_the_op_table_must_agree_on_the_overhead(capsys):
    run_cell("fe67820e", _sweep_ns(overhead_s=0.004))  # 5 ms fixed, less the fixed work, vs 4 ms
    assert "agree" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="is the per-call cost"):
        run_cell("fe67820e", _sweep_ns(overhead_s=0.0005))  # planted: the calls counted, not the time between


# --- the decode-like step --------------------------------------------------------------------------------

def _decode_ns(per_token: bool) -> dict:
    def interleaved(one, several, repeats, device):
        t1 = [0.050 + 0.001 * i for i in range(repeats)]
        batch = several().shape[0]  # the cell's DECODE_BATCH, from the arm itself
        tb = [t * (batch if per_token else 1.1) for t in t1]  # the weights read per token, or once
        return (Timing("1", sorted(t1)[repeats // 2], 0.0, repeats, 1, tuple(t1)),
                Timing(str(batch), sorted(tb)[repeats // 2], 0.0, repeats, 1, tuple(tb)))

    return base_ns(LLC=2**20, time_interleaved=interleaved, memory_roofs=MemoryRoofs((), (), 10e9, None))


def test_a_decode_step_reads_its_weights_once_for_the_batch():
    ns = run_cell("9b3e7a51", _decode_ns(per_token=False))
    assert ns["DECODE_LAYERS"] * ns["layer_bytes"] >= 1.25 * 2**20  # sized from the cache
    with pytest.raises(AssertionError, match="weights read per token"):
        run_cell("9b3e7a51", _decode_ns(per_token=True))
    with pytest.raises(AssertionError, match="faster than its roof"):  # planted: bandwidth 1000x too low
        run_cell("9b3e7a51", _decode_ns(per_token=False) | {"memory_roofs": MemoryRoofs((), (), 10e6, None)})


# --- step 7: each op against its counts --------------------------------------------------------------------

def test_each_op_of_step_7_is_held_to_its_model(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)  # the rule is tested, not Inductor
    from helpers.predictions import start_measuring

    def kind_inputs(kind, rows_scale=1):
        if kind == "compute-bound":
            return (lambda a, b: a @ b), (torch.randn(32 * rows_scale, 32), torch.randn(32, 32))
        return (lambda t: t * 2), (torch.randn(8 * rows_scale, 8),)

    ns = base_ns(kind_inputs=kind_inputs, start_measuring=start_measuring, COMPILE_ALL=False, BIGGER=2,
                 benchmark_interleaved=benchmark_interleaved, time_interleaved=time_interleaved,
                 time=__import__("time"), MIN_RUN_TIME=0.01,
                 model={k: ("memory", 1e-9) for k in ("compute-bound", "memory-bound", "overhead-bound")})
    run_cell("1f45efc5", ns)
    ns["model"] = {k: ("memory", 1e3) for k in ns["model"]}  # planted: counts that say 1000 s per call
    with pytest.raises(AssertionError, match="faster than its model"):
        run_cell("1f45efc5", ns)


def test_predictions_are_locked_before_the_measurement_starts():
    from helpers.predictions import blank_predictions, lock_predictions

    ns = base_ns(blank_predictions=blank_predictions, lock_predictions=lock_predictions)
    run_cell("85d3c2e9", ns)
    assert ns["locked"].made_at > 0 and all(v is None for v in ns["locked"].predictions.values())
    with pytest.raises(ValueError, match="not one of"):
        run_cell("85d3c2e9", ns, plant=('predictions["memory-bound"] = None',
                                        'predictions["memory-bound"] = ("fusion", 2.0)'))
