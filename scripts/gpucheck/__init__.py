"""The prepared GPU check behind `make gpu-check` (docs/gpu-check.md), as a small package.

    plan.py     what runs: the steps, their time limits and environment, and what a dry run checks
    runner.py   how a step runs: a process group with its own limit, its output streamed to a log
    report.py   what comes back: summary.md / summary.json, results.tar.gz, publishing the results
    wheels.py   what the box lacks: the wheel set `make gpu-wheels` downloads, and the BERT stand-in
    env_report.py   the `env` step itself (needs torch: the only module here that imports the course)

Everything but env_report.py uses the standard library only: it runs with a bare GPU box's own `python3`
before any wheel is installed. `scripts/gpu_check.py` is the command line over it.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository: every step runs from here
