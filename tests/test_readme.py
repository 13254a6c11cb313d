"""Every command the README shows runs as written (issue 31): `make` targets that exist, the venv's
interpreter (`.venv/bin/python`, never a bare `python` that assumes an activated venv), paths that exist,
and a clone of the repository pyproject.toml names, entered by its folder name."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BARE = ("python", "python3", "pip", "pip3", "torchrun", "jupyter", "pytest")  # need an activated venv
TOP = ("scripts", "benchmarks", "docker", "notebooks", "docs", "helpers", "course", "ci", "site", "tests")
GENERATED = re.compile(r"<!-- results:begin.*?<!-- results:end -->", re.S)  # benchmarks/update_results.py's


def _targets(makefile: str) -> set[str]:
    return {m for line in makefile.splitlines() for m in re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", line)}


def _commands(text: str) -> list[str]:
    """Shell commands of the README: each line of its bash blocks (continuations joined), and each inline
    code span that starts like a command."""
    text = GENERATED.sub("", text)
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        found += [line for line in block.replace("\\\n", " ").splitlines()
                  if line.strip() and not line.lstrip().startswith("#")]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)", prose):
        span = " ".join(span.split())
        if re.match(r"(\w+=\S+ )*(make( |$)|\.venv/bin/|python3? |torchrun |git clone |sbatch |bash )", span):
            found.append(span)
    return found


def problems(readme: str, root: Path = ROOT) -> list[str]:
    """What in `readme`'s commands names a missing target or path, or runs a bare interpreter."""
    targets = _targets((root / "Makefile").read_text())
    repo = tomllib.loads((root / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    out = []
    for line in _commands(readme):
        for command in re.split(r"\s*(?:&&|;|\|)\s*", line.split(" #")[0]):
            try:
                words = shlex.split(command)
            except ValueError:
                words = command.split()
            while words and re.match(r"^[A-Z_]+=", words[0]):
                words = words[1:]  # VAR=value before the command
            if not words:
                continue
            if words[0] in BARE:
                out.append(f"{command!r}: a bare {words[0]} needs an activated venv: .venv/bin/{words[0]}")
            if words[0] == "make":
                out += [f"{command!r}: no make target {w!r}" for w in words[1:]
                        if not w.startswith(("-", "[")) and "=" not in w and w not in targets]
            if words[:2] == ["git", "clone"] and words[2] != repo + ".git":
                out.append(f"{command!r}: the repository is {repo}.git (pyproject.toml)")
            if words[0] == "cd" and "clone" in line and words[1] != repo.rsplit("/", 1)[1]:
                out.append(f"{command!r}: the clone's folder is {repo.rsplit('/', 1)[1]}")
            for word in words:
                path = word.split("=", 1)[-1].rstrip(".,:;)")
                if path.split("/")[0] in TOP and "<" not in path and "*" not in path \
                        and not (root / path).exists():
                    out.append(f"{command!r}: {path} does not exist")
    return out


@pytest.mark.parametrize("page", ["README.md", "docs/setup.md", "docs/testing.md", "docs/results.md"])
def test_every_readme_command_names_what_exists(page):
    """The README and the pages its set-up details moved to (issue 38)."""
    assert problems((ROOT / page).read_text()) == []


def test_the_readme_is_short():
    """The shape of the best project READMEs: what it is, get started, the lessons, reuse, where next."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[:3] == ["## Get started", "## The lessons", "## Reuse the helpers in your own code"]


def test_a_missing_target_path_or_a_bare_python_is_found():
    planted = ("```bash\nmake lab\nmake nosuch-target\n.venv/bin/python scripts/no_such_script.py\n```\n"
               "then `python benchmarks/ladder.py --greedy` and `make test PYTEST_ARGS=-x`\n")
    found = problems(planted)
    assert len(found) == 3, found
    assert "nosuch-target" in found[0] and "no_such_script.py" in found[1] and "bare python" in found[2]


# --- every lesson in the README (issue 50) ------------------------------------------------------------------

def _release_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_release", ROOT / "scripts" / "course_release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lessons_missing(readme: str, notebooks: list[str], root: Path = ROOT) -> list[str]:
    """What the README lacks for each lesson: its row in the table of lessons, with the lesson's Colab and
    Kaggle links at the release; and one step of the path line per lesson."""
    release = _release_script()
    info = release.release_info(root)
    rows = {m[1]: line for line in readme.split("\n") if (m := release.README_ROW.match(line))}
    out = []
    for name in notebooks:
        if name not in rows:
            out.append(f"{name}: no row in the table of lessons")
            continue
        out += [f"{name}: its row lacks the {host} link {url}"
                for host, url in release.links(info, name).items() if url not in rows[name]]
    path = next((line for line in readme.split("\n\n") if "The path runs" in line), "")
    steps = path.split("The path runs", 1)[-1].split(". ")[0].count("→") + 1 if path else 0
    if steps != len(notebooks):
        out.append(f"the path line names {steps} steps for {len(notebooks)} lessons")
    return out


def test_every_lesson_has_its_row_and_its_links():
    """Issue 50: lesson 09 was missing from the table and from the path line; the next lesson added is
    caught the same way, whatever its number."""
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert lessons_missing((ROOT / "README.md").read_text(), notebooks) == []


def test_a_lesson_without_its_row_or_link_is_found():
    readme = (ROOT / "README.md").read_text()
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    last = notebooks[-1]
    row = next(line for line in readme.split("\n") if line.startswith(f"| `{last}`"))
    dropped = lessons_missing(readme.replace(row + "\n", ""), notebooks)
    assert dropped == [f"{last}: no row in the table of lessons"]
    unlinked = lessons_missing(readme.replace(row, row.split(" · ")[0] + " |"), notebooks)
    assert len(unlinked) == 1 and "kaggle link" in unlinked[0]
    assert "steps for" in lessons_missing(readme, notebooks + ["99_new_lesson.ipynb"])[-1]
