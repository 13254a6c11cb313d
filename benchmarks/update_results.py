"""Copy the published results into docs/results.md's results section: every ladder result
(benchmarks/results/ladder-*.md), the GPU results of the attention sweep and the mixed-precision
benchmark (their CPU runs are linked from the page's text, not copied), and the capstone's recipe beside
the Trainer (capstone-vs-trainer-*.md; its recipe search is linked, not copied).

Run it after a benchmark wrote new results; a test checks that docs/results.md shows exactly what the result
files say.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- results:begin (written by benchmarks/update_results.py) -->", "<!-- results:end -->"
PAGE = "docs/results.md"  # the page that shows the published results (the README links it)
GPU_ONLY = ("attention_sweep", "mixed_precision")  # stems copied when measured on a GPU


def _on_gpu(md: Path) -> bool:
    """Whether the result next to `md` was measured on a GPU (its JSON stamp says so)."""
    data = md.with_suffix(".json")
    if not data.exists():
        return False
    return json.loads(data.read_text()).get("stamp", {}).get("device_type") == "cuda"


def results_block(root: Path = ROOT) -> str:
    """docs/results.md's results block: each published result file, under a heading naming it."""
    folder = root / "benchmarks" / "results"
    files = sorted(folder.glob("ladder-*.md"))
    if not files:
        raise ValueError("no benchmarks/results/ladder-*.md yet: run benchmarks/ladder.py first")
    files += [f for stem in GPU_ONLY for f in sorted(folder.glob(f"{stem}-*.md")) if _on_gpu(f)]
    files += [f for f in sorted(folder.glob("capstone-vs-trainer-*.md")) if "-recipes-" not in f.name]
    parts = [START]
    for f in files:
        body = re.sub(r"^# .*\n+", "", f.read_text().strip())  # the page gives its own heading
        parts += [f"### `{f.relative_to(root).as_posix()}`", "", body, ""]
    parts.append(END)
    return "\n".join(parts)


def main() -> None:
    page = ROOT / PAGE
    text = page.read_text()
    if START not in text or END not in text:
        raise ValueError(f"{PAGE} lacks the markers {START!r} ... {END!r}")
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    page.write_text(head + results_block() + tail)
    print(f"{PAGE}: results section updated")


if __name__ == "__main__":
    main()
