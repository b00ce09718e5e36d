"""Shallow copies of a model whose first blocks differ from the rest (DeepSeek-V3's dense layers
before its MoE layers) keep those blocks: a count from the first 2 and 3 blocks was a dense
model's."""

from __future__ import annotations

from typing import Any

import pytest
from torch import nn

from advisor.models.adapter import uniform_blocks_from
from advisor.workload import AdvisorWorkload
from profilers.flops import _count, count_step_flops
from profilers.isolate import Isolation, run_isolated
from profilers.memory_blocks import depth_scaling, scalable_layers, trace_scaled
from profilers.memory_records import BYTE_COUNT_FIELDS, MemoryTrace
from profilers.memory_tracing import trace
from profilers.workload import ModelFacts, StepSpec

SPEC = StepSpec(seq_len=32, micro_batch_size=2)


def deepseek(layers: int, dense_first: int = 3) -> AdvisorWorkload:
    pytest.importorskip("transformers")
    args: dict[str, Any] = {
        "hidden_size": 64,
        "intermediate_size": 256,
        "moe_intermediate_size": 32,
        "num_hidden_layers": layers,
        "first_k_dense_replace": dense_first,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "kv_lora_rank": 16,
        "q_lora_rank": 32,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "qk_nope_head_dim": 16,
        "vocab_size": 256,
        "max_position_embeddings": 64,
    }
    return AdvisorWorkload("hf:deepseek_v3", args)


def test_the_blocks_alike_from_the_first_after_a_prefix() -> None:
    alike = [nn.Linear(4, 4) for _ in range(5)]
    assert uniform_blocks_from(alike) == 0
    assert uniform_blocks_from([nn.Linear(4, 8), nn.Linear(4, 8), *alike]) == 2
    interleaved = [nn.Linear(4, 4) if i % 2 else nn.Linear(4, 8) for i in range(6)]
    assert uniform_blocks_from(interleaved) == 5  # no run of alike blocks: never scaled
    assert uniform_blocks_from([]) == 0


def test_the_fact_is_written_only_when_some_blocks_differ() -> None:
    facts = AdvisorWorkload("gpt-tiny").facts()
    assert facts.uniform_blocks_from == 0
    assert "uniform_blocks_from" not in facts.to_dict()  # profiles of other models unchanged
    prefixed = deepseek(10).facts()
    assert prefixed.uniform_blocks_from == 3
    assert ModelFacts.from_dict(prefixed.to_dict()) == prefixed


def test_the_copies_hold_the_prefix_and_enough_blocks_past_it() -> None:
    workload = deepseek(10)
    assert depth_scaling(workload) == (10, 5, 6)  # 3 dense blocks + 2 and + 3 MoE blocks
    assert scalable_layers(workload) == 10
    assert depth_scaling(deepseek(8)) is None  # fewer than 6 blocks past the prefix
    assert depth_scaling(AdvisorWorkload("gpt-tiny", {"n_layer": 8})) == (8, 2, 3)


def test_a_deepseek_shape_is_counted_as_the_whole_model_counts() -> None:
    workload = deepseek(10)
    count = count_step_flops(workload, SPEC)
    assert count.scaled_from_blocks == (5, 6)
    whole = _count(workload, SPEC, "none", fake=True)
    tokens = SPEC.micro_batch_size * SPEC.seq_len
    assert count.flops_by_op["none"] == {op: n / tokens for op, n in sorted(whole.items())}
    assert count.expert_gemms is not None
    assert {g["calls"] for g in count.expert_gemms} == {7.0}  # the 7 MoE layers of 10


@pytest.mark.parametrize(
    ("checkpointing", "precision", "accumulation"),
    [("none", "bf16", 1), ("full", "fp32", 2)],
)
def test_a_deepseek_shape_is_traced_from_copies_as_the_whole_model_traces(
    checkpointing: str, precision: str, accumulation: int
) -> None:
    workload = deepseek(9)  # 3 dense + 6 MoE blocks: copies of 5 and 6
    spec = StepSpec(
        seq_len=32,
        micro_batch_size=2,
        grad_accum_steps=accumulation,
        precision=precision,
        activation_checkpointing=checkpointing,
    )
    whole = trace(workload, spec, cuda_rounding=True)
    scaled = trace_scaled(workload, spec, cuda_rounding=True, num_layers=9, depths=(5, 6))
    assert scaled.scaled_from_blocks == (5, 6)
    exact = ("forward_backward_peak_bytes", "parameter_bytes", "gradient_bytes")
    for field in (*exact, "optimizer_state_bytes", "resident_bytes"):
        assert getattr(scaled, field) == getattr(whole, field), field
    assert scaled.forward_backward_breakdown == whole.forward_backward_breakdown
    # The optimizer step holds one fp32 value per parameter tensor (the gradient norm's stack):
    # in the CUDA allocator's 512-byte blocks that is not affine in the blocks. Here 129
    # tensors (516 B) round to 1024 while the copies' 69 and 84 round to 512: one block.
    for field in ("optimizer_step_peak_bytes", "peak_bytes"):
        assert abs(getattr(scaled, field) - getattr(whole, field)) <= 512, field


def _ranks_both_ways(workload: AdvisorWorkload) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Child (the fake process group is process-wide): FSDP ranks, profiled and whole."""
    from profilers import memory_distributed as md

    out = []
    for precision, checkpointing, reshard in (("bf16", "full", True), ("fp32", "none", False)):
        spec = StepSpec(
            seq_len=16,
            micro_batch_size=2,
            grad_accum_steps=2,
            precision=precision,
            activation_checkpointing=checkpointing,
            parallelism="fsdp",
            world_size=2,
            fsdp_reshard_after_forward=reshard,
        )
        (profiled,) = md.trace_in_this_process(workload, [spec], "cuda")
        (whole,) = md.trace_in_this_process(workload, [spec], "cuda", whole=True)
        out.append((profiled.to_dict(), whole.to_dict()))
    return out


def test_a_deepseek_shaped_fsdp_rank_is_traced_from_copies_as_whole() -> None:
    workload = deepseek(11, dense_first=3)  # a rank's copies: 3 dense + 3 and + 4 MoE blocks
    outcome = run_isolated(Isolation(timeout_s=600, num_threads=1), _ranks_both_ways, workload)
    assert outcome.ok, f"{outcome.reason}\n{outcome.traceback}"
    for profiled_dict, whole_dict in outcome.value:
        profiled, whole = MemoryTrace.from_dict(profiled_dict), MemoryTrace.from_dict(whole_dict)
        assert profiled.scaled_from_blocks == (6, 7) and whole.scaled_from_blocks is None
        for field in BYTE_COUNT_FIELDS:
            assert getattr(profiled, field) == getattr(whole, field), field

        def at_64(t: MemoryTrace) -> int:  # what a reshard to 64 ranks scales
            return max(rest + sharded * 2 // 64 for rest, sharded in t.reshard_windows)

        assert at_64(profiled) == at_64(whole)
