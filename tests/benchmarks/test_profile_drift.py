"""benchmarks/profile_drift.py: the interval's drift part re-derived from the committed
profiler-accuracy results, on the tuning models only."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import profile_drift
from strategies.uncertainty import PROFILE_TO_RUN_DRIFT_SHARED


def _row(precision: str, checkpointing: str, b: int, drift: float | None) -> dict[str, Any]:
    return {
        "precision": precision,
        "activation_checkpointing": checkpointing,
        "micro_batch_size": b,
        "time": {"drift": drift},
    }


def _result(model: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"by_settings": [{"name": "defaults", "models": [{"model": model, "rows": rows}]}]}


def test_a_group_counts_once_and_only_the_tuning_models_make_the_constant() -> None:
    gpt = _result(
        "gpt-tiny",
        [_row("fp32", "none", b, 0.9) for b in (3, 6, 12)] + [_row("fp32", "full", 3, 1.1)],
    )
    bert = _result("bert-tiny", [_row("fp32", "none", 3, 0.5), _row("fp32", "full", 3, None)])
    rows = profile_drift.drift_rows("a.json", gpt) + profile_drift.drift_rows("b.json", bert)
    assert [(r["model"], r["checkpointing"], r["drift"]) for r in rows] == [
        ("gpt-tiny", "none", 0.9),
        ("gpt-tiny", "full", 1.1),
        ("bert-tiny", "none", 0.5),
    ]
    s = profile_drift.summary(rows)
    expected = math.sqrt((math.log(0.9) ** 2 + math.log(1.1) ** 2) / 2)
    assert s["tuning"] == {"groups": 2, "rms_log_drift": pytest.approx(expected)}
    assert s["models"]["bert-tiny"]["role"] == "held-out"
    assert s["models"]["bert-tiny"]["rms_log_drift"] == pytest.approx(-math.log(0.5))


def test_a_failed_model_and_an_old_layout_are_read_or_skipped() -> None:
    failed = {"by_settings": [{"name": "favourable", "models": [{"model": "x", "error": "boom"}]}]}
    assert profile_drift.drift_rows("f.json", failed) == []
    old = {"models": [{"model": "llama-tiny", "rows": [_row("bf16", "none", 3, 0.97)]}]}
    assert profile_drift.drift_rows("o.json", old)[0]["settings"] == "favourable"
    assert profile_drift.rms_log([]) is None


def test_the_committed_results_give_the_constant_the_intervals_use() -> None:
    result = profile_drift.collect(profile_drift.RESULTS)
    assert result["summary"]["tuning"]["groups"] == 80
    assert round(result["summary"]["tuning"]["rms_log_drift"], 2) == PROFILE_TO_RUN_DRIFT_SHARED


def test_no_results_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert profile_drift.main(["--results", str(tmp_path)]) == 2
    assert "no profiler_accuracy" in capsys.readouterr().err
    (tmp_path / "profiler_accuracy.json").write_text(
        json.dumps(_result("gpt-tiny", [_row("fp32", "none", 3, 0.9)]))
    )
    assert profile_drift.main(["--results", str(tmp_path)]) == 0
    assert (tmp_path / "profile_drift.md").is_file()
