"""Mixed precision and torch.compile on a GPU: the measurements lessons 02-05 cannot make on a CPU.

For each workload, every precision the device supports (fp32, tf32, fp16 + GradScaler, bf16) trains the
same model from the same initial weights on the same batches with `helpers.train.loop.train`; then bf16 is
trained once more with each Transformer layer under `torch.compile` (regional compilation, lesson 05;
first workload, on a GPU or with --compile). Reported per run:

- median step time after the first step (CUDA events), tokens/s, and the speed-up over fp32;
- peak memory (`torch.cuda.max_memory_allocated`) and its ratio to fp32's;
- for the compiled run: the first step (compilation) apart, the steady speed-up over bf16 eager;
- the training-memory estimate (`helpers.measure.memory.estimate_training_memory`) for the small Transformer;
- MFU against `helpers.measure.roofline.peak_flops` (via `helpers.train.loop`).

Workloads, in the order they run: `hf-bert`, Hugging Face's BertForSequenceClassification in BERT-base's
shape with RANDOM weights (speed does not depend on the values; no download), batch 32 × 512 tokens; the
course's small Transformer wide (d_model 4096, docs/claims.md#c3); at lesson 02's full size; in BERT-base's
shape.
The GPU targets (issue 11) are held against the first: bf16 ≥ 2.5× fp32's speed at ≤ 60 % of its peak
memory; compiled bf16 ≥ 1.3× bf16 eager.

Correct before fast: every run must start from fp32's first loss within 2 % and end within 10 % (of the
start) of fp32's last loss, or it is marked wrong and the script exits with status 1.

A run that runs out of memory (BERT-base at batch 32 x 512 in fp32 does on a 15 GB T4) is reported with the
memory it asked for and what the GPU held (`helpers.core.diagnosis.OOMReport`), its memory is handed back, and
the next run goes on; the runs after an fp32 that did not fit have no baseline to be compared with.

`--time-budget` bounds a run: a run (after the first workload's fp32 baseline) that would start after the
budget is spent is reported "not run", never guessed. The JSON and Markdown are written after every run
(the figure after every workload), so a run stopped from outside keeps every arm that finished.

    python benchmarks/mixed_precision_gpu.py            # on a CUDA GPU: writes benchmarks/results/
    python benchmarks/mixed_precision_gpu.py --smoke    # tiny sizes, runs anywhere (CPU too), writes build/

Writes `mixed_precision-<slug>[-smoke].json`, `.md` and `.png` through `course.results`.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from course.results import stamp, write_results
from helpers.core.device import get_device
from helpers.core.diagnosis import OOMReport
from helpers.core.precision import PRECISIONS, check_precision

HERE = Path(__file__).resolve().parent
TARGETS = dict(bf16_speedup=2.5, bf16_memory=0.60, compile_speedup=1.3)  # issue 11, for the first workload


def workloads(smoke: bool) -> dict[str, dict[str, Any]]:
    """The models and batch shapes to measure: tiny with `smoke`, the real ones otherwise."""
    if smoke:
        return {
            "hf-bert": dict(kind="hf", model=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                  intermediate_size=128, vocab_size=512), batch=2, seq=64,
                            steps=3),
            "wide": dict(kind="small", model=dict(d_model=128, n_heads=2, n_layers=1, vocab_size=256),
                         batch=2, seq=32, steps=3),
            "small": dict(kind="small", model=dict(d_model=64, n_heads=2, n_layers=2, vocab_size=256),
                          batch=4, seq=32, steps=4),
            "bert-shape": dict(kind="small", model=dict(d_model=64, n_heads=2, n_layers=2, vocab_size=512,
                                                        n_classes=2, dropout=0.1), batch=2, seq=64, steps=3),
        }
    return {
        "hf-bert": dict(kind="hf", model=dict(), batch=32, seq=512, steps=20),  # BertConfig() = BERT-base
        "wide": dict(kind="small", model=dict(d_model=4096, n_heads=32, n_layers=4, vocab_size=8192),
                     batch=8, seq=512, steps=15),
        "small": dict(kind="small", model=dict(d_model=512, n_heads=8, n_layers=8, vocab_size=8192),
                      batch=32, seq=512, steps=30),
        "bert-shape": dict(kind="small", model=dict(d_model=768, n_heads=12, n_layers=12, d_ff=3072,
                                                    vocab_size=30522, n_classes=2, dropout=0.1),
                           batch=32, seq=512, steps=20),
    }


def _build(spec: dict[str, Any]) -> torch.nn.Module:
    if spec["kind"] == "hf":
        from transformers import BertConfig, BertForSequenceClassification

        return BertForSequenceClassification(BertConfig(**spec["model"], attn_implementation="sdpa"))
    from helpers.model.models import SmallTransformer, TransformerConfig

    return SmallTransformer(TransformerConfig(max_len=spec["seq"], **spec["model"]))


def _batch_fn(spec: dict[str, Any]) -> Callable[[int, int], dict[str, torch.Tensor]]:
    from helpers.data.synthetic import synthetic_batch_fn

    vocab = spec["model"].get("vocab_size", 30522)
    tokens = synthetic_batch_fn(vocab, spec["batch"], spec["seq"], seed=0)
    classify = spec["kind"] == "hf" or spec["model"].get("n_classes", 0)

    def batch_fn(step: int, micro: int) -> dict[str, torch.Tensor]:
        b = tokens(step, micro)
        if classify:  # a sequence label: is the first token in the lower half of the vocabulary?
            b["labels"] = (b["input_ids"][:, 0] < vocab // 2).long()
        return b

    return batch_fn


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _run(name: str, spec: dict[str, Any], precision: str, device: torch.device, init: dict[str, torch.Tensor],
         *, compiled: bool = False) -> dict[str, Any]:
    """One training run from the weights `init`; a row of the results."""
    from helpers.measure.memory import estimate_training_memory
    from helpers.model.models import TransformerConfig
    from helpers.train.loop import TrainConfig, train
    from helpers.train.runspec import RunSpec

    row: dict[str, Any] = dict(workload=name, precision=precision, compiled=compiled)
    try:
        check_precision(precision, device)
    except ValueError as err:
        return {**row, "skipped": str(err)}
    model = _build(spec)
    model.load_state_dict(init)  # every arm starts from the same weights
    # compiled: each Transformer layer under torch.compile (regional compilation, lesson 05), as RunSpec does
    run_spec = RunSpec(precision=precision, compile=compiled)
    runner = run_spec.apply(model)
    cfg = TrainConfig(steps=spec["steps"], lr=1e-4, progress=False)
    oom = None
    try:
        r = train(runner, _batch_fn(spec), cfg, device=device, spec=run_spec)
    except Exception as err:  # noqa: BLE001 - out-of-memory is told apart here, the rest is raised
        oom = OOMReport.parse(err)
        if oom is None:
            raise
    if oom is not None:  # out of the except block: the error's traceback (and the tensors it pins) is gone
        del model, runner
        _release(device)
        print(f"{name:>10} {precision:>13}: {oom}", flush=True)
        return {**row, "skipped": str(oom), "oom": dataclasses.asdict(oom)}
    median = statistics.median(r.step_times_s[1:])
    estimate = None
    if spec["kind"] == "small":
        estimate = estimate_training_memory(TransformerConfig(max_len=spec["seq"], **spec["model"]),
                                            spec["batch"], spec["seq"], precision=precision).peak
    row.update(params=sum(p.numel() for p in model.parameters()), batch=spec["batch"], seq=spec["seq"],
               steps=spec["steps"], median_step_s=median, first_step_s=r.step_times_s[0],
               step_times_s=r.step_times_s,
               tokens_per_s=r.tokens_per_s, peak_memory_bytes=r.peak_memory_bytes,
               memory_method=r.memory_method, estimate_bytes=estimate, mfu=r.mfu, peak_source=r.peak_source,
               first_loss=r.losses[0], last_loss=r.losses[-1], skipped_steps=len(r.skipped_steps))
    label = f"{precision}{' compiled' if compiled else ''}"
    print(f"{name:>10} {label:>13}: {median * 1e3:9.2f} ms/step (first {r.step_times_s[0]:.2f} s), "
          f"peak {(r.peak_memory_bytes or 0) / 2**20:9.1f} MiB, loss {r.losses[0]:.3f} -> {r.losses[-1]:.3f}",
          flush=True)
    del model, runner, r
    _release(device)
    return row


def run_workload(name: str, spec: dict[str, Any], device: torch.device, *, with_compile: bool = False,
                 deadline: float | None = None,
                 on_row: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Train `spec` in every precision the device can run (and compiled bf16); one row per run. Runs
    after fp32's that would start past `deadline` (a `time.monotonic()` value) are reported not run;
    `on_row(rows so far)` after each run, its comparisons filled in."""
    from helpers.core.seeding import seed_everything

    seed_everything(0)
    init = {k: v.clone() for k, v in _build(spec).state_dict().items()}
    arms = [(precision, False) for precision in PRECISIONS] + ([("bf16", True)] if with_compile else [])
    rows: list[dict[str, Any]] = []
    for precision, compiled in arms:
        if rows and deadline is not None and time.monotonic() > deadline:
            rows.append(dict(workload=name, precision=precision, compiled=compiled,
                             skipped="not run: the time budget was spent"))
        else:
            rows.append(_run(name, spec, precision, device, init, compiled=compiled))
        _compare(rows)
        if on_row is not None:
            on_row(rows)
    return rows


def _compare(rows: list[dict[str, Any]]) -> None:
    """Fill in each run's speed-up, memory ratio and correctness against fp32's (and compiled bf16's
    against bf16 eager), as far as they have run."""
    done = [r for r in rows if "skipped" not in r]
    base = next((r for r in done if r["precision"] == "fp32" and not r["compiled"]), None)
    eager_bf16 = next((r for r in done if r["precision"] == "bf16" and not r["compiled"]), None)
    for row in done:
        if base is None:
            continue
        row["speedup_vs_fp32"] = base["median_step_s"] / row["median_step_s"]
        if row["peak_memory_bytes"] and base["peak_memory_bytes"]:
            row["memory_vs_fp32"] = row["peak_memory_bytes"] / base["peak_memory_bytes"]
        # same start as fp32 (2 %), and the same trajectory (within 10 % of the start after the run)
        row["correct"] = (abs(row["first_loss"] - base["first_loss"]) <= 0.02 * base["first_loss"]
                          and abs(row["last_loss"] - base["last_loss"]) <= 0.1 * base["first_loss"])
        if row["compiled"] and eager_bf16 is not None:
            row["speedup_vs_bf16_eager"] = eager_bf16["median_step_s"] / row["median_step_s"]
            # compiling (and any recompiling) makes a step slow: the time of steps >= 3x the median,
            # beyond the median
            row["compile_s"] = sum(t - row["median_step_s"] for t in row["step_times_s"]
                                   if t >= 3 * row["median_step_s"])


def targets(rows: list[dict[str, Any]], workload: str, device_type: str = "cuda") -> list[dict[str, Any]]:
    """The issue's GPU targets against what `workload` measured: value, target, and the verdict (on a
    device other than a GPU the values are shown but not held against the targets)."""
    def find(precision: str, compiled: bool) -> dict[str, Any] | None:
        return next((r for r in rows if r["workload"] == workload and r["precision"] == precision
                     and r["compiled"] == compiled and "skipped" not in r), None)

    bf16, comp = find("bf16", False), find("bf16", True)
    checks = [("bf16 speed-up over fp32", bf16 and bf16.get("speedup_vs_fp32"),
               TARGETS["bf16_speedup"], ">="),
              ("bf16 peak memory / fp32's", bf16 and bf16.get("memory_vs_fp32"),
               TARGETS["bf16_memory"], "<="),
              ("compiled bf16 speed-up over bf16 eager", comp and comp.get("speedup_vs_bf16_eager"),
               TARGETS["compile_speedup"], ">=")]
    out = []
    for what, value, target, op in checks:
        if value is None:
            verdict = "not measured"
        elif device_type != "cuda":
            verdict = f"not a GPU ({device_type}): not held against the target"
        elif (value >= target) if op == ">=" else (value <= target):
            verdict = "met"
        else:
            verdict = f"missed by {abs(value - target) / target:.0%}"
        out.append(dict(check=what, value=value, target=f"{op} {target}", verdict=verdict))
    return out


def _fmt(v: Any, spec: str = ".3g") -> str:
    return "–" if v is None else format(v, spec)


def to_markdown(rows: list[dict[str, Any]], run_stamp: dict[str, Any], profile: str,
                checks: list[dict[str, Any]]) -> str:
    """The results as a Markdown table, headed by the device, versions and date."""
    s = run_stamp
    lines = [f"# Mixed precision on {s['device']}", "",
             f"torch {s['torch']}, CUDA {s['cuda']}, driver {s['driver']}, transformers {s['transformers']}, "
             f"{s['date']}, profile {profile}. Random weights (speed does not depend on them); every run "
             "starts from the same weights and trains on the same batches.", "",
             "| workload | precision | compiled | ms/step | tokens/s | speed-up vs fp32 | peak MiB "
             "| memory vs fp32 | estimate / measured | MFU | first step s | correct |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        comp = "yes" if r["compiled"] else "no"
        if "skipped" in r:
            lines.append(f"| {r['workload']} | {r['precision']} | {comp} | skipped: {r['skipped'][:120]} "
                         "||||||||| |")
            continue
        est = (r["estimate_bytes"] / r["peak_memory_bytes"]
               if r.get("estimate_bytes") and r["peak_memory_bytes"] else None)
        mfu = f"{r['mfu'] * 100:.1f} %" if r["mfu"] is not None else "–"
        peak = f"{r['peak_memory_bytes'] / 2**20:,.1f}" if r["peak_memory_bytes"] else "–"
        lines.append(f"| {r['workload']} | {r['precision']} | {comp} | {r['median_step_s'] * 1e3:.2f} "
                     f"| {r['tokens_per_s']:,.0f} | {_fmt(r.get('speedup_vs_fp32'), '.2f')} | {peak} "
                     f"| {_fmt(r.get('memory_vs_fp32'), '.2f')} | {_fmt(est, '.2f')} | {mfu} "
                     f"| {r['first_step_s']:.2f} | {'yes' if r.get('correct') else 'NO'} |")
    compiled = [r for r in rows if r["compiled"] and "compile_s" in r]
    if compiled:
        lines += ["", "Regional compilation (each Transformer layer); compiling, left out of the times "
                      "(steps at least 3x the median, beyond the median): "
                  + ", ".join(f"{r['workload']} {r['compile_s']:.1f} s" for r in compiled)]
    lines += ["", f"## GPU targets ({rows[0]['workload'] if rows else '–'})", "",
              "| check | measured | target | verdict |", "|---|---|---|---|"]
    lines += [f"| {c['check']} | {_fmt(c['value'], '.2f')} | {c['target']} | {c['verdict']} |"
              for c in checks]
    return "\n".join(lines) + "\n"


def _figure(rows: list[dict[str, Any]], workload: str) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from course.plots import bar_chart

    times = {f"{r['precision']}{' compiled' if r['compiled'] else ''}": r["median_step_s"] * 1e3
             for r in rows if r["workload"] == workload and "skipped" not in r}
    if not times:
        return None
    return bar_chart(times, title=f"{workload}: median step time", ylabel="ms per step",
                     baseline="fp32" if "fp32" in times else None)


def main(argv: list[str] | None = None) -> int:
    """Run the workloads within the time budget, print the table, write JSON, Markdown and PNG."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes that run on a CPU in seconds")
    parser.add_argument("--device", default="auto", help="auto, cuda, cuda:1 or cpu")
    parser.add_argument("--only", nargs="*", default=None, help="workload names to run (default: all)")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile run")
    parser.add_argument("--compile", action="store_true", help="the torch.compile run on a CPU too")
    parser.add_argument("--time-budget", type=float, default=75.0,
                        help="seconds; runs that would start later are not run (default 75). A call takes "
                             "the budget plus start-up plus the run under way when it ends; the compiled run "
                             "includes compiling (25 s for the smoke model on a 2-core CPU; not yet measured "
                             "on a GPU): leave a caller's time limit that margin, or --no-compile")
    parser.add_argument("--out", default=None, help="folder for the results (default: benchmarks/results, "
                                                   "or build/ with --smoke)")
    args = parser.parse_args(argv)

    device = get_device(args.device)
    if device.type != "cuda" and not args.smoke:
        print("no CUDA GPU: this script measures GPUs; run with --smoke to check it works on this machine")
        return 2
    specs = workloads(args.smoke)
    if args.only:
        unknown = set(args.only) - set(specs)
        if unknown:
            parser.error(f"unknown workload(s) {sorted(unknown)}: choose from {sorted(specs)}")
        specs = {k: v for k, v in specs.items() if k in args.only}
    start = time.monotonic()
    deadline = start + args.time_budget
    out = Path(args.out) if args.out else (HERE.parent / "build" if args.smoke else HERE / "results")
    profile, first = "smoke" if args.smoke else "full", next(iter(specs))
    rows: list[dict[str, Any]] = []  # every finished workload's
    run_stamp = stamp(device)  # taken again after each workload (its date and load average)

    def write(current: list[dict[str, Any]], figure: bool) -> tuple[str, dict[str, Path]]:
        """JSON and Markdown of every run so far (and the figure): a run stopped from outside keeps them."""
        every = rows + current
        checks = targets(every, first, device.type)
        table = to_markdown(every, run_stamp, profile, checks)
        payload = dict(stamp=run_stamp, profile=profile, targets=TARGETS, checks=checks, rows=every,
                       seconds=time.monotonic() - start)
        fig = _figure(every, first) if figure else None
        paths = write_results("mixed_precision", payload, table, fig=fig, out_dir=out,
                              variant="smoke" if args.smoke else "")
        if fig is not None:
            import matplotlib.pyplot as plt

            plt.close(fig)
        return table, paths

    for i, (wname, spec) in enumerate(specs.items()):
        if i and time.monotonic() > deadline:
            rows.append(dict(workload=wname, precision="all", compiled=False,
                             skipped=f"not run: the {args.time_budget:.0f} s time budget was spent"))
            continue
        # compiled bf16 for the first workload, on a GPU (a CPU compiles for tens of seconds: --compile)
        compiled = i == 0 and not args.no_compile and (device.type == "cuda" or args.compile)
        rows += run_workload(wname, spec, device, with_compile=compiled, deadline=deadline,
                             on_row=lambda current: write(current, figure=False))
        run_stamp = stamp(device)
    table, paths = write([], figure=True)
    print(table)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    wrong = [f"{r['workload']}/{r['precision']}" for r in rows if r.get("correct") is False]
    if wrong:
        print(f"WRONG (did not match fp32's first loss or did not learn): {wrong}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
