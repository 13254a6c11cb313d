"""Lesson 06's GPU-only code, run on a CPU (issue 18): step 3's GPU branch executed with the device a CPU,
`pin_memory` an identity and the CUDA calls no-ops, so a name it breaks for later cells fails here, not on
the first GPU; and the lesson pins batch after batch only where PyTorch's pin_memory guide says it pays."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import torch

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "06_input_pipeline.ipynb"
STEP3_COPIES = "d0b79338"  # the cell id of step 3's timed copies (GPU only)


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
    assert not per_step, ("pinning a batch on the main thread each step, then copying, is usually slower "
                          "than a plain .to(device); use DataLoader(pin_memory=True): " + "; ".join(per_step))
