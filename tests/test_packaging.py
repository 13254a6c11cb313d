"""The set-up stays honest: environment.yml matches pyproject.toml, and the Makefile keeps its promises."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def _environment() -> tuple[list, list[str]]:
    """environment.yml's conda dependencies and its pip section."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return conda, pip_section


def test_environment_yml_matches_pyproject():
    """Every requirement of pyproject.toml (dependencies, test extra) is in environment.yml with the same
    specifier: torch as conda-forge's `pytorch` (CPU build where there is no GPU), the rest by pip."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = {_norm(r) for r in project["dependencies"] + extras["course"] + extras["kernels"] + extras["lab"]
               + extras["test"]}
    conda, pip_section = _environment()
    listed = {_norm(r) for r in pip_section if r.strip() != "-e ."}
    torch_req = next(r for r in wanted if re.match(r"torch\b", r))
    assert _norm("py" + torch_req) in {_norm(c) for c in conda}, (
        f"environment.yml must take {torch_req} from conda-forge as pytorch (a pip torch is the CUDA wheel)")
    assert not any(re.match(r"torch\b", r) for r in listed), "torch must not come from pip in environment.yml"
    listed.add(torch_req)
    assert listed == wanted, (f"only in pyproject.toml: {sorted(wanted - listed)}; "
                              f"only in environment.yml: {sorted(listed - wanted)}")
    assert "-e ." in pip_section, "environment.yml must install the course itself (-e .)"
    assert "cpuonly" not in conda, "cpuonly does not change a pip torch, and conda-forge's pytorch needs none"


def test_python_range_is_the_same_everywhere():
    """pyproject.toml's floor, environment.yml's pin and the set-up check (scripts/make_venv.sh) agree."""
    floor = re.fullmatch(r">=(3\.\d+)", tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "requires-python"].split("#")[0].strip())[1]
    script = (ROOT / "scripts" / "make_venv.sh").read_text()
    low = re.search(r"^MIN=(\S+)", script, re.M)[1]
    high = re.search(r"^TESTED_MAX=(\S+)", script, re.M)[1]
    conda, _ = _environment()
    python = next(c for c in conda if c.startswith("python"))
    assert low == floor, (low, floor)
    minor = int(high.split(".")[1])
    assert _norm(python) == f"python>={floor},<3.{minor + 1}", python


def test_the_readmes_library_install_takes_the_tested_set():
    """`pip install .` as the README writes it installs the newest tested set (issue 40), and that set is the
    one `make test` runs in: each pin of ci/constraints-newest.txt equals the version installed here."""
    from importlib.metadata import version

    readme = (ROOT / "README.md").read_text()
    assert "`pip install . -c ci/constraints-newest.txt`" in readme
    pins = dict(line.split("==") for line in (ROOT / "ci" / "constraints-newest.txt").read_text().splitlines()
                if line and not line.startswith("#"))
    assert "torch" in pins and "transformers" in pins
    here = {name: version(name).split("+")[0] for name in pins}
    assert pins == here, f"ci/constraints-newest.txt is not the set make test ran: {pins} vs {here}"
    setup = (ROOT / "docs" / "setup.md").read_text()
    assert f"| newest | 3.11 | {pins['torch']} | {pins['transformers']} |" in setup


def test_torch_is_a_range_not_a_pin():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_req = next(d for d in deps if re.match(r"torch\b", d))
    assert ">=" in torch_req and "==" not in torch_req


def test_lab_binds_loopback_and_keeps_the_token():
    makefile = (ROOT / "Makefile").read_text()
    lab = makefile[makefile.index("\nlab:"):].split("\n\n")[0]
    assert "--ServerApp.ip=127.0.0.1" in lab
    for unsafe in ("token=''", 'token=""', "token= ", "0.0.0.0", "disable_check_xsrf", "allow_origin"):
        assert unsafe not in lab


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    assert "make test" in (ROOT / "README.md").read_text()
    assert "environment.yml" in (ROOT / "README.md").read_text(), "the README names the conda route"


def test_results_page_shows_the_latest_ladder_results():
    import importlib.util

    spec = importlib.util.spec_from_file_location("update_results", ROOT / "benchmarks" / "update_results.py")
    update_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(update_results)
    assert update_results.results_block(ROOT) in (ROOT / update_results.PAGE).read_text(), (
        f"{update_results.PAGE}'s results differ from benchmarks/results/ladder-*.md: "
        "run .venv/bin/python benchmarks/update_results.py")
    assert "(docs/results.md)" in (ROOT / "README.md").read_text(), "the README links the results page"


def test_the_wheel_ships_what_the_course_opens_and_the_build_warns_of_nothing(tmp_path):
    """Building the wheel names every package it ships (setuptools warns of an importable folder it would
    drop), and the wheel holds what lessons open at run time: every module, the solutions, the sample data,
    the Slurm script, py.typed."""
    import shutil
    import subprocess
    import sys
    import zipfile

    src = tmp_path / "src"  # a clean copy: a build/ left in the checkout would lend the wheel stale files
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "course_setup.py"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("helpers", "course"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path), str(src)], capture_output=True, text=True, timeout=600,
                           cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    warned = [line for line in (built.stdout + built.stderr).splitlines()
              if "would be ignored" in line or "absent from the `packages`" in line]
    assert not warned, warned
    (wheel,) = tmp_path.glob("*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    wanted = {p.relative_to(ROOT).as_posix() for folder in ("helpers", "course")
              for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert wanted <= shipped, sorted(wanted - shipped)[:10]
    assert any(n.startswith("course/solutions/01_attention/") for n in shipped)
    assert {"course/scripts/slurm/train_ddp.sbatch", "course/sample_data/sample.csv",
            "helpers/py.typed", "course_setup.py"} <= shipped
