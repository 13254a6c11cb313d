"""docs/claims.md is the course's one home for the claims it measures: every citation resolves, every number
on a line that links a results file (a measured row, or a sentence quoting one) is in the file it links, the
datasheet arithmetic it quotes adds up, and nothing cites a file a learner's clone does not have."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = ROOT / "docs" / "claims.md"
# where claims are cited
CITING = ("notebooks", "scripts", "benchmarks", "helpers", "course", "README.md", "docs")
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
            links = re.findall(r"\]\(\.\./(benchmarks/results/[^)]+)\)", row)
            for link in links:
                assert (ROOT / link).is_file(), f"{cid}: links {link}, which does not exist"
            quoted = re.findall(r"`([^`]+)`", row)
            assert quoted, f"{cid}: a measured row names no figure from {links}: {row}"
            texts = "\n".join((ROOT / link).read_text() for link in links)
            absent = [q for q in quoted if q not in texts]
            assert not absent, f"{cid}: {absent} are not in {links} (stale or invented figures)"


NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?")  # 0.07, 1,701, -0.47; not the 2 of "C2" or "x2"


def numbers(text: str) -> set[str]:
    """The numbers in a text, commas dropped ("1,701" -> "1701")."""
    return {n.replace(",", "") for n in NUMBER.findall(text)}


def unbacked_numbers(claims_text: str, root: Path = ROOT) -> list[str]:
    """'cN: n' for every number on a line that links a results file (a measured row: its device and value
    columns; a sentence: all of it) that none of the files it links holds."""
    found = []
    for cid, body in claim_sections(claims_text).items():
        for line in (r for r in body.splitlines() if "](../benchmarks/results/" in r):
            links = re.findall(r"\]\(\.\./(benchmarks/results/[^)]+)\)", line)
            held = set().union(*(numbers((root / link).read_text()) for link in links
                                 if (root / link).is_file()))
            said = re.sub(r"\]\([^)]*\)", "]", line)  # link targets are file names, not figures
            if said.startswith("|"):
                said = "|".join(said.strip().strip("|").split("|")[:-1])  # the file column names the file
            found += [f"{cid}: {n}" for n in sorted(numbers(said) - held)]
    return found


def test_every_number_of_a_measured_row_is_in_its_results_file():
    absent = unbacked_numbers(CLAIMS.read_text())
    assert not absent, f"numbers no linked results file holds (stale or invented): {absent}"


def test_a_number_missing_from_its_results_file_is_caught(tmp_path):
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "x-cpu.md").write_text("speed-up 0.07x over 1,701 articles")
    row = ("| a CPU | `0.07x` over 1,701 articles; an earlier run measured 1.64x "
           "| [x-cpu.md](../benchmarks/results/x-cpu.md) |")
    text = f"## C1\n\n{row}\n\nSee [x-cpu.md](../benchmarks/results/x-cpu.md): about 3 points.\n"
    # the kind of 1.64x C2 used to quote, and a figure in a sentence
    assert unbacked_numbers(text, tmp_path) == ["c1: 1.64", "c1: 3"]


def test_the_datasheet_arithmetic_of_c9_adds_up():
    body = claim_sections(CLAIMS.read_text())["c9"]
    m = re.search(r"([\d.]+) Gbit/s per pin × (\d+)-bit bus ÷ 8 = (\d+) GB/s", body)
    assert m, "C9 no longer states the bandwidth's arithmetic"
    per_pin, bus, total = float(m.group(1)), int(m.group(2)), int(m.group(3))
    assert per_pin * bus / 8 == total == 936  # the claim's 936 GB/s, from the datasheet's own two figures


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


# --- course.claims: each claim a summary judges is written once ------------------------------------------

def claim_literals(source: str) -> list[str]:
    """String literals of a Python source that cite a claim (`docs/claims.md#c4`): a claim written again
    (a docstring, prose, may cite one)."""
    import ast

    tree = ast.parse(source)
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    strings = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return [n.value for n in strings if id(n) not in docs and CITATION.search(n.value)]


def test_the_lessons_cite_claims_from_the_registry_only():
    """The lessons' summaries take a claim's words, anchor and rule from course.claims; no course module
    writes a claim's citation again (comments may point at docs/claims.md)."""
    from course.claims import CLAIMS as REGISTRY

    sections = claim_sections(CLAIMS.read_text())
    assert {c.anchor for c in REGISTRY.values()} <= set(sections), "a registry anchor docs/claims.md lacks"
    found = {str(p.relative_to(ROOT)): hits for p in sorted((ROOT / "course").rglob("*.py"))
             if (hits := claim_literals(p.read_text(encoding="utf-8")))}
    assert not found, f"claims written outside course/claims.py (use CLAIMS[...]): {found}"


def test_the_registry_check_catches_a_planted_claim_literal():
    assert claim_literals('summary.add("x", 1.0, "1.5–2.3× (docs/claims.md#c2)")\n') == [
        "1.5–2.3× (docs/claims.md#c2)"]
    assert claim_literals('summary.add("x", 1.0, CLAIMS["amp-speedup"])  # docs/claims.md#c2\n') == []
    assert claim_literals('def f():\n    """Judges docs/claims.md#c2."""\n') == []
