"""The machinery of the checked exercises (every lesson): an exercise, the outcome of checking an answer, the
errors a check cell raises, how an untouched skeleton is told from an attempt, and the few tools every check
uses (`Wrong`, `close`, `unpack`, `learner_line`).

A check function (one module per lesson: `helpers.exercises.lesson00` ... `lesson08`) takes the learner's
answer, runs it on small cases against the course's own reference, and returns a one-line account of what
passed, or raises `Wrong(mistake, what, hint)`: `mistake` is a short stable key (tests and CI match on it),
`what` says what came out wrong, `hint` names the likely cause and the fix. A diagnosis is made the way a
teacher makes one: the answer's output is compared with what each typical mistake would give (a missing
rescale, clipping before unscaling, a sum instead of an average, ...); the first that matches names the
mistake. Every check runs on the CPU in about a second (the torchrun one launches once), whatever the device
the lesson runs on.

Inputs are drawn per run: a check that takes a `seed` argument gets one (`draw_seed`: a fresh one each run,
or COURSE_EXERCISE_SEED / `check(..., seed=N)` to replay), draws its sizes and values from it, and the line it
shows ends with the seed, so that a failure can be replayed exactly while an answer tailored to one set of
inputs fails on the next.
"""

from __future__ import annotations

import ast
import inspect
import math
import os
import random
import textwrap
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.paths import solutions_dir

__all__ = ["Exercise", "Outcome", "Wrong", "ExerciseFailed", "ExerciseNotAttempted", "is_skeleton",
           "run_check", "strict_from_env", "learner_line", "close", "unpack", "solutions_dir", "STATUSES",
           "SEED_ENV", "draw_seed", "course_code_running", "course_module", "tensors_in"]


STATUSES = ("passed", "failed", "not attempted")
STRICT_ENV = "COURSE_EXERCISES"  # "strict": an untouched skeleton is an error too (CI's solutions pass)
SEED_ENV = "COURSE_EXERCISE_SEED"  # an integer: every check draws its inputs from it (to replay a failure)
_HELPERS_DIR = Path(__file__).resolve().parents[1]  # helpers/: the course's own code
_EXERCISES_DIR = Path(__file__).resolve().parent  # helpers/exercises/: the checks


@dataclass(frozen=True)
class Exercise:
    """One checked exercise: where it lives, the name the learner defines, its check and its solution."""

    id: str  # "01-flash-forward": lesson number, then a short name
    lesson: str  # the notebook's stem, e.g. "01_attention"
    title: str
    answer: str  # the name the skeleton cell defines (a function, or a value for `...` skeletons)
    solution: str  # the solution file, relative to helpers/solutions/: "01_attention/flash_forward.py"
    check: Callable[..., str]  # check(answer, **context) -> what passed; raises Wrong
    needs: tuple[str, ...] = ()  # the lesson's variables the check cell passes: check(..., roof=roof)
    gpu: str = ""  # what a GPU would add; "" when the exercise is the same everywhere

    @property
    def solution_path(self) -> Path:
        return solutions_dir() / self.solution


@dataclass(frozen=True)
class Outcome:
    """What checking one answer gave: a status, the one line shown, and for a wrong answer the mistake."""

    id: str
    status: str  # one of STATUSES
    line: str  # the line the check cell prints
    mistake: str = ""  # short key of the mistake found ("missing-rescale"), for a failed answer
    hint: str = ""
    seed: int | None = None  # the seed the check drew its inputs from (None: its inputs are fixed)


class Wrong(Exception):
    """Raised by a check: the answer is wrong; `mistake` is a stable key, `what` and `hint` are shown."""

    def __init__(self, mistake: str, what: str, hint: str) -> None:
        super().__init__(f"{what} Hint: {hint}")
        self.mistake, self.what, self.hint = mistake, what, hint


class _CellError(AssertionError):
    """A check cell's error: shown as its one line in Jupyter, without a traceback into the course's code."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.line)
        self.outcome = outcome

    @property
    def mistake(self) -> str:
        return self.outcome.mistake

    @property
    def hint(self) -> str:
        return self.outcome.hint

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of the traceback
        return [f"{type(self).__name__}: {self.outcome.line}"]


class ExerciseFailed(_CellError):
    """The answer is wrong: the message names the mistake and a hint. An AssertionError, so Run All stops."""


class ExerciseNotAttempted(_CellError):
    """Strict mode only: the skeleton is untouched (CI runs every notebook with the solutions, strict)."""


def strict_from_env() -> bool:
    """Whether COURSE_EXERCISES=strict asks for strict mode (an untouched skeleton is an error)."""
    value = os.environ.get(STRICT_ENV, "").strip().lower()
    if value not in ("", "strict", "lenient"):
        raise ValueError(f"{STRICT_ENV}={value!r}: use 'strict' (an untouched skeleton fails its check) or "
                         "'lenient' (the default: it says 'not attempted yet' and the lesson runs on)")
    return value == "strict"


def draw_seed() -> int:
    """The seed of one check's inputs: COURSE_EXERCISE_SEED when set (a replay), else a fresh one (every
    lesson)."""
    value = os.environ.get(SEED_ENV, "").strip()
    if value:
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{SEED_ENV}={value!r}: give an integer (the seed a check printed), or unset it "
                             "for fresh inputs on every run") from None
    return random.SystemRandom().randrange(1, 1_000_000)


# --- tools of the checks (every lesson's module) ------------------------------------------------------------

def close(a: float, b: float, rtol: float = 1e-6) -> bool:
    """Whether two numbers agree within the relative tolerance `rtol` (the checks of every lesson)."""
    return math.isclose(float(a), float(b), rel_tol=rtol, abs_tol=1e-30)


def unpack(got: Any, n: int, names: str) -> tuple:
    """The n values an answer returned, as a tuple; Wrong("return-shape") naming them if it returned else."""
    if not isinstance(got, (tuple, list)) or len(got) != n:
        kind = type(got).__name__ + (f" of {len(got)}" if isinstance(got, (tuple, list)) else "")
        raise Wrong("return-shape", f"it returned a {kind}, not the {n} values ({names})",
                    f"end with `return {names}`")
    return tuple(got)


# --- is it still the skeleton? ----------------------------------------------------------------------------

def _function_node(fn: types.FunctionType) -> ast.FunctionDef | None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):  # no source to read (built in C, or typed at a bare interpreter prompt)
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a decorated or nested definition cut badly: no static verdict
        return None
    return next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == fn.__name__), None)


def _raises_not_implemented(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.Raise) or stmt.exc is None:
        return False
    exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def is_skeleton(answer: Any) -> bool:
    """True for an untouched skeleton: `...` itself, or a function whose body raises NotImplementedError at
    its top level and never returns (what the skeleton cells hold until the learner writes the answer)."""
    if answer is Ellipsis:
        return True
    fn = inspect.unwrap(answer) if callable(answer) else None
    if not isinstance(fn, types.FunctionType):
        return False
    node = _function_node(fn)
    if node is None:
        return False
    returns = any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(node))
    return not returns and any(_raises_not_implemented(s) for s in node.body)


def _answer_codes(answer: Any) -> set[types.CodeType]:
    """The code objects of the learner's function and of every function defined inside it."""
    fn = inspect.unwrap(answer) if callable(answer) else None
    if not isinstance(fn, types.FunctionType):
        return set()
    codes, todo = set(), [fn.__code__]
    while todo:
        code = todo.pop()
        codes.add(code)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return codes


def _learner_frame(err: BaseException, answer: Any) -> traceback.FrameSummary | None:
    """The innermost frame of `err`'s traceback in the learner's own code (their function or their cell)."""
    codes = _answer_codes(answer)
    files = {c.co_filename for c in codes}
    found = None
    tb = err.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code in codes or code.co_filename in files:
            found = traceback.FrameSummary(code.co_filename, tb.tb_lineno, code.co_name,
                                           line=_source_line(code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    return found


def learner_line(answer: Any) -> str:
    """The line of the learner's code running now (the innermost frame in it), for a hint; "?" if none."""
    codes = _answer_codes(answer)
    files = {c.co_filename for c in codes}
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code in codes or frame.f_code.co_filename in files:
            return _source_line(frame.f_code.co_filename, frame.f_lineno) or "?"
        frame = frame.f_back
    return "?"


_COURSE_MODULES: dict[str, str] = {}  # code file -> "helpers.<module>", or "" outside the course's own code


def course_module(filename: str) -> str:
    """The course module ("helpers.ladder") a code file belongs to, "" for any other file or a check's own."""
    if filename not in _COURSE_MODULES:
        path = Path(filename)
        inside = _HELPERS_DIR in path.parents and _EXERCISES_DIR not in path.parents
        _COURSE_MODULES[filename] = (".".join(path.relative_to(_HELPERS_DIR.parent).with_suffix("").parts)
                                     if inside else "")
    return _COURSE_MODULES[filename]


def course_code_running() -> str | None:
    """The course function (`helpers.<module>.<function>`) the learner's code called, if one is on the call
    stack now (outside the checks themselves); None otherwise. A check calls it from inside what it hands the
    learner (a simulated step, an op seen by a dispatch mode) to tell "wrote it" from "called the
    lesson's"."""
    found = None
    frame = inspect.currentframe()
    frame = frame.f_back if frame is not None else None
    while frame is not None:
        module = course_module(frame.f_code.co_filename)
        if module:
            found = f"{module}.{frame.f_code.co_name}"  # the outermost one: what the learner called
        frame = frame.f_back
    return found


def tensors_in(obj: Any) -> list:
    """The tensors in `obj`, nested in tuples, lists and dicts: an op's arguments or outputs (lessons 01,
    06)."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in tensors_in(item)]
    return []


def _source_line(filename: str, lineno: int) -> str:
    import linecache

    return linecache.getline(filename, lineno).strip()


def _raised_here(err: BaseException, answer: Any) -> bool:
    """Whether `err` was raised by a statement of the learner's function itself (its innermost frame)."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code in _answer_codes(answer)


# --- checking one answer ---------------------------------------------------------------------------------

def _not_attempted(ex: Exercise, tip: str = "") -> Outcome:
    line = (f"{ex.id}: not attempted yet: write your answer in the cell above, run it, then run this check. "
            f"{tip}Until then the lesson runs on with its own version. Stuck? "
            f"show_solution({ex.id!r}) prints helpers/solutions/{ex.solution}")
    return Outcome(ex.id, "not attempted", line)


def _seed_note(ex: Exercise, seed: int | None, replay: bool = True) -> str:
    if seed is None:
        return ""
    if not replay:
        return f" [inputs drawn with seed {seed}]"
    return f" [inputs drawn with seed {seed}: check({ex.id!r}, ..., seed={seed}) replays them]"


def _failed(ex: Exercise, mistake: str, what: str, hint: str, seed: int | None = None) -> Outcome:
    what = what.rstrip(".") + "."
    line = f"{ex.id}: not right yet: {what} Hint: {hint.rstrip()}{_seed_note(ex, seed)}"
    return Outcome(ex.id, "failed", line, mistake, hint, seed)


class _one_thread:
    """torch on one thread while a check runs: its small ops are then not slowed by a busy machine's other
    work (a thread pool waits for its slowest thread), and its timings (08-new-rung) are steadier."""

    def __enter__(self) -> None:
        import torch

        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        import torch

        torch.set_num_threads(self.threads)


def _takes_seed(check: Callable[..., str]) -> bool:
    try:
        return "seed" in inspect.signature(check).parameters
    except (TypeError, ValueError):
        return False


def run_check(ex: Exercise, answer: Any, context: dict[str, Any], seed: int | None = None) -> Outcome:
    """Check `answer` for exercise `ex`: never raises for the learner's mistakes, returns the Outcome. A check
    that draws its inputs gets `seed` (a fresh one when None: `draw_seed`)."""
    missing = [n for n in ex.needs if n not in context]
    if missing:
        names = ", ".join(f"{n}={n}" for n in ex.needs)
        raise ValueError(f"{ex.id}: the check needs the lesson's {missing}: call check({ex.id!r}, "
                         f"{ex.answer}, {names})")
    if is_skeleton(answer):
        return _not_attempted(ex)
    kwargs = dict(context)
    if _takes_seed(ex.check):
        seed = draw_seed() if seed is None else int(seed)
        kwargs["seed"] = seed
    else:
        seed = None
    try:
        with _one_thread():
            detail = ex.check(answer, **kwargs)
    except Wrong as w:
        return _failed(ex, w.mistake, w.what, w.hint, seed)
    except NotImplementedError as err:
        if _raised_here(err, answer):  # the skeleton's own `raise`, left after some code
            return _not_attempted(ex, "(It still raises NotImplementedError: delete that line when your "
                                      "code is complete.) ")
        return _raised(ex, err, answer, seed)
    except Exception as err:  # noqa: BLE001 - the learner's code may raise anything: report where
        if _learner_frame(err, answer) is None:
            raise  # not the learner's code: a bug of the check or a wrong context, shown in full
        return _raised(ex, err, answer, seed)
    return Outcome(ex.id, "passed", f"{ex.id}: passed: {detail}{_seed_note(ex, seed, replay=False)}",
                   seed=seed)


def _raised(ex: Exercise, err: BaseException, answer: Any, seed: int | None = None) -> Outcome:
    frame = _learner_frame(err, answer)
    where = f" at line {frame.lineno} (`{frame.line}`)" if frame is not None and frame.line else ""
    message = str(err).strip().splitlines()[0] if str(err).strip() else ""
    what = f"your code raised {type(err).__name__}{where}" + (f": {message}" if message else "")
    return _failed(ex, "raised", what, "run your function on small inputs by itself, or read the traceback "
                                       "with %debug; the task above gives the shapes it receives", seed)
