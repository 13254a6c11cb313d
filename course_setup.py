"""The check at the top of every lesson: `course_setup.check("04_where_time_goes")` in its first cell.

On Colab, Kaggle or a Jupyter without the course, the cell has just pip-installed the lesson's release;
where the course is installed (`make lab`) the cell had nothing to install. Either way this module then makes
sure the lesson will find what it needs, and says in one line what it found:

- the `helpers` this kernel imports is the course's, not a file or folder of yours with the same name;
- a lesson that runs Triton kernels (lesson 01) has triton: a GPU runtime's torch brings it, a CPU runtime
  gets it installed here (about 270 MiB), and no other lesson installs it;
- the installed course is the release the notebook belongs to.

It imports nothing heavy (no torch), so it runs in a second. It also silences the known lines of torch and
transformers that say nothing to a learner (`quiet_known_noise`), each matched by its own text and source, and
its messages name the restart menu of the host the lesson runs on (`restart_menu`).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import re
import stat
import subprocess
import sys
import threading
import warnings
from importlib import metadata
from pathlib import Path

__all__ = ["RELEASE", "DISTRIBUTION", "NEEDS_TRITON", "CourseSetupError", "check", "helpers_problem",
           "restart_menu", "NATIVE_NOISE", "LOG_NOISE", "WARNING_NOISE", "PRINTED_NOISE", "quiet_known_noise"]

RELEASE = "main"  # the release these files belong to (scripts/course_release.py writes it)
DISTRIBUTION = "fast-transformers-course"
NEEDS_TRITON = ("01_attention",)  # lessons that run Triton kernels (on a CPU, through its interpreter)
HERE = Path(__file__).resolve().parent  # where the course's helpers/ and course/ sit beside this file
PACKAGES = ("helpers", "course")  # the library and the course's machinery


class CourseSetupError(RuntimeError):
    """The course cannot run here as it is; the message names the problem and the fix."""


def restart_menu() -> str:
    """The menu item that restarts this notebook's kernel on the host it runs on (every lesson)."""
    if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:
        return "Runtime > Restart session"
    if "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
        return "Run > Restart & clear cell outputs"
    return "Kernel > Restart Kernel"


# --- the known noise ----------------------------------------------------------------------------------------
# Lines torch's native code writes to the process's stderr, which a notebook shows under the cell: torch
# 2.13's profiler (kineto) logs every start and stop at its USDT level, above ERROR, so no log level drops
# them alone; its memory profiling warns of blocks allocated before it started (which it leaves out, as the
# course's measurements expect); a CUDA build of torch on a machine without a GPU (Colab's CPU runtime) logs
# its failed device count.
NATIVE_NOISE = re.compile(r"^(?:USDT:[^\n]* SyncActivityProfilerHandler\.cpp:\d+\] profiler_(?:start|stop)"
                          r"|\[W[^\n]* CPUAllocator\.cpp:\d+\] Memory block of unknown size was allocated "
                          r"before the profiling started[^\n]*"
                          r"|[^\n]*gpuGetDeviceCount failed with code 35[^\n]*)\n?", re.M)
# Log records: (logger, the start of the message). transformers' default loss of a GPT-2 LM head (right, and
# said as if the config were wrong); torch's C++-extension helper on a machine with CUDA's files but no GPU.
LOG_NOISE = (("transformers.modeling_utils", "`loss_type=None` was set in the config but it is unrecogni"),
             ("torch.utils.cpp_extension", "No CUDA runtime is found, using CUDA_HOME"))  # -zed, 4.52: -sed
# torch before 2.8 prints the C++-extension helper's line itself, to sys.stderr, when the module is first
# imported: quiet_known_noise imports it first with that one line taken out
PRINTED_NOISE = "No CUDA runtime is found, using CUDA_HOME"
# Python warnings: (message pattern, category). torch 2.9-2.11 warn on every use of the TF32 switch the course
# shows (`torch.set_float32_matmul_precision`), which still works.
WARNING_NOISE = ((r"Please use the new API settings to control TF32", UserWarning),)


class _Drop(logging.Filter):
    """Drops the records of one logger whose message starts with `start`."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


_QUIETED: set[int] = set()  # {2} once fd 2 is filtered: once per process


def quiet_known_noise() -> None:
    """Silence the known noise (NATIVE_NOISE, LOG_NOISE, WARNING_NOISE), each matched by its own text and
    source, never a whole stream or logger; safe to call again (every lesson)."""
    for pattern, category in WARNING_NOISE:
        warnings.filterwarnings("ignore", message=pattern, category=category)
    for name, start in LOG_NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) and f.start == start for f in logger.filters):
            logger.addFilter(_Drop(start))
    if type(sys.stderr).__module__.startswith("ipykernel") and not _QUIETED:
        _filter_native_stderr()
        _QUIETED.add(2)
    if "torch.utils.cpp_extension" not in sys.modules and importlib.util.find_spec("torch"):
        _import_without_its_line("torch.utils.cpp_extension", PRINTED_NOISE)  # imports torch: lessons do next


def _import_without_its_line(module: str, start: str) -> None:
    """Import `module` with the lines it prints to sys.stderr that begin with `start` left out."""
    import contextlib
    import io

    caught = io.StringIO()
    with contextlib.redirect_stderr(caught):
        importlib.import_module(module)
    sys.stderr.write("".join(line for line in caught.getvalue().splitlines(keepends=True)
                             if not line.startswith(start)))


def _filter_native_stderr() -> None:
    """In a notebook, what native code writes to fd 2 goes to the cell through a pipe the kernel reads: put a
    pipe of ours in front of it, and pass on all but NATIVE_NOISE's lines. C++'s stderr arrives in pieces
    (each `<<` flushed on its own), so a piece that may start such a line waits for the rest of it."""
    if not stat.S_ISFIFO(os.fstat(2).st_mode):  # the kernel does not read fd 2 here: nothing shows
        return
    STARTS = (b"USDT:", b"WARNING:", b"ERROR:", b"[W")  # how kineto's and c10's log lines begin
    kernel = os.dup(2)  # the write end of the kernel's pipe, where the kept bytes go
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)

    def forward() -> None:
        pending = b""
        while chunk := os.read(read, 4096):
            lines = (pending + chunk).splitlines(keepends=True)
            pending = b""
            last = lines[-1] if lines else b"\n"
            if not last.endswith(b"\n") and any(last.startswith(s) or s.startswith(last) for s in STARTS):
                pending = lines.pop()  # a native log line's start: may be noise, so wait for its end
            kept = b"".join(line for line in lines
                            if not NATIVE_NOISE.fullmatch(line.decode("utf-8", "replace")))
            if kept:
                os.write(kernel, kept)
    threading.Thread(target=forward, name="course_setup: native stderr", daemon=True).start()


def helpers_problem() -> str | None:
    """Why `import helpers` or `import course` would not give the course's packages here, or None when both
    would (every lesson)."""
    for package in PACKAGES:
        expected = HERE / package / "__init__.py"
        loaded = sys.modules.get(package)
        if loaded is not None:  # imported already in this kernel
            origin = getattr(loaded, "__file__", None)
        else:
            spec = importlib.util.find_spec(package)
            origin = spec.origin if spec is not None else None
        if origin is None:
            return (f"the course's `{package}` package is missing beside {HERE}: reinstall the course "
                    f"(run this cell again after {restart_menu()})")
        if Path(origin).resolve() == expected:
            continue
        mine = Path(origin)
        what = mine.parent if mine.name == "__init__.py" else mine
        return (f"`import {package}` finds {what}, not the course's {expected.parent}: a file or folder "
                f"named `{package}` of yours hides it. Rename yours (for example to my_{package}.py), then "
                f"{restart_menu()} and run this cell again")
    return None


def _triton_requirement() -> str:
    """The triton requirement of the course's `kernels` extra (pyproject.toml), for a CPU runtime."""
    try:
        for req in metadata.requires(DISTRIBUTION) or []:
            if req.startswith("triton") and "kernels" in req:
                return req.split(";")[0].strip()
    except metadata.PackageNotFoundError:
        pass
    return "triton>=3.3"


def _ensure_triton(lesson: str) -> str:
    """Install triton where `lesson` runs Triton kernels and it is missing -> what was done, for the line."""
    if lesson not in NEEDS_TRITON or importlib.util.find_spec("triton") is not None:
        return ""
    if not sys.platform.startswith("linux"):
        return "; no triton for this system: the Triton cells will say so and skip"
    requirement = _triton_requirement()
    print(f"set-up: installing {requirement} for this lesson's Triton kernels (about 270 MiB)...", flush=True)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", requirement],
                          capture_output=True, text=True)
    if done.returncode:
        raise CourseSetupError(f"pip could not install {requirement}:\n{(done.stdout + done.stderr)[-2000:]}")
    importlib.invalidate_caches()
    return f"; installed {requirement} for the Triton kernels"


def check(lesson: str, release: str | None = None) -> None:
    """Check that `lesson` can run here, install what only it needs, silence the known noise, and print one
    line (every lesson)."""
    quiet_known_noise()
    problem = helpers_problem()
    if problem:
        raise CourseSetupError(problem)
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a folder that is not installed (a test)
        version = "not installed"
    how = "your copy" if (HERE / "pyproject.toml").is_file() else "installed"
    note = _ensure_triton(lesson)
    if release is not None and release != RELEASE:
        note += (f"; this notebook is from release {release} but the installed course is {RELEASE}: "
                 f"pip install --force-reinstall the notebook's release, then {restart_menu()}")
    try:
        torch = f"torch {metadata.version('torch')}"
    except metadata.PackageNotFoundError:
        torch = "no torch"
    print(f"set-up: course {version} ({how}, release {RELEASE}), {torch}, Python "
          f"{sys.version_info.major}.{sys.version_info.minor}{note}")
