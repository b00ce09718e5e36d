"""Shallow copies of a model whose first blocks differ from the rest (DeepSeek-V3's dense layers
before its MoE layers) keep those blocks, and a model whose blocks repeat with a period (Llama 4
Maverick: dense and MoE layers in turn, RoPE left out of every 4th) is copied whole periods at a
time: a count from the first 2 and 3 blocks was a dense model's, or a mix no model has."""

from __future__ import annotations

from typing import Any

import pytest
from torch import nn

from advisor.models.adapter import block_pattern
from advisor.workload import AdvisorWorkload
from profilers.flops import _count, count_step_flops
from profilers.isolate import Isolation, run_isolated
from profilers.memory_blocks import DepthScaling, depth_scaling, trace_scaled
from profilers.memory_distributed import rank_depth_scaling
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


class Flagged(nn.Linear):
    """A block whose behaviour differs by a flag, not by its parameters (Llama 4's use_rope)."""

    def __init__(self, flag: bool) -> None:
        super().__init__(4, 4)
        self.use_rope = flag


def llama4(layers: int, **extra: Any) -> AdvisorWorkload:
    """Llama 4 Maverick's pattern: MoE every 2nd layer, no RoPE in every 4th."""
    pytest.importorskip("transformers")
    args: dict[str, Any] = {
        **extra,
        "hidden_size": 64,
        "intermediate_size": 64,
        "intermediate_size_mlp": 128,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 2,
        "vocab_size": 256,
        "max_position_embeddings": 64,
    }
    return AdvisorWorkload("hf:llama4_text", args)


def test_the_pattern_of_the_blocks_prefix_and_period() -> None:
    alike = [nn.Linear(4, 4) for _ in range(5)]
    assert block_pattern(alike) == (0, 1)
    assert block_pattern([nn.Linear(4, 8), nn.Linear(4, 8), *alike]) == (2, 1)
    interleaved = [nn.Linear(4, 4) if i % 2 else nn.Linear(4, 8) for i in range(6)]
    assert block_pattern(interleaved) == (0, 2)
    assert block_pattern([*interleaved, nn.Linear(4, 8)]) == (1, 2)  # whole periods after it
    # the same parameters, a flag off in every 4th block: period 4
    assert block_pattern([Flagged(i % 4 != 3) for i in range(12)]) == (0, 4)
    different = [nn.Linear(4, n) for n in range(1, 7)]
    assert block_pattern(different) == (5, 1)  # no pattern: never extended
    assert block_pattern([]) == (0, 1)


def test_the_fact_is_written_only_when_some_blocks_differ() -> None:
    facts = AdvisorWorkload("gpt-tiny").facts()
    assert (facts.uniform_blocks_from, facts.block_period) == (0, 1)
    assert "uniform_blocks_from" not in facts.to_dict()  # profiles of other models unchanged
    assert "block_period" not in facts.to_dict()
    prefixed = deepseek(10).facts()
    assert (prefixed.uniform_blocks_from, prefixed.block_period) == (3, 1)
    assert ModelFacts.from_dict(prefixed.to_dict()) == prefixed
    maverick = llama4(12).facts()  # three periods at least
    assert (maverick.uniform_blocks_from, maverick.block_period) == (0, 4)
    assert ModelFacts.from_dict(maverick.to_dict()) == maverick


def test_the_copies_hold_the_prefix_and_enough_blocks_past_it() -> None:
    workload = deepseek(10)
    assert depth_scaling(workload) == DepthScaling(layers=10, prefix=3, period=1, depths=(5, 6))
    assert depth_scaling(deepseek(8)) is None  # fewer than 6 blocks past the prefix
    assert depth_scaling(AdvisorWorkload("gpt-tiny", {"n_layer": 8})) == DepthScaling(
        layers=8, prefix=0, period=1, depths=(2, 3)
    )


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


# (precision, checkpointing, blocks resharded after forward, micro-batches): a rank with and
# without resharding; each shape accumulates in one of them, so both kinds are checked with
# accumulation, and a rank traced without it costs ~40% less.
RankSetting = tuple[str, str, bool, int]
RANK_SETTINGS: dict[str, tuple[RankSetting, RankSetting]] = {
    "deepseek": (("bf16", "full", True, 1), ("fp32", "none", False, 2)),
    "periodic": (("bf16", "full", True, 2), ("fp32", "none", False, 1)),
}


def _ranks_both_ways(
    workload: AdvisorWorkload, settings: tuple[RankSetting, ...]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """In the child (the fake process group is process-wide): FSDP ranks, profiled and whole."""
    from profilers import memory_distributed as md

    out = []
    for precision, checkpointing, reshard, accumulation in settings:
        spec = StepSpec(
            seq_len=16,
            micro_batch_size=2,
            grad_accum_steps=accumulation,
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


def _every_rank_both_ways(
    workloads: dict[str, AdvisorWorkload],
) -> dict[str, list[tuple[dict[str, Any], dict[str, Any]]]]:
    """Child: :func:`_ranks_both_ways` of each workload at its settings, one after the other."""
    return {
        name: _ranks_both_ways(workload, RANK_SETTINGS[name])
        for name, workload in workloads.items()
    }


@pytest.fixture(scope="module")
def fsdp_ranks() -> dict[str, list[tuple[dict[str, Any], dict[str, Any]]]]:
    """The FSDP ranks of both shapes below from ONE child: a child's start-up (torch,
    transformers, the fake process group) cost about as much as a shape's traces. The budget
    is the two children's it replaces."""
    workloads = {
        # a rank's copies: 2 dense + 3 and + 4 MoE blocks (a prefix of more than one block, as
        # DeepSeek-V3's 3; the single-device tests above keep its 3)
        "deepseek": deepseek(10, dense_first=2),
        # period 2 (RoPE left out of every 2nd layer, the MoE ones): copies of 3 and 4 periods
        "periodic": llama4(16, no_rope_layer_interval=2),
    }
    isolation = Isolation(timeout_s=1200, num_threads=1)
    outcome = run_isolated(isolation, _every_rank_both_ways, workloads)
    assert outcome.ok, f"{outcome.reason}\n{outcome.traceback}"
    ranks: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = outcome.value
    return ranks


def _assert_ranks_traced_as_whole(
    ranks: list[tuple[dict[str, Any], dict[str, Any]]], depths: tuple[int, int]
) -> None:
    for profiled_dict, whole_dict in ranks:
        profiled, whole = MemoryTrace.from_dict(profiled_dict), MemoryTrace.from_dict(whole_dict)
        assert profiled.scaled_from_blocks == depths and whole.scaled_from_blocks is None
        for field in BYTE_COUNT_FIELDS:
            assert getattr(profiled, field) == getattr(whole, field), field

        def at_64(t: MemoryTrace) -> int:  # what a reshard to 64 ranks scales
            return max(rest + sharded * 2 // 64 for rest, sharded in t.reshard_windows)

        assert at_64(profiled) == at_64(whole)


def test_a_deepseek_shaped_fsdp_rank_is_traced_from_copies_as_whole(
    fsdp_ranks: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]],
) -> None:
    # a rank's copies: 2 dense + 3 and + 4 MoE blocks (deepseek(10, dense_first=2))
    assert rank_depth_scaling(deepseek(10, dense_first=2)) == DepthScaling(
        layers=10, prefix=2, period=1, depths=(5, 6)
    )
    # DeepSeek-V3's 3 dense layers: copies of 3 + 3 and + 4
    assert rank_depth_scaling(deepseek(11, dense_first=3)) == DepthScaling(
        layers=11, prefix=3, period=1, depths=(6, 7)
    )
    _assert_ranks_traced_as_whole(fsdp_ranks["deepseek"], (5, 6))


def test_a_llama4_pattern_is_counted_and_traced_whole_periods_at_a_time() -> None:
    """Copies of 2 and 3 blocks (before 2026-12-05) read its peak 13.7% low without
    checkpointing and 6.1% high with it; copies of 2 and 3 periods by parameters alone (dense,
    MoE) 0.4-0.8% high (every 4th layer has no RoPE); of 2 and 3 whole periods, exactly."""
    workload = llama4(24)
    assert depth_scaling(workload) == DepthScaling(layers=24, prefix=0, period=4, depths=(8, 12))
    count = count_step_flops(workload, SPEC)
    whole_count = _count(workload, SPEC, "none", fake=True)
    tokens = SPEC.micro_batch_size * SPEC.seq_len
    assert count.scaled_from_blocks == (8, 12)
    assert count.flops_by_op["none"] == {op: n / tokens for op, n in sorted(whole_count.items())}
    spec = StepSpec(seq_len=32, micro_batch_size=2, precision="bf16")
    whole = trace(workload, spec, cuda_rounding=True)
    scaled = trace_scaled(workload, spec, cuda_rounding=True, num_layers=24, depths=(8, 12))
    assert scaled.forward_backward_peak_bytes == whole.forward_backward_peak_bytes
    assert scaled.forward_backward_breakdown == whole.forward_backward_breakdown


def test_a_periodic_fsdp_rank_is_traced_from_whole_periods_as_whole(
    fsdp_ranks: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]],
) -> None:
    """A rank's windows up to the second period's end and each of the last period's are their
    own (memory_distributed.trace_scaled); checked before by a script only. Llama 4 with RoPE
    left out of every 2nd layer, the MoE ones: period 2, copies of 3 and 4 periods."""
    workload = llama4(16, no_rope_layer_interval=2)
    assert depth_scaling(workload, (3, 4), min_layers=8) == DepthScaling(
        layers=16, prefix=0, period=2, depths=(6, 8)
    )
    _assert_ranks_traced_as_whole(fsdp_ranks["periodic"], (6, 8))
