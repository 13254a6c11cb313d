"""Mixed precision and memory on a GPU: the measurements lessons 02 and 03 cannot make on a CPU.

For each workload, every precision the device supports (fp32, tf32, fp16 + GradScaler, bf16) trains the
same model on the same batches with `helpers.train.train`, and the script reports:

- median step time after warm-up, tokens/s and the speed-up over fp32 (claims 2 and 3: "1.5–2.3×",
  "more than 2× on LLaMA-class models");
- peak memory (`torch.cuda.max_memory_allocated`) and the saving over fp32 (claim 2: "~40 % less");
- the training-memory estimator (`helpers.memory.estimate_training_memory`) against that peak;
- MFU against the datasheet peak of the GPU (`helpers.flops`), when the GPU is in the table.

Workloads: the course's small Transformer (lesson 02's full size), the same model wide (d_model 4096,
claim 3), a SmallTransformer of BERT-base's shape, and Hugging Face's BertForSequenceClassification
with BERT-base's configuration (random weights: no download), batch x 512 tokens.

Correct before fast: every precision must start from fp32's first loss within 2 % and end within 10 %
(of the start) of fp32's last loss, or the row is marked wrong and the script exits with status 1.

    python benchmarks/mixed_precision_gpu.py            # on a CUDA GPU: writes benchmarks/results/
    python benchmarks/mixed_precision_gpu.py --smoke    # tiny sizes, runs anywhere (CPU too), writes build/

Writes `mixed_precision-<device>.json` and `.md` into `--out`, stamped with device, versions and date.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import platform
import re
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file from anywhere: make `helpers` importable
    sys.path.insert(0, str(ROOT))

__all__ = ["workloads", "run_workload", "to_markdown", "main"]


def workloads(smoke: bool) -> dict[str, dict[str, Any]]:
    """The models and batch shapes to measure: tiny with `smoke`, the real ones otherwise."""
    if smoke:
        return {
            "small": dict(kind="small", model=dict(d_model=64, n_heads=2, n_layers=2, vocab_size=256),
                          batch=4, seq=32, steps=4),
            "wide": dict(kind="small", model=dict(d_model=128, n_heads=2, n_layers=1, vocab_size=256),
                         batch=2, seq=32, steps=3),
            "bert-shape": dict(kind="small", model=dict(d_model=64, n_heads=2, n_layers=2, vocab_size=512,
                                                        n_classes=2, dropout=0.1), batch=2, seq=64, steps=3),
            "hf-bert": dict(kind="hf", model=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                  intermediate_size=128, vocab_size=512), batch=2, seq=64,
                            steps=3),
        }
    return {
        "small": dict(kind="small", model=dict(d_model=512, n_heads=8, n_layers=8, vocab_size=8192),
                      batch=32, seq=512, steps=30),
        "wide": dict(kind="small", model=dict(d_model=4096, n_heads=32, n_layers=4, vocab_size=8192),
                     batch=8, seq=512, steps=15),
        "bert-shape": dict(kind="small", model=dict(d_model=768, n_heads=12, n_layers=12, d_ff=3072,
                                                    vocab_size=30522, n_classes=2, dropout=0.1),
                           batch=32, seq=512, steps=20),
        "hf-bert": dict(kind="hf", model=dict(), batch=32, seq=512, steps=20),  # BertConfig() = BERT-base
    }


def _build(spec: dict[str, Any]) -> torch.nn.Module:
    if spec["kind"] == "hf":
        from transformers import BertConfig, BertForSequenceClassification

        return BertForSequenceClassification(BertConfig(**spec["model"], attn_implementation="sdpa"))
    from helpers.models import SmallTransformer, TransformerConfig

    return SmallTransformer(TransformerConfig(max_len=spec["seq"], **spec["model"]))


def _batch_fn(spec: dict[str, Any]):
    from helpers.train import synthetic_batch_fn

    vocab = spec["model"].get("vocab_size", 30522)
    tokens = synthetic_batch_fn(vocab, spec["batch"], spec["seq"], seed=0)
    classify = spec["kind"] == "hf" or spec["model"].get("n_classes", 0)

    def batch_fn(step: int, micro: int) -> dict[str, torch.Tensor]:
        b = tokens(step, micro)
        if classify:  # a sequence label: is the first token in the lower half of the vocabulary?
            b["labels"] = (b["input_ids"][:, 0] < vocab // 2).long()
        return b

    return batch_fn


def run_workload(name: str, spec: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    """Train `spec` in every precision the device can run; one row per precision."""
    from helpers.config import seed_everything
    from helpers.memory import estimate_training_memory
    from helpers.models import TransformerConfig
    from helpers.train import PRECISIONS, TrainConfig, check_precision, train

    rows: list[dict[str, Any]] = []
    batch_fn = _batch_fn(spec)
    for precision in PRECISIONS:
        try:
            check_precision(precision, device)
        except ValueError as err:
            rows.append(dict(workload=name, precision=precision, skipped=str(err)))
            continue
        seed_everything(0)
        model = _build(spec)
        n_params = sum(p.numel() for p in model.parameters())
        cfg = TrainConfig(steps=spec["steps"], lr=1e-4, precision=precision, progress=False)
        try:
            r = train(model, batch_fn, cfg, device=device)
        except torch.cuda.OutOfMemoryError as err:
            rows.append(dict(workload=name, precision=precision, skipped=f"out of memory: {err}"[:200]))
            del model
            gc.collect()
            torch.cuda.empty_cache()
            continue
        estimate = None
        if spec["kind"] == "small":
            estimate = estimate_training_memory(TransformerConfig(max_len=spec["seq"], **spec["model"]),
                                                spec["batch"], spec["seq"], precision=precision).peak
        rows.append(dict(workload=name, precision=precision, params=n_params, batch=spec["batch"], seq=spec["seq"],
                         steps=spec["steps"], median_step_s=statistics.median(r.step_times_s[1:]),
                         tokens_per_s=r.tokens_per_s, peak_memory_bytes=r.peak_memory_bytes,
                         memory_method=r.memory_method, estimate_bytes=estimate, mfu=r.mfu,
                         first_loss=r.losses[0], last_loss=r.losses[-1], skipped_steps=len(r.skipped_steps)))
        print(f"{name:>10} {precision:>4}: {rows[-1]['median_step_s'] * 1e3:9.2f} ms/step, "
              f"peak {r.peak_memory_bytes / 2**20:9.1f} MiB, loss {r.losses[0]:.3f} -> {r.losses[-1]:.3f}",
              flush=True)
        del model, r
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    base = next((row for row in rows if row["precision"] == "fp32" and "skipped" not in row), None)
    for row in rows:
        if "skipped" in row or base is None:
            continue
        row["speedup_vs_fp32"] = base["median_step_s"] / row["median_step_s"]
        row["memory_vs_fp32"] = row["peak_memory_bytes"] / base["peak_memory_bytes"]
        # same start as fp32 (2 %), and the same trajectory (within 10 % of the start after the run)
        row["correct"] = (abs(row["first_loss"] - base["first_loss"]) <= 0.02 * base["first_loss"]
                          and abs(row["last_loss"] - base["last_loss"]) <= 0.1 * base["first_loss"])
    return rows


def _fmt(v: Any, spec: str = ".3g") -> str:
    return "–" if v is None else format(v, spec)


def to_markdown(rows: list[dict[str, Any]], stamp: dict[str, str]) -> str:
    """The results as a Markdown table, headed by the device, versions and date."""
    lines = [f"# Mixed precision on {stamp['device']}", "",
             f"torch {stamp['torch']}, CUDA {stamp['cuda']}, {stamp['date']}, profile {stamp['profile']}", "",
             "| workload | precision | ms/step | tokens/s | speed-up vs fp32 | peak MiB | memory vs fp32 "
             "| estimate / measured | MFU | correct |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['workload']} | {r['precision']} | skipped: {r['skipped'][:80]} |||||||| |")
            continue
        est = r["estimate_bytes"] / r["peak_memory_bytes"] if r.get("estimate_bytes") and r["peak_memory_bytes"] else None
        lines.append(f"| {r['workload']} | {r['precision']} | {r['median_step_s'] * 1e3:.2f} | {r['tokens_per_s']:,.0f} "
                     f"| {_fmt(r.get('speedup_vs_fp32'), '.2f')} | {r['peak_memory_bytes'] / 2**20:,.1f} "
                     f"| {_fmt(r.get('memory_vs_fp32'), '.2f')} | {_fmt(est, '.2f')} "
                     f"| {_fmt(r['mfu'] * 100 if r['mfu'] is not None else None, '.1f')}{'%' if r['mfu'] else ''} "
                     f"| {'yes' if r.get('correct') else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run every workload, print the table, write JSON and Markdown."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes that run on a CPU in seconds")
    parser.add_argument("--device", default="auto", help="auto, cuda, cuda:1 or cpu")
    parser.add_argument("--only", nargs="*", default=None, help="workload names to run (default: all)")
    parser.add_argument("--out", default=None, help="folder for the results (default: benchmarks/results, "
                                                   "or build/ with --smoke)")
    args = parser.parse_args(argv)

    from helpers.hardware import get_device

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
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    stamp = dict(device=name, torch=torch.__version__, cuda=str(torch.version.cuda),
                 date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 profile="smoke" if args.smoke else "full", python=platform.python_version())
    rows: list[dict[str, Any]] = []
    for wname, spec in specs.items():
        rows += run_workload(wname, spec, device)
    out = Path(args.out) if args.out else (ROOT / ("build" if args.smoke else "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ("-smoke" if args.smoke else "")
    (out / f"mixed_precision-{slug}.json").write_text(json.dumps(dict(stamp=stamp, rows=rows), indent=2))
    table = to_markdown(rows, stamp)
    (out / f"mixed_precision-{slug}.md").write_text(table)
    print(table)
    wrong = [f"{r['workload']}/{r['precision']}" for r in rows if r.get("correct") is False]
    if wrong:
        print(f"WRONG (did not match fp32's first loss or did not learn): {wrong}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
