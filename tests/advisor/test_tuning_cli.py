"""``advisor tune``: bad input is one line and exit 2 before any trial; end to end (slow), the
tuned plan trains with ``advisor train --plan`` to the best trial's loss."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from advisor.cli import main
from profilers.metrics_record import read_metrics
from profilers.rundir import RunDir
from tests.advisor.test_tuning import write_plan


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _one_line_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.output


def test_missing_plan(tmp_path: Path) -> None:
    _one_line_error(
        invoke("tune", "--plan", str(tmp_path / "nope.json")), "no plan at", "advisor recommend"
    )


def test_plan_is_required() -> None:
    _one_line_error(invoke("tune"), "--plan")


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ("lr=1e-2:1e-4", "the range is empty"),
        ("lr=0:1", "LOW must be > 0"),
        ("batch", "unknown parameter 'batch'"),
        ("wd=0.1", "wd=LOW:HIGH"),
        # a warm-up longer than the trial (300 steps) never reaches its lr: it was accepted
        ("warmup=0:1000", "a trial is 300 steps, and a longer warm-up never reaches its lr"),
    ],
)
def test_bad_ranges(tmp_path: Path, params: str, fragment: str) -> None:
    plan = write_plan(tmp_path)
    _one_line_error(invoke("tune", "--plan", str(plan), "--params", params), fragment)
    assert not RunDir(tmp_path).tune.root.exists()  # nothing ran


@pytest.mark.parametrize(
    ("storage", "fragment"),
    [
        # sqlite:// is in memory: Optuna's tables were missing and it ended in a traceback
        ("sqlite://", "is an in-memory database"),
        ("sqlite:///:memory:", "is an in-memory database"),
        ("", "--storage is empty"),
    ],
)
def test_storage_a_study_cannot_live_in(tmp_path: Path, storage: str, fragment: str) -> None:
    plan = write_plan(tmp_path)
    _one_line_error(invoke("tune", "--plan", str(plan), "--storage", storage), fragment)
    assert not RunDir(tmp_path).tune.root.exists()


SLOW_STUDY = """
import sys
import advisor.tuning
from tests.advisor.test_tuning import Scripted
advisor.tuning.ChildTrainer = lambda: Scripted(delay_s=0.2)
from advisor.cli import main
main(["tune", "--plan", sys.argv[1], "--trials", "3", "--tokens-per-trial", "5120"])
"""


def test_sigterm_stops_the_study_as_ctrl_c_does(tmp_path: Path) -> None:
    """SIGTERM (a scheduler's preemption) killed 'advisor tune' without a word: its trial
    stayed RUNNING and the child's checkpoint was left behind."""
    import signal

    plan = write_plan(tmp_path, warmup_steps=2)
    child = subprocess.Popen(
        [sys.executable, "-c", SLOW_STUDY, str(plan)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent.parent,
    )
    assert child.stderr is not None
    said = []
    for line in child.stderr:
        said.append(line)
        if line.startswith("trial 1:"):  # trial 0 is done, trial 1 is running
            break
    child.send_signal(signal.SIGTERM)
    _, rest = child.communicate(timeout=120)
    assert child.returncode == 128 + signal.SIGTERM, "".join(said) + rest
    lines = [line for line in rest.splitlines() if line.strip()]
    assert lines == [
        "error: interrupted (SIGTERM): the trials so far are kept in its study; the same "
        "command continues it"
    ]
    from strategies.tuning import read_trials

    trials = read_trials(RunDir(tmp_path).tune.trials)
    assert [(t.number, t.state) for t in trials] == [(0, "complete"), (1, "failed"), (2, "waiting")]
    assert trials[1].reason == "interrupted (SIGTERM); re-run as trial 2"


def test_too_few_tokens_for_one_evaluation(tmp_path: Path) -> None:
    plan = write_plan(tmp_path)  # 4 sequences of 32 tokens per step
    _one_line_error(
        invoke("tune", "--plan", str(plan), "--tokens-per-trial", "200"),
        "--tokens-per-trial 200 is too few",
        "give at least 256",
    )


def test_zero_trials(tmp_path: Path) -> None:
    plan = write_plan(tmp_path)
    _one_line_error(invoke("tune", "--plan", str(plan), "--trials", "0"), "--trials")


@pytest.mark.slow
def test_tune_then_train_the_tuned_plan(tmp_path: Path) -> None:
    """Real trials (each an ``advisor train`` child), then the tuned plan trained again: the
    same held-out loss as its trial (training is deterministic per seed). 512 tokens per trial:
    4 steps of the plan's 128 tokens, an eval at each (as the retrain's --eval-every 1)."""
    plan = write_plan(
        tmp_path, parallelism="single", world_size=1, micro_batch_size=4, grad_accum_steps=1
    )
    command = [sys.executable, "-m", "advisor"]
    done = subprocess.run(
        [*command, "tune", "--plan", str(plan), "--trials", "3", "--tokens-per-trial", "512",
         "--device", "cpu"],
        capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tuned plan:" in done.stdout
    study = json.loads(RunDir(tmp_path).tune.study.read_text())
    best = study["best_number"]
    trial_dir = RunDir(tmp_path).tune.trial(study["study_name"], best)
    assert not trial_dir.checkpoints.exists()  # deleted: the metrics are the evidence
    out = tmp_path / "train"
    done = subprocess.run(
        [*command, "train", "--plan", str(RunDir(tmp_path).tuned_plan), "--out", str(out),
         "--steps", "4", "--eval-every", "1", "--quiet", "--device", "cpu"],
        capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert read_metrics(out / "metrics.jsonl").evals[-1].eval_loss == pytest.approx(
        study["best_score"], rel=1e-6
    )
    assert read_metrics(trial_dir.metrics).evals[-1].eval_loss == pytest.approx(
        study["best_score"], rel=1e-6
    )
