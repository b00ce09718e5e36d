"""Communication probe: collective bandwidth and latency per backend and world size.

For each world size, one launch through torch's own elastic launcher
(``torch.distributed.launcher.api.elastic_launch``; c10d rendezvous on 127.0.0.1, the port picked
by the OS) starts the ranks, which time ``all_reduce``, ``all_gather``, ``reduce_scatter`` and
``broadcast`` over growing message sizes (:mod:`profilers.comm_worker`). The parent turns their
samples into nccl-tests bandwidths and an alpha-beta fit per collective
(:mod:`profilers.comm_records`).

Bounded in time three ways: sizes stop growing when the budget share of a launch is spent; every
collective runs under the process group's timeout, so a rank stuck in (or never reaching) a
collective makes its peers fail; a dead rank makes the launcher stop the others (no restarts);
and each rank exits on its own after a hard deadline (faulthandler) whatever it is doing. A launch
that fails becomes a :class:`CommRun` with status ``error``/``timeout`` and a reason, keeping the
samples measured before it failed.

On this 2-vCPU machine one gloo launch of 2 ranks costs ~2.5-3 s before the first collective
(two ``import torch`` on two cores, rendezvous, process group); see ``CommRun.launch_overhead_s``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from profilers.comm_failure import diagnose_failure
from profilers.comm_records import (
    COLLECTIVES,
    CommFit,
    CommProfile,
    CommRun,
    CommSample,
    algorithm_bandwidth_GBps,
    bus_bandwidth_factor,
    fit_alpha_beta,
    predict_collective_time,
)
from profilers.stopping import INTERRUPTED, interrupted_here, kept_signal_handlers, stopped

# What an elastic launch takes over (LaunchConfig.signals_to_handle's default): the probe's launch
# and advisor's own launcher keep their handlers across it.
ELASTIC_LAUNCH_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)

__all__ = [
    "COLLECTIVES",
    "CommFit",
    "CommProfile",
    "CommRun",
    "CommSample",
    "algorithm_bandwidth_GBps",
    "available_world_sizes",
    "bus_bandwidth_factor",
    "fit_alpha_beta",
    "message_sizes",
    "predict_collective_time",
    "probe_communication",
]

KiB = 1024
MiB = 1024 * KiB
DEFAULT_MAX_BYTES = {"cpu": 64 * MiB, "cuda": 512 * MiB}
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
Progress = Callable[[str], None]


def available_world_sizes(
    device_type: str = "cpu", *, max_world_size: int | None = None
) -> tuple[int, ...]:
    """World sizes worth probing here: 2, 4, 8, ... up to the limit, plus the limit itself.

    CUDA: the limit is the number of local GPUs (one rank per GPU), capped by ``max_world_size``.
    CPU: 2 when the host has at least two cores; ``max_world_size`` asks for more (ranks then
    share cores, and the numbers say more about the scheduler than about the transport).
    """
    if device_type == "cuda":
        import torch

        num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        limit = num_gpus if max_world_size is None else min(num_gpus, max_world_size)
    elif device_type == "cpu":
        num_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        default = 2 if num_cores >= 2 else 0
        limit = default if max_world_size is None else max_world_size
    else:
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    sizes = []
    size = 2
    while size <= limit:
        sizes.append(size)
        size *= 2
    if limit >= 2 and limit not in sizes:
        sizes.append(limit)
    return tuple(sizes)


def message_sizes(
    min_bytes: int, max_bytes: int, world_size: int, growth: int = 4
) -> tuple[int, ...]:
    """Sizes from ``min_bytes`` to ``max_bytes`` growing ``growth``-fold, each a multiple of
    4 * world_size bytes (float32 elements that split evenly across ranks for all_gather /
    reduce_scatter shards).

    Fourfold by default: 4 KiB to 64 MiB in 8 sizes rather than 15, so a small time budget on a
    slow host still reaches the MiB sizes that pin down the bandwidth (the latency comes from
    the smallest ones); the alpha-beta fit needs the spread, not the density.
    """
    quantum = 4 * world_size
    sizes: list[int] = []
    size = min_bytes
    while size <= max_bytes:
        rounded = max(quantum, size // quantum * quantum)
        if not sizes or rounded > sizes[-1]:
            sizes.append(rounded)
        size *= growth
    return tuple(sizes)


def probe_communication(
    *,
    world_sizes: Sequence[int] | None = None,
    backend: str = "auto",
    device_type: str = "cpu",
    collectives: Sequence[str] = COLLECTIVES,
    min_bytes: int = 4 * KiB,
    max_bytes: int | None = None,
    budget_s: float = 25.0,
    timeout_s: float = 60.0,
    num_warmup: int = 2,
    num_samples: int = 5,
    progress: Progress | None = None,
) -> CommProfile:
    """Measure collectives for each world size; one launch per world size, run one after another.

    ``world_sizes=None`` probes :func:`available_world_sizes`. ``backend="auto"`` is gloo on CPU,
    NCCL on CUDA. ``max_bytes`` defaults to 64 MiB on CPU, 512 MiB on CUDA; sizes also stop at
    ~1/6 of free device memory (host memory shared by the ranks on CPU) and when the launch's
    share of ``budget_s`` (wall time, launches included) would be exceeded — at least two sizes
    are always measured so every collective gets a fit. ``timeout_s`` bounds any one collective
    (process-group timeout). ``progress`` receives one line of text per event, from a helper
    thread, while the ranks run.

    Ranks are started with the ``spawn`` method, which re-imports the caller's ``__main__``: a
    script calling this must do so under ``if __name__ == "__main__":`` (console scripts and
    pytest already do).
    """
    backend = _check_args(
        world_sizes=world_sizes,
        backend=backend,
        device_type=device_type,
        collectives=collectives,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        budget_s=budget_s,
        timeout_s=timeout_s,
        num_samples=num_samples,
    )
    sizes_to_probe = (
        tuple(world_sizes) if world_sizes is not None else available_world_sizes(device_type)
    )
    limit = max_bytes if max_bytes is not None else DEFAULT_MAX_BYTES[device_type]
    deadline = time.time() + budget_s
    samples: list[CommSample] = []
    runs: list[CommRun] = []
    for position, world_size in enumerate(sizes_to_probe):
        if (why := stopped()) is not None:  # Ctrl-C: no launch starts after it
            runs.append(
                CommRun(
                    backend=backend,
                    device_type=device_type,
                    world_size=world_size,
                    status="error",
                    reason=why,
                )
            )
            continue
        share = max(0.0, deadline - time.time()) / (len(sizes_to_probe) - position)
        run, run_samples = _launch_world(
            backend=backend,
            device_type=device_type,
            world_size=world_size,
            collectives=tuple(collectives),
            sizes=message_sizes(min_bytes, limit, world_size),
            budget_s=share,
            timeout_s=timeout_s,
            num_warmup=num_warmup,
            num_samples=num_samples,
            progress=progress,
        )
        runs.append(run)
        samples.extend(run_samples)
    return CommProfile(samples=tuple(samples), fits=fit_alpha_beta(samples), runs=tuple(runs))


def _check_args(
    *,
    world_sizes: Sequence[int] | None,
    backend: str,
    device_type: str,
    collectives: Sequence[str],
    min_bytes: int,
    max_bytes: int | None,
    budget_s: float,
    timeout_s: float,
    num_samples: int,
) -> str:
    """Validate once, up front; return the concrete backend."""
    if device_type not in BACKENDS:
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    if backend == "auto":
        backend = BACKENDS[device_type]
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and device_type != "cuda":
        raise ValueError("the nccl backend needs CUDA tensors: use device_type='cuda' or gloo")
    unknown = sorted(set(collectives) - set(COLLECTIVES))
    if unknown or not collectives:
        raise ValueError(f"collectives must be among {', '.join(COLLECTIVES)}, got {unknown}")
    if world_sizes is not None and any(n < 2 for n in world_sizes):
        raise ValueError(f"world sizes must be at least 2 (got {list(world_sizes)})")
    if min_bytes < 1 or (max_bytes is not None and max_bytes < min_bytes):
        raise ValueError(f"need 1 <= min_bytes <= max_bytes, got {min_bytes} and {max_bytes}")
    if budget_s <= 0 or timeout_s <= 0 or num_samples < 1:
        raise ValueError("budget_s and timeout_s must be positive and num_samples at least 1")
    if device_type == "cuda" and world_sizes:
        import torch

        num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if max(world_sizes) > num_gpus:
            raise ValueError(
                f"world size {max(world_sizes)} needs one GPU per rank but {num_gpus} are "
                "visible: ask for at most that many, or probe gloo on CPU"
            )
    return backend


def _launch_world(
    *,
    backend: str,
    device_type: str,
    world_size: int,
    collectives: tuple[str, ...],
    sizes: tuple[int, ...],
    budget_s: float,
    timeout_s: float,
    num_warmup: int = 2,
    num_samples: int = 5,
    progress: Progress | None = None,
    fault: tuple[str, int] | None = None,
) -> tuple[CommRun, list[CommSample]]:
    """One elastic launch of ``world_size`` local ranks; never raises for a failed rank."""
    from torch.distributed.elastic.multiprocessing.api import (
        DefaultLogsSpecs,
        SignalException,
        Std,
    )
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from profilers.comm_worker import WorkerSpec, run_worker

    workdir = Path(tempfile.mkdtemp(prefix="advisor-comm-"))
    results_path = workdir / "results.jsonl"
    results_path.touch()
    started = time.time()
    spec = WorkerSpec(
        backend=backend,
        device_type=device_type,
        collectives=collectives,
        sizes=sizes,
        launch_started_unix=started,
        deadline_unix=started + budget_s,
        # Launch + budget + one stuck collective, with slack for the sizes in flight.
        hard_timeout_s=budget_s + 2 * timeout_s + 30.0,
        timeout_s=timeout_s,
        results_path=str(results_path),
        num_warmup=num_warmup,
        num_samples=num_samples,
        fault=fault,
    )
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=world_size,
        run_id=f"advisor-comm-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        # Port 0: the rendezvous store binds a port the OS knows is free (no probe-then-bind race).
        rdzv_endpoint="127.0.0.1:0",
        rdzv_configs={"join_timeout": int(timeout_s) + 30},
        local_addr="127.0.0.1",
        max_restarts=0,  # a failed rank is a result to report, not something to retry
        monitor_interval=0.1,
        start_method="spawn",
        # Rank output (warnings, a faulthandler dump) goes to files we read for the reason.
        logs_specs=DefaultLogsSpecs(log_dir=str(workdir / "logs"), redirects=Std.ALL),
    )
    status, reason = "ok", ""
    signalled: signal.Signals | None = None
    try:
        # The launch takes over Ctrl-C, TERM, HUP and QUIT (it raises SignalException) and
        # leaves its handlers behind: a Ctrl-C after it was swallowed as a failed rank, and
        # the profile's own Ctrl-C handler (profilers.stopping) was gone for the rest.
        with (
            _ResultTail(results_path, progress) as tail,
            quiet_elastic_logs(),
            kept_signal_handlers(*ELASTIC_LAUNCH_SIGNALS),
        ):
            try:
                elastic_launch(config, run_worker)(spec)
            except ChildFailedError as error:
                status, reason = diagnose_failure(error, workdir / "logs")
            except SignalException as error:  # the ranks are stopped: pass the signal on
                signalled = error.sigval
                status = "error"
                reason = (
                    INTERRUPTED if signalled == signal.SIGINT else f"stopped by {signalled.name}"
                )
            except Exception as error:  # rendezvous or launcher failure: report, don't raise
                status, reason = "error", f"{type(error).__name__}: {error}"[:500]
        events = tail.events
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if signalled == signal.SIGINT:
        interrupted_here()  # the profile's stop, as if the Ctrl-C had reached it
    elif signalled is not None:
        signal.raise_signal(signalled)  # what it does here (TERM: the end of the process)
    return _summarise(
        events,
        backend=backend,
        device_type=device_type,
        world_size=world_size,
        status=status,
        reason=reason,
        wall_s=time.time() - started,
    )


def _summarise(
    events: list[dict[str, Any]],
    *,
    backend: str,
    device_type: str,
    world_size: int,
    status: str,
    reason: str,
    wall_s: float,
) -> tuple[CommRun, list[CommSample]]:
    samples = [CommSample.from_dict(e) for e in events if e.get("kind") == "sample"]
    init = next((e for e in events if e.get("kind") == "init"), {})
    end = next((e for e in events if e.get("kind") == "end"), {})
    if status == "ok" and not end:
        status, reason = "error", "the ranks exited without finishing (no end record)"
    run = CommRun(
        backend=backend,
        device_type=device_type,
        world_size=world_size,
        status=status,
        reason=reason,
        wall_s=wall_s,
        launch_overhead_s=init.get("launch_overhead_s"),
        init_process_group_s=init.get("init_process_group_s"),
        stopped_by=str(end.get("stopped_by", "")),
        max_bytes_measured=max((s.bytes for s in samples if s.status == "ok"), default=0),
        num_samples=len(samples),
    )
    return run, samples


class _ResultTail:
    """Reads rank 0's JSON lines while the launch runs (for progress) and once more at the end."""

    def __init__(self, path: Path, progress: Progress | None) -> None:
        self._path = path
        self._progress = progress
        self._offset = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="comm-probe-tail", daemon=True)
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> _ResultTail:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._read_new()

    def _poll(self) -> None:
        while not self._stop.wait(0.2):
            self._read_new()

    def _read_new(self) -> None:
        with open(self._path) as results:
            results.seek(self._offset)
            chunk = results.read()
        complete, _, _partial = chunk.rpartition("\n")  # a line being written waits its turn
        if not complete:
            return
        self._offset += len(complete.encode()) + 1
        for line in complete.splitlines():
            event = json.loads(line)
            self.events.append(event)
            if self._progress is not None:
                self._progress(_describe(event))


def _describe(event: dict[str, Any]) -> str:
    kind = event.get("kind")
    if kind == "init":
        return f"ranks ready after {event['launch_overhead_s']:.2f} s (spawn + rendezvous)"
    if kind == "end":
        return f"done (sizes stopped by {event['stopped_by']})"
    sample = CommSample.from_dict(event)
    head = f"{sample.backend} x{sample.world_size} {sample.collective}"
    if sample.status != "ok":
        return f"{head}: {sample.status} ({sample.reason})"
    return f"{head} {sample.bytes / MiB:.3g} MiB: busbw {sample.busbw_GBps:.3g} GB/s"


_LAUNCHER_LOGGERS = (
    "torch.distributed.elastic",
    "torch.distributed.launcher",
    "torch.multiprocessing",
    "torchelastic",
)


@contextlib.contextmanager
def quiet_elastic_logs() -> Iterator[None]:
    """Silence the launcher's own logging (a failed rank is our result, not the user's error)."""
    loggers = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name.startswith(_LAUNCHER_LOGGERS)
    ]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
