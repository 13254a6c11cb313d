"""The set-up stays honest: environment.yml matches pyproject.toml, and the Makefile keeps its promises."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _norm(req: str) -> str:
    return re.sub(r"\s+", "", req).lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = {_norm(r) for r in project["dependencies"] + extras["course"] + extras["test"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = {_norm(r) for r in pip_section if r.strip() != "-e ."}
    assert listed == wanted, (f"only in pyproject.toml: {sorted(wanted - listed)}; "
                              f"only in environment.yml: {sorted(listed - wanted)}")
    assert "-e ." in pip_section, "environment.yml must install the course itself (-e .)"


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


def test_readme_shows_the_latest_ladder_results():
    import importlib.util

    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "benchmarks" / "update_readme.py")
    update_readme = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(update_readme)
    assert update_readme.results_block(ROOT) in (ROOT / "README.md").read_text(), (
        "README.md's results differ from benchmarks/results/ladder-*.md: "
        "run python benchmarks/update_readme.py")
