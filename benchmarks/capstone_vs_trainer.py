"""The capstone's recipe beside Hugging Face's `Trainer` with its defaults: accuracy and time, seed by seed.

Two arms fine-tune the same pretrained checkpoint (for a seed, the same weights and the same new classifier
head) on the same train/val/test split at the same max_length for the same epochs, in one process with the
same threads, and are scored by the same function (`helpers.train.evaluation.evaluate`):

- **course**: `course/scripts/finetune_bert.py` with its defaults, through its own `finetune` function (what
  `python course/scripts/finetune_bert.py --seed S` runs);
- **trainer**: `transformers.Trainer` with `TrainingArguments`' defaults except the output folder, the epochs,
  no saving, no reporting and the seed; given the tokenizer, it pads each batch to its longest with its
  default collator (`DataCollatorWithPadding`).

Training seconds: the course's batching plus its `train` call; the Trainer's `train()` call (it batches as it
goes). Runs alternate, course seed 0, trainer seed 0, course seed 1, ..., so a change in the machine's load
falls on both arms alike; each run records the load average before and after it and the CPU seconds that
other processes used meanwhile (psutil). The time verdict uses the paired ratios (trainer s / course s,
seed by seed) against the spread of each arm's times: "faster" or "slower" only beyond that noise; likewise
an accuracy difference (of the medians) counts only beyond the seeds' spread (max - min) of either arm.

`--search` runs the recipe search instead: candidates that differ from the script's former defaults in one
thing each (`CANDIDATES`), seeds interleaved, scored on the *validation* split; test accuracy is reported
and never used to pick. Round 1's winners are the changes whose median validation accuracy beats the former
defaults'; `--round 2` (read from round 1's result file) sets them beside all of them together, and `pick`
names the recipe: the best median validation accuracy, then the best mean, then the shorter median time.

The Trainer arm needs `accelerate` (`pip install accelerate`, or `pip install -e ".[bench]"`); nothing else
here does, and it is imported only when that arm runs.

    python benchmarks/capstone_vs_trainer.py                       # 3 seeds x 2 arms: ~15 min on 2 cores
    python benchmarks/capstone_vs_trainer.py --search --round 1    # the recipe search (~50 min on 2 cores)

Writes `capstone-vs-trainer-<slug>.json/.md` (the search: `...-recipes-<round>`) into `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch

from course.results import stamp, write_results
from helpers.core.device import get_device
from helpers.data.text import padding_fraction
from helpers.train.evaluation import evaluate
from helpers.train.runspec import RunSpec

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("course", "trainer")
MIN_SEEDS = 3
INSTALL = "pip install accelerate  (or: pip install -e \".[bench]\")"

# The script's defaults before the search (issue: they lost to the Trainer's): the search's starting point.
FORMER = dict(batch_size=16, lr=5e-5, lr_schedule="linear", warmup_frac=0.1, weight_decay=0.01,
              spec=RunSpec(attn="sdpa", padding="fixed"))
# Round 1: one change each from FORMER. Padding is not among them: at 128 tokens every BBC article fills the
# window, so fixed, dynamic and bucketed batches carry no padding (`padding_check` shows it on the data).
CANDIDATES: dict[str, dict[str, Any]] = {
    "former defaults": {},
    "batch 8": {"batch_size": 8},
    "lr 3e-5": {"lr": 3e-5},
    "lr 1e-4": {"lr": 1e-4},
    "no warm-up": {"warmup_frac": 0.0},
    "no decay (constant lr)": {"lr_schedule": "constant"},
}


def winners(summary: dict[str, Any], base: str = "former defaults") -> list[str]:
    """Round 1's candidates whose median validation accuracy beats `base`'s, best first."""
    floor = summary[base]["val_accuracy"]["median"]
    better = [n for n in summary if n != base and summary[n]["val_accuracy"]["median"] > floor]
    return sorted(better, key=lambda n: -summary[n]["val_accuracy"]["median"])


def round2_candidates(round1: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Round 2: the former defaults, round 1's winners (their runs are read back), and the winners' changes
    all together (on a clash over one setting, the better winner's value)."""
    names = winners(round1["summary"])
    cands: dict[str, dict[str, Any]] = {"former defaults": {}, **{n: round1["candidates"][n] for n in names}}
    if len(names) > 1:
        together: dict[str, Any] = {}
        for n in reversed(names):  # the better winner last, so its value stays
            together.update(round1["candidates"][n])
        cands[" + ".join(names)] = together
    return cands


def pick(summary: dict[str, Any], runs: list[dict[str, Any]], key: str = "candidate") -> str:
    """The recipe: best median validation accuracy, then best mean, then the shorter median training time."""
    def score(name: str) -> tuple[float, float, float]:
        vals = [r["val_accuracy"] for r in runs if r[key] == name]
        return (summary[name]["val_accuracy"]["median"], statistics.fmean(vals),
                -summary[name]["train_s"]["median"])

    return max(summary, key=score)


def round1_file(out: Path) -> dict[str, Any]:
    """Round 1's recorded result for this device (round 2 starts from it)."""
    from course.results import slug

    path = out / f"capstone-vs-trainer-{slug(get_device('auto'))}-recipes-1.json"
    if not path.is_file():
        raise SystemExit(f"round 2 starts from round 1's result, {path}, missing: run --search --round 1")
    return json.loads(path.read_text())


def load_script() -> Any:
    """course/scripts/finetune_bert.py, the course's fine-tuning script, as a module."""
    from course.scripts import finetune_bert

    return finetune_bert


def check_seeds(seeds: list[int]) -> list[int]:
    """The seeds, checked: at least MIN_SEEDS distinct non-negative integers."""
    if len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
        raise ValueError(f"seeds must be distinct non-negative integers, got {seeds}")
    if len(seeds) < MIN_SEEDS:
        raise ValueError(f"need at least {MIN_SEEDS} seeds for a median and a spread, got {seeds}: "
                         f"--seeds 0 1 2")
    return seeds


def candidate_config(ft: Any, overrides: dict[str, Any], **run: Any) -> Any:
    """A FinetuneConfig: FORMER, then `overrides` (a "spec" entry: a dict of RunSpec fields), then `run`."""
    values = dict(FORMER)
    for name, value in overrides.items():
        if name == "spec":
            values["spec"] = values["spec"].replace(**value)
        elif name in {f.name for f in dataclasses.fields(ft.FinetuneConfig)}:
            values[name] = value
        else:
            raise ValueError(f"unknown setting {name!r} in a candidate: use a FinetuneConfig field or 'spec'")
    return ft.FinetuneConfig(**values, **run)


# --- the machine while a run runs -------------------------------------------------------------------

def _cpu_seconds() -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy, CPU seconds of this process and its children)."""
    import psutil

    t = psutil.cpu_times()
    busy = sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))
    own = psutil.Process().cpu_times()
    return busy, own.user + own.system + own.children_user + own.children_system


def watched(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """fn()'s result with the load average before/after and the CPU seconds of this process and others."""
    load0, (busy0, own0) = os.getloadavg()[0], _cpu_seconds()
    out = fn()
    busy1, own1 = _cpu_seconds()
    own = own1 - own0
    return {**out, "load_before": load0, "load_after": os.getloadavg()[0], "own_cpu_s": own,
            "other_cpu_s": max(0.0, busy1 - busy0 - own)}


# --- the two arms -----------------------------------------------------------------------------------

def run_course(ft: Any, cfg: Any) -> dict[str, Any]:
    """One run of the script's `finetune` (its defaults unless `cfg` changes them)."""
    r = ft.finetune(cfg, log=lambda *a, **k: None)
    seconds = r["batching_s"] + r["train_s"]
    samples = r["steps"] * cfg.batch_size
    return {"train_s": seconds, "samples": samples, "samples_per_s": samples / seconds, "steps": r["steps"],
            "val_accuracy": r["val_accuracy"], "test_accuracy": r["test_accuracy"],
            "mean_loss": statistics.fmean(r["losses"]), "first_step_s": r["first_step_s"],
            "padding": r["padding"], "threads": torch.get_num_threads()}


def trainer_arguments(cfg: Any, seed: int, output_dir: str) -> dict[str, Any]:
    """TrainingArguments' keyword arguments: its defaults except these (max_steps only for a short test)."""
    args = dict(output_dir=output_dir, num_train_epochs=cfg.epochs, save_strategy="no", report_to="none",
                seed=seed)
    if cfg.max_steps:
        args["max_steps"] = cfg.max_steps
    return args


def _name(value: Any) -> str:
    """An enum's value ("linear"), anything else as a string."""
    return str(getattr(value, "value", value))


def run_trainer(ft: Any, cfg: Any) -> dict[str, Any]:
    """One run of Hugging Face's Trainer with its defaults on the script's data and model."""
    if importlib.util.find_spec("accelerate") is None:
        raise SystemExit(f"the Trainer arm needs accelerate, which is not installed: {INSTALL}")
    from transformers import Trainer, TrainingArguments

    splits = ft.load_splits(cfg, verbose=False)
    model, tokenizer = ft.build_model(cfg, num_labels=splits.num_labels, verbose=False)  # same head per seed
    data = ft.tokenize_splits(splits, tokenizer, cfg)
    device = get_device(cfg.device)
    with tempfile.TemporaryDirectory(prefix="trainer-") as out:
        args = TrainingArguments(**trainer_arguments(cfg, cfg.seed, out))
        trainer = Trainer(model=model, args=args, train_dataset=data["train"], processing_class=tokenizer)
        t0 = time.perf_counter()
        metrics = trainer.train().metrics
        seconds = time.perf_counter() - t0
        steps, batch = trainer.state.global_step, args.per_device_train_batch_size
    samples = min(len(data["train"]) * cfg.epochs, steps * batch)
    score = {name: evaluate(trainer.model, data[name], batch_size=cfg.eval_batch_size, spec=cfg.spec,
                            device=device, pad_token_id=tokenizer.pad_token_id or 0)[0]
             for name in ("val", "test")}
    return {"train_s": seconds, "samples": samples, "samples_per_s": samples / seconds, "steps": steps,
            "val_accuracy": score["val"], "test_accuracy": score["test"],
            "mean_loss": metrics.get("train_loss"),
            "trainer_runtime_s": metrics.get("train_runtime"), "batch_size": batch,
            "learning_rate": args.learning_rate, "lr_scheduler": _name(args.lr_scheduler_type),
            "warmup": args.warmup_steps, "weight_decay": args.weight_decay, "optim": _name(args.optim),
            "threads": torch.get_num_threads()}


# --- summaries --------------------------------------------------------------------------------------

def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of a list of numbers."""
    if not values:
        raise ValueError("spread of no values")
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(runs: list[dict[str, Any]], key: str = "arm") -> dict[str, Any]:
    """Per group (`key`): median/min/max of time, samples/s, validation and test accuracy."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(r[key], []).append(r)
    measures = ("train_s", "samples_per_s", "val_accuracy", "test_accuracy")
    return {name: {m: spread([r[m] for r in rs]) for m in measures} | {"seeds": [r["seed"] for r in rs]}
            for name, rs in groups.items()}


def compare(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The course against the trainer: paired time ratios (trainer s / course s per seed), the noise
    (the larger relative spread (max - min) / median of the two arms' times), the accuracy differences
    against the seeds' spread, and the verdicts."""
    by = {(r["arm"], r["seed"]): r for r in runs}
    seeds = sorted({s for a, s in by if (("course", s) in by and ("trainer", s) in by)})
    if not seeds:
        raise ValueError("no seed ran in both arms")
    ratios = [by["trainer", s]["train_s"] / by["course", s]["train_s"] for s in seeds]
    summary = summarize([r for r in runs if r["seed"] in seeds])
    times = [summary[a]["train_s"] for a in ARMS]
    noise = max((t["max"] - t["min"]) / t["median"] for t in times)
    ratio = statistics.median(ratios)
    if ratio > 1 + noise:
        time_verdict = "faster"
    elif ratio < 1 / (1 + noise):
        time_verdict = "slower"
    else:
        time_verdict = "the same within the noise"
    acc, acc_noise, acc_verdict = {}, {}, {}
    for m in ("val_accuracy", "test_accuracy"):
        # the same kind of rule as the time's: a difference of medians counts only beyond the seed-to-seed
        # spread (max - min, the larger of the two arms'); one article either way is often inside it
        acc[m] = summary["course"][m]["median"] - summary["trainer"][m]["median"]
        acc_noise[m] = max(summary[a][m]["max"] - summary[a][m]["min"] for a in ARMS)
        acc_verdict[m] = ("more accurate" if acc[m] > acc_noise[m] else
                          "less accurate" if acc[m] < -acc_noise[m] else "as accurate within the noise")
    return {"seeds": seeds, "ratios": ratios, "ratio": ratio, "noise": noise, "time": time_verdict,
            "accuracy_difference": acc, "accuracy_noise": acc_noise, "accuracy": acc_verdict,
            "summary": summary, "at_least_as_accurate": acc_verdict["test_accuracy"] != "less accurate",
            "not_slower": time_verdict != "slower"}


def pct(x: float | None) -> str:
    """An accuracy as a percentage with two decimals ("97.65 %")."""
    return "–" if x is None else f"{100 * x:.2f} %"


def _range(s: dict[str, float], fmt: Callable[[float], str]) -> str:
    return f"{fmt(s['median'])} ({fmt(s['min'])} – {fmt(s['max'])})"


def machine_lines(result: dict[str, Any]) -> list[str]:
    """The machine, the load before/after and whether other processes ran, as Markdown lines."""
    st, runs = result["stamp"], result["runs"]
    other = [r["other_cpu_s"] / r["run_wall_s"] for r in runs if r.get("run_wall_s")]
    loads = [r[k] for r in runs for k in ("load_before", "load_after")]
    busy, resumed = max(other, default=0.0), sum(bool(r.get("resumed")) for r in runs)
    ran = ("nothing else used the CPUs to speak of" if busy < 0.05 else
           f"other processes ran: they used {100 * min(other):.0f}–{100 * busy:.0f} % of one core during the "
           "runs (a shared machine: times are noisy)")
    return [f"Machine: {st['device']} ({st['cpu_count']} CPUs; torch threads: {st['threads']}), torch "
            f"{st['torch']}, transformers {st['transformers']}, Python {st['python']}, {st['date']}.",
            f"Load average (1 min): {runs[0]['load_before']:.2f} before the first run, "
            f"{runs[-1]['load_after']:.2f} after the last, {min(loads):.2f}–{max(loads):.2f} at the starts "
            f"and ends of the runs; {ran} (CPU seconds of other processes / the run's wall seconds, psutil)."
            + (f" {resumed} runs were read back from the progress file of earlier invocations (their load "
               "figures are their own)." if resumed else "")
            + (f" {result['note']}" if result.get("note") else "")]


def comparison_markdown(result: dict[str, Any]) -> str:
    """The Markdown of a course-vs-trainer result: the runs, the medians and the verdicts."""
    c, runs = result["comparison"], result["runs"]
    cfg, targs = result["course_config"], result["trainer_arguments"]
    spec, hf = cfg["spec"], result["trainer_defaults"]
    lines = ["# The capstone's recipe beside Hugging Face's Trainer (its defaults)", "",
             f"Run: `{result['command']}`; {len(c['seeds'])} seeds, arms interleaved (course, trainer, "
             "course, ...). Same checkpoint and new head per seed, same split, same max_length, same "
             "threads, one evaluation function.", "",
             f"- course (`course/scripts/finetune_bert.py` defaults): batch {cfg['batch_size']}, "
             f"lr {cfg['lr']:g} "
             f"{cfg['lr_schedule']} (warm-up {cfg['warmup_frac']:g} of the steps), weight decay "
             f"{cfg['weight_decay']:g}, padding {spec['padding']}, attention {spec['attn']}, "
             f"{spec['precision']}, fused AdamW {spec['fused_adamw']}, {cfg['max_length']} tokens, "
             f"{cfg['epochs']} epoch(s).",
             f"- trainer (`TrainingArguments` defaults, set: {', '.join(sorted(targs))}): batch "
             f"{hf['batch_size']}, lr {hf['learning_rate']:g} {hf['lr_scheduler']} (warm-up {hf['warmup']} "
             f"steps), weight decay {hf['weight_decay']:g}, {hf['optim']}, DataCollatorWithPadding.", "",
             *machine_lines(result), "",
             "| arm | seed | training s | samples/s | val accuracy | test accuracy | steps "
             "| load before → after | other processes' CPU |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['arm']} | {r['seed']} | {r['train_s']:.1f} | {r['samples_per_s']:.2f} | "
                     f"{pct(r['val_accuracy'])} | {pct(r['test_accuracy'])} | {r['steps']} | "
                     f"{r['load_before']:.2f} → {r['load_after']:.2f} | "
                     f"{100 * r['other_cpu_s'] / r['run_wall_s']:.0f} % of a core |")
    s = c["summary"]
    lines += ["", "Medians over the seeds (min – max):", "",
              "| arm | training s | samples/s | val accuracy | test accuracy |", "|---|---|---|---|---|"]
    for arm in ARMS:
        lines.append(f"| {arm} | {_range(s[arm]['train_s'], lambda v: f'{v:.1f}')} | "
                     f"{_range(s[arm]['samples_per_s'], lambda v: f'{v:.2f}')} | "
                     f"{_range(s[arm]['val_accuracy'], pct)} | {_range(s[arm]['test_accuracy'], pct)} |")
    d = c["accuracy_difference"]
    lines += ["", f"Time: trainer s / course s per seed: {', '.join(f'{x:.3f}' for x in c['ratios'])}; "
              f"median {c['ratio']:.3f}x (the course took longer in {sum(x < 1 for x in c['ratios'])} of "
              f"{len(c['ratios'])} seeds); noise (the larger relative spread of the two arms' times) "
              f"{100 * c['noise']:.1f} %: the course's recipe is **{c['time']}**"
              + ("" if c["time"] != "the same within the noise" else
                 " (the ratios cannot tell the two apart: neither faster nor slower is supported)") + ".",
              "Accuracy: course minus trainer, medians (noise: the larger seed-to-seed spread, max - min, "
              f"of the two arms): validation {100 * d['val_accuracy']:+.2f} points (noise "
              f"{100 * c['accuracy_noise']['val_accuracy']:.2f}): **{c['accuracy']['val_accuracy']}**; "
              f"test {100 * d['test_accuracy']:+.2f} points (noise "
              f"{100 * c['accuracy_noise']['test_accuracy']:.2f}; one test article is "
              f"{100 / result['test_examples']:.2f} points): **{c['accuracy']['test_accuracy']}**."]
    return "\n".join(lines) + "\n"


def search_markdown(result: dict[str, Any]) -> str:
    """The Markdown of a recipe search: each candidate's medians over the seeds; picked by validation."""
    s, cands = result["summary"], result["candidates"]
    base = s[next(iter(cands))]
    lines = [f"# Recipe search for the capstone, round {result['round']}: scored on validation", "",
             f"Run: `{result['command']}`; seeds {result['seeds']}, candidates interleaved within each "
             "seed. Starting point: the script's former defaults (batch 16, lr 5e-5, warm-up 10 % + linear "
             "decay, weight decay 0.01, fixed padding, SDPA, fp32, fused AdamW); 128 tokens, one epoch. "
             "Picked by **validation** accuracy and time; test accuracy is shown and was **not** used to "
             "pick.", "",
             *machine_lines(result), "", result.get("padding_note", ""), "",
             "| candidate | change | val accuracy | test accuracy (not used to pick) | training s | steps |",
             "|---|---|---|---|---|---|"]
    for name, change in cands.items():
        m, steps = s[name], sorted({r["steps"] for r in result["runs"] if r["candidate"] == name})
        lines.append(f"| {name} | {change or '–'} | {_range(m['val_accuracy'], pct)} | "
                     f"{_range(m['test_accuracy'], pct)} | {_range(m['train_s'], lambda v: f'{v:.1f}')} | "
                     f"{'/'.join(map(str, steps))} |")
    gain = {n: 100 * (s[n]["val_accuracy"]["median"] - base["val_accuracy"]["median"]) for n in cands}
    best = pick(s, result["runs"])
    lines += ["", "Validation accuracy, median difference to the first row: "
              + "; ".join(f"{n} {g:+.2f}" for n, g in gain.items()) + " points (one validation article is "
              f"{100 / result['val_examples']:.2f} points)."]
    if result["round"] == 1:
        lines.append("Winners (median validation accuracy above the former defaults'), carried to round 2 "
                     f"with their changes all together: {', '.join(winners(s)) or 'none'}.")
    else:
        lines.append("Picked (best median validation accuracy, then best mean, then the shorter median "
                     f"time): **{best}**.")
    return "\n".join(lines) + "\n"


# --- running it -------------------------------------------------------------------------------------

def padding_check(ft: Any, cfg: Any) -> tuple[dict[str, float], str]:
    """Padding of each mode on the training split at cfg.max_length, and whether fixed == dynamic batches."""
    splits = ft.load_splits(cfg, verbose=False)
    _, tokenizer = ft.build_model(cfg, num_labels=splits.num_labels, verbose=False)
    train = ft.tokenize_splits(splits, tokenizer, cfg)["train"]
    batches = {p: ft.make_batches(train, dataclasses.replace(cfg, spec=cfg.spec.replace(padding=p)))
               for p in ("fixed", "dynamic", "bucketed")}
    fractions = {p: padding_fraction(b) for p, b in batches.items()}
    pairs = zip(batches["fixed"], batches["dynamic"])
    same = all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in pairs)
    short = sum(n < cfg.max_length for n in train.lengths)
    note = (f"Padding at {cfg.max_length} tokens: {short} of {len(train)} training articles are shorter than "
            f"the window; padding fraction fixed {100 * fractions['fixed']:.2f} %, dynamic "
            f"{100 * fractions['dynamic']:.2f} %, bucketed {100 * fractions['bucketed']:.2f} %; fixed and "
            f"dynamic batches {'are identical' if same else 'differ'}"
            + (", so the padding mode cannot change this run's time or accuracy and is not a candidate here."
               if same else "."))
    return fractions, note


def run_all(plan: list[tuple[str, int, Any, Callable[[Any], dict[str, Any]]]], key: str,
            progress: Path | None = None) -> list[dict[str, Any]]:
    """Run each (name, seed, config, fn) of the plan in order, watched; one line printed per run. Each run
    is appended to `progress` (JSON lines) as it ends, and a run already there (same name and config) is
    read back instead of run again: an interrupted benchmark continues where it stopped."""
    done: dict[str, dict[str, Any]] = {}
    if progress is not None and progress.is_file():
        for line in progress.read_text().splitlines():
            entry = json.loads(line)
            done[entry["key"]] = entry["run"]
    runs = []
    for name, seed, cfg, fn in plan:
        ident = f"{name}|{torch.get_num_threads()} threads|{cfg!r}"
        if ident in done:
            runs.append({**done[ident], "resumed": True})
            continue
        t0, threads = time.perf_counter(), torch.get_num_threads()
        r = watched(lambda: fn(cfg))
        if torch.get_num_threads() != threads:  # both arms must run on the same threads
            raise RuntimeError(f"{name} changed torch's threads from {threads} to {torch.get_num_threads()}")
        r.update({key: name, "seed": seed, "run_wall_s": time.perf_counter() - t0})
        runs.append(r)
        if progress is not None:
            with progress.open("a") as f:
                f.write(json.dumps({"key": ident, "run": r}) + "\n")
        print(f"{name} seed {seed}: {r['train_s']:.1f} s training, val {pct(r['val_accuracy'])}, test "
              f"{pct(r['test_accuracy'])}, load {r['load_before']:.2f} -> {r['load_after']:.2f}, others "
              f"{r['other_cpu_s']:.0f} CPU s", flush=True)
    return runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (seeds, sizes)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help=f"at least {MIN_SEEDS}")
    p.add_argument("--search", action="store_true", help="the recipe search instead of the comparison")
    p.add_argument("--round", type=int, default=1, choices=(1, 2), help="the search's round")
    p.add_argument("--max-examples", type=int, default=0, help="a subset of the corpus (a quick look only)")
    p.add_argument("--max-steps", type=int, default=0, help="stop each run after this many steps (a look)")
    p.add_argument("--candidates", nargs="+", default=[], help="only these candidates of the round")
    p.add_argument("--note", default="", help="a sentence the Markdown must carry (how the runs were made)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default, all cores)")
    p.add_argument("--no-resume", action="store_true", help="run everything again, ignoring finished runs")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    try:
        check_seeds(args.seeds)
        if args.max_examples < 0 or args.max_steps < 0 or args.threads < 0:
            raise ValueError("--max-examples, --max-steps, --threads must be >= 0 (0: the whole corpus, "
                             "whole epochs, torch's threads)")
        if args.candidates and args.round == 1 and not set(args.candidates) <= set(CANDIDATES):
            raise ValueError(f"--candidates: choose among {sorted(CANDIDATES)}, got {args.candidates}")
    except ValueError as err:
        p.error(str(err))
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    ft = load_script()
    device = get_device("auto")
    run = dict(max_examples=args.max_examples, max_steps=args.max_steps, device=device.type)
    words = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "benchmarks/capstone_vs_trainer.py", *words])
    load_before = os.getloadavg()[0]
    if args.threads:
        torch.set_num_threads(args.threads)

    def progress(name: str) -> Path | None:  # where finished runs are kept until the results are written
        return None if args.no_resume else Path(tempfile.gettempdir()) / f"capstone-vs-trainer-{name}.jsonl"

    if args.search:
        cands = CANDIDATES if args.round == 1 else round2_candidates(round1_file(args.out))
        if args.candidates:  # a share of the round (several processes can share one round's progress file)
            cands = {name: cands[name] for name in args.candidates}
        _, note = padding_check(ft, candidate_config(ft, {}, **run))
        plan = [(name, seed, candidate_config(ft, over, seed=seed, **run), partial(run_course, ft))
                for seed in args.seeds for name, over in cands.items()]
        runs = run_all(plan, key="candidate", progress=progress("recipes"))  # one file: round 2 reuses runs
        result = {"command": command.strip(), "round": args.round, "seeds": args.seeds, "padding_note": note,
                  "candidates": {n: {k: (v if k != "spec" else dict(v)) for k, v in o.items()} for n, o in
                                 cands.items()}, "runs": runs, "summary": summarize(runs, key="candidate")}
        markdown, variant = search_markdown, f"recipes-{args.round}"
    else:
        course = ft.FinetuneConfig(**run)
        arms = {"course": partial(run_course, ft), "trainer": partial(run_trainer, ft)}
        plan = [(arm, seed, dataclasses.replace(course, seed=seed), arms[arm])
                for seed in args.seeds for arm in ARMS]
        runs = run_all(plan, key="arm", progress=progress("comparison"))
        trainer = next(r for r in runs if r["arm"] == "trainer")
        result = {"command": command.strip(), "course_config": dataclasses.asdict(course),
                  "trainer_arguments": trainer_arguments(course, 0, "<tmp>"), "runs": runs,
                  "trainer_defaults": {k: trainer[k] for k in ("batch_size", "learning_rate", "lr_scheduler",
                                                              "warmup", "weight_decay", "optim")},
                  "comparison": compare(runs)}
        markdown, variant = comparison_markdown, ""
    splits = ft.load_splits(ft.FinetuneConfig(**run), verbose=False)
    result.update(stamp=stamp(device), load_before=load_before, load_after=os.getloadavg()[0], note=args.note,
                  val_examples=len(splits.val), test_examples=len(splits.test))
    paths = write_results("capstone-vs-trainer", result, markdown(result), out_dir=args.out, variant=variant)
    print(markdown(result))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return result


if __name__ == "__main__":
    main()
