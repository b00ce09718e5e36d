"""The view model of a report: everything the page shows, computed from the run files.

Compute, then render (as Optuna's ``_get_timeline_info`` / ``_get_timeline_plot``):
:func:`build_view` returns a :class:`ReportView` of plain records, :mod:`reports.render` turns it
into HTML, and tests assert on the records, not on markup or pixels.
"""

from __future__ import annotations

import dataclasses
import datetime
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reports.candidates import (
    TrialRow,
    ValidationRow,
    candidates_section,
    validation_rows,
    validation_section,
)
from reports.charts import Chart
from reports.comm import comm_section
from reports.common import mapping, trained_elsewhere, whatif_target
from reports.facts import facts_section
from reports.failures import StageFailure, stage_failures, with_failure_notes
from reports.fmt import model_label
from reports.memory import MemoryBar, memory_section
from reports.model import Section
from reports.reproduce import Commands, reproduce_section
from reports.runfiles import RunFiles, is_interruption, load_run
from reports.summary import Summary, build_summary, summary_section
from reports.training import (
    TrainingStats,
    training_section,
    training_stats,
    training_validation,
)
from reports.tuning import TuningView, tuning_section


@dataclass(frozen=True, kw_only=True, slots=True)
class Stage:
    name: str
    done: bool
    detail: str
    failed: bool = False  # run.json says this stage of ``advisor run`` failed
    interrupted: bool = False  # ... or that Ctrl-C / SIGTERM stopped it


@dataclass(frozen=True, kw_only=True)
class ReportView:
    title: str
    subtitle: str
    run_dir: str
    generated: str
    stages: tuple[Stage, ...]
    problems: tuple[str, ...]
    sections: tuple[Section, ...]
    summary: Summary | None
    memory_bars: tuple[MemoryBar, ...]
    trials: tuple[TrialRow, ...]
    validations: tuple[ValidationRow, ...]
    training: TrainingStats | None
    commands: Commands
    estimate_label: str = ""
    failures: tuple[StageFailure, ...] = ()  # failed stages of ``advisor run``, in run order
    tuning: TuningView | None = None  # advisor tune's study, when the run has one

    @property
    def charts(self) -> tuple[Chart, ...]:
        return tuple(c for s in self.sections for c in s.charts)

    def section(self, section_id: str) -> Section:
        return next(s for s in self.sections if s.id == section_id)

    def chart_data(self) -> dict[str, Any]:
        """What the page's script reads: every chart spec by id."""
        return {"charts": [c.to_dict() for c in self.charts]}


def _stages(run: RunFiles, stats: TrainingStats | None) -> tuple[Stage, ...]:
    plan = mapping(run.plan)
    search = mapping(plan.get("search"))
    # a what-if plan is trained on its target, not by this run
    training = "not started" if not whatif_target(run.plan) else "none (a what-if plan)"
    if stats is not None:
        training = (
            f"{stats.steps}" + (f"/{stats.total_steps}" if stats.total_steps else "") + " steps"
        )
        if stats.diverged_step is not None:
            training = f"diverged at step {stats.diverged_step} ({training})"
    failed = run.failed_stages
    stages: tuple[Stage, ...] = (
        Stage(
            name="profile",
            done=run.profile is not None,
            detail=f"{len(run.probes)} probes" if run.profile is not None else "missing",
        ),
        Stage(
            name="recommend",
            done=run.plan is not None,
            detail=f"{search.get('num_evaluated', len(run.trials))} candidates"
            if run.plan
            else "missing",
        ),
        Stage(name="train", done=stats is not None and stats.complete, detail=training),
    )
    if run.tuning is not None or "tune" in failed:
        trials = len(run.tune_trials)
        tune = Stage(name="tune", done=run.tuned_plan is not None, detail=f"{trials} trials")
        stages = (*stages[:2], tune, stages[2])
    out = []
    for s in stages:
        if s.name in failed:
            stopped = is_interruption(failed[s.name])
            what = failed[s.name] if stopped else "failed"
            s = dataclasses.replace(
                s,
                done=False,
                failed=not stopped,
                interrupted=stopped,
                detail=what + (f" after {s.detail}" if s.name == "train" and stats else ""),
            )
        out.append(s)
    return tuple(out)


def build_view(run: RunFiles | str | Path, *, now: datetime.datetime | None = None) -> ReportView:
    """The view model of the run in ``run`` (a RunFiles, or its directory)."""
    if not isinstance(run, RunFiles):
        run = load_run(run)
    profile, plan = run.profile, run.plan
    stats = training_stats(run)
    config = mapping(mapping(run.train_config).get("config"))
    # A what-if plan trained on this host: its measurements describe this host, not the plan's
    # target (the page compared a CPU's 1,001 tok/s with an H100's predicted 746k: +74428%).
    elsewhere = (
        str(mapping(run.train_config).get("device") or "this host")
        if stats is not None and trained_elsewhere(plan, run.train_config)
        else ""
    )
    training_row = None if elsewhere else training_validation(stats, plan, config)
    summary = build_summary(plan, stats, elsewhere)
    measured_peak = None
    # a run too short for a steady rate still measured its peak memory
    as_planned = None if elsewhere else training_validation(stats, plan, config, steady_only=False)
    if stats is not None and stats.peak_memory_bytes and as_planned is not None:
        what = "process RSS" if stats.memory_kind.startswith("cpu") else "tensor memory"
        measured_peak = (f"training peak ({what})", stats.peak_memory_bytes)
    memory, bars = memory_section(profile, plan, measured_peak)
    candidates, trials = candidates_section(run.trials, plan)
    validations = validation_rows(plan, training_row)
    reproduce, commands = reproduce_section(run)
    tuning, tuning_view = tuning_section(run)
    sections: tuple[Section, ...] = (
        summary_section(
            summary,
            plan,
            stats,
            profile is not None,
            mapping(mapping(run.tuned_plan).get("config")) or None,
            config or None,
            trials,
            plan_is_tuned=run.plan is not None and run.plan is run.tuned_plan,
        ),
        facts_section(profile, run.probes),
        memory,
        candidates,
        validation_section(validations, plan),
        comm_section(profile, run.probes),
        tuning,
        training_section(run, plan, stats),
        reproduce,
    )
    # Notes name the commands that fill a section; RUN stands for this run's directory.
    sections = tuple(
        dataclasses.replace(s, note=s.note.replace("RUN", shlex.quote(str(run.root))))
        for s in sections
    )
    failures = stage_failures(run)
    sections = with_failure_notes(sections, failures)  # after RUN: the notes hold real paths
    workload = (
        mapping(mapping(profile).get("workload")) or config or mapping(mapping(plan).get("config"))
    )
    model = model_label(
        workload.get("model"),
        mapping(workload.get("model_args")),
        mapping(mapping(profile).get("model")).get("num_params"),
    )
    device = mapping(mapping(profile).get("device")).get("name") or mapping(run.train_config).get(
        "device"
    )
    moment = now or datetime.datetime.now(datetime.timezone.utc)
    title = f"{model}" + (f" on {device}" if device else "")
    if target := whatif_target(plan):
        # A what-if plan is for other hardware: the profiled host is where it was measured,
        # not what it plans (the title read "on AMD EPYC" above an 8× H100 plan).
        title = f"{model}: what-if for {target}" + (f" (profiled on {device})" if device else "")
    return ReportView(
        title=title,
        subtitle="transformer-advisor report",
        run_dir=str(run.root),
        generated=moment.strftime("%Y-%m-%d %H:%M UTC"),
        stages=_stages(run, stats),
        problems=run.problems,
        sections=sections,
        summary=summary,
        memory_bars=bars,
        trials=trials,
        validations=validations,
        training=stats,
        commands=commands,
        estimate_label=summary.estimate_label if summary else "",
        failures=failures,
        tuning=tuning_view,
    )


def notes(view: ReportView) -> Mapping[str, str]:
    """Section id → its note (what is missing), for sections that have one."""
    return {s.id: s.note for s in view.sections if s.note}
