"""Small result tables that render as Markdown in Jupyter and as text in a terminal (every lesson)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["Table", "fmt"]


def fmt(value: Any, digits: int = 3) -> str:
    """Format one cell: floats to `digits` significant figures, None as a dash (every lesson)."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # NaN
            return "nan"
        return f"{value:.{digits}g}" if abs(value) < 10 ** digits else f"{value:,.0f}"
    return str(value)


_MARKDOWN = str.maketrans({c: "\\" + c for c in "\\|*_`<[]"})  # what Markdown would read as syntax


def _md(text: str) -> str:
    """`text` shown as written in a Markdown table: aten::_fused_adamw_ not in italics, |Δ| not two cells."""
    return text.translate(_MARKDOWN)


@dataclass
class Table:
    """Rows under named columns, drawn as Markdown in a notebook and as text in a terminal (every lesson)."""

    columns: Sequence[str]
    rows: list[Sequence[Any]] = field(default_factory=list)
    title: str = ""

    def __post_init__(self) -> None:
        for row in self.rows:
            self._check(row)

    def _check(self, row: Sequence[Any]) -> None:
        if len(row) != len(self.columns):
            raise ValueError(f"row {list(row)!r} has {len(row)} cells; the table has "
                             f"{len(self.columns)} columns {list(self.columns)!r}")

    def add(self, *cells: Any) -> None:
        """Append one row."""
        self._check(cells)
        self.rows.append(cells)

    def column(self, name: str) -> list[Any]:
        """The raw values of one column."""
        if name not in self.columns:
            raise ValueError(f"no column {name!r}; columns are {list(self.columns)!r}")
        i = list(self.columns).index(name)
        return [row[i] for row in self.rows]

    def to_markdown(self) -> str:
        """The table as GitHub-flavoured Markdown."""
        lines = [f"**{_md(self.title)}**", ""] if self.title else []
        lines.append("| " + " | ".join(_md(str(c)) for c in self.columns) + " |")
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        lines += ["| " + " | ".join(_md(fmt(c)) for c in row) + " |" for row in self.rows]
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def __str__(self) -> str:
        cells = [list(self.columns)] + [[fmt(c) for c in row] for row in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(([self.title] if self.title else []) + lines)
