"""``advisor run --tune-trials N``: the tune stage between recommend and train (trials as long
as the run's training), and train then runs the tuned plan. Off by default."""

from __future__ import annotations

from pathlib import Path

import pytest

from advisor import run as run_module
from advisor.errors import AdvisorError, UsageProblem
from advisor.run import RunRequest, _train_stage, _tune_stage
from profilers.rundir import RunDir
from tests.advisor.test_tuning import Scripted, write_plan


def test_the_command_records_tune_trials_only_when_asked(tmp_path: Path) -> None:
    assert "--tune-trials" not in RunRequest().command(tmp_path)
    argv = RunRequest(tune_trials=5).command(tmp_path)
    assert argv[argv.index("--tune-trials") + 1] == "5"
    with pytest.raises(UsageProblem, match="--tune-trials"):
        RunRequest(tune_trials=-1)


def test_tune_stage_tunes_at_the_runs_length_and_train_runs_the_tuned_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_plan(tmp_path)  # RUN/plan.json: 4 sequences of 32 tokens per step
    monkeypatch.setattr("advisor.tuning.ChildTrainer", Scripted)
    request = RunRequest(seq_len=32, global_batch_size=4, steps=30, tune_trials=4)
    said: list[str] = []
    detail, result = _tune_stage(request, tmp_path, lambda message, _f: said.append(message))
    assert result.summary.tokens_per_trial == 30 * 4 * 32
    assert result.summary.steps_per_trial == 30
    assert len(result.trials) == 4
    assert detail.startswith(f"trial {result.best.number} of 4: ")
    assert sum(m.startswith("trial ") for m in said) == 4
    assert RunDir(tmp_path).tuned_plan.is_file()

    launched: list[list[str]] = []

    def fake_advisor(args: list[str]) -> tuple[int, str]:
        launched.append(args)
        return 1, "error: stop here"

    monkeypatch.setattr(run_module, "_run_advisor", fake_advisor)
    with pytest.raises(AdvisorError, match="stop here"):
        _train_stage(request, tmp_path, show_progress=False)
    args = launched[0]
    assert args[args.index("--plan") + 1] == str(RunDir(tmp_path).tuned_plan)
    launched.clear()
    with pytest.raises(AdvisorError):
        _train_stage(RunRequest(steps=30), tmp_path, show_progress=False)
    args = launched[0]
    assert args[args.index("--plan") + 1] == str(RunDir(tmp_path).plan)
