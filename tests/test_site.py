"""Read before you run (issue 31): one lesson built as a page of the course's static site (site/build.py, the
engine of `make site`), offline, and opened in Chromium: the page shows a figure and a results table of a real
run, stamped with the machine and the profile. (`make site` builds every lesson the same way.)

The page is built from lesson 00 as tests/test_hosted.py executed it (build/hosted/, with its stamp), so the
suite runs the lesson once; run alone, this file executes it. Without network where `unshare -n` can take it
away (root on Linux), so a theme or template fetched at build time would fail the build. The screenshots go to
build/screenshots/site-*.png.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_browser import browser, chromium  # noqa: F401 (fixtures: Debian's Chromium through Playwright)

REPO = Path(__file__).resolve().parents[1]
EXECUTED = REPO / "build" / "hosted"
SHOTS = REPO / "build" / "screenshots"


def _offline() -> list[str]:
    """A command prefix that runs without any network, where this machine allows it."""
    found = shutil.which("unshare")
    probe = subprocess.run([found, "-n", "true"], capture_output=True) if found else None
    if probe is not None and probe.returncode == 0:
        return ["unshare", "-n"]
    return []


@pytest.fixture(scope="module")
def page_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    ready = EXECUTED / "00_setup.stamp.json"
    cmd = [*_offline(), sys.executable, str(REPO / "site" / "build.py"), "--out", str(out), "--lessons", "00"]
    if ready.is_file():
        cmd += ["--executed", str(EXECUTED)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    return out / "lessons" / "00_setup.html"


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
    cut = page.evaluate("""() => [...document.querySelectorAll('div.cell_input div.highlight pre')]
        .filter(p => p.scrollWidth > p.clientWidth + 1).map(p => p.textContent.split('\\n')[0])""")
    assert not cut, f"code lines cut at the page's width: {cut[:3]}"
    assert not errors, errors
    context.close()
