"""The profile records a mixture of experts' grouped GEMMs shape by shape."""

from __future__ import annotations

import pytest
import torch

from profilers.expert_gemms import FIELDS, _count, count_expert_gemms
from profilers.flops import FlopCount, count_step_flops
from profilers.workload import StepSpec

pytestmark = [
    pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no grouped GEMM"),
]

SPEC = StepSpec(seq_len=32, micro_batch_size=2)


def mixtral(layers: int) -> object:
    pytest.importorskip("transformers")
    from advisor.workload import AdvisorWorkload
    from tests.advisor.test_models import TINY_MIXTRAL

    return AdvisorWorkload("hf:mixtral", {**TINY_MIXTRAL, "num_hidden_layers": layers})


def test_each_forward_projection_is_recorded_with_its_experts_rows_and_calls() -> None:
    records = count_expert_gemms(mixtral(2), SPEC)  # type: ignore[arg-type]
    assert records == [
        # gate and up fused (64 -> 2 x 96), then down (96 -> 64): two of four experts per token
        {"experts": 4.0, "k": 64.0, "n": 192.0, "rows_per_token": 2.0, "calls": 2.0},
        {"experts": 4.0, "k": 96.0, "n": 64.0, "rows_per_token": 2.0, "calls": 2.0},
    ]
    assert all(set(r) == set(FIELDS) for r in records)


def test_a_deep_model_is_recorded_from_shallow_copies_as_the_whole_would_be() -> None:
    deep = mixtral(8)
    scaled = count_expert_gemms(deep, SPEC)  # type: ignore[arg-type]
    whole = _count(deep, SPEC)  # type: ignore[arg-type]
    assert [r["calls"] for r in scaled] == [8.0, 8.0]
    assert sorted(whole.values()) == [8, 8]


def test_the_flop_count_carries_the_record_and_a_dense_model_has_none() -> None:
    pytest.importorskip("transformers")
    from advisor.workload import AdvisorWorkload

    count = count_step_flops(mixtral(2), SPEC)  # type: ignore[arg-type]
    assert count.expert_gemms is not None and len(count.expert_gemms) == 2
    again = FlopCount.from_dict(count.to_dict())
    assert again.expert_gemms == count.expert_gemms

    dense = count_step_flops(AdvisorWorkload("gpt-tiny", {}), SPEC)
    assert dense.expert_gemms is None
    assert "expert_gemms" not in dense.to_dict()  # profiles of dense models are unchanged


def test_the_formula_counts_the_experts_a_token_is_routed_to() -> None:
    """Published MoE utilisations count the activated parameters; every parameter in the
    formula made a Mixtral's MFU read 3.4x what its GPUs did."""
    from profilers.flops import palm_flops_per_token, unrouted_expert_params

    workload = mixtral(2)
    count = count_step_flops(workload, SPEC)  # type: ignore[arg-type]
    facts = workload.facts()  # type: ignore[attr-defined]
    # per layer, two of the four experts' gate-up (64 x 192) and down (96 x 64) weights sit out
    unrouted = 2 * (4 - 2) * 64 * 192 + 2 * (4 - 2) * 96 * 64
    assert unrouted_expert_params(count.expert_gemms) == unrouted
    every = palm_flops_per_token(
        facts.num_params,
        facts.num_layers,
        facts.hidden_size,
        SPEC.seq_len,
        num_embedding_params=facts.num_embedding_params,
    )
    routed = palm_flops_per_token(
        facts.num_params - unrouted,
        facts.num_layers,
        facts.hidden_size,
        SPEC.seq_len,
        num_embedding_params=facts.num_embedding_params,
    )
    assert count.formula_flops_per_token == pytest.approx(routed)
    assert count.formula_flops_per_token < every
    # the counted step does what the routed formula says (SDPA's backward recompute aside)
    assert count.model_flops_per_token == pytest.approx(count.formula_flops_per_token, rel=0.1)
    assert unrouted_expert_params(None) == 0
