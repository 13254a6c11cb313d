"""Write docs/gpus.md: what each GPU class gets in each lesson (sizes, precision, attention backend, what is
skipped and why), from each lesson's set-up (course/lessons/) run under a faked GPU on this CPU. It lives
beside the tests because it is their fixtures' output: the fake GPUs (fakegpu.py) and the decisions
(lesson_sizes.py) that test_gpu_matrix.py checks, and which compares the page with this script's.

    python tests/gpus_doc.py           # rewrite docs/gpus.md
    python tests/gpus_doc.py --check   # exit 1 when docs/gpus.md is not current
"""

from __future__ import annotations

import argparse
import sys

from fakegpu import GPU_CLASSES  # `python tests/gpus_doc.py` puts tests/ first on sys.path
from lesson_sizes import DOC, decisions, plan, render_gpus_doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only say whether docs/gpus.md is current")
    args = p.parse_args(argv)
    page = render_gpus_doc(decisions, plan, list(GPU_CLASSES))
    if args.check:
        current = DOC.is_file() and DOC.read_text(encoding="utf-8") == page
        print(f"{DOC.name}: {'current' if current else 'NOT current: run python tests/gpus_doc.py'}")
        return 0 if current else 1
    DOC.write_text(page, encoding="utf-8")
    print(f"wrote {DOC} ({len(page.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
