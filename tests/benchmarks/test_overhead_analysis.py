"""The trainer-overhead benchmark's analysis (benchmarks/overhead_analysis.py) on synthetic
run logs: steady-state windows, pairing, ratios, the loss check and the results table."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import pytest

from benchmarks import overhead_analysis as oa

TOKENS = 1024  # tokens per optimizer step of every synthetic run


def times_at(step_s: float, steps: int, start: float = 1.0) -> list[float]:
    """Wall (or CPU) time at the end of each step: ``start`` then ``step_s`` per step."""
    return [start + step_s * (k + 1) for k in range(steps)]


def run(
    config: str,
    side: str,
    pair: int,
    *,
    step_s: float = 0.1,
    cpu_step_s: Sequence[float] = (0.1,),
    steps: int = 10,
    warmup: int = 2,
    losses: Sequence[float] | None = None,
) -> dict[str, Any]:
    """One raw ``run`` record: a constant step time, one CPU list per rank."""
    position = oa.pair_order(pair).index(side)
    return {
        "record": "run",
        "config": config,
        "side": side,
        "pair": pair,
        "position": position,
        "steps": steps,
        "warmup": warmup,
        "tokens_per_step": TOKENS,
        "times": times_at(step_s, steps),
        "cpu": [times_at(c, steps, start=0.5) for c in cpu_step_s],
        "losses": list(losses) if losses is not None else [5.0 - 0.1 * k for k in range(steps)],
        "process_s": step_s * steps + 3.0,
    }


def config(name: str, layout: str = "single", world: int = 1) -> dict[str, Any]:
    return {
        "record": "config",
        "name": name,
        "base": name,
        "layout": layout,
        "world_size": world,
        "train_config": {
            "model": "gpt-tiny",
            "model_args": {},
            "seq_len": 128,
            "micro_batch_size": 8 // world,
            "grad_accum_steps": 1,
            "precision": "fp32",
            "activation_checkpointing": "none",
        },
        "threads": 1,
        "steps": 10,
        "warmup_steps_excluded": 2,
        "tokens_per_step": TOKENS,
        "calibration_step_s": None,
    }


SESSION = {
    "record": "session",
    "created": "2026-01-01T00:00:00+0000",
    "quick": False,
    "method": {"pairs": 2, "advisor_quiet": False},
    "environment": {"torch": "2.x", "cpu_count": 2, "loadavg_start": [1.0, 1.0, 1.0]},
}
END = {"record": "end", "total_s": 600.0, "loadavg_end": [2.0, 1.5, 1.0]}


# -- pairing and windows ---------------------------------------------------------------------------


def test_pairs_alternate_which_side_runs_first() -> None:
    assert [oa.pair_order(p) for p in range(4)] == [
        ("advisor", "hand"),
        ("hand", "advisor"),
        ("advisor", "hand"),
        ("hand", "advisor"),
    ]


def test_step_durations_start_after_the_warmup() -> None:
    assert oa.step_durations([1.0, 3.0, 4.0, 7.0], warmup=2) == [1.0, 3.0]
    with pytest.raises(ValueError, match="warmup"):
        oa.step_durations([1.0, 2.0], warmup=0)


def test_single_run_window_counts_steps_after_the_warmup_only() -> None:
    # Step 1 is slow (warm-up); steps 3..10 take 0.1 s of wall and 0.05 s of CPU each.
    record = run("c", "hand", 0, cpu_step_s=(0.05,))
    record["times"][0] -= 5.0  # a slow first step moves nothing after the warm-up
    result = oa.run_result(record)
    assert result.window_s == pytest.approx(0.8)
    assert result.tokens_per_s == pytest.approx(8 * TOKENS / 0.8)
    assert result.tokens_per_cpu_s == pytest.approx(8 * TOKENS / 0.4)
    assert result.cpu_share == pytest.approx(0.5)
    assert result.median_step_tokens_per_s == pytest.approx(TOKENS / 0.1)


def test_distributed_run_sums_cpu_over_ranks_and_shares_over_processes() -> None:
    result = oa.run_result(run("c", "advisor", 0, cpu_step_s=(0.1, 0.05)))
    assert result.cpu_window_s == pytest.approx((0.8, 0.4))
    assert result.tokens_per_cpu_s == pytest.approx(8 * TOKENS / 1.2)
    assert result.cpu_share == pytest.approx(1.2 / (0.8 * 2))


def test_a_run_missing_a_step_on_any_rank_is_refused() -> None:
    record = run("c", "advisor", 0, cpu_step_s=(0.1, 0.1))
    record["cpu"][1] = record["cpu"][1][:-1]
    with pytest.raises(ValueError, match="expected 10"):
        oa.run_result(record)
    short = run("c", "hand", 0)
    short["times"] = short["times"][:-1]
    with pytest.raises(ValueError, match="expected 10"):
        oa.run_result(short)


# -- the same-work check ---------------------------------------------------------------------------


def test_identical_losses_agree_bit_for_bit() -> None:
    agreement = oa.compare_losses([3.0, 2.5, 2.0], [3.0, 2.5, 2.0])
    assert agreement.max_abs_diff == 0.0
    assert agreement.identical_steps == 3 and agreement.first_different_step is None


def test_a_loss_difference_is_reported_not_hidden() -> None:
    agreement = oa.compare_losses([3.0, 2.5, 2.0, 1.8], [3.0, 2.5, 2.0001, 1.7])
    assert agreement.max_abs_diff == pytest.approx(0.1)
    assert agreement.max_rel_diff == pytest.approx(0.1 / 1.8)
    assert agreement.identical_steps == 2 and agreement.first_different_step == 3


def test_nan_on_one_side_only_is_an_infinite_difference() -> None:
    assert oa.compare_losses([1.0, math.nan], [1.0, 2.0]).max_abs_diff == math.inf
    both = oa.compare_losses([1.0, math.nan], [1.0, math.nan])
    assert both.max_abs_diff == 0.0 and both.identical_steps == 2


def test_loss_curves_of_different_lengths_cannot_be_compared() -> None:
    with pytest.raises(ValueError, match="length"):
        oa.compare_losses([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        oa.compare_losses([], [])


def test_spread_is_relative_to_the_median() -> None:
    assert oa.spread([1.0, 2.0, 4.0]) == {
        "median": 2.0,
        "min": 1.0,
        "max": 4.0,
        "spread_pct": 150.0,
    }


# -- from the runs log to the results --------------------------------------------------------------


def two_pairs(name: str, advisor_step_s: Sequence[float], hand_step_s: float) -> list[dict]:
    records: list[dict[str, Any]] = []
    for pair, adv_s in enumerate(advisor_step_s):
        for side in oa.pair_order(pair):
            step = adv_s if side == "advisor" else hand_step_s
            records.append(run(name, side, pair, step_s=step, cpu_step_s=(step,)))
    return records


def test_ratio_is_the_median_over_pairs_of_advisor_over_hand() -> None:
    # Advisor 10% slower in pair 0, 25% slower in pair 1, 0% in pair 2: median ratio 1/1.1.
    log = [SESSION, config("c"), *two_pairs("c", [0.11, 0.125, 0.1], 0.1), END]
    results = oa.analyze(log)
    (entry,) = results["configs"]
    ratios = sorted(p["ratio"] for p in entry["pairs"])
    assert ratios == pytest.approx([0.8, 1 / 1.1, 1.0])
    summary = entry["summary"]
    assert summary["ratio"]["median"] == pytest.approx(1 / 1.1)
    assert summary["cpu_ratio"]["median"] == pytest.approx(1 / 1.1)
    assert summary["meets_target"] is False and summary["meets_target_cpu_time"] is False
    assert summary["all_losses_identical"] is True and summary["max_abs_loss_diff"] == 0.0
    assert results["partial"] is False and results["total_s"] == 600.0
    first, second = ["advisor", "hand"], ["hand", "advisor"]
    assert [p["order"] for p in entry["pairs"]] == [first, second, first]


def test_a_pair_missing_a_side_is_left_out_and_counted() -> None:
    records = two_pairs("c", [0.1, 0.1], 0.1)
    records = [r for r in records if not (r["pair"] == 1 and r["side"] == "hand")]
    failure = {"record": "failure", "config": "c", "side": "hand", "pair": 1, "reason": "exit 1"}
    results = oa.analyze([SESSION, config("c"), *records, failure])
    (entry,) = results["configs"]
    assert [p["pair"] for p in entry["pairs"]] == [0]
    assert entry["incomplete_pairs"] == [1]
    assert entry["failures"] == [{"side": "hand", "pair": 1, "reason": "exit 1"}]
    assert results["partial"] is True  # no end record: the invocation did not finish


def test_a_config_without_a_complete_pair_has_no_summary() -> None:
    results = oa.analyze([SESSION, config("c"), run("c", "advisor", 0)])
    assert results["configs"][0]["summary"] is None
    assert "| c | single |" in oa.render_markdown(results)


def test_only_the_last_session_of_a_log_counts() -> None:
    old = [SESSION, config("old"), *two_pairs("old", [0.2], 0.1), END]
    new = [SESSION, config("new"), *two_pairs("new", [0.1], 0.1), END]
    assert [c["name"] for c in oa.analyze(old + new)["configs"]] == ["new"]
    with pytest.raises(ValueError, match="session"):
        oa.analyze([config("c")])


def test_a_loss_mismatch_reaches_the_summary() -> None:
    records = two_pairs("c", [0.1], 0.1)
    records[1]["losses"][4] += 0.5  # the hand run of pair 0 diverges at step 5
    (entry,) = oa.analyze([SESSION, config("c"), *records])["configs"]
    assert entry["pairs"][0]["first_different_loss_step"] == 5
    assert entry["summary"]["max_abs_loss_diff"] == pytest.approx(0.5)
    assert entry["summary"]["all_losses_identical"] is False


def test_results_are_plain_json() -> None:
    log = [SESSION, config("c"), *two_pairs("c", [0.1], 0.1), END]
    results = oa.analyze(log)
    assert json.loads(json.dumps(results)) == results


def test_the_table_has_one_labelled_row_per_config_and_layout() -> None:
    log = [
        SESSION,
        config("single-cfg"),
        *two_pairs("single-cfg", [0.1, 0.1], 0.1),
        config("ddp-cfg", "ddp", 2),
        *two_pairs("ddp-cfg", [0.125, 0.125], 0.1),
        END,
    ]
    table = oa.render_markdown(oa.analyze(log))
    rows = [line for line in table.splitlines() if line.startswith("| ") and "cfg" in line]
    assert len(rows) == 2
    assert rows[0].startswith("| single-cfg | single |") and "**1.000**" in rows[0]
    assert rows[1].startswith("| ddp-cfg | ddp×2 |") and "**0.800**" in rows[1]
    assert rows[1].endswith("| NO / NO |") and rows[0].endswith("| yes / yes |")
    assert "0.0e+00 (yes)" in rows[0]
    assert "total 10.0 min" in table
