"""Records of the memory probe: traced and measured step memory (JSON via to_dict/from_dict)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from profilers.workload import StepSpec

# MemoryTrace.method of a step measured on a real step (profilers.memory_measured).
REAL_STEP = "real step"
# How a memory probe row measured so begins (its reason), whatever its status: what recommend
# reads to tell a real step that could not run from a trace left out for time.
REAL_STEP_ROW = f"{REAL_STEP}: "
# The reason of a real-step memory check left out because the config is predicted not to fit
# (profilers.phases_memory writes it in probes.csv; strategies.cost reads it).
PREDICTED_NOT_TO_FIT = "predicted not to fit the device"

TARGET_DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda")


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryBreakdown:
    """Bytes live at one instant, by what they hold (MemTracker's ``_MemRefType`` categories).

    MemTracker labels a storage by where it was created: ``activations`` are created in forward
    (and in the recomputation of checkpointed blocks), ``temporaries`` in backward (gradients of
    activations, and parameter gradients until their hook relabels them ``gradients``). Storages
    created between backward and ``optimizer.step()`` (GradScaler's unscale, gradient clipping)
    count as ``activations``. Inside ``optimizer.step()`` the state that outlives the step is
    ``optimizer_state`` and the rest (e.g. foreach AdamW's parameter-sized temporaries) is
    ``temporaries``.

    Distributed steps (``memory_distributed``): under FSDP ``parameters`` holds the local shards
    and the gathered (unsharded) parameters, ``gradients`` the sharded ones, and
    ``communication`` the all-gather and reduce-scatter buffers; under DDP ``gradients`` holds
    the gradient buckets (they are the gradients' storage). ``communication`` is 0 elsewhere.
    """

    parameters: int = 0
    buffers: int = 0
    gradients: int = 0
    optimizer_state: int = 0
    activations: int = 0
    temporaries: int = 0
    other: int = 0
    communication: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in dataclasses.fields(self))

    def to_dict(self) -> dict[str, int]:
        return {**dataclasses.asdict(self), "total": self.total}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryBreakdown:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in names})


# MemoryTrace's byte counts, whole-step and per phase (what two traces of one step must agree on).
BYTE_COUNT_FIELDS: tuple[str, ...] = (
    "peak_bytes",
    "forward_backward_peak_bytes",
    "optimizer_step_peak_bytes",
    "parameter_bytes",
    "gradient_bytes",
    "optimizer_state_bytes",
    "resident_bytes",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryTrace:
    """Traced memory of one full training step (the second one: optimizer state exists).

    ``peak_bytes`` is the max of the two phase peaks; each breakdown is taken at its phase's
    peak. ``resident_bytes`` is what stays live between steps (parameters, optimizer state, and
    gradients if the step does not free them). For a CUDA target every storage is rounded up
    to the caching allocator's 512-byte blocks; CUDA context, workspaces and fragmentation are
    not included (see :class:`CudaStepMemory`).
    """

    spec: StepSpec
    target_device_type: str
    peak_bytes: int
    forward_backward_peak_bytes: int
    optimizer_step_peak_bytes: int
    forward_backward_breakdown: MemoryBreakdown
    optimizer_step_breakdown: MemoryBreakdown
    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    resident_bytes: int
    trace_seconds: float
    # (K1, K2): traced on copies with K1 and K2 repeated blocks and extended to the model's
    # depth (profilers.memory_blocks); None: traced whole.
    scaled_from_blocks: tuple[int, int] | None = None
    # An FSDP rank's forward+backward per window (memory_tracing.PeakWindows): the most bytes
    # not sharded and the most sharded (the rank's parameter shards, sharded gradients and
    # optimizer state: 1/N of the model each) live at any moment of it. A rank at N' ranks
    # holds at most max over windows of (unsharded + sharded x N/N'): MemoryModel.resharded.
    # Empty: not an FSDP rank, or traced before windows were kept.
    reshard_windows: tuple[tuple[int, int], ...] = ()
    # One device's forward+backward peak per window of the step, split where the last
    # repeated block's backward ends (memory_tracing.PeakWindows: "F" the forward until
    # autocast drops its weight copies, "A" until that backward ends, "B" the rest of
    # backward), in that order; the largest is forward_backward_peak_bytes. What prices
    # blocks:K from the traced settings (checkpointing_fits). Empty: a model without repeated
    # blocks, a distributed rank, or traced before windows were kept.
    window_peaks: tuple[tuple[str, int], ...] = ()
    # How the bytes were obtained: "trace" (fake tensors under MemTracker), or "real step" for
    # a model no fake trace can run (one that reads tensor values on the host): the allocator's
    # per-phase peaks of real steps on the profiled device (profilers.memory_measured), split
    # only into the training state and the rest (``other``).
    method: str = "trace"

    @property
    def peak_phase(self) -> str:
        if self.forward_backward_peak_bytes >= self.optimizer_step_peak_bytes:
            return "forward_backward"
        return "optimizer_step"

    @property
    def breakdown(self) -> MemoryBreakdown:
        """The breakdown at the overall peak."""
        if self.peak_phase == "forward_backward":
            return self.forward_backward_breakdown
        return self.optimizer_step_breakdown

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "target_device_type": self.target_device_type,
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase,
            "forward_backward_peak_bytes": self.forward_backward_peak_bytes,
            "optimizer_step_peak_bytes": self.optimizer_step_peak_bytes,
            "forward_backward_breakdown": self.forward_backward_breakdown.to_dict(),
            "optimizer_step_breakdown": self.optimizer_step_breakdown.to_dict(),
            "parameter_bytes": self.parameter_bytes,
            "gradient_bytes": self.gradient_bytes,
            "optimizer_state_bytes": self.optimizer_state_bytes,
            "resident_bytes": self.resident_bytes,
            "trace_seconds": self.trace_seconds,
            "scaled_from_blocks": list(self.scaled_from_blocks)
            if self.scaled_from_blocks
            else None,
            **(
                {"reshard_windows": [list(w) for w in self.reshard_windows]}
                if self.reshard_windows
                else {}
            ),
            **({"window_peaks": dict(self.window_peaks)} if self.window_peaks else {}),
            **({"method": self.method} if self.method != "trace" else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryTrace:
        return cls(
            spec=StepSpec.from_dict(data["spec"]),
            target_device_type=str(data["target_device_type"]),
            peak_bytes=int(data["peak_bytes"]),
            forward_backward_peak_bytes=int(data["forward_backward_peak_bytes"]),
            optimizer_step_peak_bytes=int(data["optimizer_step_peak_bytes"]),
            forward_backward_breakdown=MemoryBreakdown.from_dict(
                data["forward_backward_breakdown"]
            ),
            optimizer_step_breakdown=MemoryBreakdown.from_dict(data["optimizer_step_breakdown"]),
            parameter_bytes=int(data["parameter_bytes"]),
            gradient_bytes=int(data["gradient_bytes"]),
            optimizer_state_bytes=int(data["optimizer_state_bytes"]),
            resident_bytes=int(data["resident_bytes"]),
            trace_seconds=float(data["trace_seconds"]),
            scaled_from_blocks=_pair(data.get("scaled_from_blocks")),
            reshard_windows=tuple(
                (int(rest), int(sharded)) for rest, sharded in data.get("reshard_windows") or ()
            ),
            window_peaks=tuple(
                (str(name), int(peak)) for name, peak in (data.get("window_peaks") or {}).items()
            ),
            method=str(data.get("method", "trace")),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class CpuStepMemory:
    """CPU truth for one real step: the allocator's net bytes, peaked per phase."""

    spec: StepSpec
    peak_bytes: int
    forward_backward_peak_bytes: int
    optimizer_step_peak_bytes: int
    step_seconds: float  # wall time of the measured step, profiler overhead included

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "spec": self.spec.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CpuStepMemory:
        return cls(
            spec=StepSpec.from_dict(data["spec"]),
            peak_bytes=int(data["peak_bytes"]),
            forward_backward_peak_bytes=int(data["forward_backward_peak_bytes"]),
            optimizer_step_peak_bytes=int(data["optimizer_step_peak_bytes"]),
            step_seconds=float(data["step_seconds"]),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class CudaStepMemory:
    """CUDA truth for one real step, and what the fake trace cannot see.

    ``fragmentation_bytes`` is reserved minus allocated at their peaks (the caching allocator's
    cached but unused blocks). ``context_bytes`` is device memory in use before the workload was
    built that the allocator does not hold: the CUDA context, plus other processes on a shared
    device (an upper bound). ``workspace_bytes`` is device memory the step added outside the
    allocator (library handles and workspaces not taken from the caching allocator).
    ``library_bytes`` is what the math libraries take *from* the caching allocator once per
    process: cuBLAS's workspace, one per thread and stream (a step's forward and autograd's
    backward thread: 2 × 32 MiB on an H200). The allocator's peaks include it, the fake trace
    cannot: :attr:`step_peak_allocated_bytes` is the step's own.
    """

    spec: StepSpec
    device_name: str
    total_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    forward_backward_peak_allocated_bytes: int
    optimizer_step_peak_allocated_bytes: int
    context_bytes: int
    workspace_bytes: int
    library_bytes: int = 0

    @property
    def step_peak_allocated_bytes(self) -> int:
        """The allocator's peak less the libraries' workspaces: what the fake trace counts."""
        return max(0, self.peak_allocated_bytes - self.library_bytes)

    @property
    def fragmentation_bytes(self) -> int:
        return self.peak_reserved_bytes - self.peak_allocated_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "spec": self.spec.to_dict(),
            "fragmentation_bytes": self.fragmentation_bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CudaStepMemory:
        names = {f.name for f in dataclasses.fields(cls)} - {"spec", "device_name"}
        return cls(
            spec=StepSpec.from_dict(data["spec"]),
            device_name=str(data["device_name"]),
            **{k: int(v) for k, v in data.items() if k in names},
        )


def fitted_groups(traces: Sequence[MemoryTrace]) -> list[tuple[str, str]]:
    """The (precision, checkpointing) groups whose single-device, plain-loss, non-accumulating
    traces cover two or more micro-batch sizes (what a memory fit needs), in the order their
    first trace appears."""
    sizes: dict[tuple[str, str], set[int]] = {}
    for trace in traces:
        s = trace.spec
        if s.parallelism == "single" and s.loss_chunks == 1 and s.grad_accum_steps == 1:
            group = (s.precision, s.activation_checkpointing)
            sizes.setdefault(group, set()).add(s.micro_batch_size)
    return [group for group, seen in sizes.items() if len(seen) >= 2]


def _pair(value: Any) -> tuple[int, int] | None:
    if not value:
        return None
    first, second = value
    return int(first), int(second)
