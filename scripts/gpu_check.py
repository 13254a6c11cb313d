"""The prepared GPU check: every GPU cell, test and benchmark of the course in one command.

Made for a bare, air-gapped GPU box: it runs with that box's own `python3` and CUDA build of torch, and
uses only the standard library until step `wheels` has installed what the box lacks from the folder `.whl/`
that `make gpu-wheels` fills here. Nothing reaches for the network. The work is done by the package next to
this file (scripts/gpucheck/: plan, runner, report, wheels); this is its command line. docs/gpu-check.md
tells the whole story.

    make gpu-check                         # every step, in order, at most BUDGET_S seconds in all
    make gpu-check ONLY=ladder,attention   # rerun some steps (`wheels` always runs first when present)
    make gpu-check NOTEBOOKS=03,05         # the notebooks step on some lessons only
    make gpu-check DRY_RUN=1               # print the plan and its problems, run nothing
    python3 scripts/gpu_check.py --fake    # a trivial plan run end to end on any machine (tests the runner)
    python3 scripts/gpu_check.py --publish-from results.tar.gz   # copy the results into benchmarks/results/
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the gpucheck package beside this file

from gpucheck import ROOT  # noqa: E402
from gpucheck import plan as gplan  # noqa: E402
from gpucheck.report import clear_out, pack, publish, publish_from, read_stamp, summary_markdown  # noqa: E402
from gpucheck.runner import run_plan  # noqa: E402
from gpucheck.wheels import WHEEL_DIR, WHEELS, make_wheels, wheel_files  # noqa: E402


def _split(value: str | None) -> list[str] | None:
    return [x for x in re.split(r"[,\s]+", value) if x] if value else None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", help="comma-separated step names (make gpu-check ONLY=...)")
    p.add_argument("--notebooks", help="comma-separated lesson prefixes for the notebooks step, e.g. 03,05")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its problems, run nothing")
    p.add_argument("--fake", action="store_true", help="run a trivial plan end to end (tests the runner)")
    p.add_argument("--no-publish", action="store_true", help="do not copy results into benchmarks/results/")
    p.add_argument("--budget", type=float, default=gplan.BUDGET_S, help="seconds for the whole check")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every limit and the budget (a GPU slower than an H200, a CPU rehearsal)")
    p.add_argument("--site", type=Path, default=gplan.DEFAULT_SITE, help="where the wheels are installed")
    p.add_argument("--wheels", type=Path, default=WHEEL_DIR, help="folder of wheels to install first")
    p.add_argument("--wheel-list", action="store_true", help="print the wheel set, NAME==VERSION a line")
    p.add_argument("--make-wheels", action="store_true", help="download the wheel set into .whl/ (network)")
    p.add_argument("--publish-from", type=Path, metavar="TARBALL",
                   help="copy the benchmark results in a check's results.tar.gz into benchmarks/results/")
    return p


def _print_plan(steps: list, env: dict[str, str], args: argparse.Namespace, out: Path,
                problems: list[str], missing: list[str]) -> None:
    total = sum(s.timeout_s for s in steps)
    print(f"GPU check plan: {len(steps)} steps, limits adding up to {total} s (budget {args.budget:.0f} s); "
          f"output in {out}")
    for i, s in enumerate(steps, 1):
        print(f"\n{i}. {s.name} (limit {s.timeout_s} s): {s.what}\n   $ {s.command()}")
    shown = ("PYTHONPATH", "COURSE_CACHE", "COURSE_BERT_PATH", *gplan.OFFLINE_ENV)
    print("\nenvironment of every step: " + " ".join(f"{k}={env[k]}" for k in shown if k in env)
          + f"; unset: {' '.join(gplan.DROPPED_ENV)}")
    if not wheel_files(args.wheels):
        print(f"no wheels in {args.wheels.name}/: `make gpu-wheels` before carrying the repo to a bare box")
    print("\ngaps: " + ("; ".join(missing) if missing else "none"))
    print("problems: " + ("; ".join(problems) if problems else
                          "none (offline, every package at hand, every GPU cell and cuda test covered)"))


def main(argv: list[str] | None = None) -> int:
    """Plan, check, run, summarise and pack (or one of the side jobs the flags name)."""
    p = _parser()
    args = p.parse_args(argv)
    if args.wheel_list:
        print("\n".join(WHEELS))
        return 0
    if args.make_wheels:
        return make_wheels(sys.executable)
    if args.publish_from:
        for f in publish_from(args.publish_from):
            print(f"published {f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}")
        return 0
    if args.scale <= 0:
        p.error(f"--scale must be positive, got {args.scale}")

    out = Path(os.environ.get("GPU_CHECK_OUT") or gplan.DEFAULT_OUT).resolve()
    python = sys.executable
    try:
        steps = gplan.select(gplan.fake_plan(out, python) if args.fake else
                       gplan.plan(out, python=python, site=args.site, wheel_dir=args.wheels,
                            lessons=_split(args.notebooks), scale=args.scale), _split(args.only))
    except ValueError as err:
        p.error(str(err))
    args.budget *= args.scale
    env = gplan.check_env(out, site=args.site, wheel_dir=args.wheels)
    problems = gplan.network_problems(steps, env)
    if not args.fake:
        problems += gplan.package_problems(steps, args.wheels, args.site)
        problems += gplan.uncovered(gplan.plan(out, python=python))
    missing = [] if args.fake else gplan.gaps(args.wheels, args.site)
    if args.dry_run:
        _print_plan(steps, env, args, out, problems, missing)
        return 1 if problems else 0
    if problems:
        print("the plan cannot run as it is:\n  " + "\n  ".join(problems))
        return 1
    try:
        clear_out(out)
    except ValueError as err:
        p.error(str(err))

    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    outcomes = run_plan(steps, env, out, args.budget)
    stamp = read_stamp(out / "work")
    passed = {o.name for o in outcomes if o.status == "pass"}
    results = {s.name: s.results for s in steps if s.results}
    published = ([] if args.no_publish or args.fake else
                 publish(passed, results, ROOT / "benchmarks" / "results"))
    (out / "summary.json").write_text(json.dumps(
        {"started": started, "stamp": stamp, "budget_s": args.budget, "gaps": missing,
         "steps": [dataclasses.asdict(o) for o in outcomes], "published": [f.name for f in published]},
        indent=2))
    (out / "summary.md").write_text(summary_markdown(outcomes, stamp, missing))
    kept = pack(out)
    print("\n" + summary_markdown(outcomes, stamp, missing))
    print("back from the box: " + ", ".join(f.name for f in kept))
    return 0 if all(o.status == "pass" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
