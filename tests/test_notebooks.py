"""Every lesson is committed clean and follows the course's skeleton (DESIGN.md)."""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SECTIONS = ("What you will learn", "What we measured on this machine", "Exercises", "Further reading")


def _cells(path):
    return json.loads(path.read_text())["cells"]


def test_there_are_lessons():
    assert NOTEBOOKS, "no notebooks found in notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    dirty = [i for i, c in enumerate(_cells(path))
             if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_follows_the_lesson_skeleton(path):
    cells = _cells(path)
    code = [c for c in cells if c["cell_type"] == "code"]
    assert "bootstrap" in code[0].get("metadata", {}).get("tags", []), \
        f"{path.name}: the first code cell is set-up (tag `bootstrap`), before any import of helpers"
    assert "parameters" in code[1].get("metadata", {}).get("tags", []), \
        f"{path.name}: the second code cell must carry the `parameters` tag"
    assert "get_profile" in "".join(code[1]["source"]), \
        f"{path.name}: the parameters cell reads the profile"
    first_md = "".join(next(c for c in cells if c["cell_type"] == "markdown")["source"])
    assert "**Time:**" in first_md, \
        f"{path.name}: the first markdown cell gives the time it takes (**Time:**)"
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    missing = [s for s in SECTIONS if s not in markdown]
    assert not missing, f"{path.name}: missing sections {missing}"
