"""The validation-agreement benchmark's analysis (benchmarks/validation_agreement.py)."""

from __future__ import annotations

import pytest

from benchmarks import validation_agreement as va


def test_the_configs_are_fixed_by_the_global_batch() -> None:
    assert va.plan_configs(16) == [(16, 1, "none"), (2, 8, "none"), (4, 4, "full")]
    assert va.plan_configs(4) == [(4, 1, "none"), (1, 4, "full")]
    assert va.plan_configs(2) == [(2, 1, "none")]
    assert va.config_label(2, 8, "none") == "mb2xga8/none"


def test_summary_pairs_the_instruments_round_by_round() -> None:
    def visit(instrument: str, rnd: int, steps: list[float] | None, config: str = "a") -> dict:
        return {
            "model": "m",
            "config": config,
            "round": rnd,
            "instrument": instrument,
            "status": "ok" if steps else "error",
            "step_s": steps,
        }

    visits = [
        visit("child", 0, [0.1, 0.3, 0.2]),  # median 0.2
        visit("train", 0, [0.4, 0.4, 0.5]),  # median 0.4
        visit("train", 1, [0.2, 0.2, 0.2]),
        visit("child", 1, [0.3, 0.3, 0.3]),
        visit("child", 2, [0.9]),  # no train visit in round 2: not a pair
        visit("train", 2, None),
        visit("child", 0, [1.0], config="b"),
    ]
    rows = {r["config"]: r for r in va.summarize(visits)}
    a = rows["a"]
    assert a["rounds"] == 2
    assert a["child_s"] == pytest.approx(0.3)  # median of 0.2, 0.3, 0.9
    assert a["train_s"] == pytest.approx(0.3)  # median of 0.4, 0.2
    assert a["ratio"] == pytest.approx(1.0)
    assert a["round_ratios"] == [0.5, 1.5]
    assert (a["ratio_min"], a["ratio_max"]) == (pytest.approx(0.5), pytest.approx(1.5))
    b = rows["b"]
    assert b["train_s"] is None and b["ratio"] is None and b["rounds"] == 0
    text = va.table(list(rows.values()), [0.5, 1.5])
    assert "| m | a | 2 | 0.3000 | 0.3000 | 1.000 | 0.50, 1.50 |" in text
    assert "Median child / train over 1 configs: 1.000" in text
