"""Open the course as learners do: Jupyter Lab, started like `make lab`, in a real Chromium (Playwright).

- every notebook present in notebooks/ opens in Lab, every cell shown, and names the course's kernel
  (`python3`, which is the interpreter running these tests); the notebooks that run cells here wait for it,
  idle, and their set-up cell says the smoke profile (the server's environment reaches the kernel; lesson
  00 ran its set-up cells here for that before, 7 s of CI). The others open one after another in one tab of
  Lab (`lab_tab`), each test waiting for its cells, not its kernel (the same `python3`, started in the
  background): a fresh tab and a kernel start cost about 5 s of CI per notebook. Their set-up cells are the
  same code, run by nbval or tests/test_hosted.py (running each again in Chromium cost about 55 s of CI);
  the browser leaves the notebook file unchanged;
- the first notebook (in lesson order) to draw each widget (a `course.widgets` class, or widget code of its
  own through `ipywidgets`) runs cell by cell in the browser under the smoke profile: no cell shows an error,
  every figure is rendered, every widget is drawn, and moving the explorer's "layer" slider changes its
  figure (required of the attention lesson; done for any notebook with such a slider). A later lesson that
  draws the same widget (lesson 08's AttentionExplorer) only opens: nbval runs its cells, and running it
  again in Chromium would add ~2.5 minutes to CI and no check;
- at each checked exercise of a notebook run cell by cell, a learner's round trip: the untouched skeleton's
  check says "not attempted yet"; for lesson 01's exercise a wrong answer typed into the skeleton cell gets
  the hint naming its mistake (screenshots exercise-*.png); the solution typed in passes, and the rest of the
  lesson runs with it in place;
- Lab in the browser asks for the token when the URL has none.
A notebook run cell by cell here gets nbval's checks (every cell without an error, the `requires-*` cells
skipped as conftest.py skips them, after each exercise's check the solution passing, in place), so nbval
leaves it out (conftest.py asks `runs_instead_of_nbval()`) where Chromium and Playwright are found: lesson
01 ran three times in `make test` before (nbval, here, and here again for the exercise), about 30 s of CI.
(The time estimate, "**Time:**" in each lesson's first Markdown cell, is checked in test_notebooks.py.)
Screenshots go to build/screenshots/. Without Chromium or Playwright the browser tests skip and say why
(`make browser`, i.e. scripts/install_browser.sh, installs Debian's chromium).

Environment: BROWSER_NOTEBOOK_DIR serves another folder of notebooks (e.g. a scratch one);
BROWSER_RUN_ALL picks the notebooks run in the browser: "widgets" (default: the first to draw each widget),
"none", or notebook stems
separated by commas (e.g. 01_attention); BROWSER_RUN_SETUP=all runs every other lesson's set-up cells in Lab
too (default: none); COURSE_CHROMIUM names the Chromium executable;
BROWSER_CELL_TIMEOUT_S / BROWSER_NOTEBOOK_TIMEOUT_S bound one cell / one notebook (1200 s / 1800 s).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from labserver import REPO_ROOT, LabServer, api_request, lab_server  # tests/labserver.py

NOTEBOOK_DIR = Path(os.environ.get("BROWSER_NOTEBOOK_DIR", REPO_ROOT / "notebooks")).resolve()
SCREENSHOT_DIR = REPO_ROOT / "build" / "screenshots"
CELL_TIMEOUT_S = float(os.environ.get("BROWSER_CELL_TIMEOUT_S", "1200"))  # one cell, on a busy machine
NOTEBOOK_TIMEOUT_S = int(
    os.environ.get("BROWSER_NOTEBOOK_TIMEOUT_S", "1800")
)  # one notebook (pytest-timeout)
RUN_ALL = os.environ.get("BROWSER_RUN_ALL", "widgets")  # which notebooks run all cells in the browser
RUN_SETUP = os.environ.get("BROWSER_RUN_SETUP", "none")  # set-up cells of the others run in Lab: none | all
OPEN_TIMEOUT_MS = 120_000  # Lab's first page load and a kernel start, on a busy 2-core machine
VIEWPORT = {"width": 1400, "height": 1000}
# Debian's chromium first; GitHub's Ubuntu runners ship chromium-browser and Google Chrome, which work too.
CHROMIUM_CANDIDATES = (
    "chromium",
    "chromium-browser",
    "/usr/lib/chromium/chromium",
    "google-chrome",
    "google-chrome-stable",
)
WIDGET_IMPORT = re.compile(r"\bipywidgets\b|\bcourse\.widgets\b|from\s+course\s+import\s+[^\n]*\bwidgets\b")
FIGURE_CODE = re.compile(r"\bplt\.|\bplots\.|\bmatplotlib\b|\bwidgets\.")
LAYER_LABEL = re.compile(r"^\s*layer\b", re.IGNORECASE)
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colour codes in tracebacks
# Lab settings for the test: never save (the committed notebooks stay output-free), no news pop-up over
# the screenshots, every cell kept in the page (no virtual scrolling) so each output can be inspected.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"checkForUpdates": False, "fetchNews": "false"},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}


def _notebooks() -> list[Path]:
    return sorted(NOTEBOOK_DIR.glob("*.ipynb")) if NOTEBOOK_DIR.is_dir() else []


NOTEBOOKS = _notebooks()
NB_PARAMS = [pytest.param(p, id=p.stem) for p in NOTEBOOKS] or [
    pytest.param(None, marks=pytest.mark.skip(reason=f"no notebooks in {NOTEBOOK_DIR.name}/ yet"), id="none")
]


def _code(nb: nbformat.NotebookNode) -> str:
    """The lesson's code, less its set-up cell (which names ipywidgets to keep the host's, drawing none)."""
    return "\n".join(c.source for c in nb.cells
                     if c.cell_type == "code" and "bootstrap" not in c.get("metadata", {}).get("tags", []))


def _has_outputs(nb: nbformat.NotebookNode) -> bool:
    return any(c.get("outputs") or c.get("execution_count") for c in nb.cells if c.cell_type == "code")


HELPER_WIDGETS = re.compile(r"from[ \t]+course\.widgets[ \t]+import[ \t]+(\([^)]*\)|[^\n#]+)")


def _widgets(path: Path, nb: nbformat.NotebookNode) -> set[str]:
    """The widgets a notebook draws: the course.widgets classes it imports; any other widget code (ipywidgets
    itself, `course.widgets` used as a module) counts as the notebook's own."""
    code = _code(nb)
    names = {n.split(" as ")[0].strip() for m in HELPER_WIDGETS.finditer(code)
             for n in m.group(1).strip("()").replace("\n", " ").split(",") if n.strip()}
    own = WIDGET_IMPORT.search(HELPER_WIDGETS.sub("", code))  # ipywidgets, or course.widgets as a module
    return names | ({f"{path.stem}'s own"} if own else set())


def _first_of_each_widget(paths: list[Path]) -> set[str]:
    """The notebooks run cell by cell under BROWSER_RUN_ALL=widgets: the first (in lesson order) to draw each
    widget. A later lesson drawing the same widget class adds no browser check that nbval lacks (its cells
    run under nbval; the widget is drawn and driven in the first), and a run of lesson 08 in Chromium costs
    CI about 2.5 minutes."""
    seen: set[str] = set()
    first = set()
    for path in paths:
        new = _widgets(path, nbformat.read(path, as_version=4)) - seen
        if new:
            first.add(path.stem)
            seen |= new
    return first


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _skipped_here(cell: nbformat.NotebookNode, gpus: int) -> bool:
    """Cells the harness skips on this machine, exactly as conftest.py does for nbval."""
    tags = cell.get("metadata", {}).get("tags", [])
    return ("requires-cuda" in tags and gpus < 1) or ("requires-multi-gpu" in tags and gpus < 2)


# --------------------------------------------------------------------------------------------- fixtures
def _find_chromium() -> str | None:
    """The Chromium executable ($COURSE_CHROMIUM, else the first of CHROMIUM_CANDIDATES on PATH), or None."""
    wanted = os.environ.get("COURSE_CHROMIUM")
    for name in (wanted,) if wanted else CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def runs_instead_of_nbval() -> set[Path]:
    """The notebooks test_notebook_in_browser runs cell by cell, with nbval's checks, on this machine (none
    without Chromium or Playwright): conftest.py leaves them out of nbval when that test is collected."""
    if _find_chromium() is None or importlib.util.find_spec("playwright") is None:
        return set()
    return {p.resolve() for p in NOTEBOOKS if _runs_here(p, nbformat.read(p, as_version=4))}


@pytest.fixture(scope="module")
def chromium() -> str:
    """Path of the Chromium executable, or skip saying how to get one."""
    pytest.importorskip(
        "playwright.sync_api", reason="Playwright for Python is not installed (pip install playwright)"
    )
    found = _find_chromium()
    if found:
        return found
    wanted = os.environ.get("COURSE_CHROMIUM")
    pytest.skip(
        f"Chromium not found ({wanted or ', '.join(CHROMIUM_CANDIDATES)}): run `make browser` "
        "(scripts/install_browser.sh installs Debian's chromium as root) or set COURSE_CHROMIUM"
    )


@pytest.fixture(scope="module")
def lab(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """Jupyter Lab on NOTEBOOK_DIR, as `make lab` starts it, with the smoke profile reaching its kernels."""
    settings = tmp_path_factory.mktemp("lab-settings")
    for plugin, values in LAB_SETTINGS.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = {
        "COURSE_PROFILE": "smoke",
        "HF_HUB_OFFLINE": "1",
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "MPLBACKEND": None,
    }  # make test sets Agg for nbval; in Lab figures must draw inline as for a learner
    checkpoints = tmp_path_factory.mktemp(
        "lab-checkpoints"
    )  # Lab checkpoints each notebook it opens: not in notebooks/
    with lab_server(
        NOTEBOOK_DIR, env=env, extra_args=[f"--FileCheckpoints.checkpoint_dir={checkpoints}",
                                           "--LabApp.expose_app_in_browser=True"]  # window.jupyterapp
    ) as server:
        yield server


@pytest.fixture(scope="module")
def browser(chromium: str) -> Iterator[object]:
    """A headless Chromium (Debian's build: Playwright cannot download its own offline)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=chromium)
        yield b
        b.close()


def _kernel_message(frame: bytes | str) -> tuple[str, dict, dict, dict] | None:
    """(channel, header, parent header, content) of a kernel websocket frame: Jupyter's v1 binary protocol or
    legacy JSON."""
    try:
        if isinstance(frame, str):  # legacy protocol: one JSON object per frame
            msg = json.loads(frame)
            return msg.get("channel", ""), msg["header"], msg.get("parent_header", {}), msg.get("content", {})
        # v1.kernel.websocket.jupyter.org: uint64 count n, n uint64 offsets, then channel, header,
        # parent_header, metadata, content, buffers... at those offsets.
        n = int.from_bytes(frame[:8], "little")
        offsets = [int.from_bytes(frame[8 + 8 * i : 16 + 8 * i], "little") for i in range(n)] + [len(frame)]
        parts = [frame[offsets[i] : offsets[i + 1]] for i in range(n)]
        return parts[0].decode(), json.loads(parts[1]), json.loads(parts[2]), json.loads(parts[4])
    except (ValueError, KeyError, IndexError, UnicodeDecodeError):
        return None


def _watch_kernel_errors(ws: object, errors: list[str], idle: list[str]) -> None:
    """Append every error the kernel reports on this websocket (an `error` message on iopub) to `errors`, and
    the id of every execution it has finished (its `idle` status on iopub) to `idle`. The kernel sends a
    run's outputs and errors on iopub before that status: once it is seen, they are in `errors`."""

    def on_frame(frame: bytes | str) -> None:
        msg = _kernel_message(frame)
        if msg and msg[1].get("msg_type") == "status" and msg[2].get("msg_type") == "execute_request" \
                and msg[3].get("execution_state") == "idle":
            idle.append(msg[2].get("msg_id", ""))
        if msg and msg[1].get("msg_type") == "error":
            content = msg[3]
            trace = ANSI.sub("", "\n".join(content.get("traceback", [])))
            errors.append(f"{content.get('ename')}: {content.get('evalue')}\n{trace[-3000:]}")

    if "/api/kernels/" in ws.url:
        ws.on("framereceived", on_frame)


def _new_tab(browser: object) -> tuple[object, object]:
    """(context, page): a fresh tab; JS errors in `page.js_errors`, kernel errors in `page.kernel_errors`."""
    context = browser.new_context(viewport=VIEWPORT)
    pg = context.new_page()
    pg.js_errors, pg.kernel_errors, pg.kernel_idle = [], [], []
    pg.on("pageerror", lambda exc: pg.js_errors.append(str(exc)))
    pg.on("websocket", lambda ws: _watch_kernel_errors(ws, pg.kernel_errors, pg.kernel_idle))
    return context, pg


@pytest.fixture
def page(browser: object) -> Iterator[object]:
    """A fresh browser tab (see _new_tab)."""
    context, pg = _new_tab(browser)
    yield pg
    context.close()


@pytest.fixture(scope="module")
def lab_tab(browser: object, lab: LabServer) -> Iterator[object]:
    """One tab with Lab loaded, in which the notebooks that run no cell open one after another (Lab's start in
    a fresh tab, its scripts loaded and compiled, cost about 2 s of CI per notebook)."""
    context, pg = _new_tab(browser)
    pg.goto(f"{lab.url}lab?reset&token={lab.token}")
    pg.wait_for_function("() => window.jupyterapp?.commands.hasCommand('docmanager:open')",
                         timeout=OPEN_TIMEOUT_MS)
    pg.evaluate("async () => { await jupyterapp.restored; }")  # its layout restored: no tab opens under it
    yield pg
    context.close()


# ---------------------------------------------------------------------------------------- page helpers
def _open_notebook(page: object, lab: LabServer, name: str, display_name: str) -> None:
    """Open `name` in Lab and wait until its kernel (shown by `display_name`) is idle."""
    page.goto(
        f"{lab.url}lab/tree/{name}?reset&token={lab.token}"
    )  # reset: no tabs restored from earlier tests
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=OPEN_TIMEOUT_MS)
    deadline = time.monotonic() + OPEN_TIMEOUT_MS / 1000
    while (
        time.monotonic() < deadline
    ):  # the indicator reads "idle" before the kernel starts: ask the server too
        sessions = [
            s for s in api_request(lab.url + "api/sessions", lab.token)[1] if s["path"].endswith(name)
        ]
        status = set(
            page.locator(".jp-NotebookPanel-toolbar .jp-Notebook-ExecutionIndicator").evaluate_all(
                "els => els.map(e => e.dataset.status)"
            )
        )  # the toolbar may hold a second copy in its overflow menu
        toolbar = page.locator(".jp-NotebookPanel-toolbar").first.inner_text()
        if (
            sessions
            and sessions[0]["kernel"]["execution_state"] == "idle"
            and status == {"idle"}
            and display_name in toolbar
        ):
            return
        time.sleep(0.5)
    pytest.fail(
        f"{name}: no idle '{display_name}' kernel within {OPEN_TIMEOUT_MS // 1000} s "
        f"(toolbar: {toolbar!r}, sessions: {sessions})"
    )


# the cells Lab shows for notebook `p`: in its panel, if that is open and visible (-1 if not)
CELLS_SHOWN = """p => { for (const w of jupyterapp.shell.widgets('main')) {
                   if (w.context?.path === p && w.isVisible) {
                     return w.node.querySelectorAll('.jp-Notebook .jp-Cell').length; } }
                 return -1; }"""


def _open_in_lab_tab(page: object, name: str, n_cells: int) -> None:
    """Open `name` in a new tab of the Lab in `page` (lab_tab), with Lab's own docmanager:open; wait until it
    is shown with `n_cells` cells (or OPEN_TIMEOUT_MS), not for its kernel."""
    # not awaited: the command's promise settles when the notebook's kernel has started, about 3 s after the
    # cells are drawn; the tabs before it stay open (closing one before its promise settles raises errors in
    # the page). A failure to open shows as a JavaScript error, which the tests assert there is none of.
    page.evaluate("p => { jupyterapp.commands.execute('docmanager:open', {path: p}); }", name)
    deadline = time.monotonic() + OPEN_TIMEOUT_MS / 1000
    while page.evaluate(CELLS_SHOWN, name) < n_cells and time.monotonic() < deadline:
        time.sleep(0.1)  # Lab draws a notebook's cells over a few frames


def _run_cell(page: object, index: int, label: str) -> None:
    """Run the cell at `index` (Ctrl+Enter on the selected cell) and wait until it has finished: its prompt
    numbered and the kernel idle after it, so its errors are in `page.kernel_errors`."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputPrompt").click()  # selects the cell, command mode
    finished = len(page.kernel_idle)
    page.keyboard.press("Control+Enter")
    prompt = cell.locator(".jp-InputPrompt")
    deadline = time.monotonic() + CELL_TIMEOUT_S
    while time.monotonic() < deadline:
        if len(page.kernel_idle) > finished and re.fullmatch(r"\[\d+\]:", prompt.inner_text().strip()):
            return
        page.wait_for_timeout(50)  # lets Playwright deliver the websocket's frames meanwhile
    pytest.fail(f"{label}: still running after {CELL_TIMEOUT_S:.0f} s")


def _widget_errors(page: object, index: int) -> list[str]:
    """Widget views in the cell at `index` that failed to draw (Lab shows these texts in their place)."""
    outputs = " ".join(
        page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-OutputArea-output").all_inner_texts()
    )
    return [m for m in ("Error displaying widget", "Loading widget...") if m in outputs]


def _image_srcs(page: object) -> list[str]:
    return page.locator(".jp-Notebook .jp-OutputArea-output img").evaluate_all("els => els.map(e => e.src)")


def _broken_images(page: object) -> int:
    return page.locator(".jp-Notebook .jp-OutputArea-output img").evaluate_all(
        "els => els.filter(e => !(e.complete && e.naturalWidth > 0)).length"
    )


def _shot(page: object, name: str) -> Path:
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOT_DIR / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def _move_layer_slider(page: object, label: str) -> bool:
    """Move the explorer's "layer" slider by one step; True if there was one. Asserts the figure changed."""
    sliders = [
        s
        for s in page.locator(".jp-Notebook .widget-slider").all()
        if LAYER_LABEL.match(s.locator(".widget-label").first.inner_text())
    ]
    if not sliders:
        return False
    slider = sliders[0]
    handle = slider.locator("[role='slider']").first
    before_value = handle.get_attribute("aria-valuenow")
    before_srcs = _image_srcs(page)
    slider.scroll_into_view_if_needed()
    _shot(page, f"{label}-explorer-before")
    at_max = float(before_value) >= float(handle.get_attribute("aria-valuemax"))
    handle.focus()
    page.keyboard.press("ArrowLeft" if at_max else "ArrowRight")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and handle.get_attribute("aria-valuenow") == before_value:
        time.sleep(0.2)
    assert handle.get_attribute("aria-valuenow") != before_value, f"{label}: the layer slider did not move"
    while time.monotonic() < deadline and _image_srcs(page) == before_srcs:
        time.sleep(0.2)  # the kernel redraws the figure
    assert _image_srcs(page) != before_srcs, f"{label}: moving the layer slider did not change any figure"
    time.sleep(0.5)  # let the new image paint before the screenshot
    assert _broken_images(page) == 0, f"{label}: a figure failed to render after moving the slider"
    _shot(page, f"{label}-explorer-after")
    return True


# ------------------------------------------------------------------------------------------------ tests
def test_lab_asks_for_the_token(lab: LabServer, page: object) -> None:
    """Without the token in the URL, the browser gets Lab's login page, not the notebooks."""
    page.goto(lab.url + "lab")
    page.wait_for_selector("input[type='password']", timeout=OPEN_TIMEOUT_MS)
    assert page.locator(".jp-Notebook").count() == 0
    assert "login" in page.url, page.url
    _shot(page, "login")


def test_kernel_is_the_course_interpreter(lab: LabServer) -> None:
    """Lab's default kernel, python3, runs the interpreter the course is installed in."""
    import sys

    status, specs = api_request(lab.url + "api/kernelspecs", lab.token)
    assert status == 200, specs
    assert specs["default"] == "python3", specs["default"]
    argv0 = specs["kernelspecs"]["python3"]["spec"]["argv"][0]
    # "python"/"python3" means the server's own interpreter (jupyter_client substitutes sys.executable),
    # which lab_server starts as this one.
    assert argv0 in ("python", "python3") or Path(argv0).resolve() == Path(sys.executable).resolve(), argv0


def _run_all_cells(page: object, nb: nbformat.NotebookNode, path: Path) -> set[str]:
    """Run every code cell in the browser, in order, as a learner does; stop at the first error. -> the
    exercises whose round trip ran."""
    cells = page.locator(".jp-Notebook .jp-Cell")
    gpus = _gpu_count()
    code_cells = 0
    tripped = set()
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or _skipped_here(cell, gpus):  # conftest.py skips these for nbval too
            continue
        label = f"{path.name} cell {i}"
        seen = len(page.kernel_errors)
        _run_cell(page, i, label)  # returns once the kernel is idle after it: its errors have arrived
        code_cells += 1
        errors = page.kernel_errors[seen:] + _widget_errors(page, i)
        if errors:
            cells.nth(i).scroll_into_view_if_needed()
            pytest.fail(f"{label} shows an error:\n" + "\n".join(e[-2000:] for e in errors))
        if "setup" in cell.metadata.get("tags", []):
            _check_smoke_profile(page, i, path)
        if "exercise-check" in cell.metadata.get("tags", []) and SOLUTIONS_IN_PLACE:
            _exercise_round_trip(page, nb, i, cell.metadata["exercise"])
            tripped.add(cell.metadata["exercise"])
    assert code_cells > 0, f"{path.name}: no code cell ran"
    time.sleep(1.0)  # last images and widget views paint
    figures = page.locator(".jp-Notebook .jp-OutputArea-output img").count()
    assert _broken_images(page) == 0, f"{path.name}: a figure did not render"
    if FIGURE_CODE.search(_code(nb)):
        assert figures > 0, f"{path.name}: the code draws figures but none is shown in Lab"
    views = page.locator(".jp-Notebook .jp-OutputArea-output .jupyter-widgets").count()
    assert views > 0, f"{path.name}: the notebook uses widgets but none is drawn"
    moved = _move_layer_slider(page, path.stem)
    if "attention" in path.stem:
        assert moved, f"{path.name}: the attention explorer (a slider described 'layer') is not drawn"
    measured = [
        i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and "What we measured" in c.source
    ]
    cells.nth(measured[0] if measured else len(nb.cells) - 1).evaluate(
        "e => e.scrollIntoView({block: 'start'})"
    )
    _shot(page, f"{path.stem}-measured" if measured else f"{path.stem}-end")  # this run's numbers, as shown
    return tripped


def _run_parameters_cell(page: object, nb: nbformat.NotebookNode, path: Path) -> int | None:
    """Run the code cells up to the `setup` cell (install, parameters, the sizes for this device) -> its
    index; checks the smoke profile in the line the setup cell prints."""
    index = next((i for i, c in enumerate(nb.cells) if "setup" in c.metadata.get("tags", [])), None)
    if index is None:
        return None
    seen = len(page.kernel_errors)
    for i in range(index + 1):
        if nb.cells[i].cell_type == "code":
            _run_cell(page, i, f"{path.name} cell {i}")
    assert not page.kernel_errors[seen:], (
        f"{path.name}: the set-up, parameters or setup cell failed: {page.kernel_errors[seen:]}"
    )
    _check_smoke_profile(page, index, path)
    return index


def _check_smoke_profile(page: object, index: int, path: Path) -> None:
    """The setup cell at `index` printed the smoke profile: COURSE_PROFILE=smoke reached the kernel through
    the Lab server's environment."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    text = " ".join(cell.locator(".jp-OutputArea-output").all_inner_texts()).lower()
    assert "smoke profile" in text, f"{path.name}: not the smoke profile: {text[:200]!r}"  # FitResult.line()


def _runs_here(path: Path, nb: nbformat.NotebookNode) -> bool:
    """Whether to run all cells of `path` in the browser (BROWSER_RUN_ALL: widgets | none | stems)."""
    if RUN_ALL == "widgets":
        return path.stem in _first_of_each_widget(NOTEBOOKS)
    return path.stem in {s.strip() for s in RUN_ALL.split(",")}


@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S)
@pytest.mark.parametrize("path", NB_PARAMS)
def test_notebook_in_browser(path: Path, lab: LabServer, request: pytest.FixtureRequest) -> None:
    """Opens with the course kernel; widget notebooks run every cell cleanly, figures and widgets drawn."""
    nb = nbformat.read(path, as_version=4)
    original = path.read_bytes()
    kernel = nb.metadata.get("kernelspec", {})
    assert kernel.get("name") == "python3", (
        f"{path.name}: kernelspec {kernel!r}; the course's kernel is python3"
    )
    display_name = api_request(lab.url + "api/kernelspecs", lab.token)[1]["kernelspecs"]["python3"]["spec"][
        "display_name"
    ]
    runs_all = _runs_here(path, nb)
    runs_setup = not runs_all and RUN_SETUP == "all"
    page = request.getfixturevalue("page" if runs_all or runs_setup else "lab_tab")
    js_seen, kernel_seen = len(page.js_errors), len(page.kernel_errors)  # lab_tab's come from earlier tests
    try:
        if runs_all or runs_setup:
            _open_notebook(page, lab, path.name, display_name)
        else:
            _open_in_lab_tab(page, path.name, len(nb.cells))
        cells = page.locator(".jp-Notebook .jp-Cell")
        shown = page.evaluate(CELLS_SHOWN, path.name)  # in its own tab (lab_tab keeps earlier ones open)
        assert shown == len(nb.cells), f"{path.name}: Lab shows {shown} cells, the file has {len(nb.cells)}"
        if runs_all:
            tripped = _run_all_cells(page, nb, path)
            if path.stem == "01_attention" and SOLUTIONS_IN_PLACE:
                assert EXERCISE_ID in tripped, f"{path.name}: no {EXERCISE_ID} check cell: update EXERCISE_ID"
            page.locator(".jp-Notebook .jp-Cell").first.evaluate("e => e.scrollIntoView({block: 'start'})")
        elif runs_setup:
            index = _run_parameters_cell(page, nb, path)
            cells.nth(index or 0).evaluate("e => e.scrollIntoView({block: 'center'})")  # its output in view
        _shot(page, path.stem)
    except BaseException:
        _shot(page, f"{path.stem}-failed")  # what the learner would see at the failure
        raise
    finally:
        for session in api_request(lab.url + "api/sessions", lab.token)[1]:  # free the kernel's memory now
            if session["path"].endswith(path.name):
                api_request(f"{lab.url}api/sessions/{session['id']}", lab.token, method="DELETE")
    kernel_errors, js_errors = page.kernel_errors[kernel_seen:], page.js_errors[js_seen:]
    assert not kernel_errors, f"{path.name}: the kernel reported errors: {kernel_errors[:3]}"
    assert not js_errors, f"{path.name}: JavaScript errors in the page: {js_errors[:3]}"
    if _has_outputs(nbformat.reads(original.decode(), as_version=4)):
        assert path.read_bytes() == original, f"{path.name}: the browser session changed the file"
    else:  # its author may rewrite it meanwhile; a save from Lab would bring the outputs of the cells it ran
        assert not _has_outputs(nbformat.read(path, as_version=4)), (
            f"{path.name}: Lab saved outputs into the file"
        )


def test_each_widget_is_run_in_the_browser_by_its_first_lesson(tmp_path: Path) -> None:
    """BROWSER_RUN_ALL=widgets: the first notebook to draw each widget runs cell by cell, not the repeats."""
    code = {"a": "from course.widgets import AttentionExplorer\nAttentionExplorer(maps)",
            "b": "from course.widgets import (AttentionExplorer,)  # the same explorer again",
            "c": "import ipywidgets as w\nw.IntSlider()", "d": "print('no widget')"}
    boot = nbformat.v4.new_code_cell('KEEP = ("torch", "ipywidgets")', metadata={"tags": ["bootstrap"]})
    for stem, src in code.items():
        nb = nbformat.v4.new_notebook()
        nb.cells = [boot, nbformat.v4.new_code_cell(src)]  # every lesson's set-up cell names ipywidgets
        nbformat.write(nb, tmp_path / f"{stem}.ipynb")
    assert _first_of_each_widget(sorted(tmp_path.glob("*.ipynb"))) == {"a", "c"}
    assert {"01_attention"} <= _first_of_each_widget(NOTEBOOKS)  # the attention lesson drives the slider


# ------------------------------------------------------------------------------ a checked exercise, by hand
EXERCISE_ID = "01-flash-forward"  # the exercise whose wrong answer is typed in too
# the learner's first try: the solution without the rescale (the check must say so)
WRONG = ("alpha = torch.exp(m - m_new)", "alpha = torch.ones_like(m_new)")
# conftest.py's switch: "0" runs the notebooks as they are (a folder holding one's own answers), no solutions
SOLUTIONS_IN_PLACE = os.environ.get("COURSE_EXERCISE_SOLUTIONS", "1") != "0"


def _replace_cell_text(page: object, index: int, text: str) -> None:
    """Select the cell's whole text in its editor and put `text` in its place, as a paste does."""
    editor = page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".cm-content")
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(text)


def _outputs(page: object, index: int) -> str:
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    texts = cell.locator(".jp-OutputArea-output").all_inner_texts()
    return ANSI.sub("", " ".join(texts))


def _run_exercise(page: object, skeleton: int, check: int, label: str) -> str:
    """Run the skeleton cell, then the check cell; -> what the check cell shows."""
    _run_cell(page, skeleton, f"{label}: skeleton cell {skeleton}")
    _run_cell(page, check, f"{label}: check cell {check}")
    time.sleep(0.5)  # the output (iopub) may arrive after the reply
    page.locator(".jp-Notebook .jp-Cell").nth(check).scroll_into_view_if_needed()
    return _outputs(page, check)


def _exercise_round_trip(page: object, nb: nbformat.NotebookNode, check: int, exercise_id: str) -> None:
    """At an exercise's check cell, just run on the untouched skeleton: it said "not attempted yet"; (lesson
    01's) a wrong answer typed into the skeleton gets the hint naming its mistake; the solution typed in
    passes. The lesson then goes on with the solution in place, as under nbval (conftest.py)."""
    from course.exercises import EXERCISES

    skeleton = next(i for i, c in enumerate(nb.cells) if c.metadata.get("exercise") == exercise_id
                    and "exercise-skeleton" in c.metadata.get("tags", []))
    label = f"exercise {exercise_id}"
    shown = _outputs(page, check)
    assert f"{exercise_id}: not attempted yet" in shown, f"{label}, untouched skeleton: {shown}"
    _shot(page, f"exercise-{exercise_id}-1-not-attempted")
    solution = EXERCISES[exercise_id].solution_path.read_text(encoding="utf-8")
    if exercise_id == EXERCISE_ID:
        assert solution.count(WRONG[0]) == 1, "the wrong answer is built from the solution: update WRONG"
        seen = len(page.kernel_errors)
        _replace_cell_text(page, skeleton, solution.replace(*WRONG))
        shown = _run_exercise(page, skeleton, check, f"{label}, wrong answer")
        assert "not right yet" in shown and "wrong with several" in shown and "exp(m - m_new)" in shown, shown
        assert "ExerciseFailed" in shown, shown  # raised: Run All would stop here
        raised = page.kernel_errors[seen:]
        assert len(raised) == 1 and "ExerciseFailed" in raised[0], raised
        del page.kernel_errors[seen:]  # the one error this step expects
        _shot(page, f"exercise-{exercise_id}-2-hint")
    seen = len(page.kernel_errors)
    _replace_cell_text(page, skeleton, solution)
    shown = _run_exercise(page, skeleton, check, f"{label}, the solution")
    assert f"{exercise_id}: passed" in shown and "ExerciseFailed" not in shown, shown
    assert not page.kernel_errors[seen:], page.kernel_errors[seen:]
    _shot(page, f"exercise-{exercise_id}-3-passed")
