"""The speed ladder of lesson 08 as a benchmark: BERT training steps, one optimisation at a time.

The published run over `helpers.train.ladder` (rungs, checks, timing, greedy selection: read its docstring)
and `helpers.train.ladder_report` (rows, table, the why of each rung): `run_ladder` climbs on a BERT with
random weights (speed does not depend on their values) and the BBC News corpus' token lengths (recorded
quantiles where the corpus is not installed); `to_markdown` writes the result with its targets. Files
`ladder-<device>.json/.md/.png` go into `--out` with course.results (stamped with device, versions, date,
threads and load); with `--greedy`, `ladder-<device>-greedy.*`. The files are written again after each rung
(marked partial until the last), so a run stopped at a time limit keeps the rungs it finished.

    python benchmarks/ladder.py                                               # BERT mini, seq 512: a CPU
    python benchmarks/ladder.py --greedy                                      # keep only what pays here
    python benchmarks/ladder.py --gpu-target --time-budget 420                # BERT-base, seq 512 (GPU)
    python benchmarks/ladder.py --gpu-target --batch-size 8                   # the same on a 15 GB T4

Out of memory: a stack that runs out of memory is reported with the memory it asked for and what the GPU held
(`helpers.core.diagnosis.OOMReport`), in the files and in one line, and its memory is handed back. The rungs
after it are measured where `helpers.train.ladder.climb` reports an out-of-memory rung as skipped; where it
does not (and for the fp32 baseline, which every rung is timed against) the run stops there, keeps what it
finished, and exits with status 3, naming a smaller batch as the next try.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import torch
from torch import nn
from transformers import BertForSequenceClassification

from course.plots import ladder_chart
from course.results import stamp, write_results
from helpers.core.device import get_device
from helpers.core.diagnosis import OOMReport
from helpers.data.corpus import corpus_lengths
from helpers.measure.agreement import TOLERANCES
from helpers.measure.roofline import mfu_peak
from helpers.model.models import MODEL_SIZES, bert_config
from helpers.train.ladder import RULE, RUNGS, Rung, climb_stacks, sample_batches
from helpers.train.ladder_report import ladder_table

TARGETS = {"speedup": 12.0, "mfu": 0.50}  # BERT-base, seq 512, H100/H200, whole stack vs fp32 eager


def _peak_line(peak: Any) -> str:
    return f"{peak.precision} peak ({peak.source}), {peak.flops / 1e12:.3g} TFLOP/s"


def run_ladder(*, model: str = "base", seq_len: int = 512, batch_size: int = 32, n_batches: int = 4,
               device: str = "auto", repeats: int = 5, lr: float = 5e-5, rungs: Sequence[Rung] = RUNGS,
               greedy: bool = False, lengths: Sequence[int] | None = None, n_classes: int = 5,
               peak_flops: float | None = None, time_budget_s: float | None = None,
               log: Callable[[str], None] = print,
               on_rung: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Check and time every rung on a random-weight BERT (cumulative or greedy); a JSON-ready dict with
    the run's stamp. `on_rung` gets the same dict, marked "partial", after the baseline and each rung."""
    dev = get_device(device)
    cfg = bert_config(model, n_classes)
    if seq_len > cfg.max_position_embeddings or seq_len < 8:
        raise ValueError(f"seq_len {seq_len}: use 8 ... {cfg.max_position_embeddings} (BERT's positions)")
    if lengths is None:
        lengths, lengths_source = corpus_lengths(seq_len, log=log)
    else:
        lengths, lengths_source = list(lengths), "given lengths"
    log(f"run_ladder: BERT {model!r} shapes with random weights (speed does not depend on their values), "
        f"{lengths_source}")
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in BertForSequenceClassification(cfg).state_dict().items()}
    batches, check = sample_batches(lengths, batch_size=batch_size, n_batches=n_batches, seq_len=seq_len,
                                    vocab=cfg.vocab_size, n_classes=n_classes)
    found = None if peak_flops else mfu_peak(dev, measure=True)  # one peak for every stack, measured now
    peak, peak_source = ((peak_flops, "given peak") if peak_flops else
                         (found.flops, _peak_line(found)) if found else (None, "no peak known"))

    def make_model() -> nn.Module:
        m = BertForSequenceClassification(copy.deepcopy(cfg))
        m.load_state_dict(state)
        return m.to(dev)

    setup = {"model": model, "params": sum(v.numel() for v in state.values()), "seq_len": seq_len,
             "batch_size": batch_size, "batches_per_pass": n_batches, "repeats": repeats, "lr": lr,
             "lengths": lengths_source, "peak_flops": peak, "peak_source": peak_source,
             "tolerances": TOLERANCES, "time_budget_s": time_budget_s, "rule": RULE}

    def payload(result: dict[str, Any]) -> dict[str, Any]:
        result = {k: v for k, v in result.items() if k != "stack"}  # the RunSpec: its fields are in the rows
        return {"stamp": stamp(dev), **result, "setup": setup}

    result = climb_stacks(make_model, batches, check, device=dev, greedy=greedy, repeats=repeats, lr=lr,
                          peak_flops=peak, rungs=rungs, time_budget_s=time_budget_s, log=log,
                          on_rung=None if on_rung is None else lambda partial: on_rung(payload(partial)))
    return payload(result)


def to_markdown(result: Mapping[str, Any]) -> str:
    """The ladder as Markdown: stamp line, setup, table, the why of each rung, your stack."""
    s, u = result["stamp"], result["setup"]
    vers = ", ".join(f"{k} {s[k]}" for k in ("torch", "cuda", "transformers", "triton", "python") if s.get(k))
    yours = result["your_stack_vs_baseline"]
    lines = [
        f"Ladder ({result['mode']}) on **{s['device']}** ({vers}), {s['date']}, {s.get('threads')} threads, "
        f"load average {s.get('load_average_1min')}.",
        f"BERT `{u['model']}` shapes ({u['params'] / 1e6:.1f} M params, random weights), seq {u['seq_len']}, "
        f"batch {u['batch_size']}, {u['batches_per_pass']} batches per pass, {u['repeats']} timed passes per "
        f"stack; lengths: {u['lengths']}. Tokens/s count real tokens; MFU counts useful FLOPs (each "
        f"document's real tokens at its own length, no padding) against the {u['peak_source']}.",
        f"Greedy rule: {u['rule']}." if result["mode"] == "greedy" else "",
        *([f"Note: {s['note']}"] if s.get("note") else []),
        *([f"**Partial result: {result['partial']}** (written after each rung; the run has not finished or "
           "was stopped)."] if result.get("partial") else []),
        "",
        ladder_table(result).to_markdown(),
        "",
        *[f"- {r['name']}: {r['why']}" for r in result["rows"][1:]],
        *_too_busy(result),
        "",
        "One timing per row: each stack was timed in alternation with the stack it was added to and with the "
        "fp32 eager baseline, and every number of its row (samples/s, the baseline's samples/s, speed-up, vs "
        "stack below, MFU) comes from that one session.",
        f"Your stack (up to **{yours['name']}**) against fp32 eager, timed side by side: "
        f"**{yours['speedup']:.2f}x**" + (f", MFU {100 * yours['mfu']:.1f} %." if yours.get("mfu") is not None
                                          else "."),
        "",
        "Your stack on this machine (the greedy rule's):" if result["mode"] == "greedy" else
        "The top of the ladder (every rung on; `--greedy` keeps only what pays):",
        "",
        "```python",
        result["your_stack_code"],
        "```",
        *_targets(result, yours),
    ]
    return "\n".join(lines)


def _too_busy(result: Mapping[str, Any]) -> list[str]:
    """The line naming the rungs the machine was too busy to judge (helpers.core.timing.busy), or none."""
    if not result.get("too_busy"):
        return []
    leaves = " and your stack leaves them out" if result["mode"] == "greedy" else ""
    return [f"**Too busy to judge:** {', '.join(result['too_busy'])} (helpers.core.timing.busy: their rounds "
            "disagreed by half or more, or other programs took a quarter or more of the CPUs while they were "
            f"timed): no verdict was drawn for them{leaves}. Rerun on a quiet machine."]


def _targets(result: Mapping[str, Any], best: Mapping[str, Any]) -> list[str]:
    s, u = result["stamp"], result["setup"]
    t = f">= {TARGETS['speedup']:.0f}x and >= {100 * TARGETS['mfu']:.0f} % MFU"
    if s["device_type"] != "cuda" or u["model"] != "base" or u["seq_len"] != 512:
        return ["", f"(The targets, {t}, apply to BERT-base at seq 512 on an H100/H200-class GPU; this "
                    "run is not that.)"]
    sp, m = best["speedup"], best.get("mfu")
    out = ["", f"- Target speed-up >= {TARGETS['speedup']:.0f}x: {sp:.2f}x, "
               + ("met." if sp >= TARGETS["speedup"] else f"short by {TARGETS['speedup'] / sp:.2f}x.")]
    if m is None:
        out.append("- Target MFU: no peak known for this GPU, not computed.")
    else:
        out.append(f"- Target MFU >= {100 * TARGETS['mfu']:.0f} % (useful FLOPs, dense bf16 peak): "
                   f"{100 * m:.1f} %, " + ("met." if m >= TARGETS["mfu"]
                                           else f"short by {100 * (TARGETS['mfu'] - m):.1f} points."))
    return out


def main(argv: list[str] | None = None) -> dict:
    """Run the ladder as the flags say, write the results, print the Markdown."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mini", choices=sorted(MODEL_SIZES),
                   help="BERT shapes (base = BertConfig())")
    p.add_argument("--seq-len", type=int, default=512, help="longest sequence (tokens)")
    p.add_argument("--batch-size", type=int, default=None, help="samples per step (4; 32 with --gpu-target)")
    p.add_argument("--batches", type=int, default=2, help="steps per timed pass")
    p.add_argument("--repeats", type=int, default=5, help="timed passes per stack (median and IQR)")
    p.add_argument("--greedy", action="store_true",
                   help="add each rung to the best stack so far, keep it only when faster beyond the spread")
    p.add_argument("--gpu-target", action="store_true",
                   help="the GPU targets' shapes: BERT-base, seq 512, batch 32 (unless --batch-size), "
                        "4 batches per pass, on CUDA (unless --device)")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop measuring new rungs after this many seconds (the rest are reported as skipped)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--note", default="", help="a line about the conditions (a shared machine, ...)")
    p.add_argument("--out", default="benchmarks/results", help="folder for the results")
    args = p.parse_args(argv)
    if args.gpu_target:
        args.model, args.seq_len, args.batches = "base", 512, 4
        # the GPU targets' shapes take hours on a CPU: --gpu-target asks for CUDA unless --device is given
        args.device = "cuda" if args.device == "auto" else args.device
        get_device(args.device)  # no CUDA here: the error says so and how to fix it, before anything is built
    args.batch_size = args.batch_size or (32 if args.gpu_target else 4)

    def save(result: dict[str, Any]) -> dict[str, Any]:
        if args.note:
            result["stamp"]["note"] = args.note
        measured = [r for r in result["rows"] if "samples_per_s" in r]  # each timed beside the baseline
        title = (f"BERT training ladder ({result['mode']}), {result['stamp']['device']}\n"
                 f"({args.model}, seq {args.seq_len}, {result['stamp']['date'][:10]})")
        fig = ladder_chart({r["name"]: r["speedup"] for r in measured}, title=title,
                           kept={r["name"]: r["kept"] for r in measured} if args.greedy else None,
                           vs_below={r["name"]: r["vs_below"] for r in measured if r.get("vs_below")})
        # the greedy ladder is written next to the cumulative one: ladder-<device>-greedy.*
        paths = write_results("ladder", result, to_markdown(result), fig=fig, out_dir=args.out,
                              variant="greedy" if args.greedy else "")
        plt.close(fig)
        return paths

    last: dict[str, Any] = {}  # the newest partial result: what a run stopped by an error keeps

    def save_partial(result: dict[str, Any]) -> dict[str, Any]:
        last.clear()
        last.update(result)
        return save(result)

    # written after each rung too: a run stopped at a time limit keeps the rungs it finished
    oom = None
    try:
        result = run_ladder(model=args.model, seq_len=args.seq_len, batch_size=args.batch_size,
                            n_batches=args.batches, repeats=args.repeats, greedy=args.greedy,
                            device=args.device, time_budget_s=args.time_budget, on_rung=save_partial)
    except Exception as err:  # noqa: BLE001 - out-of-memory is reported below, anything else raised
        oom = OOMReport.parse(err)
        if oom is None:
            raise
    if oom is not None:  # outside the except block, so the error's frames (and their tensors) can go
        return _stopped_by_oom(args, oom, last, save)
    paths = save(result)
    print(to_markdown(result))
    print("wrote", ", ".join(str(p) for p in paths.values()))
    return result


def _stopped_by_oom(args: argparse.Namespace, oom: OOMReport, last: dict[str, Any],
                    save: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """Report a run that ran out of memory: which stack, the memory it asked, what was kept; exit status 3."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # hand the failed stack's cached blocks back
    done = len(last.get("rows", [])) - 1  # rungs finished after the baseline
    where = ("the fp32 eager baseline" if not last else
             f"rung {done + 1} ({RUNGS[done].name})" if done < len(RUNGS) else "the final comparison")
    line = (f"{where} ran out of memory at BERT {args.model!r}, seq {args.seq_len}, batch "
            f"{args.batch_size}: {oom}; try --batch-size {max(1, args.batch_size // 2)}")
    print(line, flush=True)
    if last:  # the rungs finished before it, marked as stopped
        last["partial"] = f"stopped: {line}"
        last["oom"] = dataclasses.asdict(oom)
        paths = save(last)
        print(to_markdown(last))
    else:
        dev = get_device(args.device)
        payload = {"stamp": stamp(dev), "stopped": line, "oom": dataclasses.asdict(oom),
                   "setup": {"model": args.model, "seq_len": args.seq_len, "batch_size": args.batch_size}}
        paths = write_results("ladder", payload, f"# Ladder on {payload['stamp']['device']}\n\n{line}.\n",
                              out_dir=args.out, variant="greedy" if args.greedy else "")
    print("wrote", ", ".join(str(p) for p in paths.values()))
    raise SystemExit(3)


if __name__ == "__main__":
    main()
