"""A mixture of experts priced at its experts' own GEMM shapes, not as one dense FFN."""

from __future__ import annotations

import dataclasses

import pytest

from profilers.flops import FlopCount
from profilers.hardware import lookup_target
from profilers.workload import ModelFacts
from strategies import roofline
from strategies.space import Candidate
from strategies.whatif import RooflineTime, time_source

H100 = lookup_target("h100-80gb")
H, LAYERS, HEADS, VOCAB, SEQ = 2048, 4, 16, 32000, 4096


def moe(experts: int, top_k: int, ffn: int) -> tuple[ModelFacts, FlopCount]:
    """A Qwen-MoE-like model (gated experts of width ``ffn``, ``top_k`` of ``experts`` per
    token) and the FLOP count a profile would hold of it, expert shapes recorded."""
    attention = 4 * H * H
    block = attention + experts * 3 * H * ffn + H * experts + 2 * H
    params = LAYERS * block + VOCAB * H
    facts = ModelFacts(
        name="moe",
        family="hf-qwen3_moe",
        objective="causal_lm",
        num_params=params,
        num_trainable_params=params,
        num_embedding_params=VOCAB * H,
        num_layers=LAYERS,
        hidden_size=H,
        num_heads=HEADS,
        vocab_size=VOCAB,
        max_seq_len=SEQ,
        block_class="Block",
        ffn_hidden_size=ffn,  # Mixtral's intermediate_size: one expert's width
        tied_embeddings=True,
    )
    routed = 6.0 * LAYERS * top_k * 3 * H * ffn
    dense = 6.0 * (LAYERS * (attention + H * experts) + VOCAB * H)
    count = FlopCount(
        seq_len=SEQ,
        micro_batch_size=1,
        tokens=SEQ,
        flops_per_token={"none": dense + routed},
        flops_by_op={"none": {"aten.mm": dense, "aten._grouped_mm": routed}},
        formula_flops_per_token=None,
        method="fake",
        expert_gemms=[
            {"experts": experts, "k": H, "n": 2 * ffn, "rows_per_token": top_k, "calls": LAYERS},
            {"experts": experts, "k": ffn, "n": H, "rows_per_token": top_k, "calls": LAYERS},
        ],
    )
    return facts, count


def cand(mb: int, checkpointing: str = "none") -> Candidate:
    return Candidate(
        precision="bf16",
        activation_checkpointing=checkpointing,
        parallelism="fsdp",
        world_size=8,
        micro_batch_size=mb,
        grad_accum_steps=1,
    )


def source(count: FlopCount, facts: ModelFacts) -> RooflineTime:
    out = time_source(H100, facts, SEQ, count)
    assert isinstance(out, RooflineTime)
    return out


def test_the_expert_record_replaces_the_dense_ffn_with_grouped_gemms_at_their_shapes() -> None:
    facts, count = moe(experts=128, top_k=8, ffn=768)
    shape = source(count, facts).shape
    assert len(shape.experts) == 2
    ops = roofline.block_forward_ops(shape, tokens=SEQ, seq_len=SEQ, precision="bf16")
    names = {op.name for op in ops}
    assert not names & {"up", "down", "activation"}
    up = next(op for op in ops if op.name == "experts.0")
    rows = 8 * SEQ
    assert up.kind == "expert_gemm" and up.batch == 128
    assert up.mnk == (rows // 128, 2 * 768, H)  # 256 rows per expert
    assert up.flops == 2.0 * rows * H * 2 * 768
    # every expert's weights are read: 128 x H x 1536 x 2 B beside 2 x rows x ... of tokens
    assert up.bytes == 2.0 * (rows * H + 128 * H * 2 * 768 + rows * 2 * 768)
    # the activation between the projections at the routed width (read 2f, write f per row)
    act = next(op for op in ops if op.name == "experts.0.activation")
    down_act = next(op for op in ops if op.name == "experts.1.activation")
    assert act.bytes + down_act.bytes == 2.0 * rows * 3 * 768
    routing = next(op for op in ops if op.name == "experts.1.routing")
    assert routing.bytes == 2.0 * (roofline.ROUTING_ELEMENTS_PER_ROW * rows * H + SEQ * H)
    # the dense weights left are attention's and the head's
    assert shape.matmul_params == LAYERS * 4 * H * H + VOCAB * H


def test_the_experts_are_not_scaled_by_the_dense_count_and_flops_still_add_up() -> None:
    facts, count = moe(experts=64, top_k=4, ffn=1024)
    src = source(count, facts)
    # counted mm = attention + router + head; the analytic = attention + head (router: 0.1%)
    assert src.gemm_scale() == 1.0
    ops = roofline.step_ops(
        src.shape,
        tokens=SEQ,
        seq_len=SEQ,
        precision="bf16",
        checkpointing="none",
        casts_weights=False,
    )
    gemm_flops = sum(op.flops * op.count for op in ops if op.kind in roofline.GEMM_KINDS)
    # all but the router's (h x experts, under the tolerance that scales the dense ones)
    router = 6.0 * LAYERS * H * 64 * SEQ
    assert gemm_flops == pytest.approx(count.flops_per_token["none"] * SEQ - router)
    backward = [op for op in ops if op.name.startswith("experts.0.")]
    assert {op.name for op in backward} >= {"experts.0.dgrad", "experts.0.wgrad"}
    wgrad = next(op for op in backward if op.name == "experts.0.wgrad")
    assert wgrad.mnk == (H, 2 * 1024, SEQ * 4 // 64) and wgrad.batch == 64


def test_a_fine_grained_moe_at_a_small_micro_batch_is_bound_by_its_experts_weights() -> None:
    """128 experts, top-8, width 768: at 4k tokens each expert multiplies 256 rows and the
    call reads all 128 experts' weights; per token, the expert GEMMs cost more at 1 sequence
    than at 8 (the weights' bytes are shared by more rows), which one dense FFN of the same
    FLOPs does not show."""
    facts, count = moe(experts=128, top_k=8, ffn=768)
    shape = source(count, facts).shape

    def expert_seconds_per_token(tokens: int) -> float:
        ops = [
            op
            for op in roofline.block_forward_ops(shape, tokens, SEQ, "bf16")
            if op.kind == "expert_gemm"
        ]
        return roofline.time_ops(ops, H100, "bf16", seq_len=SEQ, head_dim=128).gemm_s / tokens

    assert expert_seconds_per_token(SEQ) > 1.3 * expert_seconds_per_token(8 * SEQ)
    up = next(
        op for op in roofline.block_forward_ops(shape, SEQ, SEQ, "bf16") if op.name == "experts.0"
    )
    bandwidth = H100.memory_bandwidth_gbs * 1e9 * roofline.MEMORY_BANDWIDTH_EFFICIENCY  # type: ignore[operator]
    peak = H100.peak_flops("bf16") * roofline.mamf_fraction(H100)[0]  # type: ignore[operator]
    assert up.bytes / bandwidth > up.flops / peak  # memory-bound at 256 rows per expert
    # the old pricing (no record: one dense FFN, FLOPs scaled to the count) is faster
    dense = source(dataclasses.replace(count, expert_gemms=None), facts)
    assert (
        source(count, facts).compute(cand(1)).forward_backward_s
        > dense.compute(cand(1)).forward_backward_s
    )


def test_checkpointing_recomputes_the_experts_as_its_policy_says() -> None:
    facts, count = moe(experts=8, top_k=2, ffn=2816)
    shape = source(count, facts).shape
    forward = roofline.block_forward_ops(shape, SEQ, SEQ, "bf16")

    def recomputed(setting: str, fraction: float | None = None) -> set[str]:
        return {
            op.name
            for op in roofline.recomputed_ops(forward, setting, LAYERS, fraction)
            if op.kind == "expert_gemm"
        }

    assert recomputed("none") == set()
    assert recomputed("ops") == set()  # ops saves grouped GEMMs' outputs
    assert recomputed("full") == {"experts.0", "experts.1"}
    assert recomputed("ops-half", 0.5) == {"experts.0", "experts.1"}  # its save list has none
    # the counted ops-half difference is the experts' forward plus half the dense blocks'
    blocks = 2.0 * (shape.matmul_params - VOCAB * H)
    counted = 1e12 + shape.expert_forward_flops_per_token + 0.5 * blocks
    assert roofline.recomputed_matmul_fraction(shape, counted, 1e12) == pytest.approx(0.5)


def test_autocast_casts_every_experts_weights() -> None:
    facts, count = moe(experts=8, top_k=2, ffn=2816)
    shape = source(count, facts).shape
    # gate_up (2f) and down (f) of all 8 experts in every layer
    assert shape.cast_params == shape.matmul_params + 8 * 3 * H * 2816 * LAYERS
    single = dataclasses.replace(cand(1), parallelism="single", world_size=1)
    text = source(count, facts).compute(single).source
    assert "mixture-of-experts GEMMs at their recorded shapes" in text
    assert "8 experts × 2048→5632, 2 rows/token" in text


def test_a_profile_without_the_record_is_priced_as_before() -> None:
    facts, count = moe(experts=8, top_k=2, ffn=2816)
    old = dataclasses.replace(count, expert_gemms=None)
    src = source(old, facts)
    assert src.shape.experts == ()
    assert src.gemm_scale() > 1.0  # the grouped GEMMs' FLOPs scale the dense op list
    assert "recorded shapes" not in src.compute(cand(1)).source


def test_experts_as_wide_as_the_model_count_their_activation_and_routing_once() -> None:
    """gpt-oss's experts are as wide as its hidden size: the down projection's K and N are
    both the hidden size. The activation reads the up projection's 2f and writes f per row,
    and the routing runs once per layer."""
    facts, count = moe(experts=32, top_k=4, ffn=H)
    ops = roofline.block_forward_ops(source(count, facts).shape, SEQ, SEQ, "bf16")
    rows = 4 * SEQ
    activation = sum(op.bytes for op in ops if op.name.endswith(".activation"))
    assert activation == 2.0 * rows * 3 * H
    assert [op.name for op in ops if op.name.endswith(".routing")] == ["experts.1.routing"]
