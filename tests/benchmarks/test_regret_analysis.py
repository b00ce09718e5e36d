"""The regret benchmark's analysis (benchmarks/regret_analysis.py) on synthetic visit logs."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from benchmarks import regret_analysis as ra

TOKENS = 1024  # tokens per optimizer step in every synthetic visit
MiB = 2**20


def visit(
    key: str,
    pass_index: int,
    step_s: Sequence[float] | float,
    *,
    peak_mib: int = 400,
    layout: str = "single",
    world: int = 1,
    status: str = "ok",
    kind: str = "grid",
    order_index: int = 0,
) -> dict[str, Any]:
    steps = [step_s] * 3 if isinstance(step_s, float) else list(step_s)
    ok = status == "ok"
    return {
        "case": "m-gbs8",
        "kind": kind,
        "pass": pass_index,
        "order_index": order_index,
        "key": key,
        "layout": layout,
        "world_size": world,
        "tokens_per_step": TOKENS,
        "status": status,
        "reason": "" if ok else "boom",
        "step_s": steps if ok else [],
        "peak_bytes": [peak_mib * MiB] * len(steps) if ok else [],
        "wall_s": 5.0,
        "loadavg": [1.0, 1.0, 1.0],
    }


def grid(
    times: Mapping[str, Sequence[float]], peaks: Mapping[str, int] | None = None
) -> list[dict[str, Any]]:
    """Visits of every key in every pass: ``times[key][p]`` is its step time in pass p."""
    out = []
    for key, per_pass in times.items():
        layout = key.split("/")[0]
        world = 2 if layout != "single" else 1
        for p, t in enumerate(per_pass):
            out.append(
                visit(
                    key,
                    p,
                    t,
                    peak_mib=(peaks or {}).get(key, 400),
                    layout=layout,
                    world=world,
                )
            )
    return out


def case(keys: Sequence[str], passes: int = 2, session: str = "s1") -> dict[str, Any]:
    return {
        "id": "m-gbs8",
        "group": "m seq 128",
        "model": "m",
        "role": "held-out",
        "global_batch_size": 8,
        "passes": passes,
        "keys": list(keys),
    }


def advisor(
    unconstrained: str | None, memory_bound: dict[str, Any] | None = None
) -> dict[str, Any]:
    rec: dict[str, Any] = {"unconstrained": {"status": "ok", "key": unconstrained, "wall_s": 30.0}}
    if memory_bound is not None:
        rec["memory-bound"] = memory_bound
    return {"case": "m-gbs8", "profile": {"wall_s": 60.0, "status": "ok"}, "recommend": rec}


# -- visit order ----------------------------------------------------------------------------------


def test_passes_alternate_seeded_order_and_its_reverse() -> None:
    keys = [f"k{i:02d}" for i in range(20)]
    first = ra.pass_order(keys, 0, "seed")
    assert sorted(first) == keys and first != keys  # a shuffle of every key
    assert ra.pass_order(keys, 1, "seed") == first[::-1]
    third = ra.pass_order(keys, 2, "seed")
    assert sorted(third) == keys and third != first  # a new shuffle starts the next pair
    assert ra.pass_order(keys, 3, "seed") == third[::-1]
    # The order depends on the keys and the seed, not on the order they were listed in.
    assert ra.pass_order(list(reversed(keys)), 0, "seed") == first
    assert ra.pass_order(keys, 0, "other seed") != first


def test_every_config_gets_the_same_visits_and_no_more() -> None:
    keys = [f"k{i}" for i in range(7)]
    schedule = ra.grid_schedule(keys, 3, "seed")
    counts = {k: sum(1 for _p, _i, key in schedule if key == k) for k in keys}
    assert counts == dict.fromkeys(keys, 3)
    for p in range(3):
        assert sorted(k for q, _i, k in schedule if q == p) == sorted(keys)


def test_extra_visits_of_the_advised_config_never_enter_the_reference() -> None:
    times = {"single/a": [0.10, 0.10], "single/b": [0.125, 0.125]}
    visits = grid(times)
    # Visits of the advised config logged apart (kind "extra", e.g. a later measurement that
    # read it much faster) must change nothing in the grid's numbers.
    visits += [visit("single/b", p, 0.05, kind="extra") for p in range(2)]
    result = ra.analyse_case(
        session="s1", case=case(list(times)), visits=visits, advisor=advisor("single/b")
    )
    r = result.regrets["unconstrained"]
    assert result.visits_per_config == {"single/a": 2, "single/b": 2}
    assert r["advised_tokens_per_s"] == pytest.approx(TOKENS / 0.125)
    assert r["ratio"] == pytest.approx(0.8)
    assert r["rank"] == 2 and r["apart"] is None


def test_an_advised_config_outside_the_grid_is_reported_apart() -> None:
    times = {"single/a": [0.10, 0.10], "single/b": [0.125, 0.125]}
    visits = grid(times) + [
        visit("ddp/x", p, 0.2, layout="ddp", world=2, kind="extra") for p in (0, 1)
    ]
    result = ra.analyse_case(
        session="s1", case=case(list(times)), visits=visits, advisor=advisor("ddp/x")
    )
    r = result.regrets["unconstrained"]
    assert r["in_grid"] is False and r["ratio"] is None and r["rank"] is None
    assert r["best"] == "single/a"  # the reference is the grid's alone
    assert r["apart"]["visits"] == 2
    assert r["apart"]["ratio_to_grid_best"] == pytest.approx(0.5)
    assert result.configs == 2


# -- per-config statistics ------------------------------------------------------------------------


def test_config_stats_pool_steps_and_count_every_rank() -> None:
    visits = [
        visit("ddp/a", 0, [0.1, 0.3, 0.2], peak_mib=300, layout="ddp", world=2),
        visit("ddp/a", 1, [0.4, 0.5], peak_mib=350, layout="ddp", world=2),
        visit("single/b", 0, 0.1),
        visit("single/b", 1, 0.1, status="error"),
        visit("single/c", 0, 0.1, status="timeout"),
    ]
    stats = ra.config_stats(visits)
    a = stats["ddp/a"]
    assert a.step_time_s == pytest.approx(0.3)  # median of all five timed steps, pooled
    assert a.tokens_per_s == pytest.approx(TOKENS / 0.3)
    assert a.peak_bytes == 350 * MiB and a.budgeted_bytes == 700 * MiB
    assert a.visit_tokens_per_s == pytest.approx((TOKENS / 0.2, TOKENS / 0.45))
    b = stats["single/b"]
    assert (b.visits, b.visits_ok, b.status) == (2, 1, "ok")
    assert b.visit_tokens_per_s[1] is None
    c = stats["single/c"]
    assert (c.status, c.tokens_per_s, c.reason) == ("timeout", None, "boom")


# -- ranks and ratios -----------------------------------------------------------------------------


def test_ratio_and_rank_with_ties() -> None:
    times = {
        "single/a": [0.1, 0.1],
        "single/b": [0.1, 0.1],  # ties with a for the best
        "single/c": [0.2, 0.2],
        "single/d": [0.2, 0.2],
        "single/e": [0.4, 0.4],
    }
    stats = ra.config_stats(grid(times))
    tie = ra.regret(stats, "single/b")
    assert tie.ratio == pytest.approx(1.0) and tie.rank == 1 and tie.meets_target
    assert tie.best == "single/a"  # ties go to the smaller key, whatever the log's order
    slow = ra.regret(stats, "single/d")
    assert slow.ratio == pytest.approx(0.5) and slow.rank == 3  # 1, 1, 3, 3, 5
    assert not slow.meets_target
    assert ra.regret(stats, "single/e").rank == 5
    assert ra.rank_of(5.0, [5.0, 5.0, 4.0]) == 1


def test_a_failed_advised_config_has_no_ratio() -> None:
    visits = grid({"single/a": [0.1, 0.1]}) + [
        visit("single/b", p, 0.1, status="oom") for p in (0, 1)
    ]
    r = ra.regret(ra.config_stats(visits), "single/b")
    assert r.in_grid and r.ratio is None and r.rank is None and r.advised_status == "oom"


# -- the memory-bound budget ----------------------------------------------------------------------


def test_budget_rule_excludes_the_unconstrained_best() -> None:
    times = {
        "ddp/fast": [0.1, 0.1],
        "single/mid": [0.125, 0.125],
        "single/small": [0.2, 0.2],
    }
    peaks = {"ddp/fast": 500, "single/mid": 600, "single/small": 400}  # ddp: 2 x 500 MiB
    stats = ra.config_stats(grid(times, peaks))
    rule = ra.memory_bound_budget(stats)
    assert (rule.best, rule.smallest) == ("ddp/fast", "single/small")
    assert rule.budget_bytes == (400 + 1000) * MiB // 2  # midway: 700 MiB
    assert rule.budget_bytes < 1000 * MiB == stats["ddp/fast"].budgeted_bytes
    bound = ra.regret(stats, "single/mid", rule.budget_bytes)
    assert bound.best == "single/mid" and bound.eligible == 2
    assert bound.ratio == pytest.approx(1.0) and bound.rank == 1 and bound.advised_fits
    over = ra.regret(stats, "ddp/fast", rule.budget_bytes)
    assert over.advised_fits is False and over.best == "single/mid"


def test_no_memory_bound_case_when_the_best_is_also_the_smallest() -> None:
    stats = ra.config_stats(
        grid({"single/a": [0.1, 0.1], "single/b": [0.2, 0.2]}, {"single/b": 500})
    )
    rule = ra.memory_bound_budget(stats)
    assert rule.budget_bytes is None and "smallest" in rule.reason


def test_budget_fraction_reproduces_the_budget_in_bytes() -> None:
    memory = 23_456_789_012
    for budget in (1, 612_345_678, 700 * MiB, memory):
        fraction = ra.budget_fraction(budget, memory)
        assert fraction is not None and 0 < fraction <= 1
        assert math.floor(fraction * memory) == budget
        assert math.floor(float(repr(fraction)) * memory) == budget  # as the CLI reads it back
    assert ra.budget_fraction(memory + 1, memory) is None


def test_memory_bound_regret_in_a_case() -> None:
    times = {"ddp/fast": [0.1, 0.1], "single/mid": [0.125, 0.125], "single/small": [0.2, 0.2]}
    peaks = {"ddp/fast": 500, "single/mid": 600, "single/small": 400}
    budget = 700 * MiB
    result = ra.analyse_case(
        session="s1",
        case=case(list(times)),
        visits=grid(times, peaks),
        advisor=advisor(
            "ddp/fast", {"status": "ok", "key": "single/small", "budget_bytes": budget}
        ),
    )
    bound = result.regrets["memory-bound"]
    assert bound["best"] == "single/mid" and bound["ratio"] == pytest.approx(0.625)
    assert bound["rule"]["budget_bytes"] == budget
    assert result.regrets["unconstrained"]["ratio"] == pytest.approx(1.0)


# -- the host's spread and the statements ---------------------------------------------------------


def test_spread_and_the_statement_when_it_exceeds_the_gap() -> None:
    # a wins pass 1, b wins pass 2: the best of each pass alone differs by 25%.
    times = {"single/a": [0.08, 0.125], "single/b": [0.1, 0.1]}
    visits = grid(times)
    spread = ra.host_spread(visits)
    assert spread.pass_winners_differ
    assert spread.pass_best_spread == pytest.approx(0.25)
    assert spread.median_cv is not None and spread.value == pytest.approx(0.25)
    result = ra.analyse_case(
        session="s1", case=case(list(times)), visits=visits, advisor=advisor("single/b")
    )
    assert "cannot tell whether the target is met" in result.statements["unconstrained"]


def test_no_statement_when_the_gap_is_larger_than_the_spread() -> None:
    assert "exceeds the gap" in ra.spread_statement(0.98, 0.02)  # gap 1% < spread 2%
    assert "exceeds the gap" in ra.spread_statement(0.95, 0.05)
    assert ra.spread_statement(0.98, 0.005) == ""
    assert ra.spread_statement(0.80, 0.05) == ""
    assert ra.spread_statement(None, 0.5) == ""
    assert "spread is unknown" in ra.spread_statement(0.9, None)  # one pass: no spread
    steady = grid({"single/a": [0.1, 0.1], "single/b": [0.2, 0.2]})
    result = ra.analyse_case(
        session="s1",
        case=case(["single/a", "single/b"]),
        visits=steady,
        advisor=advisor("single/b"),
    )
    assert result.statements == {}  # ratio 0.5, spread 0: clearly below the target


def test_sessions_are_all_reported_with_their_spread() -> None:
    keys = ["single/a", "single/b"]
    one = ra.analyse_case(
        session="s1",
        case=case(keys),
        visits=grid({"single/a": [0.1, 0.1], "single/b": [0.1, 0.1]}),
        advisor=advisor("single/b"),
    )
    two = ra.analyse_case(
        session="s2",
        case=case(keys),
        visits=grid({"single/a": [0.1, 0.1], "single/b": [0.125, 0.125]}),
        advisor=advisor("single/b"),
    )
    unfinished = ra.analyse_case(
        session="s3", case=case(keys), visits=grid({"single/a": [0.1]}), advisor=None
    )
    (group,) = [
        g for g in ra.summarize_sessions([two, unfinished, one]) if g.budget == "unconstrained"
    ]
    assert [s["session"] for s in group.sessions] == ["s1", "s2", "s3"]  # none left out
    assert [s["ratio"] for s in group.sessions] == pytest.approx([1.0, 0.8, None])
    assert group.sessions[2]["state"] == "grid unfinished"
    assert (group.ratio_min, group.ratio_max) == pytest.approx((0.8, 1.0))
    assert group.ratio_median == pytest.approx(0.9)
    assert any("disagree" in s for s in group.statements)


# -- the cost model against the grid --------------------------------------------------------------


def test_prediction_errors_compare_like_for_like() -> None:
    visits = grid({"single/a": [0.1, 0.1], "ddp/b": [0.2, 0.2]}, {"single/a": 500, "ddp/b": 600})
    stats = ra.config_stats(visits)
    predictions = {
        "single/a": {"step_time_s": 0.11, "traced_bytes": 200 * MiB, "budgeted_bytes": 500 * MiB},
        "ddp/b": {
            "step_time_s": 0.2,
            "traced_bytes": 250 * MiB,
            "budgeted_bytes": 1320 * MiB,
            "probed": True,
        },
    }
    overheads = {"fixed": 300 * MiB, "parallel": {"ddp": 50 * MiB}}
    errors = ra.prediction_errors(stats, predictions, overheads)
    assert errors["single"]["time"]["median"] == pytest.approx(0.1)
    assert errors["single"]["memory"]["median"] == pytest.approx(0.0)  # 200 / (500 - 300)
    assert errors["ddp"]["memory"]["median"] == pytest.approx(0.0)  # 250 / (600 - 300 - 50)
    assert errors["ddp"]["budgeted"]["median"] == pytest.approx(0.1)  # 1320 / (2 x 600)
    assert errors["all"]["time_unprobed"]["n"] == 1
    assert ra.prediction_errors(stats, {}, overheads)["all"]["unpredictable"] == 2


def test_calibration_of_intervals_and_their_absence() -> None:
    stats = ra.config_stats(
        grid({"single/a": [0.1, 0.1], "single/b": [0.2, 0.2], "single/c": [0.4, 0.4]})
    )
    with_intervals = {
        "single/a": {"step_time_s": 0.1, "step_time_s_interval": [0.09, 0.12]},
        "single/b": {"step_time_s": 0.25, "step_time_s_interval": [0.22, 0.3]},  # misses
        "single/c": {"step_time_s": 0.4, "step_time_s_interval": [0.3, 0.5]},
    }
    (cal,) = ra.calibration(stats, with_intervals)
    assert (cal.quantity, cal.configs, cal.inside) == ("step_time_s", 3, 2)
    assert cal.fraction_inside == pytest.approx(2 / 3)
    assert cal.median_relative_width == pytest.approx(0.32)  # 0.3, 0.32, 0.5
    assert ra.calibration(stats, {"single/a": {"step_time_s": 0.1}}) == []
    result = ra.analyse_case(
        session="s1",
        case=case(["single/a", "single/b", "single/c"]),
        visits=grid({"single/a": [0.1, 0.1], "single/b": [0.2, 0.2], "single/c": [0.4, 0.4]}),
        advisor={**advisor("single/a"), "predictions": {"single/a": {"step_time_s": 0.1}}},
    )
    assert result.calibration == []


# -- the markdown --------------------------------------------------------------------------------


def test_the_summaries_say_what_the_analysis_found() -> None:
    from benchmarks import regret_report

    times = {"single/a": [0.08, 0.125], "single/b": [0.1, 0.1]}  # passes crown different configs
    visits = grid(times) + [
        visit("ddp/x", p, 0.2, layout="ddp", world=2, kind="extra") for p in (0, 1)
    ]
    record = advisor(
        "single/b", {"status": "ok", "key": "ddp/x", "budget_bytes": 500 * MiB, "wall_s": 20.0}
    )
    record["predictions"] = {"single/a": {"step_time_s": 0.1}, "single/b": {"step_time_s": 0.1}}
    result = ra.analyse_case(session="s1", case=case(list(times)), visits=visits, advisor=record)
    meta = {
        "session": "s1",
        "finished": None,
        "settings": {
            "models": ["m"],
            "global_batch_sizes": [8],
            "seq_len": 128,
            "world_size": 2,
            "precisions": ["fp32"],
            "checkpointing": ["none"],
            "passes": 2,
            "warmup": 2,
            "steps": 3,
        },
        "environment": {},
    }
    text = regret_report.session_markdown(meta, [result])
    assert "UNFINISHED" in text
    assert "cannot tell whether the target is met" in text
    assert "no intervals in predictions" in text
    assert "ddp/x is NOT in the grid" in text and "measured apart" in text.lower()
    summary = regret_report.all_sessions_markdown(
        [(meta, [result])], ra.summarize_sessions([result])
    )
    assert "## Held-out models" in summary and "Tuning set" not in summary
    assert "advised config not in the grid" in summary


def test_visits_on_a_busy_host_are_counted_where_logged() -> None:
    from benchmarks import regret_report

    times = {"single/a": [0.1, 0.1], "single/b": [0.2, 0.2]}
    visits = grid(times)
    assert (
        ra.analyse_case(session="s1", case=case(list(times)), visits=visits, advisor=None).busy_host
        is None
    )  # sessions before the meter
    for v, share in zip(visits, (0.02, 0.3, 0.6, None), strict=True):
        if share is not None:
            v["host_others_share"] = share
    result = ra.analyse_case(session="s1", case=case(list(times)), visits=visits, advisor=None)
    assert result.busy_host == {"visits": 3, "busy": 2, "threshold": 0.25, "max": 0.6}
    text = "\n".join(regret_report.case_markdown(result))
    want = "other processes took ≥ 25% of the host's CPU time during 2 of 3 visits (at most 60%)"
    assert want in text


# -- what the knobs of issue 14 gain --------------------------------------------------------------


def test_the_knobs_gain_is_the_best_against_the_best_without_them() -> None:
    plain_fast = "fp32/none/single1/mb8xga1/nw0"
    plain_small = "fp32/full/single1/mb2xga4/nw0"
    ops = "fp32/ops/single1/mb4xga2/nw0"
    kept = "fp32/none/fsdp2/mb4xga1/nw0/kg"
    assert not ra.uses_new_knob(plain_fast) and not ra.uses_new_knob(plain_small)
    assert ra.uses_new_knob(ops) and ra.uses_new_knob(kept)
    assert ra.uses_new_knob("fp32/blocks:2/ddp2/mb4xga1/nw0")
    assert ra.uses_new_knob("fp32/none/single1/mb8xga1/nw0/lc4")
    visits = (
        [visit(plain_fast, p, 0.10, peak_mib=600) for p in range(2)]
        + [visit(plain_small, p, 0.16, peak_mib=300) for p in range(2)]
        + [visit(ops, p, 0.125, peak_mib=400) for p in range(2)]
        + [visit(kept, p, 0.20, peak_mib=350, layout="fsdp", world=2) for p in range(2)]
    )
    stats = ra.config_stats(visits)
    # Unconstrained the plain config wins: the knobs gain nothing (1.0, never below).
    free = ra.knob_gain(stats)
    assert free is not None and free["gain"] == pytest.approx(1.0)
    assert free["best"] == free["plain_best"] == plain_fast and free["knob_configs"] == 2
    # Within 450 MiB the fastest plain config left is full (0.16 s); ops fits at 0.125 s.
    bound = ra.knob_gain(stats, 450 * MiB)
    assert bound is not None and bound["best"] == ops and bound["plain_best"] == plain_small
    assert bound["gain"] == pytest.approx(0.16 / 0.125)
    # A grid without the knobs has no gain to report.
    assert ra.knob_gain({k: s for k, s in stats.items() if not ra.uses_new_knob(k)}) is None
    result = ra.analyse_case(
        session="s1",
        case=case([plain_fast, plain_small, ops, kept]),
        visits=visits,
        advisor=None,
    )
    assert result.knob_gains["unconstrained"]["gain"] == pytest.approx(1.0)
