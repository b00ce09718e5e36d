"""Per-rank memory of DDP and FSDP steps, traced under a fake process group in one child.

The fake group is process-global, so every distributed trace runs in a single child that
works through the specs in priority order (every group's sizes before any accumulation
variant) until its budget ends, and reports one result per spec.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from profilers import probe_rows
from profilers.memory_records import MemoryTrace
from profilers.probe_run import CHILD_START_S, MIN_CHILD_SHARE_S, ProbeRun
from profilers.workload import StepSpec, Workload

# The child checks its deadline only between traces, so the last one it starts can run past
# its share: the timeout allows one more trace, plus the child's start-up and teardown, before
# a healthy child is killed and every trace it had made is lost with it.
DISTRIBUTED_TRACE_TIMEOUT_MARGIN_S = 20
GROUP_NAME = "ddp/fsdp per-rank"  # the name of the rows about the phase as a whole


def distributed_trace_phase(
    run: ProbeRun,
    precisions: Sequence[str],
    target: str,
    world_sizes: Sequence[int],
    parallelisms: Sequence[str] = ("fsdp", "ddp"),
) -> list[MemoryTrace]:
    """Per-rank memory of ``parallelisms`` steps at each world size, traced under a fake
    process group in one child (the group is process-global). fp32 first; the rest while
    the budget lasts."""
    share = run.clock.share("memory_distributed")
    if not world_sizes or share < MIN_CHILD_SHARE_S:
        reason = "no world size > 1" if not world_sizes else "time budget spent"
        run.rows.append(probe_rows.skipped("memory_distributed", None, reason, name=GROUP_NAME))
        return []
    specs = _distributed_specs(run, precisions, world_sizes, parallelisms)
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
        timeout_s=share + DISTRIBUTED_TRACE_TIMEOUT_MARGIN_S,
    )
    if not outcome.ok:
        run.rows.append(probe_rows.failed("memory_distributed", None, outcome, name=GROUP_NAME))
        return []
    return _record_results(run, specs, outcome.value)


def _distributed_specs(
    run: ProbeRun,
    precisions: Sequence[str],
    world_sizes: Sequence[int],
    parallelisms: Sequence[str] = ("fsdp", "ddp"),
) -> list[StepSpec]:
    """Every precision x checkpointing x layout x world size at each traced size and once
    with accumulation; fp32 first, every group's sizes before any accumulation variant."""
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
    # Priority: every group's two sizes before any accumulation variant.
    specs.sort(key=lambda s: s.grad_accum_steps > 1)
    return specs


def _record_results(
    run: ProbeRun, specs: Sequence[StepSpec], results: Sequence[dict[str, Any]]
) -> list[MemoryTrace]:
    """A row per trace made or failed, one for all the traces the budget left out."""
    traces = []
    for spec, result in zip(specs, results, strict=True):
        name = f"{spec.parallelism}x{spec.world_size} {probe_rows.label(spec)}"
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
                f"{skipped} traces left out: time budget spent",
                name=GROUP_NAME,
            )
        )
    return traces


# -- child-process entry point (top level: pickled by reference) ------------------------------


def _distributed_trace_child(
    workload: Workload, specs: list[StepSpec], target: str, budget_s: float
) -> list[dict[str, Any]]:
    """Per-rank traces under a fake process group, in priority order, until the budget ends.

    Returns one dict per spec: the trace, or why there is none (error, or budget spent).
    """
    from profilers.memory_distributed import trace_in_this_process

    deadline = time.perf_counter() + budget_s
    out: list[dict[str, Any]] = []
    for spec in specs:
        if time.perf_counter() > deadline:
            out.append({"status": "skipped", "reason": "time budget spent"})
            continue
        started = time.perf_counter()
        try:
            trace = trace_in_this_process(workload, [spec], target)[0]
            out.append(
                {"status": "ok", "trace": trace.to_dict(), "wall_s": time.perf_counter() - started}
            )
        except Exception as exc:
            out.append(
                {
                    "status": "error",
                    "reason": probe_rows.one_line(exc),
                    "wall_s": time.perf_counter() - started,
                }
            )
    return out
