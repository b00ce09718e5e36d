"""Ground truth for the memory trace: real steps, measured by the allocators themselves.

Both measure the second step of the same phases the trace measures (forward+backward over all
micro-batches, then the optimizer step). A first step whose GradScaler skipped the update (fp16
overflow at the initial scale) creates no optimizer state, so warm-up repeats until the state
exists, as it does in steady training.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence

import torch
from torch._C._profiler import _EventType, _ProfilerEvent
from torch.profiler import ProfilerActivity, profile, record_function

from profilers.memory_records import CpuStepMemory, CudaStepMemory
from profilers.workload import Batch, StepSpec, TrainStep, Workload

_MAX_WARMUP_STEPS = 8
# The CPU truth runs steps of at most this many micro-batches. A step of k >= 2 holds what a step
# of 2 holds (the gradients exist from the first backward on; every later micro-batch repeats
# the second), but the profiler's event buffers grow with k: at 16 micro-batches they took a
# process's private memory from 654 to 2,140 MiB for the same 130 MiB step (hf-gpt2-32k,
# blocks:1, micro-batch 1), and a validation child capped at a 1,143 MiB budget failed every
# config as "oom" that `advisor train` ran within it (regret session 20261203T083130Z).
CPU_TRUTH_MICRO_BATCHES = 2
_FORWARD_BACKWARD = "memory_probe::forward_backward"
_OPTIMIZER_STEP = "memory_probe::optimizer_step"


def measure_cpu(
    workload: Workload,
    spec: StepSpec,
    *,
    min_warmup: int = 1,
    inspect: Callable[[TrainStep], None] | None = None,
) -> CpuStepMemory:
    """Peak of the CPU allocator's ``total_allocated`` over each phase of the measured step.

    The profiler's CPU memory reporter counts only blocks allocated while it runs (frees of older
    blocks are not subtracted), so the step is built inside the profiled region: the count is
    then everything the step holds, as the trace counts it. At least ``min_warmup`` steps run
    before the measured one (more until the optimizer has state): the allocator's count is the
    same after one, but a process's resident peak still grows over the first steps. Steps of
    more than :data:`CPU_TRUTH_MICRO_BATCHES` micro-batches run that many (the same peak);
    the record keeps ``spec``. ``inspect(step)``, if given, sees the step after the measured one
    (e.g. to read its parameters' and optimizer state's sizes).
    """
    generator = torch.Generator().manual_seed(0)
    run = dataclasses.replace(
        spec, grad_accum_steps=min(spec.grad_accum_steps, CPU_TRUTH_MICRO_BATCHES)
    )
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step = workload.build_step(run, "cpu")
        _warm_up(step, generator, min_warmup)
        started = time.perf_counter()
        with record_function(_FORWARD_BACKWARD):
            batches = step.synthetic_batches(generator)
            loss = step.forward_backward(batches)
        with record_function(_OPTIMIZER_STEP):
            step.optimizer_step()
        step_seconds = time.perf_counter() - started
        if inspect is not None:
            inspect(step)
        # The micro-batches not run are held as inputs all step long, as in the real step.
        unrun = (spec.grad_accum_steps - run.grad_accum_steps) * _batch_bytes(batches[-1])
        del batches, loss, step
    assert prof.profiler is not None and prof.profiler.kineto_results is not None
    events = list(_walk(prof.profiler.kineto_results.experimental_event_tree()))
    start = _level_at_start(events)
    forward_backward = _window_peak(events, _FORWARD_BACKWARD) - start + unrun
    optimizer_step = _window_peak(events, _OPTIMIZER_STEP) - start + unrun
    return CpuStepMemory(
        spec=spec,
        peak_bytes=max(forward_backward, optimizer_step),
        forward_backward_peak_bytes=forward_backward,
        optimizer_step_peak_bytes=optimizer_step,
        step_seconds=step_seconds,
    )


def _batch_bytes(batch: Batch) -> int:
    """The bytes a micro-batch's tensors hold (a storage two of them view counted once)."""
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in batch.values()
    }
    return sum(storages.values())


def _warm_up(step: TrainStep, generator: torch.Generator | None, min_steps: int = 1) -> None:
    for i in range(max(_MAX_WARMUP_STEPS, min_steps)):
        step.step(step.synthetic_batches(generator))
        if step.optimizer.state and i + 1 >= min_steps:
            return


def _walk(roots: list[_ProfilerEvent]) -> Iterator[_ProfilerEvent]:
    stack = list(roots)
    while stack:
        event = stack.pop()
        yield event
        stack.extend(event.children)


def _level_at_start(events: list[_ProfilerEvent]) -> int:
    """The CPU count before this session's first allocation.

    The count is process-wide and outlives a profiling session: a block allocated while some
    earlier session ran and freed after it stays in the count for good (40 kB kept across two
    sessions read 40 kB at the start of the next). The step's own level is above this.
    """
    first = min(
        (e for e in events if _is_cpu_allocation(e)), key=lambda e: e.start_time_ns, default=None
    )
    if first is None:
        return 0
    fields = first.extra_fields
    return fields.total_allocated - fields.alloc_size  # type: ignore[union-attr]


def _is_cpu_allocation(event: _ProfilerEvent) -> bool:
    return (
        event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu"  # type: ignore[union-attr]
    )


def _window_peak(events: list[_ProfilerEvent], label: str) -> int:
    """Max CPU ``total_allocated`` from the start to the end of the ``label`` range.

    The level entering the window (after the last event before it) counts too: a phase that
    only frees peaks at its start.
    """
    (window,) = [e for e in events if e.tag == _EventType.TorchOp and e.name == label]
    start, end = window.start_time_ns, window.end_time_ns
    allocations = sorted(
        (e.start_time_ns, e.extra_fields.total_allocated)  # type: ignore[union-attr]
        for e in events
        if _is_cpu_allocation(e) and e.start_time_ns <= end
    )
    before = [total for t, total in allocations if t < start]
    inside = [total for t, total in allocations if t >= start]
    return max([*before[-1:], *inside], default=0)


def measure_cuda(
    workload: Workload,
    spec: StepSpec,
    device: str | torch.device = "cuda",
    *,
    inspect: Callable[[TrainStep], None] | None = None,
) -> CudaStepMemory:
    """The caching allocator's peaks over each phase of the second step, plus what it misses.

    ``torch.cuda.mem_get_info`` reports the whole device (this process's context, workspaces
    outside the allocator, other processes); ``memory_reserved`` is what the caching allocator
    holds. Their difference before the build is the context (plus other tenants); its growth over
    the steps is the step's memory outside the allocator. ``inspect(step)`` as in
    :func:`measure_cpu`.
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"measure_cuda_step_memory needs a CUDA device, got {dev}")
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available on this machine: measure on a GPU host")
    with torch.cuda.device(dev):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free_before, total = torch.cuda.mem_get_info()  # creates the context if needed
        outside_before = total - free_before - torch.cuda.memory_reserved()
        library = _library_workspace_bytes(dev, spec.precision)

        step = workload.build_step(spec, dev)
        # The global RNG: the contract does not say on which device a generator must live.
        _warm_up(step, None)
        batches = step.synthetic_batches()
        torch.cuda.synchronize()  # the peaks must not include warm-up work still queued
        torch.cuda.reset_peak_memory_stats()
        loss = step.forward_backward(batches)
        torch.cuda.synchronize()  # the allocator's peak counters are final once work is done
        forward_backward = torch.cuda.max_memory_allocated()
        reserved = torch.cuda.max_memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        step.optimizer_step()
        torch.cuda.synchronize()
        optimizer_step = torch.cuda.max_memory_allocated()
        reserved = max(reserved, torch.cuda.max_memory_reserved())
        free_after, _ = torch.cuda.mem_get_info()
        outside_after = total - free_after - torch.cuda.memory_reserved()
        if inspect is not None:
            inspect(step)
        del batches, loss, step
    return CudaStepMemory(
        spec=spec,
        device_name=torch.cuda.get_device_name(dev),
        total_bytes=total,
        peak_allocated_bytes=max(forward_backward, optimizer_step),
        peak_reserved_bytes=reserved,
        forward_backward_peak_allocated_bytes=forward_backward,
        optimizer_step_peak_allocated_bytes=optimizer_step,
        context_bytes=outside_before,
        workspace_bytes=max(0, outside_after - outside_before),
        library_bytes=library,
    )


def _library_workspace_bytes(dev: torch.device, precision: str) -> int:
    """What the math libraries keep in the caching allocator once they have run: a small
    linear layer's forward (this thread's cuBLAS handle) and backward (autograd's device
    thread has its own handle, and its own workspace) in ``precision``'s autocast. The
    first device run (an H200) found a step's allocator peak 64-72 MB above the fake trace's
    whatever the model (10.6 MB traced against 78.8 MB): two 32 MiB cuBLAS workspaces."""
    import torch.nn.functional as F

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    before = torch.cuda.memory_allocated(dev)
    w = torch.randn(64, 64, device=dev, requires_grad=True)
    b = torch.zeros(64, device=dev, requires_grad=True)
    x = torch.randn(8, 64, device=dev)
    with torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        y = F.linear(F.linear(x, w, b), w)  # addmm and mm: cuBLAS and cuBLASLt paths
    y.float().sum().backward()
    torch.cuda.synchronize(dev)
    del w, b, x, y
    return max(0, torch.cuda.memory_allocated(dev) - before)


_TRANSIENT = "memory_probe::transient"


def forward_backward_transient_bytes(
    step: TrainStep, batches: Sequence[Batch], device_type: str
) -> int:
    """The bytes one forward+backward of an already warmed-up ``step`` allocates above what it
    started with, at its peak: activations, temporaries and new gradients.

    CUDA: the caching allocator's peak counter, reset at the start. CPU: the profiler's CPU
    memory events over the call; the count only sees blocks allocated while it runs (frees of
    older blocks, e.g. the previous step's gradients, are not subtracted), the same for every
    step measured this way, so two steps measured so compare like for like. The optimizer step
    is left to the caller.
    """
    if device_type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        loss = step.forward_backward(batches)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del loss
        return max(int(peak), 0)
    if device_type != "cpu":
        raise ValueError(f"no allocator peak for device type {device_type!r}")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function(_TRANSIENT):
            loss = step.forward_backward(batches)
        del loss
    assert prof.profiler is not None and prof.profiler.kineto_results is not None
    events = list(_walk(prof.profiler.kineto_results.experimental_event_tree()))
    return max(_window_peak(events, _TRANSIENT) - _level_at_start(events), 0)


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def resident_peak_bytes() -> int | None:
    """This process's resident-set high-water mark (Linux ``VmHWM``), or None where unknown."""
    return _status_bytes("VmHWM")


def resident_bytes() -> int | None:
    """This process's resident set now (Linux ``VmRSS``), or None where unknown."""
    return _status_bytes("VmRSS")


def parallel_resident_bytes() -> dict[str, int]:
    """Resident memory a ddp/fsdp rank carries beyond a single-device process, per parallelism.

    A torchrun rank also holds a gloo process group and whatever its wrapper loads. Measured
    by difference of ``VmRSS``: a one-rank gloo group on an in-memory store and a DDP around a
    one-weight module (``ddp``), then ``fully_shard`` of another on a one-rank mesh with a
    forward and backward (``fsdp``, cumulative). Modules already loaded count zero, so call it
    in a process that has already done what a single-device training process does (built the
    step, optimizer included, and run it): with torch 2.13 the optimizer's constructor imports
    ``torch._dynamo``, which loads the DTensor and FSDP stacks, inductor and, where installed,
    triton (70-170 MiB resident on CPU). In a fresh interpreter those would read as a rank's
    extra although every training process carries them (the cause of a single-device CPU
    prediction 23% below ``advisor train``'s resident peak).
    Empty where the resident set or gloo is unavailable.
    """
    import torch
    import torch.distributed as dist

    before = resident_bytes()
    if before is None or not dist.is_available() or not dist.is_gloo_available():
        return {}
    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        from torch.nn.parallel import DistributedDataParallel

        DistributedDataParallel(torch.nn.Linear(1, 1))
        ddp = resident_bytes()
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        module = torch.nn.Linear(1, 1)
        fully_shard(module, mesh=init_device_mesh("cpu", (1,)))
        module(torch.ones(1, 1)).sum().backward()
        fsdp = resident_bytes()
    finally:
        if own_group:
            dist.destroy_process_group()
    if ddp is None or fsdp is None:
        return {}
    return {"ddp": max(0, ddp - before), "fsdp": max(0, fsdp - before)}
