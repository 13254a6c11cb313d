"""Read before you run (issue 31): one lesson built as a page of the course's static site (site/build.py, the
engine of `make site`), offline, and opened in Chromium: the page shows a figure and a results table of a real
run, stamped with the machine and the profile. (`make site` builds every lesson the same way.)

The page is built from lesson 00 as tests/test_hosted.py executed it (build/hosted/, with its stamp), so the
suite runs the lesson once; run alone, this file executes it. Without network where `unshare -n` can take it
away (root on Linux), so a theme or template fetched at build time would fail the build. The screenshots go to
build/screenshots/site-*.png.

A site worth reading (issue 40): lesson 01's attention explorer renders from the widget manager the site
serves (site/_static/html-manager/), with every request off the page refused by the browser. No test run
keeps an executed lesson 01, so the builder executes the lesson's own explorer cells here (parameters, setup
and section 9: ~20 s), without network (the loopback only, for the kernel), in the same Sphinx build as lesson
00 and a lesson 06 page whose run printed the profiler's log (recorded here from torch.profiler; the log must
not be on the page). The Pages workflow is read as YAML and builds with the Makefile's site target.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from test_browser import browser, chromium  # noqa: F401 (fixtures: Debian's Chromium through Playwright)

REPO = Path(__file__).resolve().parents[1]
EXECUTED = REPO / "build" / "hosted"
SHOTS = REPO / "build" / "screenshots"
MANAGER = REPO / "site" / "_static" / "html-manager"
WORKFLOW = REPO / ".github" / "workflows" / "pages.yml"
PROFILER_MARK = "the profiler's log, as the kernel forwards it"  # a line of the recorded stderr


def _builder():
    """site/build.py as a module (`site` is also the name of a standard module, so it is loaded by path)."""
    spec = importlib.util.spec_from_file_location("course_site_build", REPO / "site" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _offline() -> list[str]:
    """A command prefix that runs without any network, where this machine allows it."""
    found = shutil.which("unshare")
    probe = subprocess.run([found, "-n", "true"], capture_output=True) if found else None
    if probe is not None and probe.returncode == 0:
        return ["unshare", "-n"]
    return []


def _offline_with_loopback() -> list[str]:
    """As _offline, with the loopback interface up: a lesson's kernel talks to the builder over 127.0.0.1."""
    if not _offline() or shutil.which("ip") is None:
        return []
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True)
    up_then_run = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
    return up_then_run if probe.returncode == 0 else []


@pytest.fixture(scope="module")
def page_path(built_site: Path) -> Path:
    return built_site / "lessons" / "00_setup.html"


def _cut_code(page) -> list[str]:
    """The first line of each code cell wider than the page shows (cut, or scrolled sideways)."""
    return page.evaluate("""() => [...document.querySelectorAll('div.cell_input div.highlight pre')]
        .filter(p => p.scrollWidth > p.clientWidth + 1).map(p => p.textContent.split('\\n')[0])""")


def test_the_page_is_stamped_and_navigable(page_path: Path) -> None:
    html = page_path.read_text(encoding="utf-8")
    info = json.loads((EXECUTED / "00_setup.stamp.json").read_text()) if (EXECUTED / "00_setup.stamp.json"
                                                                           ).is_file() else None
    assert "This page is a real run" in html and "profile <code" in html, "the page lacks its stamp"
    if info:
        assert info["device"] in html and info["torch"] in html and info["date"] in html
    assert 'href="../index.html"' in html or 'href="../index.html#' in html, "no way back to the contents"
    assert "injected-solution" not in html and "strict_mode" not in html, "a test's solution cell is shown"
    assert "course_setup" not in html, "the install cell is shown: a page is read, not run"
    assert "output stderr" not in html, "warnings and logs (stderr) are shown"


def test_the_built_page_shows_a_figure_and_a_results_table(page_path: Path, browser) -> None:  # noqa: F811
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(page_path.as_uri())
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "site-00-top.png"))
    figures = page.locator(".cell_output img")
    assert figures.count() > 0, "no figure in the lesson's outputs"
    figures.first.scroll_into_view_if_needed()
    assert figures.first.evaluate("e => e.complete && e.naturalWidth > 100"), "the figure does not render"
    page.screenshot(path=str(SHOTS / "site-00-figure.png"))
    table = page.locator(".cell_output table").filter(has_text="holds")  # What we measured: claim verdicts
    assert table.count() > 0, "no results table (claims and verdicts) in the lesson's outputs"
    table.last.scroll_into_view_if_needed()
    assert table.last.locator("tr").count() > 3
    page.screenshot(path=str(SHOTS / "site-00-table.png"))
    cut = _cut_code(page)
    assert not cut, f"code lines cut at the page's width: {cut[:3]}"
    assert not errors, errors
    context.close()


# ------------------------------------------------ lesson 01's explorer and lesson 06's log, built offline
def _explorer_lesson() -> nbformat.NotebookNode:
    """Lesson 01 cut to what its explorer needs: the title, the parameters and setup cells, and section 9 up
    to the explorer's cell (the lesson's own cells, unchanged)."""
    nb = nbformat.read(REPO / "notebooks" / "01_attention.ipynb", as_version=4)
    cells = nb.cells
    start = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## 9."))
    end = next(i for i, c in enumerate(cells) if c.cell_type == "code" and "AttentionExplorer(" in c.source)
    assert start < end, "lesson 01's explorer is no longer in its section 9: update this test's cut"
    tagged = [c for c in cells[:start] if {"parameters", "setup"} & set(c.metadata.get("tags", []))]
    nb.cells = [cells[0], *tagged, *cells[start:end + 1]]
    return nb


def _profiler_log() -> tuple[str, str]:
    """(what torch.profiler writes to file descriptor 2 around one profiled step, its table of the step)"""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with tempfile.TemporaryFile(mode="w+b") as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)  # the kineto library writes with C++, under Python's sys.stderr
        try:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                torch.nn.Linear(8, 8)(torch.randn(2, 8)).sum().backward()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        log = f.read().decode(errors="replace")
    return log + PROFILER_MARK + "\n", prof.key_averages().table(row_limit=3)


def _profiled_lesson06(folder: Path) -> None:
    """An executed lesson 06 page as a run leaves it: the profile's table on stdout, the log on stderr."""
    from course.results import stamp
    from helpers.core.device import get_device

    log, table = _profiler_log()
    code = "with profile(activities=activities) as prof:  ...\nprint(prof.key_averages().table(row_limit=3))"
    cell = nbformat.v4.new_code_cell(code)
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text=log),
                    nbformat.v4.new_output("stream", name="stdout", text=table)]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Lesson 06 (its profile)"), cell])
    nbformat.write(nb, folder / "06_input_pipeline.ipynb")
    info = {**stamp(get_device()), "profile": "smoke", "seconds": 1.0}
    (folder / "06_input_pipeline.stamp.json").write_text(json.dumps(info))


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One offline build (one Sphinx run) of three pages: lesson 00 as tests/test_hosted.py ran it (else run
    here), lesson 01's explorer cells executed by the builder, and lesson 06's profiled page."""
    work = tmp_path_factory.mktemp("site")
    source, executed, out = work / "lessons", work / "executed", work / "site"
    source.mkdir()
    executed.mkdir()
    shutil.copy(REPO / "notebooks" / "00_setup.ipynb", source)
    if (EXECUTED / "00_setup.stamp.json").is_file():
        shutil.copy(EXECUTED / "00_setup.ipynb", executed)
        shutil.copy(EXECUTED / "00_setup.stamp.json", executed)
    nbformat.write(_explorer_lesson(), source / "01_attention.ipynb")
    _profiled_lesson06(executed)
    nbformat.write(nbformat.v4.new_notebook(), source / "06_input_pipeline.ipynb")  # taken from executed/
    cmd = [*_offline_with_loopback(), sys.executable, str(REPO / "site" / "build.py"), "--out", str(out),
           "--source", str(source), "--executed", str(executed)]
    env = {**os.environ, "COURSE_PROFILE": "smoke", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_the_attention_explorer_renders_with_the_network_off(built_site: Path, browser) -> None:  # noqa: F811
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    asked: list[str] = []  # what the page asked of the network: refused, as with no network at all

    def only_files(route) -> None:
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            asked.append(f"{route.request.resource_type} {route.request.url}")
            route.abort()

    context.route("**/*", only_files)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto((built_site / "lessons" / "01_attention.html").as_uri())
    explorer = page.locator(".attention-explorer")
    explorer.wait_for(timeout=20_000)  # drawn by the manager after the page's load event
    explorer.scroll_into_view_if_needed()
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "site-01-explorer.png"))
    assert explorer.locator(".widget-slider").count() == 2, "the layer and head sliders are not drawn"
    assert explorer.locator(".widget-dropdown select").count() == 2, "no text and token selectors"
    figure = explorer.locator(".widget-output img")
    assert figure.count() == 1, "the explorer's figure (its Output widget) is not drawn"
    assert figure.evaluate("e => e.complete && e.naturalWidth > 100"), "the explorer's figure does not render"
    assert "layer" in explorer.inner_text() and "running notebook redraws" in page.content()
    assert not _cut_code(page), f"code lines cut at the page's width: {_cut_code(page)[:3]}"
    needed = [a for a in asked if not a.startswith("image ")]  # the Colab/Kaggle badges are links out
    assert not needed, f"the page asked the network for what it needs to work: {needed}"
    assert not errors, errors
    context.close()


def test_the_profilers_log_is_not_on_the_page(built_site: Path) -> None:
    html = (built_site / "lessons" / "06_input_pipeline.html").read_text(encoding="utf-8")
    assert "Self CPU time total" in html, "the profile's table (stdout) is missing"
    assert PROFILER_MARK.replace("'", "&#x27;") not in html and PROFILER_MARK not in html, "stderr is shown"
    assert "profiler_start" not in html and "output stderr" not in html, "the profiler's log is on the page"


def test_a_page_built_here_says_how_busy_the_machine_was(built_site: Path) -> None:
    html = (built_site / "lessons" / "01_attention.html").read_text(encoding="utf-8")
    assert re.search(r"other programs took \d+% of its CPUs during the run", html), "no load in the stamp"
    index = (built_site / "index.html").read_text(encoding="utf-8")
    assert re.search(r"This site was built on \d{4}-\d\d-\d\d", index), "the index does not say when"


def test_the_stamp_warns_by_the_courses_rule_when_the_machine_was_busy() -> None:
    build = _builder()
    info = {"device": "a CPU", "device_type": "cpu", "cpu_count": 2, "torch": "2.13", "transformers": "5",
            "triton": "3", "python": "3.11", "date": "2026-12-03", "profile": "smoke", "seconds": 9.0}
    quiet, busy = {**info, "others_busy": build.OTHERS_BUSY / 2}, {**info, "others_busy": build.OTHERS_BUSY}
    assert "Built on a busy machine" not in build.stamp_note(quiet)
    assert "Built on a busy machine" in build.stamp_note(busy)
    assert "other programs took 25% of its CPUs during the run" in build.stamp_note(busy)
    hosted = {**info, "load_average_1min": 2.5}  # a stamp from tests/test_hosted.py: the load average only
    assert "load average 2.5 at the end of the run" in build.stamp_note(hosted)
    load = build.CpuLoad(others=0.6, wall_s=10.0, cpus=2)  # 12 s of the 20 CPU-seconds were not this build's
    assert build.others_share(load, kernel_cpu_s=8.0) == pytest.approx(0.2)  # 8 of them were its kernel's


def test_a_page_shows_paths_relative_to_the_run_not_the_builders_folders(tmp_path: Path) -> None:
    build = _builder()
    work = tmp_path / "site-outputs" / "06_input_pipeline"
    printed = f"checked: the trace holds our labels; {work}/outputs/06_input_pipeline/lesson06_trace.json\n"
    cell = nbformat.v4.new_code_cell("print(trace_path)")
    python = {"text/plain": f"'{REPO}/.venv/bin/python'"}
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed),
                    nbformat.v4.new_output("execute_result", data=python, execution_count=1)]
    nb = build.relative_paths(nbformat.v4.new_notebook(cells=[cell]), {work: "", REPO: ""})
    assert nb.cells[0].outputs[0]["text"] == ("checked: the trace holds our labels; "
                                             "outputs/06_input_pipeline/lesson06_trace.json\n")
    assert nb.cells[0].outputs[1]["data"]["text/plain"] == "'.venv/bin/python'"


def test_a_widget_the_sites_manager_cannot_draw_stops_the_build() -> None:
    build = _builder()

    def saved(module: str, version: str) -> nbformat.NotebookNode:
        model = {"model_module": module, "model_module_version": version, "model_name": "IntSliderModel"}
        return nbformat.from_dict({"metadata": {"widgets": {build.WIDGET_STATE: {"state": {"a": model}}}}})

    assert build.undrawn_widgets(saved("@jupyter-widgets/controls", "2.0.0")) == []  # ipywidgets 8
    assert build.undrawn_widgets(saved("@jupyter-widgets/controls", "1.5.0")) == []  # ipywidgets 7 (Colab's)
    assert build.undrawn_widgets(saved("@jupyter-widgets/controls", "3.0.0")) == [
        "@jupyter-widgets/controls 3.0.0 (IntSliderModel)"]  # a future ipywidgets: named, not a blank page
    assert build.undrawn_widgets(saved("bqplot", "0.5.0")), "a widget library the manager does not bundle"


def test_the_vendored_widget_manager_is_the_one_its_readme_names() -> None:
    readme = (MANAGER / "README.md").read_text()
    digest = hashlib.sha256((MANAGER / "embed.js").read_bytes()).hexdigest()
    assert digest in readme, f"embed.js (sha256 {digest}) is not the file its README names"
    assert "html-manager` **1." in readme, "html-manager 1.x draws ipywidgets 8's widgets"
    assert "BSD-3-Clause" in readme and "Redistribution and use" in (MANAGER / "LICENSE").read_text()
    assert (MANAGER / "LICENSE-fontawesome.txt").is_file() and (MANAGER / "embed.js.LICENSE.txt").is_file()
    named = set(re.findall(r"[0-9a-f]{20}\.woff2", (MANAGER / "embed.js").read_text(encoding="utf-8")))
    assert named == {p.name for p in MANAGER.glob("*.woff2")}, "the fonts embed.js asks for, and only those"
    conf = (REPO / "site" / "conf.py").read_text()
    assert 'nb_ipywidgets_js = {"html-manager/embed.js": {}}' in conf, "MyST-NB would load it from a CDN"


# ------------------------------------------------------------------------------ the Pages workflow
def test_the_pages_workflow_builds_with_make_site_and_does_nothing_while_private() -> None:
    yaml = pytest.importorskip("yaml")
    flow = yaml.safe_load(WORKFLOW.read_text())
    on = flow[True] if True in flow else flow["on"]  # YAML 1.1 reads the key `on` as True
    assert set(on) == {"push", "workflow_dispatch"} and on["push"] == {"tags": ["v*"]}, on
    jobs = flow["jobs"]
    assert set(jobs) == {"build", "deploy"} and jobs["deploy"]["needs"] == "build"
    for name, job in jobs.items():
        assert job.get("if") == "github.event.repository.private == false", f"{name} runs while private"
    steps = jobs["build"]["steps"]
    runs = [s.get("run", "") for s in steps]
    assert "make site" in runs, runs
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["uses"].endswith("@v5") and runs.index("make site") < steps.index(upload)
    assert [s["uses"] for s in jobs["deploy"]["steps"]] == ["actions/deploy-pages@v5"]
    assert jobs["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    assert flow["permissions"] == {"contents": "read"}, "the build job gets read access only"
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make here to read the Makefile's site target")
    dry = subprocess.run([make, "-n", "site"], capture_output=True, text=True, cwd=REPO)
    assert dry.returncode == 0, dry.stderr
    out = re.search(r"site/build\.py --out (\S+)", dry.stdout)
    assert out and out.group(1) == upload["with"]["path"], f"make site writes {out and out.group(1)}"
