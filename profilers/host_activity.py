"""How much of the host's CPU time others took while we measured something.

A short timing on a shared host measures the moment as much as the config: in the 12th regret
session one config's validation read 4x slower than the same config's `advisor train` runs,
while the host's load average stood at 2.6-3.6 on 2 vCPUs; on a quiet host the two
instruments agree within 0.90-1.17x (benchmarks/validation_agreement.py). The load average
cannot tell whose work that was (our own child is most of it). This meter can: over a window,
the busy CPU time (Linux ``/proc/stat``) of the CPUs this process may run on (its affinity)
minus the CPU time this process and its reaped children spent (``os.times``), plus the time a
hypervisor gave those vCPUs to someone else (``steal``), over the window's wall time × those
CPUs. 0: nobody else ran; 0.5: others took half of them.

Children count once they are reaped (``wait``): an isolated child joined, ``subprocess.run``,
torchrun's ranks waited for by torchrun. A child still running when the window closes counts
as someone else's work, so the meter closes after the work it measures has been waited for.
Where ``/proc/stat`` cannot be read (macOS, Windows) the meter reports nothing.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True, slots=True)
class HostActivity:
    """Over one window: ``others_share`` = (others' CPU time + steal) / (wall × cpus), in
    [0, 1]; ``steal_share`` its hypervisor part."""

    wall_s: float
    cpus: int
    others_share: float
    steal_share: float


@dataclass(frozen=True, slots=True)
class _Counters:
    busy_s: float  # user + nice + system + irq + softirq over the CPUs counted
    steal_s: float
    cpus: int


def read_counters(path: Path = PROC_STAT, allowed: set[int] | None = None) -> _Counters | None:
    """The CPU counters in seconds of the CPUs this process may run on (``allowed``; default
    its affinity, where the platform has one): others' work on CPUs we never use does not
    slow us. None where there is no readable ``/proc/stat``."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    if allowed is None and hasattr(os, "sched_getaffinity"):
        allowed = set(os.sched_getaffinity(0))
    busy = steal = 0.0
    cpus = 0
    for line in lines:
        fields = line.split()
        if not fields or not fields[0].startswith("cpu") or not fields[0][3:].isdigit():
            continue
        if allowed is not None and int(fields[0][3:]) not in allowed:
            continue
        if len(fields) < 9:
            return None
        try:
            user, nice, system, _idle, _iowait, irq, softirq, stolen = map(float, fields[1:9])
        except ValueError:
            return None
        busy += user + nice + system + irq + softirq
        steal += stolen
        cpus += 1
    if cpus < 1:
        return None
    tick = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
    return _Counters(busy_s=busy / tick, steal_s=steal / tick, cpus=cpus)


def own_cpu_s() -> float:
    """CPU seconds this process and its reaped children have spent (user + system)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def activity_between(
    before: _Counters, after: _Counters, own_s: float, wall_s: float
) -> HostActivity | None:
    """The share of the host others took between two readings, ``own_s`` being what this
    process and its children spent in between."""
    if wall_s <= 0 or after.cpus != before.cpus:
        return None
    capacity = wall_s * after.cpus
    steal = max(0.0, after.steal_s - before.steal_s)
    others = max(0.0, (after.busy_s - before.busy_s) - own_s)
    clip = lambda x: min(1.0, max(0.0, x))  # noqa: E731 - clock ticks round either way
    return HostActivity(
        wall_s=wall_s,
        cpus=after.cpus,
        others_share=clip((others + steal) / capacity),
        steal_share=clip(steal / capacity),
    )


class HostMeter:
    """``with HostMeter() as meter: ...`` then ``meter.activity`` / ``meter.others_share``
    (None where unreadable)."""

    def __init__(self, path: Path = PROC_STAT) -> None:
        self._path = path
        self.activity: HostActivity | None = None

    @property
    def others_share(self) -> float | None:
        """The window's ``HostActivity.others_share``; None where it could not be read."""
        return self.activity.others_share if self.activity is not None else None

    def __enter__(self) -> HostMeter:
        self._before = read_counters(self._path)
        self._own = own_cpu_s()
        self._started = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        after = read_counters(self._path)
        if self._before is None or after is None:
            return
        wall = time.perf_counter() - self._started
        self.activity = activity_between(self._before, after, own_cpu_s() - self._own, wall)
