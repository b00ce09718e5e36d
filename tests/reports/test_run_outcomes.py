"""What the page says of how a run went: interrupted, diverged or overridden stages, where its
files are, and that every chart draws every point (audit 41 of the report)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest

from reports import build_view
from reports.view import notes
from tests.reports.runs import make_hand_run


def _copy(hand_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(hand_run, run)
    return run


def _run_json(run: Path, stages: dict[str, dict[str, str]], **request: object) -> None:
    command = ["advisor", "run", "--out", str(run)]
    (run / "run.json").write_text(
        json.dumps({"command": command, "request": request, "stages": stages})
    )


# -- D2: Chart.js takes unparsed x/y data as sorted ---------------------------------------------


def test_every_xy_series_reaches_the_page_sorted_by_x(hand_run: Path, tmp_path: Path) -> None:
    """The page turns Chart.js's parsing off, which then reads an axis's range off the first
    and last points: the candidates chart, in trials.csv order, clipped 6 of 24 points."""
    run = _copy(hand_run, tmp_path)
    lines = (run / "trials.csv").read_text().splitlines(keepends=True)
    (run / "trials.csv").write_text(lines[0] + "".join(reversed(lines[1:])))
    data = build_view(run).chart_data()
    checked = 0
    for chart in data["charts"]:
        if chart["kind"] == "bar":
            continue
        for series in chart["series"]:
            xs = [p[0] for p in series["points"]]
            assert xs == sorted(xs), (chart["id"], series["label"])
            checked += len(xs) > 2
    assert checked  # the candidates chart has series of several points
    view = build_view(run)
    for chart, drawn in zip(view.charts, data["charts"], strict=True):
        for series, page in zip(chart.series, drawn["series"], strict=True):
            if len(series.hover) == len(series.points):  # each point keeps its own tooltip
                pairs = {(tuple(p), h) for p, h in zip(page["points"], page["hover"], strict=True)}
                assert pairs == set(zip(series.points, series.hover, strict=True))


# -- D5/D6/D7: Ctrl-C and SIGTERM stop a stage; they do not fail it -----------------------------


@pytest.mark.parametrize(
    ("record", "how"),
    [
        ({"status": "interrupted", "detail": "interrupted (SIGTERM)"}, "SIGTERM"),
        ({"status": "interrupted", "detail": "interrupted (Ctrl-C)"}, "Ctrl-C"),
        ({"status": "failed", "detail": "interrupted (Ctrl-C)"}, "Ctrl-C"),  # before 2026-12-07
    ],
)
def test_an_interrupted_training_is_shown_as_interrupted_not_failed(
    hand_run: Path, tmp_path: Path, record: dict[str, str], how: str
) -> None:
    run = _copy(hand_run, tmp_path)
    _run_json(run, {"train": record})
    os.utime(run / "train" / "metrics.jsonl", (1, 1))  # older than run.json: not redone since
    view = build_view(run)
    train = next(s for s in view.stages if s.name == "train")
    assert train.interrupted and not train.failed
    assert train.detail.startswith(f"interrupted ({how}) after 40/40 steps")
    note = notes(view)["training"]
    assert note.startswith(f"Training was interrupted ({how}). Continue this run")
    assert "failed" not in note and note.endswith("--resume")


def test_an_interrupted_tune_stage_says_so_and_how_to_continue(tmp_path: Path) -> None:
    """The page showed 'tune: failed' in its header and, in Tuning, how to start a study; in
    Training, how to train the untuned plan."""
    run = make_hand_run(tmp_path / "run", steps=None)
    _run_json(run, {"tune": {"status": "interrupted", "detail": "interrupted (Ctrl-C)"}})
    view = build_view(run)
    tune = next(s for s in view.stages if s.name == "tune")
    assert tune.interrupted and tune.detail == "interrupted (Ctrl-C)"
    missing = notes(view)
    assert missing["tuning"] == (
        "Tuning was interrupted (Ctrl-C). Continue this run; the stages that finished are "
        f"reused: advisor run --out {run} --resume"
    )
    assert missing["training"].startswith("Nothing to show: the tune stage of this run was ")
    assert "advisor train --plan" not in missing["training"]


def test_a_failed_tune_stage_gives_its_error_and_the_fix(tmp_path: Path) -> None:
    run = make_hand_run(tmp_path / "run", steps=None)
    _run_json(run, {"tune": {"status": "failed", "detail": "tuning failed: no eval batches"}})
    view = build_view(run)
    assert next(s for s in view.stages if s.name == "tune").failed
    assert notes(view)["tuning"].startswith("Tuning failed: no eval batches. Fix what")


def test_advisor_run_records_a_sigterm_as_an_interruption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.json said {'status': 'failed', 'detail': 'interrupted (Ctrl-C)'} for a SIGTERM."""
    import advisor.run
    from advisor.run import RunRequest, Terminated

    def stopped(*args: object, **kwargs: object) -> None:
        raise Terminated

    monkeypatch.setattr(advisor.run, "_profile_stage", stopped)
    out = tmp_path / "run"
    with pytest.raises(Terminated):
        advisor.run.run(RunRequest(), out)
    stages = json.loads((out / "run.json").read_text())["stages"]
    assert stages["profile"]["status"] == "interrupted"
    assert stages["profile"]["detail"] == "interrupted (SIGTERM)"
    page = (out / "report.html").read_text()
    assert "Profiling was interrupted (SIGTERM). Continue this run" in page


# -- D3: what trained, when the training overrode the plan ---------------------------------------


def test_settings_given_on_top_of_the_plan_are_what_the_page_shows(
    hand_run: Path, tmp_path: Path
) -> None:
    """advisor train --plan P --lr 1e30: Summary and Reproduce showed the plan's lr 0.001."""
    run = _copy(hand_run, tmp_path)
    saved = json.loads((run / "train" / "train_config.json").read_text())
    saved["config"] = {**saved["config"], "lr": 0.05, "warmup_steps": 0}
    (run / "train" / "train_config.json").write_text(json.dumps(saved))
    view = build_view(run)
    summary = view.section("summary")
    optimizer = next(f for f in summary.facts if f.label.startswith("optimizer"))
    assert optimizer.label == "optimizer (as trained)"
    assert "lr 0.05" in optimizer.value and "warm-up 0" in optimizer.value
    assert "lr 0.001" in optimizer.hint
    assert any("lr 0.05 (the plan's 0.001); warmup_steps 0 (the plan's" in s for s in summary.lead)
    assert any("lr 0.05 (the plan's 0.001)" in s for s in view.section("training").lead)
    train_step = view.commands.steps[-1]
    assert train_step.startswith(f"advisor train --plan {run}/plan.json --lr 0.05 --warmup-steps 0")
    assert "--lr 0.05" in view.commands.trained_flags
    assert "--lr 0.001" in view.commands.train_flags  # the recommended config, as titled
    titles = [b.title for b in view.section("reproduce").code]
    assert any(t.startswith("Train what this run trained") for t in titles)


def test_a_run_trained_as_planned_flags_nothing(hand_run: Path) -> None:
    view = build_view(hand_run)
    assert not view.commands.trained_flags
    assert next(f for f in view.section("summary").facts if f.label == "optimizer")


# -- D4: a diverged training ---------------------------------------------------------------------


def _diverge(run: Path, step: int) -> None:
    line = {"kind": "train", "step": step, "loss": math.nan, "tokens": step * 8 * 64}
    with open(run / "train" / "metrics.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def test_a_diverged_run_says_where_its_loss_became_nan(tmp_path: Path) -> None:
    """It said 'steps 1 of 40, incomplete: resume it' and nothing of the NaN."""
    run = make_hand_run(tmp_path / "run", steps=12, total_steps=40)
    _diverge(run, 13)
    view = build_view(run)
    assert view.training is not None and view.training.diverged_step == 13
    assert view.stages[-1].detail == "diverged at step 13 (12/40 steps)"
    training = view.section("training")
    steps = next(f for f in training.facts if f.label == "steps")
    assert steps.value == "12 of 40"
    assert steps.hint == "diverged: the loss became NaN or inf at step 13"
    assert training.lead[0].startswith(
        "Training diverged: the loss became NaN or inf at step 13 of 40, and the trainer stopped"
    )
    assert any("loss became NaN or inf at step 13" in s for s in view.section("summary").lead)
    assert not any(s.startswith("Training ran") for s in view.section("summary").lead)


def test_a_run_that_diverged_at_its_first_step_is_no_empty_training(tmp_path: Path) -> None:
    run = make_hand_run(tmp_path / "run", steps=1, total_steps=40)
    (run / "train" / "metrics.jsonl").write_text("")
    _diverge(run, 1)
    view = build_view(run)
    assert view.training is not None and view.training.diverged_step == 1
    assert "training" not in notes(view)


def test_the_trainer_logs_the_step_whose_loss_became_nan(tmp_path: Path) -> None:
    from advisor.errors import TrainingDiverged
    from advisor.trainer.loop import train
    from advisor.trainer.options import RunOptions
    from reports.runfiles import load_run
    from reports.training import training_stats
    from strategies.config import TrainConfig

    factory = Path(__file__).parent.parent / "data" / "nan_model.py"
    config = TrainConfig(
        model=f"{factory}:factory",
        model_args={"calls": 3},
        data="synthetic",
        seq_len=16,
        global_batch_size=2,
        micro_batch_size=2,
    )
    with pytest.raises(TrainingDiverged, match="loss became nan at step 4"):
        train(config, RunOptions(out=tmp_path, steps=10, progress=False, eval_every=0))
    last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["kind"] == "train" and last["step"] == 4 and math.isnan(last["loss"])
    stats = training_stats(load_run(tmp_path))
    assert stats is not None and (stats.steps, stats.diverged_step) == (3, 4)


# -- D11/D12: commands and notes that point at files that exist ----------------------------------


def test_a_profile_only_run_trains_the_plan_its_recommend_step_writes(tmp_path: Path) -> None:
    run = make_hand_run(tmp_path / "run", plan=False)
    _run_json(run, {}, memory_budget=0.0001)  # a recommend that failed on its budget
    view = build_view(run)
    steps = view.commands.steps
    assert "--memory-budget 0.0001" in steps[1]
    assert steps[-1].startswith(f"advisor train --plan {run}/plan.json ")
    assert "plan.json" not in notes(view)["tuning"]  # there is none to tune


def test_a_study_made_elsewhere_is_reproduced_from_the_files_it_used(
    hand_run: Path, tmp_path: Path
) -> None:
    """advisor tune --plan A/plan.json --out B: the steps said 'recommend --profile
    B/profile.json', a file that does not exist."""
    tuned = tmp_path / "tuned"
    (tuned / "tune").mkdir(parents=True)
    plan = json.loads((hand_run / "plan.json").read_text())
    (tuned / "tuned_plan.json").write_text(json.dumps(plan))
    command = ["advisor", "tune", "--plan", str(hand_run / "plan.json"), "--out", str(tuned)]
    study = {"plan": str(hand_run / "plan.json"), "command": command}
    (tuned / "tune" / "study.json").write_text(json.dumps(study))
    steps = build_view(tuned).commands.steps
    assert steps[0].endswith(f"--out {hand_run}")
    assert f"advisor recommend --profile {hand_run}/profile.json " in steps[1]
    assert steps[1].endswith(f"--out {hand_run}")


def test_a_training_run_alone_is_reproduced_by_its_own_command(
    hand_run: Path, tmp_path: Path
) -> None:
    shutil.copytree(hand_run / "train", tmp_path / "train-only")
    view = build_view(tmp_path / "train-only")
    assert view.commands.steps == (view.commands.train_flags,)
    assert view.commands.steps[0].startswith("advisor train --model gpt-tiny")
    titles = [b.title for b in view.section("reproduce").code]
    assert not any("recommended" in t for t in titles)
    assert "workload flags" in view.section("facts").note
    assert "no profile in this run" in " ".join(view.section("training").bullets)


# -- D8/D10/D14/D16 ------------------------------------------------------------------------------


def test_a_recommendation_slower_than_the_baseline_says_why(hand_run: Path, tmp_path: Path) -> None:
    run = _copy(hand_run, tmp_path)
    plan = json.loads((run / "plan.json").read_text())
    plan["baseline"]["measured_speedup"] = 0.24
    plan["profile"]["request"]["only"] = {"micro_batch_size": [4, 8]}
    (run / "plan.json").write_text(json.dumps(plan))
    lead = build_view(run).section("summary").lead
    assert any(
        "measured faster, but --only micro-batch-size=4,8 left it out of the search" in s
        for s in lead
    )


def test_the_naive_loop_chosen_claims_no_speed_up_in_training(
    hand_run: Path, tmp_path: Path
) -> None:
    run = _copy(hand_run, tmp_path)
    plan = json.loads((run / "plan.json").read_text())
    plan["baseline"]["config"] = plan["config"]
    (run / "plan.json").write_text(json.dumps(plan))
    view = build_view(run)
    assert view.summary is not None and view.summary.training_speedup is None
    speedup = view.section("summary").facts[0]
    assert "in training" not in speedup.value


def test_prediction_errors_are_given_with_their_sign(hand_run: Path, tmp_path: Path) -> None:
    """It gave the range of absolute errors: a -38.3% read as "off by 38.3%"."""
    run = _copy(hand_run, tmp_path)
    plan = json.loads((run / "plan.json").read_text())
    first = plan["validated"][0]
    first["measured"]["tokens_per_s"] = first["predicted"]["tokens_per_s"] * 2  # faster
    (run / "plan.json").write_text(json.dumps(plan))
    view = build_view(run)
    errors = [r.throughput_error for r in view.validations if r.throughput_error is not None]
    low, high = min(errors), max(errors)
    assert low < 0 < high
    assert (
        view.section("validation")
        .lead[0]
        .startswith(f"Throughput prediction errors: -{abs(low):.1%} to +{high:.1%}")
    )


def test_a_run_without_an_evaluation_draws_no_empty_eval_series(tmp_path: Path) -> None:
    run = make_hand_run(tmp_path / "run", steps=5, total_steps=40)
    loss = next(c for c in build_view(run).charts if c.id == "train-loss")
    assert [s.label for s in loss.series] == ["train"]
