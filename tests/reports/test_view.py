"""The view model of full and partial runs (compute): what each section says and draws."""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
from pathlib import Path

import pytest

from reports import ReportError, build_view, load_run
from reports.candidates import ValidationRow, pareto_front
from reports.memory import CATEGORIES
from reports.view import notes
from strategies.config import TrainConfig
from strategies.uncertainty import PROFILE_TO_RUN_DRIFT_SHARED
from tests.reports.runs import make_hand_run


def test_summary_states_the_plan_and_its_speedups(hand_run: Path) -> None:
    plan = json.loads((hand_run / "plan.json").read_text())
    view = build_view(hand_run)
    summary = view.summary
    assert summary is not None
    assert summary.config == plan["config"]
    assert summary.expected_speedup == pytest.approx(plan["baseline"]["expected_speedup"])
    assert summary.measured_speedup == pytest.approx(plan["baseline"]["measured_speedup"])
    assert summary.measured_tokens_per_s == pytest.approx(plan["measured"]["tokens_per_s"])
    # The plan's own sentences, the winner's first; search notes go to the details.
    assert summary.reasons[0].startswith("chosen: ")
    assert set(summary.reasons) | set(summary.notes) == set(plan["reasons"])
    assert summary.headline[0].startswith(f"Use {plan['config']['precision']}")
    assert "the naive fp32 loop" in summary.headline[1]
    # The validation row says how many steps, over how many separate runs, it pools.
    measured = plan["measured"]
    runs = f" over {measured['visits']} runs" if measured["visits"] > 1 else ""
    label = f"measured (validation, {len(measured['step_samples_s'])} steps{runs})"
    assert label in [row[0].text for row in view.section("summary").tables[0].rows]
    # The training run's steady throughput, over the baseline's measured one.
    baseline_tps = plan["baseline"]["measured"]["tokens_per_s"]
    assert summary.training_speedup == pytest.approx(summary.training_tokens_per_s / baseline_tps)


def test_memory_bars_add_up_to_the_predicted_peak(hand_run: Path) -> None:
    plan = json.loads((hand_run / "plan.json").read_text())
    view = build_view(hand_run)
    bars = view.memory_bars
    assert [b.role for b in bars[:2]] == ["chosen", "baseline"]
    assert bars[0].total_bytes == plan["predicted"]["peak_memory_bytes"]
    for bar in bars:
        assert tuple(bar.parts) == CATEGORIES
        assert sum(bar.parts.values()) == bar.total_bytes
        assert min(bar.parts.values()) >= 0
        # Whole-model checkpointing was traced; a selective setting (blocks:K, priced on the
        # line between traced settings) has no trace of its own to split by.
        assert bar.split == (
            "estimated" if "blocks:" in bar.key or "/ops/" in bar.key else "traced"
        )
        memory = bar.parts
        # The profile's fixed overhead (300 MiB) is what tracing cannot see.
        assert memory["overhead"] == 300 * 2**20
    chart = view.section("memory").charts[0]
    assert chart.stacked and chart.categories[0].endswith("(chosen)")
    assert [s.label for s in chart.series[: len(CATEGORIES)]] == list(CATEGORIES)
    # The 14.4 GiB budget is ~40x the bars: named in the caption, not drawn.
    assert all(s.role != "budget" for s in chart.series)
    assert "off the chart" in chart.caption
    # The training run's RSS peak is marked on the chosen bar.
    marker = next(s for s in chart.series if s.role == "measured")
    assert marker.values[0] is not None and set(marker.values[1:]) == {None}


def test_memory_budget_line_when_it_is_near_the_bars(tmp_path: Path) -> None:
    from reports.memory import memory_bars, memory_chart

    run = load_run(make_hand_run(tmp_path / "run", steps=None))
    bars = memory_bars(run.profile, run.plan)
    near = [dataclasses.replace(b, budget_bytes=2 * b.total_bytes) for b in bars]
    chart = memory_chart(near, None)
    assert chart is not None
    budget = next(s for s in chart.series if s.role == "budget")
    assert budget.kind == "line" and len(set(budget.values)) == 1


def test_every_trial_is_a_row_and_the_frontier_is_not_dominated(hand_run: Path) -> None:
    trials = (hand_run / "trials.csv").read_text().splitlines()
    view = build_view(hand_run)
    assert len(view.trials) == len(trials) - 1
    assert sum(r.chosen for r in view.trials) == 1
    assert sum(r.baseline for r in view.trials) == 1
    table = view.section("candidates").tables[0]
    assert table.sortable and len(table.rows) == len(view.trials)
    assert table.row_classes[0] == "chosen"
    front = pareto_front(view.trials)
    for r in view.trials:
        if not r.feasible or r.predicted_peak_bytes is None:
            continue
        for f in front:
            assert not (
                f.predicted_peak_bytes is not None
                and r.predicted_peak_bytes < f.predicted_peak_bytes
                and (r.predicted_tokens_per_s or 0) > (f.predicted_tokens_per_s or 0)
            ), f"{r.key} dominates frontier point {f.key}"
    chart = view.section("candidates").charts[0]
    roles = {s.role for s in chart.series}
    assert {"frontier", "chosen", "measured", "feasible"} <= roles
    chosen = next(s for s in chart.series if s.role == "chosen")
    assert len(chosen.points) == 1 and "micro-batch" in chosen.hover[0]


def test_rejected_candidates_keep_their_reason(tmp_path: Path) -> None:
    from tests.strategies.profiles import GiB

    root = tmp_path / "run"
    make_hand_run(root, steps=None)
    # A tiny budget: re-decide with the same profile at 1% of memory (a new study).
    from advisor.recommending import recommend
    from strategies.space import SearchRequest
    from tests.reports.runs import FakeValidator

    recommend(
        root / "profile.json",
        SearchRequest(global_batch_size=8, memory_budget=0.0205),
        validate_top_k=1,
        out=root,
        validators=[FakeValidator()],
    )
    view = build_view(root)
    over = [r for r in view.trials if not r.feasible and r.predicted_peak_bytes is not None]
    assert over, "some candidates should be over a 0.34 GiB budget"
    assert all(r.rejection_reason for r in over)
    assert view.memory_bars[0].budget_bytes == pytest.approx(0.0205 * 16 * GiB, rel=1e-6)


def test_validation_rows_compare_like_for_like(hand_run: Path) -> None:
    view = build_view(hand_run)
    rows = view.validations
    assert rows[0].role == "chosen" and rows[1].role == "training"
    validated = [r for r in rows if r.role != "training"]
    for r in validated:  # the fake validator: 90% of predicted throughput, 102% of traced memory
        assert r.throughput_error == pytest.approx(1 / 0.9 - 1)
        assert r.memory_error == pytest.approx(1 / 1.02 - 1, abs=1e-6)
    training = rows[1]
    assert training.measured_tokens_per_s == view.training.median_tokens_per_s  # type: ignore[union-attr]
    chart = view.section("validation").charts[0]
    assert [s.label for s in chart.series] == ["predicted", "measured"]
    assert len(chart.categories) == len(rows)


def test_validation_shows_each_prediction_interval_and_whether_it_held(hand_run: Path) -> None:
    plan = json.loads((hand_run / "plan.json").read_text())
    view = build_view(hand_run)
    validated = [r for r in view.validations if r.role != "training"]
    assert all(r.predicted_tokens_per_s_interval is not None for r in validated)
    # The fake validator measures 90% of the predicted throughput; the hand profile's interval
    # (the host's parts only: its fits have no residual freedom) is ×/÷ 1.28 (5.5% visit to
    # visit, 14% drift since the profile), so every one held.
    assert [r.inside_interval for r in validated] == [True] * len(validated)
    section = view.section("validation")
    assert f"{len(validated)} of {len(validated)} measured within the predicted 90% interval." in (
        section.lead
    )
    factor = plan["predicted"]["uncertainty"]["relative_sd"]
    assert any(
        f"relative error {factor:.1%} from host 5.5%, drift {PROFILE_TO_RUN_DRIFT_SHARED:.1%}"
        in line
        for line in section.lead
    )
    assert "inside" in section.tables[0].columns
    low, high = plan["predicted"]["tokens_per_s_interval"]
    assert low < plan["predicted"]["tokens_per_s"] < high


def test_a_measurement_outside_its_interval_is_marked_so() -> None:
    def row(measured: float | None, interval: tuple[float, float] | None) -> ValidationRow:
        return ValidationRow(
            key="k", label="l", role="validated", status="ok", reason="",
            predicted_tokens_per_s=1000.0, measured_tokens_per_s=measured,
            predicted_step_time_s=1.0, measured_step_time_s=1.0,
            predicted_memory_bytes=1.0, measured_memory_bytes=1.0, memory_kind="",
            predicted_tokens_per_s_interval=interval,
        )  # fmt: skip

    assert row(900.0, (917.0, 1090.0)).inside_interval is False
    assert row(1100.0, (917.0, 1090.0)).inside_interval is False
    assert row(917.0, (917.0, 1090.0)).inside_interval is True
    assert row(900.0, None).inside_interval is None
    assert row(None, (917.0, 1090.0)).inside_interval is None


def test_training_stats_and_curves(hand_run: Path) -> None:
    view = build_view(hand_run)
    stats = view.training
    assert stats is not None
    assert (stats.steps, stats.total_steps, stats.complete) == (40, 40, True)
    # The first step (500 tok/s: warm-up) is left out of the median.
    assert stats.median_tokens_per_s == statistics.median(1000.0 + (s % 3) for s in range(5, 41))
    assert stats.last_eval_loss == pytest.approx(3.0 - 40 / 100)
    assert stats.num_checkpoints == 1
    charts = {c.id: c for c in view.section("training").charts}
    assert set(charts) == {"train-loss", "train-throughput", "train-memory", "train-lr"}
    loss = charts["train-loss"]
    assert [len(s.points) for s in loss.series] == [40, 4]
    assert any(s.role == "predicted" for s in charts["train-throughput"].series)
    # No datasheet peak and no measured GEMM rate in the hand profile: MFU is explained.
    assert any("MFU" in b for b in view.section("training").bullets)


def test_communication_groups_samples_per_collective(hand_run: Path) -> None:
    view = build_view(hand_run)
    section = view.section("communication")
    chart = section.charts[0]
    assert chart.x_log
    assert [s.label for s in chart.series] == ["all_gather ×2 (gloo)", "all_reduce ×2 (gloo)"]
    reduce = chart.series[1]
    # busbw of all_reduce on 2 ranks = algbw × 2(n-1)/n = algbw.
    size, busbw = reduce.points[-1]
    assert busbw == pytest.approx(size / (1e-4 + size / 2e9) / 1e9, rel=1e-4)
    assert len(section.tables[0].rows) == 3  # the α-β fits


def test_reproduce_commands(hand_run: Path) -> None:
    view = build_view(hand_run)
    c = view.commands
    assert (
        c.steps[2] == f"advisor train --plan {hand_run}/plan.json --steps 40 --out {hand_run}/train"
    )
    assert c.torchrun[0].startswith("torchrun --standalone --nproc-per-node=1 -m advisor train")
    config = view.summary.config  # type: ignore[union-attr]
    assert f"--micro-batch-size {config['micro_batch_size']}" in c.train_flags
    assert f"--precision {config['precision']}" in c.train_flags
    versions = view.section("reproduce").tables[0]
    assert ("torch", "2.13.0+cpu") in [(r[0].text, r[1].text) for r in versions.rows]


def test_reproduce_recommend_keeps_the_searchs_only(tmp_path: Path, hand_run: Path) -> None:
    # A plan searched under --only is reproduced under the same restriction, not a wider one.
    run = tmp_path / "run"
    shutil.copytree(hand_run, run)
    plan = json.loads((run / "plan.json").read_text())
    assert "--only" not in build_view(run).commands.steps[1]
    plan["profile"]["request"]["only"] = {"activation_checkpointing": ["none", "full"]}
    (run / "plan.json").write_text(json.dumps(plan))
    assert build_view(run).commands.steps[1].endswith(f"--only checkpointing=none,full --out {run}")


def test_reproduce_keeps_what_the_run_asked_and_how_it_trained(
    tmp_path: Path, hand_run: Path
) -> None:
    """A new user's audit: the step-by-step profile dropped --checkpointing ops-half (so it
    was not measured again), recommend its validation flags, train its eval/checkpoint
    cadence; a run tuned by hand re-ran whole without tuning; the summary showed the untuned
    optimizer and the training note the untuned plan."""
    run = tmp_path / "run"
    shutil.copytree(hand_run, run)
    request = {
        "checkpointing": ["none", "ops-half"],
        "precisions": ["fp32"],
        "comm": False,
        "validate_top": 1,
        "validate_rounds": 2,
    }
    (run / "run.json").write_text(json.dumps({"request": request, "stages": {}}))
    saved = json.loads((run / "train" / "train_config.json").read_text())
    saved["options"] = {"checkpoint_every": 7, "eval_every": 5, "eval_batches": 2}
    (run / "train" / "train_config.json").write_text(json.dumps(saved))
    steps = build_view(run).commands.steps
    assert steps[0].endswith(
        "--precision fp32 --checkpointing none --checkpointing ops-half --no-comm --out " + str(run)
    )
    assert "--validate-top 1 --validate-rounds 2" in steps[1]
    assert steps[2].endswith(
        f"--eval-every 5 --checkpoint-every 7 --eval-batches 2 --out {run}/train"
    )
    plan = json.loads((run / "plan.json").read_text())
    tuned = dict(plan, config={**plan["config"], "lr": 0.00125, "warmup_steps": 3})
    (run / "tuned_plan.json").write_text(json.dumps(tuned))
    trained = json.loads((run / "train" / "train_config.json").read_text())
    trained["config"] = tuned["config"]  # the training ran the tuned plan
    (run / "train" / "train_config.json").write_text(json.dumps(trained))
    (run / "tune").mkdir()
    (run / "tune" / "study.json").write_text(json.dumps({"trials_asked": 6}))
    (run / "run.json").unlink()  # directories made by the commands one by one
    view = build_view(run)
    assert "--tune-trials 6" in view.commands.run
    optimizer = next(f for f in view.section("summary").facts if f.label.startswith("optimizer"))
    assert optimizer.label == "optimizer (tuned)" and "lr 0.00125" in optimizer.value
    assert "the recommended plan's own: AdamW lr 0.001" in optimizer.hint


def test_a_ddp_run_trained_without_a_plan_is_reproduced_by_its_flags(tmp_path: Path) -> None:
    """No plan.json: the train step named one anyway, and no torchrun line was shown."""
    from tests.reports.runs import write_training

    config = TrainConfig(parallelism="ddp", world_size=2, global_batch_size=8, micro_batch_size=4)
    write_training(tmp_path / "train", config, 20, 20)
    c = build_view(tmp_path / "train").commands
    assert "--plan" not in c.steps[-1]
    assert "--parallelism ddp" in c.steps[-1] and "--world-size 2" in c.steps[-1]
    assert c.torchrun[0].startswith("torchrun --standalone --nproc-per-node=2 -m advisor train")
    reproduce = build_view(tmp_path / "train").section("reproduce")
    assert any(block.title.startswith("Through torchrun") for block in reproduce.code)


def test_profile_only_run_notes_what_is_missing(tmp_path: Path) -> None:
    root = make_hand_run(tmp_path / "run", plan=False)
    view = build_view(root)
    missing = notes(view)
    assert set(missing) == {"summary", "memory", "candidates", "validation", "tuning", "training"}
    assert "advisor recommend" in missing["summary"]
    assert view.section("facts").facts and not view.section("facts").note
    assert view.section("communication").charts  # the profile's own data still shows
    assert [s.done for s in view.stages] == [True, False, False]
    assert view.commands.steps[0].startswith("advisor profile --model gpt-tiny --data synthetic")


def test_plan_without_training(tmp_path: Path) -> None:
    root = make_hand_run(tmp_path / "run", steps=None)
    view = build_view(root)
    assert set(notes(view)) == {"tuning", "training"}
    assert f"advisor train --plan {root}/plan.json --out {root}/train" in notes(view)["training"]
    assert [r.role for r in view.validations] == ["chosen", "validated", "baseline"]


def test_unfinished_training(tmp_path: Path) -> None:
    root = make_hand_run(tmp_path / "run", steps=12, total_steps=100)
    view = build_view(root)
    assert view.training is not None and not view.training.complete
    assert view.stages[2].detail == "12/100 steps"


def test_training_dir_alone(tmp_path: Path, hand_run: Path) -> None:
    """``advisor report`` on an ``advisor train --out DIR``: the training section only."""
    shutil.copytree(hand_run / "train", tmp_path / "train-only")
    view = build_view(tmp_path / "train-only")
    assert view.training is not None and view.training.steps == 40
    assert "summary" in notes(view) and "training" not in notes(view)


def test_a_plan_of_an_earlier_profile_is_named_as_such(tmp_path: Path, hand_run: Path) -> None:
    """`advisor profile --out RUN` over a finished run replaces its profile: the page paired
    the new profile with the old plan without a word."""
    root = tmp_path / "run"
    shutil.copytree(hand_run, root)
    assert not build_view(root).problems  # the hand run's plan is of its own profile
    profile = json.loads((root / "profile.json").read_text())
    made_from = json.loads((root / "plan.json").read_text())["profile"]["created"]
    profile["created"] = "2030-01-01T00:00:00+00:00"
    (root / "profile.json").write_text(json.dumps(profile))
    (mismatch,) = build_view(root).problems
    assert mismatch.startswith(
        f"plan.json was made from a profile created {made_from}, not from the profile.json "
        "here (created 2030-01-01T00:00:00+00:00): re-run 'advisor recommend --profile"
    )


def test_damaged_files_are_problems_not_crashes(tmp_path: Path, hand_run: Path) -> None:
    root = tmp_path / "run"
    shutil.copytree(hand_run, root)
    (root / "plan.json").write_text("{not json")
    with open(root / "train" / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 41, "lo')  # cut by a kill
    view = build_view(root)
    assert any(p.startswith("plan.json could not be read") for p in view.problems)
    assert "metrics.jsonl: 1 unreadable line(s) skipped" in view.problems
    assert "summary" in notes(view)
    assert view.training is not None and view.training.steps == 40


def test_no_run_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="holds no run files"):
        load_run(tmp_path)
    with pytest.raises(ReportError, match="does not exist"):
        load_run(tmp_path / "missing")


def test_a_measurement_on_a_busy_host_is_marked_so() -> None:
    from reports.candidates import _measured_rate_cell

    def row(share: float | None) -> ValidationRow:
        return ValidationRow(
            key="k", label="l", role="validated", status="ok", reason="",
            predicted_tokens_per_s=1000.0, measured_tokens_per_s=900.0,
            predicted_step_time_s=1.0, measured_step_time_s=1.0,
            predicted_memory_bytes=1.0, measured_memory_bytes=1.0, memory_kind="",
            host_others_share=share,
        )  # fmt: skip

    busy = _measured_rate_cell(row(0.45))
    assert busy.text.endswith("(busy host)") and "bad" in busy.cls
    assert busy.hint == "other processes took 45% of the host's CPU time while it was measured"
    quiet = _measured_rate_cell(row(0.05))
    assert "busy" not in quiet.text and "bad" not in quiet.cls and "5%" in quiet.hint
    assert _measured_rate_cell(row(None)).hint == ""


def test_the_facts_say_how_much_of_the_host_others_took_while_profiling() -> None:
    from reports.facts import facts_section

    def facts(*shares: float | None) -> dict[str, str]:
        throughput = [{"host_others_share": s} if s is not None else {} for s in shares]
        section = facts_section({"device": {}, "throughput": throughput}, [])
        return {f.label: f.value for f in section.facts}

    label = "host taken by others while timing"
    assert label not in facts(None, None)  # profiles from before the meter
    assert facts(0.01, 0.03)[label] == "up to 3.0%"
    assert facts(0.02, 0.4)[label] == (
        "up to 40.0% — busy: the profile's step times read slow; re-profile when quiet"
    )


def test_a_plan_written_away_from_its_profile_is_reported_with_that_profile(
    hand_run: Path, tmp_path: Path
) -> None:
    # `advisor recommend --profile RUN --out RUN/h100`: the plan's directory has no profile;
    # the plan names the one it was made from (and its creation time).
    away = tmp_path / "h100"
    away.mkdir()
    for name in ("plan.json", "trials.csv"):
        shutil.copy(hand_run / name, away / name)
    run = load_run(away)
    assert run.profile is not None and run.profile["created"] == "2026-01-01T00:00:00+00:00"
    assert run.probes and run.probes[0]["probe"] == "device"
    assert build_view(away).section("memory").charts  # split by the profile's traces
    # A profile of the same path written since (another creation time) is not that profile.
    plan = json.loads((away / "plan.json").read_text())
    plan["profile"]["created"] = "2026-02-02T00:00:00+00:00"
    (away / "plan.json").write_text(json.dumps(plan))
    assert load_run(away).profile is None
