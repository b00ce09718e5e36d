"""Candidates (every trial of the search, the Pareto chart) and predicted vs measured.

trials.csv is the source of the table (one row per candidate the search priced, with its
rejection reason); plan.json adds what only it holds: the validation measurements and the
predicted breakdowns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import reports.fmt as fmt
from reports.charts import Chart, Series, nonempty
from reports.common import (
    candidate,
    mapping,
    ok_measurement,
    plan_candidate,
    prediction,
    same_candidate,
)
from reports.fmt import GiB, MiB, num
from reports.model import Cell, Section, Table, cell, num_cell
from strategies.budgets import BUSY_HOST_SHARE
from strategies.prediction import Prediction
from strategies.space import Candidate

# How strategies.search went through the space (plan.json's search.mode), in words.
SEARCH_MODES = {
    "enumerate": "every candidate it could price enumerated",
    "screen": "all priced in memory, the trial budget's best kept in the study",
    "sample": "sampled by TPE",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRow:
    trial: int | None
    candidate: Candidate
    predicted_peak_bytes: float | None
    predicted_tokens_per_s: float | None
    predicted_step_time_s: float | None
    feasible: bool
    rejection_reason: str
    validation_status: str
    measured_tokens_per_s: float | None
    measured_peak_bytes: float | None
    chosen: bool
    baseline: bool
    in_space: bool = True  # False: the plan's baseline, shown though the search left it out

    @property
    def key(self) -> str:
        return self.candidate.key

    @property
    def label(self) -> str:
        return self.candidate.label()

    @property
    def role(self) -> str:
        if self.chosen:
            return "chosen"
        if self.baseline:
            return "baseline"
        if self.validation_status:
            return "validated"
        if self.feasible:
            return "feasible"
        return "infeasible" if self.predicted_peak_bytes is not None else "unpredictable"


def _plan_entries(plan: Mapping[str, Any]) -> list[dict[str, Any]]:
    """trials.csv-like rows of the chosen config and the plan's alternatives (an older run
    without trials.csv)."""
    chosen = plan_candidate(plan)
    entries: list[Mapping[str, Any]] = [
        {"candidate": plan.get("config"), "predicted": plan.get("predicted"), "feasible": 1}
    ]
    entries += [mapping(a) for a in plan.get("alternatives") or ()]
    rows = []
    for e in entries:
        c, p = candidate(e.get("candidate")), mapping(e.get("predicted"))
        if c is None:
            continue
        rows.append(
            {
                **c.to_dict(),
                "trial": e.get("trial_number"),
                "predicted_peak_memory_bytes": p.get("peak_memory_bytes"),
                "predicted_tokens_per_s": p.get("tokens_per_s"),
                "predicted_step_time_s": p.get("step_time_s"),
                "feasible": bool(e.get("feasible")),
                "rejection_reason": e.get("reason") or "",
                "chosen": same_candidate(c, chosen),
            }
        )
    return rows


# strategies.search.evaluate's reason for a candidate over the budget (strategies.prediction.
# memory_size: GiB to 2 decimals, below 1 GiB in MiB/KiB/B since 2026-12-07; older files GiB)
_SIZE = r"[0-9.]+ (?:GiB|MiB|KiB|B)"
_OVER_BUDGET = re.compile(rf"needs {_SIZE}(?P<whose>.*?) > budget {_SIZE}")


def _budget_reason(row: Mapping[str, Any]) -> str:
    """trials.csv's rejection reason, an over-budget one with its sizes in the page's units:
    in GiB to two decimals a 2.3 MiB budget (--memory-budget 0.0001) read "budget 0.00 GiB"
    (audit 42, D17); the row's own byte counts say it exactly."""
    reason = str(row.get("rejection_reason") or "")
    needed, budget = num(row.get("predicted_budgeted_bytes")), num(row.get("budget_bytes"))
    match = _OVER_BUDGET.fullmatch(reason)
    if match is None or needed is None or budget is None:
        return reason
    return f"needs {fmt.size(needed)}{match['whose']} > budget {fmt.size(budget)}"


def trial_rows(
    trials: Sequence[Mapping[str, Any]], plan: Mapping[str, Any] | None
) -> tuple[TrialRow, ...]:
    """From trials.csv; without it (an older run) from the plan's alternatives."""
    source = list(trials) if trials or not plan else _plan_entries(plan)
    rows = []
    for r in source:
        c = candidate(r)
        if c is None:
            continue
        trial = num(r.get("trial"))
        rows.append(
            TrialRow(
                trial=int(trial) if trial is not None else None,
                candidate=c,
                predicted_peak_bytes=num(r.get("predicted_peak_memory_bytes")),
                predicted_tokens_per_s=num(r.get("predicted_tokens_per_s")),
                predicted_step_time_s=num(r.get("predicted_step_time_s")),
                feasible=bool(r.get("feasible")),
                rejection_reason=_budget_reason(r),
                validation_status=str(r.get("validation_status") or ""),
                measured_tokens_per_s=num(r.get("measured_tokens_per_s")),
                measured_peak_bytes=num(r.get("measured_peak_memory_bytes")),
                chosen=bool(r.get("chosen")),
                baseline=bool(r.get("baseline")),
            )
        )
    return tuple(rows)


def pareto_front(rows: Sequence[TrialRow]) -> list[TrialRow]:
    """Feasible candidates no other feasible one beats on both memory (less) and throughput
    (more), by increasing memory."""
    feasible = [
        r
        for r in rows
        if r.feasible
        and r.in_space  # a baseline the search could not choose is on no frontier of it
        and r.predicted_peak_bytes is not None
        and r.predicted_tokens_per_s
    ]
    feasible.sort(key=lambda r: (r.predicted_peak_bytes, -(r.predicted_tokens_per_s or 0.0)))
    front, best = [], -1.0
    for r in feasible:
        if (r.predicted_tokens_per_s or 0.0) > best:
            front.append(r)
            best = r.predicted_tokens_per_s or 0.0
    return front


def pareto_chart(rows: Sequence[TrialRow], budget_bytes: float | None) -> Chart | None:
    priced = [r for r in rows if r.predicted_peak_bytes is not None and r.predicted_tokens_per_s]
    if not priced:
        return None
    top = max(r.predicted_peak_bytes or 0.0 for r in priced)
    unit, scale = ("GiB", GiB) if top >= GiB else ("MiB", MiB)

    def series(
        label: str, role: str, members: Sequence[TrialRow], measured: bool = False
    ) -> Series:
        points, hover = [], []
        for r in members:
            y = r.measured_tokens_per_s if measured else r.predicted_tokens_per_s
            if y is None:
                continue
            points.append((round((r.predicted_peak_bytes or 0.0) / scale, 4), round(y, 3)))
            what = "measured" if measured else "predicted"
            hover.append(f"{r.label}: {what} {fmt.rate(y)}, {fmt.size(r.predicted_peak_bytes)}")
        return Series(label=label, role=role, points=tuple(points), hover=tuple(hover))

    front = pareto_front(priced)
    groups = [
        series("Pareto frontier", "frontier", front),
        series("chosen", "chosen", [r for r in priced if r.chosen]),
        series("naive baseline", "baseline", [r for r in priced if r.baseline and not r.chosen]),
        series(
            "validated (predicted)",
            "validated",
            [r for r in priced if r.validation_status and not r.chosen and not r.baseline],
        ),
        series("measured", "measured", [r for r in priced if r.measured_tokens_per_s], True),
        series(
            "feasible",
            "feasible",
            [
                r
                for r in priced
                if r.feasible and not (r.chosen or r.baseline or r.validation_status)
            ],
        ),
        series("over the budget", "infeasible", [r for r in priced if not r.feasible]),
    ]
    caption = (
        "Every candidate the cost model could price: predicted peak memory per rank against "
        "predicted throughput at the same global batch. Measured points sit at the same "
        "memory as their prediction. Drag to zoom, double-click to reset."
    )
    if budget_bytes:
        if budget_bytes <= 5 * top:
            groups.append(
                Series(
                    label="budget",
                    role="budget",
                    kind="vline",
                    points=((round(budget_bytes / scale, 4), None),),
                    hover=(fmt.size(budget_bytes),),
                )
            )
        else:
            caption += f" The budget ({fmt.size(budget_bytes)}) is off the chart to the right."
    return Chart(
        id="pareto",
        title="Candidates: predicted memory vs throughput",
        kind="scatter",
        x_label=f"predicted peak memory per rank ({unit})",
        y_label="tokens/s",
        series=tuple(s for s in groups if s.points),
        caption=caption,
    )


def _fits_cell(r: TrialRow) -> Cell:
    if r.feasible:
        return cell("yes", cls="good")
    if r.predicted_peak_bytes is None:
        return cell("unknown", cls="muted", hint="the cost model could not price it")
    return cell("no", cls="bad")


def trials_table(rows: Sequence[TrialRow]) -> Table:
    out, classes = [], []
    order = sorted(
        rows,
        key=lambda r: (not r.chosen, not r.feasible, -(r.predicted_tokens_per_s or 0.0)),
    )
    for r in order:
        c = r.candidate
        status = r.validation_status.replace("_", " ")
        out.append(
            (
                num_cell(fmt.plain(r.trial), r.trial),
                cell(c.precision),
                cell(c.activation_checkpointing),
                cell(c.layout),
                num_cell(f"{c.micro_batch_size}×{c.grad_accum_steps}", float(c.micro_batch_size)),
                num_cell(fmt.plain(c.num_workers), float(c.num_workers)),
                num_cell(fmt.size(r.predicted_peak_bytes), r.predicted_peak_bytes),
                num_cell(fmt.rate(r.predicted_tokens_per_s), r.predicted_tokens_per_s),
                _fits_cell(r),
                cell(r.rejection_reason or "", cls="reason"),
                cell(status, cls="bad" if status not in ("", "ok") else ""),
                num_cell(fmt.rate(r.measured_tokens_per_s), r.measured_tokens_per_s),
            )
        )
        classes.append(r.role)
    return Table(
        id="trials",
        columns=(
            "trial",
            "precision",
            "checkpointing",
            "layout",
            "micro×accum",
            "workers",
            "pred. memory",
            "pred. tok/s",
            "fits",
            "rejection reason",
            "validation",
            "meas. tok/s",
        ),
        rows=tuple(out),
        row_classes=tuple(classes),
        sortable=True,
        caption="Click a column to sort. The chosen config is highlighted.",
    )


OUTSIDE_SPACE = (
    "not a candidate of this search (outside its space): shown as the reference the "
    "speed-ups are taken against"
)


def baseline_row(plan: Mapping[str, Any] | None, rows: Sequence[TrialRow]) -> TrialRow | None:
    """The plan's naive fp32 baseline as a row, when no trial is it: a search whose space
    leaves it out (--world-size 8 of a what-if, --only ...) still takes its speed-ups against
    it, and the Memory section draws it (audit 42, D9: the table had no row of it)."""
    baseline = mapping(mapping(plan).get("baseline"))
    c, p = candidate(baseline.get("config")), prediction(baseline.get("predicted"))
    if c is None or p is None or any(same_candidate(r.candidate, c) for r in rows):
        return None
    measured = mapping(ok_measurement(baseline.get("measured")))
    return TrialRow(
        trial=None,
        candidate=c,
        predicted_peak_bytes=float(p.peak_memory_bytes),
        predicted_tokens_per_s=p.tokens_per_s,
        predicted_step_time_s=p.step_time_s,
        feasible=bool(p.fits),
        rejection_reason=OUTSIDE_SPACE,
        validation_status=str(mapping(baseline.get("measured")).get("status") or ""),
        measured_tokens_per_s=num(measured.get("tokens_per_s")),
        measured_peak_bytes=num(measured.get("peak_memory_bytes")),
        chosen=False,
        baseline=True,
        in_space=False,
    )


def candidates_section(
    trials: Sequence[Mapping[str, Any]], plan: Mapping[str, Any] | None
) -> tuple[Section, tuple[TrialRow, ...]]:
    """The section and its rows: every trial, then the baseline when it is no trial."""
    rows = trial_rows(trials, plan)
    if not rows:
        return (
            Section(
                id="candidates",
                title="Candidates",
                note="No search yet: run 'advisor recommend --profile RUN/profile.json "
                "--global-batch-size N --out RUN' (it writes trials.csv).",
            ),
            (),
        )
    budget = num(mapping(mapping(plan).get("predicted")).get("budget_bytes")) if plan else None
    # a search that chose nothing: its rows' own (trials.csv's budget_bytes)
    budget = budget or next((b for r in trials if (b := num(r.get("budget_bytes")))), None)
    outside = baseline_row(plan, rows)
    shown = (*rows, outside) if outside is not None else rows
    chart = pareto_chart(shown, budget)
    search = mapping(mapping(plan).get("search")) if plan else {}
    num_feasible = sum(r.feasible for r in rows)
    # the plan's; a search that chose nothing has its trials' own (each row's candidate)
    gbs = mapping(mapping(plan).get("config")).get("global_batch_size") if plan else None
    gbs = gbs or next((r.candidate.global_batch_size for r in rows), "?")
    lead = [
        f"{len(rows)} candidates at global batch {gbs}"
        f": {num_feasible} fit the budget" + (f" of {fmt.size(budget)}" if budget else "") + ", "
        f"{sum(r.predicted_peak_bytes is not None and not r.feasible for r in rows)} are over "
        f"it, {sum(r.predicted_peak_bytes is None for r in rows)} could not be predicted."
    ]
    if outside is not None:
        lead.append(
            f"The naive fp32 baseline ({outside.candidate.label()}) is not in the search's "
            "space; its row is added for reference, and counted in none of these numbers."
        )
    if search.get("mode"):
        how = SEARCH_MODES.get(str(search.get("mode")), str(search.get("mode")))
        lead.append(
            f"Search: {how}, a space of {search.get('space_size')}, in "
            f"{fmt.seconds(search.get('wall_s'))} (Optuna study {search.get('study_name', '')})."
        )
    return (
        Section(
            id="candidates",
            title="Candidates",
            lead=tuple(lead),
            charts=nonempty([chart]),
            tables=(trials_table(shown),),
        ),
        tuple(shown),
    )


# -- predicted vs measured ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidationRow:
    key: str
    label: str
    role: str  # chosen | baseline | validated | training
    status: str
    reason: str
    predicted_tokens_per_s: float | None
    measured_tokens_per_s: float | None
    predicted_step_time_s: float | None
    measured_step_time_s: float | None
    predicted_memory_bytes: float | None  # comparable with measured_memory_bytes
    measured_memory_bytes: float | None
    memory_kind: str
    predicted_tokens_per_s_interval: tuple[float, float] | None = None  # 90%
    host_others_share: float | None = None  # others' share of the host's CPU while measured

    @property
    def inside_interval(self) -> bool | None:
        """Whether the measured tokens/s fell inside the predicted 90% interval."""
        interval, measured = self.predicted_tokens_per_s_interval, self.measured_tokens_per_s
        if interval is None or measured is None:
            return None
        return interval[0] <= measured <= interval[1]

    @property
    def throughput_error(self) -> float | None:
        """predicted / measured − 1 of the throughput (+0.10: predicted 10% too fast; the
        opposite sign of strategies.plan.Validation.time_error, which compares step times)."""
        if self.predicted_tokens_per_s and self.measured_tokens_per_s:
            return self.predicted_tokens_per_s / self.measured_tokens_per_s - 1
        return None

    @property
    def memory_error(self) -> float | None:
        if self.predicted_memory_bytes and self.measured_memory_bytes:
            return self.predicted_memory_bytes / self.measured_memory_bytes - 1
        return None


def _validation_row(c: Candidate, p: Prediction, m: Mapping[str, Any], role: str) -> ValidationRow:
    ok = ok_measurement(m) is not None
    # Like for like (strategies.plan.Validation.memory_error): the traced peak against the
    # allocator's measured peak, overheads that the allocator does not see excluded from both.
    return ValidationRow(
        key=c.key,
        label=c.short_label(),
        role=role,
        status=str(m.get("status") or ""),
        reason=str(m.get("reason") or ""),
        predicted_tokens_per_s=p.tokens_per_s,
        measured_tokens_per_s=num(m.get("tokens_per_s")) if ok else None,
        predicted_step_time_s=p.step_time_s,
        measured_step_time_s=num(m.get("step_time_s")) if ok else None,
        predicted_memory_bytes=float(p.traced_bytes or p.peak_memory_bytes),
        measured_memory_bytes=num(m.get("peak_memory_bytes")) if ok else None,
        memory_kind=str(m.get("memory_kind") or ""),
        predicted_tokens_per_s_interval=p.tokens_per_s_interval,
        host_others_share=num(m.get("host_others_share")),
    )


def validation_rows(
    plan: Mapping[str, Any] | None, training: ValidationRow | None
) -> tuple[ValidationRow, ...]:
    """Each validated config, the baseline when measured, and the training run of the plan."""
    if not plan:
        return ()
    chosen = plan_candidate(plan)
    baseline = mapping(plan.get("baseline"))
    baseline_config = candidate(baseline.get("config"))
    rows, seen = [], set()
    for v in plan.get("validated") or ():
        v = mapping(v)
        c, p = candidate(v.get("candidate")), prediction(v.get("predicted"))
        if c is None or p is None:
            continue
        role = (
            "chosen"
            if same_candidate(c, chosen)
            else "baseline"
            if same_candidate(c, baseline_config)
            else "validated"
        )
        rows.append(_validation_row(c, p, mapping(v.get("measured")), role))
        seen.add(c.key)
    baseline_predicted = prediction(baseline.get("predicted"))
    if (
        baseline.get("measured")
        and baseline_config is not None
        and baseline_config.key not in seen
        and baseline_predicted is not None
    ):
        rows.append(
            _validation_row(
                baseline_config, baseline_predicted, mapping(baseline["measured"]), "baseline"
            )
        )
    if training:
        rows.append(training)
    order = {"chosen": 0, "training": 1, "baseline": 3}
    return tuple(sorted(rows, key=lambda r: order.get(r.role, 2)))


def _validation_chart(rows: Sequence[ValidationRow]) -> Chart:
    return Chart(
        id="validation-throughput",
        title="Throughput: predicted vs measured",
        kind="bar",
        x_label="config",
        y_label="tokens/s",
        categories=tuple(f"{r.label} ({r.role})" for r in rows),
        series=(
            Series(
                label="predicted",
                role="predicted",
                values=tuple(r.predicted_tokens_per_s for r in rows),
                hover=tuple(_predicted_rate(r) for r in rows),
            ),
            Series(
                label="measured",
                role="measured",
                values=tuple(r.measured_tokens_per_s for r in rows),
                hover=tuple(
                    f"{fmt.rate(r.measured_tokens_per_s)} "
                    f"({fmt.percent(r.throughput_error, True)} off)"
                    for r in rows
                ),
            ),
        ),
        y_min=0,
        zoom=False,
        caption="Validation: a few interleaved real steps per config, medians. Training: the "
        "median of the run's steps after warm-up.",
    )


def _predicted_rate(r: ValidationRow) -> str:
    return fmt.with_interval(fmt.rate, r.predicted_tokens_per_s, r.predicted_tokens_per_s_interval)


def _inside_cell(r: ValidationRow) -> Cell:
    inside = r.inside_interval
    if inside is None:
        return cell("")
    return cell("yes" if inside else "no", cls="" if inside else "bad")


def _measured_rate_cell(r: ValidationRow) -> Cell:
    """The measured tokens/s, marked when others took a busy share of the host meanwhile."""
    share = r.host_others_share
    if share is None or r.measured_tokens_per_s is None:
        return num_cell(fmt.rate(r.measured_tokens_per_s), r.measured_tokens_per_s)
    busy = share >= BUSY_HOST_SHARE
    return num_cell(
        fmt.rate(r.measured_tokens_per_s) + (" (busy host)" if busy else ""),
        r.measured_tokens_per_s,
        cls="bad" if busy else "",
        hint=f"other processes took {share:.0%} of the host's CPU time while it was measured",
    )


def _validation_table(rows: Sequence[ValidationRow]) -> Table:
    table_rows = []
    for r in rows:
        bad = r.status not in ("ok", "")
        table_rows.append(
            (
                cell(r.label, hint=r.key),
                cell(r.role),
                cell(
                    r.status.replace("_", " ") + (f": {r.reason}" if r.reason else ""),
                    cls="bad" if bad else "",
                ),
                num_cell(_predicted_rate(r), r.predicted_tokens_per_s, hint="90% interval"),
                _measured_rate_cell(r),
                _inside_cell(r),
                num_cell(fmt.percent(r.throughput_error, True), r.throughput_error),
                num_cell(fmt.seconds(r.predicted_step_time_s), r.predicted_step_time_s),
                num_cell(fmt.seconds(r.measured_step_time_s), r.measured_step_time_s),
                num_cell(fmt.size(r.predicted_memory_bytes), r.predicted_memory_bytes),
                num_cell(
                    fmt.size(r.measured_memory_bytes), r.measured_memory_bytes, hint=r.memory_kind
                ),
                num_cell(fmt.percent(r.memory_error, True), r.memory_error),
            )
        )
    kinds = sorted({r.memory_kind for r in rows if r.memory_kind})
    return Table(
        columns=(
            "config",
            "role",
            "status",
            "pred. tok/s (90%)",
            "meas. tok/s",
            "inside",
            "error",
            "pred. step",
            "meas. step",
            "pred. memory",
            "meas. memory",
            "error",
        ),
        rows=tuple(table_rows),
        row_classes=tuple(r.role for r in rows),
        caption="Memory compared like for like: "
        + "; ".join(kinds)
        + (". " if kinds else "")
        + "Predicted memory here is the traced peak, or for the training run what its "
        "measurement includes.",
    )


def validation_section(rows: Sequence[ValidationRow], plan: Mapping[str, Any] | None) -> Section:
    if not rows:
        if plan and plan.get("estimate"):
            note = "A what-if plan (--target) is never validated: its numbers are estimates."
        elif plan:
            note = "No config was validated (--validate-top 0, or none could run here)."
        else:
            note = "No plan yet: validation runs the best predicted configs for a few real steps."
        return Section(id="validation", title="Predicted vs measured", note=note)
    errors = [e for r in rows if (e := r.throughput_error) is not None]
    lead = []
    if errors:
        # Signed, as the table's error column: the range of absolute errors beside a sign
        # note read "38.3%" for the training row's -38.3% (audit 41, D14).
        low, high = min(errors), max(errors)
        span = (
            fmt.percent(low, signed=True)
            if low == high
            else f"{fmt.percent(low, signed=True)} to {fmt.percent(high, signed=True)}"
        )
        lead.append(
            f"Throughput prediction errors: {span} (positive: predicted faster than "
            "measured; negative: slower)."
        )
    inside = [r.inside_interval for r in rows if r.inside_interval is not None]
    if inside:
        lead.append(f"{sum(inside)} of {len(inside)} measured within the predicted 90% interval.")
    lead += _uncertainty_lead(prediction(mapping(plan).get("predicted")) if plan else None)
    return Section(
        id="validation",
        title="Predicted vs measured",
        lead=tuple(lead),
        charts=nonempty([_validation_chart(rows)]),
        tables=(_validation_table(rows),),
    )


def _uncertainty_lead(predicted: Prediction | None) -> list[str]:
    """What the chosen config's interval is made of (strategies.uncertainty)."""
    if predicted is None or predicted.uncertainty is None:
        return []
    u = predicted.uncertainty
    parts = ", ".join(f"{name} {sigma:.1%}" for name, sigma, _ in u.terms)
    return [
        f"The chosen config's interval is ×/÷ {u.factor():.2f} around the prediction: "
        f"relative error {u.sigma:.1%} from {parts} (standard deviations, in quadrature)."
    ]
