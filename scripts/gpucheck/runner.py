"""How a step runs: its own process group, its own time limit, its output streamed to the console and a log;
every step after the last whatever its outcome, all within the check's budget."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpucheck import ROOT
from gpucheck.plan import Step

__all__ = ["Outcome", "run_step", "run_plan"]


@dataclass
class Outcome:
    """What happened to one step."""

    name: str
    status: str  # "pass", "FAIL", "timeout", "not run"
    seconds: float
    timeout_s: int
    returncode: int | None
    log: str  # path of the log inside the tarball
    what: str = ""
    tail: list[str] = field(default_factory=list)  # the last lines of its output


def _descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (Linux /proc): kernels and torchrun workers may leave its group."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _kill(proc: subprocess.Popen) -> None:
    """End the step's process group, then any descendant that left it."""
    family = _descendants(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=5)
            break
        except subprocess.TimeoutExpired:
            continue
    for pid in family:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def run_step(step: Step, env: dict[str, str], log_dir: Path, timeout_s: float, cwd: Path = ROOT) -> Outcome:
    """Run one step, its output streamed to the console and to logs/<name>.log, ended at `timeout_s`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{step.name}.log"
    tail: list[str] = []
    print(f"\n=== {step.name} (limit {timeout_s:.0f} s): {step.what}\n$ {step.command()}", flush=True)
    start = time.monotonic()
    with log_path.open("w") as log:
        log.write(f"$ {step.command()}\n")
        log.flush()
        proc = subprocess.Popen(step.argv, cwd=cwd, env={**env, **dict(step.env)}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                text=True, errors="replace", bufsize=1)

        def pump() -> None:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                sys.stdout.write(f"[{step.name}] {line}")
                tail.append(line.rstrip("\n"))
                del tail[:-20]

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill(proc)
        reader.join(timeout=10)
        seconds = time.monotonic() - start
        if timed_out:
            log.write(f"\n*** stopped: ran past its limit of {timeout_s:.0f} s\n")
    status = "timeout" if timed_out else ("pass" if proc.returncode == 0 else "FAIL")
    print(f"=== {step.name}: {status} in {seconds:.0f} s", flush=True)
    code = None if timed_out else proc.returncode
    return Outcome(step.name, status, round(seconds, 1), int(timeout_s), code, f"logs/{step.name}.log",
                   step.what, tail)


def run_plan(steps: list[Step], env: dict[str, str], out: Path, budget_s: float) -> list[Outcome]:
    """Every step in order, each after the last whatever its outcome, all within `budget_s` seconds."""
    deadline = time.monotonic() + budget_s
    outcomes = []
    for step in steps:
        left = deadline - time.monotonic()
        if left < 5:
            outcomes.append(Outcome(step.name, "not run", 0.0, step.timeout_s, None, "", step.what,
                                    [f"the check's budget of {budget_s:.0f} s was spent"]))
            continue
        outcomes.append(run_step(step, env, out / "work" / "logs", min(step.timeout_s, left)))
    return outcomes
