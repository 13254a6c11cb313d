"""pytest set-up for the whole repository: how nbval runs the notebooks.

- cells tagged `requires-cuda` are skipped without a CUDA GPU, `requires-multi-gpu` with fewer than two;
- stderr is never compared (warnings and progress bars differ from run to run);
- nbval waits at most 5 s for each further output message of a cell; slow CI needs longer;
- without CUDA, Triton interprets kernels (TRITON_INTERPRET=1) in the whole session: triton < 3.4 decides
  when it is first imported, and a test module imported before tests/test_kernels.py may import it;
- after each checked exercise's check cell, one more cell runs the exercise's solution, strictly
  (`_add_exercise_solutions` says why and how).
"""

from __future__ import annotations

import os
import textwrap

import pytest

OUTPUT_TIMEOUT_S = 120  # seconds nbval waits for the next output message of a running cell


def _gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


if not _gpu_count():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton in this process


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpus = None
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is None:  # not a notebook cell
            continue
        item.output_timeout = OUTPUT_TIMEOUT_S
        skip_compare = getattr(item.parent, "skip_compare", ())
        if "stderr" not in skip_compare:
            item.parent.skip_compare = (*skip_compare, "stderr")
        tags = cell.get("metadata", {}).get("tags", [])
        if "requires-cuda" in tags or "requires-multi-gpu" in tags:
            gpus = _gpu_count() if gpus is None else gpus
            if "requires-cuda" in tags and gpus < 1:
                item.add_marker(pytest.mark.skip(reason="cell tagged requires-cuda; no CUDA GPU here"))
            elif "requires-multi-gpu" in tags and gpus < 2:
                reason = f"cell tagged requires-multi-gpu; {gpus} GPU(s) here"
                item.add_marker(pytest.mark.skip(reason=reason))
    _add_exercise_solutions(items)


# --- checked exercises (helpers.exercises) ---------------------------------------------------------------

EXERCISE_SOLUTIONS_ENV = "COURSE_EXERCISE_SOLUTIONS"  # "0": run the notebooks as they are, answers and all


def _exercise_solution_source(exercise_id: str, check_source: str) -> str:
    """The cell run after an exercise's check cell: the skeleton said "not attempted"; the solution; the
    check again, strict."""
    from helpers.exercises import EXERCISES

    ex = EXERCISES[exercise_id]
    return "\n".join([
        "from helpers import exercises as _exercises",
        "",
        f"_exercises.expect_status({exercise_id!r}, 'not attempted')  # the committed skeleton, in context",
        f"# --- solutions/{ex.solution}",
        ex.solution_path.read_text(encoding="utf-8"),
        "# --- the check cell again, strict: 'not attempted' would be an error",
        "with _exercises.strict_mode():",
        textwrap.indent(check_source, "    "),
    ])


def _add_exercise_solutions(items: list[pytest.Item]) -> None:
    """After each cell tagged `exercise-check`, an extra nbval item runs one more cell in the same kernel.

    Why this design: CI must prove, for every exercise, that the untouched skeleton reports "not attempted"
    in its lesson, that the solution passes there, and that the rest of the lesson runs with the learner's
    code in place. Running every notebook a second time with the solutions filled in would double the
    notebooks' share of CI (most of its 20 minutes). So the one nbval run does all three: the check cell runs
    on the committed skeleton as a learner's first Run All does; then the extra cell asserts that it said
    "not attempted", runs the solution file (solutions/<lesson>/<name>.py, which defines the skeleton's
    name), and runs the check cell's code again in strict mode, where "not attempted" is an error too. Every
    later cell then runs with the solution's definitions. The cost is one more check per exercise (about a
    second; one torchrun launch for lesson 07). COURSE_EXERCISE_SOLUTIONS=0 turns it off (to run a notebook
    that holds your own answers)."""
    if os.environ.get(EXERCISE_SOLUTIONS_ENV, "1") == "0":
        return
    out = []
    for item in items:
        out.append(item)
        cell = getattr(item, "cell", None)
        if cell is None or "exercise-check" not in cell.get("metadata", {}).get("tags", []):
            continue
        import nbformat

        exercise_id = cell["metadata"]["exercise"]
        extra_cell = nbformat.v4.new_code_cell(_exercise_solution_source(exercise_id, cell.source))
        extra = type(item).from_parent(item.parent, name=f"{item.name} (solution of {exercise_id}, strict)",
                                       cell_num=item.cell_num, cell=extra_cell, options=item.options)
        extra.output_timeout = item.output_timeout
        for marker in item.iter_markers():  # skipped with its check cell
            extra.add_marker(marker)
        out.append(extra)
    items[:] = out
