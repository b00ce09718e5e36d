"""A rank that fails once the run has completed does not fail the run (advisor.training).

A gloo rank can abort while its interpreter tears the process group down, after its last step
and the final checkpoint ("terminate called without an active exception", PyTorch #65231; CI
saw it in a test's ranks on 2026-12-04). The launcher then reports a failed job although every
result is on disk. ``launch_ranks`` tells the two apart by the final checkpoint: committed in
this launch, at the run's last step, it proves every rank finished its work.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import advisor.launch
from advisor.launch import LaunchSpec, RanksFailed
from advisor.trainer.checkpoint import CheckpointDir
from advisor.trainer.options import RunOptions
from advisor.training import completed_since, launch_ranks
from profilers.rundir import TrainDir
from strategies.config import TrainConfig

FAILURE = "rank 1 was killed by SIGABRT after 12s"


def _commit(out: Path, step: int, total: int) -> Path:
    checkpoints = CheckpointDir(TrainDir(out).checkpoints, keep_last=0)
    checkpoints.begin(step)
    return checkpoints.commit(step, {"step": step, "total_steps": total})


def _launch_that(out: Path, monkeypatch: pytest.MonkeyPatch, *, step: int | None) -> list[str]:
    """Run ``launch_ranks`` with a launcher that commits a checkpoint at ``step`` of 4 (none
    when None), then reports a failed rank; what it said."""

    def fake_launch(spec: LaunchSpec, args: list[str]) -> None:
        if step is not None:
            _commit(out, step, 4)
        raise RanksFailed(FAILURE)

    monkeypatch.setattr(advisor.launch, "launch", fake_launch)
    said: list[str] = []
    config = TrainConfig(model="gpt-tiny", parallelism="ddp", world_size=2, micro_batch_size=4)
    launch_ranks(config, RunOptions(out=out, steps=4), LaunchSpec(world_size=2), said.append)
    return said


def test_a_failure_after_the_final_checkpoint_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said = _launch_that(tmp_path, monkeypatch, step=4)
    assert len(said) == 1 and said[0].startswith("warning: " + FAILURE)
    assert "step_" in said[0] and "completed" in said[0]


@pytest.mark.parametrize("step", [None, 2])
def test_a_failure_before_the_run_completed_fails_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int | None
) -> None:
    with pytest.raises(RanksFailed, match="SIGABRT"):
        _launch_that(tmp_path, monkeypatch, step=step)


def test_a_final_checkpoint_from_before_this_launch_proves_nothing(tmp_path: Path) -> None:
    final = _commit(tmp_path, 4, 4)
    assert completed_since(tmp_path, time.time() - 60) == final
    old = time.time() - 3600
    os.utime(final / "extra.pt", (old, old))
    assert completed_since(tmp_path, time.time() - 60) is None


def test_a_damaged_checkpoint_proves_nothing(tmp_path: Path) -> None:
    final = _commit(tmp_path, 4, 4)
    (final / "extra.pt").write_bytes(b"not a checkpoint")
    assert completed_since(tmp_path, time.time() - 60) is None


def test_the_launch_leaves_the_callers_environment_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the launch sets for its ranks (OMP_NUM_THREADS, torchrun's
    TORCHELASTIC_SIGNALS_TO_HANDLE, our launched mark) stayed set in a notebook after
    advisor.train, and every process started later (a profile's probes) ran on one thread."""
    import torch.distributed.run

    seen: dict[str, str | None] = {}

    def fake_run(args: object) -> None:
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = "SIGTERM"  # as torchrun's run() does
        seen.update(
            {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", advisor.launch.LAUNCHED_ENV)}
        )

    monkeypatch.setattr(torch.distributed.run, "run", fake_run)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGINT")
    before = dict(os.environ)
    advisor.launch.launch(LaunchSpec(world_size=2), ["train", "--steps", "1"])
    assert seen[advisor.launch.LAUNCHED_ENV] == "1" and seen["OMP_NUM_THREADS"] is not None
    assert dict(os.environ) == before
