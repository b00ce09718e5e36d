"""Start a multi-process job through torch's own launcher (``torch.distributed.run``, torchrun).

``advisor train`` with ``world_size > 1`` re-invokes itself once per rank through torchrun: gloo
processes on a CPU machine, NCCL on GPUs, and the same code path on several nodes (``--nnodes``,
``--node-rank``, ``--rdzv-endpoint`` pass through). No home-made launcher or RPC: torchrun's
elastic agent spawns the ranks, watches them, and stops the rest when one dies.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any

from advisor.errors import AdvisorError, UsageProblem
from profilers.comm_failure import lost_a_peer
from strategies.commands import torchrun_args, torchrun_command

# Set by our launcher in every rank it starts (ranks started by a user's own torchrun lack it).
LAUNCHED_ENV = "ADVISOR_LAUNCHED"
# What torchrun's run() sets in the launching process for its agent's signal handling.
_ELASTIC_SIGNALS = "TORCHELASTIC_SIGNALS_TO_HANDLE"


class RanksFailed(AdvisorError):
    """A rank of the job failed (the message names which, how, and why)."""


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    world_size: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # HOST:PORT of the rendezvous (node 0); None: standalone
    rdzv_id: str = "advisor"
    monitor_interval_s: float = 0.5

    def __post_init__(self) -> None:
        if self.nnodes < 1 or self.world_size % self.nnodes:
            raise UsageProblem(
                f"world size {self.world_size} is not a multiple of --nnodes {self.nnodes}: each "
                "node runs the same number of ranks"
            )
        if not 0 <= self.node_rank < self.nnodes:
            raise UsageProblem(f"--node-rank {self.node_rank} must be in 0..{self.nnodes - 1}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise UsageProblem(
                "a multi-node job needs --rdzv-endpoint HOST:PORT (node 0's address, reachable "
                "from every node)"
            )
        if self.rdzv_endpoint:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise UsageProblem(
                    f"--rdzv-endpoint {self.rdzv_endpoint!r} is not HOST:PORT: name node 0's "
                    "address and a free port, e.g. --rdzv-endpoint node0.example:29500"
                )

    @property
    def nproc_per_node(self) -> int:
        return self.world_size // self.nnodes

    def torchrun_args(self) -> list[str]:
        """The launcher's own options (what goes between ``torchrun`` and ``-m advisor``).

        No ``--node-rank``: under the c10d rendezvous torchrun numbers the nodes itself and
        ignores the flag with a warning, so every node runs the same command (our
        ``--node-rank`` only names this node's settings file)."""
        return torchrun_args(
            self.nproc_per_node,
            nnodes=self.nnodes,
            node_rank=None,
            rdzv_endpoint=self.rdzv_endpoint or None,
            rdzv_id=self.rdzv_id,
        )


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def node_command(spec: LaunchSpec, advisor_args: list[str]) -> str:
    """The torchrun command this node runs (printed for multi-node jobs): the same launcher
    options on every node, as c10d gives each node its rank; ``advisor_args`` name this
    node's settings file."""
    return torchrun_command(spec.torchrun_args(), advisor_args)


def launch(spec: LaunchSpec, advisor_args: list[str]) -> None:
    """Run ``python -m advisor ADVISOR_ARGS`` on this node's ranks; raise if any rank fails."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    from profilers.comm import ELASTIC_LAUNCH_SIGNALS, quiet_elastic_logs
    from profilers.stopping import kept_signal_handlers

    argv = [
        *spec.torchrun_args(),
        f"--monitor-interval={spec.monitor_interval_s}",
        "--max-restarts=0",
        "-m",
        "advisor",
        *advisor_args,
    ]
    args = get_args_parser().parse_args(argv)
    # The variables set for the ranks (ours, OMP_NUM_THREADS, and torchrun's own
    # TORCHELASTIC_SIGNALS_TO_HANDLE) are put back as they were when the job ends: a notebook
    # calling advisor.train kept OMP_NUM_THREADS=1, and every process it started after (a
    # profile's probes) ran on one thread.
    kept = {k: os.environ.get(k) for k in (LAUNCHED_ENV, "OMP_NUM_THREADS", _ELASTIC_SIGNALS)}
    os.environ[LAUNCHED_ENV] = "1"
    # A single CPU node: split the cores between the ranks rather than oversubscribe them.
    os.environ.setdefault(
        "OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // spec.nproc_per_node))
    )
    started = time.monotonic()
    try:
        # torchrun's agent logs each failed rank at ERROR ("failed (exitcode: 2) local_rank:
        # 0 ...") and a signal at WARNING ("Received 2 death signal, shutting down workers"):
        # the failure is reported below in one line, with the rank's own message. (Quieting
        # "torch.distributed.elastic" alone did not: its modules' loggers set their own
        # level.) The agent also takes over Ctrl-C, TERM, HUP and QUIT (SignalException) and
        # leaves its handlers behind: this process's own are put back.
        with quiet_elastic_logs(), kept_signal_handlers(*ELASTIC_LAUNCH_SIGNALS):
            run(args)
    except SignalException as exc:
        # Ctrl-C or a TERM (a scheduler's stop) reached the launcher: the agent has stopped
        # the ranks. One line and 128 + the signal, not the agent's traceback and exit 1.
        raise LaunchStopped(exc.sigval) from None
    except ChildFailedError as exc:
        usage = _usage_problem(exc)
        if usage is not None:
            raise UsageProblem(usage) from None
        stopped = _stopped_by_signal(exc)
        if stopped is not None:
            raise LaunchStopped(*stopped) from None
        raise RanksFailed(_describe_failure(exc, time.monotonic() - started)) from None
    finally:
        for key, value in kept.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class LaunchStopped(AdvisorError):
    """Ctrl-C or SIGTERM stopped the job's ranks: exit 128 + the signal, one line naming how
    to go on (the ranks save a checkpoint when the signal reaches them between steps)."""

    def __init__(self, signum: int, message: str = "") -> None:
        name = signal.Signals(signum).name
        super().__init__(
            message
            or f"{name}: the job's ranks were stopped; the same command plus --resume "
            "continues from the last checkpoint saved"
        )
        self.exit_code = 128 + signum


def _stopped_by_signal(exc: object) -> tuple[int, str] | None:
    """(the signal, the rank's message) when the ranks stopped because Ctrl-C or SIGTERM
    reached them (the trainer exits 128 + the signal after its checkpoint: TrainingInterrupted),
    else None."""
    root = _root_failure(exc)
    if root is None:
        return None
    _, failure, message = root
    signum = failure.exitcode - 128
    if signum not in (signal.SIGINT, signal.SIGTERM):
        return None
    return signum, message


def launched_rank() -> bool:
    """This process is a rank of :func:`launch`, whose launcher reports the rank's error."""
    return under_torchrun() and os.environ.get(LAUNCHED_ENV) == "1"


def _usage_problem(exc: object) -> str | None:
    """The message of a rank refused for bad usage (exit 2, as the CLI exits on it): the
    launch is refused with it too, exit 2, not as a failed job."""
    root = _root_failure(exc)
    if root is None:
        return None
    _, failure, message = root
    return message if failure.exitcode == 2 and message else None


def _root_failure(exc: object) -> tuple[int, Any, str] | None:
    """The rank that failed first, its failure and its own one-line message ("" if none)."""
    failures = getattr(exc, "failures", {}) or {}
    if not failures:
        return None

    # The root cause, not its echoes: the agent stops the surviving ranks with SIGTERM, and a
    # rank whose peer vanished fails with "connection reset"; timestamps are whole seconds.
    def echo(failure: Any) -> bool:
        text = failure.message if isinstance(failure.message, str) else ""
        return failure.exitcode == -signal.SIGTERM or lost_a_peer(text)

    rank, failure = min(failures.items(), key=lambda kv: (echo(kv[1]), kv[1].timestamp, kv[0]))
    message = failure.message if isinstance(failure.message, str) else ""
    if "To enable traceback" in message or message.startswith("Signal"):
        message = ""  # torchrun's placeholder, not the rank's reason
    return rank, failure, " ".join(message.split())


def _describe_failure(exc: object, elapsed_s: float) -> str:
    """One line: which rank failed first, how, and why (its own message when it left one)."""
    failures = getattr(exc, "failures", {}) or {}
    root = _root_failure(exc)
    if root is None:
        return f"the distributed job failed after {elapsed_s:.0f}s"
    rank, failure, message = root
    code = failure.exitcode
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    reason = f": {message}" if message else ""
    others = len(failures) - 1
    tail = f" ({others} other rank(s) stopped with it)" if others else ""
    return f"rank {rank} {how} after {elapsed_s:.0f}s{reason}{tail}"


def write_rank_error(message: str) -> None:
    """Leave this rank's one-line error where torchrun's agent looks for it."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or not under_torchrun():
        return
    # The plain form torchrun's ProcessFailure reads: a string message and a timestamp.
    payload = {"message": message, "timestamp": int(time.time())}
    try:
        with open(path, "w") as f:
            json.dump(payload, f)
    except OSError:
        pass


def die_with_parent() -> None:
    """Linux: make this rank die when the launcher dies (even by SIGKILL), never linger."""
    if os.environ.get(LAUNCHED_ENV) != "1" or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        return
    if os.getppid() == 1:  # the launcher died before we asked
        os._exit(1)
