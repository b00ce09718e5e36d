"""The memory check's per-process overhead on CPU: a single-device training process's resident
memory beyond its tensors, and what a ddp/fsdp rank adds on top of it (issue 12).

Building a training step loads most of what a DDP/FSDP wrapper would load (with torch 2.13 the
optimizer's constructor imports ``torch._dynamo``, and with it the DTensor/FSDP stacks and
inductor). The check once measured the wrappers first, in a fresh child, so all of that read as
a rank's extra and was taken off the single-device overhead: single-device predictions came out
23-35% below ``advisor train``'s resident peak.
"""

from __future__ import annotations

import sys

import pytest

from profilers.isolate import Isolation, run_isolated
from profilers.memory_records import CpuStepMemory
from profilers.phases_memory import _memory_check_child
from profilers.workload import StepSpec
from tests.profilers.toy_workload import ToyWorkload


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_ranks_extra_is_measured_on_top_of_what_the_training_step_loaded() -> None:
    spec = StepSpec(seq_len=16, micro_batch_size=2)
    outcome = run_isolated(
        Isolation(timeout_s=120), _memory_check_child, ToyWorkload(), spec, "cpu"
    )
    assert outcome.ok, outcome.reason
    data, rss, extra = outcome.value
    truth = CpuStepMemory.from_dict(data).peak_bytes
    assert rss is not None and rss > truth > 0
    assert set(extra) == {"ddp", "fsdp"} and 0 <= extra["ddp"] <= extra["fsdp"]
    # The process's own overhead (the interpreter, torch, and what building and stepping the
    # model loaded) is hundreds of MiB; a gloo group and two wrappers on top of it are a few.
    # Measured before the step, the wrappers' imports read 80-190 MiB: more than a quarter.
    assert extra["fsdp"] < (rss - truth) / 4, (extra, rss, truth)


def test_cuda_libraries_workspaces_are_fixed_overhead_not_the_traces_error() -> None:
    # The first device run (an H200): a step's allocator peak held cuBLAS's two 32 MiB
    # workspaces beyond what any fake trace counts; they are per process, like the context.
    from profilers.memory_records import CudaStepMemory
    from profilers.phases_memory import _Evidence

    record = CudaStepMemory(
        spec=StepSpec(seq_len=16, micro_batch_size=4),
        device_name="NVIDIA H200",
        total_bytes=150 << 30,
        peak_allocated_bytes=(1 << 30) + (64 << 20),
        peak_reserved_bytes=(1 << 30) + (96 << 20),
        forward_backward_peak_allocated_bytes=(1 << 30) + (64 << 20),
        optimizer_step_peak_allocated_bytes=1 << 29,
        context_bytes=500 << 20,
        workspace_bytes=8 << 20,
        library_bytes=64 << 20,
    )
    evidence = _Evidence()
    truth = evidence.add(record.to_dict(), None, {}, predicted=1 << 30)
    assert truth == 1 << 30  # the step's own peak: what the trace predicted, exactly
    overhead = evidence.overhead(on_gpu=True)
    assert overhead.fixed_bytes == (500 + 8 + 64) << 20
    assert overhead.trace_error_fraction == 0.0
