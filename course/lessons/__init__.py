"""Each lesson's set-up, one module per lesson (`course.lessons.lesson00` ... `lesson09`): the sizes it
runs at on the device it finds, the memory estimates behind them, the order in which they shrink, and the
lesson's own plumbing (its checks and tables), so that the lesson itself shows the idea.

    from course.lessons import lesson04
    S = lesson04.setup(PROFILE)   # prints one line: the device, the sizes chosen and why, the precision
    S.BATCH, S.SEQ, S.FIT         # what it chose (S.FIT: a course.sizing.Fit)
    S = S.replace(SEQ=2 * S.SEQ)  # frozen: a changed copy for an experiment

A setup allocates nothing on the device: it reads the device's name, capability and memory, so a test makes a
lesson's decisions for any GPU class on a CPU (tests/fakegpu.py, tests/lesson_sizes.py, docs/gpus.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # course.sizing imports nothing of the lessons; only the annotation needs it
    from course.sizing import Fit

__all__ = ["LessonSetup", "LESSON_MODULES"]

# the notebook's stem -> its module here
LESSON_MODULES = {
    "00_setup": "lesson00", "01_attention": "lesson01", "02_mixed_precision": "lesson02",
    "03_memory": "lesson03", "04_where_time_goes": "lesson04", "05_compile": "lesson05",
    "06_input_pipeline": "lesson06", "07_distributed": "lesson07", "08_bert_finetuning": "lesson08",
    "09_plan_your_run": "lesson09", "10_make_it_fit": "lesson10",
}


class LessonSetup:
    """What a lesson's setup chose on this device, frozen: S.PROFILE, S.DEVICE, S.FIT (a course.sizing.Fit)
    and the lesson's sizes (S.BATCH, S.SEQ, ...); `S.replace(SEQ=...)` is a changed copy (every lesson)."""

    PROFILE: str  # "smoke" or "full" (course.profile)
    DEVICE: torch.device
    FIT: Fit  # the sizes chosen on this device, and why

    def __init__(self, **values: Any) -> None:
        missing = [name for name in ("PROFILE", "DEVICE", "FIT") if name not in values]
        lower = [name for name in values if not name.isupper()]
        if missing or lower:
            raise TypeError(f"a lesson's set-up needs PROFILE, DEVICE and FIT (missing {missing}) and "
                            f"upper-case names only (got {lower})")
        self.__dict__.update(values)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the lesson's set-up is frozen, so a cell cannot change it behind the lesson's "
                             f"back: S = S.replace({name}=...) makes a changed copy")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"the lesson's set-up is frozen: {name} stays")

    def __getattr__(self, name: str) -> Any:  # only for a name the set-up lacks
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"this lesson's set-up has no {name!r}; it has {', '.join(sorted(vars(self)))}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LessonSetup) and vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # equal by value, like the namespace it replaced

    def __repr__(self) -> str:
        return f"LessonSetup({self.FIT.line()})"

    def replace(self, **changes: Any) -> LessonSetup:
        """A copy with `changes`, each a name the set-up has (a "Try this" experiment: every lesson)."""
        unknown = sorted(set(changes) - set(vars(self)))
        if unknown:
            has = ", ".join(sorted(vars(self)))
            raise AttributeError(f"this lesson's set-up has no {unknown}; it has {has}")
        return LessonSetup(**{**vars(self), **changes})

    def get(self, name: str, default: Any = None) -> Any:
        """The attribute `name`, or `default` (tests read a lesson's decisions by name)."""
        return vars(self).get(name, default)
