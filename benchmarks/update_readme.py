"""Copy the latest ladder results (benchmarks/results/ladder-*.md) into README.md's results section.

Run it after `benchmarks/ladder.py` or `scripts/finetune_bert.py` wrote new results; a test checks that the
README shows exactly what the result files say.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- results:begin (written by benchmarks/update_readme.py) -->", "<!-- results:end -->"


def results_block(root: Path = ROOT) -> str:
    """The README's results block: every ladder-*.md result file, each under a heading naming it."""
    files = sorted((root / "benchmarks" / "results").glob("ladder-*.md"))
    if not files:
        raise ValueError("no benchmarks/results/ladder-*.md yet: run benchmarks/ladder.py first")
    parts = [START]
    for f in files:
        body = re.sub(r"^# .*\n+", "", f.read_text().strip())  # the README gives its own heading
        parts += [f"### `{f.relative_to(root).as_posix()}`", "", body, ""]
    parts.append(END)
    return "\n".join(parts)


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if START not in text or END not in text:
        raise ValueError(f"README.md lacks the markers {START!r} ... {END!r}")
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    readme.write_text(head + results_block() + tail)
    print("README.md: results section updated")


if __name__ == "__main__":
    main()
