"""The checked exercises (helpers.exercises): for every exercise, its solution and every right variant pass;
every wrong answer of `tests/exercise_answers.py` (each written from scratch, as a learner would) fails with
the hint meant for it; the untouched skeleton, read from the notebook cell itself, reports "not attempted";
inputs are drawn per run from a seed that the line shows and that replays them. Also: the check cell's
contract (one line; an AssertionError for a wrong answer; strict mode), and the cells in the notebooks
(skeleton, check, solution link, given code).

One seed per session (COURSE_EXERCISE_SEED replays a session's inputs; every failing line names its seed).
Lesson 07's exercise runs under torchrun: its solution and answers are checked in one launch (2 processes).
The notebooks themselves run every exercise's solution strictly in CI (conftest.py: _add_exercise_solutions).
04-predict-time belongs to lesson 04's own tests (tests/test_exercise04.py).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import runpy
from pathlib import Path

import pytest
from exercise_answers import RIGHT, WRONG  # tests/exercise_answers.py

import helpers.exercises as exercises
from helpers.exercises import (
    EXERCISES,
    ExerciseFailed,
    ExerciseNotAttempted,
    check,
    evaluate,
    lesson05,
    lesson06,
    lesson07,
)
from helpers.exercises.core import draw_seed

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SEED = draw_seed()  # this session's inputs; every outcome line names it


def _roof():
    from helpers.roofline import Roofline

    return Roofline("a test CPU", {"fp32": 5e10, "bf16": 2e10}, 1e10, 512, 64 * 2 ** 20)  # ridge: 5 FLOP/byte


def _context(ex) -> dict:
    return {"roof": _roof()} if "roof" in ex.needs else {}


def _load(path: Path, source: str, name: str):
    """The answer `name` defined by `source`, run from a file (its source can be read, as a cell's can)."""
    path.write_text(source, encoding="utf-8")
    return runpy.run_path(str(path))[name]


def _cells(lesson: str) -> list[dict]:
    return json.loads((NOTEBOOKS / f"{lesson}.ipynb").read_text(encoding="utf-8"))["cells"]


def _exercise_cells(ex) -> dict[str, dict]:
    """The exercise's cells in its notebook, by tag (exercise-task, exercise-skeleton, exercise-check)."""
    path = NOTEBOOKS / f"{ex.lesson}.ipynb"
    if not path.is_file():
        pytest.skip(f"{path.name} is not in this checkout yet (its exercise cells go in when it is)")
    found: dict[str, dict] = {}
    for cell in _cells(ex.lesson):
        if cell["metadata"].get("exercise") == ex.id:
            (tag,) = [t for t in cell["metadata"].get("tags", []) if t.startswith("exercise-")]
            assert tag not in found, f"{ex.id}: two cells tagged {tag}"
            found[tag] = cell
    return found


def _mistake(key: str) -> str:
    return key.split("#")[0]  # "whole-score-matrix#sdpa": the same mistake in other code


IDS = sorted(EXERCISES)
ELSEWHERE = {"04-predict-time"}  # its solution and answers are tested in tests/test_exercise04.py
OURS = [i for i in IDS if i not in ELSEWHERE]
LOCAL = [i for i in OURS if i != "07-bucketed-allreduce"]  # lesson 07's runs under torchrun: its own test
WRONG_CASES = [pytest.param(i, key, id=f"{i}:{key}") for i in LOCAL for key in WRONG[i]]
RIGHT_CASES = [pytest.param(i, key, id=f"{i}:{key}") for i in LOCAL for key in RIGHT[i]]


# --- every exercise: solution, right variants, wrong answers, skeleton --------------------------------------

def test_every_exercise_has_answers_and_a_solution():
    assert set(WRONG) == set(RIGHT) == set(OURS)
    for ex in EXERCISES.values():
        assert ex.solution_path.is_file(), ex.solution
        assert ex.solution_path.parent.name == ex.lesson, ex.solution
        if ex.id not in ELSEWHERE:
            assert len(WRONG[ex.id]) >= 5 and RIGHT[ex.id], ex.id


@pytest.mark.parametrize("exercise_id", LOCAL)
def test_the_solution_passes(exercise_id, tmp_path):
    ex = EXERCISES[exercise_id]
    answer = _load(tmp_path / "solution.py", ex.solution_path.read_text(encoding="utf-8"), ex.answer)
    outcome = evaluate(exercise_id, answer, seed=SEED, **_context(ex))
    assert outcome.status == "passed", outcome.line
    assert outcome.seed == SEED and f"seed {SEED}" in outcome.line


@pytest.mark.parametrize("exercise_id, key", RIGHT_CASES)
def test_a_right_variant_passes(exercise_id, key, tmp_path):
    ex = EXERCISES[exercise_id]
    answer = _load(tmp_path / "right.py", RIGHT[exercise_id][key], ex.answer)
    outcome = evaluate(exercise_id, answer, seed=SEED, **_context(ex))
    assert outcome.status == "passed", outcome.line


@pytest.mark.parametrize("exercise_id, key", WRONG_CASES)
def test_a_wrong_answer_fails_with_its_hint(exercise_id, key, tmp_path, capsys):
    ex = EXERCISES[exercise_id]
    answer = _load(tmp_path / "wrong.py", WRONG[exercise_id][key], ex.answer)
    outcome = evaluate(exercise_id, answer, seed=SEED, **_context(ex))
    assert (outcome.status, outcome.mistake) == ("failed", _mistake(key)), outcome.line
    assert outcome.hint and "Hint: " in outcome.line and "\n" not in outcome.line
    assert f"seed={SEED}) replays them" in outcome.line


@pytest.mark.parametrize("exercise_id", IDS)
def test_the_notebook_skeleton_is_not_attempted(exercise_id, tmp_path):
    """The skeleton exactly as the notebook holds it: defined, then checked, it says 'not attempted'."""
    ex = EXERCISES[exercise_id]
    cells = _exercise_cells(ex)
    answer = _load(tmp_path / "skeleton.py", "".join(cells["exercise-skeleton"]["source"]), ex.answer)
    outcome = evaluate(exercise_id, answer, **_context(ex))
    assert outcome.status == "not attempted", outcome.line


def test_lesson_07_answers_in_one_torchrun_launch(tmp_path):
    """Lesson 07's exercise: the solution, the right variants and the wrong answers run in ONE torchrun launch
    (2 gloo processes), on this session's inputs."""
    ex = EXERCISES["07-bucketed-allreduce"]
    solution = _load(tmp_path / "solution.py", ex.solution_path.read_text(), ex.answer)
    answers = {("passed", "solution"): solution}
    for key, source in RIGHT[ex.id].items():
        answers["passed", key] = _load(tmp_path / f"right-{key}.py", source, ex.answer)
    for key, source in WRONG[ex.id].items():
        answers["failed", key] = _load(tmp_path / f"wrong-{key.replace('#', '-')}.py", source, ex.answer)
    lesson07.prefetch_allreduce(answers.values(), SEED)
    for (status, key), answer in answers.items():
        outcome = evaluate(ex.id, answer, seed=SEED)
        want = (status, "" if status == "passed" else _mistake(key))
        assert (outcome.status, outcome.mistake) == want, f"{key}: {outcome.line}"


# --- inputs drawn per run --------------------------------------------------------------------------------

def test_inputs_are_drawn_per_run_and_a_seed_replays_them(tmp_path, monkeypatch):
    ex = EXERCISES["01-flash-forward"]
    answer = _load(tmp_path / "solution.py", ex.solution_path.read_text(), ex.answer)
    lines = {s: evaluate(ex.id, answer, seed=s).line for s in (1, 2, 3)}
    assert len(set(lines.values())) == 3  # other sizes each time (the line says which)
    assert evaluate(ex.id, answer, seed=2).line == lines[2]  # and a seed replays them
    monkeypatch.setenv("COURSE_EXERCISE_SEED", "3")
    assert evaluate(ex.id, answer).line == lines[3]
    monkeypatch.setenv("COURSE_EXERCISE_SEED", "three")
    with pytest.raises(ValueError, match="COURSE_EXERCISE_SEED"):
        evaluate(ex.id, answer)


def test_an_answer_tailored_to_one_run_fails_on_the_next(tmp_path):
    """An answer right only at the sizes one run drew (its counts looked up, not computed) passes that run and
    fails the next: fixed inputs would let it through."""
    ex = EXERCISES["00-roofline"]
    solution = ex.solution_path.read_text()
    asked = _load(tmp_path / "spy.py", solution + """
ASKED = set()
_right = intensity_and_regime


def intensity_and_regime(op, n, roof):
    ASKED.add((op, n))
    return _right(op, n, roof)
""", ex.answer)
    assert evaluate(ex.id, asked, seed=SEED, roof=_roof()).status == "passed"
    known = sorted(asked.__globals__["ASKED"])
    renamed = solution.replace("def intensity_and_regime(", "def _right(")
    tailored = _load(tmp_path / "tailored.py", renamed + f"""
KNOWN = {known!r}


def intensity_and_regime(op, n, roof):
    if (op, n) in KNOWN:  # the sizes the check asked for last time
        return _right(op, n, roof)
    return 0, 1, 0.0, "memory-bound"
""", ex.answer)
    assert evaluate(ex.id, tailored, seed=SEED, roof=_roof()).status == "passed"
    outcome = evaluate(ex.id, tailored, seed=SEED + 1, roof=_roof())
    assert outcome.status == "failed", outcome.line


# --- the check cell's contract -----------------------------------------------------------------------------

SOLUTION_08 = EXERCISES["08-greedy-climb"].solution_path


def _climb(source: str, tmp_path: Path):
    return _load(tmp_path / "climb.py", source, "greedy_climb")


def test_check_prints_one_line_and_a_wrong_answer_stops_run_all(tmp_path, capsys):
    good = _climb(SOLUTION_08.read_text(), tmp_path)
    assert check("08-greedy-climb", good) is None
    wrong = _climb(WRONG["08-greedy-climb"]["no-spread"], tmp_path)
    with pytest.raises(AssertionError) as err:  # ExerciseFailed is an AssertionError: Run All stops there
        check("08-greedy-climb", wrong)
    assert isinstance(err.value, ExerciseFailed) and err.value.mistake == "no-spread" and err.value.hint
    printed = capsys.readouterr().out.strip().splitlines()  # the passed line; the error carries the other
    assert len(printed) == 1 and printed[0].startswith("08-greedy-climb: passed")
    line = str(err.value)
    assert line.startswith("08-greedy-climb: not right yet") and "Hint:" in line and "\n" not in line
    assert err.value._render_traceback_() == [f"ExerciseFailed: {line}"]  # what Jupyter shows, alone


def test_not_attempted_goes_on_unless_strict(monkeypatch, capsys):
    check("08-new-rung", ...)  # the `...` skeleton
    assert "not attempted yet" in capsys.readouterr().out
    assert exercises.last_outcome("08-new-rung").status == "not attempted"
    exercises.expect_status("08-new-rung", "not attempted")
    with pytest.raises(AssertionError):
        exercises.expect_status("08-new-rung", "passed")
    with pytest.raises(ExerciseNotAttempted):
        check("08-new-rung", ..., strict=True)
    with exercises.strict_mode(), pytest.raises(ExerciseNotAttempted):
        check("08-new-rung", ...)
    monkeypatch.setenv("COURSE_EXERCISES", "strict")
    with pytest.raises(ExerciseNotAttempted):
        check("08-new-rung", ...)
    with exercises.strict_mode(False):
        check("08-new-rung", ...)
    monkeypatch.setenv("COURSE_EXERCISES", "sometimes")
    with pytest.raises(ValueError, match="COURSE_EXERCISES"):
        check("08-new-rung", ...)


def test_errors_in_the_learners_code_are_reported_where_they_are(tmp_path):
    broken = _climb("def greedy_climb(baseline, rungs, time_side_by_side):\n    return baseline.stack, []\n",
                    tmp_path)
    outcome = evaluate("08-greedy-climb", broken)
    assert (outcome.status, outcome.mistake) == ("failed", "raised"), outcome.line
    assert "AttributeError" in outcome.line
    assert "line 2 (`return baseline.stack, []`)" in outcome.line
    left_in = _climb("def greedy_climb(baseline, rungs, time_side_by_side):\n    best = baseline\n"
                     "    if not rungs:\n        return best, []\n    raise NotImplementedError\n", tmp_path)
    assert evaluate("08-greedy-climb", left_in).status == "not attempted"  # the skeleton's raise, left in


def test_bad_calls_are_clear_errors():
    with pytest.raises(ValueError, match="no exercise 'nope'"):
        check("nope", print)
    with pytest.raises(ValueError, match=r"roof=roof"):
        evaluate("00-roofline", print)  # the lesson's roofline is missing
    with pytest.raises(ValueError, match="status"):
        exercises.expect_status("08-new-rung", "done")


def test_a_bug_of_the_check_itself_is_not_blamed_on_the_learner(monkeypatch, tmp_path):
    def broken_check(answer):
        raise KeyError("a bug in the course")

    ex = EXERCISES["08-greedy-climb"]
    monkeypatch.setitem(EXERCISES, ex.id, type(ex)(**{**ex.__dict__, "check": broken_check}))
    with pytest.raises(KeyError, match="a bug in the course"):
        evaluate(ex.id, _climb(SOLUTION_08.read_text(), tmp_path))


def test_show_solution_prints_the_file(capsys):
    exercises.show_solution("01-flash-forward")
    out = capsys.readouterr().out
    assert "helpers/solutions/01_attention/flash_forward.py" in out and "def flash_forward" in out


# --- the cells in the notebooks -----------------------------------------------------------------------------

@pytest.mark.parametrize("exercise_id", IDS)
def test_the_exercise_cells_in_the_notebook(exercise_id):
    ex = EXERCISES[exercise_id]
    cells = _exercise_cells(ex)
    assert set(cells) == {"exercise-task", "exercise-skeleton", "exercise-check"}, exercise_id
    order = [c["id"] for c in _cells(ex.lesson) if c["metadata"].get("exercise") == ex.id]
    assert order == [cells[t]["id"] for t in ("exercise-task", "exercise-skeleton", "exercise-check")]
    skeleton = "".join(cells["exercise-skeleton"]["source"])
    assert "# YOUR CODE HERE" in skeleton and ("raise NotImplementedError" in skeleton or "= ..." in skeleton)
    calls = [line for line in "".join(cells["exercise-check"]["source"]).splitlines()
             if line and not line.startswith(("from ", "import "))]
    call = rf'(exercises\.)?check\("{ex.id}", {ex.answer}(, \w+=\w+)*\)'
    assert len(calls) == 1 and re.fullmatch(call, calls[0]), calls
    task = "".join(cells["exercise-task"]["source"])
    assert f"../helpers/solutions/{ex.solution}" in task and f'show_solution("{ex.id}")' in task


@pytest.mark.parametrize("exercise_id, given", [("05-graph-break", lesson05.loss_with_breaks),
                                                ("06-hidden-syncs", lesson06.train_loop_with_syncs)])
def test_the_given_code_in_the_notebook_is_the_checks(exercise_id, given):
    """The given function the notebook shows is the one the check compares with (annotations aside)."""
    skeleton = "".join(_exercise_cells(EXERCISES[exercise_id])["exercise-skeleton"]["source"])
    shown = next(n for n in ast.parse(skeleton).body
                 if isinstance(n, ast.FunctionDef) and n.name == given.__name__)
    module = ast.parse(inspect.getsource(given)).body[0]
    for node in (shown, module):  # compare the bodies and argument names
        for a in node.args.args:
            a.annotation = None
        node.returns = None
    assert ast.dump(shown) == ast.dump(module)


@pytest.mark.parametrize("lesson", sorted({ex.lesson for ex in EXERCISES.values()}))
def test_the_exercises_section_points_to_the_checked_exercises(lesson):
    if not (NOTEBOOKS / f"{lesson}.ipynb").is_file():
        pytest.skip(f"{lesson}.ipynb is not in this checkout yet")
    texts = ["".join(c["source"]) for c in _cells(lesson) if c["cell_type"] == "markdown"]
    section = next(t for t in texts if re.search(r"^## Exercises", t, re.M))
    line = next(x for x in section.splitlines() if x.startswith("**Checked exercises**"))
    assert all(f"`{ex.id}`" in line for ex in exercises.exercises_of(lesson))
    assert f"helpers/solutions/{lesson}/" in line
