"""One command makes a release (issue 40): `scripts/course_release.py --release X.Y.Z` (`make release`) sets
the version and the tag vX.Y.Z, and every lesson's install cell, every badge and README.md's links name it."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = ("pyproject.toml", "README.md", "course_setup.py", "CHANGELOG.md", "CITATION.cff",
         "helpers/__init__.py")


def _release_script():
    spec = importlib.util.spec_from_file_location("course_release", ROOT / "scripts" / "course_release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def copy(tmp_path: Path) -> Path:
    """The files a release rewrites, copied: the repository itself is never changed by a test."""
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks",
                    ignore=shutil.ignore_patterns("*checkpoints*"))
    log = tmp_path / "CHANGELOG.md"
    entry = "## [Unreleased]\n\n## [0.2.0] - 2026-12-03"
    log.write_text(log.read_text().replace("## [Unreleased]", entry, 1))
    return tmp_path


def test_one_command_names_the_release_everywhere(copy: Path) -> None:
    release = _release_script()
    changed = release.make_release("0.2.0", copy)
    wanted = {"pyproject.toml", "helpers/__init__.py", "CITATION.cff", "course_setup.py", "README.md"}
    assert wanted <= set(changed), changed
    assert release.out_of_step(copy) == []
    for path in sorted((copy / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        boot = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
        assert "/archive/v0.2.0.zip" in boot and 'release="v0.2.0"' in boot, (path.name, boot)
        header = "".join(cells[0]["source"])
        assert header.count("/blob/v0.2.0/") == 2 and "/blob/main/" not in header, path.name
    readme = (copy / "README.md").read_text()
    links = re.findall(r"https://(?:colab|kaggle)\S+?/blob/([^/]+)/", readme)
    assert links and set(links) == {"v0.2.0"}, links
    assert 'RELEASE = "v0.2.0"' in (copy / "course_setup.py").read_text()
    assert '__version__ = "0.2.0"' in (copy / "helpers/__init__.py").read_text()
    assert re.search(r'^version = "0.2.0"$', (copy / "pyproject.toml").read_text(), re.M)
    assert 'version: "0.2.0"' in (copy / "CITATION.cff").read_text()


def test_a_release_the_changelog_does_not_describe_is_refused(copy: Path) -> None:
    with pytest.raises(ValueError, match=r"CHANGELOG.md has no '## \[0.3.0\]"):
        _release_script().make_release("0.3.0", copy)
    with pytest.raises(ValueError, match="x.y.z"):
        _release_script().make_release("v0.2", copy)


def test_the_repository_names_one_version_and_its_house_files_exist() -> None:
    """Until a release, the version is the same everywhere it is written, and the files every project of this
    kind has are there."""
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    assert f'__version__ = "{version}"' in (ROOT / "helpers/__init__.py").read_text()
    assert f'version: "{version}"' in (ROOT / "CITATION.cff").read_text()
    assert "Apache License" in (ROOT / "LICENSE").read_text() and (ROOT / "helpers" / "py.typed").is_file()
