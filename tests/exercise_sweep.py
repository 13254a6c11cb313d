"""Sweep the exercise checks over many seeds: every wrong answer of tests/exercise_answers.py must fail its
check on every seed, with the mistake key it is filed under, and every right answer (the solution, the right
variants) must pass on every seed. The suite runs each answer on one seed a session; this is the slow run
whose result docs/exercises.md records ("The sweep"). It lives beside the tests: it runs their answers.

    python tests/exercise_sweep.py --seeds 100 --batch 51            # issue 51's wrong answers
    python tests/exercise_sweep.py --seeds 10 --right                 # the right answers
    python tests/exercise_sweep.py --seeds 20 --batch 51 --ids 07-bucketed-allreduce

Lesson 07's answers run in one torchrun launch for all the seeds. Seeds are 0 .. N-1. Each answer is loaded
once and checked on every seed in turn, as a learner's kernel would run the check again: state an answer
keeps between runs is part of what the checks must catch. Prints one line per exercise (answers, caught on
every seed, named with their key on every seed) and one per answer that passed or got another key on some
seed, with the seeds and the first line.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(1, str(ROOT))  # the course (tests/, this script's folder, is sys.path[0])

import exercise_answers as answers  # noqa: E402 - tests/exercise_answers.py

from course.exercises import EXERCISES, lesson07, outcome_of  # noqa: E402
from course.exercises.core import TIME_LIMIT_ENV  # noqa: E402


def _wrong(batch: str) -> dict[str, dict[str, str]]:
    """The wrong answers of one batch ("1": the first, "39", "51") or of all ("all"), by exercise. The first
    batch is WRONG less the later batches joined into it."""
    later = {"39": answers.BATCH_39, "51": answers.BATCH_51}
    if batch in later:
        return later[batch]
    first = {i: {k: v for k, v in w.items() if not any(k in b.get(i, {}) for b in later.values())}
             for i, w in answers.WRONG.items()}
    if batch == "1":
        return first
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for b in (first, *later.values()):
        for i, w in b.items():
            out[i].update(w)
    return out


def _context(exercise_id: str) -> dict:
    if exercise_id == "08-new-rung":
        return {"device": "cpu"}
    if "roof" in EXERCISES[exercise_id].needs:
        from helpers.measure.roofline import Roofline  # the suite's made-up CPU roofline (test_exercises.py)

        return {"roof": Roofline("a test CPU", {"fp32": 5e10, "bf16": 2e10}, 1e10, 512, 64 * 2 ** 20)}
    return {}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=100, help="seeds 0 .. N-1")
    p.add_argument("--batch", default="51", choices=("1", "39", "51", "all"), help="which wrong answers")
    p.add_argument("--right", action="store_true", help="the solutions and right variants instead")
    p.add_argument("--ids", default="", help="comma-separated exercise ids (default: all)")
    args = p.parse_args()
    os.environ.setdefault(TIME_LIMIT_ENV, "10")  # an endless answer: stopped after 10 s, not 60
    seeds = list(range(args.seeds))
    if args.right:
        table = {i: {"solution": EXERCISES[i].solution_path.read_text(encoding="utf-8"),
                     **answers.RIGHT.get(i, {})} for i in EXERCISES if i in answers.RIGHT}
        table.update({i: {"solution": EXERCISES[i].solution_path.read_text(encoding="utf-8")}
                      for i in EXERCISES if i not in table})
    else:
        table = _wrong(args.batch)
    ids = [i for i in sorted(table) if not args.ids or i in args.ids.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="exercise-sweep-"))
    started = time.time()
    for exercise_id in ids:
        ex, t0 = EXERCISES[exercise_id], time.time()
        loaded = {}
        for n, (key, source) in enumerate(table[exercise_id].items()):
            path = tmp / f"{exercise_id}-{n}.py"
            path.write_text(source, encoding="utf-8")  # from a file: the checks read an answer's source
            loaded[key] = runpy.run_path(str(path))[ex.answer]
        if exercise_id == "07-bucketed-allreduce":
            lesson07.prefetch_allreduce(loaded.values(), seeds)  # one launch for every answer and seed
        caught = named = 0
        for key, answer in loaded.items():
            passed, other, first = [], [], ""
            for seed in seeds:
                outcome = outcome_of(exercise_id, answer, seed=seed, **_context(exercise_id))
                if args.right:
                    if outcome.status != "passed":
                        passed.append(seed)
                        first = first or outcome.line
                elif outcome.status != "failed":
                    passed.append(seed)
                    first = first or outcome.line
                elif outcome.mistake != key.split("#")[0]:
                    other.append((seed, outcome.mistake))
                    first = first or outcome.line
            caught += not passed
            named += not passed and not other
            if passed or other:
                what = "failed" if args.right else "passed"
                print(f"  {exercise_id} {key}: {what} on {len(passed)} seed(s) {passed[:10]}; another key on "
                      f"{len(other)} {other[:5]}: {first[:300]}", flush=True)
        word = "passed on every seed" if args.right else "failed on every seed"
        print(f"{exercise_id}: {len(loaded)} answers, {caught} {word}"
              + ("" if args.right else f", {named} with their key on every seed")
              + f" ({len(seeds)} seeds, {time.time() - t0:.0f} s)", flush=True)
    print(f"done in {time.time() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
