"""Affine fits y = intercept + slope * x, shared by the memory, time and communication models.

Peak memory is affine in micro-batch size (DESIGN.md, "Measuring well"), step time is
t0 + k*b, and a collective costs alpha + beta*bytes (the alpha-beta, or Hockney, model). One
least-squares fit serves all three, and keeps its residuals so a profile can show how well the
line explains what was measured.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class AffineFit:
    """y = intercept + slope * x, or max(floor, that) for a hinged fit (see fit_hinged), or
    the largest of ``pieces`` for an envelope (see :func:`envelope`)."""

    intercept: float
    slope: float
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    floor: float | None = None
    # An envelope's fits (intercept, slope and floor are then its steepest piece's).
    pieces: tuple[AffineFit, ...] = ()

    def predict(self, x: float) -> float:
        if self.pieces:
            return max(piece.predict(x) for piece in self.pieces)
        line = self.intercept + self.slope * x
        return line if self.floor is None else max(self.floor, line)

    def shifted(self, offset: float) -> AffineFit:
        """The same fit moved up by ``offset`` (floor and pieces included)."""
        return AffineFit(
            intercept=self.intercept + offset,
            slope=self.slope,
            xs=(),
            ys=(),
            floor=None if self.floor is None else self.floor + offset,
            pieces=tuple(piece.shifted(offset) for piece in self.pieces),
        )

    def mapped(self, scale: float, offset: float) -> AffineFit:
        """The fit of ``scale * y + offset`` (``scale`` > 0): the fitted points move with it,
        so the residuals keep their meaning."""
        if not scale > 0:
            raise ValueError(f"scale must be positive, got {scale}")
        return AffineFit(
            intercept=scale * self.intercept + offset,
            slope=scale * self.slope,
            xs=self.xs,
            ys=tuple(scale * y + offset for y in self.ys),
            floor=None if self.floor is None else scale * self.floor + offset,
            pieces=tuple(piece.mapped(scale, offset) for piece in self.pieces),
        )

    @property
    def residuals(self) -> tuple[float, ...]:
        return tuple(y - self.predict(x) for x, y in zip(self.xs, self.ys, strict=True))

    @property
    def max_relative_residual(self) -> float:
        """Largest |residual| / |measured| over the fitted points (0 for a two-point fit)."""
        return max(
            (abs(r) / abs(y) for r, y in zip(self.residuals, self.ys, strict=True) if y),
            default=0.0,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "intercept": self.intercept,
            "slope": self.slope,
            "xs": list(self.xs),
            "ys": list(self.ys),
            "residuals": list(self.residuals),
            "max_relative_residual": self.max_relative_residual,
            "floor": self.floor,
            **({"pieces": [piece.to_dict() for piece in self.pieces]} if self.pieces else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AffineFit:
        return cls(
            intercept=float(data["intercept"]),
            slope=float(data["slope"]),
            xs=tuple(float(x) for x in data.get("xs", ())),
            ys=tuple(float(y) for y in data.get("ys", ())),
            floor=None if data.get("floor") is None else float(data["floor"]),
            pieces=tuple(cls.from_dict(piece) for piece in data.get("pieces") or ()),
        )


def envelope(pieces: Sequence[AffineFit], xs: Sequence[float] = ()) -> AffineFit:
    """The largest of ``pieces`` at every x: a peak that is the maximum of parts each affine
    in x (e.g. the windows of a training step, each peaking at its own moment), where one
    line through the maximum's values would cut the kinks. ``xs``: the points it was
    measured at (its ``ys`` its values there); none for one derived from other fits."""
    if not pieces:
        raise ValueError("an envelope needs at least one piece")
    steepest = max(pieces, key=lambda piece: piece.slope)
    return AffineFit(
        intercept=steepest.intercept,
        slope=steepest.slope,
        xs=tuple(float(x) for x in xs),
        ys=tuple(max(piece.predict(x) for piece in pieces) for x in xs),
        floor=steepest.floor,
        pieces=tuple(pieces),
    )


def fit_affine(xs: Sequence[float], ys: Sequence[float]) -> AffineFit:
    """Ordinary least squares through (xs, ys); needs at least two distinct xs.

    With repeated samples at the same x (e.g. several timed steps per micro-batch size), pass
    them all: the fit then goes through the per-x means.
    """
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys differ in length ({len(xs)} vs {len(ys)})")
    if len(set(xs)) < 2:
        raise ValueError("an affine fit needs measurements at two or more distinct x values")
    if not all(math.isfinite(v) for v in (*xs, *ys)):
        raise ValueError("an affine fit needs finite measurements")
    mean_x = statistics.fmean(xs)
    mean_y = statistics.fmean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    return AffineFit(
        intercept=mean_y - slope * mean_x,
        slope=slope,
        xs=tuple(float(x) for x in xs),
        ys=tuple(float(y) for y in ys),
    )


def fit_hinged(xs: Sequence[float], ys: Sequence[float]) -> AffineFit:
    """max(floor, a + b*x): a line through all but the smallest x, floored at its y.

    Peak memory of a training phase is the larger of a part that does not grow with the
    micro-batch (every gradient live at the end of backward) and one that does (activations).
    A single line through a point left of the bend and one right of it under-predicts
    everything past the bend (up to 8% measured on gpt-tiny). With three or more sizes the
    line is fitted right of the smallest and the smallest's value is the floor; with two, this
    is the plain affine fit.
    """
    if len(set(xs)) < 3:
        return fit_affine(xs, ys)
    smallest = min(xs)
    right = [(x, y) for x, y in zip(xs, ys, strict=True) if x != smallest]
    line = fit_affine([x for x, _ in right], [y for _, y in right])
    floor = max(y for x, y in zip(xs, ys, strict=True) if x == smallest)
    return AffineFit(
        intercept=line.intercept,
        slope=line.slope,
        xs=tuple(float(x) for x in xs),
        ys=tuple(float(y) for y in ys),
        floor=floor,
    )
