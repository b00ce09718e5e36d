"""A model with a frozen parameter is traced: MemTracker hooked every parameter and torch
refuses a hook on one that needs no gradient, so every single-device and DDP memory probe of
such a model failed (ERNIE-4.5-MoE's expert-score correction bias; a fixed positional table as
here). FSDP's tracker never hooked them; its test keeps it so."""

from __future__ import annotations

from typing import Any

import pytest

from advisor.workload import AdvisorWorkload
from profilers.isolate import Isolation, run_isolated
from profilers.memory import measure_cpu_step_memory, trace_step_memory
from profilers.workload import StepSpec

WORKLOAD = AdvisorWorkload(model="tests/data/frozen_param_model.py:factory")
# dim 32, vocab 256, 2 blocks of 32 -> 128 -> 32, head 32 -> 256; the frozen table 128 x 32
TRAINABLE = 256 * 32 + 2 * (2 * 32 + 32 * 128 + 128 + 128 * 32 + 32) + 32 * 256 + 256
FROZEN = 128 * 32


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_frozen_parameter_is_traced_without_a_gradient(precision: str) -> None:
    spec = StepSpec(seq_len=64, micro_batch_size=4, precision=precision)
    trace = trace_step_memory(WORKLOAD, spec, target_device_type="cpu")
    assert trace.parameter_bytes == 4 * (TRAINABLE + FROZEN)
    assert trace.gradient_bytes == 4 * TRAINABLE
    truth = measure_cpu_step_memory(WORKLOAD, spec)
    assert truth.peak_bytes * 0.99 <= trace.peak_bytes <= truth.peak_bytes * 1.0001


def _fsdp_rank(workload: AdvisorWorkload) -> tuple[int, int]:
    from profilers import memory_distributed as md

    spec = StepSpec(
        seq_len=64, micro_batch_size=4, precision="bf16", parallelism="fsdp", world_size=2
    )
    (trace,) = md.trace_in_this_process(workload, [spec], "cpu")
    return trace.parameter_bytes, trace.gradient_bytes


def test_a_frozen_parameter_is_traced_on_an_fsdp_rank() -> None:
    outcome: Any = run_isolated(Isolation(timeout_s=300, num_threads=1), _fsdp_rank, WORKLOAD)
    assert outcome.ok, f"{outcome.reason}\n{outcome.traceback}"
    parameter_bytes, gradient_bytes = outcome.value
    # each rank holds half of every parameter (dim 0 padded to a multiple of 2: all even here)
    assert parameter_bytes == 4 * (TRAINABLE + FROZEN) // 2
    assert gradient_bytes == 4 * TRAINABLE // 2
