"""`make site`: the whole course as a static site, every page a real run on this machine.

    .venv/bin/python site/build.py --out build/site [--lessons 00,04] [--executed DIR]

Each lesson is executed here first (nbclient with helpers.nbrun's kernel manager, this interpreter's kernel,
the profile of $COURSE_PROFILE or the device's default, its outputs under <out>-outputs/), or taken from DIR
when it holds `<lesson>.ipynb` executed with its `<lesson>.stamp.json` (tests/test_hosted.py writes both). A
note under each lesson's title stamps the run: device, versions, date (helpers.results.stamp), profile and
seconds. Cells tagged `requires-cuda` (or `requires-multi-gpu`) are shown but not run without the GPUs they
need, and say so. Then Sphinx builds the pages (site/conf.py: MyST-NB, sphinx-book-theme) into <out>/, lessons
in order, index.html first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(__file__).resolve().parent
INDEX = """# Fast Transformer training with PyTorch

Every page below is a lesson of the course, **executed on the machine that built this site**: each says
which machine, which versions, which profile and when. Your numbers will differ; to run a lesson yourself,
open it in Jupyter Lab (`make lab`) or on Colab or Kaggle (the links under each title).

```{{toctree}}
:maxdepth: 1
:caption: Lessons

{pages}
```
"""


def gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def for_this_machine(nb: nbformat.NotebookNode, n_gpus: int) -> nbformat.NotebookNode:
    """GPU-tagged cells this machine cannot run are kept on the page, not executed (nbclient's skip tag)."""
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if ("requires-cuda" in tags and n_gpus < 1) or ("requires-multi-gpu" in tags and n_gpus < 2):
            cell.metadata["tags"] = [*tags, "skip-execution"]
    return nb


def execute(lesson: Path, work: Path, profile: str) -> tuple[nbformat.NotebookNode, dict]:
    """Run `lesson` top to bottom here -> (executed notebook, its stamp)."""
    from nbclient import NotebookClient

    from helpers.device import get_device
    from helpers.nbrun import CourseKernelManager
    from helpers.results import stamp

    nb = for_this_machine(nbformat.read(lesson, as_version=4), gpus())
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "COURSE_PROFILE": profile, "COURSE_OUTPUT_DIR": str(work / "outputs")}
    start = time.perf_counter()
    # CourseKernelManager: nbclient's own sometimes waits for ever at a widget cell (helpers/nbrun.py)
    client = NotebookClient(nb, timeout=3600, kernel_name="python3", kernel_manager_class=CourseKernelManager,
                            resources={"metadata": {"path": str(work)}})
    client.execute(env=env, cwd=str(work))
    return nb, {**stamp(get_device()), "profile": profile, "seconds": time.perf_counter() - start}


def stamp_note(info: dict) -> str:
    """The note under a lesson's title: where, with what and when this page's outputs were made."""
    gpu = f", driver {info['driver']}, CUDA {info['cuda']}" if info.get("driver") else ""
    return (f"```{{note}}\nThis page is a real run: executed on **{info['device']}** ({info['device_type']}"
            f"{gpu}; {info['cpu_count']} CPUs, load {info['load_average_1min']:.1f}) "
            f"with torch {info['torch']}, "
            f"transformers {info['transformers']}, triton {info['triton']}, Python {info['python']}, "
            f"on {info['date']}, profile `{info['profile']}`, in {info['seconds']:.0f} s"
            f"{' (' + info['where'] + ')' if info.get('where') else ''}. "
            "Your machine's numbers will differ.\n```")


def page(nb: nbformat.NotebookNode, info: dict) -> nbformat.NotebookNode:
    """The lesson as a page: the stamp under its title, the kernel named for MyST-NB, and neither the install
    cell (tag `bootstrap`: a page is read, not run) nor the solution cells a test run adds (tag
    `injected-solution`)."""
    hidden = ("injected-solution", "bootstrap")
    nb.cells = [c for c in nb.cells if not set(hidden) & set(c.get("metadata", {}).get("tags", []))]
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(stamp_note(info)))
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata.setdefault("kernelspec", kernel)
    return nb


def build(out: Path, lessons: list[str] | None = None, executed: Path | None = None) -> list[Path]:
    """Execute (or take) the lessons, write their pages and the index, run Sphinx -> the lesson pages."""
    from helpers.config import get_profile

    profile = get_profile()
    src = out.parent / f"{out.name}-src"
    (src / "lessons").mkdir(parents=True, exist_ok=True)
    names = []
    for lesson in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        if lessons and lesson.name[:2] not in lessons:
            continue
        ready = executed / lesson.name if executed else None
        if ready is not None and ready.is_file():
            nb = nbformat.read(ready, as_version=4)
            info = json.loads(ready.with_suffix(".stamp.json").read_text())
        else:
            print(f"site: executing {lesson.name} (profile {profile})", flush=True)
            nb, info = execute(lesson, out.parent / f"{out.name}-outputs" / lesson.stem, profile)
        nbformat.write(page(nb, info), src / "lessons" / lesson.name)
        names.append(lesson.stem)
    if not names:
        raise SystemExit(f"site: no lesson matches {lessons}")
    (src / "index.md").write_text(INDEX.format(pages="\n".join(f"lessons/{n}" for n in names)))
    subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", "-c", str(SITE), str(src), str(out)],
                   check=True)
    print(f"site: {len(names)} lesson(s) in {out}/index.html")
    return [out / "lessons" / f"{n}.html" for n in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site", help="the site's folder")
    parser.add_argument("--lessons", default="", help="lesson numbers, e.g. 00,04 (default: every lesson)")
    parser.add_argument("--executed", type=Path, help="a folder of executed lessons with their stamps")
    args = parser.parse_args(argv)
    lessons = [x.strip().zfill(2) for x in args.lessons.split(",") if x.strip()] or None
    build(args.out.resolve(), lessons, args.executed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
