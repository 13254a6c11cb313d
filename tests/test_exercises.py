"""The checked exercises (helpers.exercises): for every exercise, its solution passes; its untouched
skeleton, read from the notebook cell itself, reports "not attempted"; and mutants of the solution, the
mistakes learners make, fail with the hint meant for them. Also: the check cell's contract (one line; an
AssertionError for a wrong answer; strict mode), and the cells in the notebooks (skeleton, check, solution
link, given code).

Lesson 07's exercise runs under torchrun: its solution and mutants are checked in one launch (2 processes).
The notebooks themselves run every exercise's solution strictly in CI (conftest.py: _add_exercise_solutions).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import runpy
from pathlib import Path

import pytest

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

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"

# Mutants: (the mistake the check must name, [(text of the solution, replaced by)]). Each is a mistake
# learners make; each replaced text occurs exactly once in the solution, so mutants follow its edits.
MUTANTS: dict[str, list[tuple[str, list[tuple[str, str]]]]] = {
    "00-roofline": [
        ("flops-multiply-add", [("flops, elements = 2 * n ** 3,", "flops, elements = n ** 3,")]),
        ("bytes-output", [("flops, elements = n, 3 * n", "flops, elements = n, 2 * n")]),
        ("ridge", [(" / roof.bandwidth  # FLOP per byte", "  # FLOP per byte")]),
    ],
    "01-flash-forward": [
        ("missing-rescale", [("alpha = torch.exp(m - m_new)", "alpha = torch.ones_like(m_new)")]),
        ("not-normalised", [("return acc / l[..., None], m", "return acc, m")]),
        ("lse-is-max", [("m + torch.log(l)", "m")]),
        ("missing-scale", [("scale = q.shape[-1] ** -0.5", "scale = 1.0")]),
    ],
    "02-fp16-step": [
        ("clip-before-unscale", [("    scaler.unscale_(optimizer)", "    pass")]),
        ("direct-step", [("    scaler.step(optimizer)", "    optimizer.step()")]),
        ("backward-in-autocast", [("        loss = model(**batch).loss  # forward and loss only\n    scaler",
                                   "        loss = model(**batch).loss\n        scaler")]),
        ("no-clip", [("    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)", "    pass")]),
    ],
    "03-largest-batch": [
        ("no-gc", [("        gc.collect()", "        pass")]),
        ("no-bisect", [("    while bad - good > 1:", "    while False:")]),
        ("swallowed-error", [("except torch.cuda.OutOfMemoryError:", "except Exception:")]),
        ("kept-error", [("except torch.cuda.OutOfMemoryError:\n            pass",
                         "except torch.cuda.OutOfMemoryError as err:\n            KEPT.append(err)"),
                        ("import gc\n", "import gc\n\nKEPT = []\n")]),
    ],
    "05-graph-break": [
        ("graph-break", [("max_loss / loss.detach()", "max_loss / loss.item()")]),
        ("gradient", [("max_loss / loss.detach()", "max_loss / loss")]),
        ("branch-dropped", [("return torch.where(loss > max_loss, loss * (max_loss / loss.detach()), loss)",
                             "return loss")]),
    ],
    "06-hidden-syncs": [
        ("per-step-sync", [("    losses = [train_step(batch) for batch in batches]",
                            "    losses = []\n    for batch in batches:\n"
                            "        loss = train_step(batch)\n"
                            "        if not torch.isfinite(loss):\n"
                            "            raise FloatingPointError(loss)\n"
                            "        losses.append(loss)")]),
        ("not-floats", [("return stacked.tolist()", "return losses")]),
        ("nan-unnoticed", [("    if bad.any():", "    if False:")]),
    ],
    "07-bucketed-allreduce": [
        ("summed", [("            flat /= world", "            pass")]),
        ("last-bucket", [("        flush()  # the last bucket", "        pass  # the last bucket")]),
        ("no-overlap", [("        if size >= bucket_cap_bytes:\n            flush()", "        pass")]),
    ],
    "08-keep-rule": [
        ("inverted", [("best.median_s / candidate.median_s", "candidate.median_s / best.median_s")]),
        ("candidate-spread-only", [("max(candidate.iqr_s / candidate.median_s, best.iqr_s / best.median_s)",
                                    "candidate.iqr_s / candidate.median_s")]),
        ("absolute-spread", [("max(candidate.iqr_s / candidate.median_s, best.iqr_s / best.median_s)",
                              "max(candidate.iqr_s, best.iqr_s)")]),
    ],
    "08-new-rung": [
        ("duplicate", [('"precision", "fp16"', '"precision", "bf16"')]),
        ("not-a-rung", [("NEW_RUNG = ladder.Rung(", "NEW_RUNG = (")]),
        ("no-claim", [('"like bf16 on Volta+ GPUs, but needs a GradScaler (lesson 02)"', '""')]),
    ],
}


def _roof():
    from helpers.roofline import Roofline

    return Roofline("a test CPU", {"fp32": 5e10}, 1e10, 512, 64 * 2 ** 20)  # ridge: 5 FLOP per byte


def _context(ex) -> dict:
    return {"roof": _roof()} if "roof" in ex.needs else {}


def _load(path: Path, source: str, name: str):
    """The answer `name` defined by `source`, run from a file (its source can be read, as a cell's can)."""
    path.write_text(source, encoding="utf-8")
    return runpy.run_path(str(path))[name]


def _mutate(source: str, edits: list[tuple[str, str]]) -> str:
    for old, new in edits:
        assert source.count(old) == 1, f"the mutant's text {old!r} is not in the solution exactly once"
        source = source.replace(old, new)
    return source


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


IDS = sorted(EXERCISES)
ELSEWHERE = {"04-predict-time"}  # its solution and mutants are tested in tests/test_exercise04.py
OURS = [i for i in IDS if i not in ELSEWHERE]
LOCAL = [i for i in OURS if i != "07-bucketed-allreduce"]  # lesson 07's runs under torchrun: its own test
MUTANT_CASES = [pytest.param(i, mistake, edits, id=f"{i}:{mistake}")
                for i in LOCAL for mistake, edits in MUTANTS[i]]


# --- every exercise: solution, skeleton, mutants ------------------------------------------------------------

def test_every_exercise_has_mutants_and_a_solution():
    assert set(MUTANTS) == set(OURS)
    for ex in EXERCISES.values():
        assert ex.solution_path.is_file(), ex.solution
        assert ex.solution_path.parent.name == ex.lesson, ex.solution
        assert ex.id in ELSEWHERE or 2 <= len(MUTANTS[ex.id]) <= 4, ex.id


@pytest.mark.parametrize("exercise_id", LOCAL)
def test_the_solution_passes(exercise_id, tmp_path):
    ex = EXERCISES[exercise_id]
    answer = _load(tmp_path / "solution.py", ex.solution_path.read_text(encoding="utf-8"), ex.answer)
    outcome = evaluate(exercise_id, answer, **_context(ex))
    assert outcome.status == "passed", outcome.line


@pytest.mark.parametrize("exercise_id, mistake, edits", MUTANT_CASES)
def test_a_mutant_fails_with_its_hint(exercise_id, mistake, edits, tmp_path):
    ex = EXERCISES[exercise_id]
    source = _mutate(ex.solution_path.read_text(encoding="utf-8"), edits)
    outcome = evaluate(exercise_id, _load(tmp_path / "mutant.py", source, ex.answer), **_context(ex))
    assert (outcome.status, outcome.mistake) == ("failed", mistake), outcome.line
    assert outcome.hint and "Hint: " in outcome.line and "\n" not in outcome.line


@pytest.mark.parametrize("exercise_id", IDS)
def test_the_notebook_skeleton_is_not_attempted(exercise_id, tmp_path):
    """The skeleton exactly as the notebook holds it: defined, then checked, it says 'not attempted'."""
    ex = EXERCISES[exercise_id]
    cells = _exercise_cells(ex)
    answer = _load(tmp_path / "skeleton.py", "".join(cells["exercise-skeleton"]["source"]), ex.answer)
    outcome = evaluate(exercise_id, answer, **_context(ex))
    assert outcome.status == "not attempted", outcome.line


def test_lesson_07_solution_and_mutants_in_one_torchrun_launch(tmp_path):
    """Lesson 07's exercise: the solution and its mutants run in ONE torchrun launch (2 gloo processes)."""
    ex = EXERCISES["07-bucketed-allreduce"]
    solution = ex.solution_path.read_text(encoding="utf-8")
    answers = {"solution": _load(tmp_path / "solution.py", solution, ex.answer)}
    for mistake, edits in MUTANTS[ex.id]:
        answers[mistake] = _load(tmp_path / f"{mistake}.py", _mutate(solution, edits), ex.answer)
    lesson07.prefetch_allreduce(answers.values())
    for name, answer in answers.items():
        outcome = evaluate(ex.id, answer)
        want = ("passed", "") if name == "solution" else ("failed", name)
        assert (outcome.status, outcome.mistake) == want, outcome.line


# --- the check cell's contract -----------------------------------------------------------------------------

def _keep_rung(source: str, tmp_path: Path):
    return _load(tmp_path / "keep.py", source, "keep_rung")


SOLUTION_08 = EXERCISES["08-keep-rule"].solution_path


def test_check_prints_one_line_and_a_wrong_answer_stops_run_all(tmp_path, capsys):
    good = _keep_rung(SOLUTION_08.read_text(), tmp_path)
    assert check("08-keep-rule", good) is None
    wrong = _keep_rung("def keep_rung(candidate, best):\n    return candidate.median_s < best.median_s\n",
                       tmp_path)
    with pytest.raises(AssertionError) as err:  # ExerciseFailed is an AssertionError: Run All stops there
        check("08-keep-rule", wrong)
    assert isinstance(err.value, ExerciseFailed) and err.value.mistake == "no-spread" and err.value.hint
    printed = capsys.readouterr().out.strip().splitlines()  # the passed line; the error carries the other
    assert len(printed) == 1 and printed[0].startswith("08-keep-rule: passed")
    line = str(err.value)
    assert line.startswith("08-keep-rule: not right yet") and "Hint:" in line and "\n" not in line
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
    broken = _keep_rung("def keep_rung(candidate, best):\n    return candidate.median / best.median_s\n",
                        tmp_path)
    outcome = evaluate("08-keep-rule", broken)
    assert (outcome.status, outcome.mistake) == ("failed", "raised"), outcome.line
    assert "AttributeError" in outcome.line
    assert "line 2 (`return candidate.median / best.median_s`)" in outcome.line
    left_in = _keep_rung("def keep_rung(candidate, best):\n    ratio = best.median_s / candidate.median_s\n"
                         "    if ratio > 100:\n        return True\n    raise NotImplementedError\n",
                         tmp_path)
    assert evaluate("08-keep-rule", left_in).status == "not attempted"  # the skeleton's raise, left in


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

    ex = EXERCISES["08-keep-rule"]
    monkeypatch.setitem(EXERCISES, ex.id, type(ex)(**{**ex.__dict__, "check": broken_check}))
    with pytest.raises(KeyError, match="a bug in the course"):
        evaluate(ex.id, _keep_rung(SOLUTION_08.read_text(), tmp_path))


def test_show_solution_prints_the_file(capsys):
    exercises.show_solution("01-flash-forward")
    out = capsys.readouterr().out
    assert "solutions/01_attention/flash_forward.py" in out and "def flash_forward" in out


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
    assert f"../solutions/{ex.solution}" in task and f'show_solution("{ex.id}")' in task


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
    assert f"solutions/{lesson}/" in line
