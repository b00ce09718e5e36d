"""A profile stopped by Ctrl-C keeps what it measured.

A profile runs for minutes (``--budget-s``) and its probes are independent: when the user
presses Ctrl-C, what has finished is worth keeping. Inside :func:`stop_on_interrupt` the first
Ctrl-C does not raise: it marks the profile stopped (:func:`stopped` names why), the probe child
running now is stopped (:func:`profilers.isolate.run_isolated` checks it twice a second), no
other child starts, a fake trace in this process stops at its next check
(:mod:`profilers.fake_kernels`), and the budget's clock reads nothing left, so every phase not
finished records its probes as skipped and the profile ends within seconds with what was
measured. A second Ctrl-C raises :class:`KeyboardInterrupt` at once (abandon everything).

Only the main thread can take signals, and only Python's default Ctrl-C handler is replaced: an
application that installed its own keeps it (and the first Ctrl-C then does whatever it does).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

# The reason of a probe a Ctrl-C kept from finishing (a skipped row), and the detail advisor run
# records for a stage Ctrl-C stopped. Imports nothing of the project's: records may use it.
INTERRUPTED = "interrupted (Ctrl-C)"

# Why the profile running in this process was asked to stop; empty while it was not (a list:
# no global rebinding).
_STOPPED: list[str] = []
# The Ctrl-C handlers of the stop_on_interrupt blocks this process is in, innermost last.
_HANDLERS: list[Callable[[int, object], None]] = []


def stopped() -> str | None:
    """Why the profile running in this process was asked to stop, or None."""
    return _STOPPED[0] if _STOPPED else None


@contextlib.contextmanager
def stop_on_interrupt(on_stop: Callable[[], None] = lambda: None) -> Iterator[None]:
    """While inside, the first Ctrl-C asks the work to stop (``on_stop`` then runs, in the
    signal handler: keep it short) and the second raises :class:`KeyboardInterrupt`.
    Leaving restores the previous handler and forgets the stop."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return

    def handler(signum: int, frame: object) -> None:
        if _STOPPED:
            raise KeyboardInterrupt
        _STOPPED.append(INTERRUPTED)
        on_stop()

    previous = signal.signal(signal.SIGINT, handler)
    _HANDLERS.append(handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _HANDLERS.pop()
        _STOPPED.clear()


def interrupted_here() -> None:
    """What a Ctrl-C does here, for code that took Ctrl-C over for a while and caught it (an
    elastic launch installs a handler of its own): inside :func:`stop_on_interrupt` the stop
    (or, the second time, :class:`KeyboardInterrupt`), elsewhere :class:`KeyboardInterrupt`."""
    if not _HANDLERS:
        raise KeyboardInterrupt
    _HANDLERS[-1](signal.SIGINT, None)


@contextlib.contextmanager
def kept_signal_handlers(*signals: signal.Signals) -> Iterator[None]:
    """Put back the handlers of ``signals`` on leaving (in the main thread; elsewhere none can
    be set): for code that replaces them and leaves its own behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.getsignal(sig) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(sig, handler)
