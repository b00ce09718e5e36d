"""Memory: where each config's predicted peak goes, stacked, against the budget.

The cost model predicts one rank's peak as the traced peak (parameters, gradients, optimizer
state, activations, temporaries, as the fake trace counted them) plus what tracing cannot see
(CUDA context and workspaces, allocator fragmentation; on CPU the process's resident memory
beyond tensors). strategies.memory_split splits each prediction into those categories; this
module draws them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import reports.fmt as fmt
from profilers.memory_records import MemoryTrace
from reports.charts import Chart, Series
from reports.common import candidate, mapping, plan_candidate, prediction
from reports.fmt import GiB, MiB
from reports.model import Section, Table, cell, num_cell
from strategies.memory_split import CATEGORIES, split_memory
from strategies.prediction import MemoryTerms

MAX_BARS = 7
BUDGET_ON_CHART = 5.0  # draw the budget line when it is within this factor of the tallest bar


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBar:
    """One config's predicted per-rank peak, split into :data:`CATEGORIES` (bytes)."""

    key: str
    label: str
    role: str  # chosen | baseline | alternative
    parts: Mapping[str, int]
    total_bytes: int
    budget_bytes: int | None
    phase: str
    split: str  # how activations/temporaries were split: "traced" or "estimated"
    ranks_sharing_memory: int = 1

    @property
    def fits(self) -> bool:
        return self.budget_bytes is None or self.total_bytes * self.ranks_sharing_memory <= (
            self.budget_bytes
        )


def profile_traces(profile: Mapping[str, Any] | None) -> list[MemoryTrace]:
    """The profile's fake-traced steps (a damaged entry is left out)."""
    out = []
    for trace in mapping(profile).get("memory") or ():
        try:
            out.append(MemoryTrace.from_dict(mapping(trace)))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def memory_bars(
    profile: Mapping[str, Any] | None, plan: Mapping[str, Any] | None
) -> tuple[MemoryBar, ...]:
    """The chosen config, the naive baseline and the best alternatives, in that order."""
    if not plan:
        return ()
    entries: list[tuple[str, Any, Any]] = [("chosen", plan.get("config"), plan.get("predicted"))]
    baseline = mapping(plan.get("baseline"))
    entries.append(("baseline", baseline.get("config"), baseline.get("predicted")))
    for alt in plan.get("alternatives") or ():
        alt = mapping(alt)
        entries.append(("alternative", alt.get("candidate"), alt.get("predicted")))
    traces = profile_traces(profile)
    bars: list[MemoryBar] = []
    seen: set[str] = set()
    for role, c_data, p_data in entries:
        c, p = candidate(c_data), prediction(p_data)
        if c is None or p is None or c.key in seen:
            continue
        seen.add(c.key)
        memory = p.breakdown.memory or MemoryTerms.from_dict({})
        split = split_memory(memory, p.peak_memory_bytes, c, traces)
        bars.append(
            MemoryBar(
                key=c.key,
                label=c.short_label(),
                role=role,
                parts=split.parts,
                total_bytes=p.peak_memory_bytes,
                budget_bytes=p.budget_bytes,
                phase=memory.phase if p.breakdown.memory else "",
                split=split.split,
                ranks_sharing_memory=memory.ranks_sharing_memory or 1,
            )
        )
        if len(bars) == MAX_BARS:
            break
    return tuple(bars)


def _unit(max_bytes: float) -> tuple[str, float]:
    return ("GiB", GiB) if max_bytes >= GiB else ("MiB", MiB)


def memory_chart(bars: Sequence[MemoryBar], measured_peak: tuple[str, int] | None) -> Chart | None:
    """The stacked chart. ``measured_peak``: (label, bytes) of the training run's
    peak, drawn as a marker on the chosen bar."""
    if not bars:
        return None
    tallest = max(b.total_bytes * b.ranks_sharing_memory for b in bars)
    budget = bars[0].budget_bytes
    show_budget = budget is not None and budget <= BUDGET_ON_CHART * tallest
    unit, scale = _unit(max(tallest, budget or 0) if show_budget else tallest)
    series = [
        Series(
            label=category,
            role=f"mem-{category.replace(' ', '-')}",
            values=tuple(round(b.parts[category] / scale, 4) for b in bars),
            hover=tuple(fmt.size(b.parts[category]) for b in bars),
            stack="peak",
        )
        for category in CATEGORIES
    ]
    caption = [
        "Predicted peak of one rank at its peak phase; gradients, activations and temporaries "
        "split as the profile's traces of the same precision and checkpointing split them."
    ]
    if budget is not None:
        if show_budget:
            series.append(
                Series(
                    label="budget",
                    role="budget",
                    kind="line",
                    values=tuple(round(budget / scale, 4) for _b in bars),
                    hover=tuple(fmt.size(budget) for _b in bars),
                )
            )
        else:
            caption.append(
                f"The memory budget ({fmt.size(budget)}) is {budget / tallest:.0f}× the tallest "
                "bar: off the chart."
            )
    if measured_peak is not None:
        label, value = measured_peak
        series.append(
            Series(
                label=label,
                role="measured",
                kind="point",
                values=(round(value / scale, 4),) + (None,) * (len(bars) - 1),
                hover=(fmt.size(value),) + ("",) * (len(bars) - 1),
            )
        )
    chart = Chart(
        id="memory-breakdown",
        title="Predicted peak memory per rank",
        kind="bar",
        x_label="config",
        y_label=unit,
        categories=tuple(
            f"{b.label} ({b.role})" if b.role != "alternative" else b.label for b in bars
        ),
        series=tuple(series),
        stacked=True,
        y_min=0,
        caption=" ".join(caption),
    )
    return chart


def memory_section(
    profile: Mapping[str, Any] | None,
    plan: Mapping[str, Any] | None,
    measured_peak: tuple[str, int] | None,
) -> tuple[Section, tuple[MemoryBar, ...]]:
    bars = memory_bars(profile, plan)
    if not bars:
        note = (
            "No plan yet: the breakdown needs the cost model's predictions. Run 'advisor "
            "recommend --profile RUN/profile.json --global-batch-size N --out RUN'."
            if not plan
            else "The plan holds no memory prediction."
        )
        return Section(id="memory", title="Memory", note=note), ()
    chart = memory_chart(bars, measured_peak)
    rows = []
    for b in bars:
        rows.append(
            (
                cell(b.label, hint=b.key),
                cell(b.role),
                *(num_cell(fmt.size(b.parts[c]), b.parts[c]) for c in CATEGORIES),
                num_cell(fmt.size(b.total_bytes), b.total_bytes, cls="strong"),
                num_cell(
                    fmt.percent(b.total_bytes * b.ranks_sharing_memory / b.budget_bytes)
                    if b.budget_bytes
                    else fmt.DASH,
                    b.total_bytes / b.budget_bytes if b.budget_bytes else None,
                    cls="" if b.fits else "bad",
                ),
            )
        )
    table = Table(
        columns=("config", "role", *CATEGORIES, "peak", "of budget"),
        rows=tuple(rows),
        row_classes=tuple(b.role for b in bars),
    )
    chosen = bars[0]
    share = (
        chosen.total_bytes * chosen.ranks_sharing_memory / chosen.budget_bytes
        if chosen.budget_bytes
        else None
    )
    chosen_config = plan_candidate(plan)
    lead = [
        f"The chosen config ({chosen_config.label() if chosen_config else '?'}) is predicted "
        "to peak at "
        f"{fmt.size(chosen.total_bytes)} per rank"
        + (
            f", {fmt.percent(share)} of the {fmt.size(chosen.budget_bytes)} budget."
            if share is not None
            else "."
        )
    ]
    if chosen.ranks_sharing_memory > 1:
        lead.append(
            f"Its {chosen.ranks_sharing_memory} ranks are processes on one host sharing its RAM: "
            "the budget holds all of them together."
        )
    if any(b.split == "estimated" for b in bars):
        lead.append(
            "Where the profile has no trace of a config's precision and checkpointing, its "
            "activations and temporaries are shown together as activations."
        )
    return (
        Section(
            id="memory",
            title="Memory",
            lead=tuple(lead),
            charts=(chart,) if chart else (),
            tables=(table,),
        ),
        bars,
    )
