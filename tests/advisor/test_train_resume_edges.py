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
