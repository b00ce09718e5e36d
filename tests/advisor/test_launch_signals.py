"""Ctrl-C or SIGTERM on a multi-process ``advisor train``: torchrun's agent raised its
SignalException through the launcher (a 50-line traceback, exit 1) and left its own signal
handlers behind; ranks that stopped on the signal (exit 128 + it, a checkpoint saved) read as a
failed job. Now: one line naming --resume, exit 128 + the signal, the handlers put back."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace
from typing import Any

import pytest

from advisor.launch import LaunchSpec, LaunchStopped, _stopped_by_signal, launch


def failures(*codes: int, message: str = "") -> SimpleNamespace:
    return SimpleNamespace(
        failures={
            rank: SimpleNamespace(exitcode=code, message=message, timestamp=0)
            for rank, code in enumerate(codes)
        }
    )


def test_ranks_that_stopped_on_a_signal_are_a_stop_not_a_failure() -> None:
    saved = "SIGINT: stopped after step 22, checkpoint saved in RUN; continue with --resume"
    assert _stopped_by_signal(failures(130, 130, message=saved)) == (signal.SIGINT, saved)
    assert _stopped_by_signal(failures(143)) == (signal.SIGTERM, "")
    assert _stopped_by_signal(failures(1)) is None  # a rank's own error
    assert _stopped_by_signal(failures(-9)) is None  # killed from outside
    stop = LaunchStopped(signal.SIGTERM)
    assert stop.exit_code == 143
    assert str(stop) == (
        "SIGTERM: the job's ranks were stopped; the same command plus --resume continues from "
        "the last checkpoint saved"
    )
    assert str(LaunchStopped(signal.SIGINT, saved)) == saved


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_at_the_agent_is_one_line_and_its_handlers_do_not_stay(
    monkeypatch: pytest.MonkeyPatch, sig: signal.Signals
) -> None:
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException

    def agent(args: Any) -> None:  # what torchrun's agent does on a signal
        for taken in (signal.SIGINT, signal.SIGTERM):
            signal.signal(taken, lambda *_: None)
        raise SignalException(f"Process 1 got signal: {sig}", sigval=sig)

    monkeypatch.setattr(torchrun, "run", agent)
    # launch() sets OMP_NUM_THREADS for the ranks when unset: undone after the test
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(LaunchStopped) as info:
        launch(LaunchSpec(world_size=2), ["train", "--steps", "1"])
    assert info.value.exit_code == 128 + sig
    assert str(info.value).startswith(f"{sig.name}: the job's ranks were stopped")
    assert {s: signal.getsignal(s) for s in before} == before
