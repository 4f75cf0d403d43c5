"""The report as data: sections of blocks, each rendered once to HTML and once to Markdown (:mod:`.render`).

Builders (:mod:`.sweep`, :mod:`.training`, :mod:`.advice`) return :class:`Section` objects and never
write markup: text is plain (the renderer escapes it for each format), emphasis and links are
:class:`Span` and :class:`Link` parts of a :class:`Paragraph`, tables are DataFrames.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import pandas as pd

from growbench.harness.report.figures.base import FigureResult
from growbench.harness.report.wording import signed


@dataclass(frozen=True)
class Span:
    """Inline text with a style: ``code``, ``strong`` (bold), ``em`` (italic) or ``file`` (a file beside the
    report: a link in Markdown, code in the self-contained HTML)."""

    text: str
    style: Literal["code", "strong", "em", "file"]


@dataclass(frozen=True)
class Link:
    """A link to a section of the report: ``anchor`` is its HTML id, ``title`` its heading (Markdown
    viewers derive the anchor from the heading)."""

    text: str
    anchor: str
    title: str


Part = str | Span | Link


@dataclass
class Paragraph:
    """A paragraph of parts; ``style`` ``note`` marks a warning, ``choice`` the recommendation."""

    parts: tuple[Part, ...]
    style: Literal["", "note", "choice"] = ""
    kind: ClassVar[str] = "paragraph"

    @classmethod
    def of(cls, *parts: Part, style: Literal["", "note", "choice"] = "") -> Paragraph:
        """A paragraph of ``parts`` (plain strings and spans), e.g. ``Paragraph.of("Use ", Span(x, "code"))``."""
        return cls(tuple(parts), style)


@dataclass
class Facts:
    """A two-column table of names and values (what a database holds)."""

    rows: dict[str, Any]
    kind: ClassVar[str] = "facts"


@dataclass
class Cell:
    """A formatted table cell; ``align`` is ``num`` (right-aligned), ``str`` (one line) or ``text`` (wraps)."""

    text: str
    align: Literal["num", "str", "text"]


@dataclass
class Table:
    """A DataFrame shown as a table: floats with ``float_format`` (or the column's entry in ``formats``; a
    leading ``+`` shows the sign), the ``wide`` columns wrapped as prose, ``small`` in a smaller font."""

    frame: pd.DataFrame
    float_format: str = ".4g"
    wide: tuple[str, ...] = ()
    small: bool = False
    formats: dict[str, str] = field(default_factory=dict)
    kind: ClassVar[str] = "table"

    @property
    def columns(self) -> list[str]:
        return [str(c) for c in self.frame.columns]

    def rows(self) -> list[list[Cell]]:
        """Every cell formatted once, for both renderers: NaN empty, booleans yes/no, integers as they are."""
        return [[self._cell(col, value) for col, value in zip(self.columns, row, strict=True)]
                for row in self.frame.itertuples(index=False)]

    def _cell(self, column: str, value: Any) -> Cell:
        if isinstance(value, bool):
            return Cell("yes" if value else "no", "str")
        if isinstance(value, numbers.Integral):
            return Cell(str(value), "num")
        if isinstance(value, numbers.Real):
            fmt = self.formats.get(column, self.float_format)
            if math.isnan(value):
                return Cell("", "num")
            return Cell(signed(value, fmt[1:]) if fmt.startswith("+") else format(value, fmt), "num")
        return Cell("" if value is None else str(value), "text" if column in self.wide else "str")


@dataclass
class Bullet:
    """One list item: its parts and, optionally, sub-items (plain text)."""

    parts: tuple[Part, ...]
    children: tuple[str, ...] = ()


@dataclass
class Bullets:
    """A list of :class:`Bullet` items."""

    items: list[Bullet]
    kind: ClassVar[str] = "bullets"


@dataclass
class Figure:
    """A figure with its caption, its numbers (``result.table``) and its details, or its note when not drawn."""

    result: FigureResult
    kind: ClassVar[str] = "figure"

    @property
    def table(self) -> Table | None:
        result = self.result
        return Table(result.table, wide=result.wide, formats=result.formats) if len(result.table) else None


Block = Paragraph | Facts | Table | Bullets | Figure


@dataclass
class Section:
    """A heading (``level`` 2 or 3; ``anchor`` its HTML id, none when empty) and its blocks.

    ``folded``: when not empty, the blocks fold away under this summary line (HTML ``<details>``),
    for long evidence a reader opens on demand.
    """

    title: str
    blocks: list[Block] = field(default_factory=list)
    level: int = 2
    anchor: str = ""
    folded: str = ""


@dataclass
class Report:
    """The whole page: its title, the sections that lead it (what to use), the commands that regenerate it,
    when it was generated (and from which database, when no section says so), blocks before the first
    section, the opening advice, the sections."""

    title: str
    command: str
    generated: str
    sections: list[Section]
    advice: Section | None = None
    source: str | None = None
    preamble: list[Block] = field(default_factory=list)
    lead: list[Section] = field(default_factory=list)


def figure_section(result: FigureResult, level: int = 2) -> Section:
    """A figure under its own heading, anchored by the figure's name."""
    return Section(result.title, [Figure(result)], level=level, anchor=result.name)
