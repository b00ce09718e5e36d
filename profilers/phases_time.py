"""Timed real steps: per precision x checkpointing, one child each, two micro-batch sizes.

:mod:`profilers.phases_core` decides which groups are timed, in which order and with how much
time. Inside its child a group times a small size, then a larger one chosen to fit its time
(:func:`_timing_child`), and on a multi-thread CPU the larger size once more on half the threads
(what a rank that shares the cores sees).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from profilers import probe_rows
from profilers.device import DeviceInfo
from profilers.memory_model import MemoryModel
from profilers.probe_run import CHILD_START_S, ProbeRun
from profilers.throughput import StepTiming, TimeModel, with_host_share
from profilers.workload import StepSpec, Workload

CPU_MAX_TIMED_MICRO_BATCH = 8  # CPU throughput is flat or falls beyond ~8 (DESIGN.md)
GPU_MAX_TIMED_MICRO_BATCH = 64
# A precision this many times slower than fp32 (per the device probe) is timed at small sizes
# only, so its probe stays inside the budget (bf16 and fp16 on a CPU without native support ran
# 10-30x slower than fp32 here, DESIGN.md).
SLOW_PRECISION_FACTOR = 4
SLOW_PRECISION_MAX_MICRO_BATCH = 2
# The child plans its rounds from a single timed step, and a step's time varies run to run (up
# to 35% on the 2-vCPU host, DESIGN.md): 1.5x the group's time lets a plan that ran long still
# return, and the margin covers a start-up slower than CHILD_START_S and teardown, so a slow
# but healthy group is measured rather than recorded as a timeout.
TIMING_TIMEOUT_FACTOR = 1.5
TIMING_TIMEOUT_MARGIN_S = 15
# The half-thread timing's cost in steps of the full-thread time: one warm-up and two timed
# steps, each up to twice as long on half the threads.
_SPLIT_COST_STEPS = 6


def timed_sizes(
    run: ProbeRun, model: MemoryModel | None, capacity: int, slowdown: float
) -> tuple[int, int]:
    """(small size, largest size allowed): the larger one is picked in the child."""
    if run.options.time_micro_batch_sizes is not None:
        return run.options.time_micro_batch_sizes
    cap = GPU_MAX_TIMED_MICRO_BATCH if run.on_gpu else CPU_MAX_TIMED_MICRO_BATCH
    if slowdown > SLOW_PRECISION_FACTOR:  # a slow precision: small sizes keep it in budget
        cap = SLOW_PRECISION_MAX_MICRO_BATCH
    largest = cap
    if model is not None:
        while largest > 1 and model.predict(largest) > run.options.memory_budget * capacity:
            largest //= 2
    largest = max(largest, 2)
    return (max(1, largest // 4), largest)


def _slowdown(device: DeviceInfo, precision: str) -> float:
    """How many times slower than fp32 the device probe found ``precision`` (1 if unknown)."""
    check = device.precisions.get(precision)
    if check is not None and check.speedup_vs_fp32:
        return 1.0 / check.speedup_vs_fp32
    return 1.0


def _time_group(run: ProbeRun, small: StepSpec, b_max: int, per_group: float) -> list[StepTiming]:
    """One group's child; its timings and a row each, or one row saying how it failed."""
    outcome = run.isolated(
        _timing_child,
        run.workload,
        small,
        b_max,
        run.options.device,
        per_group - CHILD_START_S,
        timeout_s=TIMING_TIMEOUT_FACTOR * per_group + TIMING_TIMEOUT_MARGIN_S,
    )
    if not outcome.ok:
        run.rows.append(probe_rows.failed("throughput", small, outcome))
        return []
    return _measured(
        run, outcome.value, outcome.wall_s, lambda t: f"{t.threads} threads" if t.threads else ""
    )


def _measured(
    run: ProbeRun,
    records: Sequence[dict[str, Any]],
    wall_s: float,
    reason: Callable[[StepTiming], str],
) -> list[StepTiming]:
    """A timing child's records as StepTimings, each with its ``measured`` row."""
    timings = [StepTiming.from_dict(d) for d in records]
    for timing in timings:
        run.rows.append(
            probe_rows.measured(
                "throughput",
                timing.spec,
                wall_s=wall_s,
                value=timing.median_step_s,
                unit="s/step",
                reason=reason(timing),
            )
        )
    return timings


def plain_steps(
    models: Sequence[TimeModel], timings: Sequence[StepTiming], precision: str
) -> tuple[TimeModel, dict[int, float]] | None:
    """The core's single-device fit of ``precision`` without checkpointing (fitted through its
    own timings) and the median step of each size it timed at the fit's thread count: what a
    same-child delta adds to, and what plans its child. None without that fit."""
    plain = next(
        (
            m
            for m in models
            if (m.precision, m.activation_checkpointing, m.parallelism, m.loss_chunks)
            == (precision, "none", "single", 1)
            and not m.delta_from
        ),
        None,
    )
    if plain is None:
        return None
    steps = {
        t.spec.micro_batch_size: t.median_step_s
        for t in timings
        if (t.spec.precision, t.spec.activation_checkpointing, t.spec.parallelism)
        == (precision, "none", "single")
        and t.spec.loss_chunks == 1
        and t.spec.grad_accum_steps == 1
        and t.threads == plain.threads
    }
    return plain, steps


def time_side_by_side(
    run: ProbeRun, specs: Sequence[StepSpec], left_s: float, rounds: int, reason: str
) -> list[StepTiming] | None:
    """``specs`` timed round-robin in one child within ``left_s`` (up to ``rounds`` rounds): a
    same-child delta's measurement (the chunked loss's, a checkpointed group's recompute). A
    row per timing with ``reason``, or one row saying how the child failed (then None)."""
    from profilers.throughput import interleaved_child

    outcome = run.isolated(
        interleaved_child,
        run.workload,
        specs,
        run.options.device,
        left_s - CHILD_START_S,
        rounds,
        timeout_s=TIMING_TIMEOUT_FACTOR * left_s + TIMING_TIMEOUT_MARGIN_S,
    )
    if not outcome.ok:
        run.rows.append(probe_rows.failed("throughput", specs[1], outcome))
        return None
    return _measured(run, outcome.value, outcome.wall_s, lambda _: reason)


# -- child-process entry point (top level: pickled by reference) ------------------------------


def _timing_child(
    workload: Workload, small: StepSpec, max_micro: int, device: str, budget_s: float
) -> list[dict[str, Any]]:
    """Time ``small`` and a larger micro-batch, interleaved, sized to fit ``budget_s``.

    One untimed + one timed step at the small size first tell how slow this group is here (a
    precision can be 30x slower than fp32 on a CPU); the larger size and the number of rounds
    follow from it: the largest power-of-two multiple <= ``max_micro`` whose rounds fit.
    """
    from profilers.host_activity import HostMeter
    from profilers.host_allocator import steady_malloc

    if not device.startswith("cuda"):
        steady_malloc()  # two sizes alternate here, one in a training run (the module says why)
    with HostMeter() as meter:  # what others took of the host while this child timed
        timings = _time_two_sizes(workload, small, max_micro, device, budget_s)
    return [with_host_share(t, meter).to_dict() for t in timings]


def _time_two_sizes(
    workload: Workload, small: StepSpec, max_micro: int, device: str, budget_s: float
) -> list[StepTiming]:
    """:func:`_timing_child`'s timings."""
    import torch

    from profilers.throughput import measure_interleaved, time_steps

    started = time.perf_counter()
    t_small = time_steps(workload, small, device, warmup=1, repeats=1).median_step_s
    left = budget_s - (time.perf_counter() - started)
    b1 = small.micro_batch_size
    threads = torch.get_num_threads()
    split = not device.startswith("cuda") and threads > 1
    # On a multi-thread CPU, room for the half-thread steps of the larger size below: planned
    # for, but after two timed rounds per size.
    reserve = _SPLIT_COST_STEPS if split else 0

    def cost(b2: int, rounds: int, reserve: int) -> float:  # linear in b: an upper bound
        return (1 + rounds) * t_small * (1 + b2 / b1) + reserve * t_small * b2 / b1

    plans = [(3, reserve), (2, reserve), (3, 0), (2, 0), (1, reserve), (1, 0)]
    doublings = _doublings(2 * b1, max_micro)
    b2, rounds = 2 * b1, 1  # the minimum: two sizes, one timed step each
    for candidate_rounds, candidate_reserve in plans:
        fitting = [b for b in doublings if cost(b, candidate_rounds, candidate_reserve) <= left]
        if fitting:
            b2, rounds = fitting[-1], candidate_rounds
            break
    specs = [small, dataclasses.replace(small, micro_batch_size=b2)]
    timings = measure_interleaved(
        workload, specs, device, rounds=rounds, warmup=1, deadline=started + budget_s
    )
    left = budget_s - (time.perf_counter() - started)
    again = _split_target([t.median_step_s for t in timings], left) if split else None
    if again is not None:
        # CPU ranks split the cores (the launcher gives each cores // ranks threads), and a
        # step does not run twice as long on half the threads (fp16 kernels here barely use a
        # second one). Time a size once more on half of them: the cost model scales a rank's
        # compute by what this measures instead of assuming perfect scaling.
        torch.set_num_threads(threads // 2)
        try:
            timings.append(time_steps(workload, specs[again], device, warmup=1, repeats=2))
        finally:
            torch.set_num_threads(threads)
    return timings


def _split_target(step_s: Sequence[float], left_s: float) -> int | None:
    """Which timed size (index into ``step_s``, the sizes' median step times, smallest size
    first) to time again on half the threads: the largest whose three more steps (one warm-up,
    two timed, each up to twice as long there) fit in ``left_s``, else None. The larger size's
    ratio is preferred (more work per op, the ratio a rank's big micro-batches see); the
    smaller one's still beats no measurement: fp16 on a CPU is 10-20x slower than fp32, and
    its larger size rarely fits, which left its ddp predictions assuming perfect thread
    scaling (+90% step time)."""
    for i in reversed(range(len(step_s))):
        if left_s > _SPLIT_COST_STEPS * step_s[i]:
            return i
    return None


def _doublings(start: int, limit: int) -> list[int]:
    """``start``, 2x, 4x, ... up to ``limit`` (at least ``start`` itself)."""
    out = [start]
    while out[-1] * 2 <= limit:
        out.append(out[-1] * 2)
    return out
