"""torch.compile (``compile``), after the core: its speed-up and its compile time, per group.

Runs after :mod:`profilers.phases_core` (and the chunked loss): a new knob comes after the
search's core in priority. For each group the core timed, in the core's order (fp32/none
first), while the phase's share of the budget lasts, one child:

1. builds the eager and the compiled step at the group's two timed sizes; the first compiled
   step at the smaller size minus the eager step's median there is the compile time. The
   child's inductor cache is an empty temporary directory (``TORCHINDUCTOR_CACHE_DIR``), so
   this is the *cold* compile a user's first run pays; a later run on the same machine reads
   inductor's on-disk cache and compiles in a fraction of it (gpt-tiny here: ~20 s cold, ~3 s
   warm), which the plan does not count on;
2. times compiled and eager steps round-robin at the group's two timed sizes (the same-child
   pattern :mod:`profilers.phases_chunked` uses for the chunked loss's delta: on a shared host a
   step's time drifts up to 35% between children, DESIGN.md), and keeps the median of the
   eager/compiled forward+backward ratios of each round.

Each size is compiled with static shapes (``automatic_dynamic_shapes`` off), as a training run
with one micro-batch size compiles it. A child that fails (a model dynamo or inductor cannot
compile, an OOM, a timeout) is a failure record with its one-line reason: the search drops
compile for that group, never the profile. Without a C++ compiler (CPU) or triton (CUDA)
nothing is tried and every group's record says why.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

from profilers import probe_rows
from profilers.compile_records import CompileMeasurement, compile_unavailable
from profilers.probe_run import CHILD_START_S, MIN_CHILD_SHARE_S, ProbeRun
from profilers.throughput import StepTimer, StepTiming
from profilers.workload import StepSpec, Workload

PROBE = "compile"
# Planning only, never a prediction: a cold compile of one block's step, forward and backward,
# measured on this 2-vCPU host with an empty inductor cache: gpt-tiny with one block ~20 s,
# the default gpt-tiny 35-48 s with the host loaded by other jobs (the blocks share one graph:
# depth adds guards, not compiles). A larger block compiles longer; the child's timeout leaves
# room (COMPILE_TIMEOUT_FACTOR) and a timeout is recorded, not fatal.
COLD_COMPILE_PLAN_S = 25.0
COMPILE_TIMEOUT_FACTOR = 3.0
# Rounds of the interleaved timing (each: an eager and a compiled step at both sizes).
MAX_ROUNDS = 3


def compile_phase(
    run: ProbeRun, groups: Sequence[tuple[str, str]], core_timings: Sequence[StepTiming]
) -> list[CompileMeasurement]:
    """Measure compile on each group of ``groups`` (the core's, in its priority order) that was
    timed at two sizes, while the ``compile`` share lasts; the others get a skipped row."""
    share = run.clock.share(PROBE)
    deadline = time.perf_counter() + share
    sizes = _timed_sizes(groups, core_timings)
    todo = [g for g in groups if len(sizes.get(g, ())) >= 2]
    if not todo:
        run.rows.append(
            probe_rows.skipped(
                PROBE, None, "no group was timed at two sizes: nothing to compare with"
            )
        )
        return []
    why = compile_unavailable(run.options.device.split(":")[0])
    if why:
        run.rows.append(probe_rows.row(PROBE, None, "unsupported", reason=why))
        return [
            CompileMeasurement(
                precision=p, activation_checkpointing=c, status="unavailable", reason=why
            )
            for p, c in todo
        ]
    out: list[CompileMeasurement] = []
    for i, (p, c) in enumerate(todo):
        small, large = sizes[(p, c)]
        steps = _eager_step_s(core_timings, p, c)
        least = least_compile_s(steps[small], steps[large])
        left = deadline - time.perf_counter()
        if left < least:
            _skip_rest(run, todo[i:], sizes, share, share - left, least)
            break
        run.clock.say(f"compile: {p}/{c} (a cold compile, then compiled vs eager steps)")
        specs = [run.spec(p, c, small), run.spec(p, c, large)]
        outcome = run.isolated(
            _compile_child,
            run.workload,
            specs,
            run.options.device,
            left - CHILD_START_S,
            timeout_s=COMPILE_TIMEOUT_FACTOR * max(left, least),
        )
        name = f"{p}/{c}/compiled"
        if not outcome.ok:
            run.rows.append(probe_rows.failed(PROBE, specs[0], outcome, name=name))
            out.append(
                CompileMeasurement(
                    precision=p,
                    activation_checkpointing=c,
                    status=outcome.status,
                    reason=outcome.reason,
                )
            )
            continue
        measured = measurement_from_child(p, c, outcome.value)
        out.append(measured)
        run.rows.append(
            probe_rows.measured(
                PROBE,
                specs[0],
                value=measured.speedup,
                unit="x eager",
                wall_s=outcome.wall_s,
                name=name,
                reason=f"forward+backward eager/compiled, interleaved at b={small} and b={large}; "
                f"cold compile {measured.compile_s:.1f} s",
            )
        )
    return out


def least_compile_s(small_step_s: float, large_step_s: float) -> float:
    """A compile child's least cost, before it runs: start-up, a cold compile at each size
    (:data:`COLD_COMPILE_PLAN_S`, the second size recompiled), one warm-up and one timed round
    of the four steps (each compiled step taken as slow as the eager one)."""
    steps = 2 * (small_step_s + large_step_s)
    return max(MIN_CHILD_SHARE_S, CHILD_START_S + 2 * COLD_COMPILE_PLAN_S + 2 * steps)


def measurement_from_child(
    precision: str, checkpointing: str, value: dict[str, Any]
) -> CompileMeasurement:
    """The group's record from what :func:`_compile_child` returned."""
    timings = [StepTiming.from_dict(d) for d in value["timings"]]
    sizes = sorted({t.spec.micro_batch_size for t in timings})
    by_size = [paired_speedups(timings, b) for b in sizes]
    # The compile: the compiled step's first step at the smaller size (timings[1], the order
    # _compile_child builds them in) minus that size's median eager step.
    eager = timings[0]
    compile_s = float(value["first_step_s"][1]) - eager.median_step_s
    return CompileMeasurement(
        extra_bytes_by_size=extra_bytes_by_size(timings, value.get("transient_bytes") or ()),
        precision=precision,
        activation_checkpointing=checkpointing,
        status="ok",
        speedup=statistics.median(r for ratios in by_size for r in ratios),
        compile_s=max(0.0, compile_s),
        micro_batch_sizes=tuple(sizes),
        speedup_by_size=tuple(statistics.median(r) for r in by_size),
        speedup_log_sd=ratio_log_sd(by_size),
        pairs_per_size=min((len(r) for r in by_size), default=0),
    )


def ratio_log_sd(by_size: Sequence[Sequence[float]]) -> float | None:
    """The sd of the paired ratios' logs about their size's median log, pooled over the sizes
    (one degree of freedom per size spent on its median); None without a spare pair."""
    deviations = [
        math.log(r) - math.log(statistics.median(ratios))
        for ratios in by_size
        if ratios
        for r in ratios
    ]
    dof = len(deviations) - sum(1 for ratios in by_size if ratios)
    if dof < 1:
        return None
    return math.sqrt(sum(d * d for d in deviations) / dof)


def extra_bytes_by_size(
    timings: Sequence[StepTiming], transient: Sequence[int | None]
) -> tuple[int, ...]:
    """Per timed size, ascending: the compiled forward+backward's allocator peak minus the eager
    one's (negative where compile saves memory); empty unless every size has both."""
    peaks: dict[tuple[int, bool], int] = {
        (t.spec.micro_batch_size, t.spec.compile): int(p)
        for t, p in zip(timings, transient, strict=False)
        if p is not None
    }
    sizes = sorted({t.spec.micro_batch_size for t in timings})
    if not sizes or any((b, c) not in peaks for b in sizes for c in (False, True)):
        return ()
    return tuple(peaks[(b, True)] - peaks[(b, False)] for b in sizes)


def paired_speedups(timings: Sequence[StepTiming], micro_batch_size: int) -> list[float]:
    """Eager over compiled forward+backward at one size, round by round (samples pair by
    index: the two were timed in the same round)."""

    def samples(compiled: bool) -> tuple[float, ...]:
        return next(
            t.forward_backward_s
            for t in timings
            if t.spec.micro_batch_size == micro_batch_size and t.spec.compile == compiled
        )

    return [e / c for e, c in zip(samples(False), samples(True), strict=False) if c > 0]


def _timed_sizes(
    groups: Sequence[tuple[str, str]], timings: Sequence[StepTiming]
) -> dict[tuple[str, str], tuple[int, int]]:
    """(smallest, largest) single-device micro-batch size the core timed, per group."""
    found: dict[tuple[str, str], set[int]] = {}
    for t in timings:
        s = t.spec
        if s.parallelism == "single" and s.loss_chunks == 1 and s.grad_accum_steps == 1:
            found.setdefault((s.precision, s.activation_checkpointing), set()).add(
                s.micro_batch_size
            )
    return {g: (min(found[g]), max(found[g])) for g in groups if len(found.get(g, ())) >= 2}


def _eager_step_s(
    timings: Sequence[StepTiming], precision: str, checkpointing: str
) -> dict[int, float]:
    """The core's median step time per size of one group."""
    out: dict[int, list[float]] = {}
    for t in timings:
        s = t.spec
        if (s.precision, s.activation_checkpointing, s.parallelism) == (
            precision,
            checkpointing,
            "single",
        ) and s.loss_chunks == 1:
            out.setdefault(s.micro_batch_size, []).append(t.median_step_s)
    return {b: statistics.median(v) for b, v in out.items()}


def _skip_rest(
    run: ProbeRun,
    groups: Sequence[tuple[str, str]],
    sizes: dict[tuple[str, str], tuple[int, int]],
    share: float,
    spent: float,
    least: float,
) -> None:
    """One row per group the share did not cover, with the budget that would have."""
    # The least cost of each, on top of what the groups before them took (``spent``); the
    # share grows with the budget (it is a fixed part of what the phases before it leave), so
    # the budget that covers them scales by (spent + need) / share, always above 1 here (the
    # first group skipped needed more than what was left).
    need = spent + len(groups) * least
    scale = need / share if share > 0 else 1 + need / MIN_CHILD_SHARE_S
    suggested = int(math.ceil(run.options.budget_s * max(scale, 1.0) / 30) * 30)
    for p, c in groups:
        run.rows.append(
            probe_rows.skipped(
                PROBE,
                run.spec(p, c, sizes[(p, c)][0]),
                f"time budget spent before compile was measured for this group (a cold compile "
                f"and timed steps need ~{least:.0f} s); --budget-s {suggested} would cover it",
                name=f"{p}/{c}/compiled",
            )
        )


# -- child-process entry point (top level: pickled by reference) ------------------------------


def _compile_child(
    workload: Workload, specs: Sequence[StepSpec], device: str, budget_s: float
) -> dict[str, Any]:
    """The cold compile at ``specs[0]``'s size, then eager and compiled steps round-robin at
    every spec's size (as many rounds, up to :data:`MAX_ROUNDS`, as ``budget_s`` allows).

    Each step is built once and timed from its second step: a compiled step's first one
    compiles it (the smaller size's is the compile time, the larger size's a recompile for its
    static shape), an eager step's first one is its lazy initialisation."""
    import dataclasses
    import os
    import tempfile
    from contextlib import ExitStack

    with tempfile.TemporaryDirectory(prefix="advisor-inductor-") as cache, ExitStack() as stack:
        # Read by inductor when it first needs its cache: set before anything compiles.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
        import torch._dynamo

        torch._dynamo.config.automatic_dynamic_shapes = False  # one static graph per size
        from profilers.throughput import round_robin

        deadline = time.perf_counter() + budget_s
        timers: list[StepTimer] = []
        first_step_s: list[float] = []  # per timer: its first step (a compiled one compiles)
        for spec in specs:
            for compiled in (False, True):
                timer = StepTimer(workload, dataclasses.replace(spec, compile=compiled), device)
                timers.append(stack.enter_context(timer))
                t0 = time.perf_counter()
                timer.warm_up(1)  # host-synchronised, as every step StepTimer runs
                first_step_s.append(time.perf_counter() - t0)
        for position, index in enumerate(round_robin(len(timers), MAX_ROUNDS)):
            if index == 0 and position >= len(timers) and time.perf_counter() > deadline:
                break
            timers[index].sample()
        timings = [t.timing() for t in timers]
        transient = [_transient_or_none(t) for t in timers]  # after the timing: no profiler in it
    return {
        "first_step_s": first_step_s,
        "timings": [t.to_dict() for t in timings],
        "transient_bytes": transient,
    }


def _transient_or_none(timer: StepTimer) -> int | None:
    """The step's forward+backward allocator peak above its start, or None if the allocator
    cannot say (the speed-up stands without it)."""
    from profilers.isolate import quiet_native_output

    try:
        with quiet_native_output():  # kineto prints "USDT: profiler_start/stop" on CPU
            return int(timer.transient_bytes())
    except Exception:
        return None
