"""docs/learning-goals.md lists, for every lesson, each goal its "What you will learn" states and the cell
that computes it (issue 50): the goals are the lesson's own words, each line of code is in one of the lesson's
code cells, and none is a call into its course/lessons/lessonNN.py. A lesson added without its rows fails."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "learning-goals.md"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MODULE_CALL = re.compile(r"\blesson\d\d\.\w+\(")  # a call into a lesson's module
# Rows still computed in a lesson's module, each with its owner's reason; an entry that no longer is fails.
PENDING = {"09_plan_your_run.ipynb": "the plan against this machine and published runs: the planner's part"}


def goals_of(notebook: Path) -> list[str]:
    """The bullets of the lesson's "What you will learn", one line each, bold marks and final ; or . gone."""
    text = "".join(json.loads(notebook.read_text(encoding="utf-8"))["cells"][0]["source"])
    block = text[text.index("What you will learn"):text.index("**Prerequisites")].splitlines()[1:]
    goals: list[str] = []
    for line in block:
        if line.startswith("- "):
            goals.append(line[2:].strip())
        elif line.startswith("  ") and goals:
            goals[-1] += " " + line.strip()
    return [re.sub(r"[;.]$", "", g.replace("**", "")) for g in goals]


def rows_of(doc: str) -> dict[str, list[tuple[str, list[str]]]]:
    """{notebook: [(goal, [code lines])]} from the page's tables."""
    out: dict[str, list[tuple[str, list[str]]]] = {}
    current = None
    for line in doc.splitlines():
        if m := re.match(r"^## `(\d\d_\w+\.ipynb)`", line):
            current = out.setdefault(m[1], [])
        elif current is not None and line.startswith("| ") and not line.startswith("| what you will learn |"):
            goal, where = line.strip("| ").split(" | ", 1)  # where: "§n: what it does: `code` · `code`"
            code = where[where.index(": `") + 2:] if ": `" in where else ""
            current.append((goal, re.findall(r"`([^`]+)`", code)))
    return out


def code_of(name: str) -> str:
    cells = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def problems(doc: str, notebooks: list[Path] = NOTEBOOKS) -> list[str]:
    rows = rows_of(doc)
    found = []
    for nb in notebooks:
        if nb.name not in rows:
            found.append(f"{nb.name}: no table on docs/learning-goals.md")
            continue
        goals = goals_of(nb)
        listed = [g for g, _ in rows[nb.name]]
        if listed != goals:
            found.append(f"{nb.name}: the goals listed {listed} are not the lesson's {goals}")
        for goal, lines in rows[nb.name]:
            if not lines:
                found.append(f"{nb.name}: '{goal}' names no line of code")
            for line in lines:
                pending = line.startswith("PENDING: ")
                where, code = (f"{line[:2]}_", line[4:]) if re.match(r"^\d\d: ", line) else (nb.name, line)
                code = code.removeprefix("PENDING: ")
                name = next((p.name for p in NOTEBOOKS if p.name.startswith(where)), where)
                if code not in code_of(name):
                    found.append(f"{nb.name}: `{code}` is in no code cell of {name}")
                elif MODULE_CALL.search(code) and not (pending and nb.name in PENDING):
                    found.append(f"{nb.name}: `{code}` is a call into the lesson's module, not the method")
                elif pending and not MODULE_CALL.search(code):
                    found.append(f"{nb.name}: `{code}` is marked pending but is on the page now: unmark it")
    return found


def test_every_goal_of_every_lesson_points_to_a_cell_on_the_page():
    assert problems(DOC.read_text(encoding="utf-8")) == []


def test_a_missing_goal_a_moved_line_and_a_module_call_are_found():
    doc = DOC.read_text(encoding="utf-8")
    nb = NOTEBOOKS[4]  # lesson 04
    first = rows_of(doc)[nb.name][0]
    other = doc.replace(f"| {first[0]} |", "| another goal |")
    assert any("goals listed" in p for p in problems(other, [nb]))
    moved = doc.replace(f"`{first[1][0]}`", "`a line no cell holds`", 1)
    assert any("in no code cell" in p for p in problems(moved, [nb]))
    called = doc.replace(f"`{first[1][0]}`", "`lesson04.roofs_here(device, S.PROFILE, MIN_RUN_TIME`", 1)
    assert any("call into the lesson's module" in p for p in problems(called, [nb]))
    assert problems(doc.replace(f"## `{nb.name}`", "## `elsewhere`"), [nb]) == [
        f"{nb.name}: no table on docs/learning-goals.md"]
