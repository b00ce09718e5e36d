"""Run every probe on one workload within a time budget and assemble the Profile.

Order: device facts and micro-benchmarks, model facts and FLOPs, then the search's core group
by group (each precision x checkpointing: fake-traced memory at two micro-batch sizes, no
allocation, then timed steps, isolated, interleaved across two sizes; fp32 first, a group the
budget cannot complete skipped whole with the budget that would cover it), the refinements
(accumulation and smaller traced sizes), the recompute of the checkpointed groups the core
traced but did not time (beside the plain step, in one child), the chunked loss, torch.compile,
collectives (without them no DDP/FSDP candidate is
priced), real memory checks of configs that fit (what tracing cannot see), and the input
pipeline. Each probe that runs real steps runs in a
child process with a timeout: an OOM, crash or hang becomes a row with its status and reason,
and profiling goes on.

:func:`run_profile` reads top-down in that order. Each phase lives in a ``profilers.phases_*``
module and shares one :class:`profilers.probe_run.ProbeRun` (options, budget clock, rows); the
budget's shares are in :mod:`profilers.budget`, the rows' shapes in :mod:`profilers.probe_rows`.
Names imported ``as`` themselves are re-exported: callers and tests import them from here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.metadata
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from profilers.budget import Progress as Progress
from profilers.fake_kernels import fake_deadline
from profilers.memory_measured import training_state_bytes
from profilers.phases_chunked import chunked_loss_phase
from profilers.phases_comm import communication_phase
from profilers.phases_compile import compile_phase
from profilers.phases_core import core_phase, refine_phase
from profilers.phases_distributed import distributed_trace_phase, what_if_rank_order
from profilers.phases_facts import device_phase, model_phase, usable_precisions
from profilers.phases_input import input_phase
from profilers.phases_memory import memory_check_phase
from profilers.phases_recompute import recompute_phase
from profilers.phases_selective import line_rows
from profilers.phases_time import _SPLIT_COST_STEPS as _SPLIT_COST_STEPS
from profilers.phases_time import (
    CPU_MAX_TIMED_MICRO_BATCH as CPU_MAX_TIMED_MICRO_BATCH,
)
from profilers.phases_time import (
    GPU_MAX_TIMED_MICRO_BATCH as GPU_MAX_TIMED_MICRO_BATCH,
)
from profilers.phases_time import _doublings as _doublings
from profilers.phases_time import _split_target as _split_target
from profilers.phases_time import _timing_child as _timing_child
from profilers.probe_rows import fit_gap, one_line
from profilers.probe_run import CHILD_START_S as CHILD_START_S
from profilers.probe_run import ProbeRun
from profilers.probe_run import ProfileOptions as ProfileOptions
from profilers.profile_record import Fits, ProbeRow, Profile
from profilers.stopping import INTERRUPTED, stop_on_interrupt, stopped
from profilers.workload import DataWorkload, StepSpec, Workload

# Phases a profile of a model whose training state alone exceeds this device drops before its
# core: each serves a plan on this device only.
WHAT_IF_ONLY_DROPPED = ("communication", "input")
NOTHING_TO_MEASURE_HERE = (
    "the model does not fit this device (no plan on it to measure for); a what-if (--target) "
    "uses the target's datasheet"
)


def _phases_turned_off(workload: Workload, options: ProfileOptions) -> list[str]:
    """The budget phases these options leave with nothing to do."""
    off = []
    if not options.comm or options.comm_world_sizes == ():
        off.append("communication")
    if not options.input_workers or not isinstance(workload, DataWorkload):
        off.append("input")
    return off


# A fake trace or count in the profile's process stops this far past the budget: 8% of it
# (issue 13: the budget holds within +10%; what follows the stop, the fits and the files, took
# 1-3 s of a 120 s Jamba profile that stopped at +10% and ended at +10.8%), at least 10 s (a
# tiny test budget on a loaded host).
TRACE_OVERRUN_PART = 0.08
TRACE_OVERRUN_MIN_S = 10.0


def run_profile(
    workload: Workload, options: ProfileOptions, progress: Progress | None = None
) -> Profile:
    """Probe ``workload`` on ``options.device`` within about ``options.budget_s`` seconds."""
    if options.budget_s <= 0:
        raise ValueError(f"budget_s must be positive, got {options.budget_s}")
    run = ProbeRun(workload, options, progress)
    rows_before_stop: list[int] = []

    def on_stop() -> None:  # in the Ctrl-C handler: no phase gets time from now on
        rows_before_stop.append(len(run.rows))
        run.clock.stop()
        run.clock.say("Ctrl-C: ending with what was measured (Ctrl-C again abandons it)")

    # Nothing traced in this process runs unbounded: a fake trace or count past the budget and
    # its overrun stops (profilers.fake_kernels.fake_deadline) and its probe says why.
    overrun = max(TRACE_OVERRUN_PART * options.budget_s, TRACE_OVERRUN_MIN_S)
    with (
        stop_on_interrupt(on_stop),
        fake_deadline(
            time.perf_counter() + run.clock.remaining() + overrun,
            f"--budget-s {options.budget_s:g} and {overrun:.0f} s over it",
        ),
    ):
        profile = _probe(run, workload, options)
        why = stopped()
    if why is None:
        return profile
    # Each probe the stop cut short is a skipped row that says so (not a timeout, an error or
    # a budget too small: a re-run with the same budget measures it).
    first = rows_before_stop[0]
    rows = [
        interrupted_row(row, why) if i >= first and cut_short(row, why) else row
        for i, row in enumerate(profile.probes)
    ]
    raise ProfileInterrupted(dataclasses.replace(profile, probes=tuple(rows)))


def cut_short(row: ProbeRow, why: str) -> bool:
    """Did the stop keep this probe (one recorded after it) from finishing? Its own reason
    says so (a child stopped, a fake trace ended: ``why`` in it), or it was skipped or timed
    out for the time the stopped clock no longer gave. Not a probe the options turned off
    (``disabled``), one unsupported here, or an error or out-of-memory of its own."""
    if why in row.reason:
        return True
    return row.status in ("skipped", "timeout") and "budget" in row.reason


class ProfileInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a profile (:mod:`profilers.stopping`); ``profile`` is what it measured
    (its unfinished probes are skipped rows that say so), for the caller to save before it lets
    the interrupt go on; ``saved_to``: where it did (the CLI names it)."""

    def __init__(self, profile: Profile) -> None:
        super().__init__(INTERRUPTED)
        self.profile = profile
        self.saved_to: object = None


def interrupted_row(row: ProbeRow, why: str) -> ProbeRow:
    """``row`` as a probe the profile's stop kept from finishing."""
    return dataclasses.replace(row, status="skipped", reason=why)


def _probe(run: ProbeRun, workload: Workload, options: ProfileOptions) -> Profile:
    from profilers.memory_model import fit_memory_models
    from profilers.throughput import fit_step_times

    # Phases the options turn off give their share to the others from the start (a phase's
    # share is fixed when it starts, so a weight that only left at its turn would be lost).
    run.clock.drop(*_phases_turned_off(workload, options))
    device = device_phase(run)
    precisions = usable_precisions(run, device)
    model = model_phase(run)
    kind = "cuda" if options.device.startswith("cuda") else "cpu"
    # The traces' target: this device's kind, or a CUDA GPU from a CPU (a what-if profile).
    target = options.trace_for or kind
    # Probes are sized against the memory free NOW on a GPU (a probe must fit beside whatever
    # else holds the GPU), and against total RAM (or the cgroup limit) on a CPU: each probe runs
    # in an isolated child, so one that outgrows the RAM actually free is recorded as oom and
    # profiling goes on. The plan's budget makes the reverse choice (RAM available when
    # profiled, total GPU memory): strategies/cost.py machine_from_profile owns that one.
    capacity = device.free_memory_bytes if kind == "cuda" else device.total_memory_bytes
    run.usable_bytes = options.memory_budget * capacity
    run.state_bytes = training_state_bytes(model.facts.num_params, model.facts.num_trainable_params)
    if run.state_bytes > run.usable_bytes:
        # Its training state alone exceeds this device (a 9B model on a 24 GiB host): no step
        # will run here, and no collective or loader serves a plan on it. Their shares go to
        # the traces the what-if needs from the start, not only once the core has found that
        # nothing fits (nor is anything compiled or checked on a real step: the core borrows
        # those shares for its lead groups, profilers.phases_core.core_phase).
        run.clock.drop(*WHAT_IF_ONLY_DROPPED, reason=NOTHING_TO_MEASURE_HERE)
    # The search's core, group by group (memory at two sizes, then step times), then the
    # refinements while the budget lasts.
    core = core_phase(run, precisions, target, capacity, device, model.flops)
    timings = core.timings
    if core.unfit and not core.groups:
        # Nothing fits this device even at micro-batch 1 (a 70B model on a small host): the
        # profile serves a what-if (--target), which prices the target from its datasheet.
        # Measuring this device's collectives and loader serves no plan: their time goes to
        # the memory traces the what-if needs (the refinements, the per-rank traces).
        run.clock.drop("communication", "input", reason=NOTHING_TO_MEASURE_HERE)
    time_models = _fit_groups(fit_step_times, timings, run.rows, "throughput")
    traces = core.traces + refine_phase(run, core, target)
    recompute = recompute_phase(run, core.skipped, timings, time_models, traces)
    time_models += recompute.time_models
    chunked = chunked_loss_phase(
        run, model.facts, target, timings, time_models, traces, core.costs.trace
    )
    timings = [*timings, *recompute.timings]
    traces += chunked.traces
    timings = [*timings, *chunked.timings]
    time_models += chunked.time_models
    compiled = compile_phase(run, core.groups, core.timings)
    models = _fit_groups(fit_memory_models, traces, [], "memory")
    comm = communication_phase(run)
    checks = memory_check_phase(run, models, precisions, capacity, core.lead)
    world_sizes, layouts = _traced_layouts(options, kind)
    order = None
    if core.unfit and not core.groups:
        # Nothing fits this device even at micro-batch 1 (a 70B model on a small host): the
        # profile serves a what-if (--target), where memory binds. DDP ranks hold a whole
        # step each, so they fit no better: FSDP only, bf16's groups first (what_if_rank_order).
        layouts = tuple(layout for layout in layouts if layout == "fsdp")
        order = what_if_rank_order(models, options.trace_micro_batch_sizes[-1])
    traces += distributed_trace_phase(
        run,
        precisions,
        target,
        world_sizes,
        layouts,
        order,
        core.costs.trace,
        kept_gathered=model.facts.repeated_blocks,
    )
    models = _fit_groups(fit_memory_models, traces, run.rows, "memory")
    # blocks:K: how far the none-full line is from the measured middle K (memory and time).
    sizes = options.trace_micro_batch_sizes
    run.rows += line_rows(models, time_models, model.facts.num_layers, sizes[-1])
    micro = max((t.spec.micro_batch_size for t in timings), default=4)
    inputs = input_phase(run, micro)
    run.clock.say("done")
    return Profile(
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        tool=_versions(options.tool),
        workload={**_describe(workload), "seq_len": options.seq_len},
        device=device,
        model=model.facts,
        flops=model.flops,
        memory=tuple(traces),
        memory_measured=checks.measured,
        memory_overhead=checks.overhead,
        throughput=tuple(timings),
        communication=tuple(comm.samples) if comm is not None else (),
        communication_runs=tuple(comm.runs) if comm is not None else (),
        input=tuple(inputs),
        compile=tuple(compiled),
        fits=Fits(
            memory=tuple(models),
            time=tuple(time_models),
            communication=tuple(comm.fits) if comm is not None else (),
        ),
        probes=tuple(run.rows),
        budget_s=options.budget_s,
        precisions=tuple(options.precisions) if options.precisions else None,
        elapsed_s=run.clock.elapsed(),
    )


def _versions(extra: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("torch", "optuna", "transformers", "numpy", "pandas"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return {**out, **extra}


def _describe(workload: Workload) -> dict[str, Any]:
    """What the workload says about itself (AdvisorWorkload: model, args, data), if anything."""
    describe = getattr(workload, "describe", None)
    return dict(describe()) if callable(describe) else {}


def _traced_layouts(options: ProfileOptions, kind: str) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """(world sizes, parallelisms) whose per-rank memory the profile traces.

    The world sizes available here, DDP and FSDP. With one device only, FSDP ranks at world
    size 2 still: a fake process group needs no second device, and a what-if for N GPUs
    (``--target``) then reshards a traced rank (``MemoryModel.resharded``) instead of deriving
    one from the single-device trace, which holds every gradient and autocast's copy of every
    weight. Explicit ``comm_world_sizes`` are taken as they are (``()``: none).
    """
    layouts = ("fsdp", "ddp")
    if options.comm_world_sizes is not None:
        return options.comm_world_sizes, layouts
    from profilers.comm import available_world_sizes

    local = available_world_sizes(kind)
    return (local, layouts) if local else ((2,), ("fsdp",))


class _Specced(Protocol):
    @property
    def spec(self) -> StepSpec: ...


_Record = TypeVar("_Record", bound=_Specced)
_Fitted = TypeVar("_Fitted")


def _fit_groups(
    fit: Callable[[Sequence[_Record]], Iterable[_Fitted]],
    records: Sequence[_Record],
    rows: list[ProbeRow],
    probe: str,
) -> list[_Fitted]:
    """Fit each group that has what a fit needs; a group that cannot be fitted becomes a row."""
    try:
        return list(fit(records))
    except ValueError:
        pass
    # One bad group must not sink the others: fit group by group.
    groups: dict[tuple[str, str, str, int, int, bool], list[_Record]] = {}
    for record in records:
        spec = record.spec
        key = (
            spec.precision,
            spec.activation_checkpointing,
            spec.parallelism,
            spec.world_size,
            spec.loss_chunks,
            spec.fsdp_reshard_after_forward,
        )
        groups.setdefault(key, []).append(record)
    out: list[_Fitted] = []
    for (precision, checkpointing, parallelism, world, _chunks, _reshard), group in groups.items():
        try:
            out.extend(fit(group))
        except ValueError as exc:
            layout = "" if parallelism == "single" else f"{parallelism}x{world} "
            sizes = sorted({r.spec.micro_batch_size for r in group if r.spec.grad_accum_steps == 1})
            # One size only: the probe stopped (time budget) before a second one, which is
            # a gap, not a failure; the cost model falls back to what it has.
            short = len(sizes) < 2
            rows.append(
                fit_gap(
                    probe,
                    name=f"{layout}{precision}/{checkpointing}",
                    status="skipped" if short else "error",
                    reason=(
                        f"only micro-batch size {sizes[0] if sizes else '-'} was measured: "
                        "a fit needs two"
                        if short
                        else one_line(exc)
                    ),
                    precision=precision,
                    checkpointing=checkpointing,
                )
            )
    return out
