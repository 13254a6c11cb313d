"""Lessons opened on a hosted notebook (Colab, Kaggle), simulated: the set-up cell installs the course, and
the lesson runs to its end from a folder outside the checkout (issue 31).

The host (tests/hosted.py) is a fresh venv that ships what Colab ships (torch, numpy, transformers, a Jupyter
kernel; linked from this interpreter) and Colab's ipywidgets major version (7), with no `make` and no course.
A lesson is copied to a folder outside the checkout and run with nbclient in the host's kernel; its set-up
cell clones the course from a local git repository holding the working tree (COURSE_SOURCE, the one source
variable) at pyproject.toml's release and installs it. Lessons 00 and 07 run at smoke sizes (07 launches the
course's scripts with torchrun).

These two runs replace nbval's run of the same lessons in `make test` (the Makefile leaves them out of nbval),
with nbval's checks: every cell runs without an error, `requires-cuda` / `requires-multi-gpu` cells are
skipped as conftest.py skips them, and after each exercise's check cell its solution runs, strict, as
conftest.py injects it (COURSE_EXERCISE_SOLUTIONS=0 turns that off there and here). No lesson compares
outputs (`# NBVAL_CHECK_OUTPUT`); one that did would fail here until this file compares them too.
A planted lesson that walks up from its working folder for `scripts/` (the old lines of lessons 07 and 08)
fails here with its StopIteration.
"""

from __future__ import annotations

import copy
import os
import sys
from importlib import metadata
from pathlib import Path

import nbformat
import pytest
from hosted import REPO_ROOT, course_source, make_host, run_notebook  # tests/hosted.py

LESSONS = ("00_setup", "07_distributed")
OLD_ROOT = ('ROOT = next(p for p in [Path.cwd(), *Path.cwd().parents] '
            'if (p / "scripts" / "train_ddp.py").is_file())')  # lesson 07's line before helpers.paths
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
    """The simulated hosted notebook: its python, the course's git URL, its seconds."""
    tmp = tmp_path_factory.mktemp("hosted")
    python, seconds = make_host(tmp / "host")
    source = course_source(tmp / "source.git")
    kept = {"torch": metadata.version("torch")}
    env = {"COURSE_SOURCE": source, "COURSE_DIR": str(tmp / "clone"), "COURSE_PROFILE": PROFILE,
           "HF_HUB_OFFLINE": "1", "COURSE_OUTPUT_DIR": None, "COURSE_ROOT": None}  # None: not in the kernel's
    print(f"\nhosted notebook: {seconds}")
    return {"python": python, "tmp": tmp, "env": env, "clone": tmp / "clone", "kept": kept}


def _setup_line(executed: nbformat.NotebookNode) -> str:
    boot = next(c for c in executed.cells if c.cell_type == "code")
    return "".join(o.get("text", "") for o in boot.outputs if o.get("output_type") == "stream")


def run_hosted(host: dict, lesson: str) -> nbformat.NotebookNode:
    """Copy `lesson` to a folder outside the checkout (Colab's /content) and run it there -> executed copy."""
    content = host["tmp"] / f"content-{lesson}"
    content.mkdir()
    nb = nbformat.read(REPO_ROOT / "notebooks" / f"{lesson}.ipynb", as_version=4)
    nbformat.write(nb, content / f"{lesson}.ipynb")  # what the learner opened, outside the checkout
    assert REPO_ROOT not in content.resolve().parents
    import json
    import time

    from helpers.device import get_device
    from helpers.results import stamp

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
    clone = host["clone"].resolve()
    # the first lesson run installs the course from the source; the next finds it installed, in the clone
    assert (f"installed the course from {host['env']['COURSE_SOURCE']}" in line
            or f"the course is installed (helpers at {clone}" in line), line
    if "installed the course" in line:
        assert f"cloned to {clone}" in line and "ipywidgets 7." in line, line
    probe = [str(host["python"]), "-c", "from importlib.metadata import version as v; import helpers; "
             "print(v('ipywidgets'), v('torch'), helpers.__file__)"]
    import subprocess

    widgets, torch_version, helpers_file = subprocess.run(probe, capture_output=True, text=True, check=True,
                                                          cwd=host["tmp"]).stdout.split()
    assert widgets.startswith("7."), f"the set-up cell replaced the host's ipywidgets 7 with {widgets}"
    assert torch_version == host["kept"]["torch"], f"set-up replaced the host's torch: {torch_version}"
    assert Path(helpers_file).resolve().is_relative_to(clone), helpers_file


WIDGET_CELL = """
import torch
from IPython.display import display
import ipywidgets
from helpers.attention import AttentionMaps
from helpers.widgets import AttentionExplorer

maps = torch.softmax(torch.randn(3, 2, 5, 5, generator=torch.Generator().manual_seed(0)), dim=-1)
explorer = AttentionExplorer(AttentionMaps(maps=maps, tokens=[f"tok{i}" for i in range(5)]))
before = explorer.figure
explorer.layer.value = 2  # what the slider does in the browser
assert explorer.figure is not before and explorer.figure.axes[0].get_title() == "layer 2, head 0"
print("ipywidgets", ipywidgets.__version__)
display(explorer.widget)
"""


@pytest.mark.timeout(600)
def test_the_widgets_work_with_the_hosts_ipywidgets_7(host: dict) -> None:
    """helpers.widgets' explorer builds, redraws and shows in the host's kernel, on Colab's ipywidgets."""
    nb = nbformat.read(REPO_ROOT / "notebooks" / "01_attention.ipynb", as_version=4)
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
def test_a_lesson_walking_up_from_its_folder_fails_there(host: dict) -> None:
    """Planted: lesson 07's parameters cell with its old line, which looks for scripts/ above the working
    folder. Run outside the checkout, it raises the bare StopIteration that issue 31 reported."""
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(REPO_ROOT / "notebooks" / "07_distributed.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    params = code[1]
    assert "ROOT = course_root()" in params.source
    params.source = "from pathlib import Path\n" + params.source.replace("ROOT = course_root()", OLD_ROOT)
    nb.cells = code[:2]
    content = host["tmp"] / "content-planted"
    content.mkdir()
    with pytest.raises(CellExecutionError, match="StopIteration"):
        run_notebook(nb, host["python"], content, host["env"])
