"""Exercises the learner writes, checked where they write them (every lesson, 00-08).

Each exercise sits right after the concept it practises, as three cells: the task (Markdown), a skeleton the
learner fills in (cell tag `exercise-skeleton`: `raise NotImplementedError` under `# YOUR CODE HERE`), and a
one-line check (tag `exercise-check`):

    check("01-flash-forward", flash_forward)

which prints one line and
- says `passed` and what was checked;
- says `not attempted yet` while the skeleton is untouched (it still raises NotImplementedError, or is `...`):
  the lesson runs on with its own version, so nobody is stuck;
- or says what is wrong and raises `ExerciseFailed`, an AssertionError, so Run All stops at the mistake: the
  hint names a mistake (missing rescale, clipped before unscale, ...) only when the answer's output is what
  that mistake gives, and otherwise says what differs (which output, where, by how much).

Each check draws its inputs (sizes and values) per run and ends its line with the seed: `check(..., seed=N)`
or COURSE_EXERCISE_SEED=N replays them. Any answer gets one line, never a traceback into the course: a value
where a function belongs, other parameters than the skeleton's, an answer still running after the time limit
(60 s; COURSE_EXERCISE_TIME_LIMIT=120 on a slow machine), each is said so; a check leaves the random
generators as it found them.

Strict mode (`check(..., strict=True)`, `with strict_mode():`, or COURSE_EXERCISES=strict) makes an untouched
skeleton an error too (`ExerciseNotAttempted`): CI runs every lesson with the solutions filled in that way
(conftest.py). Each exercise's solution is `course/solutions/<lesson>/<name>.py`; `show_solution(id)`
prints it.
`EXERCISES` is the registry: id -> `Exercise` (lesson, the name the learner defines, the check, the solution).
The checks live one module per lesson (`lesson00` ... `lesson08`); `core` holds the machinery they share.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from course.exercises import (
    lesson00,
    lesson01,
    lesson02,
    lesson03,
    lesson04,
    lesson05,
    lesson06,
    lesson07,
    lesson08,
    lesson09,
    lesson10,
)
from course.exercises.core import (
    STATUSES,
    Exercise,
    ExerciseFailed,
    ExerciseNotAttempted,
    Outcome,
    Wrong,
    is_skeleton,
    run_check,
    strict_from_env,
)

__all__ = ["EXERCISES", "Exercise", "Outcome", "Wrong", "ExerciseFailed", "ExerciseNotAttempted", "check",
           "outcome_of", "last_outcome", "expect_status", "strict_mode", "show_solution", "solution_source",
           "exercises_of", "is_skeleton"]

_GPU_SYNC = "on a GPU each read of a device value is a wait (cudaStreamSynchronize); the check counts reads"

EXERCISES: dict[str, Exercise] = {ex.id: ex for ex in (
    Exercise("00-roofline", "00_setup", "FLOPs, bytes, arithmetic intensity and regime of three ops",
             "intensity_and_regime", "00_setup/intensity_and_regime.py", lesson00.roofline_regime,
             needs=("roof",)),
    Exercise("01-flash-forward", "01_attention", "FlashAttention's forward in tiles: (O, logsumexp)",
             "flash_forward", "01_attention/flash_forward.py", lesson01.flash_forward),
    Exercise("02-fp16-step", "02_mixed_precision", "One fp16 step: autocast, scale, unscale, clip, step",
             "fp16_step", "02_mixed_precision/fp16_step.py", lesson02.fp16_step,
             gpu="the check runs the step on the CPU (fp16 autocast exists there too); your function takes "
                 "the device, so the same code trains on a GPU"),
    Exercise("03-largest-batch", "03_memory", "The largest batch that fits, surviving out-of-memory errors",
             "largest_batch", "03_memory/largest_batch.py", lesson03.largest_batch,
             gpu="the check simulates a device's memory; on a GPU run yours on the lesson's step as well"),
    Exercise("04-predict-time", "04_where_time_goes",
             "Predict an op's regime and time, on a CPU and on a GPU",
             "predict_time", "04_where_time_goes/predict_time.py", lesson04.predict_time),
    Exercise("05-graph-break", "05_compile", "Remove the graph breaks: one graph, same loss, same gradients",
             "loss_without_breaks", "05_compile/loss_without_breaks.py", lesson05.graph_break),
    Exercise("06-hidden-syncs", "06_input_pipeline", "A training loop without hidden syncs, same losses",
             "train_loop", "06_input_pipeline/train_loop.py", lesson06.hidden_syncs, gpu=_GPU_SYNC),
    Exercise("07-bucketed-allreduce", "07_distributed", "DDP's core: bucketed all-reduce, overlapped with "
             "backward", "attach_grad_allreduce", "07_distributed/attach_grad_allreduce.py",
             lesson07.bucketed_allreduce),
    Exercise("08-greedy-climb", "08_bert_finetuning", "The greedy ladder: each rung on the best stack so "
                                                      "far, "
             "kept only when it pays beyond the noise", "greedy_climb", "08_bert_finetuning/greedy_climb.py",
             lesson08.greedy_climb),
    Exercise("08-new-rung", "08_bert_finetuning", "A new rung for the ladder, measured", "NEW_RUNG",
             "08_bert_finetuning/new_rung.py", lesson08.new_rung,
             gpu="the check measures it on a tiny BERT on the lesson's device (a rung only a GPU runs is "
                 "measured on the GPU); then climb the lesson's ladder with it"),
    Exercise("09-largest-batch", "09_plan_your_run", "The largest batch that fits, from two dry runs",
             "largest_batch_from", "09_plan_your_run/largest_batch_from.py", lesson09.largest_batch_from),
    Exercise("10-model-states", "10_make_it_fit", "Weights, gradients and AdamW's state per GPU: DDP, "
             "ZeRO-1, FSDP2", "model_states_per_gpu", "10_make_it_fit/model_states_per_gpu.py",
             lesson10.model_states_per_gpu),
    Exercise("10-pick-levers", "10_make_it_fit", "The cheapest levers that fit a step in a GPU's memory "
             "budget", "pick_levers", "10_make_it_fit/pick_levers.py", lesson10.pick_levers),
)}

_LAST: dict[str, Outcome] = {}  # exercise id -> the outcome of its latest check in this process
_STRICT: list[bool] = []  # stack of strict_mode() settings


def _exercise(exercise_id: str) -> Exercise:
    if exercise_id not in EXERCISES:
        raise ValueError(f"no exercise {exercise_id!r}; the exercises are {sorted(EXERCISES)}")
    return EXERCISES[exercise_id]


def exercises_of(lesson: str) -> list[Exercise]:
    """The exercises of one lesson, by its notebook's stem ("01_attention") or number ("01")."""
    return [ex for ex in EXERCISES.values() if ex.lesson == lesson or ex.lesson.split("_")[0] == lesson]


def outcome_of(exercise_id: str, answer: Any, *, seed: int | None = None, **context: Any) -> Outcome:
    """Check `answer` and return the Outcome without printing or raising (tests; every lesson). `seed`: the
    inputs' seed a check printed, to replay it (default: fresh inputs, or COURSE_EXERCISE_SEED)."""
    return run_check(_exercise(exercise_id), answer, context, seed)


def check(exercise_id: str, answer: Any, *, strict: bool | None = None, seed: int | None = None,
          **context: Any) -> None:
    """Check the learner's answer in place and show one line: passed, not attempted yet (printed), or what is
    wrong with a hint (the message of ExerciseFailed, raised so that Run All stops there); in strict mode an
    untouched skeleton raises ExerciseNotAttempted. `seed` replays the inputs of an earlier check (its line
    names the seed); `context`: the lesson's values a check needs (every lesson)."""
    outcome = outcome_of(exercise_id, answer, seed=seed, **context)
    _LAST[exercise_id] = outcome
    if outcome.status == "failed":  # the error shows the line (once: it is not printed as well)
        raise ExerciseFailed(outcome)
    strict = strict if strict is not None else (_STRICT[-1] if _STRICT else strict_from_env())
    if outcome.status == "not attempted" and strict:
        raise ExerciseNotAttempted(outcome)
    print(outcome.line)


def last_outcome(exercise_id: str) -> Outcome | None:
    """The outcome of the latest `check` of this exercise in this process, or None (CI; every lesson)."""
    _exercise(exercise_id)
    return _LAST.get(exercise_id)


def expect_status(exercise_id: str, status: str) -> None:
    """Assert that the latest check of this exercise gave `status` (CI: the committed skeleton, in context,
    must report "not attempted") (every lesson)."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    got = last_outcome(exercise_id)
    assert got is not None, f"{exercise_id}: its check cell has not run in this kernel"
    assert got.status == status, f"{exercise_id}: expected {status!r}, the check said: {got.line}"


@contextlib.contextmanager
def strict_mode(enabled: bool = True) -> Iterator[None]:
    """Within the block, an untouched skeleton fails its check (or, with enabled=False, never does)."""
    _STRICT.append(enabled)
    try:
        yield
    finally:
        _STRICT.pop()


def solution_source(exercise_id: str) -> str:
    """The source of the exercise's solution, from course/solutions/<lesson>/ (every lesson)."""
    path = _exercise(exercise_id).solution_path
    if not path.is_file():
        raise FileNotFoundError(f"no solution file at {path}: course/solutions/ ships with the course; "
                                "reinstall it (the set-up cell at the top of the lesson)")
    return path.read_text(encoding="utf-8")


def show_solution(exercise_id: str) -> None:
    """Print the exercise's solution (for a learner who is stuck; every lesson)."""
    ex = _exercise(exercise_id)
    print(f"# course/solutions/{ex.solution}: paste it over your cell, or compare it with yours\n")
    print(solution_source(exercise_id))
