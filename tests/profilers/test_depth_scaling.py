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
from profilers.memory_blocks import depth_scaling, scalable_layers
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


def test_sums_scale_from_copies_that_hold_the_prefix_and_memory_does_not_scale() -> None:
    workload = deepseek(10)
    assert depth_scaling(workload) == (10, 5, 6)  # 3 dense blocks + 2 and + 3 MoE blocks
    assert scalable_layers(workload) is None  # a peak is traced whole
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
