"""The profiler's time budget: how much of ``budget_s`` each phase may spend.

Each phase has a weight in :data:`SHARES`. When a phase starts it asks :meth:`Clock.share` for
its seconds: its weight's part of the time still left, among the phases not started yet. So time
an earlier phase left unused flows to the later ones, and a phase that overran shrinks all the
later ones a little rather than starving the last. A phase asks once, when it starts; a phase
with nothing to do still asks, so its weight stops counting for the rest.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Sequence

Progress = Callable[[str, float], None]  # (what is running now, fraction of the budget spent)

# Shares of the budget per phase; what a phase leaves unused flows to the next ones.
# In the order the phases run: what matters most for the search comes first.
SHARES = {
    "device": 0.05,
    "model": 0.02,
    # The search's core, group by group (profilers.phases_core): traces, then timed steps.
    "memory": 0.10,
    "throughput": 0.34,
    # Traces of the groups the core had no time for, accumulation, the memory fit's hinge.
    "memory_refine": 0.10,
    # torch.compile's cold compile and speed-up per timed group (profilers.phases_compile):
    # 0.12 taken from the four phases after it in proportion (0.39 -> 0.27), so when it does
    # not run (the default budget cannot cover a cold compile) they split its time as before.
    "compile": 0.12,
    # Collectives before the real-step memory check: without their fits no DDP/FSDP candidate
    # can be priced (half the search), while the check only audits fits already made. Seen in
    # CI: a loaded host overran the check, and a world-size-2 profile measured no collective.
    "communication": 0.104,
    "memory_check": 0.062,
    "memory_distributed": 0.055,
    "input": 0.049,
}


def covering_budget_s(
    budget_s: float, phases: Sequence[str], need_s: float, dropped: Collection[str] = ()
) -> int:
    """The --budget-s whose share for ``phases`` also covers ``need_s`` more seconds, rounded
    up to 30 s: what a skipped probe's row names. A share is the phases' weight among those
    that run (one ``dropped`` for the run, e.g. the collectives of a model that fits no device
    here, gives its weight to the others)."""
    running = sum(w for p, w in SHARES.items() if p not in dropped)
    fraction = sum(SHARES[p] for p in phases) / running
    return int(math.ceil((budget_s + need_s / fraction) / 30.0) * 30)


class Clock:
    """The budget's clock, started at construction or at ``start`` (a reading of ``now``
    taken earlier: the request's arrival, so what ran before the probes counts too); ``now``
    (default: time.perf_counter, looked up at each call) is injectable for tests."""

    def __init__(
        self,
        budget_s: float,
        progress: Progress | None,
        now: Callable[[], float] | None = None,
        start: float | None = None,
    ) -> None:
        self.budget_s, self.progress = budget_s, progress
        self.now = now or (lambda: time.perf_counter())
        self.start = self.now() if start is None else start
        self.started: set[str] = set()
        self.dropped: set[str] = set()
        self.drop_reasons: dict[str, str] = {}
        self.stopped = False

    def elapsed(self) -> float:
        return self.now() - self.start

    def remaining(self) -> float:
        return 0.0 if self.stopped else max(0.0, self.budget_s - self.elapsed())

    def stop(self) -> None:
        """Nothing is left from now on (the profile was asked to stop: Ctrl-C): every phase
        not started gets no time, and one running sees none left."""
        self.stopped = True

    def share(self, phase: str) -> float:
        """Seconds this phase may use: its weight's part of what is left, among the phases
        not started yet. Time an earlier phase left unused flows to the later ones, and one
        that overran shrinks them all a little rather than starving the last. A dropped phase
        gets nothing."""
        if phase in self.dropped:
            return 0.0
        part = self._part(phase)
        self.started.add(phase)
        return part

    def joint_share(self, *phases: str, borrow: Sequence[str] = ()) -> float:
        """Seconds ``phases`` may use together, started now at once, plus what the ``borrow``
        phases would get if they started now (they are not started): their weights' part of
        what is left, among the phases not started yet. (Asking :meth:`share` of each in turn
        counts the time left again after each, as if the earlier ones had used none of it.)"""
        waiting = sum(w for p, w in SHARES.items() if p not in self.started)
        weight = sum(SHARES[p] for p in (*phases, *borrow) if p not in self.started)
        part = self.remaining() * weight / waiting if waiting > 0 else 0.0
        self.started.update(phases)
        return part

    def peek(self, phase: str) -> float:
        """Seconds ``phase`` would get if it started now, without starting it (0 when it has
        started or was dropped): what a phase before it may borrow for its most valuable work."""
        return 0.0 if phase in self.started else self._part(phase)

    def _part(self, phase: str) -> float:
        """``phase``'s weight's part of what is left, among the phases not started yet."""
        waiting = sum(w for p, w in SHARES.items() if p not in self.started)
        return self.remaining() * SHARES[phase] / waiting if waiting > 0 else 0.0

    def drop(self, *phases: str, reason: str | None = None) -> None:
        """Phases known to have nothing to do (the options turned them off, or nothing fits
        the device): their weights leave the budget at once, so the other phases not started
        yet share their time. ``reason`` is kept for the phase's skipped row."""
        for phase in phases:
            if phase not in SHARES:
                raise ValueError(f"unknown phase {phase!r}")
            self.dropped.add(phase)
            self.started.add(phase)
            if reason is not None:
                self.drop_reasons[phase] = reason

    def say(self, message: str) -> None:
        """Report ``message`` and the fraction of the budget spent (capped at 1)."""
        if self.progress is not None:
            self.progress(message, min(1.0, self.elapsed() / self.budget_s))
