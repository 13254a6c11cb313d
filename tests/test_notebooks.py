"""Every lesson is committed clean and follows the course's skeleton (DESIGN.md)."""

import ast
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


def _source(cell) -> str:
    return "".join(cell["source"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_follows_the_lesson_skeleton(path):
    """The first screen (issue 38): the install cell (at most 5 lines, it checks this lesson), plain values in
    the parameters cell, one call that sets the lesson up; then the sections every lesson has."""
    cells = _cells(path)
    code = [c for c in cells if c["cell_type"] == "code"]
    boot = _source(code[0])
    assert "bootstrap" in code[0].get("metadata", {}).get("tags", []), \
        f"{path.name}: the first code cell is set-up (tag `bootstrap`), before any import of helpers"
    assert len([ln for ln in boot.splitlines() if ln.strip()]) <= 5, f"{path.name}: the install cell is long"
    assert f'course_setup.check("{path.stem}"' in boot, f"{path.name}: the install cell checks another lesson"
    assert "parameters" in code[1].get("metadata", {}).get("tags", []), \
        f"{path.name}: the second code cell must carry the `parameters` tag"
    params = _source(code[1])
    assert re.search(r"^PROFILE = None\b", params, re.M), \
        f"{path.name}: the parameters cell holds plain values, PROFILE = None first (papermill -p PROFILE)"
    for node in ast.parse(params).body:  # papermill rewrites plain values only
        assert isinstance(node, ast.Assign), f"{path.name}: the parameters cell holds assignments only"
        ast.literal_eval(node.value)  # a plain value, or ValueError naming the node
    assert "setup" in code[2].get("metadata", {}).get("tags", []), \
        f"{path.name}: the cell after the parameters cell sets the lesson up (tag `setup`)"
    assert f"lesson{path.name[:2]}.setup(PROFILE" in _source(code[2]), \
        f"{path.name}: the set-up cell calls course.lessons.lesson{path.name[:2]}.setup(PROFILE, ...)"
    first_md = _source(next(c for c in cells if c["cell_type"] == "markdown"))
    assert "**Time:**" in first_md, \
        f"{path.name}: the first markdown cell gives the time it takes (**Time:**)"
    markdown = "\n".join(_source(c) for c in cells if c["cell_type"] == "markdown")
    missing = [s for s in SECTIONS if s not in markdown]
    assert not missing, f"{path.name}: missing sections {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_colab_opens_it_on_a_gpu_runtime(path):
    """Colab opens a notebook on a GPU runtime when its metadata says so (a T4 on the free tier); Kaggle's own
    notebooks name GPU T4 x2 and the Internet switch as below (its P100 default cannot run its PyTorch)."""
    meta = json.loads(path.read_text())["metadata"]
    assert meta.get("accelerator") == "GPU" and meta.get("colab", {}).get("gpuType") == "T4", meta
    kaggle = meta.get("kaggle", {})
    assert kaggle.get("accelerator") == "nvidiaTeslaT4" and kaggle.get("isGpuEnabled") is True \
        and kaggle.get("isInternetEnabled") is True, f"{path.name}: Kaggle's metadata {kaggle}"


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
    boots = {_source(next(c for c in _cells(p) if c["cell_type"] == "code")).replace(p.stem, "<lesson>")
             for p in NOTEBOOKS}
    assert len(boots) == 1, "the set-up cells differ between lessons (but for the lesson's name)"
    info = release.release_info(ROOT)
    for path in NOTEBOOKS:
        header = "".join(_cells(path)[0]["source"])
        for url in release.links(info, path.name).values():
            assert url in header, f"{path.name}: its header lacks {url}"


def test_a_stale_link_or_setup_cell_is_found(tmp_path):
    """The check above fails on a lesson whose link or set-up cell names another release (planted)."""
    import shutil

    release = _release_script()
    for name in ("pyproject.toml", "README.md", "course_setup.py"):
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


DOWNLOADS = ("01", "08")  # lessons that download bert-base-uncased when the hub answers


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_header_says_what_is_downloaded_online(path):
    """The Time line is one short line; a lesson that downloads a model says so in its header."""
    header = _source(_cells(path)[0])
    time_line = next(line for line in header.split("\n") if "**Time:**" in line)
    if _number(path) in DOWNLOADS:
        assert "`bert-base-uncased`" in header and "440 MB" in header, (
            f"{path.name}: the header must say that online it downloads bert-base-uncased (~440 MB)")
        assert "MiniLM" in header, f"{path.name}: the header must say its times are the offline MiniLM's"
    assert time_line.strip(), path.name


# lessons a later lesson builds on (issue 32)
USES = {"05": {"04"}, "06": {"04"}, "08": {"01", "03", "04"}, "09": {"03", "04", "08"}}


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
    """What a lesson writes goes under outputs/ beside the notebook (course.paths.output_dir), and the
    course's files are found by course.paths (script, solutions_dir): never /tmp, never a walk up from the
    working folder."""
    import re

    bad = re.compile(r"Path\.cwd\(\)\.parents|mkdtemp\((?![^)]*\bdir=)|gettempdir|[\"']/tmp\b")
    found = [f"{p.name} cell {i}: {line.strip()}" for p in NOTEBOOKS for i, c in enumerate(_cells(p))
             if c["cell_type"] == "code" for line in "".join(c["source"]).split("\n") if bad.search(line)]
    assert not found, found


# --- exercise prompts (issue 50) ----------------------------------------------------------------------------

PROMPT_WORDS = 120  # the task of an exercise, read before writing it; what the check does is a collapsed note


def prompt_words(task: str) -> int:
    """Words of an exercise's task cell a learner reads: its heading and its collapsed `<details>` note left
    out, links counted by their text."""
    text = re.sub(r"<details>.*?</details>", " ", task, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return len(re.sub(r"<[^>]+>", " ", text).split())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_exercise_prompts_are_short(path):
    long = {_source(c).splitlines()[0]: prompt_words(_source(c)) for c in _cells(path)
            if "exercise-task" in c.get("metadata", {}).get("tags", [])}
    assert all(n <= PROMPT_WORDS for n in long.values()), {k: n for k, n in long.items() if n > PROMPT_WORDS}


def test_a_long_prompt_is_counted_and_a_collapsed_note_is_not():
    task = "### Exercise x\n\nWrite it. [the solution](../x.py)\n<details><summary>s</summary>\n\n" + \
        "word " * 500 + "\n</details>\n"
    assert prompt_words(task) == 4
    assert prompt_words(task.replace("<details>", "")) > PROMPT_WORDS  # planted: the note left open
