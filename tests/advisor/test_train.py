"""The trainer end to end: resume equality after SIGKILL, SIGTERM, divergence, the config matrix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advisor.errors import TrainingDiverged, UsageProblem
from advisor.trainer.loop import RunOptions, train
from strategies.config import TrainConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

# A tiny GPT that sleeps in forward: signals must land in the middle of the run whatever the
# host's speed (a quiet machine trains the plain tiny model to the end in under a second).
SLOW = str(Path(__file__).parent.parent / "data" / "slow_model.py") + ":factory"
TINY = [
    "--model",
    SLOW,
    "--keep-checkpoints",
    "100",
    "--seq-len",
    "32",
    "--micro-batch-size",
    "2",
    "--grad-accum-steps",
    "2",
    "--warmup-steps",
    "2",
    "--eval-batches",
    "2",
    "--quiet",
]
# Steps of the signal tests' runs: a checkpoint at 4, then 4 more steps of 2 sleeping forwards and
# an eval each (>= 0.5 s) for a kill or a SIGTERM to land in; the resumed run continues through
# the warm-up's end and the decay. 24 steps checked nothing more and cost ~3 times as long.
STEPS = "8"
TINY_CONFIG = TrainConfig(
    model="gpt-tiny",
    model_args={"n_layer": 1, "n_embd": 32},
    seq_len=32,
    global_batch_size=4,
    micro_batch_size=2,
    grad_accum_steps=2,
    warmup_steps=2,
)


def advisor(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "advisor", *args],
        text=True,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,
    )  # type: ignore[call-overload]


def run_ok(*args: str) -> str:
    proc = advisor(*args)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out


def losses(out: Path) -> list[tuple[int, float]]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in lines if r["kind"] == "train"]


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int, float]]:
    out = tmp_path_factory.mktemp("ref") / "run"
    run_ok("train", *TINY, "--steps", STEPS, "--checkpoint-every", "4", "--out", str(out))
    return losses(out)


def test_sigkill_then_resume_reproduces_losses_bitwise(tmp_path: Path, reference: list) -> None:
    out = tmp_path / "run"
    args = ["train", *TINY, "--steps", STEPS, "--checkpoint-every", "4", "--out", str(out)]
    proc = advisor(*args)
    wait_for(out / "checkpoints" / "step_00000004", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert len(losses(out)) < int(STEPS)  # it really was cut short
    run_ok(*args, "--resume")
    assert losses(out) == reference  # same steps, same float losses: bit for bit


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path: Path, reference: list) -> None:
    out = tmp_path / "run"
    args = ["train", *TINY, "--steps", STEPS, "--checkpoint-every", "100", "--out", str(out)]
    proc = advisor(*args)
    wait_for(out / "metrics.jsonl", proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the run finished before SIGTERM arrived")
    assert proc.returncode == 128 + signal.SIGTERM
    assert err.startswith("error: SIGTERM: stopped after step"), err
    assert "Traceback" not in err
    assert any((out / "checkpoints").glob("step_*/extra.pt"))
    run_ok(*args, "--resume")
    assert losses(out) == reference


def test_nan_loss_stops_with_a_clear_message_and_keeps_the_checkpoint(tmp_path: Path) -> None:
    factory = Path(__file__).parent.parent / "data" / "nan_model.py"
    config = TrainConfig(
        model=f"{factory}:factory",
        model_args={"calls": 8},
        seq_len=16,
        global_batch_size=2,
        micro_batch_size=2,
    )
    with pytest.raises(
        TrainingDiverged,
        match=r"loss became nan at step 9; the last good "
        r"checkpoint is .*step_00000008\. Lower --lr",
    ):
        train(
            config,
            RunOptions(out=tmp_path, steps=20, checkpoint_every=4, progress=False, eval_every=0),
        )
    assert (tmp_path / "checkpoints" / "step_00000008" / "extra.pt").exists()


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("checkpointing", ["none", "full"])
@pytest.mark.parametrize("accum", [1, 2])
def test_every_precision_checkpointing_accumulation_trains(
    tmp_path: Path, precision: str, checkpointing: str, accum: int
) -> None:
    config = TINY_CONFIG.replace(
        precision=precision,
        activation_checkpointing=checkpointing,
        grad_accum_steps=accum,
        micro_batch_size=4 // accum,
        lr=3e-3,
    )
    result = train(config, RunOptions(out=tmp_path, steps=6, progress=False, eval_batches=1))
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in steps] == list(range(1, 7))
    for key in (
        "loss",
        "lr",
        "grad_norm",
        "tokens",
        "step_time_s",
        "tokens_per_s",
        "peak_memory_bytes",
    ):
        assert all(r[key] is not None for r in steps), key
    assert steps[-1]["tokens"] == 6 * 4 * 32
    assert steps[-1]["loss"] < steps[0]["loss"]
    assert result.eval_loss is not None and result.checkpoint is not None


def test_refuses_to_overwrite_a_run_without_resume(tmp_path: Path) -> None:
    train(TINY_CONFIG, RunOptions(out=tmp_path, steps=1, progress=False, eval_batches=1))
    with pytest.raises(UsageProblem, match="already holds a training run: pass --resume"):
        train(TINY_CONFIG, RunOptions(out=tmp_path, steps=1, progress=False))


def test_resume_with_a_different_config_is_refused(tmp_path: Path) -> None:
    train(TINY_CONFIG, RunOptions(out=tmp_path, steps=2, progress=False, eval_batches=1))
    # The values, as flags: "a different lr" sent the user to train_config.json for them.
    with pytest.raises(UsageProblem, match=r"trained with --lr 0\.001 \(not 0\.01\); resume"):
        train(
            TINY_CONFIG.replace(lr=1e-2),
            RunOptions(out=tmp_path, steps=4, resume=True, progress=False),
        )


def test_tokens_budget_sets_the_number_of_steps(tmp_path: Path) -> None:
    result = train(
        TINY_CONFIG, RunOptions(out=tmp_path, tokens=3 * 128 + 1, progress=False, eval_batches=1)
    )
    assert result.steps == 4  # ceil(385 / 128)


def test_a_run_that_repeats_its_data_says_so_even_when_quiet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 33-token dataset was trained 58 times over without a word (audit of 2026-12-07)."""
    import dataclasses

    import numpy as np

    data = tmp_path / "tiny"
    data.mkdir()
    for split in ("train", "val"):
        np.arange(40, dtype=np.uint16).tofile(data / f"{split}.bin")
    config = dataclasses.replace(TINY_CONFIG, data=str(data))
    train(config, RunOptions(out=tmp_path / "run", steps=3, progress=False, eval_batches=1))
    err = capsys.readouterr().err
    assert "note: data " in err and "12 tokens" not in err
    assert "384 tokens from 40 train tokens, about 9.6 passes" in err, err
    # Enough data for the run: nothing said.
    big = tmp_path / "big.bin"
    np.resize(np.arange(200, dtype=np.uint16), 50_000).tofile(big)
    config = dataclasses.replace(TINY_CONFIG, data=str(big))
    train(config, RunOptions(out=tmp_path / "run2", steps=3, progress=False, eval_batches=1))
    assert "note: data" not in capsys.readouterr().err


def test_plain_progress_shows_the_first_step_a_heartbeat_and_the_time_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a terminal a line came every twentieth of the run only: a 100,000-step run at
    10 s a step was silent for 14 hours, and its first line came after 5,000 steps."""
    import io

    from advisor.trainer import metrics

    clock = [0.0]
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: clock[0])
    stream = io.StringIO()
    progress = metrics.Progress(100_000, 0, stream=stream)
    for step in range(1, 31):
        clock[0] = step * 10.0
        progress.update(step, 2.5, 1234.0)
    assert stream.getvalue().splitlines() == [
        "step 1/100000  loss 2.5000  1.2k tok/s  10s, 11d13h left",  # the first step
        "step 7/100000  loss 2.5000  1.2k tok/s  1m10s, 11d13h left",  # then once a minute
        "step 13/100000  loss 2.5000  1.2k tok/s  2m10s, 11d13h left",
        "step 19/100000  loss 2.5000  1.2k tok/s  3m10s, 11d13h left",
        "step 25/100000  loss 2.5000  1.2k tok/s  4m10s, 11d13h left",
    ]
    resumed_lines = io.StringIO()
    resumed = metrics.Progress(4, 2, stream=resumed_lines)  # a resume at step 2
    clock[0] += 3.0
    resumed.update(3, 2.5, 10.0)
    clock[0] += 3.0
    resumed.update(4, 2.5, 10.0)
    assert resumed_lines.getvalue().splitlines() == [
        "step 3/4  loss 2.5000  10 tok/s  3s, 3s left",
        "step 4/4  loss 2.5000  10 tok/s  6s",
    ]
