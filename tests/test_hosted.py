"""Lessons opened on a hosted notebook (Colab, Kaggle), simulated: the set-up cell installs the course, and
the lesson runs to its end from a folder outside the checkout (issue 31).

The host (tests/hosted.py) is a fresh venv that ships what Colab ships (torch, numpy, transformers, a Jupyter
kernel; linked from this interpreter) and Colab's ipywidgets major version (7), with no `make` and no course.
A lesson is copied to a folder outside the checkout and run with nbclient in the host's kernel; its install
cell (the short one every lesson opens with) pip-installs the course from a zip of the working tree laid out
as GitHub's zip of the release, the one line that differs from what Colab runs. Lessons 00 and 07 run at smoke
sizes (07 launches the course's scripts, shipped in the package, with torchrun).

These two runs replace nbval's run of the same lessons in `make test` (the Makefile leaves them out of nbval),
with nbval's checks: every cell runs without an error, `requires-cuda` / `requires-multi-gpu` cells are
skipped as conftest.py skips them, and after each exercise's check cell its solution runs, strict, as
conftest.py injects it (COURSE_EXERCISE_SOLUTIONS=0 turns that off there and here). No lesson compares
outputs (`# NBVAL_CHECK_OUTPUT`); one that did would fail here until this file compares them too.
A planted cell that looks for the course's files beside the notebook fails here: the notebook is not in the
course's folder.
"""

from __future__ import annotations

import copy
import os
import sys
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
from hosted import (  # tests/hosted.py
    REPO_ROOT,
    course_archive,
    cpu_runtime,
    hosted_copy,
    make_host,
    run_notebook,
)

LESSONS = ("00_setup", "07_distributed")
EXECUTED = REPO_ROOT / "build" / "hosted"  # the executed lessons, kept (test_site.py builds a page from one)
INJECTED = "injected-solution"  # tag of the solution cells added here (site/build.py leaves them out)
PROFILE = os.environ.get("COURSE_PROFILE", "smoke")  # make test's TEST_PROFILE


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def as_nbval_runs(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of `nb` holding the cells nbval runs under `make test`: tagged GPU cells skipped without GPUs,
    each exercise's solution cell after its check cell (conftest.py's injection)."""
    conftest = sys.modules.get("conftest") or pytest.importorskip("conftest")
    gpus = _gpus()
    inject = os.environ.get(conftest.EXERCISE_SOLUTIONS_ENV, "1") != "0"
    out = copy.deepcopy(nb)
    out.cells = []
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell.cell_type == "code" and "NBVAL_CHECK_OUTPUT" in cell.source:
            pytest.fail("a cell compares its output (NBVAL_CHECK_OUTPUT): teach test_hosted.py to compare")
        if cell.cell_type == "code" and (("requires-cuda" in tags and gpus < 1)
                                         or ("requires-multi-gpu" in tags and gpus < 2)):
            continue
        out.cells.append(cell)
        if inject and "exercise-check" in tags:
            source = conftest._exercise_solution_source(cell.metadata["exercise"], cell.source)
            out.cells.append(nbformat.v4.new_code_cell(source, metadata={"tags": [INJECTED]}))
    return out


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The simulated hosted notebook: its python, the course's zip, its seconds."""
    tmp = tmp_path_factory.mktemp("hosted")
    python, seconds = make_host(tmp / "host")
    archive = course_archive(tmp / "course.zip")
    kept = {"torch": metadata.version("torch")}
    # None: not in the kernel's environment
    env = {"COURSE_PROFILE": PROFILE, "HF_HUB_OFFLINE": "1", "COURSE_OUTPUT_DIR": None}
    print(f"\nhosted notebook: {seconds}")
    return {"python": python, "tmp": tmp, "env": env, "archive": archive, "kept": kept}


@pytest.mark.timeout(300)
def test_without_network_the_install_cell_names_the_internet_switch(host: dict) -> None:
    """Kaggle with its Internet switch off: pip cannot reach the release, and the line that fails says what to
    do. Runs first, while the host has no course (pytest keeps this file's order)."""
    from nbclient.exceptions import CellExecutionError

    nb = hosted_copy("00_setup", "https://course.invalid/fast-transformers-course.zip")  # no such host
    nb.cells = [next(c for c in nb.cells if c.cell_type == "code")]
    content = host["tmp"] / "content-offline"
    content.mkdir()
    # pip's retries (5 by default: about 8 s of back-off against a name that never resolves) change nothing
    # in the line checked here
    with pytest.raises(CellExecutionError) as failed:
        run_notebook(nb, host["python"], content, {**host["env"], "PIP_RETRIES": "0"})
    assert "No module named 'course_setup'" in str(failed.value), failed.value
    assert "Settings > Internet on" in str(failed.value), failed.value


def _setup_line(executed: nbformat.NotebookNode) -> str:
    boot = next(c for c in executed.cells if c.cell_type == "code")
    return "".join(o.get("text", "") for o in boot.outputs if o.get("output_type") == "stream")


def run_hosted(host: dict, lesson: str) -> nbformat.NotebookNode:
    """Copy `lesson` to a folder outside the checkout (Colab's /content) and run it there -> executed copy."""
    content = host["tmp"] / f"content-{lesson}"
    content.mkdir()
    nb = hosted_copy(lesson, host["archive"])
    nbformat.write(nb, content / f"{lesson}.ipynb")  # what the learner opened, outside the checkout
    assert REPO_ROOT not in content.resolve().parents
    import json
    import time

    from course.results import stamp
    from helpers.core.device import get_device

    start = time.perf_counter()
    executed = run_notebook(as_nbval_runs(nb), host["python"], content, host["env"])
    seconds = time.perf_counter() - start
    EXECUTED.mkdir(parents=True, exist_ok=True)
    nbformat.write(executed, EXECUTED / f"{lesson}.ipynb")  # with its stamp: what site/build.py reads
    info = {**stamp(get_device()), "profile": PROFILE, "seconds": seconds, "where": "a simulated Colab"}
    (EXECUTED / f"{lesson}.stamp.json").write_text(json.dumps(info, indent=1))
    return executed


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_runs_on_a_hosted_notebook(host: dict, lesson: str) -> None:
    executed = run_hosted(host, lesson)
    line = _setup_line(executed)
    # the first lesson run installs the course; the next finds it installed: either way the check's one line
    assert "set-up: course " in line and "(installed, release " in line, line
    assert f"torch {host['kept']['torch']}" in line, line
    probe = [str(host["python"]), "-c", "from importlib.metadata import version as v; import helpers; "
             "print(v('ipywidgets'), v('torch'), helpers.__file__)"]
    import subprocess

    widgets, torch_version, helpers_file = subprocess.run(probe, capture_output=True, text=True, check=True,
                                                          cwd=host["tmp"]).stdout.split()
    assert widgets.startswith("7."), f"the set-up cell replaced the host's ipywidgets 7 with {widgets}"
    assert torch_version == host["kept"]["torch"], f"set-up replaced the host's torch: {torch_version}"
    venv = host["python"].parent.parent
    assert Path(helpers_file).resolve().is_relative_to(venv), helpers_file
    no_triton = subprocess.run([str(host["python"]), "-c", "import importlib.util as u; "
                                "print(u.find_spec('triton') is None)"], capture_output=True, text=True)
    assert no_triton.stdout.strip() == "True" or not cpu_runtime(), (
        f"{lesson} installed triton on a CPU runtime")
    assert not Path(helpers_file).resolve().is_relative_to(REPO_ROOT), helpers_file


WIDGET_CELL = """
import torch
import ipywidgets
from helpers.model.attention import AttentionMaps
from course.widgets import AttentionExplorer

maps = torch.softmax(torch.randn(3, 2, 5, 5, generator=torch.Generator().manual_seed(0)), dim=-1)
explorer = AttentionExplorer(AttentionMaps(maps=maps, tokens=[f"tok{i}" for i in range(5)]))
before = explorer.figure
explorer.layer.value = 2  # what the slider does in the browser
assert explorer.figure is not before and explorer.figure.axes[0].get_title() == "layer 2, head 0"
print("ipywidgets", ipywidgets.__version__)
explorer  # shown as a lesson shows it: the cell's value
"""


@pytest.mark.timeout(600)
def test_the_widgets_work_with_the_hosts_ipywidgets_7(host: dict) -> None:
    """course.widgets' explorer builds, redraws and shows in the host's kernel, on Colab's ipywidgets."""
    nb = hosted_copy("00_setup", host["archive"])  # lesson 01's widgets; its triton is not needed here
    boot = next(c for c in nb.cells if c.cell_type == "code")
    nb.cells = [boot, nbformat.v4.new_code_cell(WIDGET_CELL)]
    content = host["tmp"] / "content-widgets"
    content.mkdir()
    executed = run_notebook(nb, host["python"], content, host["env"])
    outputs = executed.cells[1].outputs
    assert any("ipywidgets 7.7" in o.get("text", "") for o in outputs), outputs
    views = [o["data"]["application/vnd.jupyter.widget-view+json"] for o in outputs
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert views and views[0]["version_major"] == 2, outputs  # ipywidgets 7's view protocol


@pytest.mark.timeout(600)
def test_a_lesson_reading_the_course_beside_the_notebook_fails_there(host: dict) -> None:
    """Planted: a cell that opens the training script beside the notebook, as a lesson that assumed the
    course's folder would. Run where a hosted notebook runs, it fails: the harness is not in the checkout."""
    from nbclient.exceptions import CellExecutionError

    nb = hosted_copy("07_distributed", host["archive"])
    boot = next(c for c in nb.cells if c.cell_type == "code")
    planted = nbformat.v4.new_code_cell(
        'from pathlib import Path\nPath("course/scripts/train_ddp.py").read_text()')
    nb.cells = [boot, planted]
    content = host["tmp"] / "content-planted"
    content.mkdir()
    with pytest.raises(CellExecutionError, match="FileNotFoundError"):
        run_notebook(nb, host["python"], content, host["env"])


@pytest.mark.timeout(300)
def test_a_helpers_py_of_yours_beside_the_notebook_is_named(host: dict) -> None:
    """A learner's own helpers.py in the notebook's folder hides the course's package: the install cell stops,
    naming the file and the fix, instead of the next cell failing with "No module named 'helpers.core'"."""
    from nbclient.exceptions import CellExecutionError

    nb = hosted_copy("00_setup", host["archive"])
    nb.cells = [next(c for c in nb.cells if c.cell_type == "code")]
    content = host["tmp"] / "content-shadowed"
    content.mkdir()
    (content / "helpers.py").write_text("def load(path):\n    return open(path).read()\n")
    with pytest.raises(CellExecutionError) as failed:
        run_notebook(nb, host["python"], content, host["env"])
    assert "CourseSetupError" in str(failed.value) and str(content / "helpers.py") in str(failed.value)
