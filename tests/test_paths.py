"""helpers.paths: the course's folder is found from the installed helpers, never from the working folder, and
lessons write what the learner opens under ./outputs (issue 31)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from helpers import paths

REPO = Path(__file__).resolve().parents[1]


def test_course_root_is_the_checkout_from_any_working_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.ROOT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)  # a folder with no scripts/ anywhere above it, as on Colab
    assert paths.course_root() == REPO
    assert (paths.course_root() / "scripts" / "train_ddp.py").is_file()


def _copied_helpers(where: Path):
    """helpers/paths.py loaded from a copy of the package in `where` (a non-editable install's layout)."""
    (where / "helpers").mkdir(parents=True)
    shutil.copy(REPO / "helpers" / "paths.py", where / "helpers" / "paths.py")
    spec = importlib.util.spec_from_file_location("copied_paths", where / "helpers" / "paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_helpers_outside_a_course_folder_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.ROOT_ENV, raising=False)
    copied = _copied_helpers(tmp_path / "site-packages")
    with pytest.raises(FileNotFoundError, match=r"non-editable.*pip install -e.*COURSE_ROOT"):
        copied.course_root()
    monkeypatch.setenv(paths.ROOT_ENV, str(REPO))  # the fix it names
    assert copied.course_root() == REPO


def test_a_wrong_course_root_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(paths.ROOT_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="COURSE_ROOT=.*is not the course's folder"):
        paths.course_root()


def test_output_dir_is_beside_the_notebook_or_where_named(tmp_path, monkeypatch):
    monkeypatch.delenv(paths.OUTPUT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    out = paths.output_dir("06_input_pipeline")
    assert out == (tmp_path / "outputs" / "06_input_pipeline").resolve() and out.is_dir()
    (out / "trace.json").write_text("{}")
    assert (paths.output_dir("06_input_pipeline") / "trace.json").exists()  # kept by default
    assert not any(paths.output_dir("06_input_pipeline", fresh=True).iterdir())  # emptied with fresh
    monkeypatch.setenv(paths.OUTPUT_ENV, str(tmp_path / "elsewhere"))
    assert paths.output_dir("07_distributed") == (tmp_path / "elsewhere" / "07_distributed").resolve()


@pytest.mark.parametrize("bad", ["", "..", ".", "a/b", "/tmp/x", None])
def test_output_dir_refuses_anything_but_a_folder_name(bad):
    with pytest.raises(ValueError, match="plain folder name"):
        paths.output_dir(bad)
