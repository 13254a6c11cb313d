"""Diagnose a broken GPU set-up: the facts of this machine (torch build, driver, visible GPUs), what is
wrong with them and the fix; and the known CUDA error messages explained (lesson 00)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch

from helpers.compat import version_tuple
from helpers.device import driver_cuda_version, nvidia_smi
from helpers.tables import Table

__all__ = ["Finding", "KNOWN_ERRORS", "explain_error", "SetupFacts", "diagnose", "findings_table"]


@dataclass(frozen=True)
class Finding:
    """One check of the set-up: what was checked, whether it is fine, what was seen, the fix (lesson 00)."""

    check: str
    ok: bool
    detail: str
    fix: str = ""


# (pattern in an error message, cause, fix): the breakages learners report most
KNOWN_ERRORS = [
    (r"Found no NVIDIA driver|NVIDIA driver on your system|no CUDA-capable device",
     "torch is a CUDA build but no working NVIDIA driver / GPU is visible",
     "on a GPU box install the NVIDIA driver (nvidia-smi must work); on a CPU box use the CPU build: "
     "COURSE_TORCH=cpu make setup"),
    (r"driver version is insufficient|NVIDIA driver on your system is too old"
     r"|CUDA driver version is insufficient",
     "the NVIDIA driver is older than the CUDA version torch was built with",
     "update the driver (it must support at least torch.version.cuda), or install a torch built for "
     "an older CUDA (pip install torch --index-url https://download.pytorch.org/whl/cu118, for example)"),
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


@dataclass(frozen=True)
class SetupFacts:
    """What `diagnose` looks at; `SetupFacts.gather()` reads them off this machine (lesson 00)."""

    torch_cuda: str | None  # torch.version.cuda: None for a CPU-only build
    torch_sees_gpu: bool  # torch.cuda.is_available()
    smi_gpus: list[str] | None  # lines of `nvidia-smi -L`; None when nvidia-smi is missing or fails
    driver_cuda: str | None  # "CUDA Version" in nvidia-smi's header
    visible_devices: str | None  # $CUDA_VISIBLE_DEVICES

    @classmethod
    def gather(cls) -> "SetupFacts":
        out = nvidia_smi("-L")
        return cls(torch_cuda=torch.version.cuda, torch_sees_gpu=torch.cuda.is_available(),
                   smi_gpus=None if out is None else [ln for ln in out.splitlines() if ln.startswith("GPU")],
                   driver_cuda=driver_cuda_version(), visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))


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
    if torch_cuda and driver_cuda and version_tuple(driver_cuda)[:2] < version_tuple(torch_cuda)[:2]:
        findings.append(Finding("driver too old for this torch", False,
                                f"torch needs CUDA {torch_cuda}; the driver supports up to CUDA "
                                f"{driver_cuda}",
                                "update the NVIDIA driver, or install a torch built for CUDA "
                                f"{driver_cuda} or older"))
    if visible_devices is not None and visible_devices.strip() in ("", "-1") and has_gpu:
        findings.append(Finding("GPUs hidden", False,
                                f"CUDA_VISIBLE_DEVICES={visible_devices!r} hides every GPU",
                                "unset CUDA_VISIBLE_DEVICES or list the GPU indices to use"))
    if torch_cuda and has_gpu and not torch_sees_gpu and all(f.ok for f in findings):
        findings.append(Finding("torch cannot use the GPU", False,
                                "torch is a CUDA build, the driver sees a GPU, but "
                                "torch.cuda.is_available() is False",
                                "run python -c 'import torch; torch.zeros(1).cuda()' and look the message up "
                                "with helpers.diagnosis.explain_error"))
    findings.append(Finding("torch can use a GPU", True, "yes" if torch_sees_gpu else
                            "no: the lessons run on the CPU with the smoke sizes"))
    return findings


def findings_table(findings: list[Finding]) -> Table:
    """Findings of `diagnose` as a table: check, status, what was seen, the fix (lesson 00)."""
    t = Table(["check", "status", "seen", "fix"], title="Diagnosis")
    for f in findings:
        t.add(f.check, "ok" if f.ok else "PROBLEM", f.detail, f.fix or None)
    return t
