"""What the GPU check runs: its steps, each step's time limit and environment, and what a dry run checks.

Every limit below is sized for an H200 (141 GB, bf16 matmul ~790 TFLOP/s measured, 16 CPU cores): start-up
+ the step's work, or its own time budget + the longest piece of work that can be under way when that budget
ends, + a margin; docs/gpu-check.md gives each term, and says which two steps (notebooks, ladder) have no
budget of their own to build on. The limits add up to BUDGET_S; `--scale` multiplies them all.

A dry run reports three kinds of problem, and the check refuses to run while any is left:
- the network: a download, a URL, pip without --no-index, an environment that is not offline;
- packages: a pytest plugin a step's command line uses (--timeout, -n, --nbval-lax), or a package the
  notebooks need, neither installed for this Python nor waiting as a wheel in .whl/; no BERT for lessons
  06 and 08;
- coverage: a file with `cuda` tests, or a notebook with `requires-cuda` cells, that no step runs.
Gaps (a GPU path that would skip, such as torchao's FP8 without torchao) are reported, not refused.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from gpucheck import ROOT
from gpucheck.wheels import (
    STANDIN_DIR,
    WHEEL_DIR,
    WHEELS,
    bert_available,
    minilm_installed,
    project,
    provided,
    wheel_files,
)

__all__ = ["BUDGET_S", "LIMITS", "DEFAULT_OUT", "DEFAULT_SITE", "MARKER_TEXT", "OFFLINE_ENV", "DROPPED_ENV",
           "Step", "plan", "fake_plan", "select", "check_env", "notebooks", "gpu_cells", "cuda_test_files",
           "network_problems", "package_problems", "uncovered", "gaps"]

BUDGET_S = 495  # the whole check: 8 1/4 minutes on an H200
# Each step's limit in seconds on an H200; they add up to BUDGET_S (docs/gpu-check.md: what each is made of).
LIMITS = {"wheels": 15, "env": 15, "cuda-tests": 95, "notebooks": 150, "attention": 70,
          "mixed-precision": 60, "ladder": 90}
CUDA_TEST_TIMEOUT_S = 40  # one test at most (pytest-timeout): a hung test leaves the others their time
ATTENTION_BUDGET_S = 40  # attention_sweep.py --time-budget: no case starts after it (the target length's do)
MIXED_BUDGET_S = 15  # mixed_precision_gpu.py --time-budget: no arm after fp32's starts after it
LADDER_BUDGET_S = 45  # ladder.py --time-budget: no rung starts after it
# FlexAttention's compile (tens of seconds for each new shape) cannot be bounded inside the attention step:
# the step times the others; flex runs on the GPU in lesson 01 (the notebooks step)
ATTENTION_IMPLS = ("triton", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math", "naive")
NOTEBOOK_WORKERS = 8  # kernels at a time on the one GPU (smoke sizes leave it far from full)

DEFAULT_OUT = ROOT / "build" / "gpu-check"
DEFAULT_SITE = Path("/tmp/gpu-check-site")  # where the wheels are installed on the box (PYTHONPATH)
MARKER = "cuda"  # the pytest marker of GPU tests (pyproject.toml)
MARKER_TEXT = f"mark.{MARKER}"  # every file with such tests says so (conftest.py stops the run otherwise)

# Every step runs offline: the hub and pip are told so, and HTTP(S) goes to a closed local port (fails fast).
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1", "PIP_NO_INDEX": "1",
    "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
    "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
}
DROPPED_ENV = ("TRITON_INTERPRET", "MPLBACKEND", "COURSE_PROFILE")  # a GPU run compiles Triton for real

# Network reach that a step's command line must never show (checked by `network_problems`).
NETWORK_PATTERNS = (
    (re.compile(r"\bcurl\b|\bwget\b|\bgit\s+(clone|fetch|pull)\b"), "downloads with curl/wget/git"),
    (re.compile(r"https?://(?!127\.0\.0\.1)"), "names a URL"),
    (re.compile(r"pip\s+download"), "runs pip download"),
    (re.compile(r"snapshot_download|hf_hub_download|huggingface-cli|\bhf\s+download"),
     "downloads from the hub"),
    (re.compile(r"load_dataset\("), "loads a data set from the hub"),
)
PIP_INSTALL = re.compile(r"\bpip[\d.]*\s+install\b")  # pip, pip3, pip3.12; `python -m pip`, `uv pip` too
# pytest options -> the plugin (distribution) that gives them: without it pytest stops at its command line
PLUGINS = {"--timeout": "pytest-timeout", "-n": "pytest-xdist", "--dist": "pytest-xdist",
           "--nbval-lax": "nbval", "--nbval-current-env": "nbval"}
OPTIONAL = ("torchao",)  # without it a GPU path skips (a gap), nothing fails


@dataclass(frozen=True)
class Step:
    """One step of the check: a command run from the repository root with its own time limit."""

    name: str
    argv: tuple[str, ...]
    timeout_s: int
    what: str  # one line for the plan and the summary
    env: tuple[tuple[str, str], ...] = ()  # added to the common environment
    always: bool = False  # runs whatever --only says (the wheel install the others need)
    results: str | None = None  # folder the step writes result files into (published when it passes)
    needs: tuple[str, ...] = ()  # distributions it cannot do without, besides the plugins its options name

    def command(self) -> str:
        """The command line, shell-quoted, as the plan prints it."""
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env), shlex.join(self.argv)])

    def packages(self) -> list[str]:
        """Every distribution the step needs: its own, pytest and the plugins its options name."""
        found = list(self.needs) + (["pytest"] if "pytest" in self.argv else [])
        found += [dist for opt, dist in PLUGINS.items() if opt in self.argv]
        return list(dict.fromkeys(found))


# --- what there is to run

def notebooks(root: Path = ROOT) -> list[Path]:
    """Every lesson notebook, in order."""
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def gpu_cells(path: Path) -> list[int]:
    """Indices of the cells of notebook `path` tagged requires-cuda or requires-multi-gpu."""
    cells = json.loads(path.read_text())["cells"]
    return [i for i, c in enumerate(cells)
            if {"requires-cuda", "requires-multi-gpu"} & set(c.get("metadata", {}).get("tags", []))]


def cuda_test_files(root: Path = ROOT) -> list[str]:
    """The test files that hold `cuda` tests (they name the marker), relative to `root`: what
    `pytest -m cuda` collects, without importing every other test module."""
    return [p.relative_to(root).as_posix() for p in sorted((root / "tests").glob("test_*.py"))
            if MARKER_TEXT in p.read_text()]


# --- the plan

def plan(out: Path, *, root: Path = ROOT, python: str = "python3", site: Path = DEFAULT_SITE,
         wheel_dir: Path = WHEEL_DIR, lessons: list[str] | None = None, scale: float = 1.0) -> list[Step]:
    """Every step of the check, in order, with the exact command each runs (from the repository root).

    scale multiplies every time limit (1: an H200 within BUDGET_S; more for a slower GPU or a CPU rehearsal).
    """
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")

    def t(seconds: float) -> int:
        return round(seconds * scale)

    work = out / "work"
    res = work / "results"
    pytest = (python, "-m", "pytest", "-v", "-p", "no:cacheprovider")
    steps = []
    wheels = wheel_files(wheel_dir)
    if wheels:
        paths = [str(w.relative_to(root)) if w.is_relative_to(root) else str(w) for w in wheels]
        pip = (python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--target", str(site))
        steps.append(Step("wheels", (*pip, *paths), t(LIMITS["wheels"]),
                          f"install {len(wheels)} wheels from {wheel_dir.name}/ into {site}", always=True))
    steps.append(Step("env", (python, "scripts/gpucheck/env_report.py", str(work)), t(LIMITS["env"]),
                      "environment report, versions and measured roofline (lesson 00's helpers)"))
    files = cuda_test_files(root)
    steps.append(Step("cuda-tests", (*pytest, "-m", MARKER, "-rs", "--timeout", str(t(CUDA_TEST_TIMEOUT_S)),
                                     "--junitxml", str(work / "cuda-tests.xml"), *files),
                      t(LIMITS["cuda-tests"]),
                      f"every test marked cuda (pytest -m cuda), in {len(files)} files"))
    nbs = [nb.relative_to(root).as_posix() for nb in notebooks(root)
           if not lessons or any(nb.name.startswith(x) or x in nb.name for x in lessons)]
    if not nbs:  # pytest given no path would run every test and notebook of the repository
        raise ValueError(f"NOTEBOOKS={','.join(lessons or [])} names no notebook of notebooks/: "
                         f"use lesson numbers such as 03,05")
    workers = min(len(nbs), NOTEBOOK_WORKERS)  # one kernel per notebook (loadscope), several at a time
    stack = tuple(w.split("==")[0] for w in WHEELS if project(w.split("==")[0]) not in OPTIONAL)
    steps.append(Step("notebooks", (*pytest, "-n", str(workers), "--dist", "loadscope", "--nbval-lax",
                                    "--nbval-current-env", "--timeout", str(t(LIMITS["notebooks"])),
                                    "--junitxml", str(work / "notebooks.xml"), *nbs),
                      t(LIMITS["notebooks"]),
                      f"{len(nbs)} notebooks, nbval on the GPU, smoke sizes, {workers} at a time",
                      env=(("COURSE_PROFILE", "smoke"), ("OMP_NUM_THREADS", "2")), needs=stack))
    # each benchmark's --time-budget leaves its step's limit the margin for start-up and the work under way
    # when the budget ends (docs/gpu-check.md); each writes its results as each piece finishes
    agg = (("MPLBACKEND", "Agg"),)
    steps.append(Step("attention", (python, "benchmarks/attention_sweep.py", "--gpu-target", "--time-budget",
                                    str(t(ATTENTION_BUDGET_S)), "--impls", *ATTENTION_IMPLS,
                                    "--out", str(res / "attention")),
                      t(LIMITS["attention"]),
                      "attention sweep, d=128, bf16: N=4096 first (Triton, then SDPA), then 1024..8192",
                      env=agg, results=str(res / "attention")))
    steps.append(Step("mixed-precision", (python, "benchmarks/mixed_precision_gpu.py", "--time-budget",
                                          str(t(MIXED_BUDGET_S)), "--out", str(res / "mixed-precision")),
                      t(LIMITS["mixed-precision"]),
                      "fp32/tf32/fp16/bf16 (+ compiled bf16): step time, peak memory",
                      env=agg, results=str(res / "mixed-precision")))
    note = "gpu-check: BERT-base shapes, random weights (speed does not depend on them)"
    # --greedy: each rung against the best stack so far (issue 15); --repeats 3 keeps BERT-base's stacks short
    steps.append(Step("ladder", (python, "benchmarks/ladder.py", "--gpu-target", "--greedy", "--repeats", "3",
                                 "--time-budget", str(t(LADDER_BUDGET_S)),
                                 "--out", str(res / "ladder"), "--note", note),
                      t(LIMITS["ladder"]), "the greedy ladder, BERT-base seq 512 (random weights)",
                      env=agg, results=str(res / "ladder")))
    return steps


def fake_plan(out: Path, python: str) -> list[Step]:
    """A trivial plan for any machine: one step passes and writes a result, one fails, one runs too long."""
    res = out / "work" / "results" / "fake"
    code = ("import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.mkdir(parents=True, exist_ok=True); "
            "[(p / f'fake-cpu.{e}').write_text('fake ' + e) for e in ('json', 'md', 'png')]; "
            "print('wrote', p)")
    return [Step("ok", (python, "-c", code, str(res)), 20, "passes, writes fake-cpu.{json,md,png}",
                 results=str(res)),
            Step("fails", (python, "-c", "import sys; print('about to fail'); sys.exit(3)"), 20,
                 "exits with 3"),
            Step("hangs", (python, "-c", "import time; print('sleeping', flush=True); time.sleep(60)"), 1,
                 "runs past its 1 s limit")]


def select(steps: list[Step], only: list[str] | None) -> list[Step]:
    """The steps `only` names (plus those that always run), in plan order; ValueError for an unknown name."""
    if not only:
        return steps
    names = [s.name for s in steps]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ValueError(f"ONLY names unknown step(s) {unknown}: choose from {names}")
    return [s for s in steps if s.name in only or s.always]


def check_env(out: Path, *, site: Path = DEFAULT_SITE, root: Path = ROOT, wheel_dir: Path = WHEEL_DIR,
              base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every step: offline, the course and the wheels on PYTHONPATH, Triton compiled."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in DROPPED_ENV}
    env.update(OFFLINE_ENV)
    path = [str(root), str(site), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    env["PYTHONUNBUFFERED"] = "1"
    env["COURSE_CACHE"] = str(out / "work" / "cache")  # the roofline step `env` measures, read by later steps
    env["GPU_CHECK_OUT"] = str(out)
    standin = wheel_dir / STANDIN_DIR.name
    if not minilm_installed() and (standin / "config.json").exists():
        env.setdefault("COURSE_BERT_PATH", str(standin))  # BERT with random weights (helpers.model.models)
    return env


# --- what a dry run checks

def network_problems(steps: list[Step], env: dict[str, str]) -> list[str]:
    """How the plan would reach for the network: a download, pip without --no-index, an online env."""
    problems = []
    for s in steps:
        line = s.command()
        problems += [f"{s.name}: {why}: {line[:120]}" for pat, why in NETWORK_PATTERNS if pat.search(line)]
        if PIP_INSTALL.search(line) and "--no-index" not in s.argv:
            problems.append(f"{s.name}: pip install without --no-index")
    problems += [f"environment: {k} must be {v!r}, is {env.get(k)!r}" for k, v in OFFLINE_ENV.items()
                 if env.get(k) != v]
    return problems


def package_problems(steps: list[Step], wheel_dir: Path = WHEEL_DIR, site: Path = DEFAULT_SITE) -> list[str]:
    """What a step needs that neither this Python has nor the `wheels` step would install: it would stop
    at its command line (a pytest plugin) or fail in every notebook (nbval's kernel, the corpus)."""
    problems = []
    for s in steps:
        missing = [d for d in s.packages() if not provided(d, wheel_dir, site)]
        if missing:
            problems.append(f"{s.name}: needs {', '.join(missing)}: not installed for this Python, and no "
                            f"wheel in {wheel_dir.name}/ (add it to WHEELS and run `make gpu-wheels`)")
    if any(s.name == "notebooks" for s in steps) and not bert_available(wheel_dir):
        problems.append(f"notebooks: no BERT for lessons 06 and 08: neither the MiniLM package nor "
                        f"{wheel_dir.name}/{STANDIN_DIR.name}/ (run `make gpu-wheels` after `make setup`)")
    return problems


def uncovered(steps: list[Step], root: Path = ROOT) -> list[str]:
    """GPU work the plan misses: a notebook with GPU cells, or a file with `cuda` tests, that no step runs
    (the files are found from `root`; the plan may have been made from another copy)."""
    args = [a for s in steps for a in s.argv]
    marked = next((s.argv for s in steps if s.name == "cuda-tests"), ())  # pytest -m <MARKER> <files>
    missing = []
    for nb in notebooks(root):
        rel = nb.relative_to(root).as_posix()
        if gpu_cells(nb) and rel not in args:
            missing.append(f"{rel}: cells {gpu_cells(nb)} need a GPU, and no step runs this notebook")
    for rel in cuda_test_files(root):
        if rel not in marked or MARKER not in marked:
            missing.append(f"{rel}: holds tests marked {MARKER}, and no `pytest -m {MARKER}` step runs it")
    return missing


def gaps(wheel_dir: Path = WHEEL_DIR, site: Path = DEFAULT_SITE) -> list[str]:
    """GPU paths that would skip, not fail: optional packages neither here nor among the wheels."""
    return [f"{d}: not installed and no wheel: its GPU tests and cells will skip" for d in OPTIONAL
            if not provided(d, wheel_dir, site)]
