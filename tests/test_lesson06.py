"""Lesson 06's GPU-only code, run on a CPU (issues 18, 24): step 3's GPU branch executed with the device a
CPU, `pin_memory` an identity and the CUDA calls no-ops, so a name it breaks for later cells fails here, not
on the first GPU; every way of batching is pinned alike on a GPU; pinning is timed where it happens (with 0
workers the DataLoader pins inside next(), on the loop's thread); no loop pins by hand batch after batch."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import torch

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "06_input_pipeline.ipynb"
STEP3_COPIES = "d0b79338"  # the cell id of step 3's timed copies (GPU only)
WORKER_SWEEP = "0adbe798"  # step 2: the num_workers (and, on a GPU, pin_memory) sweep
PADDING_ARMS = "4068bf3d"  # step 5: loader_for, the DataLoader of each way of batching


def _code_cells() -> list[tuple[str, str]]:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    return [(c.get("id", ""), "".join(c["source"])) for c in cells if c["cell_type"] == "code"]


def _functions_defined(source: str) -> list[ast.FunctionDef]:
    return [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]


def _called_names(source: str) -> set[str]:
    return {n.func.id for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


def test_step_3_gpu_branch_keeps_the_helpers_later_cells_call(monkeypatch):
    from helpers.tables import Table
    from helpers.timing import Timing

    cells = _code_cells()
    at = next(i for i, (cid, _) in enumerate(cells) if cid == STEP3_COPIES)
    # the lesson's functions defined before step 3, as a GPU run has them
    ns = {"torch": torch, "GPU": True, "device": torch.device("cpu"), "COPY_MB": 1, "measured": {},
          "Table": Table, "display": lambda *a: None, "time": __import__("time")}
    helpers = set()
    for _, source in cells[:at]:
        functions = _functions_defined(source)
        exec(compile(ast.Module(body=functions, type_ignores=[]), str(NOTEBOOK), "exec"), ns)
        helpers |= {f.name for f in functions}
    # the GPU branch, on this CPU: only the device and the size differ
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    ns["synchronize"] = lambda *a, **k: None
    ns["benchmark"] = lambda fn, name="", **k: (fn(), Timing(name=name, median_s=1e-3, iqr_s=0.0, runs=1,
                                                              calls_per_run=1, times_s=(1e-3,)))[1]
    exec(compile(cells[at][1], f"{NOTEBOOK.name} step 3", "exec"), ns)
    assert ns["measured"]["pinned GB/s"] > 0
    later = set().union(*(_called_names(source) for _, source in cells[at + 1:]))
    broken = {name: type(ns[name]).__name__ for name in later & helpers if not callable(ns[name])}
    assert not broken, f"step 3's GPU branch rebinds {broken}, which later cells call"
    pin = next(n for n in helpers & later if "pin" in n)  # the helper that pins batches reused in step 4
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long)}
    assert torch.equal(ns[pin](batch)["input_ids"], batch["input_ids"])


def test_batches_are_pinned_by_the_dataloader_not_step_by_step_on_the_main_thread():
    cells = _code_cells()
    # functions of the lesson that pin (call .pin_memory())
    pins = {f.name for _, source in cells for f in _functions_defined(source)
            if any(isinstance(n, ast.Attribute) and n.attr == "pin_memory" for n in ast.walk(f))}
    assert pins, "the lesson defines no helper that pins a batch (step 4 pins its batches once)"
    per_step = []
    for cid, source in cells:
        for loop in (n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.For, ast.While))):
            for call in (n for n in ast.walk(loop) if isinstance(n, ast.Call)):
                func = call.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name == "pin_memory" or name in pins:
                    per_step.append(f"cell {cid}, line {call.lineno}: {ast.unparse(call)}")
    assert not per_step, ("pinning a batch by hand each step, then copying, is usually slower than a "
                          "plain .to(device): pin batches once (step 4), or let DataLoader(pin_memory=True) "
                          "pin them (in its pin thread with workers, in next() without; step 2 times both): "
                          + "; ".join(per_step))


def _loader_for(gpu: bool, plant: tuple[str, str] | None = None):
    """Step 5's `loader_for`, defined as a GPU run (gpu=True) or a CPU run defines it; `plant` mutates it."""
    from torch.utils.data import DataLoader

    from helpers.packing import PackCollate, PackedBatchSampler
    from helpers.runspec import RunSpec

    source = next(src for cid, src in _code_cells() if cid == PADDING_ARMS)
    if plant is not None:
        assert plant[0] in source
        source = source.replace(*plant)
    ns = {"torch": torch, "DataLoader": DataLoader, "PackCollate": PackCollate,
          "PackedBatchSampler": PackedBatchSampler, "RunSpec": RunSpec, "BATCH": 2, "MAX_LEN": 16,
          "pad_id": 0, "SEED": 0, "GPU": gpu, "device": torch.device("cuda" if gpu else "cpu")}
    loader_for = next(f for f in _functions_defined(source) if f.name == "loader_for")
    exec(compile(ast.Module(body=[loader_for], type_ignores=[]), str(NOTEBOOK), "exec"), ns)
    return ns["loader_for"]


def _unpinned(loader_for) -> list[str]:
    from helpers.data import TokenizedDataset
    from helpers.runspec import PADDINGS

    ids = [[101, 5, 6, 102], [101, 7, 102], [101, 8, 9, 10, 102], [101, 11, 102]]
    ds = TokenizedDataset(ids, [0, 1, 0, 1])
    return [p for p in PADDINGS if not loader_for(ds, p).pin_memory]


def test_every_way_of_batching_is_pinned_alike_on_a_gpu():
    assert _unpinned(_loader_for(gpu=True)) == []  # the same kind of copy to the device in every arm
    assert set(_unpinned(_loader_for(gpu=False))) == {"fixed", "dynamic", "bucketed", "packed"}  # no GPU
    planted = _loader_for(gpu=True, plant=("collate_fn=collate_packed, pin_memory=GPU)",
                                           "collate_fn=collate_packed)"))
    assert _unpinned(planted) == ["packed"]  # the packed arm left pageable is caught


def test_the_worker_sweep_times_pinning_on_the_loop_thread_and_in_the_pin_thread():
    source = next(src for cid, src in _code_cells() if cid == WORKER_SWEEP)
    line = next(x for x in source.splitlines() if x.startswith("settings = "))
    gpu = eval(line.split(" = ", 1)[1], {"WORKERS": [0, 1, 2], "GPU": True, "max": max})
    cpu = eval(line.split(" = ", 1)[1], {"WORKERS": [0, 1, 2], "GPU": False, "max": max})
    assert (0, True) in gpu and (2, True) in gpu  # 0 workers: pinned inside next(); 2: by the pin thread
    assert all(not pin for _, pin in cpu)  # a CPU has nothing to pin
