"""Per-rank memory of DDP and FSDP steps, traced under a fake process group in one child.

The fake group is process-global, so every distributed trace runs in a single child that
works through the specs in priority order (every group's sizes before any accumulation
variant) until its budget ends, and reports one result per spec.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from profilers import probe_rows
from profilers.budget import covering_budget_s
from profilers.memory_model import MemoryModel
from profilers.memory_records import MemoryTrace
from profilers.probe_run import CHILD_START_S, MIN_CHILD_SHARE_S, ProbeRun
from profilers.workload import StepSpec, Workload

# The child starts a trace only when the mean of the ones it made would end it before its
# deadline, but a trace can run longer than that mean: the timeout allows one more trace, plus
# the child's start-up and teardown, before a healthy child is killed and every trace it had
# made is lost with it.
DISTRIBUTED_TRACE_TIMEOUT_MARGIN_S = 20
GROUP_NAME = "ddp/fsdp per-rank"  # the name of the rows about the phase as a whole
KEPT_GATHERED_NAME = "fsdp kept gathered"  # the row about the reshard-False traces left out
DEFAULT_TRACE_S = 2.0  # a gpt-tiny trace when none was made to time one
# A rank's trace over a one-device trace of the same setting, the expected time of the first
# rank trace (the child times the later ones itself). A rank is traced from deeper copies
# (3 and 4 blocks or periods against 2 and 3: 1.4x the layers) under FSDP's collectives and
# hooks (~1.5-1.9x the ops per layer). Measured 2026-12-06: Qwen3.5-9B 2.6x (12 s -> 31 s,
# bf16/full), llama-tiny and gpt-tiny with 8 layers 1.4-1.8x (each traced whole, the rank
# from copies); until that day's faster one-device traces (memory_tracing.GlobalPeakOnly)
# the two took about as long, the phase assumed 1x, and Qwen3.5-9B's default profile then
# started a 31 s rank trace with 20 s of the budget left (135 s for 120). Re-measured later
# that day with the primed tracer (benchmarks/results/large_models, fsdp_analytic,
# fsdp_one_rank: 14 default profiles), the first rank trace against the group's slowest
# one-device trace: 1.6-2.9x (3.4x on Mistral 7B's 1.8 s traces: the child's start weighs
# most on the shortest), the later ones 1.2-1.7x.
RANK_TRACE_FACTOR = 3.0


def distributed_trace_phase(
    run: ProbeRun,
    precisions: Sequence[str],
    target: str,
    world_sizes: Sequence[int],
    parallelisms: Sequence[str] = ("fsdp", "ddp"),
    group_order: Sequence[tuple[str, str]] | None = None,
    trace_seconds: Callable[[str], float] | None = None,
    kept_gathered: bool = True,
) -> list[MemoryTrace]:
    """Per-rank memory of ``parallelisms`` steps at each world size, traced under a fake
    process group in one child (the group is process-global). fp32 first (or the
    (precision, checkpointing) groups in ``group_order``, the others after them); the rest
    while the budget lasts.

    ``trace_seconds``: what a one-device trace took per checkpointing (the core's costs); the
    first rank's trace is expected to take :data:`RANK_TRACE_FACTOR` times that, and no child
    starts when the share cannot cover it (until 2026-12-05 the first always started: a
    Zamba2, traced whole at ~140 s a trace, had its child killed after the phase's 46 s).

    ``kept_gathered``: trace FSDP ranks with the blocks kept gathered too (False for a model
    without repeated blocks: its one FSDP unit, the root, stays gathered from forward to
    backward either way, so those traces would equal the others)."""
    share = run.clock.share("memory_distributed")
    if not world_sizes or share < MIN_CHILD_SHARE_S:
        reason = "no world size > 1" if not world_sizes else "time budget spent"
        run.rows.append(probe_rows.skipped("memory_distributed", None, reason, name=GROUP_NAME))
        return []
    specs = _distributed_specs(
        run, precisions, world_sizes, parallelisms, group_order, kept_gathered
    )
    first_s = (
        RANK_TRACE_FACTOR * trace_seconds(specs[0].activation_checkpointing)
        if trace_seconds and specs
        else 0.0
    )
    if first_s > share - CHILD_START_S:
        skipped = [{"status": "skipped", "reason": "time budget spent"} for _ in specs]
        return _record_results(run, specs, skipped, unmeasured_s=first_s)
    run.clock.say(
        f"memory: per-rank {'/'.join(parallelisms)} traces at world size "
        f"{', '.join(map(str, world_sizes))}"
    )
    outcome = run.isolated(
        _distributed_trace_child,
        run.workload,
        specs,
        target,
        share - CHILD_START_S,
        first_s,
        timeout_s=share + DISTRIBUTED_TRACE_TIMEOUT_MARGIN_S,
    )
    if not outcome.ok:
        run.rows.append(probe_rows.failed("memory_distributed", None, outcome, name=GROUP_NAME))
        return []
    return _record_results(run, specs, outcome.value, unmeasured_s=first_s or DEFAULT_TRACE_S)


# The what-if's precisions, in the order a model too large for this device has its ranks
# traced: it serves GPUs, whose plans at that scale are 16-bit (bf16, the mixed precision of
# choice where it runs, then fp16), and an fp16 rank holds what a bf16 one does but for its
# loss scaler's few scalars.
WHAT_IF_PRECISION_ORDER = ("bf16", "fp16", "fp32")


def what_if_rank_order(models: Sequence[MemoryModel], largest: int) -> list[tuple[str, str]]:
    """The (precision, checkpointing) groups whose FSDP ranks a profile of a model that fits
    no device here traces first: by precision (:data:`WHAT_IF_PRECISION_ORDER`), then the
    groups needing least memory first, ranked by forward/backward at the ``largest`` traced
    size (at micro-batch 1 the optimizer step, the same for every group, hides what their
    activations differ by). Until 2026-12-05 the order was by memory alone, which put fp32
    and fp16 with full checkpointing before bf16 without: a 6.7B Llama's default profile
    traced fp32/full, bf16/full and fp16/full ranks, and its bf16/none candidates, the
    fastest that fit 8 H100s, were priced by the analytic fallback instead.

    ``blocks:K`` groups come last within their precision: the search prices a ``blocks:K``
    rank on the line through the none and full ranks, and its own rank is traced whole (the
    copies cannot hold K of their blocks), several times a scaled rank's time. When the faster
    tracer of 2026-12-06 first reached a 7.53B Llama's single-device ``blocks:16`` group in the
    default budget, memory alone put its ranks (9.6 s each, against 2.5 s) second, and
    bf16/ops's and bf16/none's ranks were left out."""
    fitted = {
        (m.precision, m.activation_checkpointing): m.forward_backward.predict(largest)
        for m in models
        if m.loss_chunks == 1
    }
    rank = {p: i for i, p in enumerate(WHAT_IF_PRECISION_ORDER)}
    return sorted(
        fitted,
        key=lambda g: (rank.get(g[0], len(rank)), g[1].startswith("blocks:"), fitted[g]),
    )


def _distributed_specs(
    run: ProbeRun,
    precisions: Sequence[str],
    world_sizes: Sequence[int],
    parallelisms: Sequence[str] = ("fsdp", "ddp"),
    group_order: Sequence[tuple[str, str]] | None = None,
    kept_gathered: bool = True,
) -> list[StepSpec]:
    """Every precision x checkpointing x layout x world size at each traced size and once
    with accumulation; fp32 first (or ``group_order`` first), every group's sizes before any
    accumulation variant."""
    sizes = run.options.trace_micro_batch_sizes
    specs = []
    for precision in sorted(precisions, key=lambda p: p != "fp32"):
        for checkpointing in run.options.checkpointing:
            for parallelism in parallelisms:
                for world in world_sizes:
                    for b, a in (*((b, 1) for b in sizes), (sizes[0], 2)):
                        specs.append(
                            dataclasses.replace(
                                run.spec(precision, checkpointing, b, a),
                                parallelism=parallelism,
                                world_size=world,
                            )
                        )
    if group_order:
        rank = {g: i for i, g in enumerate(group_order)}
        specs.sort(key=lambda s: rank.get((s.precision, s.activation_checkpointing), len(rank)))
    # Priority: every group's two sizes before any accumulation variant.
    specs.sort(key=lambda s: s.grad_accum_steps > 1)
    # FSDP with every block kept gathered from forward to backward (reshard_after_forward
    # False): the baseline group's sizes (fp32 without checkpointing: a few seconds on a
    # small model) right after that group's own traces, so a default profile can price the
    # knob; every other kept trace after all the traces above, so they never displace one.
    kept = [
        dataclasses.replace(s, fsdp_reshard_after_forward=False)
        for s in specs
        if s.parallelism == "fsdp" and kept_gathered
    ]
    if not specs:
        return []

    def baseline(s: StepSpec) -> bool:
        return _in_first_group(s, specs[0])

    cut = next((i for i, s in enumerate(specs) if not baseline(s)), len(specs))
    early = [s for s in kept if baseline(s)]
    return [*specs[:cut], *early, *specs[cut:], *(s for s in kept if not baseline(s))]


def _in_first_group(spec: StepSpec, first: StepSpec) -> bool:
    """``spec`` is of the first spec's precision x checkpointing group, without accumulation:
    the group whose kept-gathered traces come right after its own (:func:`_distributed_specs`)."""
    return (spec.precision, spec.activation_checkpointing, spec.grad_accum_steps) == (
        first.precision,
        first.activation_checkpointing,
        1,
    )


def _record_results(
    run: ProbeRun,
    specs: Sequence[StepSpec],
    results: Sequence[dict[str, Any]],
    *,
    unmeasured_s: float = DEFAULT_TRACE_S,
) -> list[MemoryTrace]:
    """A row per trace made or failed, one for all the traces the budget left out (each
    taken at the mean of those made, or at ``unmeasured_s`` when none was)."""
    traces = []
    for spec, result in zip(specs, results, strict=True):
        name = f"{spec.parallelism}x{spec.world_size} {probe_rows.label(spec)}"
        if not spec.fsdp_reshard_after_forward:
            name += " kept gathered"
        if result["status"] != "ok":
            if result["status"] == "error":
                run.rows.append(
                    probe_rows.row(
                        "memory_distributed",
                        spec,
                        "error",
                        reason=result["reason"],
                        wall_s=result.get("wall_s", 0.0),
                        name=name,
                    )
                )
            continue
        trace = MemoryTrace.from_dict(result["trace"])
        traces.append(trace)
        run.rows.append(
            probe_rows.measured(
                "memory_distributed",
                spec,
                wall_s=result["wall_s"],
                name=name,
                value=trace.peak_bytes,
                unit="bytes",
            )
        )
    skipped = sum(r["status"] == "skipped" for r in results)
    if skipped:
        run.rows.append(
            probe_rows.skipped(
                "memory_distributed",
                None,
                f"{skipped} traces left out: time budget spent; --budget-s "
                f"{_covering_budget_s(run, results, skipped, unmeasured_s)} would cover them",
                name=GROUP_NAME,
            )
        )
    kept = [
        i
        for i, (s, r) in enumerate(zip(specs, results, strict=True))
        if not s.fsdp_reshard_after_forward and r["status"] == "skipped"
    ]
    if kept:
        run.rows.append(
            probe_rows.skipped(
                "memory_distributed",
                None,
                f"{len(kept)} FSDP traces with the blocks kept gathered "
                "(fsdp_reshard_after_forward false) left out: time budget spent; "
                + _kept_budget_advice(run, specs, results, kept, unmeasured_s),
                name=KEPT_GATHERED_NAME,
            )
        )
    return traces


def _kept_budget_advice(
    run: ProbeRun,
    specs: Sequence[StepSpec],
    results: Sequence[dict[str, Any]],
    kept: Sequence[int],
    unmeasured_s: float = DEFAULT_TRACE_S,
) -> str:
    """Which --budget-s traces the kept-gathered ranks the search needs. The knob is searched
    once any FSDP rank was traced kept gathered (strategies.space.reshard_settings): the first
    group's sizes, which come right after that group's own traces, are enough for it. Covering
    every kept trace (they come last) can ask for hours on a large model."""
    skipped_upto = list(itertools.accumulate(r["status"] == "skipped" for r in results))
    every = _covering_budget_s(run, results, skipped_upto[-1], unmeasured_s)
    first = specs[0]
    group = [i for i in kept if _in_first_group(specs[i], first)]
    if not group:
        return f"--budget-s {every} would cover them"
    enough = _covering_budget_s(run, results, skipped_upto[group[-1]], unmeasured_s)
    return (
        f"--budget-s {enough} would trace {first.precision}/{first.activation_checkpointing}'s "
        f"(enough to search the knob), {every} all of them"
    )


def _covering_budget_s(
    run: ProbeRun,
    results: Sequence[dict[str, Any]],
    skipped: int,
    unmeasured_s: float = DEFAULT_TRACE_S,
) -> int:
    """The --budget-s whose share for this phase also covers ``skipped`` more traces, at the
    mean wall time of the traces made, or ``unmeasured_s`` (profilers.budget.covering_budget_s)."""
    walls = [float(r["wall_s"]) for r in results if r["status"] == "ok"]
    per_trace = statistics.fmean(walls) if walls else unmeasured_s
    return covering_budget_s(
        run.options.budget_s, ("memory_distributed",), skipped * per_trace, run.clock.dropped
    )


# -- child-process entry point (top level: pickled by reference) ------------------------------


def _distributed_trace_child(
    workload: Workload, specs: list[StepSpec], target: str, budget_s: float, first_s: float = 0.0
) -> list[dict[str, Any]]:
    """Per-rank traces under a fake process group, in priority order, until the budget ends.

    A trace starts only when it would end before the deadline at the mean wall time of the
    traces made so far (the first at ``first_s``, from what a one-device trace took: 0 when
    unknown, and it always starts): a 70B rank's trace takes 10-15 s, and
    checking only that the deadline had not passed let the last one overrun the whole
    profile's budget by that much. Returns one dict per spec: the trace, or why there is none
    (error, or budget spent).
    """
    from profilers.memory_distributed import trace_in_this_process

    deadline = time.perf_counter() + budget_s
    out: list[dict[str, Any]] = []
    walls: list[float] = []
    for spec in specs:
        expected = statistics.fmean(walls) if walls else first_s
        if time.perf_counter() + expected > deadline:
            out.append({"status": "skipped", "reason": "time budget spent"})
            continue
        started = time.perf_counter()
        try:
            traced = trace_in_this_process(workload, [spec], target)[0]
            walls.append(time.perf_counter() - started)
            out.append({"status": "ok", "trace": traced.to_dict(), "wall_s": walls[-1]})
        except Exception as exc:
            walls.append(time.perf_counter() - started)
            out.append({"status": "error", "reason": probe_rows.one_line(exc), "wall_s": walls[-1]})
    return out
