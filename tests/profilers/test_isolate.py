from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from profilers.isolate import (
    Isolation,
    Outcome,
    classify_exception,
    describe_exception,
    run_isolated,
)

# Targets run in the spawned child: top-level, so they pickle by reference.


def _add(a: int, b: int, *, scale: int = 1) -> int:
    return (a + b) * scale


def _raise_value_error() -> None:
    raise ValueError("bad probe\nsecond line")


def _raise_memory_error() -> None:
    raise MemoryError("simulated")


def _hang() -> None:
    time.sleep(300)


def _hang_ignoring_sigterm(ready: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(ready).write_text("ignoring SIGTERM")
    time.sleep(300)


def _hang_with_worker(pid_file: str) -> None:
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    Path(pid_file).write_text(str(worker.pid))
    time.sleep(300)


def _segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def _exit_abruptly() -> None:
    os._exit(3)


def _sigkill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _allocate_python(num_bytes: int) -> int:
    return len(bytearray(num_bytes))


def _allocate_torch(num_bytes: int) -> int:
    import torch

    x = torch.empty(num_bytes, dtype=torch.uint8)
    x.fill_(1)
    return int(x.numel())


def _unpicklable_result() -> object:
    return threading.Lock()


def _environment() -> tuple[str | None, str | None, int]:
    import torch

    return (
        os.environ.get("ADVISOR_TEST_FLAG"),
        os.environ.get("OMP_NUM_THREADS"),
        (torch.get_num_threads()),
    )


_KEPT: list[object] = []


def _keep_a_queue() -> int:
    """What torch's elastic launcher and inductor's workers do: a spawn-context SimpleQueue (two
    named semaphores, registered with the parent's resource tracker) alive at the end."""
    import multiprocessing

    _KEPT.append(multiprocessing.get_context("spawn").SimpleQueue())
    return 1


def test_ok_returns_value_and_times() -> None:
    outcome = run_isolated(Isolation(timeout_s=60), _add, 2, 3, scale=10)
    assert outcome.status == "ok" and outcome.ok
    assert outcome.value == 50
    assert outcome.reason == ""
    assert outcome.exitcode == 0
    assert outcome.run_s is not None and outcome.wall_s >= outcome.run_s


def test_exception_is_an_error_with_a_one_line_reason() -> None:
    outcome = run_isolated(Isolation(timeout_s=60), _raise_value_error)
    assert outcome.status == "error"
    assert outcome.reason == "ValueError: bad probe"
    assert outcome.traceback is not None and "_raise_value_error" in outcome.traceback
    assert outcome.value is None


def test_memory_error_is_oom() -> None:
    outcome = run_isolated(Isolation(timeout_s=60), _raise_memory_error)
    assert outcome.status == "oom"
    assert outcome.reason == "MemoryError: simulated"


def test_hang_is_killed_as_timeout() -> None:
    outcome = run_isolated(Isolation(timeout_s=1, grace_s=1), _hang)
    assert outcome.status == "timeout"
    assert outcome.reason == "no result after 1 s"
    assert outcome.exitcode == -signal.SIGTERM


def test_hang_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    # A child still starting when the timeout came (a loaded host: its spawn took over 1 s)
    # had not yet ignored SIGTERM, and SIGTERM ended it: a longer timeout, until it had.
    for timeout_s in (1, 4, 16):
        ready = tmp_path / f"ready-{timeout_s}"
        isolation = Isolation(timeout_s=timeout_s, grace_s=0.5)
        outcome = run_isolated(isolation, _hang_ignoring_sigterm, str(ready))
        assert outcome.status == "timeout"  # our own SIGKILL is not mistaken for the OOM killer
        if ready.exists():
            break
    assert outcome.exitcode == -signal.SIGKILL


def test_timeout_kills_the_workers_of_the_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "worker.pid"
    outcome = run_isolated(Isolation(timeout_s=3, grace_s=1), _hang_with_worker, str(pid_file))
    assert outcome.status == "timeout"
    worker = int(pid_file.read_text())
    # The worker was our grandchild; once killed it is reparented and reaped by init.
    for _ in range(100):
        if not _alive(worker):
            break
        time.sleep(0.05)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.parametrize(
    ("target", "status", "reason"),
    [
        (_segfault, "error", "killed by signal 11 (SIGSEGV)"),
        (_exit_abruptly, "error", "exited with code 3 before returning a result"),
        (_sigkill_self, "oom", "killed by signal 9 (likely the kernel's OOM killer)"),
    ],
)
def test_crash_is_reported(target: object, status: str, reason: str) -> None:
    outcome = run_isolated(Isolation(timeout_s=60), target)  # type: ignore[arg-type]
    assert (outcome.status, outcome.reason) == (status, reason)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA is Linux-only")
def test_memory_limit_turns_a_big_python_allocation_into_oom() -> None:
    isolation = Isolation(timeout_s=60, memory_limit_bytes=256 * 2**20)
    assert run_isolated(isolation, _allocate_python, 2**30).status == "oom"
    assert run_isolated(isolation, _allocate_python, 2**20).value == 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA is Linux-only")
def test_memory_limit_turns_a_big_tensor_into_oom() -> None:
    isolation = Isolation(timeout_s=120, memory_limit_bytes=1024 * 2**20)
    outcome = run_isolated(isolation, _allocate_torch, 2 * 2**30)
    assert outcome.status == "oom"
    assert "DefaultCPUAllocator: can't allocate memory" in outcome.reason


def test_unpicklable_callable_starts_no_child() -> None:
    outcome = run_isolated(Isolation(timeout_s=60), lambda: 1)
    assert outcome.status == "error"
    assert outcome.reason.startswith("the probe can't be sent to a child process: ")
    assert outcome.exitcode is None


def test_unpicklable_argument_is_an_error() -> None:
    outcome = run_isolated(Isolation(timeout_s=60), _add, threading.Lock(), 1)
    assert outcome.status == "error"
    assert "can't be sent" in outcome.reason


def test_unpicklable_result_is_an_error() -> None:
    outcome = run_isolated(Isolation(timeout_s=60), _unpicklable_result)
    assert outcome.status == "error"
    assert outcome.reason.startswith("the result can't be pickled: TypeError")


def test_env_and_threads_reach_the_child() -> None:
    isolation = Isolation(timeout_s=120, env={"ADVISOR_TEST_FLAG": "on"}, num_threads=1)
    outcome = run_isolated(isolation, _environment)
    assert outcome.value == ("on", "1", 1)
    assert "ADVISOR_TEST_FLAG" not in os.environ


def test_outcome_round_trips_through_json() -> None:
    outcome = Outcome(status="oom", reason="MemoryError", wall_s=1.5, run_s=0.5, exitcode=0)
    data = json.loads(json.dumps(outcome.to_dict()))
    assert Outcome.from_dict(data) == outcome
    assert set(data) == {"status", "reason", "value", "wall_s", "run_s", "exitcode", "traceback"}


def test_outcome_to_dict_uses_the_value_records_to_dict() -> None:
    value = Isolation(timeout_s=5)
    assert Outcome(status="ok", value=value, wall_s=1.0).to_dict()["value"] == value.to_dict()


def test_invalid_isolation_is_rejected() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        Isolation(timeout_s=0)
    with pytest.raises(ValueError, match="unknown status"):
        Outcome(status="crashed", wall_s=0.0)


def test_classify_exception() -> None:
    import torch

    assert classify_exception(MemoryError()) == "oom"
    assert classify_exception(torch.OutOfMemoryError("CUDA out of memory. Tried ...")) == "oom"
    assert classify_exception(torch.cuda.OutOfMemoryError("x")) == "oom"
    cpu = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 2147483648 bytes. Error code 12 (Cannot allocate memory)"
    )
    assert classify_exception(cpu) == "oom"
    assert classify_exception(RuntimeError("CUDA error: out of memory")) == "oom"
    assert classify_exception(OSError(12, "Cannot allocate memory")) == "oom"
    assert classify_exception(RuntimeError("shape mismatch")) == "error"
    assert classify_exception(KeyboardInterrupt()) == "error"


def test_describe_exception_is_one_bounded_line() -> None:
    assert describe_exception(ValueError("")) == "ValueError"
    long = describe_exception(RuntimeError("x" * 1000 + "\nmore"))
    assert "\n" not in long and len(long) <= 300 and long.endswith("…")


def test_semaphores_a_probe_keeps_are_cleaned_up_without_a_leak_warning() -> None:
    # The warning comes from the parent's resource tracker when the parent exits, so the parent
    # is a fresh interpreter here.
    script = (
        "from profilers.isolate import Isolation, run_isolated\n"
        "from tests.profilers.test_isolate import _keep_a_queue\n"
        "if __name__ == '__main__':\n"
        "    print(run_isolated(Isolation(timeout_s=60), _keep_a_queue).status)\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    assert "leaked semaphore" not in done.stderr, done.stderr
