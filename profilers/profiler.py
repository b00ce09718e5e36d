"""Run every probe on one workload within a time budget and assemble the Profile.

Order: device facts and micro-benchmarks, model facts and FLOPs, fake-traced memory (no
allocation: every precision x checkpointing at two micro-batch sizes and once with
accumulation), real memory checks of configs that fit (what tracing cannot see), timed steps per
precision x checkpointing (isolated, interleaved across two micro-batch sizes), collectives,
and the input pipeline. Each probe that runs real steps runs in a child process with a timeout:
an OOM, crash or hang becomes a row with its status and reason, and profiling goes on.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.metadata
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from profilers.isolate import Isolation, Outcome, quiet_native_output, run_isolated
from profilers.memory_model import MemoryModel
from profilers.memory_records import CpuStepMemory, CudaStepMemory, MemoryTrace
from profilers.profile_record import (
    Fits,
    InputSample,
    MemoryOverhead,
    ProbeRow,
    Profile,
)
from profilers.throughput import StepTiming
from profilers.workload import CHECKPOINTING, PRECISIONS, DataWorkload, StepSpec, Workload

Progress = Callable[[str, float], None]  # (what is running now, fraction of the budget spent)

# Shares of the budget per phase; what a phase leaves unused flows to the next ones.
# In the order the phases run: what matters most for the search comes first.
SHARES = {
    "device": 0.05,
    "model": 0.02,
    "memory": 0.10,
    "throughput": 0.40,
    "memory_accumulation": 0.04,
    "memory_check": 0.09,
    "communication": 0.15,
    "memory_distributed": 0.08,
    "input": 0.07,
}
CPU_MAX_TIMED_MICRO_BATCH = 8  # CPU throughput is flat or falls beyond ~8 (DESIGN.md)
GPU_MAX_TIMED_MICRO_BATCH = 64
CHILD_START_S = 3.0  # spawn + import torch + build, measured 1.1-3 s on 2 cores


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    seq_len: int
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"
    budget_s: float = 120.0
    precisions: tuple[str, ...] | None = None  # None: every precision the device can run
    checkpointing: tuple[str, ...] = CHECKPOINTING
    # Three sizes: the fit is hinged at the smallest (see profilers.fit.fit_hinged).
    trace_micro_batch_sizes: tuple[int, ...] = (1, 4, 8)
    time_micro_batch_sizes: tuple[int, int] | None = None  # None: chosen from memory and budget
    comm: bool = True
    comm_world_sizes: tuple[int, ...] | None = None  # None: what is available locally
    input_workers: tuple[int, ...] = (0, 1, 2)
    memory_budget: float = 0.9  # fraction of device memory a probed config may use
    tool: dict[str, Any] = field(default_factory=dict)


class _Clock:
    def __init__(self, budget_s: float, progress: Progress | None) -> None:
        self.budget_s, self.progress = budget_s, progress
        self.start = time.perf_counter()
        self.started: set[str] = set()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def remaining(self) -> float:
        return max(0.0, self.budget_s - self.elapsed())

    def share(self, phase: str) -> float:
        """Seconds this phase may use: its weight's part of what is left, among the phases
        not started yet. Time an earlier phase left unused flows to the later ones, and one
        that overran shrinks them all a little rather than starving the last."""
        waiting = sum(w for p, w in SHARES.items() if p not in self.started)
        self.started.add(phase)
        return self.remaining() * SHARES[phase] / waiting if waiting > 0 else 0.0

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message, min(1.0, self.elapsed() / self.budget_s))


def _versions(extra: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("torch", "optuna", "transformers", "numpy", "pandas"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return {**out, **extra}


def _label(spec: StepSpec) -> str:
    label = f"{spec.precision}/{spec.activation_checkpointing}/b={spec.micro_batch_size}"
    return label + (f"x{spec.grad_accum_steps}" if spec.grad_accum_steps > 1 else "")


def _row(
    probe: str,
    spec: StepSpec | None,
    outcome_status: str,
    *,
    reason: str = "",
    wall_s: float = 0.0,
    value: float | None = None,
    unit: str = "",
    name: str | None = None,
) -> ProbeRow:
    kw: dict[str, Any] = {}
    if spec is not None:
        kw = dict(
            precision=spec.precision,
            activation_checkpointing=spec.activation_checkpointing,
            micro_batch_size=spec.micro_batch_size,
            grad_accum_steps=spec.grad_accum_steps,
            world_size=spec.world_size,
        )
    return ProbeRow(
        probe=probe,
        name=name or (_label(spec) if spec else probe),
        status=outcome_status,
        reason=reason,
        wall_s=wall_s,
        value=value,
        unit=unit,
        **kw,
    )


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


# -- child-process entry points (top level: they are pickled by reference) --------------------


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


def _timing_child(
    workload: Workload, small: StepSpec, max_micro: int, device: str, budget_s: float
) -> list[dict[str, Any]]:
    """Time ``small`` and a larger micro-batch, interleaved, sized to fit ``budget_s``.

    One untimed + one timed step at the small size first tell how slow this group is here (a
    precision can be 30x slower than fp32 on a CPU); the larger size and the number of rounds
    follow from it: the largest power-of-two multiple <= ``max_micro`` whose rounds fit.
    """
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
    timings = measure_interleaved(workload, specs, device, rounds=rounds, warmup=1)
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
    return [t.to_dict() for t in timings]


# The half-thread timing's cost in steps of the full-thread time: one warm-up and two timed
# steps, each up to twice as long on half the threads.
_SPLIT_COST_STEPS = 6


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
    out = [start]
    while out[-1] * 2 <= limit:
        out.append(out[-1] * 2)
    return out


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
                    "reason": _one_line(exc),
                    "wall_s": time.perf_counter() - started,
                }
            )
    return out


def _input_child(
    workload: DataWorkload, spec: StepSpec, workers: tuple[int, ...], budget_s: float
) -> list[dict[str, Any]]:
    from profilers.input import probe_input

    return [s.to_dict() for s in probe_input(workload, spec, workers, budget_s=budget_s)]


# -- the phases ---------------------------------------------------------------------------------


class _Run:
    def __init__(self, workload: Workload, options: ProfileOptions, progress: Progress | None):
        self.workload, self.options = workload, options
        self.clock = _Clock(options.budget_s, progress)
        self.rows: list[ProbeRow] = []
        self.base = StepSpec(seq_len=options.seq_len)

    def spec(self, precision: str, checkpointing: str, micro: int, accum: int = 1) -> StepSpec:
        return dataclasses.replace(
            self.base,
            precision=precision,
            activation_checkpointing=checkpointing,
            micro_batch_size=micro,
            grad_accum_steps=accum,
        )

    def isolated(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Outcome:
        return run_isolated(Isolation(timeout_s=max(timeout_s, CHILD_START_S + 5)), fn, *args)

    # device ----------------------------------------------------------------------------------
    def device(self) -> Any:
        from profilers.device import probe_device

        self.clock.say("device: facts, matmul and bandwidth benchmarks")
        t0 = time.perf_counter()
        info = probe_device(self.options.device, budget_s=max(1.0, self.clock.share("device")))
        self.rows.append(
            _row(
                "device",
                None,
                "ok",
                wall_s=time.perf_counter() - t0,
                name=info.name,
                value=info.total_memory_bytes,
                unit="bytes",
            )
        )
        return info

    def precisions(self, device: Any) -> list[str]:
        wanted = self.options.precisions or PRECISIONS
        out = []
        for precision in wanted:
            check = device.precisions.get(precision)
            if check is not None and not check.supported:
                self.rows.append(
                    _row(
                        "device",
                        None,
                        "unsupported",
                        reason=check.reason or "",
                        name=f"precision {precision}",
                    )
                )
                continue
            out.append(precision)
        return out

    # model -----------------------------------------------------------------------------------
    def model(self) -> tuple[Any, Any]:
        from profilers.flops import count_step_flops

        self.clock.say("model: shape facts and FLOPs per token")
        self.clock.share("model")
        t0 = time.perf_counter()
        facts = self.workload.facts()
        self.rows.append(
            _row(
                "model",
                None,
                "ok",
                wall_s=time.perf_counter() - t0,
                name=facts.name,
                value=facts.num_params,
                unit="params",
            )
        )
        t0 = time.perf_counter()
        try:
            flops = count_step_flops(self.workload, self.spec("fp32", "none", 1))
            self.rows.append(
                _row(
                    "flops",
                    None,
                    "ok",
                    wall_s=time.perf_counter() - t0,
                    value=flops.model_flops_per_token,
                    unit="flops/token",
                )
            )
        except Exception as exc:
            flops = None
            self.rows.append(
                _row("flops", None, "error", reason=_one_line(exc), wall_s=time.perf_counter() - t0)
            )
        return facts, flops

    # memory ----------------------------------------------------------------------------------
    def traces(
        self, precisions: Sequence[str], target: str, *, accumulation: bool
    ) -> list[MemoryTrace]:
        """Fake-traced steps of every precision x checkpointing: the two micro-batch sizes a
        fit needs (always, whatever the budget), or, in a later phase, the accumulation
        variants (while the budget lasts)."""
        from profilers.memory import trace_step_memory

        share = self.clock.share("memory_accumulation" if accumulation else "memory")
        deadline = time.perf_counter() + share
        sizes = self.options.trace_micro_batch_sizes
        b1 = sizes[0]
        plan_sizes = ((b1, 2),) if accumulation else tuple((b, 1) for b in sizes)
        plan = [
            (p, c, b, a)
            for p in sorted(precisions, key=lambda p: p != "fp32")
            for c in self.options.checkpointing
            for b, a in plan_sizes
        ]
        traces = []
        for i, (p, c, b, a) in enumerate(plan):
            spec = self.spec(p, c, b, a)
            if accumulation and time.perf_counter() > deadline:
                self.rows.append(_row("memory", spec, "skipped", reason="time budget spent"))
                continue
            self.clock.say(f"memory: tracing {_label(spec)} ({i + 1}/{len(plan)})")
            t0 = time.perf_counter()
            try:
                trace = trace_step_memory(self.workload, spec, target_device_type=target)
            except Exception as exc:
                self.rows.append(
                    _row(
                        "memory",
                        spec,
                        "error",
                        reason=_one_line(exc),
                        wall_s=time.perf_counter() - t0,
                    )
                )
                continue
            traces.append(trace)
            self.rows.append(
                _row(
                    "memory",
                    spec,
                    "ok",
                    wall_s=time.perf_counter() - t0,
                    value=trace.peak_bytes,
                    unit="bytes",
                )
            )
        return traces

    def memory_checks(
        self, models: Sequence[MemoryModel], precisions: Sequence[str], capacity: int
    ) -> tuple[list[CpuStepMemory | CudaStepMemory], MemoryOverhead]:
        share = self.clock.share("memory_check")
        deadline = time.perf_counter() + share
        b = self.options.trace_micro_batch_sizes[1]
        candidates = [(p, c) for p in precisions for c in self.options.checkpointing]
        # fp32 first: the others are checked only while the budget lasts.
        candidates.sort(key=lambda pc: (pc[0] != "fp32", pc[1] != "none"))
        measured: list[CpuStepMemory | CudaStepMemory] = []
        errors: list[float] = []
        fixed: list[int] = []
        fragmentation: list[float] = []
        parallel: dict[str, int] = {}
        for p, c in candidates:
            spec = self.spec(p, c, b)
            model = next(
                (m for m in models if m.precision == p and m.activation_checkpointing == c), None
            )
            if model is None:
                continue
            if model.predict(b) > self.options.memory_budget * capacity:
                self.rows.append(
                    _row("memory_check", spec, "skipped", reason="predicted not to fit the device")
                )
                continue
            if measured and time.perf_counter() > deadline:
                self.rows.append(_row("memory_check", spec, "skipped", reason="time budget spent"))
                continue
            self.clock.say(f"memory: real step {_label(spec)}")
            outcome = self.isolated(
                _memory_check_child,
                self.workload,
                spec,
                self.options.device,
                timeout_s=max(30.0, deadline - time.perf_counter()),
            )
            if not outcome.ok:
                self.rows.append(
                    _row(
                        "memory_check",
                        spec,
                        outcome.status,
                        reason=outcome.reason,
                        wall_s=outcome.wall_s,
                    )
                )
                continue
            data, rss, rank_extra = outcome.value
            parallel = parallel or rank_extra
            record: CpuStepMemory | CudaStepMemory
            if data.get("device_name") is not None:
                record = CudaStepMemory.from_dict(data)
                fixed.append(record.context_bytes + record.workspace_bytes)
                if record.peak_allocated_bytes:
                    fragmentation.append(record.fragmentation_bytes / record.peak_allocated_bytes)
                truth = record.peak_allocated_bytes
            else:
                record = CpuStepMemory.from_dict(data)
                truth = record.peak_bytes
                if rss is not None:
                    # Less the FSDP stack and gloo group the child loaded on purpose.
                    fixed.append(max(0, rss - truth - rank_extra.get("fsdp", 0)))
            measured.append(record)
            predicted = model.predict(b)
            if truth:
                errors.append(abs(truth - predicted) / truth)
            self.rows.append(
                _row(
                    "memory_check",
                    spec,
                    "ok",
                    wall_s=outcome.wall_s,
                    value=truth,
                    unit="bytes",
                    reason=f"traced fit {predicted} B",
                )
            )
        method = (
            "CUDA: context + workspaces from mem_get_info, fragmentation from "
            "max_memory_reserved / max_memory_allocated"
            if self.options.device.startswith("cuda")
            else "CPU: process resident peak (VmHWM) minus the allocator's peak; ddp/fsdp "
            "ranks: plus the resident growth of a gloo group and the wrapper's imports"
        )
        overhead = MemoryOverhead(
            fixed_bytes=max(fixed) if fixed else 0,
            parallel_bytes=parallel,
            fragmentation_fraction=max(fragmentation) if fragmentation else 0.0,
            trace_error_fraction=max(errors) if errors else 0.0,
            method=method,
        )
        return measured, overhead

    def distributed_traces(
        self, precisions: Sequence[str], target: str, world_sizes: Sequence[int]
    ) -> list[MemoryTrace]:
        """Per-rank memory of DDP and FSDP steps at each world size, traced under a fake
        process group in one child (the group is process-global). fp32 first; the rest while
        the budget lasts."""
        share = self.clock.share("memory_distributed")
        if not world_sizes or share < CHILD_START_S + 2:
            reason = "no world size > 1" if not world_sizes else "time budget spent"
            self.rows.append(
                _row("memory_distributed", None, "skipped", reason=reason, name="ddp/fsdp per-rank")
            )
            return []
        sizes = self.options.trace_micro_batch_sizes
        specs = []
        for precision in sorted(precisions, key=lambda p: p != "fp32"):
            for checkpointing in self.options.checkpointing:
                for parallelism in ("fsdp", "ddp"):
                    for world in world_sizes:
                        for b, a in (*((b, 1) for b in sizes), (sizes[0], 2)):
                            specs.append(
                                dataclasses.replace(
                                    self.spec(precision, checkpointing, b, a),
                                    parallelism=parallelism,
                                    world_size=world,
                                )
                            )
        # Priority: every group's two sizes before any accumulation variant.
        specs.sort(key=lambda s: s.grad_accum_steps > 1)
        self.clock.say(
            f"memory: per-rank ddp/fsdp traces at world size {', '.join(map(str, world_sizes))}"
        )
        outcome = self.isolated(
            _distributed_trace_child,
            self.workload,
            specs,
            target,
            share - CHILD_START_S,
            timeout_s=share + 20,
        )
        if not outcome.ok:
            self.rows.append(
                _row(
                    "memory_distributed",
                    None,
                    outcome.status,
                    reason=outcome.reason,
                    wall_s=outcome.wall_s,
                    name="ddp/fsdp per-rank",
                )
            )
            return []
        traces = []
        for spec, result in zip(specs, outcome.value, strict=True):
            name = f"{spec.parallelism}x{spec.world_size} {_label(spec)}"
            if result["status"] != "ok":
                if result["status"] == "error":
                    self.rows.append(
                        _row(
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
            self.rows.append(
                _row(
                    "memory_distributed",
                    spec,
                    "ok",
                    wall_s=result["wall_s"],
                    name=name,
                    value=trace.peak_bytes,
                    unit="bytes",
                )
            )
        skipped = sum(r["status"] == "skipped" for r in outcome.value)
        if skipped:
            self.rows.append(
                _row(
                    "memory_distributed",
                    None,
                    "skipped",
                    name="ddp/fsdp per-rank",
                    reason=f"{skipped} traces left out: time budget spent",
                )
            )
        return traces

    # throughput ------------------------------------------------------------------------------
    def timed_sizes(
        self, model: MemoryModel | None, capacity: int, on_gpu: bool, slowdown: float
    ) -> tuple[int, int]:
        """(small size, largest size allowed): the larger one is picked in the child."""
        if self.options.time_micro_batch_sizes is not None:
            return self.options.time_micro_batch_sizes
        cap = GPU_MAX_TIMED_MICRO_BATCH if on_gpu else CPU_MAX_TIMED_MICRO_BATCH
        if slowdown > 4:  # a slow precision: small sizes keep its probe inside the budget
            cap = 2
        largest = cap
        if model is not None:
            while largest > 1 and model.predict(largest) > self.options.memory_budget * capacity:
                largest //= 2
        largest = max(largest, 2)
        return (max(1, largest // 4), largest)

    def throughput(
        self, precisions: Sequence[str], models: Sequence[MemoryModel], capacity: int, device: Any
    ) -> list[StepTiming]:
        share = self.clock.share("throughput")
        deadline = time.perf_counter() + share
        on_gpu = self.options.device.startswith("cuda")
        groups = [(p, c) for p in precisions for c in self.options.checkpointing]
        groups.sort(key=lambda pc: (pc[0] != "fp32", pc[1] != "none"))
        timings: list[StepTiming] = []
        for i, (p, c) in enumerate(groups):
            check = device.precisions.get(p)
            slowdown = 1.0
            if check is not None and check.speedup_vs_fp32:
                slowdown = 1.0 / check.speedup_vs_fp32
            model = next(
                (m for m in models if m.precision == p and m.activation_checkpointing == c), None
            )
            b1, b_max = self.timed_sizes(model, capacity, on_gpu, slowdown)
            small = self.spec(p, c, b1)
            remaining = deadline - time.perf_counter()
            # Every group gets a child's minimum while time remains; the first (fp32) always.
            floor = CHILD_START_S + 2 if i == 0 else min(remaining, CHILD_START_S + 2)
            per_group = max(remaining / (len(groups) - i), floor)
            if per_group < CHILD_START_S + 2:
                self.rows.append(_row("throughput", small, "skipped", reason="time budget spent"))
                continue
            self.clock.say(f"throughput: timing {p}/{c} from b={b1}")
            outcome = self.isolated(
                _timing_child,
                self.workload,
                small,
                b_max,
                self.options.device,
                per_group - CHILD_START_S,
                timeout_s=1.5 * per_group + 15,
            )
            if not outcome.ok:
                for spec in (small,):
                    self.rows.append(
                        _row(
                            "throughput",
                            spec,
                            outcome.status,
                            reason=outcome.reason,
                            wall_s=outcome.wall_s,
                        )
                    )
                continue
            for data in outcome.value:
                timing = StepTiming.from_dict(data)
                timings.append(timing)
                self.rows.append(
                    _row(
                        "throughput",
                        timing.spec,
                        "ok",
                        wall_s=outcome.wall_s,
                        value=timing.median_step_s,
                        unit="s/step",
                        reason=f"{timing.threads} threads" if timing.threads else "",
                    )
                )
        return timings

    # communication ---------------------------------------------------------------------------
    def communication(self) -> Any:
        from profilers.comm import available_world_sizes, probe_communication

        share = self.clock.share("communication")
        device_type = "cuda" if self.options.device.startswith("cuda") else "cpu"
        sizes = self.options.comm_world_sizes or available_world_sizes(device_type)
        if not self.options.comm or not sizes or share < 5:
            reason = (
                "disabled"
                if not self.options.comm
                else "no world size > 1 available"
                if not sizes
                else "time budget spent"
            )
            self.rows.append(_row("communication", None, "skipped", reason=reason))
            return None
        self.clock.say(f"communication: collectives at world size {', '.join(map(str, sizes))}")
        t0 = time.perf_counter()
        try:
            comm = probe_communication(
                world_sizes=sizes,
                device_type=device_type,
                budget_s=share,
                progress=lambda line: self.clock.say(f"communication: {line}"),
            )
        except Exception as exc:
            self.rows.append(
                _row(
                    "communication",
                    None,
                    "error",
                    reason=_one_line(exc),
                    wall_s=time.perf_counter() - t0,
                )
            )
            return None
        for run in comm.runs:
            self.rows.append(
                _row(
                    "communication",
                    None,
                    run.status,
                    reason=run.reason,
                    wall_s=run.wall_s,
                    name=f"{run.backend} world={run.world_size}",
                    value=run.max_bytes_measured,
                    unit="bytes",
                )
            )
        return comm

    # input -----------------------------------------------------------------------------------
    def input(self, micro_batch: int) -> list[InputSample]:
        share = self.clock.share("input")
        if not isinstance(self.workload, DataWorkload) or share < 2:
            self.rows.append(
                _row(
                    "input",
                    None,
                    "skipped",
                    reason="no data loader" if share >= 2 else "time budget spent",
                )
            )
            return []
        spec = self.spec("fp32", "none", micro_batch)
        self.clock.say(f"input: data loader at num_workers {self.options.input_workers}")
        outcome = self.isolated(
            _input_child,
            self.workload,
            spec,
            self.options.input_workers,
            max(1.0, share - CHILD_START_S),
            timeout_s=share + 30,
        )
        if not outcome.ok:
            self.rows.append(
                _row("input", spec, outcome.status, reason=outcome.reason, wall_s=outcome.wall_s)
            )
            return []
        samples = [InputSample.from_dict(d) for d in outcome.value]
        for s in samples:
            self.rows.append(
                _row(
                    "input",
                    spec,
                    s.status,
                    reason=s.reason,
                    name=f"num_workers={s.num_workers}",
                    value=s.tokens_per_s,
                    unit="tokens/s",
                )
            )
        return samples


def run_profile(
    workload: Workload, options: ProfileOptions, progress: Progress | None = None
) -> Profile:
    """Probe ``workload`` on ``options.device`` within about ``options.budget_s`` seconds."""
    from profilers.memory_model import fit_memory_models
    from profilers.throughput import fit_step_times

    if options.budget_s <= 0:
        raise ValueError(f"budget_s must be positive, got {options.budget_s}")
    run = _Run(workload, options, progress)
    device = run.device()
    precisions = run.precisions(device)
    facts, flops = run.model()
    target = "cuda" if options.device.startswith("cuda") else "cpu"
    capacity = device.free_memory_bytes if target == "cuda" else device.total_memory_bytes
    # Memory at two sizes, then step times (the search's core), then the refinements.
    traces = run.traces(precisions, target, accumulation=False)
    models = _fit_groups(fit_memory_models, traces, [], "memory")
    timings = run.throughput(precisions, models, capacity, device)
    time_models = _fit_groups(fit_step_times, timings, run.rows, "throughput")
    traces += run.traces(precisions, target, accumulation=True)
    models = _fit_groups(fit_memory_models, traces, [], "memory")
    measured, overhead = run.memory_checks(models, precisions, capacity)
    comm = run.communication()
    world_sizes = _local_world_sizes(options, target)
    traces += run.distributed_traces(precisions, target, world_sizes)
    models = _fit_groups(fit_memory_models, traces, run.rows, "memory")
    micro = max((t.spec.micro_batch_size for t in timings), default=4)
    inputs = run.input(micro)
    run.clock.say("done")
    return Profile(
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        tool=_versions(options.tool),
        workload={**_describe(workload), "seq_len": options.seq_len},
        device=device,
        model=facts,
        flops=flops,
        memory=tuple(traces),
        memory_measured=tuple(measured),
        memory_overhead=overhead,
        throughput=tuple(timings),
        communication=tuple(comm.samples) if comm is not None else (),
        communication_runs=tuple(comm.runs) if comm is not None else (),
        input=tuple(inputs),
        fits=Fits(
            memory=tuple(models),
            time=tuple(time_models),
            communication=tuple(comm.fits) if comm is not None else (),
        ),
        probes=tuple(run.rows),
        budget_s=options.budget_s,
        elapsed_s=run.clock.elapsed(),
    )


def _describe(workload: Workload) -> dict[str, Any]:
    """What the workload says about itself (AdvisorWorkload: model, args, data), if anything."""
    describe = getattr(workload, "describe", None)
    return dict(describe()) if callable(describe) else {}


def _local_world_sizes(options: ProfileOptions, target: str) -> tuple[int, ...]:
    if options.comm_world_sizes is not None:
        return options.comm_world_sizes
    from profilers.comm import available_world_sizes

    return available_world_sizes(target)


def _fit_groups(
    fit: Callable[[Any], Any], records: Sequence[Any], rows: list[ProbeRow], probe: str
) -> list[Any]:
    """Fit each group that has what a fit needs; a group that cannot be fitted becomes a row."""
    try:
        return list(fit(records))
    except ValueError:
        pass
    # One bad group must not sink the others: fit group by group.
    groups: dict[tuple[str, str, str, int], list[Any]] = {}
    for record in records:
        spec = record.spec
        key = (spec.precision, spec.activation_checkpointing, spec.parallelism, spec.world_size)
        groups.setdefault(key, []).append(record)
    out = []
    for (precision, checkpointing, parallelism, world), group in groups.items():
        try:
            out.extend(fit(group))
        except ValueError as exc:
            layout = "" if parallelism == "single" else f"{parallelism}x{world} "
            sizes = sorted({r.spec.micro_batch_size for r in group if r.spec.grad_accum_steps == 1})
            # One size only: the probe stopped (time budget) before a second one, which is
            # a gap, not a failure; the cost model falls back to what it has.
            short = len(sizes) < 2
            rows.append(
                ProbeRow(
                    probe=f"{probe}_fit",
                    name=f"{layout}{precision}/{checkpointing}",
                    status="skipped" if short else "error",
                    reason=(
                        f"only micro-batch size {sizes[0] if sizes else '-'} was measured: "
                        "a fit needs two"
                        if short
                        else _one_line(exc)
                    ),
                    precision=precision,
                    activation_checkpointing=checkpointing,
                )
            )
    return out
