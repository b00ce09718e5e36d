"""Children that end with the process that started them (probes', validation's, training's).

A SIGKILLed ``advisor run`` (or ``advisor recommend``: the out-of-memory killer, a closed
terminal, a scheduler) left its validation child measuring on for 30-60 s, holding the memory
and the cores the next run was to use, and a SIGKILLed ``advisor profile`` its probe child
timing on up to the probe's timeout: every isolated child (:mod:`profilers.isolate`) is in a
process group of its own, so nothing told it. Two ways, both here:

* :func:`exit_with_parent`: in a child already running Python (every isolated child calls it
  first), a daemon thread waits for the parent's end (multiprocessing's parent sentinel, a
  pipe that reads EOF when the parent dies, whatever kills it; else ``os.getppid()`` changing,
  polled) and then kills the child's process group: itself and the workers it started. Linux
  and macOS alike.
  On Linux ``PR_SET_PDEATHSIG`` (SIGKILL) also ends the child itself at once, even while a
  long native call holds the GIL (the kernel's signal then comes first; torch's DataLoader and
  compile workers watch their own parent and exit after it).
* :func:`kill_with_parent`: a ``preexec_fn`` for a child started by ``subprocess`` (the launcher
  validator's ``advisor train``): Linux ``PR_SET_PDEATHSIG`` (SIGKILL; its torchrun ranks die
  with it, advisor.launch.die_with_parent). Elsewhere a no-op: that child ends with its few
  steps, writing to a file, never to a pipe nobody reads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h
POLL_S = 0.5  # how often the watchdog looks at os.getppid() (the sentinel wakes it at once)
_WATCHED: set[int] = set()  # the pid whose watch runs (one per process; a fork's differs)
# Signal 9 by name where it has one: Windows' signal module has no SIGKILL (nor a prctl to ask,
# nor process groups to kill).
_SIGKILL: int = getattr(signal, "SIGKILL", 9)


def _prctl() -> Callable[..., int] | None:
    """Linux's ``prctl``, looked up here (a ``preexec_fn`` must not load a library in the
    forked child of a threaded process: the loader's lock may be held); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _parent_death_signal(signum: int, prctl: Callable[..., int] | None = None) -> bool:
    """Linux: ask the kernel for ``signum`` when the parent dies; False where it cannot."""
    prctl = prctl or _prctl()
    return prctl is not None and int(prctl(PR_SET_PDEATHSIG, signum)) == 0


def kill_with_parent(parent: int | None = None, signum: int | None = None) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child get ``signum`` when this process dies (Linux; a
    no-op elsewhere): SIGKILL, or SIGTERM for a training child that saves a checkpoint first
    (a tune trial, ``advisor run``'s training). Made in the parent, which names itself: a child
    whose parent died before the request exits at once."""
    parent = os.getpid() if parent is None else parent
    prctl = _prctl()  # looked up in the parent: the child only calls it
    signum = _SIGKILL if signum is None else signum

    def preexec() -> None:  # pragma: no cover - runs in the child before exec
        if prctl is None:
            return
        if _parent_death_signal(signum, prctl) and os.getppid() != parent:
            os._exit(1)  # the parent died before we asked

    return preexec


def _end_group() -> None:
    """Kill this process and, when it leads its process group (the isolated child made itself
    leader), the workers in that group with it."""
    if not hasattr(os, "killpg"):  # Windows: no process groups to kill, no SIGKILL
        os._exit(1)
    with contextlib.suppress(OSError):
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), _SIGKILL)
    os.kill(os.getpid(), _SIGKILL)


def exit_with_parent(parent: int | None = None, *, end: Callable[[], None] = _end_group) -> bool:
    """In a child process: end it (``end``: kill its group) promptly when its parent dies.

    ``parent``: the parent's pid as the parent knew it (None: ``os.getppid()`` now). Returns
    whether a watch was started: only in a multiprocessing child (not where the function was
    called in-process: a test, a benchmark), and once per process."""
    import multiprocessing

    mp_parent = multiprocessing.parent_process()
    if mp_parent is None:
        return False  # no multiprocessing parent: not a child of ours (called in-process)
    parent = os.getppid() if parent is None else parent
    if os.getpid() in _WATCHED:
        return False
    _WATCHED.add(os.getpid())
    _parent_death_signal(_SIGKILL)
    if os.getppid() != parent:
        end()  # it died before we asked
        return True
    sentinel = getattr(mp_parent, "sentinel", None)

    def watch() -> None:
        from multiprocessing.connection import wait

        while True:
            if sentinel is not None:
                try:
                    # readable at EOF: the parent's end of the pipe closed (it died)
                    gone = bool(wait([sentinel], timeout=POLL_S))
                except (OSError, ValueError):
                    gone = False
                    threading.Event().wait(POLL_S)
            else:
                threading.Event().wait(POLL_S)
                gone = False
            if gone or os.getppid() != parent:
                end()
                return

    threading.Thread(target=watch, name="advisor-exit-with-parent", daemon=True).start()
    return True
