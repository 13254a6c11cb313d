"""The learner's copy of the lessons (issue 31): `make lab` copies the lessons into an ignored folder, where
edits live; `git pull` of a new release and `make test` never see them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from hosted import REPO_ROOT, course_source  # tests/hosted.py

spec = importlib.util.spec_from_file_location("copy_lessons", REPO_ROOT / "scripts" / "copy_lessons.py")
copy_lessons = importlib.util.module_from_spec(spec)
spec.loader.exec_module(copy_lessons)


def test_new_lessons_are_copied_untouched_ones_refreshed_edited_ones_kept(tmp_path):
    src, dst = tmp_path / "notebooks", tmp_path / "my-lessons"
    src.mkdir()
    for name in ("a", "b"):
        (src / f"{name}.ipynb").write_text(f"{name} v1")
    assert copy_lessons.copy_lessons(src, dst)["copied"] == ["a.ipynb", "b.ipynb"]
    (dst / "a.ipynb").write_text("a v1 + my answer")  # the learner's edit
    for name in ("a", "b", "c"):  # the next release changes a and b and adds c
        (src / f"{name}.ipynb").write_text(f"{name} v2")
    done = copy_lessons.copy_lessons(src, dst)
    assert done["copied"] == ["c.ipynb"] and done["updated"] == ["b.ipynb"], done
    assert done["kept, changed by the release"] == ["a.ipynb"], done
    assert (dst / "a.ipynb").read_text() == "a v1 + my answer" and (dst / "b.ipynb").read_text() == "b v2"
    assert "compare yours with" in copy_lessons.summary(done, src, dst)
    again = copy_lessons.copy_lessons(src, dst)  # nothing new: the edit still kept, nothing else done
    assert not again["copied"] and not again["updated"]
    assert again["kept, changed by the release"] == ["a.ipynb"]
    assert copy_lessons.copy_lessons(src, src) == {k: [] for k in done}  # the same folder


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args], cwd=cwd,
                          capture_output=True, text=True)


def test_git_pull_after_the_learners_edits_has_no_conflict(tmp_path):
    """A temporary clone: the learner copies the lessons, edits one, a lesson writes its outputs; upstream
    changes the same lesson; `git pull` merges cleanly, nothing is left to commit, the edit survives, and the
    linter of `make test` (ruff, which honours .gitignore) does not read the learner's folder."""
    origin = Path(course_source(tmp_path / "origin").removeprefix("file://"))
    learner = tmp_path / "learner"
    assert _git(tmp_path, "clone", "--quiet", str(origin), str(learner)).returncode == 0
    run = [sys.executable, "scripts/copy_lessons.py", "notebooks", "my-lessons"]
    assert subprocess.run(run, cwd=learner, check=True, capture_output=True, text=True).stdout
    mine = learner / "my-lessons" / "03_memory.ipynb"
    answer = ('"cells": [\n  {"cell_type": "code", "id": "mine", "metadata": {}, "outputs": [], '
              '"execution_count": null, "source": ["import os,sys  # my unlinted answer"]},')
    mine.write_text(mine.read_text().replace('"cells": [', answer, 1))
    for out in (learner / "my-lessons" / "outputs" / "06_input_pipeline",
                learner / "notebooks" / "outputs" / "06_input_pipeline"):  # a lesson run in either folder
        out.mkdir(parents=True)
        (out / "lesson06_trace.json").write_text("{}")
    release = origin / "notebooks" / "03_memory.ipynb"
    release.write_text(release.read_text().replace("Where GPU memory goes", "Where GPU memory goes (v2)", 1))
    assert _git(origin, "commit", "--quiet", "-am", "a new release of lesson 03").returncode == 0

    pulled = _git(learner, "pull", "--quiet", "--no-rebase")
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert _git(learner, "status", "--porcelain").stdout == "", "the learner's files show up in git"
    assert "(v2)" in (learner / "notebooks" / "03_memory.ipynb").read_text()
    assert "my unlinted answer" in mine.read_text()
    again = subprocess.run(run, cwd=learner, check=True, capture_output=True, text=True).stdout
    assert "this release changed lessons you edited" in again, again
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=learner, capture_output=True,
                          text=True)
    assert lint.returncode == 0, "ruff read the learner's folder:\n" + lint.stdout[-2000:]
    assert subprocess.run([sys.executable, "-m", "ruff", "check", str(mine)], cwd=learner,
                          capture_output=True).returncode == 1, "planted: ruff finds the answer itself"


def test_make_test_never_collects_the_learners_folder():
    makefile = (REPO_ROOT / "Makefile").read_text()
    folder = next(line.split("?=")[1].strip() for line in makefile.splitlines()
                  if line.startswith("LESSONS "))
    recipe = makefile[makefile.index("\ntest:"):].split("\n\n")[0]
    assert recipe.rstrip().endswith("tests notebooks") and folder not in recipe, recipe
    for path in (f"{folder}/x.ipynb", "notebooks/outputs/x.json"):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_ROOT)
        assert ignored.returncode == 0, f"{path} must be ignored (.gitignore)"
