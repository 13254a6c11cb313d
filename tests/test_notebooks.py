"""Every lesson is committed clean and follows the course's skeleton (DESIGN.md)."""

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SECTIONS = ("What you will learn", "What we measured on this machine", "Exercises", "Further reading")


def _cells(path):
    return json.loads(path.read_text())["cells"]


def test_there_are_lessons():
    assert NOTEBOOKS, "no notebooks found in notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    dirty = [i for i, c in enumerate(_cells(path))
             if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_follows_the_lesson_skeleton(path):
    cells = _cells(path)
    code = [c for c in cells if c["cell_type"] == "code"]
    assert "bootstrap" in code[0].get("metadata", {}).get("tags", []), \
        f"{path.name}: the first code cell is set-up (tag `bootstrap`), before any import of helpers"
    assert "parameters" in code[1].get("metadata", {}).get("tags", []), \
        f"{path.name}: the second code cell must carry the `parameters` tag"
    assert re.search(r"^PROFILE = None\b", "".join(code[1]["source"]), re.M), \
        f"{path.name}: the parameters cell holds plain values, PROFILE = None first (papermill -p PROFILE)"
    assert "sizes" in code[2].get("metadata", {}).get("tags", []), \
        f"{path.name}: the cell after the parameters cell picks the sizes (tag `sizes`)"
    assert "get_profile(PROFILE)" in "".join(code[2]["source"]), \
        f"{path.name}: the sizes cell reads the profile the parameters cell names"
    first_md = "".join(next(c for c in cells if c["cell_type"] == "markdown")["source"])
    assert "**Time:**" in first_md, \
        f"{path.name}: the first markdown cell gives the time it takes (**Time:**)"
    markdown = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    missing = [s for s in SECTIONS if s not in markdown]
    assert not missing, f"{path.name}: missing sections {missing}"


# --- where learners are (issue 31): the set-up cell, the links, the header, the closing lines
ROOT = Path(__file__).resolve().parents[1]


def _release_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_release", ROOT / "scripts" / "course_release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_setup_cell_and_links_follow_the_release_in_pyproject():
    """Every set-up cell is the same, and it and every Colab/Kaggle link name pyproject.toml's release."""
    release = _release_script()
    assert release.out_of_step(ROOT) == [], "run .venv/bin/python scripts/course_release.py"
    boots = {"".join(next(c for c in _cells(p) if c["cell_type"] == "code")["source"]) for p in NOTEBOOKS}
    assert len(boots) == 1, "the set-up cells differ between lessons"
    info = release.release_info(ROOT)
    for path in NOTEBOOKS:
        header = "".join(_cells(path)[0]["source"])
        for url in release.links(info, path.name).values():
            assert url in header, f"{path.name}: its header lacks {url}"


def test_a_stale_link_or_setup_cell_is_found(tmp_path):
    """The check above fails on a lesson whose link or set-up cell names another release (planted)."""
    import shutil

    release = _release_script()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "notebooks").mkdir()
    for path in NOTEBOOKS[:2]:
        shutil.copy(path, tmp_path / "notebooks" / path.name)
    assert release.out_of_step(tmp_path) == []
    stale = tmp_path / "notebooks" / NOTEBOOKS[1].name
    stale.write_text(stale.read_text().replace("/blob/main/", "/blob/v0.0.9/", 1))
    readme = tmp_path / "README.md"
    readme.write_text(readme.read_text().replace("/blob/main/notebooks/00_", "/blob/old/notebooks/00_"))
    assert release.out_of_step(tmp_path) == [f"notebooks/{NOTEBOOKS[1].name}", "README.md"]


def _number(path: Path) -> str:
    return path.name[:2]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_header_says_what_is_downloaded_online(path):
    time_line = next(line for line in "".join(_cells(path)[0]["source"]).split("\n") if "**Time:**" in line)
    assert "`bert-base-uncased`" in time_line and "440 MB" in time_line, (
        f"{path.name}: the Time line must say that online, lessons 01 and 08 download bert-base-uncased "
        "(~440 MB)")
    assert "MiniLM" in time_line, f"{path.name}: the Time line must say its times are the offline MiniLM's"


USES = {"05": {"04"}, "06": {"04"}, "08": {"01", "03", "04"}}  # lessons a later lesson builds on (issue 32)


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if _number(p) in USES], ids=lambda p: p.name)
def test_prerequisites_name_the_lessons_used(path):
    import re

    header = "".join(_cells(path)[0]["source"])
    prereq = header[header.index("**Prerequisites:**"):].split("\n\n")[0]
    named = set(re.findall(r"\b0\d\b", prereq))
    missing = USES[_number(path)] - named
    assert not missing, f"{path.name}: prerequisites lack lessons {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_ends_with_what_it_taught_and_what_comes_next(path):
    last = _cells(path)[-1]
    text = "".join(last["source"])
    assert last["cell_type"] == "markdown" and text.startswith("**What this lesson taught:**"), (
        f"{path.name}: the last cell says in one line what the lesson taught")
    paragraphs = text.split("\n\n")
    assert len(paragraphs) == 2 and paragraphs[1].startswith("**What comes next:**"), paragraphs
    later = [p for p in NOTEBOOKS if p.name > path.name]
    if later:
        assert f"lesson {_number(later[0])}" in paragraphs[1], f"{path.name}: name the next lesson"


def test_no_lesson_writes_to_tmp_or_walks_up_from_its_folder():
    """What a lesson writes goes under outputs/ beside the notebook (helpers.paths.output_dir), and the
    course's files are found by helpers.paths.course_root(): never /tmp, never a walk up from the working
    folder."""
    import re

    bad = re.compile(r"Path\.cwd\(\)\.parents|mkdtemp\((?![^)]*\bdir=)|gettempdir|[\"']/tmp\b")
    found = [f"{p.name} cell {i}: {line.strip()}" for p in NOTEBOOKS for i, c in enumerate(_cells(p))
             if c["cell_type"] == "code" for line in "".join(c["source"]).split("\n") if bad.search(line)]
    assert not found, found
