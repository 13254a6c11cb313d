"""The GPU workflow (.github/workflows/gpu.yml) tests what learners run: one job per GPU class.

Read as YAML (no runner here): a matrix over runner labels of a T4-class, a 24 GB, an A100 and an H100/H200
runner, each checking its GPU first (`nvidia-smi`, then torch's CUDA and the class's memory and capability),
running the suite with the profile unset (the sizes fitted to that GPU), and keeping its executed notebooks
as an artifact named by class. The class check itself is run here against the faked GPU classes of
tests/fakegpu.py: each board is accepted by exactly its own class.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from fakegpu import GPU_CLASSES, fake_gpu

yaml = pytest.importorskip("yaml")

WORKFLOW = Path(__file__).resolve().parent.parent / ".github" / "workflows" / "gpu.yml"
# the fake boards and the class each belongs to (V100: no class of its own, so none must accept it)
EXPECTED = {"T4": "t4", "2xT4": "t4", "RTX3090": "24gb", "RTX4090": "24gb", "L4": "24gb", "A100-40": "a100",
            "A100-80": "a100", "H100": "h100", "H200": "h100", "V100-16": None}


def _job() -> dict:
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    matrixed = [j for j in jobs.values() if "matrix" in j.get("strategy", {})]
    assert len(matrixed) == 1, "one job with a matrix over GPU classes"
    return matrixed[0]


def _class_check(job: dict) -> tuple[dict, str]:
    step = next(s for s in job["steps"] if "torch.cuda.is_available()" in s.get("run", ""))
    code = textwrap.dedent(re.search(r"<<'PY'\n(.*?)\n\s*PY\s*$", step["run"], re.S).group(1))
    return step, code


def test_the_matrix_covers_the_classes_learners_have():
    assert set(EXPECTED) == set(GPU_CLASSES), "every faked board is placed in a class (or none)"
    job = _job()
    rows = job["strategy"]["matrix"]["include"]
    assert job["strategy"].get("fail-fast") is False, "one class failing must not cancel the others"
    assert len({r["label"] for r in rows}) == len(rows) >= 4, rows
    assert "${{ matrix.label }}" in job["runs-on"] and "self-hosted" in job["runs-on"], job["runs-on"]
    caps = {r["class"]: r["capability"].split() for r in rows}
    assert caps.get("t4") == ["7.5"] and "8.0" in caps.get("a100", []) and "9.0" in caps.get("h100", [])
    assert any(r["min_gib"] <= 23.5 <= r["max_gib"] for r in rows), "a 24 GB class"


def test_the_gpu_is_checked_before_anything_runs():
    steps = _job()["steps"]
    runs = [s.get("run", "") for s in steps]
    first_run = next(i for i, r in enumerate(runs) if r)
    assert runs[first_run].strip() == "nvidia-smi", f"nvidia-smi first, got {runs[first_run]!r}"
    check = next(i for i, r in enumerate(runs) if "torch.cuda.is_available()" in r)
    work = [i for i, r in enumerate(runs) if re.search(r"make (test|course)", r)]
    assert work and check < min(work), "assert CUDA before the tests run"


@pytest.mark.parametrize("board", sorted(EXPECTED))
def test_each_board_is_accepted_by_its_class_only(monkeypatch, board):
    job = _job()
    step, code = _class_check(job)
    fake_gpu(monkeypatch, board)
    accepted = []
    for row in job["strategy"]["matrix"]["include"]:
        for var, expr in step["env"].items():  # ${{ matrix.x }} -> the row's value
            monkeypatch.setenv(var, str(row[re.search(r"matrix\.(\w+)", expr).group(1)]))
        try:
            exec(compile(code, "gpu.yml", "exec"), {})
        except AssertionError:
            continue
        accepted.append(row["class"])
    assert accepted == ([EXPECTED[board]] if EXPECTED[board] else []), (board, accepted)


def test_the_profile_is_left_unset_so_sizes_fit_the_gpu():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    job = _job()
    envs = [workflow.get("env", {}), job.get("env", {}), *(s.get("env", {}) for s in job["steps"])]
    assert not any("COURSE_PROFILE" in e for e in envs), "COURSE_PROFILE must stay unset"
    tests = [s["run"] for s in job["steps"] if "make test" in s.get("run", "")]
    assert tests, "the job runs make test"
    for run in tests:  # the Makefile defaults TEST_PROFILE to smoke: it must be emptied, not set
        assert re.search(r"TEST_PROFILE=(\s|$)", run) and not re.search(r"TEST_PROFILE=\w", run), run
    assert any("make course" in s.get("run", "") for s in job["steps"])


def test_executed_notebooks_are_kept_per_class():
    uploads = [s for s in _job()["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert len(uploads) == 1, uploads
    up = uploads[0]
    assert up.get("if") == "always()", "keep the notebooks of a failed run too"
    assert "${{ matrix.class }}" in up["with"]["name"] and up["with"]["path"].rstrip("/") == "build"
