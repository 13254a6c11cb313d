"""course.paths: what a lesson opens at run time ships inside the package, found from the installed helpers
wherever the notebook runs, and lessons write what the learner opens under ./outputs (issues 31, 38)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from course import paths

REPO = Path(__file__).resolve().parents[1]


def test_the_scripts_solutions_and_sample_data_are_in_the_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a folder with nothing of the course in it, as on Colab
    assert paths.script("train_ddp") == REPO / "course" / "scripts" / "train_ddp.py"
    assert paths.script("slurm/train_ddp.sbatch").is_file()
    assert (paths.solutions_dir() / "01_attention" / "flash_forward.py").is_file()
    assert paths.sample_data().is_file()
    assert paths.checkout_root() == REPO


def test_an_unknown_script_is_named_with_the_known_ones():
    with pytest.raises(FileNotFoundError, match="no script 'train_dp'.*train_ddp"):
        paths.script("train_dp")


def test_an_installed_copy_has_no_checkout(tmp_path):
    """course/paths.py loaded from a copy of the package in a site-packages folder (a pip install)."""
    where = tmp_path / "site-packages"
    (where / "course").mkdir(parents=True)
    shutil.copy(REPO / "course" / "paths.py", where / "course" / "paths.py")
    spec = importlib.util.spec_from_file_location("copied_paths", where / "course" / "paths.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.checkout_root() is None
    assert module.solutions_dir() == where / "course" / "solutions"


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
