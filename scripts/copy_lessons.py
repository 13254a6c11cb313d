"""Your copy of the lessons: `make lab` copies the notebooks into a folder git ignores, and opens that.

    .venv/bin/python scripts/copy_lessons.py notebooks my-lessons

Your edits live there, where `git pull` and `make test` never see them. Run again (every `make lab` does):
- a lesson you do not have yet (the first start, or a new lesson of a later release) is copied in;
- a lesson you have not changed since it was copied is brought to this release's version;
- a lesson you changed is left alone, and when this release changed it too, this says so (compare it with
  notebooks/<name>, or delete yours to get the new one).
What was copied is remembered by content hash in <folder>/.course-lessons.json. Same folder twice: nothing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

RECORD = ".course-lessons.json"  # lesson file -> sha256 of the copy as it was made


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def copy_lessons(src: Path, dst: Path) -> dict[str, list[str]]:
    """Copy new lessons of `src` into `dst`, refresh unchanged copies, keep changed ones -> what happened."""
    if not src.is_dir():
        raise FileNotFoundError(f"no lessons folder {src}: run this from the course's folder")
    done: dict[str, list[str]] = {"copied": [], "updated": [], "kept": [], "kept, changed by the release": []}
    if dst.resolve() == src.resolve():
        return done
    dst.mkdir(parents=True, exist_ok=True)
    record_path = dst / RECORD
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    for lesson in sorted(src.glob("*.ipynb")):
        mine, new = dst / lesson.name, _sha(lesson)
        if not mine.exists():
            shutil.copyfile(lesson, mine)
            record[lesson.name] = new
            done["copied"].append(lesson.name)
        elif _sha(mine) == record.get(lesson.name):  # untouched since it was copied
            if new != record[lesson.name]:
                shutil.copyfile(lesson, mine)
                record[lesson.name] = new
                done["updated"].append(lesson.name)
        elif new != record.get(lesson.name, new):
            done["kept, changed by the release"].append(lesson.name)
        else:
            done["kept"].append(lesson.name)
    record_path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return done


def summary(done: dict[str, list[str]], src: Path, dst: Path) -> str:
    """One line (two when a changed lesson has a newer release) saying what happened."""
    if not any(done.values()) and dst.resolve() == src.resolve():
        return ""
    parts = [f"{what} {', '.join(names)}" for what, names in done.items() if names and what != "kept"]
    if done["kept"]:
        parts.append(f"kept your edits to {len(done['kept'])} lesson(s)")
    line = (f"make lab: your copy of the lessons is {dst}/ (git ignores it: edit there, `git pull` and "
            f"`make test` never see it); " + ("; ".join(parts) or "nothing new"))
    if done["kept, changed by the release"]:
        line += (f"\nmake lab: this release changed lessons you edited: compare yours with {src}/<name>, or "
                 "delete yours and run make lab again to get the new one")
    return line


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    src, dst = Path(argv[0]), Path(argv[1])
    text = summary(copy_lessons(src, dst), src, dst)
    if text:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
