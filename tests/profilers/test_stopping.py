"""Ctrl-C during a profile (profilers.stopping): the first asks the work to stop, and what is
running stops soon (a probe child, a fake trace, the budget's clock, an elastic launch); the
second abandons everything (KeyboardInterrupt). Before, the first Ctrl-C lost the whole profile.

Signals are sent to this process itself: ``signal.raise_signal`` runs the handler before it
returns, ``os.kill`` from another thread lets the main thread run it at its next check.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from profilers.budget import SHARES, Clock
from profilers.isolate import Isolation, run_isolated
from profilers.stopping import (
    INTERRUPTED,
    interrupted_here,
    kept_signal_handlers,
    stop_on_interrupt,
    stopped,
)

# What an elastic launch takes over (profilers.comm), and what each test puts back.
HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@pytest.fixture(autouse=True)
def python_ctrl_c() -> Iterator[None]:
    """Each test starts with Python's own Ctrl-C handler (the one stop_on_interrupt replaces)
    and leaves every handler it touched as it found it."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are set in the main thread only")
    saved = {sig: signal.getsignal(sig) for sig in HANDLED}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
        assert stopped() is None  # no stop outlives its block
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def _blocked() -> set[int]:
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


# -- stop_on_interrupt, interrupted_here, kept_signal_handlers -------------------------------------


def test_the_first_ctrl_c_asks_to_stop_and_the_second_abandons() -> None:
    calls: list[str | None] = []
    with stop_on_interrupt(lambda: calls.append(stopped())):
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        assert stopped() is None
        signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt: the work goes on, told why
        assert stopped() == INTERRUPTED == "interrupted (Ctrl-C)"
        assert calls == [INTERRUPTED]  # on_stop ran once, after the stop was recorded
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert calls == [INTERRUPTED]  # not again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert stopped() is None
    with pytest.raises(KeyboardInterrupt):  # Python's own Ctrl-C again
        signal.raise_signal(signal.SIGINT)


def test_a_second_ctrl_c_leaving_the_block_restores_the_handler_and_forgets_the_stop() -> None:
    with pytest.raises(KeyboardInterrupt), stop_on_interrupt():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert stopped() is None


def test_a_handler_the_application_installed_is_left_alone() -> None:
    seen: list[int] = []

    def own(signum: int, frame: object) -> None:
        seen.append(signum)

    signal.signal(signal.SIGINT, own)
    calls: list[int] = []
    with stop_on_interrupt(lambda: calls.append(1)):
        assert signal.getsignal(signal.SIGINT) is own
        signal.raise_signal(signal.SIGINT)
        assert seen == [signal.SIGINT]
        assert stopped() is None and calls == []
    assert signal.getsignal(signal.SIGINT) is own


def test_an_inner_block_keeps_the_outer_ones_handler_and_stop() -> None:
    outer: list[int] = []
    inner: list[int] = []
    with stop_on_interrupt(lambda: outer.append(1)):
        handler = signal.getsignal(signal.SIGINT)
        with stop_on_interrupt(lambda: inner.append(1)):
            assert signal.getsignal(signal.SIGINT) is handler
            signal.raise_signal(signal.SIGINT)
        assert (outer, inner) == ([1], [])
        assert stopped() == INTERRUPTED  # the inner block's end did not forget the stop
        assert signal.getsignal(signal.SIGINT) is handler
    assert stopped() is None


def test_outside_the_main_thread_nothing_is_installed() -> None:
    seen: dict[str, Any] = {}

    def body() -> None:
        with stop_on_interrupt():
            seen["handler"] = signal.getsignal(signal.SIGINT)
        seen["left"] = True

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == {"handler": signal.default_int_handler, "left": True}


def test_interrupted_here_is_what_a_ctrl_c_does_here() -> None:
    with pytest.raises(KeyboardInterrupt):
        interrupted_here()  # outside any stop_on_interrupt: Python's own Ctrl-C
    calls: list[int] = []
    with stop_on_interrupt(lambda: calls.append(1)):
        interrupted_here()
        assert stopped() == INTERRUPTED and calls == [1]
        with pytest.raises(KeyboardInterrupt):
            interrupted_here()  # the second time
        assert calls == [1]
    assert stopped() is None


def test_kept_signal_handlers_puts_back_what_was_replaced_inside() -> None:
    def own(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGTERM, own)
    with (
        pytest.raises(RuntimeError, match="inside"),
        kept_signal_handlers(signal.SIGINT, signal.SIGTERM),
    ):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise RuntimeError("inside")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is own


# -- the budget's clock --------------------------------------------------------------------------


def test_a_stopped_clock_has_nothing_left_for_any_phase() -> None:
    clock = Clock(100.0, None, now=lambda: 1000.0)
    first, second, *later = SHARES
    assert clock.remaining() == 100.0 and clock.share(first) > 0
    clock.stop()
    assert clock.remaining() == 0.0
    assert clock.peek(second) == 0.0
    assert clock.share(second) == 0.0
    assert clock.joint_share(*later) == 0.0


# -- probe children (profilers.isolate) ----------------------------------------------------------
# Targets run in the spawned child: top-level, so they pickle by reference.


def _mark_then_sleep(marker: str, seconds: float) -> str:
    Path(marker).write_text("started")
    time.sleep(seconds)
    return "slept"


def _sigint_blocked() -> bool:
    return signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_stopped_profile_starts_no_child(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    with stop_on_interrupt():
        interrupted_here()
        outcome = run_isolated(Isolation(timeout_s=60), _mark_then_sleep, str(marker), 0.0)
    assert (outcome.status, outcome.reason) == ("error", INTERRUPTED)
    assert outcome.exitcode is None and not marker.exists()
    # once the block is left, the same probe runs
    assert run_isolated(Isolation(timeout_s=60), _mark_then_sleep, str(marker), 0.0).ok
    assert marker.exists()


def test_ctrl_c_stops_the_child_running_now(tmp_path: Path) -> None:
    """The child sleeps for a minute, well inside its 120 s timeout; Ctrl-C comes once it
    runs (sent from another thread, as a terminal's would come)."""
    marker = tmp_path / "started"
    done = threading.Event()

    def ctrl_c_once_started() -> None:
        while not done.is_set():
            if marker.exists():
                os.kill(os.getpid(), signal.SIGINT)
                return
            done.wait(0.05)

    sender = threading.Thread(target=ctrl_c_once_started, daemon=True)
    with stop_on_interrupt():
        sender.start()
        try:
            outcome = run_isolated(
                Isolation(timeout_s=120, grace_s=5), _mark_then_sleep, str(marker), 60.0
            )
        finally:
            done.set()
            sender.join()
        assert stopped() == INTERRUPTED
    assert marker.exists()  # it was running
    assert (outcome.status, outcome.reason) == ("error", INTERRUPTED)  # not a timeout
    assert outcome.exitcode == -signal.SIGTERM  # stopped by the parent, not by the Ctrl-C
    assert outcome.run_s is None and outcome.value is None


def test_a_child_takes_ctrl_c_once_it_runs_and_the_parent_keeps_its_mask() -> None:
    """Two children: the first a process starts also starts multiprocessing's resource
    tracker, whose start unblocks SIGINT in the parent (Python 3.11), so only a later one
    inherits the mask _start blocks and shows that the child unblocks it itself."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        before = _blocked()
        outcomes = [run_isolated(Isolation(timeout_s=60), _sigint_blocked) for _ in range(2)]
        after = _blocked()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    assert [(o.status, o.value) for o in outcomes] == [("ok", False), ("ok", False)]
    assert after == before and signal.SIGUSR1 in after and signal.SIGINT not in after


def test_a_child_starts_with_ctrl_c_blocked_and_the_mask_comes_back() -> None:
    """The start (spawn's fork and exec) happens with SIGINT blocked, a mask the child
    inherits until it is in a process group of its own; the parent's mask is restored after,
    also when the start fails."""
    from profilers.isolate import _start

    class Starts:
        def __init__(self) -> None:
            self.mask: set[int] = set()

        def start(self) -> None:
            self.mask = _blocked()

    class Fails:
        def start(self) -> None:
            raise OSError("fork failed")

    before = _blocked()
    starts = Starts()
    _start(starts)  # type: ignore[arg-type]
    assert signal.SIGINT in starts.mask and signal.SIGINT not in before
    assert _blocked() == before
    with pytest.raises(OSError, match="fork failed"):
        _start(Fails())  # type: ignore[arg-type]
    assert _blocked() == before


# -- fake traces in this process (profilers.fake_kernels) ---------------------------------------


def test_a_stop_ends_a_fake_trace_at_its_next_check() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from profilers.fake_kernels import TraceOverBudget, deadline_left, fake_deadline

    mode = FakeTensorMode()
    with mode:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
        x = torch.ones(2, 4)
    with stop_on_interrupt(), fake_deadline(time.perf_counter() + 1000, "a far deadline"):
        with mode:
            model(x)  # far from the deadline: runs
            loss = model(x).sum()
        left = deadline_left()
        assert left is not None and left[0] > 0
        signal.raise_signal(signal.SIGINT)
        left = deadline_left()
        assert left is not None and left[0] < 0 and left[1] == INTERRUPTED
        with mode, pytest.raises(TraceOverBudget, match=r"stopped: interrupted \(Ctrl-C\)"):
            model(x)
        with mode, pytest.raises(TraceOverBudget, match="stopped"):
            loss.backward()  # a backward traced before the stop does not start either
        real = torch.nn.Linear(4, 4)
        real(torch.ones(2, 4)).sum().backward()  # real tensors are never stopped
    with fake_deadline(time.perf_counter() + 1000), mode:
        model(x)  # the stop ended with its block


# -- an elastic launch (profilers.comm) ----------------------------------------------------------


class _CtrlCDuringLaunch:
    """elastic_launch as torch's agent behaves on Ctrl-C (or another signal): it takes the
    signals over with a handler that raises SignalException, leaves that handler behind, and
    the signal comes while it runs."""

    sig = signal.SIGINT
    launches = 0

    def __init__(self, config: object, entrypoint: object) -> None:
        pass

    def __call__(self, *args: object) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        type(self).launches += 1

        def raise_signal_exception(signum: int, frame: object) -> None:
            raise SignalException(f"got signal: {signum}", sigval=signal.Signals(signum))

        for sig in HANDLED:
            signal.signal(sig, raise_signal_exception)
        signal.raise_signal(self.sig)


def _launch() -> Any:
    from profilers.comm import _launch_world

    return _launch_world(
        backend="gloo",
        device_type="cpu",
        world_size=2,
        collectives=("all_reduce",),
        sizes=(4096,),
        budget_s=5.0,
        timeout_s=5.0,
        num_samples=1,
    )


@pytest.fixture
def ctrl_c_launch(monkeypatch: pytest.MonkeyPatch) -> type[_CtrlCDuringLaunch]:
    import torch.distributed.launcher.api

    class Launch(_CtrlCDuringLaunch):
        pass

    monkeypatch.setattr(torch.distributed.launcher.api, "elastic_launch", Launch)
    return Launch


def test_ctrl_c_during_an_elastic_launch_stops_the_profile(
    ctrl_c_launch: type[_CtrlCDuringLaunch],
) -> None:
    """Before, the launch swallowed the Ctrl-C as a failed run and left its own handlers in
    place: the profile's Ctrl-C handler was gone for the rest of it."""
    calls: list[int] = []
    with stop_on_interrupt(lambda: calls.append(1)):
        ours = signal.getsignal(signal.SIGINT)
        run, samples = _launch()
        assert (run.status, run.reason) == ("error", INTERRUPTED)
        assert samples == []
        assert stopped() == INTERRUPTED and calls == [1]  # as if the Ctrl-C had reached it
        assert signal.getsignal(signal.SIGINT) is ours
        with pytest.raises(KeyboardInterrupt):
            _launch()  # a Ctrl-C in a launch after the stop: the second one
        assert signal.getsignal(signal.SIGINT) is ours
    assert ctrl_c_launch.launches == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_during_an_elastic_launch_outside_a_profile_is_a_keyboard_interrupt(
    ctrl_c_launch: type[_CtrlCDuringLaunch],
) -> None:
    def own(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGTERM, own)
    with pytest.raises(KeyboardInterrupt):
        _launch()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is own


def test_another_signal_during_an_elastic_launch_is_passed_on(
    ctrl_c_launch: type[_CtrlCDuringLaunch],
) -> None:
    """TERM during the launch does here what it does in this process (its handler: here one
    that records it), once the launch's handlers are gone."""
    seen: list[int] = []

    def own(signum: int, frame: object) -> None:
        seen.append(signum)

    signal.signal(signal.SIGTERM, own)
    ctrl_c_launch.sig = signal.SIGTERM
    with stop_on_interrupt():
        run, _samples = _launch()
        assert stopped() is None  # not a Ctrl-C: no stop
    assert run.status == "error"
    assert seen == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is own


def test_after_a_ctrl_c_in_one_launch_no_other_world_size_is_launched(
    ctrl_c_launch: type[_CtrlCDuringLaunch],
) -> None:
    """The probe loops over world sizes: each launch after the stop spawned ranks again (and
    a second Ctrl-C inside one abandoned the profile)."""
    from profilers.comm import probe_communication

    with stop_on_interrupt():
        result = probe_communication(
            world_sizes=(2, 3, 4), collectives=("all_reduce",), budget_s=5.0, timeout_s=5.0
        )
    assert ctrl_c_launch.launches == 1
    assert [(r.world_size, r.status, r.reason) for r in result.runs] == [
        (2, "error", INTERRUPTED),
        (3, "error", INTERRUPTED),
        (4, "error", INTERRUPTED),
    ]
