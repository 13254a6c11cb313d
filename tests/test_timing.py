import time

import pytest

from helpers.core.tables import Table
from helpers.core.timing import Timing, benchmark, compare, time_once


def test_benchmark_measures_what_it_runs_and_warms_up():
    calls = []

    def work():
        calls.append(1)
        time.sleep(0.01)

    t = benchmark(work, name="sleep", warmup=3, min_run_time=0.1)
    assert isinstance(t, Timing) and t.name == "sleep"
    assert 0.009 < t.median_s < 0.05  # a 10 ms sleep, timed; generous upper bound for a busy machine
    # warm-up calls happen on top of the timed ones
    assert len(calls) >= 3 + t.runs * t.calls_per_run
    assert t.iqr_s >= 0 and len(t.times_s) == t.runs


def test_benchmark_rejects_bad_input():
    with pytest.raises(ValueError, match="callable"):
        benchmark(42)
    with pytest.raises(ValueError, match="min_run_time"):
        benchmark(lambda: None, min_run_time=0)


def test_time_once_returns_result_and_seconds():
    out, s = time_once(lambda: (time.sleep(0.02), "done")[1])
    assert out == "done" and 0.015 < s < 1.0


def test_compare_speedups_relative_to_baseline():
    slow = Timing("slow", 0.2, 0.0, 3, 1)
    fast = Timing("fast", 0.05, 0.0, 3, 1)
    table = compare([slow, fast])
    assert isinstance(table, Table)
    assert table.column("speed-up vs slow") == [1.0, 4.0]
    assert compare({"a": slow, "b": fast}, baseline="b").column("speed-up vs b") == [0.25, 1.0]
    with pytest.raises(ValueError, match="baseline"):
        compare([slow], baseline="missing")
    assert "| fast |" in table.to_markdown()


def test_table_checks_row_width():
    t = Table(["a", "b"])
    with pytest.raises(ValueError, match="2 columns"):
        t.add(1, 2, 3)


def test_table_cells_render_as_written():
    """An op name with underscores stays upright and a |x| stays in its cell, rendered by the same Markdown
    parser MyST-NB uses for the site (markdown-it, with GitHub's tables)."""
    from markdown_it import MarkdownIt

    t = Table(["op", "check"], title="ops_by_time")
    t.add("aten::_fused_adamw_", "|Δ| 1e-3 ≤ 2e-3")
    html = MarkdownIt("commonmark").enable("table").render(t.to_markdown())
    assert "<em>" not in html and "aten::_fused_adamw_" in html and "ops_by_time" in html, html
    assert html.count("<td>") == 2 and "<td>|Δ| 1e-3 ≤ 2e-3</td>" in html, html


def test_cold_start_is_measured_in_a_fresh_process():
    import os

    from helpers.core.timing import ColdStart, cold_start

    cold = cold_start("cpu", n=64, repeats=3)
    assert isinstance(cold, ColdStart) and cold.pid != os.getpid()  # not this warmed-up process
    assert cold.import_s > 0 and cold.first_call_s > 0 and cold.steady_s > 0
    assert "fresh process" in str(cold)
    with pytest.raises(ValueError, match="n >= 1"):
        cold_start("cpu", n=0)
    with pytest.raises(ValueError, match="device"):
        cold_start("meta")


def test_interleaved_rounds_rotate_the_order_and_keep_each_arms_fastest_round(monkeypatch):
    from helpers.core import timing

    calls = []
    medians = {"a": [0.002, 0.040, 0.003], "b": [0.004, 0.005, 0.004]}  # a is disturbed in round 2

    def fake_benchmark(fn, *, name, warmup, min_run_time):
        calls.append(name)
        return Timing(name, medians[name][calls.count(name) - 1], 0.0, 1, 1)

    monkeypatch.setattr(timing, "benchmark", fake_benchmark)
    got = timing.benchmark_interleaved({"a": lambda: None, "b": lambda: None}, rounds=3)
    assert calls == ["a", "b", "b", "a", "a", "b"]  # a different arm leads each round
    assert list(got) == ["a", "b"] and got["a"].median_s == 0.002 and got["b"].median_s == 0.004
    with pytest.raises(ValueError, match="rounds"):
        timing.benchmark_interleaved({"a": lambda: None}, rounds=0)


def test_interleaved_timing_measures_what_it_runs():
    from helpers.core.timing import benchmark_interleaved

    got = benchmark_interleaved({"short": lambda: time.sleep(0.002), "long": lambda: time.sleep(0.006)},
                                rounds=2, warmup=0, min_run_time=0.05)
    assert got["short"].median_s < got["long"].median_s


# --- too busy to judge: the one rule (helpers.core.timing.busy)
# ------------------------------------------------

def test_too_busy_when_the_rounds_disagree_or_others_take_the_cpus():
    from helpers.core.timing import OTHERS_BUSY, TOO_BUSY, CpuLoad, busy, relative_spread

    quiet, noisy = Timing("a", 1.0, 0.1, 5, 1), Timing("b", 1.0, TOO_BUSY, 5, 1)
    assert relative_spread(noisy) == TOO_BUSY and relative_spread([1.0, 1.0, 1.0]) == 0.0
    assert not busy(quiet, quiet).too_busy and str(busy(quiet)).startswith("quiet enough to judge")
    state = busy(quiet, noisy)  # the noisier arm decides
    assert state.too_busy and state.noise == TOO_BUSY and "rounds disagree by 50%" in str(state)
    assert str(state).startswith("too busy to judge")
    loaded = busy(quiet, load=CpuLoad(others=OTHERS_BUSY, wall_s=1.0, cpus=2))  # tight rounds, a busy machine
    assert loaded.too_busy and "other programs took 25% of the CPUs' time" in str(loaded)
    assert not busy(quiet, load=CpuLoad(None, 1.0, 2)).too_busy  # unknown load: the spread alone decides
    assert not busy(0.49, load=0.24).too_busy and busy(0.49, load=0.24, others_limit=0.2).too_busy
    for bad in (dict(load=1.5), dict(load="busy")):
        with pytest.raises(ValueError, match="load must be"):
            busy(quiet, **bad)
    with pytest.raises(ValueError, match="Timings or relative spreads"):
        busy(-0.1)


def test_the_load_probe_sees_another_process_take_a_cpu():
    """A busy loop in another process takes one CPU of this machine's for the whole block; this process
    sleeps. The probe must see at least most of that CPU go to others (and never count our own work)."""
    import os
    import subprocess
    import sys

    from helpers.core.timing import LoadProbe

    if not os.path.exists("/proc/stat"):
        pytest.skip("LoadProbe reads /proc/stat (Linux)")
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        with LoadProbe() as probe:
            time.sleep(1.0)
    finally:
        loop.kill()
        loop.wait()
    cpus = os.cpu_count() or 1
    assert probe.load is not None and probe.load.others is not None
    assert probe.load.others >= 0.8 / cpus, probe.load  # one CPU of `cpus`, less the scheduler's share
    with LoadProbe() as own:  # our own work is not "others": a loop here, on an otherwise idle probe
        t = time.perf_counter()
        while time.perf_counter() - t < 0.5:
            pass
    assert own.load.others is not None and own.load.others <= 1.0


def test_a_lesson_long_probe_counts_this_process_children_as_its_own():
    """A child of ours spinning (a compile or DataLoader worker) is other programs' load to a plain probe
    while it runs, and this process's own to `LoadProbe(children=True)`, the probe a lesson's setup starts."""
    import os
    import subprocess
    import sys

    from helpers.core.timing import LoadProbe

    if not os.path.exists("/proc/stat"):
        pytest.skip("LoadProbe reads /proc/stat (Linux)")
    with LoadProbe() as plain, LoadProbe(children=True) as ours:
        child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\n"
                                  "while time.time() - t < 1.5: pass"])
        try:
            time.sleep(1.2)
            seen_plain, seen_ours = plain.read(), ours.read()  # the same interval, the child still running
            with open(f"/proc/{child.pid}/stat") as f:  # the child's CPU so far: user + system ticks
                fields = f.read().rsplit(")", 1)[1].split()
            child_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        finally:
            child.kill()
            child.wait()
    assert seen_plain.others is not None and seen_ours.others is not None and child_s > 0.05
    share = child_s / (seen_plain.wall_s * seen_plain.cpus)  # the child's share of all CPUs' time
    assert seen_plain.others - seen_ours.others >= 0.5 * share, (seen_plain, seen_ours, share)
