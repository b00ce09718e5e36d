"""Memory: where each config's predicted peak goes, stacked, against the budget.

The cost model predicts one rank's peak as the traced peak (parameters, gradients, optimizer
state, activations, temporaries, as the fake trace counted them) plus what tracing cannot see
(CUDA context and workspaces, allocator fragmentation; on CPU the process's resident memory
beyond tensors). Its breakdown names the parameter, gradient and optimizer-state bytes; how the
rest of the traced peak splits into gradients, activations and temporaries is read off the
profile's own traces of that (precision, checkpointing) — interpolated in micro-batch size,
since every category is affine in it (DESIGN.md, "Memory") — and scaled to the predicted total.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reports import fmt
from reports.charts import Chart, Series
from reports.common import candidate_key, long_label, mapping, plan_candidate, short_label
from reports.fmt import GiB, MiB, num
from reports.model import Section, Table, cell, num_cell

CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer state",
    "activations",
    "temporaries",
    "overhead",
)
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


def _traces_for(profile: Mapping[str, Any], c: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    accumulating = int(c.get("grad_accum_steps") or 1) > 1
    out = []
    for trace in profile.get("memory") or ():
        spec = mapping(mapping(trace).get("spec"))
        if (
            spec.get("precision") == c.get("precision")
            and spec.get("activation_checkpointing") == c.get("activation_checkpointing")
            and spec.get("parallelism", "single") == "single"
        ):
            out.append(((int(spec.get("grad_accum_steps") or 1) > 1) == accumulating, trace))
    same = [t for match, t in out if match]
    return same or [t for _m, t in out]


def _phase_parts(trace: Mapping[str, Any], phase: str) -> dict[str, float]:
    b = mapping(trace.get(f"{phase}_breakdown")) or mapping(trace.get("forward_backward_breakdown"))
    other = sum(num(b.get(k)) or 0.0 for k in ("temporaries", "other", "communication"))
    return {
        "gradients": num(b.get("gradients")) or 0.0,
        "activations": num(b.get("activations")) or 0.0,
        "temporaries": other,
    }


def _interpolated_shares(
    traces: Sequence[Mapping[str, Any]], micro_batch: int, phase: str
) -> dict[str, float] | None:
    """gradients/activations/temporaries at ``micro_batch``: the traces' values, linear in b
    between (or beyond) the two nearest traced sizes."""
    points: dict[int, dict[str, float]] = {}
    for t in traces:
        b = int(mapping(t.get("spec")).get("micro_batch_size") or 0)
        if b > 0:
            points[b] = _phase_parts(t, phase)
    if not points:
        return None
    if micro_batch in points or len(points) == 1:
        return points.get(micro_batch) or next(iter(points.values()))
    sizes = sorted(points, key=lambda b: (abs(b - micro_batch), b))[:2]
    b0, b1 = sorted(sizes)
    out = {}
    for k in points[b0]:
        slope = (points[b1][k] - points[b0][k]) / (b1 - b0)
        out[k] = max(points[b0][k] + slope * (micro_batch - b0), 0.0)
    return out


def breakdown(
    profile: Mapping[str, Any] | None, candidate: Mapping[str, Any], prediction: Mapping[str, Any]
) -> tuple[dict[str, int], str]:
    """(bytes per category summing to the predicted peak, "traced" | "estimated")."""
    m = mapping(mapping(prediction.get("breakdown")).get("memory"))
    total = int(num(prediction.get("peak_memory_bytes")) or 0)
    traced = int(num(m.get("traced_bytes")) or total)
    world = max(int(candidate.get("world_size") or 1), 1)
    params = num(m.get("parameter_bytes")) or 0.0
    grads_full = num(m.get("gradient_bytes")) or 0.0
    optimizer = num(m.get("optimizer_state_bytes")) or 0.0
    overhead = max(total - traced, 0)
    fsdp = mapping(m.get("fsdp"))
    split = "traced"
    if fsdp:
        # ZeRO-3-like sharding (strategies.cost._fsdp_memory): state / N, gathered units and
        # the reduce-scatter buffer are transient (temporaries), activations as on one device.
        params, optimizer = params / world, optimizer / world
        grads = grads_full / world + (num(fsdp.get("reduce_scatter_buffer_bytes")) or 0.0)
        activations = num(fsdp.get("activation_bytes")) or 0.0
        temporaries = max(traced - params - optimizer - grads - activations, 0.0)
    else:
        buckets = num(m.get("ddp_gradient_buckets_bytes")) or 0.0
        rest = max(traced - params - optimizer - buckets, 0.0)
        phase = str(m.get("phase") or "forward_backward")
        shares = _interpolated_shares(
            _traces_for(profile or {}, candidate),
            int(candidate.get("micro_batch_size") or 1),
            phase,
        )
        if shares is None or sum(shares.values()) <= 0:
            split = "estimated"
            live = phase == "optimizer_step" or int(candidate.get("grad_accum_steps") or 1) > 1
            grads = min(rest, grads_full) if live else 0.0
            shares = {"gradients": grads, "activations": rest - grads, "temporaries": 0.0}
        scale = rest / sum(shares.values()) if sum(shares.values()) > 0 else 0.0
        grads = shares["gradients"] * scale + buckets
        activations = shares["activations"] * scale
        temporaries = shares["temporaries"] * scale
    parts = {
        "parameters": round(params),
        "gradients": round(grads),
        "optimizer state": round(optimizer),
        "activations": round(activations),
        "temporaries": round(temporaries),
        "overhead": round(overhead),
    }
    # Rounding and clamping may leave a few bytes: they go to temporaries so the parts add up.
    parts["temporaries"] = max(parts["temporaries"] + total - sum(parts.values()), 0)
    return parts, split


def memory_bars(
    profile: Mapping[str, Any] | None, plan: Mapping[str, Any] | None
) -> tuple[MemoryBar, ...]:
    """The chosen config, the naive baseline and the best alternatives, in that order."""
    if not plan:
        return ()
    entries: list[tuple[str, Mapping[str, Any], Mapping[str, Any]]] = []
    entries.append(("chosen", plan_candidate(plan), mapping(plan.get("predicted"))))
    baseline = mapping(plan.get("baseline"))
    if baseline.get("config") and baseline.get("predicted"):
        entries.append(("baseline", mapping(baseline["config"]), mapping(baseline["predicted"])))
    for alt in plan.get("alternatives") or ():
        alt = mapping(alt)
        if alt.get("predicted"):
            entries.append(
                ("alternative", mapping(alt.get("candidate")), mapping(alt["predicted"]))
            )
    bars, seen = [], set()
    for role, c, p in entries:
        key = candidate_key(c)
        if key in seen or num(p.get("peak_memory_bytes")) is None:
            continue
        seen.add(key)
        parts, split = breakdown(profile, c, p)
        m = mapping(mapping(p.get("breakdown")).get("memory"))
        bars.append(
            MemoryBar(
                key=key,
                label=short_label(c),
                role=role,
                parts=parts,
                total_bytes=int(num(p.get("peak_memory_bytes")) or 0),
                budget_bytes=int(b) if (b := num(p.get("budget_bytes"))) is not None else None,
                phase=str(m.get("phase") or ""),
                split=split,
                ranks_sharing_memory=int(num(m.get("ranks_sharing_memory")) or 1),
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
    lead = [
        f"The chosen config ({long_label(plan_candidate(plan or {}))}) is predicted to peak at "
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
