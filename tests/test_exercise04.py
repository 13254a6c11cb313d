"""Exercise 04-predict-time (course.exercises.lesson04): the solution and every right variant pass; each
wrong answer a learner would write, written out whole as a learner would, fails with the hint that names its
mistake (or, where no mistake matches, one that says what differs); the cases change from run to run."""

from __future__ import annotations

import textwrap
import types
from pathlib import Path

import pytest
from exercise_answers import BATCH_39, BATCH_51  # tests/exercise_answers.py

from course.exercises import EXERCISES, outcome_of
from course.exercises.lesson04 import draw_cases

EX = EXERCISES["04-predict-time"]
SEEDS = (0, 1, 2, 12345)  # fixed draws, so that a failure repeats; the check draws a new seed per run
SIGNATURE = "def predict_time(flops, bytes_moved, calls, peak_flops, bandwidth, overhead_s, synchronous):\n"

# Right answers: another way to write the same rule must pass.
RIGHT = {
    "solution": EX.solution_path.read_text(encoding="utf-8"),
    "if-chain": SIGNATURE + textwrap.indent(textwrap.dedent("""
        compute = flops / peak_flops
        memory = bytes_moved / bandwidth
        over = calls * overhead_s
        if compute >= memory and compute >= over:
            regime = "compute"
        elif memory >= over:
            regime = "memory"
        else:
            regime = "overhead"
        if synchronous:
            return regime, over + max(compute, memory)
        return regime, max(compute, memory, over)
        """), "    "),
    "sorted-list": SIGNATURE + textwrap.indent(textwrap.dedent("""
        times = [(flops / peak_flops, "compute"), (bytes_moved / bandwidth, "memory"),
                 (calls * overhead_s, "overhead")]
        slowest = sorted(times)[-1]
        work = max(times[0][0], times[1][0])
        return [slowest[1], work + times[2][0] if synchronous else slowest[0]]
        """), "    "),
    "numpy": "import numpy as np\n\n\n" + SIGNATURE + textwrap.indent(textwrap.dedent("""
        t = np.array([flops / peak_flops, bytes_moved / bandwidth, calls * overhead_s])
        regime = ("compute", "memory", "overhead")[int(np.argmax(t))]
        seconds = t[2] + t[:2].max() if synchronous else t.max()
        return regime, seconds
        """), "    "),
    "not-asynchronous-first": SIGNATURE + textwrap.indent(textwrap.dedent("""
        t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": calls * overhead_s}
        if not synchronous:
            return max(t, key=t.get), max(t.values())
        return max(t.items(), key=lambda kv: kv[1])[0], t["overhead"] + max(t["compute"], t["memory"])
        """), "    "),
}

# Wrong answers a learner would write: (the mistake the check must name, the whole answer).
WRONG = {
    "course-function": "from helpers.measure.regimes import classify_regime, roof_times\n\n\n" + SIGNATURE
    + textwrap.indent(textwrap.dedent("""
        kw = dict(peak_flops=peak_flops, bandwidth=bandwidth, overhead_s=overhead_s)
        t = roof_times(flops, bytes_moved, calls, **kw)
        work = max(t["compute"], t["memory"])
        seconds = t["overhead"] + work if synchronous else max(t.values())
        return classify_regime(flops, bytes_moved, calls, **kw), seconds
        """), "    "),
    "sum": SIGNATURE + textwrap.indent(textwrap.dedent("""
        t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": calls * overhead_s}
        return max(t, key=t.get), sum(t.values())
        """), "    "),
    "max-on-synchronous": SIGNATURE + textwrap.indent(textwrap.dedent("""
        t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": calls * overhead_s}
        regime = max(t, key=t.get)
        return regime, t[regime]  # the flag ignored: the GPU's model everywhere
        """), "    "),
    "additive-on-asynchronous": SIGNATURE + textwrap.indent(textwrap.dedent("""
        compute, memory, over = flops / peak_flops, bytes_moved / bandwidth, calls * overhead_s
        regime = "compute" if compute >= max(memory, over) else "memory" if memory >= over else "overhead"
        return regime, over + max(compute, memory)  # the CPU's model everywhere
        """), "    "),
    "one-call": SIGNATURE + textwrap.indent(textwrap.dedent("""
        t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": calls * overhead_s}
        work = max(t["compute"], t["memory"])
        return max(t, key=t.get), (overhead_s + work if synchronous else max(work, overhead_s))
        """), "    "),
    "no-overhead": SIGNATURE + textwrap.indent(textwrap.dedent("""
        t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": calls * overhead_s}
        return max(t, key=t.get), max(t["compute"], t["memory"])
        """), "    "),
    "units": SIGNATURE + textwrap.indent(textwrap.dedent("""
        compute, memory = flops / bandwidth, bytes_moved / peak_flops  # the two roofs swapped
        over = calls * overhead_s
        t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": over}
        return max(t, key=t.get), (over + max(compute, memory) if synchronous else max(compute, memory, over))
        """), "    "),
    "milliseconds": SIGNATURE + textwrap.indent(textwrap.dedent("""
        t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": calls * overhead_s}
        work = max(t["compute"], t["memory"])
        s = t["overhead"] + work if synchronous else max(work, t["overhead"])
        return max(t, key=t.get), s * 1000  # in ms, as the lesson prints them
        """), "    "),
    "ridge-only": SIGNATURE + textwrap.indent(textwrap.dedent("""
        regime = "compute" if flops / bytes_moved > peak_flops / bandwidth else "memory"
        compute, memory, over = flops / peak_flops, bytes_moved / bandwidth, calls * overhead_s
        return regime, (over + max(compute, memory) if synchronous else max(compute, memory, over))
        """), "    "),
    "smallest": SIGNATURE + textwrap.indent(textwrap.dedent("""
        t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": calls * overhead_s}
        work = max(t["compute"], t["memory"])
        return min(t, key=t.get), (t["overhead"] + work if synchronous else max(work, t["overhead"]))
        """), "    "),
    "order": SIGNATURE + textwrap.indent(textwrap.dedent("""
        t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": calls * overhead_s}
        work = max(t["compute"], t["memory"])
        return (t["overhead"] + work if synchronous else max(work, t["overhead"])), max(t, key=t.get)
        """), "    "),
    "regime-name": SIGNATURE + textwrap.indent(textwrap.dedent("""
        t = {"compute-bound": flops / peak_flops, "memory-bound": bytes_moved / bandwidth,
             "overhead-bound": calls * overhead_s}
        work = max(t["compute-bound"], t["memory-bound"])
        return max(t, key=t.get), (t["overhead-bound"] + work if synchronous else max(t.values()))
        """), "    "),
    "return-shape": SIGNATURE + textwrap.indent(textwrap.dedent("""
        return calls * overhead_s + max(flops / peak_flops, bytes_moved / bandwidth)
        """), "    "),
    # a mistake no hypothesis matches: the hint must say what differs, and name no other mistake
    "seconds": SIGNATURE + textwrap.indent(textwrap.dedent("""
        t = {"compute": flops / peak_flops, "memory": bytes_moved / bandwidth, "overhead": calls * overhead_s}
        return max(t, key=t.get), 2 * t["compute"] + t["memory"]
        """), "    "),
}
WRONG_HINTS = {"seconds": "expected"}  # the generic mistake: the line says what was expected
WRONG.update(BATCH_39[EX.id])  # the second batch (tests/exercise_answers.py), keyed "mistake#variant"
WRONG.update(BATCH_51[EX.id])  # the third (contract breaches, rare regions), likewise


def load(tmp_path: Path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    ns: dict = {"__name__": name}
    exec(compile(source, str(path), "exec"), ns)
    return ns["predict_time"]


@pytest.mark.parametrize("name", RIGHT)
def test_right_answers_pass(name, tmp_path):
    answer = load(tmp_path, name, RIGHT[name])
    for seed in SEEDS:
        outcome = outcome_of(EX.id, answer, seed=seed)
        assert outcome.status == "passed", (seed, outcome.line)


@pytest.mark.parametrize("mistake", WRONG)
def test_wrong_answers_fail_with_their_hint(mistake, tmp_path):
    answer = load(tmp_path, mistake, WRONG[mistake])
    for seed in SEEDS:
        outcome = outcome_of(EX.id, answer, seed=seed)
        assert (outcome.status, outcome.mistake) == ("failed", mistake.split("#")[0]), (seed, outcome.line)
        assert outcome.hint and "\n" not in outcome.line
    if mistake == "seconds":  # what differs, by how much; no other mistake's words
        assert "expected" in outcome.line and "x)" in outcome.line
        assert not any(w in outcome.line for w in ("milliseconds", "ONE call", "swapped", "other way"))


def test_cases_vary_per_run_and_repeat_with_a_seed(monkeypatch):
    monkeypatch.delenv("COURSE_EXERCISE_SEED", raising=False)  # a replay seed would fix every draw
    assert draw_cases(7) == draw_cases(7)
    assert draw_cases(7) != draw_cases(8)
    outcome = outcome_of(EX.id, load_solution())
    assert outcome.status == "passed" and "seed" in outcome.line
    seeds = {outcome_of(EX.id, load_solution()).line for _ in range(3)}
    assert len(seeds) > 1  # a new draw each run: an answer tailored to one draw fails the next


def test_every_draw_holds_each_regime_and_both_models():
    for seed in range(50):
        cases = draw_cases(seed)
        assert {c.regime for c in cases} == {"compute", "memory", "overhead"}
        assert {c.synchronous for c in cases} == {True, False}
        # the two models differ by 20 % or more on some case: the additive model is tested, not tolerated
        assert any(c.synchronous and c.seconds > 1.2 * max(c.terms.values()) for c in cases)
        for c in cases:  # each regime clear: its time at least 1.6x the next
            first, second = sorted(c.terms.values())[-1:-3:-1]
            assert first >= 1.6 * second


def test_the_line_says_which_model_fits_the_lessons_device():
    line = outcome_of(EX.id, load_solution(), device="cpu").line
    assert "synchronous" in line and "adds to the work" in line


def test_a_special_cased_answer_fails():
    """An answer that returns the right values for one run's inputs only (a table of every input the check
    asked with seed 0, the search's draws too) fails another run."""
    solution = load_solution()
    # the spy's table sits inside an object, where the contract's look for state kept between calls does not
    # reach: the spy is the test's instrument, not an answer
    seen = types.SimpleNamespace(table={})

    def spy(*args):
        seen.table[args] = solution(*args)
        return seen.table[args]

    assert outcome_of(EX.id, spy, seed=0).status == "passed"
    table = dict(seen.table)

    def tailored(*args):
        return table.get(args, ("compute", 0.0))

    assert outcome_of(EX.id, tailored, seed=0).status == "passed"  # the inputs it was tailored to
    assert outcome_of(EX.id, tailored, seed=1).status == "failed"


def load_solution():
    ns: dict = {}
    exec(compile(EX.solution_path.read_text(encoding="utf-8"), str(EX.solution_path), "exec"), ns)
    return ns["predict_time"]
