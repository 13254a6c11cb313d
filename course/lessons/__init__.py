"""Each lesson's set-up, one module per lesson (`course.lessons.lesson00` ... `lesson09`): the sizes it
runs at on the device it finds, the memory estimates behind them, the order in which they shrink, and the
lesson's own plumbing (its checks and tables), so that the lesson itself shows the idea.

    from course.lessons import lesson04
    S = lesson04.setup(PROFILE)   # prints one line: the device, the sizes chosen and why, the precision
    S.BATCH, S.SEQ, S.FIT         # what it chose (S.FIT: a course.sizing.Fit)

A setup allocates nothing on the device: it reads the device's name, capability and memory, so a test makes a
lesson's decisions for any GPU class on a CPU (tests/fakegpu.py, tests/lesson_sizes.py, docs/gpus.md).
"""

from __future__ import annotations

import types
from typing import Any

__all__ = ["LessonSetup", "LESSON_MODULES"]

# the notebook's stem -> its module here
LESSON_MODULES = {
    "00_setup": "lesson00", "01_attention": "lesson01", "02_mixed_precision": "lesson02",
    "03_memory": "lesson03", "04_where_time_goes": "lesson04", "05_compile": "lesson05",
    "06_input_pipeline": "lesson06", "07_distributed": "lesson07", "08_bert_finetuning": "lesson08",
    "09_plan_your_run": "lesson09", "10_make_it_fit": "lesson10",
}


class LessonSetup(types.SimpleNamespace):
    """What a lesson's setup chose on this device: upper-case attributes (S.PROFILE, S.DEVICE, S.FIT, S.BATCH,
    ...), S.FIT a course.sizing.Fit (every lesson)."""

    def __repr__(self) -> str:
        fit = getattr(self, "FIT", None)
        return f"LessonSetup({fit.line() if fit is not None else ', '.join(vars(self))})"

    def get(self, name: str, default: Any = None) -> Any:
        """The attribute `name`, or `default` (tests read a lesson's decisions by name)."""
        return getattr(self, name, default)
