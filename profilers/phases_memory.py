"""Memory phases of one device: fake-traced steps, then real checks of what tracing cannot see.

:mod:`profilers.phases_core` traces steps under FakeTensorMode (no allocation, so nothing can
run out of memory). :func:`memory_check_phase` runs real steps of the configs predicted to fit,
each in a child, and turns the gaps between truth and trace into a :class:`MemoryOverhead` (CUDA
context and workspaces, fragmentation; on CPU the process's resident memory beyond the
allocator's).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from profilers import probe_rows
from profilers.budget import covering_budget_s
from profilers.checkpointing import is_selective
from profilers.isolate import quiet_native_output
from profilers.memory_model import MemoryModel
from profilers.memory_records import PREDICTED_NOT_TO_FIT, CpuStepMemory, CudaStepMemory
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


# -- real memory checks -----------------------------------------------------------------------


def memory_check_phase(
    run: ProbeRun,
    models: Sequence[MemoryModel],
    precisions: Sequence[str],
    capacity: int,
    lead: str = "fp32",
) -> MemoryCheckResult:
    """A real step at the middle traced size for each group predicted to fit ``capacity``,
    ``lead`` first: the very first whatever the budget, the first of each other checkpointing mode
    while the whole budget has room for one more, the others only within the phase's share.

    One of each mode because the overhead (the overall max) is not the same for both on CPU:
    the resident set does not shrink with the allocator's peak when blocks are recomputed
    (bert-tiny, micro-batch 8: resident peaks within 1% of each other for a traced peak 37%
    lower), so checkpointed configs carry ~9 MiB more overhead than measured without.
    """
    share = run.clock.share("memory_check")
    deadline = time.perf_counter() + share
    b = run.options.trace_micro_batch_sizes[1]
    candidates = [(p, c) for p in precisions for c in run.options.checkpointing]
    # The core's lead precision first (fp32 unless a GPU runs 16-bit much faster): the
    # others are checked only while the budget lasts.
    candidates.sort(key=lambda pc: (pc[0] != lead, pc[0] != "fp32", pc[1] != "none"))
    evidence = _Evidence()
    tried: set[str] = set()  # checkpointing modes checked (or attempted) once already
    walls: list[float] = []  # each check's seconds
    skipped: list[int] = []  # rows of checks left out for time
    for p, c in candidates:
        spec = run.spec(p, c, b)
        model = memory_model_for(models, p, c)
        if model is None:
            continue
        if model.predict(b) > run.options.memory_budget * capacity:
            run.rows.append(probe_rows.skipped("memory_check", spec, PREDICTED_NOT_TO_FIT))
            continue
        # Past the share, a mode's first check still runs while the whole budget has room
        # for one more (as long as the last check took), the very first one always.
        spent = time.perf_counter() > deadline
        # The selective settings' checks (ops, blocks:K) only within the share: the budget.
        late = (
            c in tried
            or is_selective(c)
            or (bool(walls) and run.clock.remaining() < walls[-1])  # as long as the last took
        )
        if spent and late:
            skipped.append(len(run.rows))
            run.rows.append(probe_rows.skipped("memory_check", spec, "time budget spent"))
            continue
        tried.add(c)
        run.clock.say(f"memory: real step {probe_rows.label(spec)}")
        outcome = run.isolated(
            _memory_check_child,
            run.workload,
            spec,
            run.options.device,
            timeout_s=max(MEMORY_CHECK_MIN_TIMEOUT_S, deadline - time.perf_counter()),
        )
        walls.append(outcome.wall_s)
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
                # a model no fake trace can run was fitted from real steps (memory_measured)
                reason=f"{'real-step' if run.untraceable else 'traced'} fit {predicted} B",
            )
        )
    _name_covering_budget(run, skipped, walls)
    return MemoryCheckResult(
        measured=tuple(evidence.measured), overhead=evidence.overhead(run.on_gpu)
    )


def _name_covering_budget(run: ProbeRun, skipped: Sequence[int], walls: Sequence[float]) -> None:
    """Add to each check left out for time the --budget-s whose memory-check share covers them
    all, at what the checks that ran took on average (each is a fresh child)."""
    if not skipped or not walls:
        return
    need = len(skipped) * sum(walls) / len(walls)
    suggested = covering_budget_s(run.options.budget_s, ("memory_check",), need, run.clock.dropped)
    probe_rows.name_covering_budget(
        run.rows, skipped, suggested, f"{len(skipped)} real-step checks"
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
            # The libraries' workspaces in the allocator are per process too, and beyond
            # what the trace counts: fixed, and not the trace's error.
            self.fixed.append(record.context_bytes + record.workspace_bytes + record.library_bytes)
            if record.peak_allocated_bytes:
                self.fragmentation.append(record.fragmentation_bytes / record.peak_allocated_bytes)
            truth = record.step_peak_allocated_bytes
        else:
            record = CpuStepMemory.from_dict(data)
            truth = record.peak_bytes
            if rss is not None:
                # Read before the child loaded a gloo group and the DDP/FSDP wrappers: all of
                # it is what a single-device training process carries beyond its tensors.
                self.fixed.append(max(0, rss - truth))
        self.measured.append(record)
        if truth:
            self.errors.append(abs(truth - predicted) / truth)
        return truth

    def overhead(self, on_gpu: bool) -> MemoryOverhead:
        method = (
            "CUDA: context + workspaces from mem_get_info, fragmentation from "
            "max_memory_reserved / max_memory_allocated"
            if on_gpu
            else "CPU: process resident peak (VmHWM) minus the allocator's peak, the largest "
            "over one real step per checkpointing mode; ddp/fsdp ranks: plus what a gloo "
            "group and the wrapper add to that process afterwards"
        )
        return MemoryOverhead(
            fixed_bytes=max(self.fixed) if self.fixed else 0,
            parallel_bytes=self.parallel,
            fragmentation_fraction=max(self.fragmentation) if self.fragmentation else 0.0,
            trace_error_fraction=max(self.errors) if self.errors else 0.0,
            method=method,
        )


# -- child-process entry point (top level: pickled by reference) ------------------------------


CPU_CHECK_WARMUP_STEPS = 2


def _memory_check_child(
    workload: Workload, spec: StepSpec, device: str
) -> tuple[dict[str, Any], int | None, dict[str, int]]:
    """Real memory of one step, plus (CPU) the process's resident peak beside the allocator's
    and what a ddp/fsdp rank's process group and wrapper modules add to such a process."""
    from profilers.memory import measure_cpu_step_memory, measure_cuda_step_memory
    from profilers.memory_truth import parallel_resident_bytes, resident_peak_bytes

    if device.startswith("cuda"):
        # A GPU rank's host memory is not what the budget holds: nothing to add per rank.
        return measure_cuda_step_memory(workload, spec, device).to_dict(), None, {}
    if isinstance(workload, DataWorkload):
        # Load a few real batches first, as training does: the loader's modules and the
        # token file's pages are part of the resident memory a training process carries.
        for _ in workload.data_batches(spec, 0, 4):
            pass
    with quiet_native_output():
        # Two steps before the measured one: a training process's resident peak still grows
        # over its first steps (gpt-tiny here: +47 MiB from the first step to the second, +4
        # to the third, then flat), and the overhead read below is its steady state's. With
        # one, the check's resident peak read 2-4% below advisor train's steps 3-5.
        measured = measure_cpu_step_memory(workload, spec, min_warmup=CPU_CHECK_WARMUP_STEPS)
    # The resident peak of a single-device training process: read it before loading what
    # only a rank loads. Building the step loads what any torch training process loads
    # (with torch 2.13 the optimizer's constructor imports torch._dynamo, which imports the
    # DTensor/FSDP stacks, inductor and, where installed, triton: 70-170 MiB resident), so
    # what a ddp/fsdp rank adds is measured afterwards, on top of all that.
    rss = resident_peak_bytes()
    extra = parallel_resident_bytes()
    return measured.to_dict(), rss, extra
