"""Every relative link in README.md and docs/ reaches a file of the repository, and a heading of it where it
names one; every "Guide: docs/library/..." a library module points at exists (GitHub's heading anchors)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)
GUIDE = re.compile(r"Guide: (docs/library/[\w.]+\.md)(#[\w-]+)?")


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but - and _ dropped, spaces as -."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.DOTALL)  # a "# comment" in a code block is no heading
    return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}


def broken_links(page: Path, text: str) -> list[str]:
    """The links of a Markdown page that reach no file, or no heading of the page they name."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    bad = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # https:, mailto: ...: not the repository's
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            bad.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
            bad.append(f"{target}: no heading #{anchor}")
    return bad


def test_the_docs_links_reach_their_files_and_headings():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = {str(p.relative_to(ROOT)): bad for p in pages
             if (bad := broken_links(p, p.read_text(encoding="utf-8")))}
    assert not found, f"broken links: {found}"


def test_every_guide_a_library_module_names_exists():
    bad = []
    for path in sorted((ROOT / "helpers").rglob("*.py")):
        for page, anchor in GUIDE.findall(path.read_text(encoding="utf-8")):
            target = ROOT / page
            if not target.is_file():
                bad.append(f"{path.relative_to(ROOT)}: {page} does not exist")
            elif anchor and anchor[1:] not in anchors(target.read_text(encoding="utf-8")):
                bad.append(f"{path.relative_to(ROOT)}: {page} has no heading {anchor}")
    assert not bad, bad


def test_the_link_check_catches_a_planted_broken_link_and_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# helpers.train.loop\n\n## Batches\n", encoding="utf-8")
    page = tmp_path / "b.md"
    assert broken_links(page, "[x](a.md#helperstrainloop) [y](a.md#batches) [w](https://x.org/z)") == []
    assert broken_links(page, "[x](a.md#helperstrainlop)") == [
        "a.md#helperstrainlop: no heading #helperstrainlop"]
    assert broken_links(page, "[x](missing.md)") == ["missing.md: no such file"]
    assert anchors("## The dry run's terms (lesson 09)\n") == {"the-dry-runs-terms-lesson-09"}
