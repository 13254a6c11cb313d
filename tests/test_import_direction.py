"""Issue 14: imports among the helpers modules run one way, base -> measure -> model/data -> train -> show.

Read from the source (every `import`, at module level or inside a function), so a lazy import that
closes a circle counts too. Checked for lesson 01/03/05/07's modules: config, memory, attention, kernels,
models, data, plots, widgets.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
LAYER = {  # the layout in helpers/__init__.py: a module may import its own layer or layers to its left
    "config": 0, "tables": 0, "timing": 0, "precision": 0, "hardware": 0,
    "flops": 1, "memory": 1, "results": 1,
    "attention": 2, "kernels": 2, "models": 2, "data": 2, "packing": 2, "fp8": 2,
    "checkpoint": 3, "train": 3, "distributed": 3, "ladder": 3,
    "plots": 4, "widgets": 4,
}
CHECKED = ["config", "memory", "attention", "kernels", "models", "data", "plots", "widgets"]


def helpers_imports(path: Path) -> set[str]:
    """First component after `helpers.` of every helpers module that `path` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[0] == "helpers" and len(parts) > 1:
                found.add(parts[1])
            elif node.module == "helpers":
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("helpers."))
    return found


def _files(module: str) -> list[Path]:
    folder = HELPERS / module
    return sorted(folder.glob("*.py")) if folder.is_dir() else [HELPERS / f"{module}.py"]


@pytest.mark.parametrize("module", CHECKED)
def test_imports_run_one_way(module: str) -> None:
    for path in _files(module):
        for target in helpers_imports(path) - {module}:
            assert target in LAYER, f"{path.name} imports helpers.{target}, which has no layer in the table"
            assert LAYER[target] <= LAYER[module], (
                f"{path.name} (layer {LAYER[module]}) imports helpers.{target} (layer {LAYER[target]}): "
                "imports must run base -> measure -> model/data -> train -> show")


def test_the_check_sees_a_lazy_import(tmp_path: Path) -> None:
    planted = tmp_path / "memory.py"
    planted.write_text("def f():\n    from helpers.models import SmallTransformer\n", encoding="utf-8")
    assert helpers_imports(planted) == {"models"}
