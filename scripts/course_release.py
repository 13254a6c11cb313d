"""The release the lessons belong to, written into every place that names it, from pyproject.toml alone.

pyproject.toml holds the repository's address (`[project.urls] Repository`), the release (`[tool.course]
release`: the git tag, branch or commit the lessons belong to; "main" until the first release) and the extra
the lessons install on a hosted notebook (`[tool.course] hosted-extra`). From those this script writes:
- every lesson's set-up cell (tag `bootstrap`, the same in every lesson): on Colab, Kaggle or any Jupyter
  without the course, it clones that release and installs it (`pip install -e '<clone>[<extra>]'`), torch,
  triton and ipywidgets left as the host has them;
- the "Open in Colab" / "Open in Kaggle" line under every lesson's title, links to that release's notebook;
- the same two links in README.md's table of lessons.

    .venv/bin/python scripts/course_release.py           # rewrite them (after changing pyproject.toml)
    .venv/bin/python scripts/course_release.py --check   # exit 1 and name each place out of step (the tests)
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

# The set-up cell. {source}, {release}, {extra} come from pyproject.toml; everything else is fixed here.
BOOTSTRAP = '''\
# Set-up, the same in every lesson. Where the course is installed (`make lab`), it only says so. On Colab,
# Kaggle or a Jupyter without it, it clones the release below and installs it, the host's torch left as it is.
import importlib.util
import os

COURSE_SOURCE = os.environ.get(  # a git URL, or a folder holding the course
    "COURSE_SOURCE", "{source}")
COURSE_RELEASE = "{release}"  # the tag, branch or commit these notebooks belong to
COURSE_EXTRA = "{extra}"  # what the lessons need on top of helpers (pyproject.toml's extras)
KEEP = ("torch", "triton", "ipywidgets")  # the host's builds stay: its CUDA torch, its notebook front end


def install_course():
    import re
    import site
    import subprocess
    import sys
    import tempfile
    import time
    from importlib import metadata
    from pathlib import Path

    def run(*cmd):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            output = (done.stdout + done.stderr)[-3000:]
            raise RuntimeError(f"set-up: `{{' '.join(cmd)}}` failed:\\n{{output}}")

    start = time.perf_counter()
    if Path(COURSE_SOURCE).expanduser().is_dir():  # a folder: used as it is
        where, how = Path(COURSE_SOURCE).expanduser().resolve(), "the folder"
    else:  # a git URL: that release, cloned once into $COURSE_DIR (default ~/fast-transformers-course)
        where = Path(os.environ.get("COURSE_DIR", "~/fast-transformers-course")).expanduser().resolve()
        how = f"{{COURSE_SOURCE}} at {{COURSE_RELEASE}}, cloned to"
        if not (where / "pyproject.toml").is_file():
            if re.fullmatch(r"[0-9a-f]{{7,40}}", COURSE_RELEASE):  # a commit: clone, then check it out
                run("git", "clone", "--quiet", COURSE_SOURCE, str(where))
                run("git", "-C", str(where), "checkout", "--quiet", COURSE_RELEASE)
            else:  # a tag or a branch
                run("git", "clone", "--quiet", "--depth", "1", "--branch", COURSE_RELEASE, COURSE_SOURCE,
                    str(where))
    kept = {{}}
    for name in KEEP:
        try:
            kept[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pins:
        pins.write("".join(f"{{n}}=={{v}}\\n" for n, v in kept.items()))
    run(sys.executable, "-m", "pip", "install", "--quiet", "-c", pins.name, "-e",
        f"{{where}}[{{COURSE_EXTRA}}]")
    for folder in [*site.getsitepackages(), site.getusersitepackages()]:
        site.addsitedir(folder)  # this kernel sees the editable install without a restart
    importlib.invalidate_caches()
    if importlib.util.find_spec("helpers") is None:
        raise RuntimeError("set-up: the course is installed but this kernel cannot import it yet: "
                           "restart the kernel (Runtime > Restart session), then run this cell again")
    kept_text = ", ".join(f"{{n}} {{v}}" for n, v in kept.items()) or "nothing"
    print(f"set-up: installed the course from {{how}} {{where}} in {{time.perf_counter() - start:.0f}} s; "
          f"kept the host's {{kept_text}}")


if importlib.util.find_spec("helpers") is None:
    install_course()
else:
    print(f"set-up: the course is installed (helpers at {{importlib.util.find_spec('helpers').origin}})")'''


def release_info(root: Path = ROOT) -> dict[str, str]:
    """The repository address, the release and the hosted extra, from pyproject.toml."""
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    repo = project["project"]["urls"]["Repository"].rstrip("/")
    match = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+)", repo)
    if not match:
        raise ValueError(f"[project.urls] Repository must be https://github.com/<owner>/<name>, got {repo!r}")
    course = project["tool"]["course"]
    return {"repo": repo, "github": f"{match[1]}/{match[2]}", "release": course["release"],
            "extra": course["hosted-extra"]}


def bootstrap_source(info: dict[str, str]) -> str:
    """The set-up cell's code for this release."""
    return BOOTSTRAP.format(source=info["repo"] + ".git", release=info["release"], extra=info["extra"])


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


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def updated_notebook(nb: dict, info: dict[str, str], name: str) -> dict:
    """`nb` with its set-up cell and its header's links for this release (cell ids and the rest kept)."""
    cells = nb["cells"]
    boot = next(c for c in cells if c["cell_type"] == "code")
    if "bootstrap" not in boot.get("metadata", {}).get("tags", []):
        raise ValueError(f"{name}: the first code cell has no `bootstrap` tag")
    boot["source"] = _lines(bootstrap_source(info))
    header = "".join(cells[0]["source"]).split("\n")
    if len(header) > 2 and BADGE_LINE.match(header[2]):
        header[2] = badge_line(info, name)
    else:  # first time: under the title, then a blank line
        header[1:1] = ["", badge_line(info, name)]
    cells[0]["source"] = _lines("\n".join(header))
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
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    new = updated_readme(text, info)
    if new != text:
        stale.append("README.md")
        if write:
            readme.write_text(new, encoding="utf-8")
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a file is out of step")
    args = parser.parse_args(argv)
    stale = out_of_step(write=not args.check)
    if args.check and stale:
        print("out of step with pyproject.toml's release: " + ", ".join(stale)
              + " (run .venv/bin/python scripts/course_release.py)")
        return 1
    print(("rewrote " + ", ".join(stale)) if stale else "every lesson and README.md name the release already")
    return 0


if __name__ == "__main__":
    sys.exit(main())
