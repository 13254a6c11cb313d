"""The release the lessons belong to, written into every place that names it, from pyproject.toml alone.

pyproject.toml holds the repository's address (`[project.urls] Repository`), the release (`[tool.course]
release`: the git tag, branch or commit the lessons belong to; "main" until the first release) and the extra
the lessons install on a hosted notebook (`[tool.course] hosted-extra`). From those this script writes:
- every lesson's set-up cell (tag `bootstrap`, the same in every lesson but for the lesson's name): on Colab,
  Kaggle or any Jupyter without the course, it pip-installs that release's archive with the extra, the host's
  torch and ipywidgets kept (floors, not pins), then runs `course_setup.check(<lesson>)`;
- `course_setup.RELEASE`, the release the installed course says it is;
- the "Open in Colab" / "Open in Kaggle" line under every lesson's title, links to that release's notebook;
- the same two links in README.md's table of lessons;
- every lesson's metadata for the hosts: Colab opens it on a GPU runtime, Kaggle on GPU T4 x2 with the
  Internet on (where it reads them).

    .venv/bin/python scripts/course_release.py           # rewrite them (after changing pyproject.toml)
    .venv/bin/python scripts/course_release.py --check   # exit 1 and name each place out of step (the tests)
    .venv/bin/python scripts/course_release.py --release 0.2.0 [--tag]   # make a release (`make release`)

A release sets the version (pyproject.toml, helpers.__version__, CITATION.cff) and the release to the tag
`v<version>`, rewrites every place above, and with --tag commits that and tags it: one command. It refuses a
version that CHANGELOG.md has no "## [<version>]" section for, so every release says what changed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
KAGGLE_BADGE = "https://kaggle.com/static/images/open-in-kaggle.svg"
BADGE_LINE = re.compile(r"^\[!\[Open in Colab\]")
README_ROW = re.compile(r"^\| `(\d\d_[a-z0-9_]+\.ipynb)` \|")

# The set-up cell (tag `bootstrap`, at most 5 lines). {archive}, {release}, {extra}, {lesson} come from
# pyproject.toml and the notebook's name. The archive URL ends its line, so the linter lets it run long.
BOOTSTRAP = '''\
import importlib.util  # set-up: installs the course on Colab or Kaggle (about 30 s); here it only checks

if not importlib.util.find_spec("course_setup"):
    %pip install -q {name}[{extra}]@{archive}
import course_setup  # if this fails, the install above did: no network? On Kaggle: Settings > Internet on

course_setup.check("{lesson}", release="{release}")'''


def release_info(root: Path = ROOT) -> dict[str, str]:
    """The repository address, the release and the hosted extra, from pyproject.toml."""
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    repo = project["project"]["urls"]["Repository"].rstrip("/")
    match = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+)", repo)
    if not match:
        raise ValueError(f"[project.urls] Repository must be https://github.com/<owner>/<name>, got {repo!r}")
    course = project["tool"]["course"]
    return {"repo": repo, "github": f"{match[1]}/{match[2]}", "release": course["release"],
            "extra": course["hosted-extra"], "name": project["project"]["name"]}


def archive_url(info: dict[str, str]) -> str:
    """GitHub's zip of the release (a tag, or a branch until the first tag), which pip installs."""
    return f"{info['repo']}/archive/{info['release']}.zip"


def bootstrap_source(info: dict[str, str], lesson: str) -> str:
    """The set-up cell's code of `lesson` (a notebook's stem) for this release."""
    return BOOTSTRAP.format(name=info["name"], extra=info["extra"], archive=archive_url(info),
                            release=info["release"], lesson=lesson)


def links(info: dict[str, str], notebook: str) -> dict[str, str]:
    """Colab's and Kaggle's address of `notebook` (a file name in notebooks/) at the release."""
    path = f"{info['github']}/blob/{info['release']}/notebooks/{notebook}"
    return {"colab": f"https://colab.research.google.com/github/{path}",
            "kaggle": f"https://kaggle.com/kernels/welcome?src=https://github.com/{path}"}


def badge_line(info: dict[str, str], notebook: str) -> str:
    """The line under a lesson's title: two badges, each a link that opens this lesson there."""
    url = links(info, notebook)
    return (f"[![Open in Colab]({COLAB_BADGE})]({url['colab']}) "
            f"[![Open in Kaggle]({KAGGLE_BADGE})]({url['kaggle']})")


def readme_cell(info: dict[str, str], notebook: str) -> str:
    """README table's last cell for `notebook`."""
    url = links(info, notebook)
    return f"[Colab]({url['colab']}) · [Kaggle]({url['kaggle']})"


# What the hosts read from a notebook's metadata to pick its runtime: Colab opens it on a GPU (a T4 on the
# free tier); Kaggle's own notebooks carry "kaggle" (GPU T4 x2: its default P100 cannot run its PyTorch, and
# lesson 07's two-GPU cells need two; the Internet on, for the set-up cell's install). The README and every
# lesson still say which runtime to pick, for a host that ignores them.
COLAB_METADATA = {"accelerator": "GPU", "colab": {"gpuType": "T4"}}
KAGGLE_METADATA = {"accelerator": "nvidiaTeslaT4", "isGpuEnabled": True, "isInternetEnabled": True,
                   "language": "python", "sourceType": "notebook"}


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def updated_notebook(nb: dict, info: dict[str, str], name: str) -> dict:
    """`nb` with its set-up cell and its header's links for this release (cell ids and the rest kept)."""
    cells = nb["cells"]
    boot = next(c for c in cells if c["cell_type"] == "code")
    if "bootstrap" not in boot.get("metadata", {}).get("tags", []):
        raise ValueError(f"{name}: the first code cell has no `bootstrap` tag")
    boot["source"] = _lines(bootstrap_source(info, name.removesuffix(".ipynb")))
    header = "".join(cells[0]["source"]).split("\n")
    at = next((i for i, line in enumerate(header) if BADGE_LINE.match(line)), None)
    if at is not None:  # wherever the lesson's header puts its badges
        header[at] = badge_line(info, name)
    else:  # first time: under the title, then a blank line
        header[1:1] = ["", badge_line(info, name)]
    cells[0]["source"] = _lines("\n".join(header))
    meta = nb.setdefault("metadata", {})
    meta["accelerator"] = COLAB_METADATA["accelerator"]
    meta["colab"] = {**meta.get("colab", {}), **COLAB_METADATA["colab"]}
    meta["kaggle"] = {**meta.get("kaggle", {}), **KAGGLE_METADATA}
    return nb


def updated_readme(text: str, info: dict[str, str]) -> str:
    """README.md with each lesson row's last cell holding its two links."""
    out = []
    for line in text.split("\n"):
        match = README_ROW.match(line)
        if match:
            cells = line.rstrip().removesuffix(" |").split(" | ")  # notebook, lesson, you leave with[, links]
            line = " | ".join([*cells[:3], readme_cell(info, match[1])]) + " |"
        out.append(line)
    return "\n".join(out)


def dumps(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def out_of_step(root: Path = ROOT, write: bool = False) -> list[str]:
    """Files whose set-up cell or links differ from pyproject.toml's release (rewritten when `write`)."""
    info = release_info(root)
    stale = []
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        text = path.read_text(encoding="utf-8")
        new = dumps(updated_notebook(json.loads(text), info, path.name))
        if new != text:
            stale.append(str(path.relative_to(root)))
            if write:
                path.write_text(new, encoding="utf-8")
    setup = root / "course_setup.py"
    text = setup.read_text(encoding="utf-8")
    new = re.sub(r'^RELEASE = "[^"]*"', f'RELEASE = "{info["release"]}"', text, count=1, flags=re.M)
    if new != text:
        stale.append("course_setup.py")
        if write:
            setup.write_text(new, encoding="utf-8")
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    new = updated_readme(text, info)
    if new != text:
        stale.append("README.md")
        if write:
            readme.write_text(new, encoding="utf-8")
    return stale


VERSION = re.compile(r"\d+\.\d+\.\d+")


def make_release(version: str, root: Path = ROOT) -> list[str]:
    """Set `version` and the release tag v<version> everywhere they are named -> the files changed."""
    if not VERSION.fullmatch(version):
        raise ValueError(f"a release version is x.y.z (for example 0.2.0), got {version!r}")
    changelog = (root / "CHANGELOG.md").read_text(encoding="utf-8")
    if not re.search(rf"^## \[{re.escape(version)}\]", changelog, re.M):
        raise ValueError(f"CHANGELOG.md has no '## [{version}] - <date>' section: say what changed first")
    edits = {  # file -> (pattern, replacement): the version and the release, each where it is named
        "pyproject.toml": [(r'^version = "[^"]*"', f'version = "{version}"'),
                           (r'^release = "[^"]*"', f'release = "v{version}"')],
        "helpers/__init__.py": [(r'^__version__ = "[^"]*"', f'__version__ = "{version}"')],
        "CITATION.cff": [(r'^version: "[^"]*"', f'version: "{version}"')],
    }
    changed = []
    for name, subs in edits.items():
        path = root / name
        text = new = path.read_text(encoding="utf-8")
        for pattern, repl in subs:
            new, n = re.subn(pattern, repl, new, count=1, flags=re.M)
            if n != 1:
                raise ValueError(f"{name}: found no line matching {pattern!r} to set")
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(name)
    return changed + out_of_step(root, write=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a file is out of step")
    parser.add_argument("--release", metavar="X.Y.Z", help="make release vX.Y.Z (CHANGELOG.md must have it)")
    parser.add_argument("--tag", action="store_true", help="with --release: git commit and git tag it")
    args = parser.parse_args(argv)
    if args.release:
        changed = make_release(args.release)
        print(f"release v{args.release}: " + (", ".join(changed) if changed else "nothing to change"))
        if args.tag:
            import subprocess

            subprocess.run(["git", "-C", str(ROOT), "commit", "-q", "-m", f"release v{args.release}", "--",
                            *changed], check=True)
            subprocess.run(["git", "-C", str(ROOT), "tag", "-a", f"v{args.release}", "-m",
                            f"release v{args.release} (CHANGELOG.md)"], check=True)
            print(f"tagged v{args.release}: push it with `git push origin main v{args.release}`")
        return 0
    stale = out_of_step(write=not args.check)
    if args.check and stale:
        print("out of step with pyproject.toml's release: " + ", ".join(stale)
              + " (run .venv/bin/python scripts/course_release.py)")
        return 1
    print(("rewrote " + ", ".join(stale)) if stale else "every lesson and README.md name the release already")
    return 0


if __name__ == "__main__":
    sys.exit(main())
