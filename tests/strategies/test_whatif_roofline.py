"""The what-if per-op roofline: efficiency that varies with shape, for reasons it can name."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from profilers.hardware import lookup_target
from profilers.workload import ModelFacts
from strategies import roofline
from strategies.space import Candidate
from strategies.whatif import FlopsTime, RooflineTime, time_source

A100 = lookup_target("a100-80gb")
H100 = lookup_target("h100-80gb")


def gpt_facts(hidden: int, layers: int, heads: int, seq: int, vocab: int = 50368) -> ModelFacts:
    """An MPT/GPT-shaped model without biases: 12·h² per block, tied embeddings, positions."""
    params = layers * (12 * hidden * hidden + 4 * hidden) + vocab * hidden + seq * hidden
    return ModelFacts(
        name="gpt",
        family="gpt",
        objective="causal_lm",
        num_params=params,
        num_trainable_params=params,
        num_embedding_params=vocab * hidden + seq * hidden,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        vocab_size=vocab,
        max_seq_len=seq,
        block_class="Block",
        ffn_hidden_size=4 * hidden,
        tied_embeddings=True,
    )


def llama_facts(
    h: int = 2048,
    layers: int = 16,
    heads: int = 32,
    kv: int = 8,
    ffn: int = 8192,
    vocab: int = 128256,
    head_dim: int = 0,
) -> ModelFacts:
    """A Llama-shaped model (GQA, SwiGLU, tied embeddings); ``head_dim``: a head width that is
    not h / heads (0: it is)."""
    d = head_dim or h // heads
    block = h * (heads * d + 2 * kv * d) + heads * d * h + 3 * h * ffn + 2 * h
    params = layers * block + vocab * h + h
    return ModelFacts(
        name="llama",
        family="llama",
        objective="causal_lm",
        num_params=params,
        num_trainable_params=params,
        num_embedding_params=vocab * h,
        num_layers=layers,
        hidden_size=h,
        num_heads=heads,
        vocab_size=vocab,
        max_seq_len=8192,
        block_class="LlamaBlock",
        ffn_hidden_size=ffn,
        num_kv_heads=kv,
        tied_embeddings=True,
        head_dim=head_dim,
    )


def cand(micro: int, checkpointing: str = "none", precision: str = "bf16") -> Candidate:
    return Candidate(
        precision=precision,
        activation_checkpointing=checkpointing,
        parallelism="fsdp",
        world_size=8,
        micro_batch_size=micro,
        grad_accum_steps=1,
    )


def tokens_per_s(facts: ModelFacts, seq: int, c: Candidate, target=A100) -> float:  # type: ignore[no-untyped-def]
    source = time_source(target, facts, seq, None)
    assert isinstance(source, RooflineTime)
    return c.micro_batch_size * seq / source.compute(c).forward_backward_s


def model_flops_utilisation(facts: ModelFacts, seq: int, c: Candidate) -> float:
    flops = 6 * facts.num_params + 12 * facts.num_layers * facts.hidden_size * seq
    return tokens_per_s(facts, seq, c) * flops / A100.peak_flops("bf16")  # type: ignore[operator]


def test_the_shape_is_recovered_from_the_facts() -> None:
    gpt = roofline.BlockShape.from_facts(gpt_facts(2048, 24, 16, 2048))
    assert gpt is not None
    assert (gpt.ffn_matrices, gpt.ffn_hidden, gpt.head_dim, gpt.causal) == (2, 8192, 128, True)
    assert gpt.matmul_params == 24 * 12 * 2048 * 2048 + 50368 * 2048
    llama = roofline.BlockShape.from_facts(llama_facts())
    assert llama is not None
    assert (llama.ffn_matrices, llama.num_kv_heads, llama.head_dim) == (3, 8, 64)
    broken = dataclasses.replace(gpt_facts(256, 2, 4, 128), num_heads=0)
    assert roofline.BlockShape.from_facts(broken) is None


def test_waves_that_fill_the_gpu_are_efficient_and_one_tile_more_halves_them() -> None:
    sms = A100.num_sms
    assert sms == 108
    full = roofline.wave_efficiency(128 * sms, 128, sms)
    assert full == pytest.approx(1.0)
    one_more = roofline.wave_efficiency(128 * (sms + 1), 128, sms)
    assert one_more == pytest.approx((sms + 1) / (2 * sms), rel=0.05)
    assert roofline.wave_efficiency(100, 100, sms) < 0.01  # one small tile on a big GPU


def test_efficiency_grows_with_width_as_published_runs_show() -> None:
    # The constant-MFU model predicted the same utilisation for every width; the roofline's
    # small models lose time to memory-bound ops (the loss over a 50k vocabulary, norms) and
    # head-dim-64 attention, as llm-foundry's A100 table shows (125M: 45% MFU, 7B: 64%).
    small = model_flops_utilisation(gpt_facts(768, 12, 12, 2048), 2048, cand(40))
    large = model_flops_utilisation(gpt_facts(4096, 32, 32, 2048), 2048, cand(6))
    assert large > small + 0.10
    assert 0.3 < small < large < 0.87  # below the GEMM ceiling (A100 MAMF)


def test_long_sequences_are_slower_per_token_because_attention_grows() -> None:
    facts = gpt_facts(2048, 24, 16, 32768)
    short = tokens_per_s(facts, 2048, cand(16))
    long = tokens_per_s(facts, 32768, cand(1))
    assert long < 0.6 * short
    parts = dict(time_source(A100, facts, 32768, None).compute(cand(1)).parts)
    assert parts["attention"] > parts["gemm"]


def test_parts_add_up_and_checkpointing_costs_about_a_forward() -> None:
    facts = gpt_facts(4096, 32, 32, 2048)
    source = time_source(H100, facts, 2048, None)
    plain, full = source.compute(cand(4)), source.compute(cand(4, "full"))
    assert sum(v for _, v in plain.parts) == pytest.approx(plain.forward_backward_s)
    assert {k for k, _ in plain.parts} == set(roofline.PARTS)
    assert 1.2 < full.forward_backward_s / plain.forward_backward_s < 1.4
    assert "roofline" in plain.source and "sustained" in plain.source


def test_h100_is_faster_than_a100_but_by_less_than_the_peaks() -> None:
    facts = gpt_facts(2048, 24, 16, 2048)
    a100, h100 = tokens_per_s(facts, 2048, cand(8)), tokens_per_s(facts, 2048, cand(8), H100)
    peaks = H100.peak_flops("bf16") / A100.peak_flops("bf16")  # type: ignore[operator]
    assert 1.5 < h100 / a100 < peaks


def test_tiny_kernels_pay_the_launch_floor() -> None:
    tiny = gpt_facts(128, 2, 4, 64, vocab=256)
    parts = dict(time_source(A100, tiny, 64, None).compute(cand(1)).parts)
    assert parts["launch"] > parts["gemm"]
    big = dict(time_source(A100, gpt_facts(4096, 32, 32, 2048), 2048, None).compute(cand(4)).parts)
    assert big["launch"] < 0.01 * big["gemm"]


def test_fp32_runs_on_the_fp32_peak() -> None:
    facts = gpt_facts(1024, 24, 16, 2048)
    assert tokens_per_s(facts, 2048, cand(8, precision="fp32")) < 0.2 * tokens_per_s(
        facts, 2048, cand(8)
    )


def test_facts_without_a_transformer_block_fall_back_to_flops_at_one_efficiency() -> None:
    facts = dataclasses.replace(gpt_facts(256, 2, 4, 128), num_layers=0)
    source = time_source(A100, facts, 128, None)
    assert isinstance(source, FlopsTime)
    assert "fallback" in source.compute(cand(2)).source


def test_the_fallback_keeps_a_launch_floor_and_names_the_attribute_that_avoids_it() -> None:
    """A small model without a head count in its facts: FLOPs at one efficiency priced its
    step at 2 us (241M tokens/s on one H100) where the roofline of a same-size model with
    heads charges ~0.3 ms of kernel launches."""
    with_heads = gpt_facts(64, 2, 4, 64, vocab=256)
    facts = dataclasses.replace(with_heads, num_heads=0)
    source = time_source(H100, facts, 64, None)
    assert isinstance(source, FlopsTime)
    compute = source.compute(cand(8))
    kernels = source.launch_floor_kernels(cand(8))
    assert kernels > 20 * facts.num_layers  # every op of a block, forward and backward
    assert compute.forward_backward_s == pytest.approx(kernels * roofline.LAUNCH_S)
    assert "launch floor" in compute.source and "n_head" in compute.source
    roofline_time = time_source(H100, with_heads, 64, None).compute(cand(8))
    ratio = compute.forward_backward_s / roofline_time.forward_backward_s
    assert 0.5 < ratio < 2.0  # the same order as the roofline's, not 1/180 of it


def test_counted_gemm_flops_rescale_a_model_that_is_not_the_standard_block() -> None:
    from profilers.flops import FlopCount

    facts = gpt_facts(1024, 4, 16, 512)
    shape = roofline.BlockShape.from_facts(facts)
    assert shape is not None
    exact = 6.0 * shape.matmul_params

    def count(gemm: float) -> FlopCount:
        return FlopCount(
            seq_len=512,
            micro_batch_size=1,
            tokens=512,
            flops_per_token={"none": gemm, "full": gemm},
            flops_by_op={"none": {"aten.mm": gemm}, "full": {"aten.mm": gemm}},
            formula_flops_per_token=None,
            method="fake",
        )

    assert RooflineTime(target=A100, shape=shape, seq_len=512, flops=count(exact)).gemm_scale() == 1
    wider = RooflineTime(target=A100, shape=shape, seq_len=512, flops=count(1.5 * exact))
    assert wider.gemm_scale() == pytest.approx(1.5)
    plain = RooflineTime(target=A100, shape=shape, seq_len=512).compute(cand(4))
    scaled = wider.compute(cand(4))
    assert dict(scaled.parts)["gemm"] == pytest.approx(1.5 * dict(plain.parts)["gemm"], rel=0.01)
    assert "scaled ×1.500" in scaled.source


def test_attention_run_as_matmuls_is_not_counted_as_gemms_too() -> None:
    """An eager-attention model (no SDPA kernel in its count: Gemma 2, gpt-oss) counts its
    scores and weighted sum as bmm; the op list prices them as its attention op, so they stay
    out of the GEMM rescale, and the source says the attention is priced as flash (optimistic).
    With an SDPA kernel in the count, a bmm is a GEMM like any other."""
    from profilers.flops import FlopCount

    facts = gpt_facts(1024, 4, 16, 512)
    shape = roofline.BlockShape.from_facts(facts)
    assert shape is not None
    dense = 6.0 * shape.matmul_params
    attention = 12.0 * 512 * 1024 * 4  # QK^T and PV, forward and backward, per token

    def source(by_op: dict[str, float]) -> RooflineTime:
        count = FlopCount(
            seq_len=512,
            micro_batch_size=1,
            tokens=512,
            flops_per_token={"none": sum(by_op.values())},
            flops_by_op={"none": by_op},
            formula_flops_per_token=None,
            method="fake",
        )
        return RooflineTime(target=A100, shape=shape, seq_len=512, flops=count)

    eager = source({"aten.mm": dense, "aten.bmm": attention})
    assert eager.attention_as_matmuls()
    assert eager.gemm_scale() == 1.0
    assert "priced as flash attention: optimistic" in eager.compute(cand(4)).source
    sdpa = source(
        {
            "aten.mm": dense,
            "aten.bmm": 0.1 * dense,
            "aten._scaled_dot_product_flash_attention": attention,
        }
    )
    assert not sdpa.attention_as_matmuls()
    assert sdpa.gemm_scale() == pytest.approx(1.1)
    assert "optimistic" not in sdpa.compute(cand(4)).source


def _eager_count(seq: int, traffic: dict[str, dict[str, float]] | None):  # type: ignore[no-untyped-def]
    """A count of gpt_facts(1024, 4, 16, seq) run with eager attention (bmm, no SDPA)."""
    shape = roofline.BlockShape.from_facts(gpt_facts(1024, 4, 16, seq))
    assert shape is not None
    by_op = {"aten.mm": 6.0 * shape.matmul_params, "aten.bmm": 12.0 * seq * 1024 * 4}
    return shape, _count(seq, by_op, score_traffic=traffic)


# Per token at sequence 512 for gpt_facts(1024, 4, 16, 512): 4 layers × 16 heads × 512 score
# elements per token, ~40 B each forward and backward in bf16; Q·Kᵀ and P·V at head dim 64.
EAGER_512 = {
    "forward_bytes": 4 * 16 * 512 * 37.0,
    "backward_bytes": 4 * 16 * 512 * 42.0,
    "forward_gemm_flops": 4 * 2 * 2 * 16 * 512 * 64.0,
    "backward_gemm_flops": 4 * 4 * 2 * 16 * 512 * 64.0,
}


def test_an_eager_attention_is_priced_at_its_counted_score_traffic() -> None:
    """With the profile's count of the score traffic, eager attention is its matmuls as GEMMs
    plus its element-wise ops' bytes at the memory bandwidth, not a flash kernel: the
    memory-bound part grows by exactly those bytes, and the source says so."""
    shape, counted = _eager_count(512, {"fp32": EAGER_512, "bf16": EAGER_512})
    _, uncounted = _eager_count(512, None)
    eager = RooflineTime(target=A100, shape=shape, seq_len=512, flops=counted)
    flash = RooflineTime(target=A100, shape=shape, seq_len=512, flops=uncounted)
    c = cand(8)
    priced, optimistic = eager.compute(c), flash.compute(c)
    assert "eager attention (no SDPA kernel)" in priced.source
    assert "optimistic" not in priced.source and "optimistic" in optimistic.source
    sustained, _ = roofline.sustained_fraction(A100)
    bandwidth = A100.memory_bandwidth_gbs * 1e9 * roofline.MEMORY_BANDWIDTH_EFFICIENCY  # type: ignore[operator]
    traffic = (EAGER_512["forward_bytes"] + EAGER_512["backward_bytes"]) * 8 * 512
    grew = dict(priced.parts)["memory_bound"] - dict(optimistic.parts)["memory_bound"]
    assert grew == pytest.approx(traffic / bandwidth / sustained)
    assert priced.forward_backward_s > optimistic.forward_backward_s
    # fp16 moves what bf16 moves; a longer sequence moves proportionally more per token
    assert eager.eager_traffic("fp16") == eager.eager_traffic("bf16")
    longer = RooflineTime(target=A100, shape=shape, seq_len=1024, flops=counted)
    assert longer.eager_traffic("bf16").forward_bytes == 2 * EAGER_512["forward_bytes"]  # type: ignore[union-attr]


def test_eager_attention_recompute_follows_the_trainer_policies() -> None:
    """full recomputes the attention's matmuls and element-wise ops; ops and ops-half save the
    matmuls' outputs (bmm is in their save lists) and recompute the element-wise ops only."""
    from profilers.flops import ScoreTraffic

    shape, _ = _eager_count(512, None)
    traffic = ScoreTraffic.from_dict(EAGER_512)
    tokens = 4 * 512

    def totals(checkpointing: str) -> tuple[float, float]:
        ops = roofline.step_ops(
            shape,
            tokens=tokens,
            seq_len=512,
            precision="bf16",
            checkpointing=checkpointing,
            casts_weights=False,
            matmul_fraction=0.5 if checkpointing == "ops-half" else None,
            eager=traffic,
        )
        assert not any(op.kind == "attention" for op in ops)  # no flash kernel
        flops = sum(op.flops * op.count for op in ops if op.kind == "attention_gemm")
        score_bytes = sum(
            op.bytes * op.count for op in ops if op.name.startswith("attention.score_ops")
        )
        return flops, score_bytes

    fwd_f, bwd_f = traffic.forward_gemm_flops * tokens, traffic.backward_gemm_flops * tokens
    fwd_b, bwd_b = traffic.forward_bytes * tokens, traffic.backward_bytes * tokens
    assert totals("none") == pytest.approx((fwd_f + bwd_f, fwd_b + bwd_b))
    assert totals("full") == pytest.approx((2 * fwd_f + bwd_f, 2 * fwd_b + bwd_b))
    assert totals("ops") == pytest.approx((fwd_f + bwd_f, 2 * fwd_b + bwd_b))
    assert totals("ops-half") == pytest.approx((fwd_f + bwd_f, 2 * fwd_b + bwd_b))
    assert totals("blocks:2") == pytest.approx((1.5 * fwd_f + bwd_f, 1.5 * fwd_b + bwd_b))
    # the GEMM rescale of a model that is not the standard block leaves them alone
    ops = roofline.step_ops(
        shape,
        tokens=tokens,
        seq_len=512,
        precision="bf16",
        checkpointing="none",
        casts_weights=False,
        eager=traffic,
    )
    one = roofline.time_ops(ops, A100, "bf16", seq_len=512, head_dim=64)
    two = roofline.time_ops(ops, A100, "bf16", seq_len=512, head_dim=64, gemm_scale=2.0)
    assert two.attention_s == one.attention_s and two.gemm_s > one.gemm_s


def test_a_mixture_of_experts_count_scales_the_gemms_up_by_its_routed_experts() -> None:
    """The experts' grouped GEMMs count with the dense ones: a block whose FFN runs in two of
    its experts per token does twice the FFN's FLOPs, not only its attention's."""
    from profilers.flops import FlopCount

    facts = gpt_facts(1024, 4, 16, 512)
    shape = roofline.BlockShape.from_facts(facts)
    assert shape is not None
    dense = 6.0 * shape.matmul_params
    ffn = 6.0 * facts.num_layers * 2 * facts.hidden_size * facts.ffn_hidden_size
    by_op = {"aten.mm": dense - ffn, "aten._grouped_mm": 2 * ffn}
    count = FlopCount(
        seq_len=512,
        micro_batch_size=1,
        tokens=512,
        flops_per_token={"none": dense + ffn},
        flops_by_op={"none": by_op},
        formula_flops_per_token=None,
        method="fake",
    )
    moe = RooflineTime(target=A100, shape=shape, seq_len=512, flops=count)
    assert moe.gemm_scale() == pytest.approx((dense + ffn) / dense)


def test_an_unmeasured_gpu_says_its_constants_are_borrowed() -> None:
    l40s = lookup_target("l40s")
    source = time_source(l40s, gpt_facts(2048, 24, 16, 2048), 2048, None)
    text = source.compute(cand(4)).source
    assert "not measured for this GPU" in text and "untuned" in text


def test_ops_half_recomputes_the_counted_part_of_the_matmuls() -> None:
    from profilers.flops import FlopCount
    from strategies.errors import Unpredictable

    facts = llama_facts()
    shape = roofline.BlockShape.from_facts(facts)
    assert shape is not None
    forward_blocks = 2.0 * (shape.matmul_params - shape.vocab * shape.hidden)
    plain = 6.0 * shape.matmul_params

    def source(recomputed: float | None) -> RooflineTime:
        counted = {"none": plain, "full": plain + forward_blocks}
        if recomputed is not None:
            counted["ops-half"] = plain + recomputed * forward_blocks
        flops = FlopCount(
            seq_len=8192,
            micro_batch_size=1,
            tokens=8192,
            flops_per_token=counted,
            flops_by_op={m: {"aten.mm": v} for m, v in counted.items()},
            formula_flops_per_token=None,
            method="fake",
        )
        return RooflineTime(target=A100, shape=shape, seq_len=8192, flops=flops)

    assert roofline.recomputed_matmul_fraction(
        shape, plain + 0.4 * forward_blocks, plain
    ) == pytest.approx(0.4)
    half = source(0.4)
    ops, ops_half, full = (half.compute(cand(1, c)) for c in ("ops", "ops-half", "full"))
    gemm = {c: dict(t.parts)["gemm"] for c, t in (("ops", ops), ("ops-half", ops_half))}
    base_gemm = dict(half.compute(cand(1)).parts)["gemm"]
    # forward + dgrad + wgrad = 3 forwards; 0.4 of the blocks' forward once more (the head's
    # GEMMs are a few % of the total and are not recomputed)
    extra = (gemm["ops-half"] - gemm["ops"]) / base_gemm
    assert 0.10 < extra < 0.4 / 3
    assert ops.forward_backward_s < ops_half.forward_backward_s < full.forward_backward_s
    assert source(0.0).compute(cand(1, "ops-half")).forward_backward_s == pytest.approx(
        ops.forward_backward_s
    )
    with pytest.raises(Unpredictable, match="--checkpointing ops-half"):
        source(None).compute(cand(1, "ops-half"))


def test_fp32_attention_runs_near_the_gemm_rate_not_at_flash_attentions_fraction() -> None:
    # FA-2's fractions are low because its matmuls run on tensor cores and its softmax does
    # not; fp32 has neither tensor cores nor a flash kernel, so its attention FLOPs are
    # priced like its GEMMs' (gpt-small at sequence 1024, our H200 run's shape).
    facts = gpt_facts(768, 12, 12, 1024)
    source = time_source(H100, facts, 1024, None)
    fp32 = dict(source.compute(cand(32, precision="fp32")).parts)
    bf16 = dict(source.compute(cand(32)).parts)
    # Attention FLOPs per GEMM FLOP are the same in both precisions; only the rates differ.
    fp32_ratio, bf16_ratio = fp32["attention"] / fp32["gemm"], bf16["attention"] / bf16["gemm"]
    saturation = 1024 / (1024 + roofline.ATTENTION_HALF_SATURATION_TOKENS)
    gemm_fraction, _ = roofline.mamf_fraction(H100)
    assert roofline.attention_efficiency(H100, 1024, 64, True, "fp32") == pytest.approx(
        gemm_fraction * saturation
    )
    assert fp32_ratio < 0.25  # ~1/10 of the GEMMs' time (attention FLOPs ~9% of them)
    assert bf16_ratio > 2 * fp32_ratio  # bf16 attention: FA-2 at 34% × 0.68 of the peak
    assert "fp32 attention (no flash kernel" in source.compute(cand(32, precision="fp32")).source
    assert "FA-2's hopper efficiency" in source.compute(cand(32)).source


def _count(seq: int, by_op: dict[str, float], **extra: Any) -> Any:
    """A fake FLOP count of one sequence whose per-token ops are ``by_op``."""
    from profilers.flops import FlopCount

    return FlopCount(
        seq_len=seq,
        micro_batch_size=1,
        tokens=seq,
        flops_per_token={"none": sum(by_op.values())},
        flops_by_op={"none": by_op},
        formula_flops_per_token=None,
        method="fake",
        **extra,
    )


def test_a_hybrid_pays_for_attention_in_the_layers_that_attend_only() -> None:
    """Jamba attends in 1 layer of 8 (the others run a Mamba scan): the op list, which prices
    attention in every layer, is scaled to the counted attention kernel's FLOPs. A count of
    every layer's attention (torch's 4·T·h per token per layer) leaves it as it is."""
    seq, layers = 4096, 8
    facts = gpt_facts(1024, layers, 16, seq)
    shape = roofline.BlockShape.from_facts(facts)
    assert shape is not None
    per_layer = 4.0 * seq * 1024  # forward, per token

    def source(attending: int) -> RooflineTime:
        by_op = {
            "aten.mm": 6.0 * shape.matmul_params,
            "aten._scaled_dot_product_flash_attention": attending * per_layer,
            "aten._scaled_dot_product_flash_attention_backward": 2.5 * attending * per_layer,
        }
        return RooflineTime(
            target=H100, shape=shape, seq_len=seq, flops=_count(seq, by_op), state_space=True
        )

    dense, hybrid = source(layers), source(1)
    assert dense.attention_scale() == 1.0 and hybrid.attention_scale() == pytest.approx(1 / 8)
    full, one = dict(dense.compute(cand(1)).parts), dict(hybrid.compute(cand(1)).parts)
    assert one["attention"] == pytest.approx(full["attention"] / 8)
    assert one["gemm"] == pytest.approx(full["gemm"])
    assert "attention scaled ×0.125" in hybrid.compute(cand(1)).source
    assert "a hybrid's attention layers only" in hybrid.compute(cand(1)).source
    # A model without state-space layers whose count differs: its heads, not a hybrid's layers.
    dense_heads = dataclasses.replace(source(1), state_space=False)
    assert "heads not as wide as the facts say" in dense_heads.compute(cand(1)).source
    assert "scan kernels" not in dense_heads.compute(cand(1)).source
    assert "attention scaled" not in dense.compute(cand(1)).source


def test_a_pure_state_space_stack_pays_for_no_attention() -> None:
    """A Mamba-2 stack (Bamba's default config: every layer a Mamba layer) counts batched
    matmuls (its chunked scan's einsums) and no attention kernel. With state-space layers in
    the facts that is no attention at all, not an eager attention priced as flash; the same
    count without them still reads as an eager attention."""
    from profilers.flops import SCORE_TRAFFIC_FIELDS as SCORE_FIELDS

    seq = 4096
    facts = dataclasses.replace(
        gpt_facts(1024, 8, 16, seq), state_space_kernels=("mamba_ssm.selective_scan_fn",)
    )
    shape = roofline.BlockShape.from_facts(facts)
    assert shape is not None
    by_op = {"aten.mm": 6.0 * shape.matmul_params, "aten.bmm": 0.05 * shape.matmul_params}
    # the eager-attention counter ran and found no T×T scores (a real profile's record)
    nothing = {p: dict.fromkeys(SCORE_FIELDS, 0.0) for p in ("fp32", "bf16")}
    count = _count(seq, by_op, score_traffic=nothing)
    mamba = time_source(H100, facts, seq, count)
    assert isinstance(mamba, RooflineTime) and mamba.state_space
    assert not mamba.attention_as_matmuls() and mamba.attention_scale() == 0.0
    computed = mamba.compute(cand(1))
    assert dict(computed.parts)["attention"] == 0.0
    assert "no attention" in computed.source and "optimistic" not in computed.source
    plain = time_source(H100, dataclasses.replace(facts, state_space_kernels=()), seq, count)
    assert isinstance(plain, RooflineTime) and plain.attention_as_matmuls()
    assert dict(plain.compute(cand(1)).parts)["attention"] > 0


def test_a_recorded_head_width_shapes_the_projections_and_prices_attention_at_its_width() -> None:
    """Qwen3-4B's heads are 128 wide where hidden / heads is 80: its queries are 4096 wide, its
    attention counts 4·T·4096 FLOPs per token per layer (no rescale needed) and runs at a
    128-wide head's efficiency. Read as 80 the projections' parameters did not add up and the
    attention was priced at the narrower head's lower efficiency."""
    h, layers, heads, kv, d, ffn, vocab, seq = 2560, 36, 32, 8, 128, 9728, 151936, 4096
    block = h * (heads * d + 2 * kv * d) + heads * d * h + 3 * h * ffn + 2 * h
    facts = llama_facts(h, layers, heads, kv, ffn, vocab, head_dim=d)
    shape = roofline.BlockShape.from_facts(facts)
    assert shape is not None
    assert (shape.head_dim, shape.attention_width, shape.ffn_matrices) == (128, 4096, 3)
    assert shape.matmul_params == layers * (block - 2 * h) + vocab * h
    ops = {op.name: op for op in roofline.block_forward_ops(shape, seq, seq, "bf16")}
    assert ops["qkv"].mnk == (seq, 4096 + 2 * kv * d, h)
    assert ops["proj"].mnk == (seq, h, 4096)
    assert ops["attention"].flops == pytest.approx(4.0 * heads * seq * seq * d / 2)
    # A count of every layer's 4·T·(heads × 128) per token matches the analytic attention.
    by_op = {
        "aten.mm": 6.0 * shape.matmul_params,
        "aten._scaled_dot_product_flash_attention": layers * 4.0 * seq * heads * d,
    }
    source = RooflineTime(target=H100, shape=shape, seq_len=seq, flops=_count(seq, by_op))
    assert source.attention_scale() == 1.0
    narrow = roofline.attention_efficiency(H100, seq, h // heads, False)
    assert roofline.attention_efficiency(H100, seq, shape.head_dim, False) > narrow
    # Without a recorded width (facts written before it) the shape is what it always was.
    legacy = roofline.BlockShape.from_facts(dataclasses.replace(facts, head_dim=0))
    assert legacy is not None and legacy.head_dim == 80 and legacy.attention_width == h


def test_state_space_kernels_are_priced_at_their_recorded_bytes_and_recomputed() -> None:
    """A Mamba stack's scan kernels (the profile's record: calls, FLOPs and elements per
    token) are memory-bound ops at the HBM bandwidth, in the activations' dtype plus fp32
    chunk states; full checkpointing runs their forward once more, and so does ops (a kernel
    is not among the matmul and attention outputs its policy saves)."""
    seq, layers, channels, state = 4096, 8, 2048, 16
    facts = dataclasses.replace(
        gpt_facts(1024, layers, 16, seq), state_space_kernels=("mamba_ssm.selective_scan_fn",)
    )
    shape = roofline.BlockShape.from_facts(facts)
    assert shape is not None
    record = {
        "mamba_ssm.selective_scan_fn": {
            "calls": float(layers),
            "forward_flops": layers * 2.0 * channels * state,
            "backward_flops": layers * 6.0 * channels * state,
            "forward_elements": layers * (5.0 * channels + 2 * state),
            "forward_fp32_elements": 0.0,
            "backward_elements": layers * (8.0 * channels + 2 * state),
            "backward_fp32_elements": layers * 2.0 * state,
        }
    }
    by_op = {"aten.mm": 6.0 * shape.matmul_params}
    plain = time_source(H100, facts, seq, _count(seq, by_op))
    priced = time_source(H100, facts, seq, _count(seq, by_op, state_space_kernels=record))
    assert isinstance(plain, RooflineTime) and isinstance(priced, RooflineTime)
    bandwidth = H100.memory_bandwidth_gbs * 1e9 * roofline.MEMORY_BANDWIDTH_EFFICIENCY  # type: ignore[operator]
    sustained, _ = roofline.sustained_fraction(H100)
    work = record["mamba_ssm.selective_scan_fn"]
    tokens = 4 * seq

    def extra(checkpointing: str) -> float:
        c = cand(4, checkpointing)
        return (
            dict(priced.compute(c).parts)["memory_bound"]
            - dict(plain.compute(c).parts)["memory_bound"]
        )

    forward = 2 * work["forward_elements"] * tokens / bandwidth / sustained
    backward = (
        (2 * work["backward_elements"] + 4 * work["backward_fp32_elements"])
        * tokens
        / bandwidth
        / sustained
    )
    assert extra("none") == pytest.approx(forward + backward)
    assert extra("full") == pytest.approx(2 * forward + backward)
    assert extra("ops") == pytest.approx(2 * forward + backward)
    assert "scan kernels at their recorded bytes" in priced.compute(cand(4)).source
    assert "scan kernels are not priced" in plain.compute(cand(4)).source
