"""The memory of a step no fake trace can run, measured on real steps instead.

A fake-tensor trace (:mod:`profilers.memory_tracing`) cannot run a model that reads tensor
values on the host or makes shapes from them: a mixture-of-experts layer that takes its
per-expert token counts with ``.tolist()`` (transformers' JetMoE), routes with
``torch.nonzero``/``torch.where(mask)`` (many hand-written MoE layers) or branches on
``.item()``. Such a model's memory is what real steps on the profiled device hold: the
allocator's per-phase peaks (:mod:`profilers.memory_truth`), in a child so an out-of-memory
step is a row, not a crash. The result is a :class:`MemoryTrace` like a traced one, with
``method == "real step"``: the same affine fits over micro-batch size are made from it; its
breakdown names the training state (parameters, buffers, gradients in the optimizer step,
optimizer state) and leaves the rest unsplit (``other``), since no tracker labelled it.

What it cannot do that a trace does: a CUDA target profiled from a CPU host (a what-if) gets
the CPU step's bytes, without the CUDA allocator's 512-byte rounding or CUDA autocast's fp32
norms; the step must fit the host; it takes real steps' time (seconds, not a fraction).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from profilers.memory_records import REAL_STEP, MemoryBreakdown, MemoryTrace
from profilers.workload import StepSpec, TrainStep, Workload

# Bytes a real step holds at least, whatever its precision or checkpointing: every parameter's
# fp32 master copy, and for each one that trains its fp32 gradient and AdamW's two fp32 moments
# (advisor/trainer/step.py: fp32 master weights, AdamW). A model whose state exceeds the usable
# memory cannot run a real step.
WEIGHT_BYTES_PER_PARAM = 4
TRAINING_BYTES_PER_TRAINABLE_PARAM = 12


def training_state_bytes(num_params: int, num_trainable_params: int | None = None) -> int:
    """The bytes of a training step's state (see :data:`WEIGHT_BYTES_PER_PARAM`); every
    parameter trains when ``num_trainable_params`` is None."""
    trainable = num_params if num_trainable_params is None else num_trainable_params
    return WEIGHT_BYTES_PER_PARAM * num_params + TRAINING_BYTES_PER_TRAINABLE_PARAM * trainable


def needs_real_values(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the step reads tensor values a fake tensor
    does not have: a data-dependent output (``.item()``, ``.tolist()``), a shape made from
    values (``nonzero``, boolean masks) or a guard on such a value."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    kinds = (DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode)
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kinds):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def measure_step_trace(
    workload: Workload, spec: StepSpec, device: str, target_device_type: str
) -> dict[str, Any]:
    """(A child's body.) One real step's memory on ``device``, as a :class:`MemoryTrace` dict
    for ``target_device_type``: the allocator's peak per phase of the second step (after the
    optimizer has state), the training state's sizes read off the step itself."""
    from profilers.isolate import quiet_native_output
    from profilers.memory_truth import measure_cpu, measure_cuda

    started = time.perf_counter()
    state: dict[str, int] = {}

    def inspect(step: TrainStep) -> None:
        state.update(step_state_bytes(step))

    if device.startswith("cuda"):
        cuda = measure_cuda(workload, spec, device, inspect=inspect)
        # The libraries' workspaces are per process, as in the check: not the step's own.
        fb = max(0, cuda.forward_backward_peak_allocated_bytes - cuda.library_bytes)
        opt = max(0, cuda.optimizer_step_peak_allocated_bytes - cuda.library_bytes)
    else:
        with quiet_native_output():
            cpu = measure_cpu(workload, spec, inspect=inspect)
        fb, opt = cpu.forward_backward_peak_bytes, cpu.optimizer_step_peak_bytes
    return measured_trace(spec, target_device_type, fb, opt, state, started=started).to_dict()


def step_state_bytes(step: TrainStep) -> dict[str, int]:
    """What a step keeps between iterations: its parameters, buffers, the gradients its
    trainable parameters get and its optimizer's state (distinct storages, tied weights once)."""
    params = list(step.model.parameters())
    return {
        "parameters": _storage_bytes(params),
        "buffers": _storage_bytes(step.model.buffers()),
        "gradients": _storage_bytes(p for p in params if p.requires_grad),
        "optimizer_state": _storage_bytes(
            v for s in step.optimizer.state.values() for v in s.values()
        ),
    }


def measured_trace(
    spec: StepSpec,
    target_device_type: str,
    forward_backward_peak: int,
    optimizer_step_peak: int,
    state: dict[str, int],
    *,
    started: float,
) -> MemoryTrace:
    """A :class:`MemoryTrace` from a real step's per-phase peaks and its state's sizes
    (``started``: when the measurement began, a ``time.perf_counter()`` reading)."""
    from profilers.memory_tracing import assemble_trace

    params, buffers = state["parameters"], state["buffers"]
    gradients, optimizer = state["gradients"], state["optimizer_state"]

    def split(peak: int, held: MemoryBreakdown) -> MemoryBreakdown:
        # What the state does not explain is unsplit: activations, temporaries and (during
        # backward) gradients together.
        rest = peak - held.total
        if rest < 0:  # a peak below the state's sizes: nothing to split it by
            return MemoryBreakdown(other=peak)
        return dataclasses.replace(held, other=rest)

    fb = split(
        forward_backward_peak,
        MemoryBreakdown(parameters=params, buffers=buffers, optimizer_state=optimizer),
    )
    opt = split(
        optimizer_step_peak,
        MemoryBreakdown(
            parameters=params, buffers=buffers, gradients=gradients, optimizer_state=optimizer
        ),
    )
    trace = assemble_trace(
        spec,
        cuda_rounding=target_device_type == "cuda",
        forward_backward=fb,
        optimizer_step=opt,
        parameter_bytes=params,
        gradient_bytes=gradients,
        optimizer_state_bytes=optimizer,
        resident_bytes=params + buffers + optimizer,
        started=started,
    )
    return dataclasses.replace(trace, method=REAL_STEP)


def _storage_bytes(tensors: Any) -> int:
    import torch

    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())
