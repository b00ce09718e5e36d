"""Recompute timed for the checkpointing groups the core traced but had no time to time.

The core times its groups in priority order (:mod:`profilers.phases_core`); when its share runs
out, the checkpointed groups after the first keep their traces and get no step time. The cost
model then derived one: the no-checkpointing fit times the counted FLOPs ratio (recompute adds
one forward of each checkpointed block), and ``ops`` (which recomputes no matmul, so its FLOPs
ratio says nothing) stayed unpredictable. The FLOPs ratio assumes a block's recompute costs
its FLOPs' share of the step. Where the blocks' ops are small and overhead-bound beside one
large GEMM (a large vocabulary's head) it does not: the 6th regret session (hf-gpt2 with a
32,000 vocabulary, 2-vCPU host, 120 s profile) measured full checkpointing 5-28% slower than
derived by its ratio 1.061, and ops-half 7-39% slower than by its 1.022.

So this phase measures the recompute: one child times each such group beside the plain step of
its precision, round-robin, at the core's two timed sizes of that plain step, and the group's
time model is the core's plain fit plus that same-child difference
(:func:`profilers.throughput.delta_time_model`, the method the chunked loss's delta uses: two
groups timed in different children would compare the host's moods). Groups go in the core's
priority order, as many as the least plan of the child (one warm-up and one timed round) fits
in :data:`SHARE_OF_REMAINING` of what is left; the rest keep the derivation and get a row.
It runs after the refinements (whose traces make more groups priceable) and before the chunked
loss (a new knob, later in priority).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from profilers import probe_rows
from profilers.memory_records import MemoryTrace, fitted_groups
from profilers.phases_time import plain_steps, time_side_by_side
from profilers.probe_run import CHILD_START_S, MIN_CHILD_SHARE_S, ProbeRun
from profilers.throughput import StepTiming, TimeModel, delta_time_model

# The part of the budget left after the refinements that the phase may use. A group it times
# becomes measured instead of derived; the phases after it (the chunked loss, compile,
# communication, the memory checks, per-rank traces, input) keep at least 0.7 of what was left.
SHARE_OF_REMAINING = 0.3
# Planning only: a checkpointed step's time over the plain one's before it is measured (the
# 6th regret session's worst measured ratio, ops-half at micro-batch 1: 1.60).
RECOMPUTE_STEP_FACTOR = 1.6
# Rounds of the interleaved timing (each: the plain step and every group's, at both sizes).
MAX_ROUNDS = 3


@dataclass
class RecomputeResult:
    timings: list[StepTiming] = field(default_factory=list)
    time_models: list[TimeModel] = field(default_factory=list)


def untimed_groups(
    skipped: Sequence[tuple[str, str]],
    timed: Sequence[TimeModel],
    traces: Sequence[MemoryTrace],
) -> list[tuple[str, str]]:
    """The core's ``skipped`` groups (in its priority order) worth timing here: checkpointed,
    their precision's plain step timed (a single-device fit), and a memory fit of their own
    (traced at two sizes) so that a timed group is priceable at once."""
    fitted = set(fitted_groups(traces))
    return [
        (p, c)
        for p, c in skipped
        if c != "none" and (p, c) in fitted and plain_steps(timed, (), p) is not None
    ]


def recompute_phase(
    run: ProbeRun,
    skipped: Sequence[tuple[str, str]],
    core_timings: Sequence[StepTiming],
    core_models: Sequence[TimeModel],
    traces: Sequence[MemoryTrace],
) -> RecomputeResult:
    """Time :func:`untimed_groups` beside their plain step, one child per precision, within
    :data:`SHARE_OF_REMAINING` of what is left; a row for each group left out."""
    out = RecomputeResult()
    groups = untimed_groups(skipped, core_models, traces)
    if not groups:
        return out
    deadline = time.perf_counter() + run.clock.remaining() * SHARE_OF_REMAINING
    for precision in dict.fromkeys(p for p, _ in groups):
        settings = [c for p, c in groups if p == precision]
        _time_precision(run, out, precision, settings, deadline, core_timings, core_models)
    return out


def _time_precision(
    run: ProbeRun,
    out: RecomputeResult,
    precision: str,
    settings: Sequence[str],
    deadline: float,
    core_timings: Sequence[StepTiming],
    core_models: Sequence[TimeModel],
) -> None:
    found = plain_steps(core_models, core_timings, precision)
    assert found is not None  # untimed_groups keeps the precisions with that fit
    plain, steps = found
    if len(steps) < 2:  # the fit had two sizes; another thread count's timings do not count
        for c in settings:
            _left_out(run, precision, c, f"{precision} without checkpointing has no two sizes")
        return
    small, large = min(steps), max(steps)
    per_round = steps[small] + steps[large]

    def least(k: int) -> float:
        # The child's least plan: every step built and warmed up, then one timed round (the
        # build's first step costs about another one).
        return max(
            MIN_CHILD_SHARE_S,
            CHILD_START_S + 3 * (1 + k * RECOMPUTE_STEP_FACTOR) * per_round,
        )

    left = deadline - time.perf_counter()
    k = len(settings)
    while k > 0 and (least(k) > left or least(k) > run.clock.remaining()):
        k -= 1
    for c in settings[k:]:
        _left_out(
            run,
            precision,
            c,
            f"time budget spent (a child timing it beside {precision}/none needs ~"
            f"{least(k + 1):.0f} s): its step time is derived from the none fit by the counted "
            "FLOPs ratio (ops: unpredictable); a larger --budget-s times it",
        )
    if k == 0:
        return
    chosen = list(settings[:k])
    specs = [run.spec(precision, c, b) for b in (small, large) for c in ("none", *chosen)]
    run.clock.say(
        f"throughput: timing the recompute of {', '.join(chosen)} beside {precision}/none"
    )
    timings = time_side_by_side(
        run, specs, left, MAX_ROUNDS, f"interleaved with {precision}/none (recompute delta)"
    )
    if timings is None:
        return
    # Every timing of the child is kept in the profile (the plain steps too): its deltas can be
    # re-derived from profile.json alone.
    out.timings += timings
    base = [t for t in timings if t.spec.activation_checkpointing == "none"]
    for c in chosen:
        own = [t for t in timings if t.spec.activation_checkpointing == c]
        # A recompute only adds work: a delta measured below zero is noise (the 7th regret
        # session's profile timed blocks:2 36 ms under none at micro-batch 8, so blocks:1,
        # on the line through it, was predicted faster than none and advised).
        model = delta_time_model(plain, base, own, non_negative=True)
        out.time_models.append(
            dataclasses.replace(model, activation_checkpointing=c, delta_from="none")
        )


def _left_out(run: ProbeRun, precision: str, checkpointing: str, why: str) -> None:
    run.rows.append(
        probe_rows.skipped("throughput", None, why, name=f"{precision}/{checkpointing} recompute")
    )
