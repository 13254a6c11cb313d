"""Write docs/gpus.md: what each GPU class gets in each lesson (sizes, precision, attention backend, what is
skipped and why), from each lesson's set-up (course/lessons/) run under a faked GPU on this CPU
(tests/lesson_sizes.py: the same decisions tests/test_gpu_matrix.py checks).

    python scripts/gpus_doc.py           # rewrite docs/gpus.md
    python scripts/gpus_doc.py --check   # exit 1 when docs/gpus.md is not current
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the fake GPUs and the cell runner

from fakegpu import GPU_CLASSES  # noqa: E402
from lesson_sizes import DOC, decisions, plan, render_gpus_doc  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only say whether docs/gpus.md is current")
    args = p.parse_args(argv)
    page = render_gpus_doc(decisions, plan, list(GPU_CLASSES))
    if args.check:
        current = DOC.is_file() and DOC.read_text(encoding="utf-8") == page
        print(f"{DOC.name}: {'current' if current else 'NOT current: run python scripts/gpus_doc.py'}")
        return 0 if current else 1
    DOC.write_text(page, encoding="utf-8")
    print(f"wrote {DOC} ({len(page.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
