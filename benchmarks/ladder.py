"""The speed ladder of lesson 08 as a benchmark: BERT training steps, one optimisation at a time.

A thin command line over `helpers.ladder` (rungs, checks, timing, greedy selection: read its docstring).
Weights are random (speed does not depend on their values); lengths are the BBC News corpus' token
counts (recorded quantiles where the corpus is not installed). Writes `ladder-<device>.json/.md/.png`
into `--out` with helpers.results (stamped with device, versions, date, threads and load), or with
`--greedy` `ladder-<device>-greedy.*`.

    python benchmarks/ladder.py                                               # BERT mini, seq 512: a CPU
    python benchmarks/ladder.py --greedy                                      # keep only what pays here
    python benchmarks/ladder.py --gpu-target --time-budget 420                # BERT-base, seq 512 (GPU)
"""

from __future__ import annotations

import argparse

from helpers.ladder import run_ladder, to_markdown
from helpers.models import MODEL_SIZES
from helpers.plots import ladder_chart
from helpers.results import write_results


def main(argv: list[str] | None = None) -> dict:
    """Run the ladder as the flags say, write the results, print the Markdown."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mini", choices=sorted(MODEL_SIZES),
                   help="BERT shapes (base = BertConfig())")
    p.add_argument("--seq-len", type=int, default=512, help="longest sequence (tokens)")
    p.add_argument("--batch-size", type=int, default=4, help="samples per step")
    p.add_argument("--batches", type=int, default=2, help="steps per timed pass")
    p.add_argument("--repeats", type=int, default=5, help="timed passes per stack (median and IQR)")
    p.add_argument("--greedy", action="store_true",
                   help="add each rung to the best stack so far, keep it only when faster beyond the spread")
    p.add_argument("--gpu-target", action="store_true",
                   help="the GPU targets' shapes: BERT-base, seq 512, batch 32, 4 batches per pass")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop measuring new rungs after this many seconds (the rest are reported as skipped)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--note", default="", help="a line about the conditions (a shared machine, ...)")
    p.add_argument("--out", default="benchmarks/results", help="folder for the results")
    args = p.parse_args(argv)
    if args.gpu_target:
        args.model, args.seq_len, args.batch_size, args.batches = "base", 512, 32, 4
    result = run_ladder(model=args.model, seq_len=args.seq_len, batch_size=args.batch_size,
                        n_batches=args.batches, repeats=args.repeats, greedy=args.greedy, device=args.device,
                        time_budget_s=args.time_budget)
    if args.note:
        result["stamp"]["note"] = args.note
    measured = {r["name"]: r["speedup"] for r in result["rows"] if "samples_per_s" in r}  # side by side
    title = (f"BERT training ladder ({result['mode']}), {result['stamp']['device']}\n"
             f"({args.model}, seq {args.seq_len}, {result['stamp']['date'][:10]})")
    fig = ladder_chart(measured, title=title)
    # the greedy ladder is written next to the cumulative one: ladder-<device>-greedy.*
    paths = write_results("ladder", result, to_markdown(result), fig=fig, out_dir=args.out,
                          variant="greedy" if args.greedy else "")
    print(to_markdown(result))
    print("wrote", ", ".join(str(p) for p in paths.values()))
    return result


if __name__ == "__main__":
    main()
