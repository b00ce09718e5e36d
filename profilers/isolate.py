"""Run one probe in a child process under a wall-clock timeout, and say how it ended.

A probe that runs out of memory, crashes or hangs must not take the profiler with it (DESIGN.md,
"Reliability bar"): :func:`run_isolated` runs a picklable top-level callable in a fresh
interpreter (multiprocessing's ``spawn`` start method: no inherited parent heap, no inherited
CUDA context, so it is safe after the parent touched CUDA) and returns an :class:`Outcome`:
``ok`` with the returned value, or ``oom`` / ``timeout`` / ``error`` with a one-line reason.

Contract:

* ``fn`` and its arguments are pickled in the parent first; if they can't be, no child starts
  and the outcome is ``error``. The result is pickled in the child; if it can't be, ``error``.
* The child makes itself the leader of a new process group before it unpickles anything, so
  workers it starts (DataLoader, torchrun-free probes) are killed with it. A worker that calls
  ``setsid()``/``setpgid()`` itself escapes that net.
* On timeout the group gets SIGTERM, then SIGKILL after ``grace_s``: the call returns within
  ``timeout_s + 2 * grace_s`` plus the time to reap.
* ``memory_limit_bytes`` caps the child's private writable memory with ``RLIMIT_DATA`` (Linux
  >= 4.7 counts anonymous mmaps in it). Not ``RLIMIT_AS``: torch reserves address space it never
  touches (a 64 MiB glibc malloc arena and an 8 MiB stack per OpenMP thread; CUDA reserves tens
  of GiB), so measured here with 16 threads a toy step had VmSize 1.9 GiB for 0.37 GiB RSS, and
  RLIMIT_AS=1.5 GiB failed a 4 MiB allocation while RLIMIT_DATA=1.5 GiB ran the step and failed
  only the 2 GiB tensor, cleanly, as "DefaultCPUAllocator: can't allocate memory". RLIMIT_DATA
  is still not RSS: it excludes shared-library text (~0.15 GiB for torch) and includes memory
  committed but not yet touched (VmData ran ~0.2 GiB above RSS). It caps host memory only; GPU
  memory is bounded by the device.
* ``env`` is applied to ``os.environ`` in the child before the callable is unpickled, so it
  reaches libraries imported then (``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES``). It is too late
  for whatever the parent's ``__main__`` module imports at top level (spawn re-imports it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import pickle
import signal
import sys
import time
import traceback as traceback_module
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

from profilers import orphans
from profilers.stopping import stopped

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

STATUSES: tuple[str, ...] = ("ok", "oom", "timeout", "error")

# Exception classes that mean "out of memory" wherever they come from: torch.OutOfMemoryError
# (torch.cuda.OutOfMemoryError is the same class) and Python's own MemoryError.
_OOM_CLASS_NAMES = frozenset({"MemoryError", "OutOfMemoryError"})
# Messages of allocator failures raised as plain RuntimeError/OSError: the CPU allocator
# ("DefaultCPUAllocator: can't allocate memory"), "CUDA error: out of memory" from cuBLAS/NCCL
# initialisation, "MPS backend out of memory", ENOMEM ("Cannot allocate memory"), std::bad_alloc.
_OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory", "bad_alloc")
_MAX_REASON_CHARS = 300

# The exit code of a child whose import of the parent's main script (``spawn`` imports it in
# every child) called the advisor again: advisor.api refuses that call there, and the child
# exits with this code rather than start a profile of its own (nested profiles, the parent's
# probes timing out, no word of why).
MAIN_REIMPORTED_EXIT = 86
MAIN_REIMPORTED = (
    "a child process imported your script and it called the advisor again (the probes run "
    "in child processes, and Python's spawn start method imports the main file in each): "
    "put the calls under 'if __name__ == \"__main__\":'"
)


class MainScriptReimported(ValueError):
    """A probe child could not start: importing the parent's main script called the advisor
    (:data:`MAIN_REIMPORTED` says the fix). Raised, not an outcome: every child would fail."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Isolation:
    """How to run a probe in a child: its time limit, memory cap, environment and threads."""

    timeout_s: float = 600.0
    memory_limit_bytes: int | None = None
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    num_threads: int | None = None
    grace_s: float = 2.0  # between SIGTERM and SIGKILL, and for a finished child to exit

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s!r}")
        if not self.grace_s > 0:
            raise ValueError(f"grace_s must be positive, got {self.grace_s!r}")
        if self.memory_limit_bytes is not None:
            if self.memory_limit_bytes < 1:
                raise ValueError(
                    f"memory_limit_bytes must be positive or None, got {self.memory_limit_bytes!r}"
                )
            if not sys.platform.startswith("linux"):
                raise ValueError(
                    "memory_limit_bytes needs Linux (it sets RLIMIT_DATA, which counts anonymous "
                    "mmaps only there): pass memory_limit_bytes=None on this platform"
                )
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be positive or None, got {self.num_threads!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "timeout_s": self.timeout_s,
            "memory_limit_bytes": self.memory_limit_bytes,
            "env": dict(self.env),
            "num_threads": self.num_threads,
            "grace_s": self.grace_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Isolation:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """How one isolated probe ended. ``value`` is the callable's result when ``status == "ok"``."""

    status: str
    reason: str = ""  # one line; empty when ok
    value: Any = None
    wall_s: float  # from the call to the child being reaped: start-up, run, teardown
    run_s: float | None = None  # inside the callable only; None if it never returned or raised
    exitcode: int | None = None  # the child's; negative = killed by that signal
    traceback: str | None = None  # the child's, when the callable raised

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}: choose one of {', '.join(STATUSES)}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, provided ``value`` is JSON-ready or has its own ``to_dict``."""
        value = self.value.to_dict() if hasattr(self.value, "to_dict") else self.value
        return {
            "status": self.status,
            "reason": self.reason,
            "value": value,
            "wall_s": self.wall_s,
            "run_s": self.run_s,
            "exitcode": self.exitcode,
            "traceback": self.traceback,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Outcome:
        """``value`` comes back as stored (a dict); the caller rebuilds its own record type."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def classify_exception(exc: BaseException) -> str:
    """``"oom"`` for any out-of-memory failure, ``"error"`` otherwise (no torch import needed)."""
    if any(klass.__name__ in _OOM_CLASS_NAMES for klass in type(exc).__mro__):
        return "oom"
    message = str(exc).lower()
    return "oom" if any(m in message for m in _OOM_MESSAGES) else "error"


def describe_exception(exc: BaseException) -> str:
    """``"TypeName: first line of the message"``, cut to a length a table cell can hold."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 1] + "…"


def run_isolated(
    isolation: Isolation, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
) -> Outcome:
    """Run ``fn(*args, **kwargs)`` in a spawned child under ``isolation``; never raises for the
    child's failures (an exception, a crash, a hang, an unpicklable callable or result). Raises
    ``MainScriptReimported`` when the child re-ran the caller's unguarded ``__main__`` script:
    every later child would do the same, so that one is the caller's to fix."""
    start = time.perf_counter()
    if (why := stopped()) is not None:  # the profile was asked to stop: no child starts
        return Outcome(status="error", reason=why, wall_s=0.0)
    try:
        payload = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # pickling can raise almost anything (TypeError, PicklingError, ...)
        return Outcome(
            status="error",
            reason=f"the probe can't be sent to a child process: {describe_exception(exc)}",
            wall_s=time.perf_counter() - start,
        )
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=_child_main,
        args=(
            sender,
            payload,
            dict(isolation.env),
            isolation.memory_limit_bytes,
            isolation.num_threads,
            os.getpid(),
        ),
        name="advisor-probe",
        daemon=False,  # a daemonic child may not start workers (DataLoader, the input probe)
    )
    try:
        _start(process)
    except Exception as exc:  # e.g. OSError: fork/exec failed
        receiver.close()
        sender.close()
        return Outcome(
            status="error",
            reason=f"the child process did not start: {describe_exception(exc)}",
            wall_s=time.perf_counter() - start,
        )
    sender.close()  # the child holds the only write end now: its death reads as EOF here
    try:
        return _collect(process, receiver, isolation, start)
    except BaseException:  # Ctrl-C or a bug here: never leave the child running
        _kill_group(process, signal.SIGKILL)
        process.join()
        raise
    finally:
        receiver.close()


def _start(process: BaseProcess) -> None:
    """Start the child with Ctrl-C blocked, a mask it inherits: while it starts up it is in
    the terminal's process group, and a Ctrl-C then interrupted its imports with a traceback of
    its own on the terminal. It unblocks Ctrl-C once in a group of its own (_child_main); a
    Ctrl-C meant for this process waits until the start is over, never lost."""
    if not hasattr(signal, "pthread_sigmask"):
        process.start()
        return
    # The first start of a process also starts multiprocessing's resource tracker, and
    # Python 3.11's unblocks SIGINT in the calling thread as it does (it does not put the mask
    # back): started first, so the mask below holds for the child.
    with contextlib.suppress(Exception):
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _collect(
    process: BaseProcess, receiver: Connection, isolation: Isolation, start: float
) -> Outcome:
    data, timed_out = _receive(process, receiver, deadline=start + isolation.timeout_s)
    if timed_out:
        _stop(process, isolation.grace_s)
    else:
        _wait_exit(process, isolation.grace_s)  # it answered or died: let it finish exiting
    _kill_group(process, signal.SIGKILL)  # stragglers (workers it started), before reaping
    process.join()
    wall_s = time.perf_counter() - start
    if timed_out and (why := stopped()) is not None:
        return Outcome(status="error", reason=why, wall_s=wall_s, exitcode=process.exitcode)
    if timed_out:
        return Outcome(
            status="timeout",
            reason=f"no result after {isolation.timeout_s:g} s",
            wall_s=wall_s,
            exitcode=process.exitcode,
        )
    if data is None and process.exitcode == MAIN_REIMPORTED_EXIT:
        raise MainScriptReimported(MAIN_REIMPORTED)  # every child would do the same
    if data is None:
        return _death_outcome(process.exitcode, isolation, wall_s)
    try:
        message = pickle.loads(data)
    except Exception as exc:
        return Outcome(
            status="error",
            reason=f"the result can't be unpickled in the parent: {describe_exception(exc)}",
            wall_s=wall_s,
            exitcode=process.exitcode,
        )
    if message[0] == "ok":
        _, value, run_s = message
        return Outcome(
            status="ok", value=value, wall_s=wall_s, run_s=run_s, exitcode=process.exitcode
        )
    _, status, reason, run_s, tb = message
    return Outcome(
        status=status,
        reason=reason,
        wall_s=wall_s,
        run_s=run_s,
        exitcode=process.exitcode,
        traceback=tb,
    )


def _receive(
    process: BaseProcess, receiver: Connection, *, deadline: float
) -> tuple[bytes | None, bool]:
    """(the child's message or None if it died without one, whether the deadline passed or
    the profile was asked to stop: :func:`profilers.stopping.stopped`)."""
    while (remaining := deadline - time.perf_counter()) > 0 and stopped() is None:
        # A short cap on each wait: a worker that inherited the child's pipes keeps them open
        # after the child dies, so the exit is also checked directly.
        ready = wait([receiver, process.sentinel], timeout=min(remaining, 0.5))
        if receiver.poll(0):
            try:
                return receiver.recv_bytes(), False
            except (EOFError, OSError):
                return None, False  # closed without a message: the child died
        if ready or _exited(process):
            return None, False
    return None, True


def _exited(process: BaseProcess) -> bool:
    """Has the child exited? Doesn't reap it: while it is unreaped its pid, and so its process
    group id, can't be reused, so signalling the group afterwards can't hit a stranger."""
    assert process.pid is not None
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # already reaped
    except (AttributeError, OSError):  # no waitid on this platform: poll, which reaps
        return process.exitcode is not None


def _reaped(process: BaseProcess) -> bool:
    assert process.pid is not None
    try:
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    except (AttributeError, OSError):
        return process.exitcode is not None
    return False


def _wait_exit(process: BaseProcess, timeout_s: float) -> bool:
    deadline = time.perf_counter() + timeout_s
    while not _exited(process):
        if time.perf_counter() >= deadline:
            return False
        wait([process.sentinel], timeout=0.05)
    return True


def _stop(process: BaseProcess, grace_s: float) -> None:
    """SIGTERM the child's group, then SIGKILL it if it is still there after ``grace_s``."""
    _kill_group(process, signal.SIGTERM)
    if not _wait_exit(process, grace_s):
        _kill_group(process, signal.SIGKILL)
        _wait_exit(process, grace_s)


def _kill_group(process: BaseProcess, sig: signal.Signals) -> None:
    pid = process.pid
    if pid is None or _reaped(process):
        return  # its pid may belong to someone else by now
    try:
        # The child made itself leader of group `pid`; if it died before doing so there is no
        # such group (ProcessLookupError) and the child alone is signalled.
        os.killpg(pid, sig)
        return
    except (ProcessLookupError, PermissionError, AttributeError):
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _death_outcome(exitcode: int | None, isolation: Isolation, wall_s: float) -> Outcome:
    if exitcode is not None and exitcode < 0:
        number = -exitcode
        if number == signal.SIGKILL:
            # Not ours: our own SIGKILL only follows a timeout, reported as such above.
            reason = f"killed by signal {number} (likely the kernel's OOM killer)"
            return Outcome(status="oom", reason=reason, wall_s=wall_s, exitcode=exitcode)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "unknown signal"
        reason = f"killed by signal {number} ({name})"
        if isolation.memory_limit_bytes is not None and number in (signal.SIGABRT, signal.SIGSEGV):
            reason += f", possibly out of memory under the {isolation.memory_limit_bytes} B limit"
    else:
        reason = f"exited with code {exitcode} before returning a result"
    return Outcome(status="error", reason=reason, wall_s=wall_s, exitcode=exitcode)


def _child_main(
    sender: Connection,
    payload: bytes,
    env: dict[str, str],
    memory_limit_bytes: int | None,
    num_threads: int | None,
    parent: int,
) -> None:
    """Runs in the child: set up, unpickle, call, send one message, exit without teardown.
    ``parent``: the pid of the process that started it, which it dies with (profilers.orphans:
    a SIGKILLed 'advisor profile' or 'advisor run' left its probe or validation child running
    on in its own process group, up to the probe's timeout)."""
    if hasattr(os, "setpgid"):
        os.setpgid(0, 0)  # before anything can start workers: they join this group
    orphans.exit_with_parent(parent)  # kills the group: the workers it starts too
    # Out of the terminal's process group now: Ctrl-C reaches the parent only, which decides
    # what becomes of this child. Until here it was blocked (_start).
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if num_threads is not None:
        env = {"OMP_NUM_THREADS": str(num_threads), "MKL_NUM_THREADS": str(num_threads), **env}
    os.environ.update(env)
    if memory_limit_bytes is not None:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        limit = (
            memory_limit_bytes if hard == resource.RLIM_INFINITY else min(hard, memory_limit_bytes)
        )
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    try:
        fn, args, kwargs = pickle.loads(payload)
        if num_threads is not None:
            import torch

            torch.set_num_threads(num_threads)
    except BaseException as exc:
        reason = f"the probe can't be unpickled in the child: {describe_exception(exc)}"
        data = _failure("error", reason, None, exc)
    else:
        begin = time.perf_counter()
        try:
            value = fn(*args, **kwargs)
        except BaseException as exc:  # everything, SystemExit and KeyboardInterrupt included
            run_s = time.perf_counter() - begin
            data = _failure(classify_exception(exc), describe_exception(exc), run_s, exc)
        else:
            run_s = time.perf_counter() - begin
            try:
                data = pickle.dumps(("ok", value, run_s), protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException as exc:
                reason = f"the result can't be pickled: {describe_exception(exc)}"
                data = _failure("error", reason, run_s, exc)
    try:
        sender.send_bytes(data)
        sender.close()
    finally:
        # Skip interpreter teardown (slow with torch, and nothing is left to lose); flush what
        # the probe printed first, and run multiprocessing's exit finalizers, which os._exit
        # skips: a semaphore the probe created (a SimpleQueue in torch's elastic launcher or in
        # inductor's compile workers) is registered with the parent's resource tracker, which
        # otherwise warns "leaked semaphore objects" when the parent exits. The result is sent
        # already: a finalizer that hangs costs the grace period, never the outcome.
        sys.stdout.flush()
        sys.stderr.flush()
        _run_exit_finalizers()
        os._exit(0)


def _run_exit_finalizers() -> None:
    try:
        from multiprocessing import util

        # What a normal exit runs first (the SemLock cleanups among them); private, so guarded.
        util._run_finalizers(0)  # type: ignore[attr-defined]
    except BaseException:  # nothing here may keep the child from exiting
        pass
    sys.stdout.flush()
    sys.stderr.flush()


def _failure(status: str, reason: str, run_s: float | None, exc: BaseException) -> bytes:
    text = "".join(traceback_module.format_exception(type(exc), exc, exc.__traceback__))
    return pickle.dumps(("raised", status, reason, run_s, text[-4000:]))


@contextlib.contextmanager
def quiet_native_output() -> Iterator[None]:
    """Send this process's stdout and stderr file descriptors to /dev/null for a while.

    For C++ chatter no Python setting turns off: torch's profiler (kineto) prints
    "USDT: profiler_start/stop" lines on every memory measurement.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)
