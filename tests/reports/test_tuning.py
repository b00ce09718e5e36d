"""The report's Tuning section: each trial's eval curve (pruned marked, the chosen one), the
chosen values against the plan's, the sensitivity, the Reproduce commands; a note without a
study."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from profilers.rundir import RunDir
from reports import build_view, write_report
from strategies.tuning import (
    EvalPoint,
    ParamRange,
    TrialRecord,
    TuningSummary,
    sensitivity,
    write_trials,
)


def _trial(
    number: int, lr: float, losses: list[float], state: str, reason: str = ""
) -> TrialRecord:
    return TrialRecord(
        number=number,
        state=state,
        params={"lr": lr, "wd": 0.1 * number},
        evals=tuple(
            EvalPoint(step=5 * (i + 1), tokens=5 * (i + 1) * 1024, eval_loss=v)
            for i, v in enumerate(losses)
        ),
        score=losses[-1] if state == "complete" else None,
        tokens=5 * len(losses) * 1024,
        reason=reason,
    )


TRIALS = [
    _trial(0, 1e-3, [4.0, 3.5, 3.2, 3.0], "complete"),
    _trial(1, 1e-2, [5.0], "pruned", "pruned at step 5 (eval loss 5.0000)"),
    _trial(2, 3e-3, [3.8, 3.3, 3.0, 2.8], "complete"),
    _trial(3, 1e-4, [4.5, 4.2], "pruned", "pruned at step 10 (eval loss 4.2000)"),
]


def _add_study(run: Path) -> TuningSummary:
    files = RunDir(run)
    plan = json.loads(files.plan.read_text())
    plan["config"].update(lr=3e-3, min_lr=3e-4, weight_decay=0.2)
    files.tuned_plan.write_text(json.dumps(plan))
    write_trials(files.tune.trials, TRIALS)
    summary = TuningSummary(
        study_name="advisor-tune-0123456789abcdef",
        storage=f"sqlite:///{files.study}",
        pruner="successive halving (reduction factor 3, first rung at step 5)",
        sampler="TPE",
        trials_asked=4,
        tokens_per_trial=20 * 1024,
        steps_per_trial=20,
        eval_every=5,
        ranges=(
            ParamRange(name="lr", key="lr", low=1e-4, high=1e-2, log=True),
            ParamRange(name="wd", key="weight_decay", low=0.0, high=0.3),
        ),
        plan=str(files.plan),
        tuned_plan=str(files.tuned_plan),
        base_values={"lr": 1e-3, "wd": 0.0},
        best_number=2,
        best_values=dict(TRIALS[2].params),
        best_score=2.8,
        base_score=3.0,
        counts={"complete": 2, "pruned": 2, "failed": 0},
        tokens_trained=sum(t.tokens for t in TRIALS),
        sensitivity=tuple(sensitivity(TRIALS, ["lr", "wd"])),
        command=("advisor", "tune", "--plan", str(files.plan), "--trials", "4"),
    )
    summary.save(files.tune.study)
    return summary


@pytest.fixture
def tuned_run(hand_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(hand_run, run)
    _add_study(run)
    return run


def test_each_trial_is_a_curve_pruned_ones_marked_the_winner_chosen(tuned_run: Path) -> None:
    view = build_view(tuned_run)
    assert view.tuning is not None
    chart = view.section("tuning").charts[0]
    by_label = {s.label: s for s in chart.series}
    assert set(by_label) == {"trial 0", "trial 1 (pruned)", "trial 2 (chosen)", "trial 3 (pruned)"}
    assert by_label["trial 2 (chosen)"].role == "chosen"
    assert by_label["trial 1 (pruned)"].role == by_label["trial 3 (pruned)"].role != ""
    assert [p for p in by_label["trial 3 (pruned)"].points] == [(5.0, 4.5), (10.0, 4.2)]
    assert chart.series[-1].label == "trial 2 (chosen)"  # drawn on top


def test_chosen_values_sensitivity_and_trials_table(tuned_run: Path) -> None:
    section = build_view(tuned_run).section("tuning")
    facts = {f.label: f.value for f in section.facts}
    assert facts["chosen"] == "trial 2: lr 0.003, wd 0.2"
    assert facts["its held-out loss"] == "2.8000"
    assert facts["the plan's own values"] == "3.0000"
    assert facts["trials"] == "4: 2 complete, 2 pruned, 0 failed"
    assert facts["study cost"] == f"{sum(t.tokens for t in TRIALS) / (20 * 1024):.2f}× one trial"
    params, trials = section.tables
    rows = {r[0].text: [c.text for c in r] for r in params.rows}
    assert rows["lr"][3:5] == ["0.001", "0.003"]
    # lr at step 5 (every trial reached it): 1e-4 → 4.5, 1e-3 → 4.0, 3e-3 → 3.8, 1e-2 → 5.0.
    assert rows["lr"][5] == f"{sensitivity(TRIALS, ['lr'])[0].rho:+.2f}"
    assert [r[1].text for r in trials.rows] == ["complete", "pruned", "complete", "pruned"]
    assert trials.row_classes == ("", "", "chosen", "")
    assert trials.rows[3][-1].text == "pruned at step 10 (eval loss 4.2000)"


def test_reproduce_has_the_tune_command_and_trains_the_tuned_plan(tuned_run: Path) -> None:
    view = build_view(tuned_run)
    files = RunDir(tuned_run)
    assert view.commands.tune == f"advisor tune --plan {files.plan} --trials 4"
    steps = view.commands.steps
    assert steps[2] == view.commands.tune
    assert steps[3].startswith(f"advisor train --plan {files.tuned_plan} ")
    assert "--lr 0.003" in view.commands.train_flags
    assert [s.name for s in view.stages] == ["profile", "recommend", "tune", "train"]


def test_the_page_has_the_section(tuned_run: Path) -> None:
    page = write_report(tuned_run).read_text()
    assert 'id="tuning"' in page and "tuning-curves" in page


def test_without_a_study_the_section_says_how_to_get_one(hand_run: Path) -> None:
    view = build_view(hand_run)
    section = view.section("tuning")
    assert section.empty and "advisor tune --plan" in section.note
    assert view.tuning is None and view.commands.tune == ""
    assert "tune" not in [s.name for s in view.stages]


def test_a_what_if_plan_is_not_sent_to_be_tuned_here(hand_run: Path, tmp_path: Path) -> None:
    """The note said 'advisor tune --plan RUN/plan.json' for an 8x H100 plan: that trains
    its config on this host."""
    run = tmp_path / "run"
    shutil.copytree(hand_run, run)
    plan_file = RunDir(run).plan
    plan = json.loads(plan_file.read_text())
    plan["estimate"] = True
    plan["label"] = "ESTIMATE for 8× NVIDIA H100 SXM5 80GB: memory from ..."
    plan_file.write_text(json.dumps(plan))
    note = build_view(run).section("tuning").note
    assert note.startswith("No hyper-parameter study in this run: the plan is a what-if")
    assert "tune it where it will train" in note


def test_the_curves_caption_says_pruned_trials_stop_early(tuned_run: Path) -> None:
    caption = build_view(tuned_run).section("tuning").charts[0].caption
    assert "Every trial trains the same tokens" not in caption
    assert "stops a trial early (its curve ends)" in caption


def test_a_study_that_kept_the_plans_values_says_so(tuned_run: Path) -> None:
    """The hint said the tuned plan was not in the directory, with plan.json beside it."""

    def optimizer_hint(run: Path) -> str:
        facts = build_view(run).section("summary").facts
        return next(f.hint for f in facts if f.label == "optimizer (tuned)")

    files = RunDir(tuned_run)
    files.tuned_plan.write_text(files.plan.read_text())
    assert optimizer_hint(tuned_run) == (
        "advisor tune's values, the same as the recommended plan's own"
    )
    files.plan.unlink()
    assert optimizer_hint(tuned_run) == (
        "advisor tune's values (the plan it tuned is not in this directory)"
    )


def test_a_damaged_study_is_a_note_not_a_crash(tuned_run: Path) -> None:
    RunDir(tuned_run).tune.study.write_text('{"study_name": "x"}')
    section = build_view(tuned_run).section("tuning")
    assert "could not be read as a study" in section.note


def test_an_unfinished_study_says_so_and_names_no_tuned_plan(
    hand_run: Path, tmp_path: Path
) -> None:
    """advisor tune rewrites study.json after every trial since 2026-12-07 (before, an OUT
    tuned earlier kept the earlier study's study.json beside this one's trials): a stopped
    study shows its best so far, not a 'chosen' trial and a tuned plan it never wrote."""
    run = tmp_path / "run"
    shutil.copytree(hand_run, run)
    summary = _add_study(run)
    RunDir(run).tuned_plan.unlink()
    stopped = TrialRecord(
        number=4,
        state="failed",
        params={"lr": 2e-3, "wd": 0.1},
        tokens=1024,
        reason="interrupted (Ctrl-C); re-run as trial 5",
        rerun_as=5,
    )
    waiting = TrialRecord(number=5, state="waiting", params={"lr": 2e-3, "wd": 0.1})
    write_trials(RunDir(run).tune.trials, [*TRIALS, stopped, waiting])
    import dataclasses

    dataclasses.replace(
        summary,
        tuned_plan="",
        finished=False,
        trials_asked=6,
        counts={"complete": 2, "pruned": 2, "failed": 0, "re-run": 1, "waiting": 1},
    ).save(RunDir(run).tune.study)
    section = build_view(run).section("tuning")
    facts = {f.label: f.value for f in section.facts}
    assert "chosen" not in facts
    assert facts["best so far"] == "trial 2: lr 0.003, wd 0.2"
    assert facts["trials"] == (
        "6: 2 complete, 2 pruned, 0 failed, 1 stopped and re-queued, 1 waiting (of 6 asked: "
        "not finished)"
    )
    assert "no tuned plan from it yet" in section.lead[0]
    assert "The tuned plan:" not in section.lead[0]
    params, trials = section.tables
    assert params.columns[4] == "best so far"
    assert trials.rows[4][-1].text == "interrupted (Ctrl-C); re-run as trial 5"
    labels = {s.label for s in section.charts[0].series}
    assert "trial 2 (best so far)" in labels
