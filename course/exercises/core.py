"""The machinery of the checked exercises (every lesson): an exercise, the outcome of checking an answer, the
errors a check cell raises, how an untouched skeleton is told from an attempt, and the few tools every check
uses (`Wrong`, `close`, `unpack`, `learner_line`).

A check function (one module per lesson: `course.exercises.lesson00` ... `lesson08`) takes the learner's
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

Every answer gets a line, never a traceback into the course: a value where a function belongs, or a function
whose parameters cannot take what the check passes (read from the solution's `def`), is named before the check
runs; an answer still running after the time limit (60 s; `time_limit(None)` on a check that runs no code of
the learner's; COURSE_EXERCISE_TIME_LIMIT for a slow machine) is stopped inside its own code and the line says
where; a check can stop an answer that would grow without end by raising `Halt` from what it hands the learner
(a simulated step, a recorded op). A check leaves the process as it found it: torch's, Python's and numpy's
random generators (checks seed their own draws) and torch's thread count.
"""

from __future__ import annotations

import ast
import functools
import inspect
import math
import os
import random
import signal
import sys
import textwrap
import threading
import time
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course.paths import solutions_dir

__all__ = ["Exercise", "Outcome", "Wrong", "Halt", "ExerciseFailed", "ExerciseNotAttempted", "is_skeleton",
           "run_check", "strict_from_env", "learner_line", "close", "unpack", "solutions_dir", "STATUSES",
           "SEED_ENV", "TIME_LIMIT_ENV", "DEFAULT_TIME_LIMIT_S", "draw_seed", "time_limit", "time_limit_s",
           "course_code_running", "course_module", "tensors_in", "call_shape"]


STATUSES = ("passed", "failed", "not attempted")
STRICT_ENV = "COURSE_EXERCISES"  # "strict": an untouched skeleton is an error too (CI's solutions pass)
SEED_ENV = "COURSE_EXERCISE_SEED"  # an integer: every check draws its inputs from it (to replay a failure)
TIME_LIMIT_ENV = "COURSE_EXERCISE_TIME_LIMIT"  # seconds: a longer (or shorter) limit for every timed check
DEFAULT_TIME_LIMIT_S = 60.0  # a right answer takes about a second; a busy 2-core machine, a few
_ROOT = Path(__file__).resolve().parents[2]  # where helpers/ and course/ sit
_OWN_DIRS = (_ROOT / "helpers", _ROOT / "course")  # the course's own code: the library and the course
_EXERCISES_DIR = Path(__file__).resolve().parent  # course/exercises/: the checks


@dataclass(frozen=True)
class Exercise:
    """One checked exercise: where it lives, the name the learner defines, its check and its solution."""

    id: str  # "01-flash-forward": lesson number, then a short name
    lesson: str  # the notebook's stem, e.g. "01_attention"
    title: str
    answer: str  # the name the skeleton cell defines (a function, or a value for `...` skeletons)
    solution: str  # the solution file, relative to course/solutions/: "01_attention/flash_forward.py"
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


class Halt(BaseException):
    """Raised by a check from inside what it hands the learner (a simulated step, a recorded op) to stop an
    answer that would run or grow without end; reported like `Wrong`. A BaseException, so that the learner's
    `except Exception:` does not swallow it."""

    def __init__(self, mistake: str, what: str, hint: str) -> None:
        super().__init__(f"{what} Hint: {hint}")
        self.mistake, self.what, self.hint = mistake, what, hint


class _TimeUp(BaseException):
    """Raised inside the learner's code when a check's time limit has passed."""


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


def time_limit(seconds: float | None) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Decorator of a check function: its own time limit in seconds (None: no limit, for a check that runs no
    code of the learner's, or one whose answer runs in other processes with a timeout of their own)."""
    def mark(check: Callable[..., str]) -> Callable[..., str]:
        check.time_limit_s = seconds  # type: ignore[attr-defined]
        return check

    return mark


def time_limit_s(ex: Exercise) -> float | None:
    """The seconds a check of `ex` may run: COURSE_EXERCISE_TIME_LIMIT when set, else the check's own limit
    (`time_limit`), else DEFAULT_TIME_LIMIT_S; None where the check has no limit (every lesson)."""
    own = getattr(ex.check, "time_limit_s", DEFAULT_TIME_LIMIT_S)
    if own is None:
        return None
    value = os.environ.get(TIME_LIMIT_ENV, "").strip()
    if not value:
        return float(own)
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"{TIME_LIMIT_ENV}={value!r}: give the seconds a check may run (e.g. 120 on a slow "
                         "machine), or unset it")
    return seconds


def call_shape(ex: Exercise) -> tuple[list[str], list[str], str] | None:
    """How the check calls the learner's function, read from the solution's `def` (the skeleton's
    parameters): (the names passed by position, the names passed by keyword: those with a default, the
    parameter list as written); None when the answer is a value, not a function (every lesson)."""
    try:
        tree = ast.parse(ex.solution_path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == ex.answer), None)
    if fn is None:
        return None
    args = fn.args.args
    first_default = len(args) - len(fn.args.defaults)
    return ([a.arg for a in args[:first_default]], [a.arg for a in args[first_default:]],
            ast.unparse(fn.args))


def _describe(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, (bool, int, float, complex)):
        return f"the number {value!r}"
    shown = " ".join(repr(value).split())  # one line
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    size = f" of {len(value)}" if isinstance(value, (tuple, list, dict)) else ""
    return f"a {type(value).__name__}{size} ({shown})"


def _malformed(ex: Exercise, answer: Any) -> Wrong | None:
    """Wrong for an answer the check could not even call: not a function, or a function whose parameters do
    not take what the check passes; None otherwise (and for exercises whose answer is a value)."""
    shape = call_shape(ex)
    if shape is None:
        return None
    positional, keyword, params = shape
    if not callable(answer):
        return Wrong("not-a-function", f"`{ex.answer}` is {_describe(answer)}, not a function",
                     f"define it with `def {ex.answer}({params}):` and run that cell again; a later "
                     f"`{ex.answer} = {ex.answer}(...)` keeps the result under the function's name")
    try:
        signature = inspect.signature(answer)
    except (TypeError, ValueError):  # a builtin without a signature: the call itself will tell
        return None
    try:
        signature.bind(*positional, **{name: None for name in keyword})
    except TypeError as err:
        call = ", ".join([*positional, *(f"{name}=..." for name in keyword)])
        return Wrong("signature", f"`{ex.answer}{signature}` cannot take what the check passes, "
                     f"{ex.answer}({call}): {err}", f"keep the skeleton's parameters: "
                     f"`def {ex.answer}({params}):` (use the ones you need, leave the others)")
    return None


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


# code file -> its module ("helpers.train.ladder"), or "" outside the course's own code
_COURSE_MODULES: dict[str, str] = {}


def course_module(filename: str) -> str:
    """The course module ("helpers.train.ladder") a code file belongs to, "" for any other file or a check's
    own."""
    if filename not in _COURSE_MODULES:
        path = Path(filename)
        inside = any(d in path.parents for d in _OWN_DIRS) and _EXERCISES_DIR not in path.parents
        _COURSE_MODULES[filename] = (".".join(path.relative_to(_ROOT).with_suffix("").parts)
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
            f"show_solution({ex.id!r}) prints course/solutions/{ex.solution}")
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


class _Isolated:
    """What a check leaves as it found it: torch's random generators (CPU, and CUDA where it is in use),
    Python's and numpy's, torch's thread count and its global switches (grad mode, autocast, the default
    dtype, ...: `contract.switches`, which an answer may have left set). The check runs on one thread: its
    small ops are then not slowed by a busy machine's other work (a thread pool waits for its slowest
    thread), and its timings (08-new-rung) are steadier."""

    def __enter__(self) -> None:
        import torch

        from course.exercises.contract import switches

        self.switches = switches()  # grad mode, autocast, default dtype, ...: an answer may leave one set
        self.threads = torch.get_num_threads()
        self.python_rng = random.getstate()
        numpy = sys.modules.get("numpy")
        self.numpy_rng = numpy.random.get_state() if numpy is not None else None
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.fork = torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else [])
        self.fork.__enter__()
        torch.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        import torch

        from course.exercises.contract import restore_switches

        restore_switches(self.switches)
        torch.set_num_threads(self.threads)
        self.fork.__exit__(None, None, None)
        random.setstate(self.python_rng)
        if self.numpy_rng is not None:
            sys.modules["numpy"].random.set_state(self.numpy_rng)


class _Deadline:
    """Stop the learner's code once `seconds` have passed, inside that code only (never inside the course's
    code or torch's, whose clean-up must run): SIGALRM, every 50 ms from the deadline on, raises _TimeUp when
    it lands in the learner's own code, and otherwise sets a trace on the learner's frames under way, so that
    their next line raises it. The main thread of a POSIX system only (a notebook's cell runs there);
    elsewhere no limit. An earlier timer (pytest-timeout's) and trace function (a debugger's) are put
    back."""

    def __init__(self, seconds: float | None, answer: Any) -> None:
        self.seconds, self.fired, self.armed, self.tracing = seconds, False, False, False
        self.where = ""  # the learner's line the first stop hit
        self.codes = _answer_codes(answer)
        self.files = {c.co_filename for c in self.codes}

    def _learners(self, frame: types.FrameType) -> bool:
        """The learner's code: the answer's, its file's (or cell's), or any notebook cell's (a helper of
        theirs defined in another cell)."""
        name = frame.f_code.co_filename
        return (frame.f_code in self.codes or name in self.files or "ipykernel_" in name
                or name.startswith("<ipython-input"))

    def _stop(self, frame: types.FrameType) -> None:
        if not self.fired:
            line = _source_line(frame.f_code.co_filename, frame.f_lineno)
            self.where = f" at line {frame.f_lineno} (`{line}`)" if line else ""
        self.fired = True
        raise _TimeUp()

    def _line(self, frame: types.FrameType, event: str, arg: Any) -> Any:  # a learner frame's trace
        if event == "line" and self.armed:
            self._stop(frame)
        return self._line

    def _call(self, frame: types.FrameType, event: str, arg: Any) -> Any:  # the global trace: new frames
        return self._line if self._learners(frame) else None

    def _alarm(self, signum: int, frame: types.FrameType | None) -> None:
        if frame is not None and self._learners(frame):
            self._stop(frame)
        while frame is not None:  # the learner's frames under way raise at their next line
            if self._learners(frame):
                frame.f_trace, frame.f_trace_lines = self._line, True
            frame = frame.f_back
        if not self.tracing:
            self.previous_trace, self.tracing = sys.gettrace(), True
            sys.settrace(self._call)

    def __enter__(self) -> _Deadline:
        if (self.seconds is None or not self.codes or not hasattr(signal, "setitimer")
                or threading.current_thread() is not threading.main_thread()):
            return self
        self.start = time.monotonic()
        self.previous = signal.signal(signal.SIGALRM, self._alarm)
        self.previous_timer = signal.setitimer(signal.ITIMER_REAL, self.seconds, 0.05)
        self.armed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.armed:
            return
        self.armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)
        if self.tracing:
            sys.settrace(self.previous_trace)
        delay, interval = self.previous_timer
        if delay > 0:
            left = delay - (time.monotonic() - self.start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), interval)


class _Tracked:
    """The learner's function, as the check calls it: what it last returned is kept, so that an error of the
    check's own code on that value becomes a line naming it instead of a traceback."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn, self.returned, self.last = fn, False, None
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        value = self.fn(*args, **kwargs)
        self.returned, self.last = True, value
        return value

    def __get__(self, obj: Any, kind: Any = None) -> Any:  # as a method too, like the function it wraps
        return self if obj is None else functools.partial(self, obj)


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
    malformed = _malformed(ex, answer)
    if malformed is not None:
        return _failed(ex, malformed.mistake, malformed.what, malformed.hint)
    kwargs = dict(context)
    if _takes_seed(ex.check):
        seed = draw_seed() if seed is None else int(seed)
        kwargs["seed"] = seed
    else:
        seed = None
    limit = time_limit_s(ex)
    deadline = _Deadline(limit, answer)
    tracked = _Tracked(answer) if isinstance(answer, types.FunctionType) else None
    try:
        with _Isolated(), deadline:
            detail = ex.check(tracked or answer, **kwargs)
        if deadline.fired:  # stopped, and the learner's code caught it and went on
            raise _TimeUp()
    except _TimeUp:
        return _failed(ex, "time-limit", f"it ran for more than {limit:g} s and was stopped{deadline.where}",
                       "a right answer takes about a second on these small inputs: look for a loop that "
                       "never ends (an index or a bound that stops moving) or work that grows fast with the "
                       f"sizes; run it on small inputs yourself (a slow machine? {TIME_LIMIT_ENV}=120 "
                       "gives every check longer)", seed)
    except (Wrong, Halt) as w:
        return _failed(ex, w.mistake, w.what, w.hint, seed)
    except NotImplementedError as err:
        if _raised_here(err, answer):  # the skeleton's own `raise`, left after some code
            return _not_attempted(ex, "(It still raises NotImplementedError: delete that line when your "
                                      "code is complete.) ")
        return _raised(ex, err, answer, seed)
    except Exception as err:  # noqa: BLE001 - the learner's code may raise anything: report where
        if _learner_frame(err, answer) is not None:
            return _raised(ex, err, answer, seed)
        if tracked is not None and tracked.returned:  # the check stumbled on what the answer returned
            return _unusable(ex, err, tracked.last, seed)
        raise  # the answer never ran: a bug of the check or a wrong context, shown in full
    return Outcome(ex.id, "passed", f"{ex.id}: passed: {detail}{_seed_note(ex, seed, replay=False)}",
                   seed=seed)


def _unusable(ex: Exercise, err: BaseException, returned: Any, seed: int | None) -> Outcome:
    from course.exercises.contract import describe

    message = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return _failed(ex, "unusable-result", f"the check could not go on with what your function returned, "
                   f"{describe(returned)} ({type(err).__name__}: {message[:160]})", "compare what it returns "
                   "with the task: the kind of value, its dtype and shape (the skeleton's docstring names "
                   "them); show_solution() prints the course's", seed)


def _raised(ex: Exercise, err: BaseException, answer: Any, seed: int | None = None) -> Outcome:
    from course.exercises.contract import CASE_NOTE

    frame = _learner_frame(err, answer)
    where = f" at line {frame.lineno} (`{frame.line}`)" if frame is not None and frame.line else ""
    message = str(err).strip().splitlines()[0] if str(err).strip() else ""
    case = getattr(err, "course_case", "") or CASE_NOTE.get()
    what = f"your code raised {type(err).__name__}{where}" + (f": {message}" if message else "") + (
        f" (on {case})" if case else "")
    return _failed(ex, "raised", what, "run your function on small inputs by itself, or read the traceback "
                                       "with %debug; the task above gives the shapes it receives", seed)
