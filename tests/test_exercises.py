"""The checked exercises (course.exercises): for every exercise, its solution and every right variant pass;
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
import gc
import inspect
import json
import random
import re
import runpy
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from exercise_answers import RIGHT, WRONG  # tests/exercise_answers.py
from fakegpu import fake_gpu  # tests/fakegpu.py

import course.exercises as exercises
from course.exercises import (
    EXERCISES,
    ExerciseFailed,
    ExerciseNotAttempted,
    check,
    lesson05,
    lesson06,
    lesson07,
    outcome_of,
)
from course.exercises.core import TIME_LIMIT_ENV, call_shape, draw_seed

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
SEED = draw_seed()  # this session's inputs; every outcome line names it


def _roof():
    from helpers.measure.roofline import Roofline

    return Roofline("a test CPU", {"fp32": 5e10, "bf16": 2e10}, 1e10, 512, 64 * 2 ** 20)  # ridge: 5 FLOP/byte


def _context(ex) -> dict:
    if ex.id == "08-new-rung":  # measured on the CPU on any machine: its answers include a CPU-only refusal
        return {"device": "cpu"}
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


def _global_state() -> dict:
    """What a check must leave as it found it: the random generators (torch's, Python's, numpy's), torch's
    threads, grad mode, default dtype and matmul precision, the profiler hook, the garbage collector, the
    SIGALRM handler, an earlier alarm (pytest-timeout's) still armed, GradScaler's constructor."""
    return {"torch_rng": torch.get_rng_state().numpy().tobytes(), "python_rng": random.getstate(),
            "numpy_rng": [x.tobytes() if isinstance(x, np.ndarray) else x for x in np.random.get_state()],
            "threads": torch.get_num_threads(), "grad": torch.is_grad_enabled(),
            "dtype": torch.get_default_dtype(), "matmul": torch.get_float32_matmul_precision(),
            "profile": sys.getprofile(), "gc": gc.isenabled(), "alarm": signal.getsignal(signal.SIGALRM),
            "alarm_armed": signal.getitimer(signal.ITIMER_REAL)[0] > 0,
            "scaler_init": torch.amp.GradScaler.__init__}


IDS = sorted(EXERCISES)
# their solutions and answers are tested in their lessons' own files (tests/test_exercise04.py, lesson 09's)
ELSEWHERE = {"04-predict-time", "09-largest-batch"}
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
    before = _global_state()
    outcome = outcome_of(exercise_id, answer, seed=SEED, **_context(ex))
    assert outcome.status == "passed", outcome.line
    assert outcome.seed == SEED and f"seed {SEED}" in outcome.line
    assert _global_state() == before  # no global state changed (02, 05 and 08-new-rung reseeded torch's)


@pytest.mark.parametrize("exercise_id, key", RIGHT_CASES)
def test_a_right_variant_passes(exercise_id, key, tmp_path):
    ex = EXERCISES[exercise_id]
    answer = _load(tmp_path / "right.py", RIGHT[exercise_id][key], ex.answer)
    outcome = outcome_of(exercise_id, answer, seed=SEED, **_context(ex))
    assert outcome.status == "passed", outcome.line


@pytest.mark.parametrize("exercise_id, key", WRONG_CASES)
def test_a_wrong_answer_fails_with_its_hint(exercise_id, key, tmp_path, capsys, monkeypatch):
    ex = EXERCISES[exercise_id]
    if _mistake(key) == "time-limit":  # an answer that never ends: stopped after 2 s, not the lesson's 60
        monkeypatch.setenv(TIME_LIMIT_ENV, "2")
    answer = _load(tmp_path / "wrong.py", WRONG[exercise_id][key], ex.answer)
    before = _global_state()
    outcome = outcome_of(exercise_id, answer, seed=SEED, **_context(ex))
    assert (outcome.status, outcome.mistake) == ("failed", _mistake(key)), outcome.line
    assert _global_state() == before
    assert outcome.hint and "Hint: " in outcome.line and "\n" not in outcome.line
    if outcome.mistake not in ("signature", "not-a-function"):  # these are told before any input is drawn
        assert f"seed={SEED}) replays them" in outcome.line


@pytest.mark.parametrize("seed", [256344, 68])  # drew a gradient norm of 0.997 and 1.004 before the fix
def test_fp16_step_draws_a_gradient_that_clipping_to_one_changes(seed, tmp_path):
    """Clipping to 1.0 leaves a gradient of norm <= 1 as it is: such inputs cannot tell that mistake from no
    clipping at all (a run with seed 256344 hinted "not clipped" to an answer that clipped to 1.0)."""
    ex = EXERCISES["02-fp16-step"]
    answer = _load(tmp_path / "wrong.py", WRONG[ex.id]["clip-default-norm"], ex.answer)
    assert outcome_of(ex.id, answer, seed=seed).mistake == "clip-default-norm"


def test_a_climb_that_retries_a_dropped_rung_is_named_even_when_noise_ends_it(tmp_path):
    """The check's sessions are noisy: with seed 18 a climb that times a dropped rung again ended when a later
    session kept it, and was told "kept has the wrong length" instead of its mistake."""
    ex = EXERCISES["08-greedy-climb"]
    answer = _load(tmp_path / "wrong.py", WRONG[ex.id]["endless"], ex.answer)
    assert outcome_of(ex.id, answer, seed=18).mistake == "endless"


@pytest.mark.parametrize("exercise_id", IDS)
def test_the_notebook_skeleton_is_not_attempted(exercise_id, tmp_path):
    """The skeleton exactly as the notebook holds it: defined, then checked, it says 'not attempted'."""
    ex = EXERCISES[exercise_id]
    cells = _exercise_cells(ex)
    answer = _load(tmp_path / "skeleton.py", "".join(cells["exercise-skeleton"]["source"]), ex.answer)
    outcome = outcome_of(exercise_id, answer, **_context(ex))
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
    # a planted fault, not a learner's answer: every gradient right, a parameter moved by 0.1 % after the
    # last step's finish(): only the parameter error the workers report can tell (the check never read it)
    from course.scripts.exercise_ddp import STEPS

    planted = ex.solution_path.read_text().replace("        pending.clear()", f"""        pending.clear()
        done.append(1)
        if len(done) == {STEPS}:  # the last of the check's steps
            next(model.parameters()).data.mul_(1.001)""")
    planted = planted.replace("    world = dist", "    done = []\n    world = dist")
    assert planted.count("done") == 3
    answers["failed", "params-differ"] = _load(tmp_path / "planted.py", planted, ex.answer)
    lesson07.prefetch_allreduce(answers.values(), SEED)
    for (status, key), answer in answers.items():
        outcome = outcome_of(ex.id, answer, seed=SEED)
        want = (status, "" if status == "passed" else _mistake(key))
        assert (outcome.status, outcome.mistake) == want, f"{key}: {outcome.line}"


# --- inputs drawn per run --------------------------------------------------------------------------------

def test_inputs_are_drawn_per_run_and_a_seed_replays_them(tmp_path, monkeypatch):
    ex = EXERCISES["01-flash-forward"]
    answer = _load(tmp_path / "solution.py", ex.solution_path.read_text(), ex.answer)
    lines = {s: outcome_of(ex.id, answer, seed=s).line for s in (1, 2, 3)}
    assert len(set(lines.values())) == 3  # other sizes each time (the line says which)
    assert outcome_of(ex.id, answer, seed=2).line == lines[2]  # and a seed replays them
    monkeypatch.setenv("COURSE_EXERCISE_SEED", "3")
    assert outcome_of(ex.id, answer).line == lines[3]
    monkeypatch.setenv("COURSE_EXERCISE_SEED", "three")
    with pytest.raises(ValueError, match="COURSE_EXERCISE_SEED"):
        outcome_of(ex.id, answer)


def test_an_answer_tailored_to_one_run_fails_on_the_next(tmp_path):
    """An answer right only at the sizes one run drew (its counts looked up, not computed) passes that run and
    fails the next: fixed inputs would let it through."""
    ex = EXERCISES["00-roofline"]
    solution = ex.solution_path.read_text()
    # the spy keeps what it was asked inside an object, where the contract's look for state kept between
    # calls does not reach: the spy is the test's instrument, not an answer
    asked = _load(tmp_path / "spy.py", solution + """
import types

SPY = types.SimpleNamespace(asked=set())
_right = intensity_and_regime


def intensity_and_regime(op, n, roof):
    SPY.asked.add((op, n))
    return _right(op, n, roof)
""", ex.answer)
    assert outcome_of(ex.id, asked, seed=SEED, roof=_roof()).status == "passed"
    known = sorted(asked.__globals__["SPY"].asked)
    renamed = solution.replace("def intensity_and_regime(", "def _right(")
    tailored = _load(tmp_path / "tailored.py", renamed + f"""
KNOWN = {known!r}


def intensity_and_regime(op, n, roof):
    if (op, n) in KNOWN:  # the sizes the check asked for last time
        return _right(op, n, roof)
    return 0, 1, 0.0, "memory-bound"
""", ex.answer)
    assert outcome_of(ex.id, tailored, seed=SEED, roof=_roof()).status == "passed"
    outcome = outcome_of(ex.id, tailored, seed=SEED + 1, roof=_roof())
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
    outcome = outcome_of("08-greedy-climb", broken)
    assert (outcome.status, outcome.mistake) == ("failed", "raised"), outcome.line
    assert "AttributeError" in outcome.line
    assert "line 2 (`return baseline.stack, []`)" in outcome.line
    left_in = _climb("def greedy_climb(baseline, rungs, time_side_by_side):\n    best = baseline\n"
                     "    if not rungs:\n        return best, []\n    raise NotImplementedError\n", tmp_path)
    assert outcome_of("08-greedy-climb", left_in).status == "not attempted"  # the skeleton's raise, left in


def test_bad_calls_are_clear_errors():
    with pytest.raises(ValueError, match="no exercise 'nope'"):
        check("nope", print)
    with pytest.raises(ValueError, match=r"roof=roof"):
        outcome_of("00-roofline", print)  # the lesson's roofline is missing
    with pytest.raises(ValueError, match="status"):
        exercises.expect_status("08-new-rung", "done")


def test_a_bad_time_limit_is_a_clear_error(monkeypatch, tmp_path):
    ex = EXERCISES["04-predict-time"]
    monkeypatch.setenv(TIME_LIMIT_ENV, "soon")
    with pytest.raises(ValueError, match=f"{TIME_LIMIT_ENV}='soon': give the seconds"):
        outcome_of(ex.id, _load(tmp_path / "s.py", ex.solution_path.read_text(), ex.answer))


def test_a_bug_of_the_check_itself_is_not_blamed_on_the_learner(monkeypatch, tmp_path):
    def broken_check(answer):
        raise KeyError("a bug in the course")

    ex = EXERCISES["08-greedy-climb"]
    monkeypatch.setitem(EXERCISES, ex.id, type(ex)(**{**ex.__dict__, "check": broken_check}))
    with pytest.raises(KeyError, match="a bug in the course"):
        outcome_of(ex.id, _climb(SOLUTION_08.read_text(), tmp_path))


FUNCTIONS = [i for i in IDS if call_shape(EXERCISES[i]) is not None]  # every exercise but 08-new-rung


@pytest.mark.parametrize("exercise_id", FUNCTIONS)
def test_an_answer_that_cannot_be_called_gets_one_line(exercise_id):
    """None, a number, or a function with other parameters: one line naming it, no traceback into the course
    (every function exercise crashed into course/exercises with a TypeError before)."""
    ex = EXERCISES[exercise_id]
    for answer, mistake in ((None, "not-a-function"), (300, "not-a-function"), (lambda x: x, "signature")):
        outcome = outcome_of(exercise_id, answer, **_context(ex))
        assert (outcome.status, outcome.mistake) == ("failed", mistake), outcome.line
        assert f"def {ex.answer}(" in outcome.hint and "\n" not in outcome.line
    assert len(FUNCTIONS) >= 9


def test_an_endless_answer_is_stopped_even_if_it_catches_everything(tmp_path, monkeypatch):
    """A loop that swallows every exception, the time limit's own included: stopped, and the line says where
    (the limit raises again every 50 ms while the learner's code runs)."""
    monkeypatch.setenv(TIME_LIMIT_ENV, "1")
    answer = _load(tmp_path / "stubborn.py", """
def predict_time(flops, bytes_moved, calls, peak_flops, bandwidth, overhead_s, synchronous):
    while True:
        try:
            sum(range(1000))
        except BaseException:
            pass
""", "predict_time")
    before, start = _global_state(), time.monotonic()
    outcome = outcome_of("04-predict-time", answer, seed=SEED)
    assert (outcome.status, outcome.mistake) == ("failed", "time-limit"), outcome.line
    assert "more than 1 s" in outcome.line and "at line" in outcome.line and TIME_LIMIT_ENV in outcome.hint
    assert time.monotonic() - start < 10
    assert _global_state() == before


def test_the_time_limit_puts_back_an_earlier_alarm(tmp_path):
    """pytest-timeout (and anyone else) may have an alarm set: the check's own limit leaves it as it was."""
    def earlier(signum, frame):
        raise AssertionError("the earlier alarm went off")

    previous = signal.signal(signal.SIGALRM, earlier)
    old = signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        ex = EXERCISES["04-predict-time"]
        solution = _load(tmp_path / "s.py", ex.solution_path.read_text(), ex.answer)
        outcome = outcome_of(ex.id, solution, seed=SEED)
        assert outcome.status == "passed", outcome.line
        assert signal.getsignal(signal.SIGALRM) is earlier
        assert 90 < signal.getitimer(signal.ITIMER_REAL)[0] <= 100
    finally:
        signal.setitimer(signal.ITIMER_REAL, *old)
        signal.signal(signal.SIGALRM, previous)


def test_08_new_rung_measures_on_the_lessons_device(monkeypatch):
    """On a GPU the rung is measured there (FlexAttention trains on CUDA, not on this CPU): the check picks
    the lesson's device (helpers.core.device.get_device) unless told, and hands it to the ladder. A faked A100
    here: the ladder itself is replaced by a spy, since nothing can run on a faked GPU."""
    from helpers.train import ladder

    fake_gpu(monkeypatch, "A100-80")
    seen = {}

    def climb_stacks(make_model, batches, check, *, device, rungs, **kwargs):
        seen["device"] = device
        return {"rows": [{}, {"samples_per_s": 1.0, "kept": True, "vs_below": 1.3, "check_logits": "ok"}]}

    monkeypatch.setattr(ladder, "climb_stacks", climb_stacks)
    flex = ladder.Rung("+ FlexAttention", "attn", "flex", "custom masks at fused-kernel speed")
    outcome = outcome_of("08-new-rung", flex, seed=SEED)
    assert outcome.status == "passed", outcome.line
    assert seen["device"].type == "cuda" and "on cuda" in outcome.line
    outcome_of("08-new-rung", flex, seed=SEED, device="cpu")
    assert seen["device"].type == "cpu"  # told: the device given


@pytest.mark.cuda
def test_08_new_rung_runs_flex_attention_on_a_gpu():
    """On a real GPU, the FlexAttention rung the CPU refuses is measured and passes (make gpu-check)."""
    from helpers.train import ladder

    flex = ladder.Rung("+ FlexAttention", "attn", "flex", "custom masks at fused-kernel speed")
    outcome = outcome_of("08-new-rung", flex, seed=SEED)
    assert outcome.status == "passed" and "on cuda" in outcome.line, outcome.line


def test_show_solution_prints_the_file(capsys):
    exercises.show_solution("01-flash-forward")
    out = capsys.readouterr().out
    assert "course/solutions/01_attention/flash_forward.py" in out and "def flash_forward" in out


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
    assert f"../course/solutions/{ex.solution}" in task and f'show_solution("{ex.id}")' in task


def test_05_check_leaves_what_the_learner_compiled_compiled(tmp_path):
    """Exercise 05's check counts graphs on a copy of the answer's code, never resetting Dynamo's cache
    (torch._dynamo.explain does): a cell compiled before the check is not compiled again after it. The counter
    sees a reset: after torch._dynamo.reset() the same cell compiles again."""
    compiles = []

    def counting(gm, example_inputs):
        compiles.append(gm)
        return gm.forward

    @torch.compile(backend=counting)
    def cell(x):  # a compiled cell of the lesson, before the exercise
        return torch.sin(x) * 2

    x = torch.randn(4)
    cell(x)
    assert len(compiles) == 1
    ex = EXERCISES["05-graph-break"]
    answer = _load(tmp_path / "solution.py", ex.solution_path.read_text(encoding="utf-8"), ex.answer)
    assert outcome_of(ex.id, answer, seed=SEED).status == "passed"
    cell(x)  # the cell again, after the check
    assert len(compiles) == 1, "the check reset Dynamo's cache: the cell compiled again"
    torch._dynamo.reset()  # what explain did: the count must show it
    cell(x)
    assert len(compiles) == 2


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
    assert f"course/solutions/{lesson}/" in line
