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


def test_a_rank_whose_peer_died_exits_without_its_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kill -9 of one rank: the other's gloo traceback (50 lines, 'Connection closed by peer')
    came before the launcher's one line naming the killed rank. Ranks our launcher started
    now exit 1 quietly on it; ranks started by hand keep their traceback."""
    from advisor.cli import _lost_a_peer

    gone = RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [::1]:1")
    assert not _lost_a_peer(gone)  # not a rank of ours
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    assert not _lost_a_peer(gone)  # a rank a user's own torchrun started
    monkeypatch.setenv("ADVISOR_LAUNCHED", "1")
    assert _lost_a_peer(gone)
    assert not _lost_a_peer(ValueError("a bug of its own"))
