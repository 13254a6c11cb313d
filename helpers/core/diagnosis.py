"""Diagnose a broken GPU set-up: this machine's facts, what is wrong and the fix; known CUDA error messages
explained (lesson 00). Guide: docs/library/core.md#helperscorediagnosis
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from helpers.core.compat import version_tuple
from helpers.core.device import driver_cuda_version, nvidia_driver, nvidia_smi
from helpers.core.tables import Table

__all__ = ["Finding", "KNOWN_ERRORS", "MIN_DRIVER", "explain_error", "OOMReport", "Compilers", "SetupFacts",
           "driver_runs", "compiler_fix", "diagnose", "findings_table"]

# CUDA major -> the oldest Linux driver that runs every build of that major (minor-version compatibility;
# the CUDA toolkit release notes' table, Linux x86-64); scripts/install_torch.sh keeps the same table
MIN_DRIVER = {13: "580.65.06", 12: "525.60.13", 11: "450.80.02"}
REINSTALL = "bash scripts/install_torch.sh .venv/bin/python"  # picks the build from the driver and the GPU


@dataclass(frozen=True)
class Finding:
    """One check of the set-up: what was checked, whether it is fine, what was seen, the fix (lesson 00)."""

    check: str
    ok: bool
    detail: str
    fix: str = ""


# (pattern in an error message, cause, fix): the breakages learners report most
KNOWN_ERRORS = [
    (r"Found no NVIDIA driver|no CUDA-capable device",
     "torch is a CUDA build but no working NVIDIA driver / GPU is visible",
     "on a GPU box install the NVIDIA driver (nvidia-smi must work); on a CPU box use the CPU build: "
     "COURSE_TORCH=cpu make setup"),
    (r"driver version is insufficient|NVIDIA driver on your system is too old"
     r"|CUDA driver version is insufficient",
     "the NVIDIA driver is older than the minimum of the CUDA major torch was built for (13.x needs "
     f"{MIN_DRIVER[13]}, 12.x {MIN_DRIVER[12]}; within a major any newer driver works)",
     f"let the course pick the build this driver runs: {REINSTALL} (it reads the driver version), or "
     "update the NVIDIA driver"),
    (r"no kernel image is available|is not compatible with the current PyTorch installation",
     "this torch build has no kernels for the GPU's architecture (CUDA 13 builds start at Turing, 7.5; "
     "CUDA 12.6 builds stop at Hopper, 9.0)",
     f"{REINSTALL} picks a build with kernels for this GPU"),
    (r"Failed to find C compiler|Failed to find C\+\+ compiler|No working C\+\+ compiler|InvalidCxxCompiler",
     "Triton (GPU kernels) needs a C compiler and torch.compile's CPU code a C++ one, and none was found",
     "install one: Debian/Ubuntu/WSL `sudo apt install build-essential`, Fedora/RHEL `sudo dnf install gcc "
     "gcc-c++`, macOS `xcode-select --install`, conda `conda install -c conda-forge cxx-compiler`"),
    (r"Torch not compiled with CUDA enabled",
     "a CPU-only torch build is installed",
     "on a GPU box install the CUDA build: COURSE_TORCH=cuda make setup"),
    (r"libcudart\.so[\d.]*: cannot open shared object file|libcudart",
     "a library expects the CUDA runtime (libcudart) from a system CUDA toolkit that is not on the "
     "loader's path (torch's own wheels ship theirs)",
     "install the package's CUDA-bundled wheel, or the CUDA toolkit matching it and add its lib64 "
     "folder to LD_LIBRARY_PATH; mixing a system CUDA with pip wheels of another version is the usual cause"),
    (r"CUDA out of memory|OutOfMemoryError",
     "the GPU ran out of memory",
     "smaller batch or sequence, mixed precision, activation checkpointing (lesson 03)"),
]


def explain_error(message: str) -> str | None:
    """The cause and fix of a known CUDA set-up error message, or None for an unknown one (lesson 00)."""
    for pattern, cause, fix in KNOWN_ERRORS:
        if re.search(pattern, message, flags=re.IGNORECASE):
            return f"{cause}. Fix: {fix}"
    return None


_SIZE = r"([\d.]+) (GiB|MiB|KiB|bytes|B)\b"
_UNITS = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "bytes": 1, "B": 1}


def _bytes(match: re.Match | None) -> int | None:
    return None if match is None else int(float(match.group(1)) * _UNITS[match.group(2)])


@dataclass(frozen=True)
class OOMReport:
    """What an out-of-memory error asked for and what the device held, from its message (lesson 00)."""

    device: str  # "cuda:0", "cpu"
    asked_bytes: int | None  # the allocation that failed
    total_bytes: int | None  # the device's capacity
    free_bytes: int | None  # free on the device when it failed
    allocated_bytes: int | None  # held by PyTorch's tensors then

    @classmethod
    def parse(cls, err: BaseException) -> "OOMReport | None":
        """The report of `err`, or None when it is not an out-of-memory error."""
        msg = str(err)
        cuda = isinstance(err, torch.cuda.OutOfMemoryError) or "CUDA out of memory" in msg
        cpu = isinstance(err, RuntimeError) and re.search(r"out of memory|can't allocate|not enough mem", msg)
        if not (cuda or cpu):
            return None
        gpu = re.search(rf"GPU (\d+) has a total capacity of {_SIZE} of which {_SIZE} is free", msg)
        asked = re.search(rf"(?i)tried to allocate {_SIZE}", msg)
        return cls(device=f"cuda:{gpu.group(1)}" if gpu else "cuda" if cuda else "cpu",
                   asked_bytes=_bytes(asked),
                   total_bytes=int(float(gpu.group(2)) * _UNITS[gpu.group(3)]) if gpu else None,
                   free_bytes=int(float(gpu.group(4)) * _UNITS[gpu.group(5)]) if gpu else None,
                   allocated_bytes=_bytes(re.search(rf"memory {_SIZE} is allocated by PyTorch", msg)))

    def __str__(self) -> str:
        def gib(n: int | None) -> str:
            return "?" if n is None else f"{n / 2**30:.2f} GiB"

        held = (f"; {gib(self.allocated_bytes)} held by PyTorch, {gib(self.free_bytes)} free of "
                f"{gib(self.total_bytes)}" if self.total_bytes else "")
        return f"out of memory on {self.device}: asked for {gib(self.asked_bytes)}{held}"


@dataclass(frozen=True)
class Compilers:
    """The compilers torch.compile and Triton would find, and the OS family the fix is for (lesson 00)."""

    c: str | None  # Triton's: $CC, else gcc, else clang (triton/runtime/build.py)
    cxx: str | None  # Inductor's C++ (CPU code): $CXX, else g++ (clang++ on macOS)
    os_family: str  # "debian", "fedora", "macos", "windows" or "linux" (unknown distribution)

    @classmethod
    def find(cls) -> "Compilers":
        cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")
        default_cxx = "clang++" if sys.platform == "darwin" else "g++"
        cxx = os.environ.get("CXX") or default_cxx
        return cls(c=shutil.which(cc) if cc else None, cxx=shutil.which(cxx), os_family=_os_family())


def _os_family() -> str:
    if sys.platform == "darwin":
        return "macos"
    if sys.platform == "win32":
        return "windows"
    try:
        release = Path("/etc/os-release").read_text().lower()
    except OSError:
        return "linux"
    ids = " ".join(re.findall(r"^(?:id|id_like)=\"?([^\"\n]+)", release, re.M))
    return ("debian" if re.search(r"debian|ubuntu", ids) else
            "fedora" if re.search(r"fedora|rhel|centos|rocky|alma", ids) else "linux")


def compiler_fix(os_family: str) -> str:
    """How to install a C and C++ compiler on this OS family (lesson 00)."""
    fixes = {"debian": "sudo apt install build-essential (Debian, Ubuntu, WSL)",
             "fedora": "sudo dnf install gcc gcc-c++",
             "macos": "xcode-select --install (Apple's command-line tools: clang, clang++)",
             "windows": "use WSL (the course's Linux path) and, inside it, sudo apt install build-essential"}
    conda = "in a conda environment: conda install -c conda-forge cxx-compiler"
    return fixes.get(os_family, "your distribution's gcc and g++ packages") + f"; {conda}"


@dataclass(frozen=True)
class SetupFacts:
    """What `diagnose` looks at; `gather()` reads this machine's (lesson 00). Optional fields: None = not
    looked at, that check left out."""

    torch_cuda: str | None  # torch.version.cuda: None for a CPU-only build
    torch_sees_gpu: bool  # torch.cuda.is_available()
    smi_gpus: list[str] | None  # lines of `nvidia-smi -L`; None when nvidia-smi is missing or fails
    driver_cuda: str | None  # "CUDA Version" in nvidia-smi's header
    visible_devices: str | None  # $CUDA_VISIBLE_DEVICES
    driver: str | None = None  # the driver's own version, "535.104.05"
    compilers: Compilers | None = None
    gpu_caps: list[tuple[int, int]] | None = None  # compute capability of each GPU torch sees
    arch_list: list[str] | None = None  # torch.cuda.get_arch_list(): the kernels the build ships

    @classmethod
    def gather(cls) -> "SetupFacts":
        out = nvidia_smi("-L")
        sees = torch.cuda.is_available()
        return cls(torch_cuda=torch.version.cuda, torch_sees_gpu=sees,
                   smi_gpus=None if out is None else [ln for ln in out.splitlines() if ln.startswith("GPU")],
                   driver_cuda=driver_cuda_version(), visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                   driver=nvidia_driver(), compilers=Compilers.find(),
                   gpu_caps=[torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
                   if sees else None,
                   arch_list=torch.cuda.get_arch_list() if sees else None)


def driver_runs(torch_cuda: str, driver: str | None, driver_cuda: str | None) -> tuple[bool, str]:
    """(whether a driver runs a torch built for CUDA `torch_cuda`, why), by minor-version compatibility
    (lesson 00)."""
    major = version_tuple(torch_cuda)[0]
    minimum = MIN_DRIVER.get(major)
    if minimum is None:  # before CUDA 11 there was no minor-version compatibility: driver >= toolkit
        ok = driver_cuda is not None and version_tuple(driver_cuda)[:2] >= version_tuple(torch_cuda)[:2]
        return ok, (f"CUDA {torch_cuda} predates minor-version compatibility: the driver must support "
                    f"{torch_cuda}")
    if driver is not None:
        ok = version_tuple(driver) >= version_tuple(minimum)
        seen = f"driver {driver}"
    elif driver_cuda is not None:  # only the header known: the driver's CUDA major decides
        ok = version_tuple(driver_cuda)[0] >= major
        seen = f"a driver for CUDA {driver_cuda}"
    else:
        return False, "no driver version to compare"
    rule = f"a CUDA {major}.x build runs on any driver >= {minimum} (minor-version compatibility)"
    return ok, f"{seen}; {rule}"


def _has_kernels(cap: tuple[int, int], arch_list: list[str]) -> bool:
    # an sm_XY binary runs on its own major at the same or a later minor, compute_XY PTX on any later GPU
    # (torch._check_cubins)
    cc = cap[0] * 10 + cap[1]
    for arch in arch_list:
        kind, _, num = arch.partition("_")
        if not num.isdigit():
            continue
        n = int(num)
        if (kind == "sm" and n // 10 == cap[0] and n <= cc) or (kind == "compute" and n <= cc):
            return True
    return False


def diagnose(facts: SetupFacts | None = None) -> list[Finding]:
    """Check the GPU set-up: what is broken and how to fix it (default: this machine's facts) (lesson 00)."""
    f = facts or SetupFacts.gather()
    torch_cuda, torch_sees_gpu, smi_gpus = f.torch_cuda, f.torch_sees_gpu, f.smi_gpus
    driver_cuda, visible_devices = f.driver_cuda, f.visible_devices
    findings = [Finding("torch build", True, f"torch {torch.__version__}, "
                        + (f"built with CUDA {torch_cuda}" if torch_cuda else "CPU-only build"))]
    has_gpu = bool(smi_gpus)
    findings.append(Finding("NVIDIA driver", True,
                            "nvidia-smi not found: no NVIDIA driver on this machine" if smi_gpus is None
                            else f"nvidia-smi lists {len(smi_gpus)} GPU(s), driver supports CUDA "
                                 f"{driver_cuda}"))
    if torch_cuda and smi_gpus is None:
        findings.append(Finding("CUDA build without a driver", False,
                                "torch is a CUDA build but there is no NVIDIA driver (nvidia-smi missing)",
                                "fine on a CPU box, but it is GBs of unused CUDA libraries: COURSE_TORCH=cpu "
                                "make setup installs the CPU build; on a GPU box install the NVIDIA driver"))
    if torch_cuda is None and has_gpu:
        findings.append(Finding("CPU-only torch on a GPU box", False,
                                "nvidia-smi sees a GPU but torch is a CPU-only build, so every lesson "
                                "runs on the CPU",
                                "COURSE_TORCH=cuda make setup (installs the CUDA build of torch)"))
    if torch_cuda and (f.driver or driver_cuda):
        runs, why = driver_runs(torch_cuda, f.driver, driver_cuda)
        if runs:
            findings.append(Finding("driver and torch build", True,
                                    f"torch built for CUDA {torch_cuda}, {why}: fine"))
        else:
            findings.append(Finding("driver too old for this torch", False,
                                    f"torch built for CUDA {torch_cuda}, {why}",
                                    f"{REINSTALL} installs the newest build this driver runs; or "
                                    "update the NVIDIA driver"))
    if f.gpu_caps and f.arch_list:
        missing = sorted({cap for cap in f.gpu_caps if not _has_kernels(cap, f.arch_list)})
        if missing:
            caps = ", ".join(f"{a}.{b}" for a, b in missing)
            findings.append(Finding("no kernels for this GPU", False,
                                    f"compute capability {caps}; this torch ships {' '.join(f.arch_list)}",
                                    f"{REINSTALL} picks a build with kernels for this GPU (CUDA 13 builds "
                                    "start at 7.5, CUDA 12.6 builds stop at 9.0)"))
    if visible_devices is not None and visible_devices.strip() in ("", "-1") and has_gpu:
        findings.append(Finding("GPUs hidden", False,
                                f"CUDA_VISIBLE_DEVICES={visible_devices!r} hides every GPU",
                                "unset CUDA_VISIBLE_DEVICES or list the GPU indices to use"))
    if torch_cuda and has_gpu and not torch_sees_gpu and all(f.ok for f in findings):
        findings.append(Finding("torch cannot use the GPU", False,
                                "torch is a CUDA build, the driver sees a GPU, but "
                                "torch.cuda.is_available() is False",
                                "run python -c 'import torch; torch.zeros(1).cuda()' and look the message up "
                                "with helpers.core.diagnosis.explain_error"))
    if f.compilers is not None:
        c = f.compilers
        if c.c and c.cxx:
            findings.append(Finding("C and C++ compiler", True, f"{c.c}, {c.cxx}: torch.compile (lessons 04, "
                                    "05, 08) and Triton's GPU kernels (lesson 01) can build their code"))
        else:
            lacking = " and ".join(name for name, found in (("C", c.c), ("C++", c.cxx)) if not found)
            findings.append(Finding("no C/C++ compiler", False,
                                    f"no {lacking} compiler found ($CC/gcc/clang, $CXX/"
                                    f"{'clang++' if c.os_family == 'macos' else 'g++'}): torch.compile "
                                    "(lessons 04, 05, 08) and Triton on a GPU (lesson 01) will fail to build",
                                    compiler_fix(c.os_family)))
    findings.append(Finding("torch can use a GPU", True, "yes" if torch_sees_gpu else
                            "no: the lessons run on the CPU with the smoke sizes"))
    return findings


def findings_table(findings: list[Finding]) -> Table:
    """Findings of `diagnose` as a table: check, status, what was seen, the fix (lesson 00)."""
    t = Table(["check", "status", "seen", "fix"], title="Diagnosis")
    for f in findings:
        t.add(f.check, "ok" if f.ok else "PROBLEM", f.detail, f.fix or None)
    return t
