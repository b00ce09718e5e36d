"""profiler_accuracy.py's two settings (favourable, the product's defaults) and its summary and
report on synthetic rows (nothing is profiled here)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from benchmarks import profiler_accuracy as pa
from profilers.defaults import DEFAULT_PROFILE_BUDGET_S


def test_both_settings_by_default_favourable_first() -> None:
    args = pa.parse_args([])
    assert args.settings == "both"
    favourable, defaults = pa.resolve_variants("both", pa.FULL, 1, None, quick=False)
    assert (favourable.name, favourable.threads, favourable.budget_s) == ("favourable", 1, 240.0)
    assert (defaults.name, defaults.threads) == ("defaults", None)
    assert defaults.budget_s == DEFAULT_PROFILE_BUDGET_S  # the product's own default, not a copy


def test_threads_and_budget_flags_shape_the_favourable_settings_only() -> None:
    favourable, defaults = pa.resolve_variants("both", pa.FULL, 0, 90.0, quick=False)
    assert favourable.threads is None and favourable.budget_s == 90.0
    assert defaults.threads is None and defaults.budget_s == DEFAULT_PROFILE_BUDGET_S
    (only,) = pa.resolve_variants("defaults", pa.FULL, 4, 90.0, quick=False)
    assert only.name == "defaults" and only.budget_s == DEFAULT_PROFILE_BUDGET_S


def test_quick_caps_the_defaults_budget_at_the_quick_profile() -> None:
    _, defaults = pa.resolve_variants("both", pa.QUICK, 1, None, quick=True)
    assert defaults.budget_s == min(DEFAULT_PROFILE_BUDGET_S, pa.QUICK.budget_s)
    with pytest.raises(ValueError, match="--settings"):
        pa.resolve_variants("fast", pa.FULL, 1, None, quick=False)


def test_each_setting_gets_its_own_thread_environment() -> None:
    base = {"OMP_NUM_THREADS": "7", "MKL_NUM_THREADS": "7", "PATH": "/bin"}
    favourable = pa.Variant(name="favourable", threads=1, budget_s=240.0)
    defaults = pa.Variant(name="defaults", threads=None, budget_s=120.0)
    assert favourable.env(base) == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PATH": "/bin"}
    # torch's own choice, as `advisor profile` run from a plain shell gets it.
    assert defaults.env(base) == {"PATH": "/bin"}
    assert base["OMP_NUM_THREADS"] == "7"  # the parent's environment is left alone
    assert "1 thread(s)" in favourable.label() and "240 s" in favourable.label()
    assert "default threads" in defaults.label() and "120 s" in defaults.label()


def test_settings_alternate_their_order_from_model_to_model() -> None:
    variants = pa.resolve_variants("both", pa.FULL, 1, None, quick=False)
    assert pa.interleaved_order(["a", "b", "c"], variants) == [
        ("favourable", "a"),
        ("defaults", "a"),
        ("defaults", "b"),
        ("favourable", "b"),
        ("favourable", "c"),
        ("defaults", "c"),
    ]
    (one,) = pa.resolve_variants("defaults", pa.FULL, 1, None, quick=False)
    assert pa.interleaved_order(["a", "b"], [one]) == [("defaults", "a"), ("defaults", "b")]


def test_settings_survive_the_trip_to_a_child() -> None:
    for settings in (pa.FULL, pa.QUICK):
        sent = json.dumps(dataclasses.asdict(settings))
        assert pa.Settings.from_dict(json.loads(sent)) == settings


# -- summary and report ----------------------------------------------------------------------------


def row(
    precision: str,
    b: int,
    memory_error: float | None,
    time_error: float | None,
    *,
    same: float | None = None,
    drift: float | None = None,
    extrapolated: bool = False,
) -> dict[str, Any]:
    memory: dict[str, Any] = {"error": memory_error, "note": "no fit"}
    if memory_error is not None:
        memory = {
            "predicted_bytes": 2**20 * (1 + memory_error),
            "measured_bytes": 2**20,
            "error": memory_error,
            "extrapolated": extrapolated,
        }
    time: dict[str, Any] = {"error": time_error, "note": "no truth"}
    if time_error is not None:
        time = {
            "predicted_s": 0.1 * (1 + time_error),
            "measured_s": 0.1,
            "num_samples": 6,
            "spread": 0.05,
            "error": time_error,
            "extrapolated": extrapolated,
            "drift": drift,
        }
        if same is not None:
            time["same_session_error"] = same
    return {
        "model": "m",
        "precision": precision,
        "activation_checkpointing": "none",
        "micro_batch_size": b,
        "memory_probed_sizes": [1, 4, 8],
        "time_probed_sizes": [2, 8],
        "memory": memory,
        "time": time,
    }


ROWS = [
    row("fp32", 3, 0.01, 0.05, same=0.02, drift=1.0),
    row("fp32", 6, -0.02, -0.20, same=-0.04, drift=0.9),
    row("fp32", 12, 0.06, 0.30, same=0.12, drift=1.1, extrapolated=True),
    row("bf16", 3, None, None),
]


def test_summary_counts_within_target_and_skips_missing_values() -> None:
    fp32, bf16, total = pa.summarize(ROWS, ["fp32", "bf16"])
    assert fp32["precision"] == "fp32" and total["precision"] == "all"
    assert fp32["memory"]["num"] == 3 and fp32["memory"]["within_target"] == 2
    assert fp32["memory"]["median_abs_error"] == pytest.approx(0.02)
    assert fp32["memory"]["max_abs_error"] == pytest.approx(0.06)
    assert fp32["memory"]["num_interpolated"] == 2
    assert fp32["time"]["within_target"] == 1 and fp32["time"]["max_abs_error"] == 0.30
    same = fp32["time_same_session"]
    assert same["within_target"] == 2 and same["median_abs_error"] == pytest.approx(0.04)
    assert (same["min_drift"], same["median_drift"], same["max_drift"]) == (0.9, 1.0, 1.1)
    assert bf16["memory"]["num"] == 0 and bf16["memory"]["median_abs_error"] is None
    assert total["memory"]["num"] == 3


def bench(model: str, rows: list[dict[str, Any]], threads: int) -> dict[str, Any]:
    return {
        "model": model,
        "device": "CPU",
        "torch": "2.x",
        "torch_threads": threads,
        "profile": {
            "budget_s": 120.0,
            "elapsed_s": 100.0,
            "load_before": 1.0,
            "load_after": 1.2,
            "throughput_probes": [{"name": "t", "status": "timeout", "reason": "slow"}],
        },
        "time_truth_load": [1.0, 1.1],
        "rows": rows,
    }


def results() -> dict[str, Any]:
    favourable, defaults = pa.resolve_variants("both", pa.FULL, 1, None, quick=False)
    return {
        "meta": {
            "cpu": "CPU",
            "num_cpus": 2,
            "torch": "2.x",
            "settings": dataclasses.asdict(pa.FULL),
            "total_min": 50.0,
            "load_start": 1.0,
            "load_end": 2.0,
        },
        "by_settings": [
            pa.variant_results(favourable, [bench("gpt-tiny", ROWS[:1], 1)], ["fp32"]),
            pa.variant_results(
                defaults,
                [bench("gpt-tiny", ROWS[1:2], 2), {"model": "bert-tiny", "error": "exit 1"}],
                ["fp32"],
            ),
        ],
    }


def test_each_setting_has_its_own_summary_and_keeps_a_failed_model() -> None:
    favourable, defaults = results()["by_settings"]
    assert favourable["torch_threads"] == 1 and defaults["torch_threads"] == 2
    assert favourable["summary"][0]["time"]["max_abs_error"] == pytest.approx(0.05)
    assert defaults["summary"][0]["time"]["max_abs_error"] == pytest.approx(0.20)
    assert [b["model"] for b in defaults["models"]] == ["gpt-tiny", "bert-tiny"]
    sections = results()["by_settings"]
    assert json.loads(json.dumps(sections)) == sections


def test_report_labels_both_settings_in_the_summary_and_as_sections() -> None:
    text = pa.render(results())
    summary = [line for line in text.splitlines() if line.startswith(("| favourable", "| def"))]
    assert [line.split(" | ")[:2] for line in summary] == [
        ["| favourable", "fp32"],
        ["| favourable", "all"],
        ["| defaults", "fp32"],
        ["| defaults", "all"],
    ]
    sections = [line for line in text.splitlines() if line.startswith("## Settings: ")]
    assert len(sections) == 2
    assert sections[0].startswith("## Settings: favourable (1 thread(s)")
    assert sections[1].startswith("## Settings: defaults (torch's default threads")
    assert "### bert-tiny" in text and "Not measured: exit 1." in text
    assert "- t: timeout (slow)" in text
    assert "+5.0%" in text and "-20.0%" in text


def test_blocks_k_on_the_line_in_k_is_judged_not_called_extrapolated() -> None:
    # A fit with sizes of its own: outside them is extrapolated (memory: only to the right).
    assert pa.outside([2, 8], 12) and pa.outside([2, 8], 1) and not pa.outside([2, 8], 6)
    assert pa.beyond([1, 4, 8], 12) and not pa.beyond([1, 4, 8], 3)
    # blocks:K priced on the line through the measured settings has none: the first full run
    # of the selective settings crashed on min() of an empty list here.
    assert not pa.outside([], 6) and not pa.beyond([], 6)


def test_resume_keeps_the_models_measured_without_error_under_the_same_settings(
    tmp_path: Any,
) -> None:
    settings = dataclasses.replace(pa.FULL, models=("gpt-tiny", "bert-tiny"))
    earlier = {
        "meta": {"settings": dataclasses.asdict(dataclasses.replace(settings, models=("x",)))},
        "by_settings": [
            {
                "name": "favourable",
                "models": [
                    {"model": "gpt-tiny", "error": "the benchmark child exited with 1"},
                    {"model": "bert-tiny", "rows": []},
                ],
            }
        ],
    }
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    kept = pa.kept_benches(path, settings)
    assert list(kept) == [("favourable", "bert-tiny")]  # the failed one is measured again
    assert kept["favourable", "bert-tiny"]["kept_from"] == str(path)
    with pytest.raises(SystemExit, match="settings differ"):
        pa.kept_benches(path, dataclasses.replace(settings, budget_s=60.0))
