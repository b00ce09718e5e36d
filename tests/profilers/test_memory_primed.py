"""The memory tracers make the unmeasured first iteration's optimizer state with one optimizer
step on zero gradients (``PrimableStep``) instead of a forward and backward: every field of the
trace must equal a real first iteration's, one device and FSDP rank (benchmarks/trace_speed.py
times the two ways); DDP and fp32 FSDP ranks keep the real first iteration."""

from __future__ import annotations

from typing import Any

import pytest

from advisor.trainer.step import AdvisorStep
from advisor.workload import AdvisorWorkload
from profilers.isolate import Isolation, run_isolated
from profilers.workload import StepSpec
from tests.profilers.trace_fields import trace_fields

WORKLOAD = AdvisorWorkload(model="llama-tiny", model_args={"n_layer": 3})


def _fields(spec: StepSpec) -> tuple[dict[str, Any], int]:
    """A trace's fields but its own time, and how many forward/backward passes it ran."""
    calls = []
    real = AdvisorStep.forward_backward

    def counted(step: AdvisorStep, batches: Any) -> Any:
        calls.append(1)
        return real(step, batches)

    AdvisorStep.forward_backward = counted  # type: ignore[method-assign,assignment]
    try:
        fields = trace_fields(WORKLOAD, spec)
    finally:
        AdvisorStep.forward_backward = real  # type: ignore[method-assign]
    return fields, len(calls)


def _both_ways(spec: StepSpec) -> tuple[tuple[dict[str, Any], int], tuple[dict[str, Any], int]]:
    primed = _fields(spec)
    ours = AdvisorStep.__dict__["prime_optimizer_state"]
    del AdvisorStep.prime_optimizer_state  # not a PrimableStep: a real first iteration
    try:
        real = _fields(spec)
    finally:
        AdvisorStep.prime_optimizer_state = ours  # type: ignore[method-assign]
    return real, primed


@pytest.mark.parametrize(
    ("precision", "checkpointing", "accumulation"),
    [("bf16", "none", 1), ("fp16", "blocks:1", 2)],
)
def test_a_primed_one_device_trace_reads_what_a_real_first_iteration_reads(
    precision: str, checkpointing: str, accumulation: int
) -> None:
    spec = StepSpec(
        seq_len=32,
        micro_batch_size=2,
        grad_accum_steps=accumulation,
        precision=precision,
        activation_checkpointing=checkpointing,
    )
    (real, real_passes), (primed, primed_passes) = _both_ways(spec)
    assert (real_passes, primed_passes) == (2, 1)
    assert primed["peak_bytes"] > 0 and primed["optimizer_state_bytes"] > 0
    assert primed == real


def _ranks(precision: str, parallelism: str) -> Any:
    spec = StepSpec(
        seq_len=32,
        micro_batch_size=2,
        precision=precision,
        activation_checkpointing="full",
        parallelism=parallelism,
        world_size=2,
    )
    # a child: the fake process group is process-wide
    outcome = run_isolated(Isolation(timeout_s=300, num_threads=1), _both_ways, spec)
    assert outcome.ok, f"{outcome.reason}\n{outcome.traceback}"
    return outcome.value


def test_a_primed_fsdp_rank_reads_what_a_real_first_iteration_reads() -> None:
    (real, real_passes), (primed, primed_passes) = _ranks("bf16", "fsdp")
    assert (real_passes, primed_passes) == (2, 1)
    assert primed["peak_bytes"] > 0
    assert primed == real


@pytest.mark.parametrize(("precision", "parallelism"), [("fp32", "fsdp"), ("bf16", "ddp")])
def test_ddp_and_fp32_fsdp_ranks_keep_a_real_first_iteration(
    precision: str, parallelism: str
) -> None:
    (real, real_passes), (primed, primed_passes) = _ranks(precision, parallelism)
    assert (real_passes, primed_passes) == (2, 2)
    assert primed == real
