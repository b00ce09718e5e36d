"""What every profiling phase shares: the options, the workload, the budget clock, the rows.

A phase is a function ``something_phase(run, ...)`` (modules ``profilers.phases_*``) that asks
``run.clock`` for its share of the budget, appends its rows to ``run.rows`` in the order it
runs its probes, and returns the records it produced. Probes that run real steps go through
:meth:`ProbeRun.isolated`: a child process under a timeout, so an OOM, crash or hang becomes a
row and profiling goes on.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from profilers import probe_rows
from profilers.budget import Clock, Progress
from profilers.defaults import DEFAULT_MEMORY_BUDGET, DEFAULT_PROFILE_BUDGET_S
from profilers.isolate import Isolation, Outcome, run_isolated
from profilers.profile_record import ProbeRow
from profilers.workload import CHECKPOINTING, StepSpec, Workload

CHILD_START_S = 3.0  # spawn + import torch + build, measured 1.1-3 s on 2 cores
# No child gets a timeout shorter than this: its start-up alone can take CHILD_START_S, and a
# few seconds more let the smallest probe return instead of being recorded as a timeout.
MIN_CHILD_TIMEOUT_S = CHILD_START_S + 5
# The least time worth starting a child for: its start-up plus ~2 s for one step or trace.
# With less left, the probe is recorded as skipped for the budget instead.
MIN_CHILD_SHARE_S = CHILD_START_S + 2


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    seq_len: int
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"
    budget_s: float = DEFAULT_PROFILE_BUDGET_S
    precisions: tuple[str, ...] | None = None  # None: every precision the device can run
    checkpointing: tuple[str, ...] = CHECKPOINTING
    # Three sizes: the fit is hinged at the smallest (see profilers.fit.fit_hinged).
    trace_micro_batch_sizes: tuple[int, ...] = (1, 4, 8)
    time_micro_batch_sizes: tuple[int, int] | None = None  # None: chosen from memory and budget
    comm: bool = True
    comm_world_sizes: tuple[int, ...] | None = None  # None: what is available locally
    input_workers: tuple[int, ...] = (0, 1, 2)
    memory_budget: float = DEFAULT_MEMORY_BUDGET  # the fraction a probed config may use
    # The device the memory traces are for: "cpu" or "cuda" (512-byte blocks, CUDA autocast's
    # fp32 norms and softmax); None: the probed device's kind. "cuda" on a CPU: a profile for
    # a what-if (--target).
    trace_for: str | None = None
    tool: dict[str, Any] = field(default_factory=dict)
    # When the budget started (a time.perf_counter() reading, e.g. when the request arrived,
    # before torch was imported and the model's facts read); None: when the probes start.
    started_at: float | None = None


class ProbeRun:
    """One profile in progress: its inputs, its clock and the probe rows written so far."""

    def __init__(self, workload: Workload, options: ProfileOptions, progress: Progress | None):
        self.workload, self.options = workload, options
        self.clock = Clock(options.budget_s, progress, start=options.started_at)
        self.rows: list[ProbeRow] = []
        self.base = StepSpec(seq_len=options.seq_len)
        # Set by the profiler once the device and the model are known: the bytes a probed
        # config may use, and what any real step of the model holds (its parameters,
        # gradients and AdamW state: profilers.memory_measured.training_state_bytes).
        self.usable_bytes: float | None = None
        self.state_bytes: int | None = None
        # Why no fake trace can run this model's step (set at the first trace that failed so):
        # its memory is then measured on real steps (profilers.memory_measured).
        self.untraceable: str | None = None

    @property
    def on_gpu(self) -> bool:
        return self.options.device.startswith("cuda")

    def spec(self, precision: str, checkpointing: str, micro: int, accum: int = 1) -> StepSpec:
        """The single-device step these knobs describe, at the profile's sequence length."""
        return dataclasses.replace(
            self.base,
            precision=precision,
            activation_checkpointing=checkpointing,
            micro_batch_size=micro,
            grad_accum_steps=accum,
        )

    def measured(
        self,
        probe: str,
        spec: StepSpec | None,
        *,
        since: float,
        value: float | None,
        unit: str,
        name: str | None = None,
    ) -> None:
        """Record an ``ok`` in-process probe whose wall time ran from ``since`` (a
        ``time.perf_counter()`` reading) until now."""
        wall_s = time.perf_counter() - since
        self.rows.append(
            probe_rows.measured(probe, spec, wall_s=wall_s, value=value, unit=unit, name=name)
        )

    def isolated(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Outcome:
        """``fn(*args)`` in a child, killed after ``timeout_s`` (never under the minimum)."""
        return run_isolated(Isolation(timeout_s=max(timeout_s, MIN_CHILD_TIMEOUT_S)), fn, *args)
