"""strategies.tuning: ranges and their parsing, the tuned config, records, sensitivity."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from strategies.config import HYPERPARAMETER_KEYS, ConfigError, TrainConfig
from strategies.tuning import (
    EvalPoint,
    ParamRange,
    Sensitivity,
    TrialRecord,
    TuningSummary,
    best_trial,
    default_ranges,
    eval_every,
    first_rung,
    longest_warmup,
    parse_params,
    read_trials,
    sensitivity,
    spearman,
    speed_changes,
    study_name,
    trial_steps,
    tuned_config,
    write_trials,
)

PLAN = TrainConfig(
    model="gpt-tiny",
    seq_len=64,
    global_batch_size=16,
    micro_batch_size=4,
    grad_accum_steps=2,
    parallelism="ddp",
    world_size=2,
    precision="bf16",
    lr=2e-3,
    min_lr=2e-4,
    warmup_steps=10,
    weight_decay=0.1,
)


def test_default_ranges_are_around_the_plan() -> None:
    ranges = {r.name: r for r in parse_params(None, default_ranges(PLAN, 100))}
    assert list(ranges) == ["lr", "warmup", "wd"]
    assert ranges["lr"].low == pytest.approx(2e-4) and ranges["lr"].high == pytest.approx(2e-2)
    assert ranges["lr"].log and not ranges["wd"].log
    assert ranges["warmup"].integer and (ranges["warmup"].low, ranges["warmup"].high) == (0, 20)


def test_the_default_warmup_range_holds_the_plans_own() -> None:
    assert default_ranges(PLAN.replace(warmup_steps=30), 100)["warmup"].high == 30
    assert default_ranges(PLAN.replace(warmup_steps=300), 100)["warmup"].high == 20
    assert default_ranges(PLAN, 3)["warmup"].high == 1


def test_ranges_override_and_a_subset() -> None:
    ranges = parse_params("lr=1e-4:1e-2, wd", default_ranges(PLAN, 100))
    assert [(r.name, r.key, r.low, r.high) for r in ranges] == [
        ("lr", "lr", 1e-4, 1e-2),
        ("wd", "weight_decay", 0.0, 0.3),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lr=1e-2:1e-4", "the range is empty"),
        ("lr=0:1e-2", "log scale, LOW must be > 0"),
        ("wd=-0.1:0.2", "cannot be negative"),
        ("warmup=0:7.5", "whole numbers"),
        ("lr=1e-3", "write the range as lr=LOW:HIGH"),
        ("lr=a:b", "write the range as lr=LOW:HIGH"),
        ("momentum", "unknown parameter 'momentum'"),
        ("lr,lr", "names lr twice"),
        (" , ", "--params is empty"),
        ("wd=0:inf", "must be finite"),
    ],
)
def test_bad_ranges_are_one_line_config_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as info:
        parse_params(text, default_ranges(PLAN, 100))
    assert "\n" not in str(info.value)


def test_trial_steps_are_whole_global_batches_and_need_two() -> None:
    per_step = PLAN.tokens_per_step  # 16 x 64
    assert trial_steps(PLAN, 10 * per_step + per_step - 1) == 10
    with pytest.raises(ConfigError, match=f"give at least {2 * per_step:,}"):
        trial_steps(PLAN, 2 * per_step - 1)
    assert eval_every(100) == 10 and eval_every(5) == 1


def test_the_first_rung_is_the_first_eval_after_the_longest_warmup() -> None:
    config = TrainConfig(model="gpt-tiny", warmup_steps=7)
    ranges = default_ranges(config, 100)
    assert longest_warmup(config, parse_params(None, ranges)) == 20  # the range's top
    assert longest_warmup(config, parse_params("lr,wd", ranges)) == 7  # the plan's own
    assert first_rung(100, 10, 20) == 20
    assert first_rung(100, 10, 21) == 30  # the first eval at or after the warm-up's end
    assert first_rung(100, 10, 0) == 10  # no warm-up: the first eval
    # A warm-up as long as the trial: the last eval before the final one, still one to prune at.
    assert first_rung(100, 10, 500) == 90
    assert first_rung(95, 9, 500) == 90
    assert first_rung(2, 1, 5) == 1


def test_tuned_config_changes_only_hyperparameters() -> None:
    tuned = tuned_config(PLAN, {"lr": 5e-4, "warmup_steps": 3.0, "weight_decay": 0.0})
    assert (tuned.lr, tuned.warmup_steps, tuned.weight_decay) == (5e-4, 3, 0.0)
    assert isinstance(tuned.warmup_steps, int)
    assert tuned.min_lr == pytest.approx(5e-5)  # keeps min_lr / lr = 0.1
    assert speed_changes(PLAN, tuned) == []
    before, after = PLAN.to_dict(), tuned.to_dict()
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"lr", "min_lr", "warmup_steps", "weight_decay"}
    assert changed <= set(HYPERPARAMETER_KEYS)
    assert tuned.global_batch_size == PLAN.global_batch_size
    with pytest.raises(ConfigError, match="not micro_batch_size"):
        tuned_config(PLAN, {"micro_batch_size": 8})


def test_study_name_is_stable_and_depends_on_what_defines_the_study() -> None:
    ranges = parse_params(None, default_ranges(PLAN, 100))
    name = study_name(PLAN, ranges, 1000)
    assert name == study_name(PLAN, ranges, 1000)
    assert name.startswith("advisor-tune-")
    assert name != study_name(PLAN, ranges, 2000)
    assert name != study_name(PLAN, ranges[:2], 1000)
    assert name != study_name(PLAN.replace(micro_batch_size=8, grad_accum_steps=1), ranges, 1000)


def test_spearman() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)


def _record(number: int, lr: float, wd: float, losses: list[float], state: str) -> TrialRecord:
    return TrialRecord(
        number=number,
        state=state,
        params={"lr": lr, "wd": wd},
        evals=tuple(
            EvalPoint(step=10 * (i + 1), tokens=100 * (i + 1), eval_loss=v)
            for i, v in enumerate(losses)
        ),
        score=losses[-1] if state == "complete" else None,
    )


def test_sensitivity_uses_the_last_step_every_trial_reached() -> None:
    # lr: higher is worse at step 10 (the pruned trials stopped there); wd: no monotone effect.
    records = [
        _record(0, 1e-4, 0.1, [3.0, 2.0, 1.0], "complete"),
        _record(1, 1e-3, 0.0, [3.5, 2.5, 0.5], "complete"),
        _record(2, 1e-2, 0.2, [4.0], "pruned"),
        _record(3, 1e-1, 0.05, [5.0], "pruned"),
        _record(4, 5e-2, 0.3, [], "failed"),
    ]
    lr, wd = sensitivity(records, ["lr", "wd"])
    assert (lr.step, lr.trials) == (10, 4)
    assert lr.rho == pytest.approx(1.0)
    assert wd.rho is not None and abs(wd.rho) < 0.5
    assert sensitivity(records[:2], ["lr"])[0].rho is None  # too few trials
    assert best_trial(records) == records[1]


def test_records_round_trip(tmp_path: Path) -> None:
    records = [_record(1, 1e-3, 0.1, [3.0, 2.0], "complete"), _record(0, 0.1, 0.0, [9.0], "pruned")]
    write_trials(tmp_path / "trials.jsonl", records)
    again = read_trials(tmp_path / "trials.jsonl")
    assert [r.number for r in again] == [0, 1]
    assert again[1] == records[0]
    summary = TuningSummary(
        study_name="s",
        storage="sqlite:///x",
        pruner="p",
        sampler="TPE",
        trials_asked=2,
        tokens_per_trial=200,
        steps_per_trial=20,
        eval_every=2,
        ranges=(ParamRange(name="lr", key="lr", low=1e-4, high=1e-2, log=True),),
        plan="plan.json",
        tuned_plan="tuned_plan.json",
        base_values={"lr": 1e-3},
        best_number=1,
        best_values={"lr": 1e-3},
        best_score=2.0,
        base_score=None,
        counts={"complete": 1, "pruned": 1},
        tokens_trained=300,
        sensitivity=(Sensitivity(name="lr", rho=None, step=10, trials=2),),
    )
    summary.save(tmp_path / "study.json")
    loaded = TuningSummary.load(tmp_path / "study.json")
    assert loaded == summary
    assert math.isclose(loaded.cost_runs, 1.5)
