"""Lesson 08's set-up and plumbing (`08_bert_finetuning`): the ladder's and the final fine-tuning's batch and
length, fitted so that every step the lesson runs fits the device together with what the lesson keeps there;
whether FP8 runs; the lesson's checks, tables and figures; the DDP rung's launch; the recorded results.

What the lesson keeps on the device, step by step (counted in `setup`'s estimates, freed otherwise):
- the ladder: the candidate, the best stack so far and the baseline, each a model with its optimizer state
  (dropout off: the checks compare exact numbers);
- the final fine-tuning: one model, trained with BERT's dropout on; the comparison run of the schedule trains
  first and is let go before it (`free_device_memory`), so two fine-tuned models never share the device;
- the DDP rung: launched after the notebook handed its cached memory back, so GPU 0 holds only this
  notebook's CUDA context beside the rung's first process.
Each `check_*` raises AssertionError naming what is wrong and prints one line saying what it checked.
"""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from matplotlib import pyplot as plt
from matplotlib.figure import Figure
from torch import nn

from course.claims import CLAIMS
from course.lessons import LessonSetup
from course.lessons.lesson06 import short_texts
from course.paths import checkout_root, output_dir, script
from course.plots import ladder_chart as _ladder_chart
from course.profile import get_profile, pick
from course.results import slug
from course.sizing import Size, fit_sizes
from course.verdicts import AtLeast, MeasuredTable
from helpers.core.device import get_device
from helpers.core.tables import Table
from helpers.core.timing import Busy
from helpers.core.units import GiB
from helpers.data.text import TextExamples, TokenizedDataset, tokenize
from helpers.measure.memory import estimate_training_memory
from helpers.model.fp8 import fp8_capable, fp8_supported
from helpers.model.models import SmallTransformer, TransformerConfig, bert_config
from helpers.train import ladder, ladder_report
from helpers.train.distributed import LaunchError, launch
from helpers.train.loop import TrainConfig, train
from helpers.train.runspec import RunSpec

__all__ = ["SIZES", "BERT_DROPOUT", "NOTEBOOK_CONTEXT_BYTES", "RESULTS_URL", "setup", "step_peak",
           "free_device_memory", "check_device_free", "check_climb", "check_fp8_curves", "check_accuracy",
           "check_recall", "check_recorded_comparison", "check_reloaded", "class_table", "ladder_table",
           "ladder_chart", "fp8_loss_curves", "loss_curves_chart", "ddp_rung", "ladder_texts",
           "training_subset", "recorded_comparison", "summary_table", "story_table", "recorded_runs",
           "clean_up"]

SIZES = {"LADDER_BATCH": Size(full=32, smoke=4, floor=4),  # samples per step while the ladder is timed
         "FINAL_BATCH": Size(full=32, smoke=16, floor=4),  # samples per step of the final fine-tuning
         # tokens per article, longer ones truncated (BERT's limit: 512)
         "MAX_LENGTH": Size(full=512, smoke=64, floor=128)}
BERT_DROPOUT = 0.1  # BERT's dropout on its hidden states and attention probabilities, on while fine-tuning
# the notebook's own CUDA context on GPU 0 (0.3-0.5 GiB, outside PyTorch's allocator), beside the DDP rung's
# first process there; the fit's margin covers the process's own
NOTEBOOK_CONTEXT_BYTES = GiB // 2
RESULTS_URL = "https://github.com/fast-transformers-course/fast-transformers-course/tree/main/benchmarks/results"


def _shape(profile: str, dropout: float) -> SmallTransformer:
    """The BERT the lesson loads, as the estimator's model (meta device: nothing allocated)."""
    hf = bert_config(pick(profile, smoke="mini", full="base"), 5)  # sized for BERT-base, the largest it loads
    with torch.device("meta"):
        return SmallTransformer(TransformerConfig(
            vocab_size=hf.vocab_size, max_len=hf.max_position_embeddings, d_model=hf.hidden_size,
            n_heads=hf.num_attention_heads, n_layers=hf.num_hidden_layers, d_ff=hf.intermediate_size,
            attn="naive", n_classes=5, dropout=dropout))


def step_peak(shape: SmallTransformer, batch: int, seq: int) -> int:
    """The peak bytes of one fp32 eager training step with AdamW, every row padded to `seq`; with the
    shape's dropout on, the attention probabilities' mask and dropped copy counted (lesson 08)."""
    return estimate_training_memory(shape, batch, seq, attn_probs_dropout=shape.cfg.dropout > 0).peak


def setup(profile: str | None = None, *, ddp_procs: int = 2) -> LessonSetup:
    """Lesson 08's sizes on this device; prints what it chose and why (lesson 08)."""
    profile = get_profile(profile)
    device = get_device()
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    still, dropping = _shape(profile, 0.0), _shape(profile, BERT_DROPOUT)
    states = 16 * still.num_params()  # fp32 weights, gradients and AdamW's moments of one stack's model

    estimates = {  # the ladder times a candidate beside the best stack and the baseline: three models at once
        "the ladder: three stacks side by side": lambda s: 2 * states + step_peak(
            still, s["LADDER_BATCH"], s["MAX_LENGTH"]),
        # the stack is chosen later: at worst fp32 eager; alone on the device (the schedule's run is freed)
        "the final fine-tuning, at worst fp32 eager, dropout on": lambda s: step_peak(
            dropping, s["FINAL_BATCH"], s["MAX_LENGTH"])}
    if gpus >= ddp_procs:  # the rung runs: one process first, on GPU 0 with this notebook
        estimates["the DDP rung's first process on GPU 0, beside this notebook"] = lambda s: step_peak(
            dropping, s["LADDER_BATCH"], s["MAX_LENGTH"]) + NOTEBOOK_CONTEXT_BYTES
    fp8, fp8_why = fp8_capable(device)  # FP8 tensor cores (compute capability 8.9+): the capability alone
    note = "FP8: runs (compute capability 8.9+)" if fp8 else "FP8: skipped (needs compute capability 8.9+)"
    fit = fit_sizes(SIZES, estimates, shrink=["LADDER_BATCH", "FINAL_BATCH", "MAX_LENGTH"], profile=profile,
                    device=device, notes=[note])
    print(fit.line())
    p = fit.profile
    return LessonSetup(
        PROFILE=p, DEVICE=device, FIT=fit, FP8=fp8, FP8_WHY=fp8_why, **fit.sizes,
        LADDER_STEPS=pick(p, smoke=1, full=4),  # steps per timed pass (the same samples for every stack)
        # what the ladder times: at the smoke sizes' 64 tokens every article fills the window, and bucketing
        # and packing would have no padding to remove; each headline and first sentence is tens of tokens
        LADDER_TEXTS=pick(p, smoke="headlines", full="articles"),
        REPEATS=pick(p, smoke=3, full=5),  # timed passes per stack: median and IQR
        FINAL_EXAMPLES=pick(p, smoke=320, full=0),  # training articles for the final model; 0 = all
        FINAL_LR=pick(p, smoke=2e-4, full=5e-5),  # peak lr: a short run takes a higher one (with warm-up)
        DDP_STEPS=pick(p, smoke=5, full=20),  # steps of each DDP launch (the first is warm-up)
        DDP_TIMEOUT_S=pick(p, smoke=600, full=1800),  # give up on the torchrun launch after this long
        WORK=output_dir("08_bert_finetuning", fresh=True))  # the DDP rung's results, the saved model


# --- the device's memory between runs ----------------------------------------------------------------------

def free_device_memory(device: torch.device | str) -> None:
    """Let go of what earlier runs left: collect unreachable models (reference cycles included) and, on a
    GPU, hand the caching allocator's free blocks back to the driver, where another process can use them
    (lesson 08)."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def check_device_free(device: torch.device | str, model: nn.Module, when: str) -> None:
    """On a GPU: the device holds less than half of `model`'s weights in tensors, so no earlier model is left,
    and its allocator keeps no more than that cached (lesson 08). The bound is at least 64 MiB: cuBLAS keeps
    its workspaces (up to 32 MiB on Hopper) allocated. A CPU keeps no such count: the line says so."""
    device = torch.device(device)
    if device.type != "cuda":
        print(f"{when}: a CPU keeps no allocator count to check; on a GPU this line checks that nothing "
              "earlier is left on it")
        return
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    bound = max(weights // 2, 64 * 2**20)
    allocated, reserved = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
    assert allocated < bound, (
        f"{when}: {allocated / GiB:.2f} GiB still allocated on {device}, more than half a model's weights "
        f"({weights / GiB:.2f} GiB): an earlier model is still referenced (del it, then free_device_memory)")
    assert reserved - allocated < bound, (
        f"{when}: the allocator still caches {(reserved - allocated) / GiB:.2f} GiB on {device} "
        "(call free_device_memory first)")
    print(f"{when}: {allocated / 2**20:,.0f} MiB allocated, {reserved / 2**20:,.0f} MiB reserved on {device}")


# --- the ladder --------------------------------------------------------------------------------------------

def check_climb(rows: Sequence[Mapping[str, Any]], stack: RunSpec) -> None:
    """Checks of a greedy climb that a planted error fails (lesson 08; tests/test_ladder.py plants one for
    each): every row timed in one session, the keep rule replayed from its medians and IQRs (nothing kept on a
    machine too busy to judge), a row not timed only when the device or model cannot run it, and your stack
    the baseline plus the kept rungs."""
    replayed = ladder.BASELINE  # your stack, rebuilt from the rows: the baseline plus each kept rung
    for r in rows[1:]:
        if "samples_per_s" not in r:  # not timed: only a rung this device or model cannot run, saying why
            assert r["why"] == "already in the stack" or r.get("skipped"), f"{r['name']}: {r['why']}"
            continue
        # one timing session per row: its samples/s over the baseline's and the stack below's, both timed
        # in that session, are its speed-up and its ratio (a row mixing two timings fails here)
        assert math.isclose(r["samples_per_s"] / r["baseline_samples_per_s"], r["speedup"], rel_tol=1e-6), r
        assert math.isclose(r["samples_per_s"] / r["below_samples_per_s"], r["vs_below"], rel_tol=1e-6), r
        # the greedy rule, replayed from the row's raw medians and IQRs; on a machine too busy to judge
        # (the row says why) no rung is kept
        ratio = r["below_median_s"] / r["pass_median_s"]
        spread = max(r["pass_iqr_s"] / r["pass_median_s"], r["below_iqr_s"] / r["below_median_s"])
        pays = ratio > 1 + spread and not r.get("too_busy")
        assert r["kept"] == pays, (r["name"], r["kept"], ratio, 1 + spread, r.get("too_busy"))
        if r["kept"]:
            replayed = next(x for x in ladder.RUNGS if x.name == r["name"]).on(replayed)
    assert replayed == stack, f"your stack is not the baseline plus the kept rungs: {stack} vs {replayed}"
    timed, kept = (sum(bool(r.get(k)) for r in rows[1:]) for k in ("samples_per_s", "kept"))
    print(f"the climb: {timed} rungs timed, each in one session beside the stack below and the baseline; the "
          f"keep rule replayed on each; your stack is the baseline plus the {kept} kept rungs")


def ladder_table(climbed: Mapping[str, Any], device: torch.device, model: nn.Module,
                 max_length: int) -> Table:
    """The greedy ladder, one row per rung, every number of a row from one timing session (lesson 08)."""
    table = ladder_report.ladder_table(climbed)
    table.title = f"The greedy ladder on {device} ({model.course_source} weights, {max_length} tokens)"
    return table


def ladder_chart(rows: Sequence[Mapping[str, Any]], model: nn.Module, device: torch.device) -> Figure:
    """Each timed stack's speed-up over fp32 eager, the kept rungs solid, each rung's ratio to the stack
    below written inside its bar (lesson 08)."""
    timed = [r for r in rows if "samples_per_s" in r]
    layers = model.config.num_hidden_layers
    return _ladder_chart({r["name"]: r["speedup"] for r in timed}, kept={r["name"]: r["kept"] for r in timed},
                         vs_below={r["name"]: r["vs_below"] for r in timed if r["vs_below"]},
                         title=f"{layers}-layer BERT on {device}: speed-up of each stack")


# --- FP8 beside bf16 ---------------------------------------------------------------------------------------

def fp8_loss_curves(make_model: Callable[[], nn.Module], batches: Sequence[Any], device: torch.device, *,
                    lr: float, seed: int, steps: int = 20) -> dict[str, list[float]] | None:
    """The same steps from the same weights in bf16 and in bf16 + FP8, their losses (lesson 08); None, and
    a line saying why, where FP8 does not run. Each model is let go before the next starts."""
    ok, why = fp8_supported(device)
    if not ok:
        print(f"FP8 skipped: {why}")
        return None
    curves = {}
    for name, stack in (("bf16", ladder.BASELINE.replace(precision="bf16", attn="sdpa")),
                        ("bf16 + FP8", ladder.BASELINE.replace(precision="bf16", attn="sdpa", fp8=True))):
        free_device_memory(device)
        result = train(stack.apply(make_model()), batches, TrainConfig(steps=steps, lr=lr, seed=seed,
                                                                       progress=False), device, spec=stack)
        curves[name] = result.losses
    free_device_memory(device)
    return curves


def check_fp8_curves(curves: Mapping[str, Sequence[float]] | None) -> None:
    """FP8's final loss within 10 % of bf16's first loss of bf16's final one (lesson 08)."""
    if curves is None:
        print("FP8's loss curve not checked: FP8 does not run here")
        return
    bf16, fp8 = curves["bf16"], curves["bf16 + FP8"]
    gap = abs(fp8[-1] - bf16[-1])
    assert gap <= 0.1 * max(bf16[0], 1e-3), (
        f"FP8's loss curve left bf16's: final {fp8[-1]:.4f} vs {bf16[-1]:.4f}")
    print(f"final loss: bf16 {bf16[-1]:.4f}, FP8 {fp8[-1]:.4f}: |Δ| {gap:.3f}, within 10 % of the first loss")


def loss_curves_chart(curves: Mapping[str, Sequence[float]] | None, device: torch.device) -> Figure | None:
    """bf16's and FP8's training loss per step (`fp8_loss_curves`); None when FP8 did not run (lesson 08)."""
    if curves is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, losses in curves.items():
        ax.plot(losses, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"bf16 vs FP8 on {torch.cuda.get_device_name(device)}")
    ax.legend()
    return fig


# --- the DDP rung ------------------------------------------------------------------------------------------

def ddp_rung(S: LessonSetup, stack: RunSpec, reference: nn.Module, *, model_name: str, lr: float, seed: int,
             nproc: int, peak_flops: float | None) -> dict[int, float]:
    """Your stack under DDP: `course/scripts/finetune_bert.py` launched with torchrun with one process, then
    `nproc`, on the same global batch of S.LADDER_BATCH samples per step (lesson 08). Returns processes ->
    samples/s of the whole job; empty, with a line saying why, when the rung cannot run or a launch fails.
    On a GPU the notebook's cached memory is handed back first and checked (`check_device_free`, against
    `reference`'s weights), so GPU 0 holds only this notebook's CUDA context beside the first process."""
    device, gpu = S.DEVICE, S.DEVICE.type == "cuda"
    ddp_stack = stack if gpu else stack.replace(compile=False)  # on a CPU each process would compile its own
    if gpu and torch.cuda.device_count() < nproc:
        print(f"skipped: {nproc} DDP processes need {nproc} GPUs, this machine has "
              f"{torch.cuda.device_count()}")
        return {}
    if ddp_stack.fp8:
        print("skipped: the script has no FP8 switch; your stack uses FP8")
        return {}
    if ddp_stack != stack:
        print("your stack without compile: on a CPU every process would compile its own copy")
    free_device_memory(device)  # the ladder's cached blocks back to the driver, for the rung's processes
    check_device_free(device, reference, "before the DDP rung")
    threads = max(1, (os.cpu_count() or 1) // nproc)  # one worker's share of the cores, alone or not
    scaling: dict[int, float] = {}
    for n in (1, nproc):
        out = S.WORK / f"ddp{n}.json"
        args = ["--model-name", model_name, "--max-length", S.MAX_LENGTH, "--batch-size", S.LADDER_BATCH // n,
                "--lr", lr, "--max-steps", S.DDP_STEPS, "--max-examples", 200, "--seed", seed,
                "--precision", ddp_stack.precision, "--attn", ddp_stack.attn, "--padding", ddp_stack.padding,
                "--compile" if ddp_stack.compile else "--no-compile",
                "--fused-adamw" if ddp_stack.fused_adamw else "--no-fused-adamw",
                "--device", device.type, "--peak-flops", peak_flops or 0, "--results-json", out]
        try:
            result = launch(script("finetune_bert"), [str(a) for a in args], nproc_per_node=n,
                            timeout_s=S.DDP_TIMEOUT_S, echo=False, env={"OMP_NUM_THREADS": str(threads)})
        except LaunchError as err:  # say why, and go on without the rung: no later cell needs it
            print(f"the launch with {n} process(es) failed, so the ladder ends one rung early:\n{err}")
            return {}
        row = json.loads(out.read_text())
        scaling[n] = row["samples_per_s"]
        print(f"{n} process(es) on {row['device']}, {threads} thread(s) each: {row['samples_per_s']:.2f} "
              f"samples/s (the whole job, {S.DDP_STEPS - 1} timed steps of {S.LADDER_BATCH}); torchrun took "
              f"{result.seconds:.0f} s")
    return scaling


def ladder_texts(train: TextExamples, tokenizer: Any, S: LessonSetup) -> TokenizedDataset:
    """The training articles the ladder times, tokenised and cut at S.MAX_LENGTH: the articles themselves,
    or where S.LADDER_TEXTS says "headlines" (the smoke profile) each one's headline and first sentence
    (lesson 06's `short_texts`), whose lengths spread under the window (lesson 08)."""
    if S.LADDER_TEXTS not in ("articles", "headlines"):
        raise ValueError(f"LADDER_TEXTS must be 'articles' or 'headlines', got {S.LADDER_TEXTS!r}")
    return tokenize(short_texts(train) if S.LADDER_TEXTS == "headlines" else train, tokenizer,
                    max_length=S.MAX_LENGTH)


# --- the final model ---------------------------------------------------------------------------------------

def training_subset(train: TokenizedDataset, n: int, seed: int) -> TokenizedDataset:
    """A random subset of `n` articles of the training split (all of them when n is 0) (lesson 08)."""
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()
    chosen = order[:n] if n else order
    return TokenizedDataset([train.input_ids[i] for i in chosen], [train.labels[i] for i in chosen])


def check_accuracy(accuracy: float, pretrained: bool, at_least: float = 0.90) -> None:
    """The fine-tuned model's test accuracy reaches `at_least`, when it started from pretrained weights
    (lesson 08); from random weights it is reported, never checked."""
    if not pretrained:
        print("accuracy not checked: the model started from RANDOM weights (no pretrained checkpoint here)")
        return
    assert accuracy >= at_least, (
        f"test accuracy {accuracy:.3f} < {at_least:.2f} after fine-tuning a pretrained model")
    print(f"test accuracy {accuracy:.1%} ≥ {at_least:.0%}")


def check_recall(matrix: Sequence[Sequence[int]], names: Sequence[str], pretrained: bool) -> dict[str, float]:
    """Each class's recall from a confusion matrix (rows: true classes); at least 0.5 for every class when the
    model started from pretrained weights: a model that ignores a class can still score well overall
    (lesson 08). Returns the recalls."""
    recall = {name: matrix[i][i] / max(sum(matrix[i]), 1) for i, name in enumerate(names)}
    print("recall per class: " + ", ".join(f"{n} {100 * r:.0f} %" for n, r in recall.items()))
    if pretrained:
        assert min(recall.values()) >= 0.5, f"a class is mostly missed: {recall}"
    return recall


def check_reloaded(reference: nn.Module, loaded: nn.Module, batch: Mapping[str, torch.Tensor]) -> None:
    """The model loaded back from disk gives identical logits to the one saved, not merely close ones
    (lesson 08)."""
    with torch.no_grad():
        same = torch.equal(reference(**batch).logits, loaded(**batch).logits)
    assert same, "the reloaded model's logits differ from the saved model's"
    print("reloaded: identical logits")


def class_table(splits: Any) -> Table:
    """Articles per class in each split (lesson 08)."""
    table = Table(["class", "train", "val", "test"], title=f"articles per class ({splits.source})")
    for i, name in enumerate(splits.label_names):
        table.add(name, *(getattr(splits, s).labels.count(i) for s in ("train", "val", "test")))
    return table


def clean_up(work: Path, device: torch.device | str) -> None:
    """The lesson's work folder removed (checkpoints, the saved model: hundreds of MB) and the device's
    cached memory handed back, so that a second Run All starts as the first did (lesson 08)."""
    free_device_memory(device)
    shutil.rmtree(work, ignore_errors=True)
    print(f"removed the work folder {work.name}; the device's cache handed back")


# --- the recorded results (benchmarks/results/ of the course's repository) ----------------------------------

def _results() -> Path | None:
    """benchmarks/results/ of the course's repository; None in an installed course."""
    root = checkout_root()
    return root / "benchmarks" / "results" if root is not None else None


def check_recorded_comparison(vs: Mapping[str, Any]) -> None:
    """The recorded comparison's medians and verdict follow from its runs: 3 seeds or more, the two arms
    interleaved, each median that of the runs, the time ratio the median of the paired ratios (lesson 08)."""
    runs, summary = vs["runs"], vs["comparison"]["summary"]
    arms = [r["arm"] for r in runs]
    assert arms == ["course", "trainer"] * (len(arms) // 2) and len(arms) >= 6, "3+ seeds, arms interleaved"
    for arm in ("course", "trainer"):  # the recorded medians are those of the recorded runs
        for key in ("train_s", "samples_per_s", "val_accuracy", "test_accuracy"):
            median = statistics.median(r[key] for r in runs if r["arm"] == arm)
            assert abs(median - summary[arm][key]["median"]) <= 1e-9 * max(1.0, median), (arm, key)
    ratios = [t["train_s"] / c["train_s"] for c, t in zip(runs[::2], runs[1::2])]
    assert abs(statistics.median(ratios) - vs["comparison"]["ratio"]) < 1e-9, "paired time ratios"
    print(f"the recorded comparison follows from its {len(arms) // 2} seeds: medians, paired time ratio")


def recorded_comparison(device: torch.device, this_run: Mapping[str, Any]) -> Table | None:
    """The recorded comparison of the course's recipe with Hugging Face's Trainer
    (benchmarks/capstone_vs_trainer.py), checked, beside this run's final model (`this_run`: recipe, seconds,
    test_accuracy); None, with a line saying where the results are, in an installed course (lesson 08)."""
    results = _results()
    if results is None:
        print(f"the recorded results are in the course's repository, benchmarks/results/: {RESULTS_URL}")
        return None
    vs_file = next((p for p in (results / f"capstone-vs-trainer-{slug(device)}.json",
                                results / "capstone-vs-trainer-cpu.json") if p.is_file()), None)
    if vs_file is None:
        print("no recorded comparison: pip install accelerate, then python benchmarks/capstone_vs_trainer.py")
        return None
    vs = json.loads(vs_file.read_text())
    check_recorded_comparison(vs)
    summary, stamp, cfg, hf, verdict = (vs["comparison"]["summary"], vs["stamp"], vs["course_config"],
                                        vs["trainer_defaults"], vs["comparison"])

    def cell(arm: str, key: str, pct: bool = False) -> str:
        s = summary[arm][key]
        f = (lambda v: f"{100 * v:.2f} %") if pct else (lambda v: f"{v:.1f}")
        return f"{f(s['median'])} ({f(s['min'])} – {f(s['max'])})"

    table = Table(["run", "recipe", "training s", "val accuracy", "test accuracy"],
                  title=f"{vs_file.name}: medians over {len(vs['runs']) // 2} seeds (min – max), "
                        f"{stamp['device']}, {stamp['threads']} thread(s), {stamp['date'][:10]}")
    recipes = {"course": f"batch {cfg['batch_size']}, lr {cfg['lr']:g} {cfg['lr_schedule']}, "
                         f"warm-up {cfg['warmup_frac']:g}, {cfg['spec']['padding']} padding",
               "trainer": f"batch {hf['batch_size']}, lr {hf['learning_rate']:g} {hf['lr_scheduler']}, "
                          f"warm-up {hf['warmup']}"}
    names = {"course": "course recipe (the script's defaults)", "trainer": "Trainer (its defaults)"}
    for arm in ("course", "trainer"):
        table.add(names[arm], recipes[arm], cell(arm, "train_s"), cell(arm, "val_accuracy", True),
                  cell(arm, "test_accuracy", True))
    table.add("this lesson's final model (one run)", this_run["recipe"], f"{this_run['seconds']:.1f}", "–",
              f"{100 * this_run['test_accuracy']:.2f} %")
    print(f"recorded verdict: the course's recipe is {verdict['time']} (trainer s / course s: median "
          f"{verdict['ratio']:.3f}, noise {100 * verdict['noise']:.1f} %) and "
          f"{verdict['accuracy']['test_accuracy']} on test "
          f"({100 * verdict['accuracy_difference']['test_accuracy']:+.2f} points, seeds' spread "
          f"{100 * verdict['accuracy_noise']['test_accuracy']:.2f})")
    return table


def recorded_runs() -> None:
    """One line per recorded full CPU fine-tuning (course/scripts/finetune_bert.py's default run and the same
    run with a constant learning rate), or where the results are (lesson 08)."""
    results = _results()
    if results is None:
        print(f"the recorded full runs are in the course's repository, benchmarks/results/: {RESULTS_URL}")
        return
    recorded = results / "ladder-cpu-finetune.json"
    if not recorded.is_file():
        print("no recorded full run: python course/scripts/finetune_bert.py --tfidf-baseline --results-json "
              "benchmarks/results/ladder-cpu-finetune.json")
        return
    rec = json.loads(recorded.read_text())
    cfg = rec["config"]
    print(f"recorded full CPU run ({rec['model_source']} model, {rec['steps']} steps of {cfg['batch_size']}, "
          f"{cfg['max_length']} tokens, lr {cfg['lr']:g}, schedule {cfg.get('lr_schedule', 'constant')}, "
          f"{cfg.get('padding') or cfg['spec']['padding']} padding): test accuracy "
          f"{100 * rec['test_accuracy']:.1f} % (TF-IDF + logistic regression: "
          f"{100 * rec['tfidf_test_accuracy']:.1f} %), training took {rec['train_s']:.0f} s")
    constant = results / "ladder-cpu-finetune-constant.json"
    if constant.is_file():
        print(f"the same run with a constant lr: test accuracy "
              f"{100 * json.loads(constant.read_text())['test_accuracy']:.1f} %")


# --- what we measured ----------------------------------------------------------------------------------

def summary_table(climbed: Mapping[str, Any], *, device: torch.device, profile: str,
                  ddp_scaling: Mapping[int, float], ddp_procs: int, test_acc: float, const_acc: float,
                  final_s: float, pretrained: bool) -> MeasuredTable:
    """"What we measured on this machine": each rung's decision, your stack against fp32 eager, DDP's
    scaling efficiency, the final model; next to the claims. Once the ladder found the machine too busy to
    judge a rung, no timing verdict: "too busy to judge" (lesson 08)."""
    gpu = device.type == "cuda"
    busy_rungs = climbed.get("too_busy") or []
    state = Busy(None, signs=(f"the ladder was too busy to judge {', '.join(busy_rungs)}",)) if busy_rungs \
        else None
    efficiency = (ddp_scaling[ddp_procs] / (ddp_procs * ddp_scaling[1])
                  if {1, ddp_procs} <= set(ddp_scaling) else None)
    summary = MeasuredTable(f"Lesson 08 on {device}, {profile} profile")
    for r in climbed["rows"][1:]:  # the greedy rule's decisions, next to what is claimed for each rung
        summary.add(f"{r['name']}: speed vs the stack it was added to",
                    f"{r['vs_below']:.2f}x, {'kept' if r['kept'] else 'dropped'}" if "samples_per_s" in r
                    else "not measured", f"{r['claim']}; here: {r['why']}")
    yours = climbed["your_stack_vs_baseline"]  # your stack and fp32 eager, timed again side by side
    summary.add(f"your stack (the kept rungs, up to {yours['name']}) / fp32 eager, timed side by side",
                yours["speedup"], CLAIMS["bert-stack"],
                why="" if gpu else "measured on a CPU", busy=state)
    summary.add(f"DDP, {ddp_procs} processes: scaling efficiency (same stack, 1 vs {ddp_procs})", efficiency,
                "N processes give ~N x the throughput: ≥ 0.8", rule=AtLeast(0.8),
                needs=f"{ddp_procs} GPUs (step 3's DDP rung)", busy=state,
                why="" if gpu or state else "the processes split this CPU's cores")
    summary.add("final model: test accuracy (your stack, warm-up + linear decay)",
                test_acc if pretrained else None, "≥ 0.90: the lesson's bar on a CPU", rule=AtLeast(0.90),
                needs="pretrained weights")
    summary.add("…the same run with a constant lr after the warm-up", const_acc)
    summary.add("…training time of the final model, s", final_s)
    return summary


def story_table(n_train: int, climbed: Mapping[str, Any], device: torch.device) -> Table:
    """The claim's story, 68 h → 5.2 h → 2.1 h, rescaled to this machine's own baseline: hours per epoch of
    the whole corpus (lesson 08)."""
    gpu = device.type == "cuda"
    yours = climbed["your_stack_vs_baseline"]
    base_h = n_train / yours.get("baseline_samples_per_s", climbed["rows"][0]["samples_per_s"]) / 3600
    best_h = n_train / yours["samples_per_s"] / 3600
    start = 5.2 if gpu else 68.0
    story = Table(["step of the story", "claimed hours", "claimed speed-up",
                   "claim rescaled to this machine, h", "measured here, h"],
                  title=f"68 h → 5.2 h → 2.1 h, rescaled (one epoch of {n_train} articles)")
    story.add("one GPU, fp32" if gpu else "CPU, fp32", start, "1x", base_h, base_h)
    if not gpu:
        story.add("one GPU (RTX 3090)", 5.2, f"{68 / 5.2:.1f}x", base_h * 5.2 / 68, "needs a GPU")
    story.add("mixed precision + DDP", 2.1, f"{start / 2.1:.1f}x", base_h * 2.1 / start,
              f"{best_h:.3g} (your stack)")
    return story
