"""`make site`: the whole course as a static site, every page a real run on this machine.

    .venv/bin/python site/build.py --out build/site [--lessons 00,04] [--executed DIR] [--source DIR]

Each lesson (notebooks/, or the folder --source names) is executed here first (nbclient with course.nbrun's
kernel manager, this interpreter's kernel, the profile of $COURSE_PROFILE or the device's default, its outputs
under <out>-outputs/), or taken from DIR when it holds `<lesson>.ipynb` executed with its
`<lesson>.stamp.json` (tests/test_hosted.py writes both). A note under each lesson's title stamps the run:
device, versions, date (course.results.stamp), profile, seconds, and how busy the machine was: the share of
its CPUs other programs took while the lesson ran (helpers.core.timing.LoadProbe, less the lesson's own
kernel), with a warning by the course's rule (helpers.core.timing.OTHERS_BUSY) when the page's timings came
from a busy machine. Cells tagged `requires-cuda` (or `requires-multi-gpu`) are shown but not run without the
GPUs they need, and say so. Then Sphinx builds the pages (site/conf.py: MyST-NB, sphinx-book-theme) into
<out>/, lessons in order, index.html first. Widgets (the attention explorer) render from the state saved with
the run, through the widget manager served from the site itself (site/_static/html-manager/), so a page works
offline; a widget of a kind that manager cannot draw stops the build, naming it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from helpers.core.timing import OTHERS_BUSY, CpuLoad, LoadProbe

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(__file__).resolve().parent
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# What the vendored manager (site/_static/html-manager/, @jupyter-widgets/html-manager 1.x) draws: the
# widget modules of ipywidgets 8 and 7, by the major version of their model module.
DRAWN = {"@jupyter-widgets/base": ("1.", "2."), "@jupyter-widgets/controls": ("1.", "2."),
         "@jupyter-widgets/output": ("1.",)}
INDEX = """# Fast Transformer training with PyTorch

Every page below is a lesson of the course, **executed on the machine that built this site**: each says
which machine, which versions, which profile and when. Your numbers will differ; to run a lesson yourself,
open it in Jupyter Lab (`make lab`) or on Colab or Kaggle (the links under each title).
This site was built on {date}.

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

    from course.nbrun import CourseKernelManager
    from course.results import stamp
    from helpers.core.device import get_device

    nb = for_this_machine(nbformat.read(lesson, as_version=4), gpus())
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "COURSE_PROFILE": profile, "COURSE_OUTPUT_DIR": str(work / "outputs")}
    start = time.perf_counter()
    # CourseKernelManager: nbclient's own sometimes waits for ever at a widget cell (course/nbrun.py)
    client = NotebookClient(nb, timeout=3600, kernel_name="python3", kernel_manager_class=CourseKernelManager,
                            resources={"metadata": {"path": str(work)}})
    kernel_cpu_s = _children_cpu_s()
    with LoadProbe() as probe:  # what the CPUs did while the lesson ran; its kernel is our child
        client.execute(env=env, cwd=str(work))  # shuts the kernel down and reaps it: its CPU time is ours now
    info = {**stamp(get_device()), "profile": profile, "seconds": time.perf_counter() - start}
    nb = relative_paths(nb, {work: "", ROOT: ""})  # outputs/06_input_pipeline/..., not the builder's folders
    return nb, {**info, "others_busy": others_share(probe.load, _children_cpu_s() - kernel_cpu_s)}


def relative_paths(nb: nbformat.NotebookNode, folders: dict[Path, str]) -> nbformat.NotebookNode:
    """The builder's folders in the outputs' text replaced (folder/ -> its replacement), first key first: the
    page shows `outputs/06_input_pipeline/lesson06_trace.json` where the run printed this machine's path."""
    def short(text: str) -> str:
        for folder, instead in folders.items():
            text = text.replace(f"{folder}{os.sep}", instead)
        return text

    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = short(out["text"])
            for mime in ("text/plain", "text/markdown", "text/html"):
                if isinstance(out.get("data", {}).get(mime), str):
                    out["data"][mime] = short(out["data"][mime])
    return nb


def _children_cpu_s() -> float:
    """CPU seconds of this process's children that have ended (the lessons' kernels and what they started)."""
    t = os.times()
    return t.children_user + t.children_system


def others_share(load: CpuLoad | None, kernel_cpu_s: float) -> float | None:
    """The share of all CPUs' time that programs other than the build and its kernel took -> None: unknown.

    LoadProbe counts this process's own CPU time only, so the kernel's is taken off here."""
    if load is None or load.others is None or load.wall_s <= 0:
        return None
    return min(1.0, max(0.0, load.others - kernel_cpu_s / (load.wall_s * load.cpus)))


def load_words(info: dict) -> str:
    """How busy the machine was during the run, in words for the stamp: other programs' share of the CPUs
    where the build measured it, else the 1-minute load average at the end (the lesson's own work in it)."""
    others = info.get("others_busy")
    if others is None:
        average = info.get("load_average_1min")
        return "load unknown" if average is None else f"load average {average:.1f} at the end of the run"
    return f"other programs took {others:.0%} of its CPUs during the run"


def busy_warning(info: dict) -> str:
    """A sentence for a page whose numbers came from a busy machine (the course's rule), else ''."""
    others = info.get("others_busy")
    if others is None or others < OTHERS_BUSY:
        return ""
    return (f"\n\n**Built on a busy machine:** other programs took {others:.0%} of its CPUs while this "
            f"lesson ran (the course's rule: under {OTHERS_BUSY:.0%}). Its timings are slower and noisier "
            "than an idle machine's, and its timing verdicts may say \"too busy to judge\".")


def stamp_note(info: dict) -> str:
    """The note under a lesson's title: where, with what, when and how busy this page's outputs were made."""
    gpu = f", driver {info['driver']}, CUDA {info['cuda']}" if info.get("driver") else ""
    return (f"```{{note}}\nThis page is a real run: executed on **{info['device']}** ({info['device_type']}"
            f"{gpu}; {info['cpu_count']} CPUs, {load_words(info)}) "
            f"with torch {info['torch']}, "
            f"transformers {info['transformers']}, triton {info['triton']}, Python {info['python']}, "
            f"on {info['date']}, profile `{info['profile']}`, in {info['seconds']:.0f} s"
            f"{' (' + info['where'] + ')' if info.get('where') else ''}. "
            f"Your machine's numbers will differ.{busy_warning(info)}\n```")


def undrawn_widgets(nb: nbformat.NotebookNode) -> list[str]:
    """The saved widgets the vendored manager cannot draw, as 'module version (model)' -> [] when none."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    out = []
    for model in state.values():
        module, version = model.get("model_module", "?"), model.get("model_module_version", "?")
        if not str(version).startswith(DRAWN.get(module, ())):
            out.append(f"{module} {version} ({model.get('model_name', '?')})")
    return sorted(set(out))


WIDGET_NOTE = ("*On this page the widget above shows what the run drew. Its controls move, but only a "
               "running notebook redraws: open the lesson in Jupyter Lab, Colab or Kaggle to explore.*")


def _shows_a_widget(cell: nbformat.NotebookNode) -> bool:
    return any(WIDGET_VIEW in o.get("data", {}) for o in cell.get("outputs", []))


def page(nb: nbformat.NotebookNode, info: dict) -> nbformat.NotebookNode:
    """The lesson as a page: the stamp under its title, the kernel named for MyST-NB, a line under each widget
    saying that a page cannot redraw it, and neither the install cell (tag `bootstrap`: a page is read, not
    run) nor the solution cells a test run adds (tag `injected-solution`)."""
    hidden = ("injected-solution", "bootstrap")
    cells = []
    for cell in nb.cells:
        if set(hidden) & set(cell.get("metadata", {}).get("tags", [])):
            continue
        cells.append(cell)
        if _shows_a_widget(cell):
            cells.append(nbformat.v4.new_markdown_cell(WIDGET_NOTE))
    nb.cells = cells
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(stamp_note(info)))
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata.setdefault("kernelspec", kernel)
    return nb


def build(out: Path, lessons: list[str] | None = None, executed: Path | None = None,
          source: Path | None = None) -> list[Path]:
    """Execute (or take) the lessons, write their pages and the index, run Sphinx -> the lesson pages."""
    from course.profile import get_profile

    profile = get_profile()
    src = out.parent / f"{out.name}-src"
    (src / "lessons").mkdir(parents=True, exist_ok=True)
    names = []
    for lesson in sorted((source or ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        if lessons and lesson.name[:2] not in lessons:
            continue
        ready = executed / lesson.name if executed else None
        if ready is not None and ready.is_file():
            nb = nbformat.read(ready, as_version=4)
            info = json.loads(ready.with_suffix(".stamp.json").read_text())
        else:
            print(f"site: executing {lesson.name} (profile {profile})", flush=True)
            nb, info = execute(lesson, out.parent / f"{out.name}-outputs" / lesson.stem, profile)
        undrawn = undrawn_widgets(nb)
        if undrawn:
            raise SystemExit(f"site: {lesson.name} saved widgets the site's widget manager cannot draw: "
                             f"{', '.join(undrawn)}. Update site/_static/html-manager/ to the html-manager "
                             "release of that ipywidgets (its README says how), or run with ipywidgets 8.")
        nbformat.write(page(nb, info), src / "lessons" / lesson.name)
        names.append(lesson.stem)
    if not names:
        raise SystemExit(f"site: no lesson matches {lessons}")
    today = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    (src / "index.md").write_text(INDEX.format(pages="\n".join(f"lessons/{n}" for n in names), date=today))
    subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", "-c", str(SITE), str(src), str(out)],
                   check=True)
    print(f"site: {len(names)} lesson(s) in {out}/index.html")
    return [out / "lessons" / f"{n}.html" for n in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site", help="the site's folder")
    parser.add_argument("--lessons", default="", help="lesson numbers, e.g. 00,04 (default: every lesson)")
    parser.add_argument("--executed", type=Path, help="a folder of executed lessons with their stamps")
    parser.add_argument("--source", type=Path, help="the folder of lessons to build (default: notebooks/)")
    args = parser.parse_args(argv)
    lessons = [x.strip().zfill(2) for x in args.lessons.split(",") if x.strip()] or None
    build(args.out.resolve(), lessons, args.executed, args.source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
