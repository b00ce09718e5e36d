"""A trace's fields, for tests that compare two ways of tracing the same step."""

from __future__ import annotations

from typing import Any

from profilers.memory import trace_step_memory
from profilers.workload import StepSpec, Workload


def trace_fields(workload: Workload, spec: StepSpec) -> dict[str, Any]:
    """Every field of the step's CUDA-target trace but its own time; a DDP/FSDP rank is traced
    in this process (call it in a child: the fake process group is process-wide)."""
    if spec.parallelism == "single":
        traced = trace_step_memory(workload, spec, target_device_type="cuda")
    else:
        from profilers import memory_distributed as md

        (traced,) = md.trace_in_this_process(workload, [spec], "cuda")
    return {k: v for k, v in traced.to_dict().items() if k != "trace_seconds"}
