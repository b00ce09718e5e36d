"""The view model's building blocks: what a section shows, as plain records (compute, then render).

The template knows only these generic parts (facts, tables, charts, code blocks, notes); the
typed records of each section (``reports.memory.MemoryBar``, ``reports.candidates.TrialRow`` ...)
sit next to them in :class:`reports.view.ReportView` for tests and other consumers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reports.charts import Chart


@dataclass(frozen=True, kw_only=True, slots=True)
class Fact:
    label: str
    value: str
    hint: str = ""  # shown on hover and in small print


@dataclass(frozen=True, kw_only=True, slots=True)
class Cell:
    text: str
    sort: float | str | None = None  # the value a sortable table sorts by; None: the text
    cls: str = ""  # "num", "good", "bad", "muted"
    hint: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    row_classes: tuple[str, ...] = ()  # one per row: "chosen", "baseline" ...
    sortable: bool = False
    caption: str = ""
    id: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class CodeBlock:
    title: str
    text: str
    hint: str = ""


@dataclass(frozen=True, kw_only=True)
class Section:
    """One section of the page. ``note`` says what is missing and how to get it."""

    id: str
    title: str
    note: str = ""
    lead: tuple[str, ...] = ()
    bullets: tuple[str, ...] = ()
    facts: tuple[Fact, ...] = ()
    charts: tuple[Chart, ...] = ()
    tables: tuple[Table, ...] = ()
    code: tuple[CodeBlock, ...] = ()
    details_title: str = ""
    details: tuple[str, ...] = ()
    extra_tables: tuple[Table, ...] = ()  # collapsed under details_title
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (
            self.lead or self.bullets or self.facts or self.charts or self.tables or self.code
        )


def cell(text: str, sort: float | str | None = None, cls: str = "", hint: str = "") -> Cell:
    return Cell(text=text, sort=sort, cls=cls, hint=hint)


def num_cell(text: str, value: float | None, cls: str = "", hint: str = "") -> Cell:
    return Cell(text=text, sort=value, cls=("num " + cls).strip(), hint=hint)
