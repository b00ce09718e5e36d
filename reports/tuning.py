"""Tuning: the hyper-parameter study of ``advisor tune`` (OUT/tune/study.json, trials.jsonl).

Each trial's eval-loss curve (pruned ones marked), the chosen values against the plan's own,
the sensitivity of the loss to each parameter (strategies.tuning.Sensitivity: Spearman's rank
correlation, explained on the page), and every trial in a table.
"""

from __future__ import annotations

from dataclasses import dataclass

from profilers.rundir import RunDir
from reports.charts import Chart, Series, nonempty
from reports.common import whatif_target
from reports.model import Cell, Fact, Section, Table, cell, num_cell
from reports.runfiles import RunFiles
from strategies.tuning import TrialRecord, TuningSummary, counts_text

NO_STUDY = (
    "No hyper-parameter study in this run: 'advisor tune --plan RUN/plan.json' (or 'advisor "
    "run --tune-trials N') tunes the learning rate, warm-up and weight decay at the plan's config."
)
# A run with no plan.json: the note named RUN/plan.json all the same until 2026-12-07.
NO_STUDY_NO_PLAN = (
    "No hyper-parameter study in this run, and no plan to tune yet: 'advisor tune --plan "
    "PLAN' (or 'advisor run --tune-trials N') tunes the learning rate, warm-up and weight decay "
    "of a plan's config once there is one."
)

# A what-if plan (recommend --target): 'advisor tune' would train its config on this host.
NO_STUDY_WHATIF = (
    "No hyper-parameter study in this run: the plan is a what-if for other hardware, and "
    "'advisor tune' trains its config here; tune it where it will train ('advisor tune --plan "
    "RUN/plan.json' on the target)."
)


@dataclass(frozen=True, kw_only=True)
class TuningView:
    """What the section shows, as records (tests assert on these)."""

    summary: TuningSummary
    trials: tuple[TrialRecord, ...]
    best: TrialRecord | None
    chart: Chart


def _value(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _values(values: dict[str, object] | object) -> str:
    if not isinstance(values, dict):
        return ""
    return ", ".join(f"{k} {_value(v)}" for k, v in values.items())


def tuning_view(run: RunFiles) -> TuningView | None:
    """None when the run has no study (or its study.json cannot be read as one)."""
    if run.tuning is None:
        return None
    try:
        summary = TuningSummary.from_dict(run.tuning)
    except (KeyError, TypeError, ValueError):
        return None
    trials: list[TrialRecord] = []
    for data in run.tune_trials:
        try:
            trials.append(TrialRecord.from_dict(data))
        except (KeyError, TypeError, ValueError, AssertionError):
            continue
    best = next((t for t in trials if t.number == summary.best_number), None)
    return TuningView(
        summary=summary, trials=tuple(trials), best=best, chart=curves(summary, trials)
    )


def _counts(counts: dict[str, int] | object) -> str:
    return counts_text(counts) if isinstance(counts, dict) else ""


def _role(trial: TrialRecord, summary: TuningSummary) -> str:
    if trial.number == summary.best_number:
        return "chosen"
    if trial.state == "pruned":
        return "infeasible"  # the palette's muted grey: a curve the pruner stopped
    return ""


def curves(summary: TuningSummary, trials: list[TrialRecord]) -> Chart:
    """Eval loss against step, one line per trial; pruned trials grey, the winner red."""
    series = []
    for t in sorted(trials, key=lambda t: (t.number == summary.best_number, t.number)):
        if not t.evals:
            continue
        mark = {"pruned": " (pruned)", "failed": " (failed)"}.get(t.state, "")
        if t.rerun_as is not None:
            mark = f" (stopped, re-run as {t.rerun_as})"
        if t.number == summary.best_number:
            mark = " (chosen)" if summary.finished else " (best so far)"
        params = _values(dict(t.params))
        series.append(
            Series(
                label=f"trial {t.number}{mark}",
                role=_role(t, summary),
                points=tuple((float(e.step), e.eval_loss) for e in t.evals),
                hover=tuple(f"{e.eval_loss:.4f} at step {e.step}; {params}" for e in t.evals),
            )
        )
    return Chart(
        id="tuning-curves",
        title="Held-out loss of each trial",
        kind="line",
        x_label="step",
        y_label="eval loss",
        series=tuple(series),
        # "Every trial trains the same tokens" above curves the pruner had cut short said two
        # things at once (audit 41, D13): each is given the same tokens, a pruned one uses fewer.
        caption="Every trial is given the same tokens; the pruner stops a trial early (its "
        "curve ends) when its eval loss is not in the best third of those that reached the same "
        "evaluation.",
    )


def tuning_section(run: RunFiles) -> tuple[Section, TuningView | None]:
    view = tuning_view(run)
    if view is None:
        note = NO_STUDY if RunDir(run.root).plan.is_file() else NO_STUDY_NO_PLAN
        if whatif_target(run.plan):
            # tuning trains the plan's config on this host: no use for another's plan
            note = NO_STUDY_WHATIF
        if run.tuning is not None:
            note = "tune/study.json could not be read as a study: re-run 'advisor tune'."
        return Section(id="tuning", title="Tuning", note=note), None
    s, best = view.summary, view.best
    facts = [
        Fact(
            label="trials",
            value=f"{len(view.trials)}: {_counts(dict(s.counts))}"
            + ("" if s.finished else f" (of {s.trials_asked} asked: not finished)"),
            hint=f"pruner: {s.pruner}; sampler: {s.sampler}",
        ),
        Fact(
            label="each trial",
            value=f"{s.steps_per_trial} steps, {s.tokens_per_trial:,} tokens",
            hint=f"an eval every {s.eval_every} steps",
        ),
        Fact(
            label="study cost",
            value=f"{s.cost_runs:.2f}× one trial",
            hint=f"{s.tokens_trained:,} tokens trained by all trials together",
        ),
    ]
    if best is not None and best.score is not None:
        facts.append(
            Fact(
                label="chosen" if s.finished else "best so far",
                value=f"trial {best.number}: {_values(dict(best.params))}",
            )
        )
        facts.append(Fact(label="its held-out loss", value=f"{best.score:.4f}"))
    if s.base_score is not None:
        facts.append(
            Fact(
                label="the plan's own values",
                value=f"{s.base_score:.4f}",
                hint=_values(dict(s.base_values)),
            )
        )
    outcome = (
        f"The tuned plan: {s.tuned_plan}."
        if s.finished and s.tuned_plan
        else "The study has not finished (stopped, or still running): no tuned plan from it "
        "yet; the same 'advisor tune' command continues it."
    )
    lead = (
        f"An Optuna study over {', '.join(r.name for r in s.ranges)} at the plan's config "
        "(every speed key and the global batch unchanged), each trial a real training run "
        f"scored by its held-out loss after {s.tokens_per_trial:,} tokens. {outcome}",
    )
    ranges = Table(
        columns=(
            "parameter",
            "range",
            "scale",
            "plan",
            "chosen" if s.finished else "best so far",
            "sensitivity ρ",
        ),
        rows=tuple(
            (
                cell(r.name, hint=r.key),
                cell(f"{_value(r.low)} – {_value(r.high)}"),
                cell("log" if r.log else "linear"),
                cell(_value(s.base_values.get(r.name, ""))),
                cell(_value(s.best_values.get(r.name, "—")), cls="good"),
                _rho_cell(s, r.name),
            )
            for r in s.ranges
        ),
        caption="Sensitivity: Spearman's rank correlation between the parameter and the eval "
        "loss at the last evaluation every scored trial reached (pruned trials included): +1 "
        "the loss rises with it, −1 it falls, near 0 no monotone effect in this range. Few "
        "trials make it noisy.",
        id="tuning-params",
    )
    names = [r.name for r in s.ranges]
    rows = []
    classes = []
    for t in sorted(view.trials, key=lambda t: t.number):
        last = t.score if t.score is not None else t.last_loss
        rows.append(
            (
                num_cell(str(t.number), t.number),
                cell(t.state, cls={"complete": "good", "failed": "bad"}.get(t.state, "muted")),
                *(cell(_value(t.params.get(n, ""))) for n in names),
                num_cell(f"{last:.4f}" if last is not None else "—", last),
                num_cell(f"{t.tokens:,}", t.tokens),
                cell(t.reason),
            )
        )
        classes.append("chosen" if best is not None and t.number == best.number else "")
    trials = Table(
        columns=("trial", "state", *names, "eval loss (last)", "tokens", "why it stopped"),
        caption=""
        if not s.counts.get("re-run")
        else "A failed trial whose values were queued again (its worker was stopped, or it "
        "failed and stopped the study) names the trial that re-runs them; the counts leave it "
        "out of 'failed'.",
        rows=tuple(rows),
        row_classes=tuple(classes),
        sortable=True,
        id="tuning-trials",
    )
    section = Section(
        id="tuning",
        title="Tuning",
        lead=lead,
        facts=tuple(facts),
        charts=nonempty([view.chart]),
        tables=(ranges, trials),
        bullets=tuple(s.notes),
        data={"best_number": s.best_number},
    )
    return section, view


def _rho_cell(s: TuningSummary, name: str) -> Cell:
    found = next((x for x in s.sensitivity if x.name == name), None)
    if found is None or found.rho is None:
        trials = found.trials if found else 0
        return cell("—", hint=f"needs 3 scored trials with an eval curve ({trials} here)")
    return num_cell(
        f"{found.rho:+.2f}", found.rho, hint=f"{found.trials} trials, eval at step {found.step}"
    )
