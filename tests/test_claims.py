"""docs/claims.md is the course's one home for the claims it measures: every citation resolves, every quoted
figure is in the results file it links, and nothing cites a file a learner's clone does not have."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = ROOT / "docs" / "claims.md"
CITING = ("notebooks", "scripts", "benchmarks", "helpers", "README.md", "docs")  # where claims are cited
CITATION = re.compile(r"claims\.md#(c\d+)", re.IGNORECASE)  # docs/claims.md#c4, ../docs/claims.md#c4
# citations of files outside the course, and numbered claims without an id ("CLAIMS #2", "claim 7")
# The names are assembled here so that this file does not itself cite what it forbids.
OUTSIDE_CLAIMS, OUTSIDE_DIR = "CLAIMS" + ".md", ".." + "/" + "shared"
FORBIDDEN = {
    "the claims file that is not in the course": re.compile(re.escape(OUTSIDE_CLAIMS)),
    "a path outside the repository": re.compile(re.escape(OUTSIDE_DIR)),
    "a claim number without docs/claims.md": re.compile(r"\bclaims?\s+#?\d+\b", re.IGNORECASE),
}
FIELDS = ("**Claim.**", "**Source.**", "**Measured by.**", "**Verdict rule.**", "**Latest measured.**")
SUFFIXES = {".py", ".ipynb", ".md", ".txt", ".toml", ".yml", ".yaml", ".cfg", ".sh", ""}


def claim_sections(text: str) -> dict[str, str]:
    """{"c1": the text of section "## C1", ...} of a claims file."""
    parts = re.split(r"^## (C\d+)\s*$", text, flags=re.MULTILINE)
    return {cid.lower(): body for cid, body in zip(parts[1::2], parts[2::2])}


def cited_ids(paths: list[Path]) -> dict[str, list[str]]:
    """{claim id: [files citing it]} over the given files and folders."""
    cited: dict[str, list[str]] = {}
    for path in paths:
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            if f.suffix not in SUFFIXES or "__pycache__" in f.parts:
                continue
            for cid in CITATION.findall(f.read_text(errors="replace")):
                cited.setdefault(cid.lower(), []).append(str(f.relative_to(path.parent)))
    return cited


def unknown_citations(paths: list[Path], claims_text: str) -> dict[str, list[str]]:
    """The cited ids a claims file lacks, with the files citing them."""
    known = claim_sections(claims_text)
    return {cid: files for cid, files in cited_ids(paths).items() if cid not in known}


def repo_files() -> list[Path]:
    """The files of the repository (git's list when there is one; else every file outside build folders)."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        files = [ROOT / line for line in out.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "build", "__pycache__", ".ipynb_checkpoints"}
        files = [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.parts)]
    return [f for f in files if f.is_file() and f.suffix in SUFFIXES and f != Path(__file__).resolve()]


def forbidden_citations(files: list[Path]) -> list[str]:
    """'path:line: what' for every citation of a file outside the course, or a bare claim number."""
    found = []
    for f in files:
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            where = f.relative_to(ROOT) if f.is_relative_to(ROOT) else f
            found += [f"{where}:{n}: {what}: {line.strip()[:90]}"
                      for what, pattern in FORBIDDEN.items() if pattern.search(line)]
    return found


def test_every_claim_has_its_fields():
    sections = claim_sections(CLAIMS.read_text())
    assert len(sections) >= 11, f"docs/claims.md has {len(sections)} claims"
    ids = [f"c{i}" for i in range(1, len(sections) + 1)]
    assert list(sections) == ids, "claim ids must run C1, C2, ... in order"
    for cid, body in sections.items():
        missing = [f for f in FIELDS if f not in body]
        assert not missing, f"{cid}: missing {missing}"
        table = re.search(r"^\| device \| value \| file \|", body, re.MULTILINE)
        assert table, f"{cid}: no measured-value table"


def test_every_cited_claim_exists():
    unknown = unknown_citations([ROOT / p for p in CITING], CLAIMS.read_text())
    assert not unknown, f"cited claim ids missing from docs/claims.md: {unknown}"


def test_a_planted_unknown_citation_is_caught(tmp_path):
    (tmp_path / "lesson.ipynb").write_text('{"source": ["see docs/claims.md#c4 and ../docs/claims.md#C99"]}')
    text = CLAIMS.read_text()
    assert unknown_citations([tmp_path], text) == {"c99": [f"{tmp_path.name}/lesson.ipynb"]}
    assert "c4" in cited_ids([tmp_path]) and unknown_citations([tmp_path], text + "\n## C99\n") == {}


def test_measured_values_are_in_the_linked_results():
    # each measured row quotes its figures in `code` spans; each span must be in the results file it links
    for cid, body in claim_sections(CLAIMS.read_text()).items():
        for row in (r for r in body.splitlines() if "](../benchmarks/results/" in r):
            link = re.search(r"\]\(\.\./(benchmarks/results/[^)]+)\)", row).group(1)
            target = ROOT / link
            assert target.is_file(), f"{cid}: links {link}, which does not exist"
            quoted = re.findall(r"`([^`]+)`", row)
            assert quoted, f"{cid}: a measured row names no figure from {link}: {row}"
            absent = [q for q in quoted if q not in target.read_text()]
            assert not absent, f"{cid}: {absent} are not in {link} (stale or invented figures)"


def test_gpu_rows_say_how_to_measure_them():
    for cid, body in claim_sections(CLAIMS.read_text()).items():
        for row in (r for r in body.splitlines() if r.startswith("| GPU")):
            assert "results/" in row or "make gpu-check" in row, f"{cid}: a GPU row names no file and no way"


def test_nothing_cites_files_outside_the_course(tmp_path):
    planted = tmp_path / "planted.md"
    planted.write_text(f"see {OUTSIDE_CLAIMS}\nrung (CLAIMS #2)\nand {OUTSIDE_DIR}/NOTES.md\n"
                       "as claim 7 says\n")
    assert len(forbidden_citations([planted])) == 4  # the check finds each kind
    found = forbidden_citations(repo_files())
    assert not found, "cite docs/claims.md#cN instead:\n" + "\n".join(found)


@pytest.mark.parametrize("text", ["docs/claims.md#c2", "the claims file", "CLAIM7_RATIO = 1.0",
                                  "the claim '10–30 % faster'"])
def test_allowed_wording_is_not_flagged(tmp_path, text):
    f = tmp_path / "ok.md"
    f.write_text(text)
    assert forbidden_citations([f]) == [], text
