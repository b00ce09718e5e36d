"""The memory probe: peak memory of one training step, traced without allocating, and its model.

A step's peak is traced with ``torch.distributed._tools.mem_tracker.MemTracker`` under
``FakeTensorMode`` (:func:`trace_step_memory`): every storage is counted through the dispatcher
and nothing is allocated, so sizes that would not fit trace in a fraction of a real step. Two
phases are traced separately because they peak for different reasons (DESIGN.md, "Measuring
well"): forward+backward grows with the micro-batch (activations), the optimizer step does not
(parameters, gradients, optimizer state and the foreach temporaries). With checkpointing the
optimizer step can dominate at small micro-batches, so a single line through both would miss the
kink. :func:`fit_memory` fits each phase over micro-batch sizes and :meth:`MemoryModel.predict`
takes their max.

Ground truth, to check the trace against: :func:`measure_cpu_step_peak` (the CPU allocator's own
count, read through the profiler) and :func:`measure_cuda_step_memory` (the caching allocator's
peaks plus what the device uses outside it).

This module is the probe's one import surface and imports no torch: records live in
``memory_records``, the model in ``memory_model``; the tracing (``memory_tracing``) and measuring
(``memory_truth``) code is imported when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from profilers.memory_model import (
    ACCUMULATION_SOURCES,
    MemoryModel,
    fit_memory,
    fit_memory_models,
)
from profilers.memory_records import (
    TARGET_DEVICE_TYPES,
    CpuStepMemory,
    CudaStepMemory,
    MemoryBreakdown,
    MemoryTrace,
)
from profilers.workload import BlockScalableWorkload, StepSpec

if TYPE_CHECKING:
    import torch

    from profilers.workload import Workload

__all__ = [
    "ACCUMULATION_SOURCES",
    "TARGET_DEVICE_TYPES",
    "CpuStepMemory",
    "CudaStepMemory",
    "MemoryBreakdown",
    "MemoryModel",
    "MemoryTrace",
    "fit_memory",
    "fit_memory_models",
    "measure_cpu_step_memory",
    "measure_cpu_step_peak",
    "measure_cuda_step_memory",
    "trace_step_memory",
]


def trace_step_memory(
    workload: Workload, spec: StepSpec, *, target_device_type: str = "cpu"
) -> MemoryTrace:
    """Trace one training step's memory under FakeTensorMode: nothing is allocated.

    The step is traced on fake CPU tensors whatever the target; ``target_device_type="cuda"``
    rounds every storage to the CUDA caching allocator's 512-byte blocks.

    Requirements on the workload's step (see ``memory_tracing`` for why):

    * ``build_step(spec, "cpu", from_meta=True)`` works inside ``FakeTensorMode`` and builds
      everything the step holds (model, optimizer, scaler) there;
    * the step reads no tensor value on the host (``.item()``, ``bool(t)``, data-dependent
      shapes), except ``torch.amp.GradScaler``'s skip check, which the trace takes as "not
      skipped";
    * the optimizer's implementation is chosen explicitly (``foreach=`` or ``fused=``): left at
      its default, AdamW picks foreach on CUDA but the per-tensor loop on (fake) CPU, and their
      temporaries differ by up to one copy of the parameters;
    * autocast follows ``step.device`` (CPU here), so a mixed-precision trace for a CUDA target
      uses CPU autocast's op lists, except that a CUDA target's trace runs ``layer_norm`` and
      ``group_norm`` and a softmax without ``dtype`` in fp32 as CUDA's autocast does
      (:func:`memory_tracing.cuda_autocast_fp32_ops`);
      calibrate the rest with :func:`measure_cuda_step_memory`.

    A deep model of a :class:`BlockScalableWorkload` is traced from two shallow copies
    (:mod:`profilers.memory_blocks`; the trace's ``scaled_from_blocks`` says so), whole if that
    fails.
    """
    if target_device_type not in TARGET_DEVICE_TYPES:
        raise ValueError(
            f"unknown target_device_type {target_device_type!r}: choose one of "
            f"{', '.join(TARGET_DEVICE_TYPES)}"
        )
    if spec.parallelism != "single":
        raise ValueError(
            f"trace_step_memory traces one device (parallelism 'single'), got "
            f"{spec.parallelism!r}: trace with parallelism='single' and add the strategy's own "
            "buffers (DDP buckets, FSDP shards) on top"
        )
    from profilers.fake_kernels import TraceOverBudget
    from profilers.memory_blocks import depth_scaling, trace_scaled
    from profilers.memory_tracing import trace

    cuda_rounding = target_device_type == "cuda"
    scaling = depth_scaling(workload)
    if scaling is not None:
        assert isinstance(workload, BlockScalableWorkload)
        try:
            return trace_scaled(
                workload,
                spec,
                cuda_rounding=cuda_rounding,
                num_layers=scaling.layers,
                depths=scaling.depths,
            )
        except TraceOverBudget:  # the profile's time is spent: not whole either
            raise
        except Exception:  # a model whose forward needs all its blocks: trace it whole
            pass
    return trace(workload, spec, cuda_rounding=cuda_rounding)


def measure_cpu_step_memory(
    workload: Workload, spec: StepSpec, *, min_warmup: int = 1
) -> CpuStepMemory:
    """Run real steps on the CPU and read the allocator's peak of the last one, per phase
    (after ``min_warmup`` steps at least, and until the optimizer has state)."""
    from profilers.memory_truth import measure_cpu

    return measure_cpu(workload, spec, min_warmup=min_warmup)


def measure_cpu_step_peak(workload: Workload, spec: StepSpec) -> int:
    """CPU truth: peak allocated bytes during one real step (the second; optimizer state exists)."""
    return measure_cpu_step_memory(workload, spec).peak_bytes


def measure_cuda_step_memory(
    workload: Workload, spec: StepSpec, device: str | torch.device = "cuda"
) -> CudaStepMemory:
    """CUDA truth for one real step, plus the context, workspaces and fragmentation."""
    from profilers.memory_truth import measure_cuda

    return measure_cuda(workload, spec, device)
