"""pytest set-up for the whole repository: which tests need a GPU, and how nbval runs the notebooks.

- a test that needs a CUDA GPU carries the marker `@pytest.mark.cuda` (registered in pyproject.toml;
  `pytest.param(..., marks=pytest.mark.cuda)` for one case of a parametrised test): it is skipped without
  CUDA, and `make gpu-check` runs exactly these on a GPU (`pytest -m cuda`, on the files that write
  `mark.cuda`: a marked test in a file that does not, say through an imported alias, stops the session);
- without a GPU, a test that skips for want of one (its reason names CUDA, a GPU or NCCL) but is NOT marked
  fails, saying to add the marker: unmarked, `make gpu-check` would never run it. (With a GPU present the
  rule is off: a skip naming the GPU there means "this checks the CPU-only message", not "needs a GPU".)
- notebook cells tagged `requires-cuda` are skipped without a CUDA GPU, `requires-multi-gpu` with fewer
  than two (the tags, not the marker, govern cells);
- stderr is never compared (warnings and progress bars differ from run to run);
- nbval waits at most 5 s for each further output message of a cell; slow CI needs longer;
- without CUDA, Triton interprets kernels (TRITON_INTERPRET=1) in the whole session: triton < 3.4 decides
  when it is first imported, and a test module imported before tests/test_kernels.py may import it;
- after each checked exercise's check cell, one more cell runs the exercise's solution, strictly
  (`_add_exercise_solutions` says why and how);
- a notebook that tests/test_browser.py runs cell by cell in Chromium (lesson 01) is left out of nbval when
  that test runs in the same session: it has nbval's checks there (`_leave_browser_runs_to_the_browser`);
- a cell whose output shows known noise (course_setup's NATIVE_NOISE, LOG_NOISE, WARNING_NOISE, and
  MemTracker's warning) fails: the lessons filter it at its source (`noise_in`).
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ("pytester",)  # tests/test_gpu_check.py runs planted test files through this file

OUTPUT_TIMEOUT_S = 120  # seconds nbval waits for the next output message of a running cell
NEEDS_GPU = re.compile(r"cuda|gpu|nccl", re.IGNORECASE)  # a skip reason that names the missing GPU
MARKER_TEXT = "mark.cuda"  # `make gpu-check` runs `pytest -m cuda` on the test files holding this text
UNMARKED = ("{what} skips for want of a GPU ({reason!r}) but does not carry the `cuda` marker, so `make "
            "gpu-check` (pytest -m cuda) would never run it: {fix}")


def _gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


GPUS = _gpu_count()  # once per session (and per planted copy of this file)

if not GPUS:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton in this process


@pytest.hookimpl(trylast=True)  # after -k / -m have deselected: what is left is what runs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _leave_browser_runs_to_the_browser(config, items)
    hidden = []  # cuda tests the GPU check would not find: their file never names the marker
    texts: dict = {}
    for item in items:
        cell = getattr(item, "cell", None)
        if cell is None:  # a test: the marker decides
            if item.get_closest_marker("cuda") is not None:
                if item.path not in texts:
                    texts[item.path] = item.path.read_text(encoding="utf-8")
                if MARKER_TEXT not in texts[item.path]:
                    hidden.append(item.nodeid)
                if not GPUS:
                    item.add_marker(pytest.mark.skip(reason="marked cuda: needs a CUDA GPU, none here"))
            continue
        item.output_timeout = OUTPUT_TIMEOUT_S
        skip_compare = getattr(item.parent, "skip_compare", ())
        if "stderr" not in skip_compare:
            item.parent.skip_compare = (*skip_compare, "stderr")
        tags = cell.get("metadata", {}).get("tags", [])
        if "requires-cuda" in tags and GPUS < 1:
            item.add_marker(pytest.mark.skip(reason="cell tagged requires-cuda; no CUDA GPU here"))
        elif "requires-multi-gpu" in tags and GPUS < 2:
            item.add_marker(pytest.mark.skip(reason=f"cell tagged requires-multi-gpu; {GPUS} GPU(s) here"))
    _add_exercise_solutions(items)
    if hidden:
        raise pytest.UsageError(
            f"{hidden[0]} (and {len(hidden) - 1} more) is marked cuda, but its file never writes "
            f"{MARKER_TEXT!r}, and `make gpu-check` runs `pytest -m cuda` only on files that do: "
            "write @pytest.mark.cuda (or pytestmark = pytest.mark.cuda) there")


def _leave_browser_runs_to_the_browser(config: pytest.Config, items: list[pytest.Item]) -> None:
    """nbval leaves out a notebook that tests/test_browser.py runs cell by cell in Chromium in this session,
    with nbval's checks (its docstring lists them): one run of it, not two. Only where that test is selected
    and can run (Chromium and Playwright found); otherwise nbval runs the notebook as before."""
    browser = sys.modules.get("test_browser")  # imported by its collection, if it was collected
    selected = {Path(item.callspec.params["path"]).resolve() for item in items
                if item.nodeid.split("[")[0].endswith("test_browser.py::test_notebook_in_browser")
                and item.callspec.params.get("path") is not None}  # None: the "no notebooks" placeholder
    if browser is None or not selected:
        return
    there = browser.runs_instead_of_nbval() & selected
    left_out = [item for item in items if getattr(item, "cell", None) is not None
                and Path(item.path).resolve() in there]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report = outcome.get_result()
    if (GPUS or not report.skipped or hasattr(report, "wasxfail") or getattr(item, "cell", None) is not None
            or item.get_closest_marker("cuda") is not None):
        return
    reason = _skip_reason(report)
    if NEEDS_GPU.search(reason):
        report.outcome = "failed"
        report.longrepr = UNMARKED.format(what=item.nodeid, reason=reason, fix=(
            "add @pytest.mark.cuda to it (or pytest.param(..., marks=pytest.mark.cuda) to its CUDA cases)"))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> object:
    outcome = yield
    report = outcome.get_result()
    if GPUS or not report.skipped or not isinstance(collector, pytest.Module):
        return
    reason = _skip_reason(report)
    if NEEDS_GPU.search(reason):  # a module-level skip hides its tests from `pytest -m cuda` as well
        report.outcome = "failed"
        report.longrepr = UNMARKED.format(what=collector.nodeid, reason=reason, fix=(
            "write `pytestmark = pytest.mark.cuda` at the top of the module instead of skipping it"))


# --- checked exercises (course.exercises) ---------------------------------------------------------------

EXERCISE_SOLUTIONS_ENV = "COURSE_EXERCISE_SOLUTIONS"  # "0": run the notebooks as they are, answers and all


def _exercise_solution_source(exercise_id: str, check_source: str) -> str:
    """The cell run after an exercise's check cell: the skeleton said "not attempted"; the solution; the
    check again, strict."""
    from course.exercises import EXERCISES

    ex = EXERCISES[exercise_id]
    return "\n".join([
        "from course import exercises as _exercises",
        "",
        f"_exercises.expect_status({exercise_id!r}, 'not attempted')  # the committed skeleton, in context",
        f"# --- course/solutions/{ex.solution}",
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
    "not attempted", runs the solution file (course/solutions/<lesson>/<name>.py, which defines the
    skeleton's name), and runs the check cell's code again in strict mode, where "not attempted" is an error
    too. Every later cell then runs with the solution's definitions. The cost is one more check per exercise
    (about a second; one torchrun launch for lesson 07). COURSE_EXERCISE_SOLUTIONS=0 turns it off (to run a
    notebook that holds your own answers)."""
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


# --- known noise under the cells (issue 50) -----------------------------------------------------------------

def noise_in(outputs: list) -> list[str]:
    """The lines of a cell's outputs (nbval's or nbformat's output dicts) that show known noise: what
    course_setup.quiet_known_noise filters in every lesson, and MemTracker's warning, filtered where
    helpers.core.compat runs it."""
    import course_setup
    from helpers.core.compat import MEM_TRACKER_NOISE

    texts = [str(o.get("text", "")) for o in outputs if o.get("output_type") == "stream"]
    for o in outputs:  # a logged warning can also arrive as display data; an error's text counts too
        texts += [str(v) for k, v in (o.get("data") or {}).items() if k == "text/plain"]
    starts = [start for _, start in course_setup.LOG_NOISE]
    patterns = [re.compile(p) for p, _ in course_setup.WARNING_NOISE] + [re.compile(MEM_TRACKER_NOISE)]
    found = []
    for line in "\n".join(texts).splitlines():
        if (course_setup.NATIVE_NOISE.fullmatch(line) or any(start in line for start in starts)
                or any(p.search(line) for p in patterns)):
            found.append(line.strip())
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> object:
    result = yield
    outputs = getattr(item, "test_outputs", None) if getattr(item, "cell", None) is not None else None
    found = noise_in(outputs) if outputs else []
    if found:
        raise AssertionError(f"{len(found)} line(s) of known noise under the cell, e.g. {found[0]!r}: filter "
                             "it at its source (course_setup.quiet_known_noise, helpers.core.compat)")
    return result
