"""scripts/install_torch.sh picks the torch build from the NVIDIA driver, without installing anything.

Each case puts a stub `nvidia-smi` on PATH that answers like a real driver of that version (a 470 driver
cannot report the compute capability) and runs the script's dry run, which prints its one-line choice and
the pip command it would run. The rule checked is CUDA's minor-version compatibility: a build for CUDA major
M runs on any driver that meets M's minimum (13.x: 580.65.06, 12.x: 525.60.13, 11.x: 450.80.02), and the
build must hold kernels for the GPU.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "install_torch.sh"
INDEX = "https://download.pytorch.org/whl"


def _stub_smi(folder: Path, driver: str, caps: list[str] | None) -> None:
    """An `nvidia-smi` that lists one GPU per capability and reports `driver` (caps None: too old to say)."""
    gpus = caps or ["7.5"]
    lines = "\\n".join(f"GPU {i}: NVIDIA stub (UUID: GPU-{i})" for i in range(len(gpus)))
    cap_answer = ('echo \'Field "compute_cap" is not a valid field to query.\'; exit 2' if caps is None
                  else "printf '" + "\\n".join(caps) + "\\n'")
    smi = folder / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
case "$*" in
  -L) printf '{lines}\\n' ;;
  *driver_version*) printf '{driver}\\n' ;;
  *compute_cap*) {cap_answer} ;;
  *) echo "| NVIDIA-SMI {driver}  Driver Version: {driver}  CUDA Version: 12.0 |" ;;
esac
""")
    smi.chmod(0o755)


def _fake_python(folder: Path, installed: str = "", prefix: Path | None = None) -> Path:
    """A python whose torch is `installed` ("cu126 2.13.0"; none if empty), whose sys.prefix is `prefix`."""
    py = folder / "python"
    torch = f"echo '{installed}'" if installed else "exit 1"
    where = f"echo '{prefix}'" if prefix else "exit 1"
    py.write_text(f'#!/bin/sh\ncase "$*" in\n  *sys.prefix*) {where} ;;\n  *) {torch} ;;\nesac\n')
    py.chmod(0o755)
    return py


def _stub(folder: Path, name: str, answers: dict[str, str]) -> None:
    """A command `name` that prints answers[its arguments]."""
    cases = "".join(f"  '{args}') echo '{out}' ;;\n" for args, out in answers.items())
    (folder / name).write_text(f'#!/bin/sh\ncase "$*" in\n{cases}esac\n')
    (folder / name).chmod(0o755)


def _run(tmp_path: Path, driver: str | None, caps: list[str] | None = ["7.5"], *, installed: str = "",
         dry_run: bool = True, prefix: Path | None = None, mac: tuple[str, str] | None = None,
         **env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("sh", "bash", "sort", "head", "tail", "tr", "grep", "printf"):  # all the script needs
        if (path := shutil.which(tool)) and not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(path)
    if driver is not None:
        _stub_smi(bin_dir, driver, caps)
    if mac is not None:  # (machine, macOS version): uname and sw_vers answer as that Mac
        _stub(bin_dir, "uname", {"-s": "Darwin", "-m": mac[0]})
        _stub(bin_dir, "sw_vers", {"-productVersion": mac[1]})
    run_env = {"PATH": str(bin_dir), "HOME": str(tmp_path), **env}
    python = _fake_python(tmp_path, installed, prefix)
    args = ["bash", str(SCRIPT), str(python)] + (["--dry-run"] if dry_run else [])
    return subprocess.run(args, env=run_env, capture_output=True, text=True, timeout=30)


def _choice(out: subprocess.CompletedProcess) -> tuple[str, str | None]:
    """(the one `torch:` line, the index of the pip command it would run or None)."""
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stdout.splitlines() if line.startswith("torch:")]
    assert len(said) == 1, f"one line saying which build and why, got {said}"
    pip = [line for line in out.stdout.splitlines() if line.startswith("would run:")]
    index = re.search(r"--index-url (\S+)", pip[0]) if pip else None
    return said[0], (index.group(1) if index else "default" if pip else None)


@pytest.mark.parametrize("driver, build, version, index", [
    ("470.256.02", "cu118", "2.7.1", f"{INDEX}/cu118"),  # no CUDA 12 build runs: the course's oldest torch
    ("525.60.13", "cu126", "2.13.0", f"{INDEX}/cu126"),  # exactly CUDA 12's minimum
    ("550.54.15", "cu126", "2.13.0", f"{INDEX}/cu126"),  # a CUDA 12.4 driver runs the 12.6 build
    ("570.133.20", "cu126", "2.13.0", f"{INDEX}/cu126"),  # a 12.8 driver: still no CUDA 13
    ("580.82.07", "cu130", "2.13.0", f"{INDEX}/cu130"),
])
def test_the_driver_picks_the_newest_build_it_runs(tmp_path, driver, build, version, index):
    line, used = _choice(_run(tmp_path, driver, None if driver.startswith("470") else ["7.5"]))
    assert f"installing the {build} build of torch {version}" in line, line
    assert f"driver {driver}" in line and "runs on any driver >=" in line, line
    assert used == index


def test_minimums_are_exact(tmp_path):
    for driver, build in [("525.60.12", "cu118"), ("580.65.05", "cu126"), ("580.65.06", "cu130")]:
        line, _ = _choice(_run(tmp_path, driver))
        assert f"the {build} build" in line, (driver, line)


def test_no_gpu_gets_the_cpu_build_as_before(tmp_path):
    line, index = _choice(_run(tmp_path, None))
    assert "cpu build of torch 2.13.0" in line and "no NVIDIA GPU" in line, line
    assert index == f"{INDEX}/cpu"
    line, index = _choice(_run(tmp_path, None, installed="cpu 2.13.0"))
    assert "already installed" in line and index is None, line


@pytest.mark.parametrize("caps, driver, build, version", [
    (["7.0"], "580.82.07", "cu126", "2.13.0"),  # a V100: CUDA 13 builds start at Turing (7.5)
    (["12.0"], "570.133.20", "cu128", "2.7.1"),  # an RTX 5090 before driver 580: 2.13's cu126 lacks sm_120
    (["7.5", "8.0"], "550.54.15", "cu126", "2.13.0"),  # every GPU of the box must be covered
])
def test_the_gpu_architecture_must_have_kernels_in_the_build(tmp_path, caps, driver, build, version):
    line, _ = _choice(_run(tmp_path, driver, caps))
    assert f"installing the {build} build of torch {version}" in line, line


def test_a_driver_too_old_for_any_build_says_so(tmp_path):
    line, index = _choice(_run(tmp_path, "418.87.01", None))
    assert "cpu build" in line and "update the NVIDIA driver" in line and index == f"{INDEX}/cpu", line
    out = _run(tmp_path, "418.87.01", None, COURSE_TORCH="cuda")  # asked for CUDA: fail, do not fall back
    assert out.returncode == 3 and "update the NVIDIA driver" in out.stderr, out


def test_overrides(tmp_path):
    assert "keeping the installed build (cu124 2.6.0)" in _run(
        tmp_path, "550.54.15", installed="cu124 2.6.0", COURSE_TORCH="keep").stdout
    line, index = _choice(_run(tmp_path, "550.54.15", COURSE_TORCH="cpu"))
    assert "cpu build" in line and "COURSE_TORCH=cpu" in line and index == f"{INDEX}/cpu", line
    line, index = _choice(_run(tmp_path, "580.82.07", COURSE_TORCH_BUILD="cu132"))
    assert "cu132" in line and index == f"{INDEX}/cu132", line
    line, _ = _choice(_run(tmp_path, "550.54.15", installed="cu126 2.13.0"))
    assert "already installed" in line, line
    line, index = _choice(_run(tmp_path, "550.54.15", installed="cu130 2.13.0"))  # the wrong build for 550
    assert "installing the cu126 build" in line and index == f"{INDEX}/cu126", line
    bad = _run(tmp_path, None, COURSE_TORCH="gpu")
    assert bad.returncode == 2 and "COURSE_TORCH must be" in bad.stderr


def test_a_conda_environments_own_pytorch_is_kept(tmp_path):
    """`make lab VENV=$CONDA_PREFIX` (README: With conda): conda-forge's pytorch stays (issue 40)."""
    env = tmp_path / "env"
    (env / "conda-meta").mkdir(parents=True)
    (env / "conda-meta" / "pytorch-2.13.0-cuda130_h1234.json").write_text("{}")
    out = _run(tmp_path, "580.82.07", installed="cu130 2.13.0", prefix=env)
    assert out.returncode == 0 and "keeping conda's pytorch" in out.stdout, out
    assert "would run" not in out.stdout, out
    asked = _run(tmp_path, "580.82.07", installed="cu130 2.13.0", prefix=env, COURSE_TORCH="cpu")
    line, index = _choice(asked)
    assert "cpu build" in line and index == f"{INDEX}/cpu", line  # asked for: replaced
    (tmp_path / "other").mkdir()
    line, _ = _choice(_run(tmp_path / "other", None, prefix=tmp_path / "venv"))  # not conda: as before
    assert "cpu build of torch 2.13.0" in line, line


@pytest.mark.parametrize("machine, version, runs", [
    ("arm64", "14.5", True), ("arm64", "15.1", True),
    ("arm64", "13.6.1", False),  # Apple silicon on macOS 13: no torch >= 2.12 wheel
    ("x86_64", "14.5", False),  # an Intel Mac: none either
])
def test_a_mac_gets_a_torch_that_runs_or_one_line_saying_what_to_use(tmp_path, machine, version, runs):
    out = _run(tmp_path, None, mac=(machine, version))
    if runs:
        line, index = _choice(out)
        assert "cpu build of torch 2.13.0" in line, line
    else:
        assert out.returncode == 3 and "would run" not in out.stdout, out
        assert f"macOS {version} on {machine}" in out.stderr and "Colab" in out.stderr and "WSL" in out.stderr


def test_make_setup_installs_for_real():
    makefile = (REPO_ROOT / "Makefile").read_text()
    calls = re.findall(r"install_torch\.sh[^\n]*", makefile)
    assert calls and not any("--dry-run" in c for c in calls), calls
    assert os.access(SCRIPT, os.R_OK)
