"""Chart specs: what to draw, as data. The view model holds them; ``static/report.js`` draws them.

A spec names no plotting library: series of points (or bar values over categories) with a
``role`` that picks the colour and marker (``chosen``, ``validated``, ``budget`` ...). Tests
assert on these records; the browser test checks that every one was drawn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Point = tuple[float, float | None]


@dataclass(frozen=True, kw_only=True, slots=True)
class Series:
    label: str
    role: str = ""  # colour/marker hint for report.js
    points: tuple[Point, ...] = ()  # x/y charts
    values: tuple[float | None, ...] = ()  # bar charts: one per category
    hover: tuple[str, ...] = ()  # per point/value: the tooltip's extra line
    kind: str = ""  # "" = the chart's kind; "line" draws a line inside a bar chart
    stack: str = ""  # bar series with the same stack are stacked

    def sorted_by_x(self) -> Series:
        """The points in increasing x, each with its own hover line. The page turns Chart.js's
        parsing off, and Chart.js then takes unparsed x/y data as sorted: it reads an axis's
        range from the first and last points and looks points up by binary search. Until
        2026-12-07 the candidates chart, in trials.csv order, left 6 of 24 points off its x
        axis (audit 41, D2)."""
        order = sorted(range(len(self.points)), key=lambda i: self.points[i][0])
        hover = self.hover
        if len(hover) == len(self.points):
            hover = tuple(hover[i] for i in order)
        return dataclasses.replace(self, points=tuple(self.points[i] for i in order), hover=hover)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "role": self.role,
            "points": [list(p) for p in self.points],
            "values": list(self.values),
            "hover": list(self.hover),
            "kind": self.kind,
            "stack": self.stack,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Chart:
    """One chart. ``kind``: ``line`` | ``scatter`` | ``bar``; ``categories`` for bars."""

    id: str
    title: str
    kind: str
    x_label: str
    y_label: str
    series: tuple[Series, ...]
    categories: tuple[str, ...] = ()
    x_log: bool = False
    x_bytes: bool = False  # x values are bytes: ticks at powers of two, labelled KiB/MiB/GiB
    y_log: bool = False
    y_min: float | None = None
    y_max: float | None = None
    stacked: bool = False
    zoom: bool = True  # drag a box to zoom, double-click to reset
    caption: str = ""

    @property
    def num_points(self) -> int:
        return sum(len(s.points) + sum(v is not None for v in s.values) for s in self.series)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "kind": self.kind,
            "x_label": self.x_label,
            "y_label": self.y_label,
            # x/y charts: each series sorted by x, as the page's Chart.js expects it
            "series": [
                (s if self.kind == "bar" else s.sorted_by_x()).to_dict() for s in self.series
            ],
            "categories": list(self.categories),
            "x_log": self.x_log,
            "x_bytes": self.x_bytes,
            "y_log": self.y_log,
            "y_min": self.y_min,
            "y_max": self.y_max,
            "stacked": self.stacked,
            "zoom": self.zoom,
        }


def nonempty(charts: Sequence[Chart | None]) -> tuple[Chart, ...]:
    """Charts that have something to draw (a chart with no points is a note instead)."""
    return tuple(c for c in charts if c is not None and c.num_points > 0)
