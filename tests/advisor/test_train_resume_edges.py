"""Resume corners a user meets after a Ctrl-C: no checkpoint yet, a shorter --steps, and the
progress line's eval loss."""

from __future__ import annotations

import json
import re
import shutil
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


def test_a_resume_refused_for_changed_settings_names_both_values(tmp_path: Path) -> None:
    from advisor.errors import UsageProblem

    train(CONFIG, RunOptions(out=tmp_path, steps=1, progress=False, eval_every=0))
    other = CONFIG.replace(lr=1e-2, model_args={"n_layer": 2, "n_embd": 32})
    with pytest.raises(UsageProblem) as caught:
        train(other, RunOptions(out=tmp_path, steps=2, resume=True, progress=False))
    assert str(caught.value) == (
        f"cannot resume {tmp_path}: its checkpoint was trained with --lr 0.001 (not 0.01), "
        "--model-arg n_embd=32 n_layer=1 (not n_embd=32 n_layer=2); resume with the same "
        "settings or choose another --out"
    )


def test_a_resume_that_finds_no_run_says_it_starts_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped --out with --resume trained a new run from step 0 without a word."""
    out = tmp_path / "typo"
    train(CONFIG, RunOptions(out=out, steps=2, resume=True, progress=False, eval_every=0))
    assert f"note: --resume: no run in {out} yet: starting one at step 0" in (
        capsys.readouterr().err.splitlines()
    )


def test_a_warm_up_as_long_as_the_run_is_noted_even_when_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default 20 warm-up steps on a 3-step run: the rate never reached --lr nor decayed."""
    config = CONFIG.replace(warmup_steps=20)
    train(config, RunOptions(out=tmp_path / "a", steps=3, progress=False, eval_every=0))
    err = capsys.readouterr().err
    assert (
        "note: --warmup-steps 20 is not below the run's length (3): the learning rate rises "
        "for the whole run, to 0.00015 (--lr 0.001) at its last step, and never decays; lower "
        "--warmup-steps"
    ) in err.splitlines()
    lrs = [r.lr for r in read_metrics(TrainDir(tmp_path / "a").metrics).train]
    assert lrs == pytest.approx([5e-5, 1e-4, 1.5e-4])  # what the note describes
    train(CONFIG, RunOptions(out=tmp_path / "b", steps=3, progress=False, eval_every=0))
    assert "warmup" not in capsys.readouterr().err  # warmup_steps 1


def test_extending_a_run_keeps_its_schedule_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --resume with more --steps keeps the checkpoint's schedule (so a resume reproduces
    the run it continues): past the original length the rate stays at --min-lr, which the
    command did not say."""
    train(CONFIG, RunOptions(out=tmp_path, steps=3, progress=False, eval_every=0))
    capsys.readouterr()
    train(CONFIG, RunOptions(out=tmp_path, steps=5, resume=True, progress=False, eval_every=0))
    assert (
        f"note: the learning-rate schedule of {tmp_path} ends at step 3 (its length when it "
        "started): steps 4-5 train at --min-lr 0.0001"
    ) in capsys.readouterr().err.splitlines()
    lrs = [r.lr for r in read_metrics(TrainDir(tmp_path).metrics).train]
    assert lrs[3:] == pytest.approx([1e-4, 1e-4])


def test_a_resume_on_data_written_again_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same --data path with other contents passed the config check without a word."""
    import numpy as np

    data = tmp_path / "data"
    data.mkdir()
    for name, n in (("train.bin", 400), ("val.bin", 100)):
        (np.arange(n, dtype=np.uint16) % 200).tofile(data / name)
    config = CONFIG.replace(data=str(data))
    out = tmp_path / "run"
    train(config, RunOptions(out=out, steps=2, progress=False, eval_every=0))
    (np.arange(600, dtype=np.uint16) % 200).tofile(data / "train.bin")
    capsys.readouterr()
    train(config, RunOptions(out=out, steps=3, resume=True, progress=False, eval_every=0))
    assert (
        f"note: data {data} changed since {out} started (then: {data}/{{train,val}}.bin (400 + "
        f"100 tokens); now: {data}/{{train,val}}.bin (600 + 100 tokens)): the resumed steps "
        "read the new data, so they will not match an uninterrupted run"
    ) in capsys.readouterr().err.splitlines()


def test_a_resume_may_use_other_loader_workers(tmp_path: Path) -> None:
    """--num-workers changes no sample, so a resume on a host with fewer cores may change it
    (it was refused as a different config)."""
    import shutil

    once = {"steps": 2, "checkpoint_every": 1, "progress": False, "eval_every": 0}
    train(CONFIG, RunOptions(out=tmp_path / "whole", **once))  # type: ignore[arg-type]
    cut = tmp_path / "cut"
    train(CONFIG, RunOptions(out=cut, **once))  # type: ignore[arg-type]
    checkpoints = TrainDir(cut).checkpoints
    shutil.rmtree(checkpoints / "step_00000002")  # killed after step 1
    (checkpoints / "latest").write_text("step_00000001")
    more = CONFIG.replace(num_workers=1)
    train(more, RunOptions(out=cut, steps=2, resume=True, progress=False, eval_every=0))
    losses = [
        [r.loss for r in read_metrics(TrainDir(tmp_path / d).metrics).train]
        for d in ("whole", "cut")
    ]
    assert losses[1] == losses[0]


def test_a_signal_in_the_last_step_lets_the_run_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C during the last step's evaluation or checkpoint exited 130 "stopped after step
    N ... continue with --resume" for a run that was complete (a scheduler would requeue it)."""
    import signal

    from advisor.trainer.loop import Trainer

    log_eval = Trainer._log_eval

    def interrupted(self: Trainer, step: int, progress: object) -> None:
        log_eval(self, step, progress)  # type: ignore[arg-type]
        if step == self.total_steps:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(Trainer, "_log_eval", interrupted)
    result = train(CONFIG, RunOptions(out=tmp_path, steps=2, progress=False, eval_every=0))
    assert result.steps == 2
    assert [r.step for r in read_metrics(TrainDir(tmp_path).metrics).train] == [1, 2]


def test_a_damaged_checkpoint_is_named_with_the_way_back(tmp_path: Path) -> None:
    """An empty extra.pt raised EOFError, which click turns into a Ctrl-C: "interrupted
    (Ctrl-C)", exit 130; a cut state.pt a traceback."""
    from click.testing import CliRunner

    from advisor.cli import main

    args = ["train", "--model", "gpt-tiny", "--model-arg", "n_layer=1", "--model-arg",
            "n_embd=32", "--seq-len", "16", "--global-batch-size", "2", "--micro-batch-size",
            "2", "--quiet", "--eval-every", "0", "--out", str(tmp_path)]  # fmt: skip
    assert (
        CliRunner().invoke(main, [*args, "--steps", "2", "--checkpoint-every", "1"]).exit_code == 0
    )
    checkpoints = TrainDir(tmp_path).checkpoints
    newest = checkpoints / "step_00000002"
    for name, cut, error in (("extra.pt", 0, "EOFError"), ("state.pt", 1000, "RuntimeError")):
        whole = (newest / name).read_bytes()
        (newest / name).write_bytes(whole[:cut])
        done = CliRunner().invoke(main, [*args, "--steps", "3", "--resume"])
        assert done.exit_code == 2, done.output
        line = done.stderr.strip()
        assert line.startswith(
            f"error: cannot resume {tmp_path}: checkpoint {newest} cannot be read ({error}"
        ), line
        assert line.endswith(
            "): delete it to resume from step_00000001, or choose another --out"
        ), line
        assert "\n" not in line
        (newest / name).write_bytes(whole)  # each damage alone
    # The way back the message names: without the damaged one, the run resumes from step 1.
    (newest / "state.pt").write_bytes(b"")
    shutil.rmtree(newest)
    done = CliRunner().invoke(main, [*args, "--steps", "3", "--resume"])
    assert done.exit_code == 0, done.output


def test_a_damaged_train_config_lets_the_original_flags_resume(tmp_path: Path) -> None:
    """It said "pass the flags of the original run explicitly" and then refused them, reading
    the same damaged file."""
    from click.testing import CliRunner

    from advisor.cli import main

    flags = ["--model", "gpt-tiny", "--model-arg", "n_layer=1", "--model-arg", "n_embd=32",
             "--seq-len", "16", "--global-batch-size", "2", "--micro-batch-size", "2"]  # fmt: skip
    common = ["train", "--quiet", "--eval-every", "0", "--out", str(tmp_path)]
    assert CliRunner().invoke(main, [*common, *flags, "--steps", "2"]).exit_code == 0
    TrainDir(tmp_path).train_config.write_text("{")
    bare = CliRunner().invoke(main, [*common, "--steps", "3", "--resume"])
    assert bare.exit_code == 2
    assert "is damaged" in bare.stderr and "pass the flags of the original run" in bare.stderr
    no_seq_len = flags[:6] + flags[8:]
    wrong = CliRunner().invoke(main, [*common, *no_seq_len, "--steps", "3", "--resume"])
    assert wrong.exit_code == 2
    assert "its checkpoint was trained with --seq-len 16 (not 128); resume" in wrong.stderr
    done = CliRunner().invoke(main, [*common, *flags, "--steps", "3", "--resume"])
    assert done.exit_code == 0, done.output
    assert [r.step for r in read_metrics(TrainDir(tmp_path).metrics).train] == [1, 2, 3]
