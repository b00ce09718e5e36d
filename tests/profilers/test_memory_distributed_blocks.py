"""A deep model's DDP/FSDP rank traced from 3- and 4-block copies equals its whole trace.

profilers.memory_distributed extends a rank's trace in depth window by window, as one device's
(profilers.memory_blocks): here gpt-tiny with 8 blocks is traced both ways, at the settings where
a rank's peak moves between windows (accumulation, bf16 with checkpointing, the blocks kept
gathered, the CUDA allocator's rounding), in one child (the fake process group is process-wide).
"""

from __future__ import annotations

from typing import Any

import pytest

from advisor.workload import AdvisorWorkload
from profilers.isolate import Isolation, run_isolated
from profilers.memory_distributed import SCALE_FROM_BLOCKS, rank_depth_scaling
from profilers.memory_records import BYTE_COUNT_FIELDS, MemoryTrace
from profilers.workload import StepSpec

LAYERS = 8
FIELDS = (
    *BYTE_COUNT_FIELDS,
    "forward_backward_breakdown",
    "optimizer_step_breakdown",
)
CASES = {
    # id: (parallelism, precision, checkpointing, micro-batch, accumulation, reshard, CUDA)
    "fsdp-bf16-full-accum-cuda": ("fsdp", "bf16", "full", 2, 2, True, True),
    "fsdp-fp32-kept-gathered": ("fsdp", "fp32", "none", 1, 1, False, False),
    "ddp-fp32-none": ("ddp", "fp32", "none", 1, 1, True, False),
    # blocks:K differs block by block: no shallow copy has the same mix, so traced whole.
    "fsdp-fp32-blocks": ("fsdp", "fp32", "blocks:4", 1, 1, True, False),
}


def _spec(case: tuple[Any, ...]) -> StepSpec:
    parallelism, precision, checkpointing, micro, accum, reshard, _ = case
    return StepSpec(
        seq_len=16,
        micro_batch_size=micro,
        grad_accum_steps=accum,
        precision=precision,
        activation_checkpointing=checkpointing,
        parallelism=parallelism,
        world_size=2,
        fsdp_reshard_after_forward=reshard,
    )


def _both_ways(workload: AdvisorWorkload) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Child: per case, (the whole model's trace, the profiler's trace) as dicts; for blocks:K
    the profiler's twice (it is the whole trace)."""
    from profilers import memory_distributed as md

    out = {}
    for name, case in CASES.items():
        spec, target = _spec(case), "cuda" if case[-1] else "cpu"
        (profiled,) = md.trace_in_this_process(workload, [spec], target)
        whole = profiled
        if profiled.scaled_from_blocks is not None:
            (whole,) = md.trace_in_this_process(workload, [spec], target, whole=True)
        out[name] = (whole.to_dict(), profiled.to_dict())
    return out


@pytest.fixture(scope="module")
def traces() -> dict[str, tuple[MemoryTrace, MemoryTrace]]:
    workload = AdvisorWorkload(model="gpt-tiny", model_args={"n_layer": LAYERS})
    outcome = run_isolated(Isolation(timeout_s=600, num_threads=1), _both_ways, workload)
    assert outcome.ok, f"{outcome.reason}\n{outcome.traceback}"
    return {
        name: (MemoryTrace.from_dict(whole), MemoryTrace.from_dict(profiled))
        for name, (whole, profiled) in outcome.value.items()
    }


@pytest.mark.parametrize("case", [c for c in CASES if not c.endswith("blocks")])
def test_the_rank_extended_from_shallow_copies_equals_the_whole_trace(
    traces: dict[str, tuple[MemoryTrace, MemoryTrace]], case: str
) -> None:
    whole, profiled = traces[case]
    assert profiled.scaled_from_blocks == SCALE_FROM_BLOCKS and whole.scaled_from_blocks is None
    for field in FIELDS:
        assert getattr(profiled, field) == getattr(whole, field), field
    if case.startswith("fsdp"):
        # What a reshard to 64 ranks scales (the largest window, sharded bytes at 2/64): the
        # same from the scaled trace's five windows as from the whole trace's per-block ones.
        def at_64(trace: MemoryTrace) -> int:
            return max(rest + sharded * 2 // 64 for rest, sharded in trace.reshard_windows)

        assert at_64(profiled) == at_64(whole)
        assert max(r + s for r, s in whole.reshard_windows) >= whole.forward_backward_peak_bytes


def test_blocks_k_checkpointing_is_traced_whole(
    traces: dict[str, tuple[MemoryTrace, MemoryTrace]],
) -> None:
    _, profiled = traces["fsdp-fp32-blocks"]
    assert profiled.scaled_from_blocks is None
    assert profiled.peak_bytes > 0


def test_only_models_deeper_than_both_copies_are_scaled() -> None:
    deep = AdvisorWorkload(model="gpt-tiny", model_args={"n_layer": sum(SCALE_FROM_BLOCKS) + 1})
    shallow = AdvisorWorkload(model="gpt-tiny", model_args={"n_layer": sum(SCALE_FROM_BLOCKS)})
    scaling = rank_depth_scaling(deep)
    assert scaling is not None
    assert (scaling.layers, scaling.depths) == (sum(SCALE_FROM_BLOCKS) + 1, SCALE_FROM_BLOCKS)
    assert rank_depth_scaling(shallow) is None
