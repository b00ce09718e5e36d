"""Resume corners a user meets after a Ctrl-C: no checkpoint yet, a shorter --steps, and the
progress line's eval loss."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from advisor.trainer.loop import RunOptions, train
from profilers.metrics_record import read_metrics
from profilers.rundir import TrainDir
from strategies.config import TrainConfig

CONFIG = TrainConfig(
    model="gpt-tiny",
    model_args={"n_layer": 1, "n_embd": 32},
    seq_len=16,
    global_batch_size=2,
    micro_batch_size=2,
    grad_accum_steps=1,
    warmup_steps=1,
)


def test_resume_without_a_checkpoint_starts_afresh_without_doubling_the_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second Ctrl-C stops before a checkpoint is saved; --resume then trained from step 0
    and appended to the old lines, so metrics.jsonl held steps 1-3 twice."""
    train(CONFIG, RunOptions(out=tmp_path, steps=3, progress=False, eval_every=0))
    files = TrainDir(tmp_path)
    for checkpoint in sorted(files.checkpoints.iterdir()):  # as if none was ever saved
        if checkpoint.is_dir():
            for f in checkpoint.iterdir():
                f.unlink()
            checkpoint.rmdir()
        else:
            checkpoint.unlink()
    train(CONFIG, RunOptions(out=tmp_path, steps=3, resume=True, eval_every=0))
    steps = [r.step for r in read_metrics(files.metrics).train]
    assert steps == [1, 2, 3]
    assert "no checkpoint in" in capsys.readouterr().err


def test_a_resume_with_fewer_steps_than_done_leaves_the_run_files_alone(tmp_path: Path) -> None:
    """It rewrote train_config.json's total_steps, so the report called the run 4/2 done."""
    train(CONFIG, RunOptions(out=tmp_path, steps=4, progress=False, eval_every=0))
    config_file = TrainDir(tmp_path).train_config
    before = config_file.read_text()
    result = train(CONFIG, RunOptions(out=tmp_path, steps=2, resume=True, progress=False))
    assert result.steps == 4
    assert config_file.read_text() == before
    assert json.loads(before)["total_steps"] == 4


def test_the_progress_line_shows_this_steps_eval_loss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The line was printed before the step's evaluation: it showed the previous one's."""
    train(CONFIG, RunOptions(out=tmp_path, steps=3, eval_every=1, eval_batches=1))
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("step ")]
    shown = {
        int(m[1]): float(m[2]) for ln in lines if (m := re.match(r"step (\d+)/3 .*eval (\S+)", ln))
    }
    evals = {r.step: r.eval_loss for r in read_metrics(TrainDir(tmp_path).metrics).evals}
    assert shown and all(shown[s] == pytest.approx(evals[s], abs=5e-5) for s in shown)


def test_a_resume_that_names_no_length_keeps_the_runs_length_and_cadence(
    tmp_path: Path,
) -> None:
    """`advisor train --out RUN --resume` after a kill: it trained on to the default 300
    steps (its learning-rate schedule over at the original length) and evaluated at the
    default cadence. It now finishes the run it was: the same steps, evals, losses."""
    from click.testing import CliRunner

    from advisor.cli import main

    args = ["train", "--model", "gpt-tiny", "--model-arg", "n_layer=1", "--model-arg",
            "n_embd=32", "--seq-len", "16", "--global-batch-size", "2", "--micro-batch-size",
            "2", "--quiet"]  # fmt: skip
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    cadence = ["--steps", "6", "--eval-every", "2", "--checkpoint-every", "3"]
    for out in (whole, cut):
        done = CliRunner().invoke(main, [*args, *cadence, "--out", str(out)])
        assert done.exit_code == 0, done.output
    files = TrainDir(cut)
    (files.checkpoints / "step_00000006").rename(tmp_path / "gone")  # killed after step 5
    (files.checkpoints / "latest").write_text("step_00000003")
    done = CliRunner().invoke(main, ["train", "--out", str(cut), "--resume", "--quiet"])
    assert done.exit_code == 0, done.output
    assert "trained 6 steps" in done.output
    resumed, uninterrupted = read_metrics(files.metrics), read_metrics(TrainDir(whole).metrics)
    assert [r.step for r in resumed.train] == [1, 2, 3, 4, 5, 6]
    assert [e.step for e in resumed.evals] == [2, 4, 6]
    assert resumed.train[-1].loss == pytest.approx(uninterrupted.train[-1].loss, rel=1e-5)
    assert json.loads(files.train_config.read_text())["total_steps"] == 6
