"""benchmarks/capstone_vs_trainer.py without running it: its arguments, its one-change candidates, the Trainer
arm's untouched defaults, the verdicts and tables from planted results, and the published file's recipe
being the script's defaults. Nothing here needs accelerate."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from helpers.train.runspec import RunSpec

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("capstone_vs_trainer",
                                                  ROOT / "benchmarks" / "capstone_vs_trainer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load()
ft = bench.load_script()


def _run(arm, seed, seconds, val, test, **extra):
    return {"arm": arm, "seed": seed, "train_s": seconds, "samples": 1700, "samples_per_s": 1700 / seconds,
            "val_accuracy": val, "test_accuracy": test, "steps": 106, "load_before": 1.0, "load_after": 1.2,
            "other_cpu_s": 3.0, "run_wall_s": seconds + 20, **extra}


def _result(runs):
    stamp = {"device": "a test CPU", "cpu_count": 2, "threads": 2, "torch": "2.x", "transformers": "5.x",
             "python": "3.11", "date": "2026-01-01", "slug": "cpu"}
    return {"command": "python benchmarks/capstone_vs_trainer.py", "runs": runs, "stamp": stamp,
            "course_config": dataclasses.asdict(ft.FinetuneConfig()),
            "trainer_arguments": bench.trainer_arguments(ft.FinetuneConfig(), 0, "<tmp>"),
            "trainer_defaults": {"batch_size": 8, "learning_rate": 5e-5, "lr_scheduler": "linear",
                                 "warmup": 0, "weight_decay": 0.0, "optim": "adamw_torch_fused"},
            "comparison": bench.compare(runs), "load_before": 1.0, "load_after": 1.5, "test_examples": 213,
            "val_examples": 213}


def test_seeds_must_be_three_or_more_and_distinct():
    assert bench.check_seeds([0, 1, 2]) == [0, 1, 2]
    for bad in ([0, 1], [0, 0, 1], [-1, 0, 1]):
        with pytest.raises(ValueError, match="seeds"):
            bench.check_seeds(bad)
    with pytest.raises(SystemExit):
        bench.parse_args(["--seeds", "0", "1"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--threads", "-1"])


def test_each_candidate_changes_one_thing_from_the_former_defaults():
    former = bench.candidate_config(ft, {})
    assert former.spec == RunSpec(attn="sdpa", padding="fixed") and former.batch_size == 16
    for name, change in bench.CANDIDATES.items():
        cfg = bench.candidate_config(ft, change)
        changed = [f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) != getattr(former, f.name)]
        assert len(changed) == (0 if name == "former defaults" else 1), (name, changed)
    with pytest.raises(ValueError, match="unknown setting"):
        bench.candidate_config(ft, {"learning_rate": 1e-4})
    assert bench.candidate_config(ft, {"spec": {"padding": "dynamic"}}).spec.padding == "dynamic"


def _summary(vals: dict[str, list[float]], seconds: dict[str, float] | None = None):
    runs = [{"candidate": n, "seed": i, "val_accuracy": v, "test_accuracy": 0.5, "samples_per_s": 1.0,
             "train_s": (seconds or {}).get(n, 100.0)} for n, vs in vals.items() for i, v in enumerate(vs)]
    return bench.summarize(runs, key="candidate"), runs


def test_round_two_carries_the_winners_and_their_changes_together():
    summary, runs = _summary({"former defaults": [0.97, 0.96, 0.97], "batch 8": [0.98, 0.97, 0.98],
                              "lr 1e-4": [0.98, 0.97, 0.975], "lr 3e-5": [0.95, 0.94, 0.99],
                              "no warm-up": [0.97, 0.97, 0.97]})  # a tie with the former defaults: no win
    assert bench.winners(summary) == ["batch 8", "lr 1e-4"]
    cands = bench.round2_candidates({"summary": summary, "candidates": bench.CANDIDATES})
    assert cands == {"former defaults": {}, "batch 8": {"batch_size": 8}, "lr 1e-4": {"lr": 1e-4},
                     "batch 8 + lr 1e-4": {"batch_size": 8, "lr": 1e-4}}
    clash, _ = _summary({"former defaults": [0.9] * 3, "lr 1e-4": [0.95] * 3, "lr 3e-5": [0.93] * 3})
    together = bench.round2_candidates({"summary": clash, "candidates": bench.CANDIDATES})
    assert together["lr 1e-4 + lr 3e-5"] == {"lr": 1e-4}  # the better winner's value of a shared setting


def test_the_pick_is_by_validation_then_time():
    summary, runs = _summary({"former": [0.97] * 3, "a": [0.98, 0.97, 0.99], "b": [0.98, 0.97, 0.97]})
    assert bench.pick(summary, runs) == "a"  # same median, better mean
    summary, runs = _summary({"a": [0.98] * 3, "b": [0.98] * 3}, seconds={"a": 120.0, "b": 100.0})
    assert bench.pick(summary, runs) == "b"  # a tie on validation: the faster one


def test_the_trainer_arm_keeps_every_other_default():
    args = bench.trainer_arguments(ft.FinetuneConfig(), 3, "out")
    assert args == {"output_dir": "out", "num_train_epochs": 1, "save_strategy": "no", "report_to": "none",
                    "seed": 3}


def test_the_trainer_arm_says_how_to_install_accelerate(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate"
                        else real(name, *a))
    with pytest.raises(SystemExit, match="pip install accelerate"):
        bench.run_trainer(ft, ft.FinetuneConfig())


def test_verdicts_follow_the_paired_ratios_and_the_noise():
    same = [_run(a, s, 100 + s + (a == "trainer"), 0.97, 0.97) for s in range(3) for a in bench.ARMS]
    c = bench.compare(same)
    assert c["time"] == "the same within the noise" and c["not_slower"] and c["at_least_as_accurate"]
    faster = [_run(a, s, (100 if a == "course" else 130) + s, 0.97, 0.98 if a == "course" else 0.97)
              for s in range(3) for a in bench.ARMS]
    c = bench.compare(faster)
    assert c["time"] == "faster" and c["ratio"] == pytest.approx(131 / 101)
    assert c["accuracy_difference"]["test_accuracy"] == pytest.approx(0.01)
    slower = [_run(a, s, (130 if a == "course" else 100) + s, 0.97, 0.96 if a == "course" else 0.97)
              for s in range(3) for a in bench.ARMS]  # planted: the course loses on both counts
    c = bench.compare(slower)
    assert c["time"] == "slower" and not c["not_slower"] and not c["at_least_as_accurate"]
    one_article = [_run(a, s, 100 + s, 0.97, (0.97 if a == "course" else 0.975) + 0.02 * (s == 1))
                   for s in range(3) for a in bench.ARMS]  # 0.5 points behind, 2 points of seed spread
    c = bench.compare(one_article)
    assert c["accuracy"]["test_accuracy"] == "as accurate within the noise" and c["at_least_as_accurate"]
    assert c["accuracy_noise"]["test_accuracy"] == pytest.approx(0.02)
    assert bench.compare(slower)["accuracy"]["test_accuracy"] == "less accurate"
    assert bench.compare(faster)["accuracy"]["test_accuracy"] == "more accurate"
    noisy = [_run(a, s, (100 if a == "course" else 110) * (1 + 0.3 * s), 0.97, 0.97)
             for s in range(3) for a in bench.ARMS]  # 10 % apart, 60 % spread: no verdict either way
    assert bench.compare(noisy)["time"] == "the same within the noise"


def test_the_tables_show_every_run_and_the_verdicts():
    runs = [_run(a, s, (100 if a == "course" else 130) + s, 0.9765, 0.9812)
            for s in range(3) for a in bench.ARMS]
    md = bench.comparison_markdown(_result(runs))
    assert all(f"\n| {a} | {s} | " in md for a in bench.ARMS for s in range(3))  # every run, then the medians
    assert md.count("\n| course | ") == md.count("\n| trainer | ") == 4
    assert "97.65 %" in md and "98.12 %" in md and "**faster**" in md
    assert "**as accurate within the noise**" in md
    assert "the course took longer in 0 of 3 seeds" in md
    assert "Load average (1 min): 1.00 before the first run, 1.20 after the last" in md and "a test CPU" in md
    search = {"command": "c", "round": 1, "seeds": [0, 1, 2], "candidates": {"former defaults": {}, "batch 8":
              {"batch_size": 8}}, "runs": [dict(r, candidate="former defaults" if r["arm"] == "course" else
                                                "batch 8", val_accuracy=0.97 + 0.01 * (r["arm"] == "trainer"))
                                           for r in runs],
              "stamp": _result(runs)["stamp"], "load_before": 1.0, "load_after": 1.5, "val_examples": 213}
    search["summary"] = bench.summarize(search["runs"], key="candidate")
    md = bench.search_markdown(search)
    assert "| batch 8 | {'batch_size': 8} |" in md and "not** used to pick" in md
    assert "carried to round 2 with their changes all together: batch 8." in md
    assert "**batch 8**" in bench.search_markdown(dict(search, round=2))


def test_the_published_comparison_measured_the_scripts_defaults():
    published = ROOT / "benchmarks" / "results" / "capstone-vs-trainer-cpu.json"
    recorded = json.loads(published.read_text())["course_config"]
    today = dataclasses.asdict(ft.FinetuneConfig())
    recipe = ("max_length", "batch_size", "lr", "lr_schedule", "warmup_frac", "weight_decay", "epochs",
              "spec")
    # a RunSpec field added after the recording: the runs had what is now its default (no checkpointing;
    # the loss scale only acts in fp16), so today's default must still be that behaviour
    added_since = {"activation_checkpointing": False, "init_scale": 2.0 ** 16}
    recorded["spec"] = {**{k: v for k, v in added_since.items() if k not in recorded["spec"]},
                        **recorded["spec"]}
    differ = {k: (recorded[k], today[k]) for k in recipe if recorded[k] != today[k]}
    assert not differ, f"the script's defaults changed since {published.name} was measured: {differ}"
