"""benchmarks/regret_repredict.py: a finished session's grid against the predictions it logged
and today's, per layout, and its profiles kept in the committed session directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import regret, regret_repredict
from benchmarks import regret_analysis as ra
from profilers.rundir import RunDir

MiB = 2**20


def visits(key: str, layout: str, step_s: float) -> list[dict[str, Any]]:
    return [
        {
            "case": "m-gbs8",
            "kind": "grid",
            "pass": p,
            "key": key,
            "layout": layout,
            "world_size": 1 if layout == "single" else 2,
            "tokens_per_step": 1024,
            "status": "ok",
            "reason": "",
            "step_s": [step_s] * 3,
            "peak_bytes": [400 * MiB] * 3,
            "wall_s": 5.0,
        }
        for p in range(2)
    ]


def prediction(step_s: float, spread: float = 1.2) -> dict[str, Any]:
    return {
        "step_time_s": step_s,
        "tokens_per_s": 1024 / step_s,
        "peak_memory_bytes": 300 * MiB,
        "budgeted_bytes": 400 * MiB,
        "traced_bytes": 300 * MiB,
        "probed": False,
        "step_time_s_interval": [step_s / spread, step_s * spread],
    }


def test_before_and_now_are_judged_against_the_same_measurements() -> None:
    single, fsdp = "fp32/none/single1/mb8xga1/nw0", "fp32/none/fsdp2/mb4xga1/nw0"
    stats = ra.config_stats([*visits(single, "single", 0.10), *visits(fsdp, "fsdp", 0.20)])
    before = {single: prediction(0.10), fsdp: prediction(0.10)}  # fsdp 50% fast
    now = {single: prediction(0.10), fsdp: prediction(0.19)}  # fsdp 5% fast
    result = regret_repredict.compare(stats, before, now, {"fixed": 0, "parallel": {}})
    assert result["before"]["time"]["fsdp"]["median"] == pytest.approx(-0.5)
    assert result["now"]["time"]["fsdp"]["median"] == pytest.approx(-0.05)
    assert result["before"]["time"]["single"] == result["now"]["time"]["single"]
    # The 20% interval holds fsdp's measurement only now.
    assert result["before"]["calibration"]["step_time_s"]["inside"] == 1
    assert result["now"]["calibration"]["step_time_s"]["inside"] == 2
    text = regret_repredict.markdown(
        {
            "session": "s1",
            "commit": "abc",
            "cases": {"m-gbs8": {"model": "m", "role": "held-out", **result}},
        }
    )
    assert "| m-gbs8 (held-out) | fsdp | 50% / 50% (-50%, n=1) | 5% / 5% (-5%, n=1) |" in text
    assert "1/2 (50%)" in text and "2/2 (100%)" in text


def test_a_profile_is_copied_into_the_session_once_and_read_from_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(regret, "SCRATCH", tmp_path / "work")
    session = tmp_path / "sessions" / "s1"
    session.mkdir(parents=True)
    assert regret_repredict.profile_path(session, "m-gbs8") is None
    scratch = RunDir(tmp_path / "work" / "s1" / "m-gbs8" / "profile").profile
    scratch.parent.mkdir(parents=True)
    scratch.write_text('{"scratch": 1}')
    kept = regret_repredict.profile_path(session, "m-gbs8")
    assert kept == session / "profiles" / "m-gbs8.json" and kept.read_text() == '{"scratch": 1}'
    scratch.unlink()  # the scratch directory is git-ignored: gone on a fresh clone
    assert regret_repredict.profile_path(session, "m-gbs8") == kept


def test_no_such_session_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert regret_repredict.main(["nope", "--sessions", str(tmp_path)]) == 2
    assert "no session 'nope'" in capsys.readouterr().err


def test_the_calibration_table_pools_every_case_of_every_session() -> None:
    single, fsdp = "fp32/none/single1/mb8xga1/nw0", "fp32/none/fsdp2/mb4xga1/nw0"
    stats = ra.config_stats([*visits(single, "single", 0.10), *visits(fsdp, "fsdp", 0.20)])
    narrow = {single: prediction(0.10), fsdp: prediction(0.10)}
    wide = {single: prediction(0.10, 1.5), fsdp: prediction(0.10, 2.5)}
    overheads = {"fixed": 0, "parallel": {}}
    case = {"model": "m", "role": "held-out"}
    results = [
        {
            "session": "s1",
            "cases": {
                "m-gbs8": {**case, **regret_repredict.compare(stats, narrow, wide, overheads)}
            },
        },
        {
            "session": "s2",
            "cases": {
                "m-gbs8": {**case, **regret_repredict.compare(stats, narrow, narrow, overheads)},
                "n-gbs8": {"skipped": "no advisor phase or no profile kept"},
            },
        },
    ]
    text = regret_repredict.calibration_table(results, "abc")
    assert "| s1 | m-gbs8 (held-out) | 1/2 (50%), width 37% | 2/2 (100%), width " in text
    assert "| s2 | m-gbs8 (held-out) | 1/2 (50%), width 37% | 1/2 (50%), width 37% | -25% |" in text
    assert "n-gbs8" not in text  # a skipped case has no row and counts in no pool
    assert text.rstrip().endswith("| all | pooled | 2/4 (50%) | 3/4 (75%) | |")


def test_a_session_without_profiles_is_not_re_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(regret, "SCRATCH", tmp_path / "work")
    session = tmp_path / "sessions" / "s1"
    session.mkdir(parents=True)
    (session / "session.json").write_text('{"session": "s1", "cases": [{"id": "m-gbs8"}]}')
    assert not regret_repredict.has_profiles(session)
    assert regret_repredict.main(["--all", "--sessions", str(tmp_path / "sessions")]) == 2
    assert "no session under" in capsys.readouterr().err
    (session / "profiles").mkdir()
    (session / "profiles" / "m-gbs8.json").write_text("{}")
    assert regret_repredict.has_profiles(session)


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--tag", "a/b"], "--tag 'a/b'"), (["s1", "--all"], "--all re-asks every session")],
)
def test_bad_options_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert regret_repredict.main([*argv, "--sessions", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
