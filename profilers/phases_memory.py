"""Memory phases of one device: fake-traced steps, then real checks of what tracing cannot see.

:func:`trace_phase` traces steps under FakeTensorMode (no allocation, so nothing can run out of
memory): every precision x checkpointing at the sizes a fit needs, and later the accumulation
variants. :func:`memory_check_phase` runs real steps of the configs predicted to fit, each in a
child, and turns the gaps between truth and trace into a :class:`MemoryOverhead` (CUDA context
and workspaces, fragmentation; on CPU the process's resident memory beyond the allocator's).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from profilers import probe_rows
from profilers.isolate import quiet_native_output
from profilers.memory_model import MemoryModel
from profilers.memory_records import CpuStepMemory, CudaStepMemory, MemoryTrace
from profilers.probe_run import ProbeRun
from profilers.profile_record import MemoryOverhead
from profilers.workload import DataWorkload, StepSpec, Workload

# A floor, not a target: the first check runs even when the share is spent, and one real step
# measured under torch.profiler, after loading a gloo group and the DDP/FSDP wrappers, takes
# seconds (3.8 s for a one-layer gpt-tiny on 2 cores); a healthy check must not read as a hang.
MEMORY_CHECK_MIN_TIMEOUT_S = 30.0

StepMemory = CpuStepMemory | CudaStepMemory


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryCheckResult:
    measured: tuple[StepMemory, ...]  # the real steps, fp32 first
    overhead: MemoryOverhead  # what the traces miss, from those steps


def memory_model_for(
    models: Sequence[MemoryModel], precision: str, checkpointing: str
) -> MemoryModel | None:
    """The first fitted model of this precision and checkpointing, if any."""
    return next(
        (
            m
            for m in models
            if m.precision == precision and m.activation_checkpointing == checkpointing
        ),
        None,
    )


# -- fake-traced memory ---------------------------------------------------------------------


def trace_phase(
    run: ProbeRun, precisions: Sequence[str], target: str, *, accumulation: bool
) -> list[MemoryTrace]:
    """Fake-traced steps of every precision x checkpointing: the two micro-batch sizes a
    fit needs (always, whatever the budget), or, in a later phase, the accumulation
    variants (while the budget lasts)."""
    from profilers.memory import trace_step_memory

    share = run.clock.share("memory_accumulation" if accumulation else "memory")
    deadline = time.perf_counter() + share
    sizes = run.options.trace_micro_batch_sizes
    b1 = sizes[0]
    plan_sizes = ((b1, 2),) if accumulation else tuple((b, 1) for b in sizes)
    plan = [
        (p, c, b, a)
        for p in sorted(precisions, key=lambda p: p != "fp32")
        for c in run.options.checkpointing
        for b, a in plan_sizes
    ]
    traces = []
    for i, (p, c, b, a) in enumerate(plan):
        spec = run.spec(p, c, b, a)
        if accumulation and time.perf_counter() > deadline:
            run.rows.append(probe_rows.skipped("memory", spec, "time budget spent"))
            continue
        run.clock.say(f"memory: tracing {probe_rows.label(spec)} ({i + 1}/{len(plan)})")
        t0 = time.perf_counter()
        try:
            trace = trace_step_memory(run.workload, spec, target_device_type=target)
        except Exception as exc:
            run.rows.append(probe_rows.raised("memory", spec, exc, wall_s=time.perf_counter() - t0))
            continue
        traces.append(trace)
        run.measured("memory", spec, since=t0, value=trace.peak_bytes, unit="bytes")
    return traces


# -- real memory checks -----------------------------------------------------------------------


def memory_check_phase(
    run: ProbeRun, models: Sequence[MemoryModel], precisions: Sequence[str], capacity: int
) -> MemoryCheckResult:
    """A real step at the middle traced size for each group predicted to fit ``capacity``,
    fp32 first: until one check succeeds whatever the budget, then only while it lasts."""
    share = run.clock.share("memory_check")
    deadline = time.perf_counter() + share
    b = run.options.trace_micro_batch_sizes[1]
    candidates = [(p, c) for p in precisions for c in run.options.checkpointing]
    # fp32 first: the others are checked only while the budget lasts.
    candidates.sort(key=lambda pc: (pc[0] != "fp32", pc[1] != "none"))
    evidence = _Evidence()
    for p, c in candidates:
        spec = run.spec(p, c, b)
        model = memory_model_for(models, p, c)
        if model is None:
            continue
        if model.predict(b) > run.options.memory_budget * capacity:
            run.rows.append(
                probe_rows.skipped("memory_check", spec, "predicted not to fit the device")
            )
            continue
        if evidence.measured and time.perf_counter() > deadline:
            run.rows.append(probe_rows.skipped("memory_check", spec, "time budget spent"))
            continue
        run.clock.say(f"memory: real step {probe_rows.label(spec)}")
        outcome = run.isolated(
            _memory_check_child,
            run.workload,
            spec,
            run.options.device,
            timeout_s=max(MEMORY_CHECK_MIN_TIMEOUT_S, deadline - time.perf_counter()),
        )
        if not outcome.ok:
            run.rows.append(probe_rows.failed("memory_check", spec, outcome))
            continue
        predicted = model.predict(b)
        truth = evidence.add(*outcome.value, predicted=predicted)
        run.rows.append(
            probe_rows.measured(
                "memory_check",
                spec,
                wall_s=outcome.wall_s,
                value=truth,
                unit="bytes",
                reason=f"traced fit {predicted} B",
            )
        )
    return MemoryCheckResult(
        measured=tuple(evidence.measured), overhead=evidence.overhead(run.on_gpu)
    )


@dataclass
class _Evidence:
    """What the real checks so far say about the traces' blind spots."""

    measured: list[StepMemory] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)  # |truth - traced fit| / truth
    fixed: list[int] = field(default_factory=list)  # bytes beyond the step's own peak
    fragmentation: list[float] = field(default_factory=list)  # reserved - allocated, / allocated
    parallel: dict[str, int] = field(default_factory=dict)  # per layout, from the first check

    def add(
        self, data: dict[str, Any], rss: int | None, rank_extra: dict[str, int], *, predicted: int
    ) -> int:
        """Record one check (the child's three results); returns its true peak in bytes."""
        self.parallel = self.parallel or rank_extra
        record: StepMemory
        if data.get("device_name") is not None:
            record = CudaStepMemory.from_dict(data)
            self.fixed.append(record.context_bytes + record.workspace_bytes)
            if record.peak_allocated_bytes:
                self.fragmentation.append(record.fragmentation_bytes / record.peak_allocated_bytes)
            truth = record.peak_allocated_bytes
        else:
            record = CpuStepMemory.from_dict(data)
            truth = record.peak_bytes
            if rss is not None:
                # Less the FSDP stack and gloo group the child loaded on purpose.
                self.fixed.append(max(0, rss - truth - rank_extra.get("fsdp", 0)))
        self.measured.append(record)
        if truth:
            self.errors.append(abs(truth - predicted) / truth)
        return truth

    def overhead(self, on_gpu: bool) -> MemoryOverhead:
        method = (
            "CUDA: context + workspaces from mem_get_info, fragmentation from "
            "max_memory_reserved / max_memory_allocated"
            if on_gpu
            else "CPU: process resident peak (VmHWM) minus the allocator's peak; ddp/fsdp "
            "ranks: plus the resident growth of a gloo group and the wrapper's imports"
        )
        return MemoryOverhead(
            fixed_bytes=max(self.fixed) if self.fixed else 0,
            parallel_bytes=self.parallel,
            fragmentation_fraction=max(self.fragmentation) if self.fragmentation else 0.0,
            trace_error_fraction=max(self.errors) if self.errors else 0.0,
            method=method,
        )


# -- child-process entry point (top level: pickled by reference) ------------------------------


def _memory_check_child(
    workload: Workload, spec: StepSpec, device: str
) -> tuple[dict[str, Any], int | None, dict[str, int]]:
    """Real memory of one step, plus (CPU) the process's resident peak beside the allocator's
    and what a ddp/fsdp rank's process group and wrapper modules add to a process."""
    from profilers.memory import measure_cpu_step_memory, measure_cuda_step_memory
    from profilers.memory_truth import parallel_resident_bytes, resident_peak_bytes

    if device.startswith("cuda"):
        # A GPU rank's host memory is not what the budget holds: nothing to add per rank.
        return measure_cuda_step_memory(workload, spec, device).to_dict(), None, {}
    # torch.profiler, which measures the step below, imports the DTensor/FSDP stacks (tens of
    # MiB resident) that a single-device trainer never loads, and a DDP/FSDP rank does. Load
    # them first (with a gloo group and the wrappers), measuring what they add: the caller
    # takes that off this process's overhead, so the overhead is a single-device trainer's
    # and each rank adds its own.
    extra = parallel_resident_bytes()
    if isinstance(workload, DataWorkload):
        # Load a few real batches first, as training does: the loader's modules and the
        # token file's pages are part of the resident memory a training process carries.
        for _ in workload.data_batches(spec, 0, 4):
            pass
    with quiet_native_output():
        measured = measure_cpu_step_memory(workload, spec)
    return measured.to_dict(), resident_peak_bytes(), extra
