from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from profilers.flops import (
    FlopCount,
    conv_backward_flop,
    count_step_flops,
    formula_flops_per_token,
    mfu,
    palm_flops_per_token,
    register_cpu_sdpa_formulas,
)
from profilers.workload import StepSpec
from tests.profilers.toy_workload import ToyWorkload

WORKLOAD = ToyWorkload()  # d=64, 2 layers, 4 heads, vocab 256, tied embeddings
SPEC = StepSpec(seq_len=128, micro_batch_size=2)


@pytest.fixture(scope="module")
def counted() -> FlopCount:
    return count_step_flops(WORKLOAD, SPEC)


def test_cpu_sdpa_ops_are_registered_and_counted() -> None:
    register_cpu_sdpa_formulas()
    aten = torch.ops.aten
    assert aten._scaled_dot_product_flash_attention_for_cpu in flop_counter.flop_registry
    assert aten._scaled_dot_product_flash_attention_for_cpu_backward in flop_counter.flop_registry
    assert register_cpu_sdpa_formulas() == []  # idempotent
    b, h, s, d = 2, 4, 16, 8
    q = torch.randn(b, h, s, d, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    forward = 2 * (2 * b * h * s * s * d)  # Q·Kᵀ and P·V, no causal discount (as torch's own)
    assert counts["aten._scaled_dot_product_flash_attention_for_cpu"] == forward
    # backward: recompute the scores, then four matmuls for dV, dP, dQ, dK.
    assert counts["aten._scaled_dot_product_flash_attention_for_cpu_backward"] == 5 * forward // 2


def test_count_uses_the_fake_trace(counted: FlopCount) -> None:
    # The toy builds its meta module inside the fake mode; the count must still trace fake.
    assert counted.method == "fake", counted.fallback_reason
    assert counted.tokens == SPEC.micro_batch_size * SPEC.seq_len
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in counted.flops_by_op["none"]


def test_fake_trace_counts_what_a_real_step_counts(counted: FlopCount) -> None:
    real = count_step_flops(WORKLOAD, SPEC, prefer_fake=False)
    assert real.method == "real"
    assert real.flops_per_token == counted.flops_per_token


def test_counted_matches_palm_formula(counted: FlopCount) -> None:
    """The two differ by exactly two known terms, so the tolerance is derived, not tuned.

    * FlopCounterMode's SDPA backward recomputes Q·Kᵀ (flash attention does): +2·L·d·T per
      token, 1/6 more attention FLOPs than PaLM's 12·L·d·T.
    * 6N counts biases and norm weights, which do no matmul FLOPs: -6 per such parameter.
    With 6N ≈ 72·L·d² for the blocks, the first term alone is T/(36·d + 6·T) of the formula: the
    relative difference lies in [0, T/(36·d + 6·T)] (4.2% here, ~1% for GPT-2 small at T=1024).
    """
    d, L, T = WORKLOAD.d, WORKLOAD.layers, SPEC.seq_len
    per_layer_non_matmul = 3 * d + d + 4 * d + d + 2 * (2 * d)  # biases + two LayerNorms
    non_matmul = L * per_layer_non_matmul + 2 * d  # + final LayerNorm
    formula = formula_flops_per_token(WORKLOAD.facts(), T)
    assert counted.formula_flops_per_token == formula
    assert counted.model_flops_per_token - formula == 2 * L * d * T - 6 * non_matmul
    assert 0 <= counted.relative_difference <= T / (36 * d + 6 * T)


def test_checkpointing_adds_a_partial_forward(counted: FlopCount) -> None:
    none, full = counted.flops_per_token["none"], counted.flops_per_token["full"]
    d, L, T = WORKLOAD.d, WORKLOAD.layers, SPEC.seq_len
    block_forward = L * (2 * 12 * d * d + 4 * d * T)  # matmuls + attention, per token
    # Non-reentrant checkpointing stops recomputing once the saved tensors backward needs
    # are back, so the last matmul of each block is not redone: more than attention, at most
    # a full forward of the blocks.
    assert L * 4 * d * T < full - none <= block_forward


def test_palm_formula_and_mfu_arithmetic() -> None:
    # GPT-2 small shape (nanoGPT): 124M params of which 786,432 are position embeddings.
    per_token = palm_flops_per_token(124_439_808, 12, 768, 1024, num_embedding_params=1024 * 768)
    assert per_token == 6 * (124_439_808 - 786_432) + 12 * 12 * 768 * 1024
    assert mfu(1000.0, per_token, 312e12) == pytest.approx(1000 * per_token / 312e12)
    assert mfu(1000.0, per_token, None) is None  # unknown peak: no number, never a guess


def test_flop_count_round_trips_through_json(counted: FlopCount) -> None:
    data = json.loads(json.dumps(counted.to_dict()))
    assert data["relative_difference"] == pytest.approx(counted.relative_difference)
    assert FlopCount.from_dict(data) == counted


def test_ops_half_is_counted_under_its_own_policy_when_asked() -> None:
    """gpt's block runs four linear layers (c_attn, attn c_proj, c_fc, mlp c_proj); ops-half
    saves the 1st and 3rd and recomputes the 2nd (the 4th's output is read by no backward op,
    so non-reentrant checkpointing never runs it again): + one d×d forward matmul per block."""
    from advisor.workload import AdvisorWorkload

    d, layers = 32, 4
    gpt = AdvisorWorkload(
        "gpt-tiny", {"n_layer": layers, "n_embd": d, "n_head": 2, "block_size": 32}
    )
    spec = StepSpec(seq_len=32, micro_batch_size=2)
    plain = count_step_flops(gpt, spec)
    assert "ops-half" not in plain.flops_per_token  # counted only when asked
    assert plain.per_token("ops-half") is None  # nothing else predicts it
    counted = count_step_flops(gpt, spec, also=("ops-half",))
    none = counted.flops_per_token["none"]
    assert counted.flops_per_token["ops-half"] - none == layers * 2 * d * d
    assert counted.per_token("ops-half") < counted.flops_per_token["full"]


@pytest.mark.parametrize("groups", [64, 1])
def test_a_convolutions_backward_counts_twice_its_forward_whatever_its_groups(
    groups: int,
) -> None:
    """Torch's formula counts a grouped convolution's weight gradient as if it were dense: a
    depthwise one (a Mamba layer's, 64 channels here) read 64x its FLOPs. Dense convolutions
    count as torch counts them."""
    conv = torch.nn.Conv1d(64, 64, 4, groups=groups, padding=3)
    x = torch.randn(2, 64, 128, requires_grad=True)
    mapping = {torch.ops.aten.convolution_backward: conv_backward_flop}
    with FlopCounterMode(display=False, custom_mapping=mapping) as ours:
        conv(x).sum().backward()
    with FlopCounterMode(display=False) as torchs:
        conv(x).sum().backward()
    counts = {str(k): v for k, v in ours.get_flop_counts()["Global"].items()}
    assert counts["aten.convolution_backward"] == 2 * counts["aten.convolution"]
    theirs = {str(k): v for k, v in torchs.get_flop_counts()["Global"].items()}
    if groups == 1:
        assert counts == theirs
    else:
        assert theirs["aten.convolution_backward"] > 30 * counts["aten.convolution_backward"]
    # an input that needs no gradient: the weight's only
    frozen = torch.randn(2, 64, 128)
    with FlopCounterMode(display=False, custom_mapping=mapping) as weight_only:
        conv(frozen).sum().backward()
    counts = {str(k): v for k, v in weight_only.get_flop_counts()["Global"].items()}
    assert counts["aten.convolution_backward"] == counts["aten.convolution"]


def test_a_mamba_models_count_has_its_convolutions_at_their_size() -> None:
    pytest.importorskip("transformers")
    from advisor.workload import AdvisorWorkload

    args = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 256, "mamba_n_heads": 8,
            "mamba_d_head": 16, "mamba_d_state": 16, "mamba_chunk_size": 32}  # fmt: skip
    count = count_step_flops(AdvisorWorkload("hf:bamba", args), StepSpec(seq_len=64))
    by_op = count.flops_by_op["none"]
    assert by_op["aten.convolution_backward"] == pytest.approx(2 * by_op["aten.convolution"])
