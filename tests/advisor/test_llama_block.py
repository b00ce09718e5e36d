"""The Llama block keeps what its backward needs and no more (issue 13, item 2).

RMSNorm keeps its input in the input's own dtype and the inverse RMS (not an fp32 upcast and an
fp32 normalised copy), hands the projections one low-precision copy under autocast, and 16-bit
grouped-query attention keeps k and v with their own heads (SDPA's ``enable_gqa``), not
repeated to every query head. The values are those of ``F.rms_norm`` and of repeated heads.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from advisor.models.llama import (
    Attention,
    LlamaBlock,
    LlamaConfig,
    RMSNorm,
    apply_rope,
    rope_tables,
)
from tests.advisor.saved_tensors import saved_activations

H, HEADS, FFN, T, B = 64, 8, 256, 16, 2


def config(kv_heads: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=32, n_layer=1, n_head=HEADS, n_kv_head=kv_heads, n_embd=H, ffn_hidden=FFN,
        max_seq_len=T,
    )  # fmt: skip


def test_rms_norm_equals_torch_in_fp32_and_under_autocast() -> None:
    torch.manual_seed(0)
    norm = RMSNorm(H, 1e-5)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(B, T, H, requires_grad=True)
    y, ref = norm(x), F.rms_norm(x, (H,), norm.weight, 1e-5)
    assert torch.equal(y, ref)
    grad = torch.randn_like(y)
    ours = torch.autograd.grad(y, (x, norm.weight), grad)
    theirs = torch.autograd.grad(ref, (x, norm.weight), grad)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, ref = norm(x), F.rms_norm(x, (H,), norm.weight, 1e-5)
    # What each projection would have cast the fp32 output to, once.
    assert low.dtype == torch.bfloat16 and torch.equal(low, ref.to(torch.bfloat16))


def test_rms_norm_gradients_are_exact_in_fp64() -> None:
    norm = RMSNorm(8, 1e-5).double()
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(norm, (x,))


@pytest.mark.parametrize("kv_heads", [2, HEADS])
def test_grouped_attention_equals_repeated_heads(kv_heads: int) -> None:
    torch.manual_seed(0)
    attention = Attention(config(kv_heads))
    rope = rope_tables(H // HEADS, T, 1e4)
    x = torch.randn(B, T, H)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = attention(x, rope)
        # The reference: k and v repeated to every query head, as fp32 still does.
        q = apply_rope(attention.wq(x).view(B, T, HEADS, -1), rope).transpose(1, 2)
        k = apply_rope(attention.wk(x).view(B, T, kv_heads, -1), rope).transpose(1, 2)
        v = attention.wv(x).view(B, T, kv_heads, -1).transpose(1, 2)
        k, v = (t.repeat_interleave(HEADS // kv_heads, dim=1) for t in (k, v))
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        ref = attention.wo(ref.transpose(1, 2).reshape(B, T, -1))
    assert torch.equal(y, ref)


def test_a_16_bit_block_keeps_no_fp32_activation_and_unrepeated_k_v() -> None:
    """An FSDP rank's block: bf16 parameters and input, under autocast."""
    kv_heads = 2
    block = LlamaBlock(config(kv_heads)).to(torch.bfloat16)
    rope = rope_tables(H // HEADS, T, 1e4)
    x = torch.randn(B, T, H, dtype=torch.bfloat16, requires_grad=True)
    kept = saved_activations(block, x, rope)
    big = [t for t in kept if t.numel() > B * T * HEADS]  # not rstd, lse or rope tables
    assert all(t.dtype == torch.bfloat16 for t in big), [(t.dtype, t.shape) for t in big]
    heads = [t.shape[1] for t in big if t.dim() == 4]  # SDPA's q, k, v, output
    assert sorted(heads) == [kv_heads, kv_heads, HEADS, HEADS]
    # Per token, at 2 bytes: the 2 norm inputs, the attention input, q, k and v, SDPA's output
    # (the output projection reads a view of it), the MLP input and its 4 tensors of width FFN
    # (benchmarks/activation_bytes.py's count). Beyond that only rstd, the log-sum-exp and the
    # RoPE tables (about 2% here).
    per_token = sum(t.untyped_storage().nbytes() for t in kept) / (B * T)
    textbook = 2 * (2 * H + H + H + 2 * H * kv_heads / HEADS + H + H + 4 * FFN)
    assert textbook <= per_token <= textbook * 1.025, (per_token, textbook)


def test_an_fp32_residual_stream_is_kept_once_per_norm() -> None:
    """One device under autocast: fp32 parameters and residual stream; each norm keeps its fp32
    input (which it needs) and the projections share one bf16 copy of its output."""
    block = LlamaBlock(config(HEADS))
    rope = rope_tables(H // HEADS, T, 1e4)
    x = torch.randn(B, T, H, requires_grad=True)
    kept = saved_activations(block, x, rope)
    full = [t for t in kept if t.shape[-1] == H and t.numel() == B * T * H]
    by_dtype: dict[Any, int] = {}
    for t in full:
        by_dtype[t.dtype] = by_dtype.get(t.dtype, 0) + 1
    # fp32: the two norm inputs; bf16: the attention input and the MLP input (one each, shared
    # by wq/wk/wv and by w1/w3); SDPA's output, which the output projection reads as a view, has
    # the heads' shape.
    assert by_dtype == {torch.float32: 2, torch.bfloat16: 2}, by_dtype


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_block_keeps_unrepeated_k_v_and_the_trace_matches_the_allocator() -> None:
    """CUDA's flash attention takes the grouped k/v as they are, and the CPU-traced peak of a
    Llama step (CPU autocast and kernels, CUDA rounding) stays close to the CUDA allocator's."""
    from advisor.workload import AdvisorWorkload
    from profilers.memory import measure_cuda_step_memory, trace_step_memory
    from profilers.workload import StepSpec

    kv_heads = 2
    block = LlamaBlock(config(kv_heads)).to("cuda", torch.bfloat16)
    rope = rope_tables(H // HEADS, T, 1e4).cuda()
    x = torch.randn(B, T, H, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    kept = saved_activations(block, x, rope)
    heads = sorted(t.shape[1] for t in kept if t.dim() == 4 and t.numel() > B * T * HEADS)
    assert heads == [kv_heads, kv_heads, HEADS, HEADS]

    workload = AdvisorWorkload("llama-tiny", {}, "synthetic")
    spec = StepSpec(seq_len=128, micro_batch_size=8, precision="bf16")
    measured = measure_cuda_step_memory(workload, spec, "cuda")
    traced = trace_step_memory(workload, spec, target_device_type="cuda")
    print(f"\nllama-tiny bf16 b=8: traced {traced.peak_bytes}, {measured.to_dict()}")
    truth = measured.step_peak_allocated_bytes  # the libraries' workspaces apart
    error = (traced.peak_bytes - truth) / truth
    assert abs(error) <= 0.15, error


def test_rope_rotates_each_pair_by_its_position_angle() -> None:
    """(x1, x2), the halves of a head, turned by position x inverse frequency (RoFormer), on the
    (b, t, heads, head_dim) layout the attention applies it in."""
    head_dim, theta = 8, 1e4
    x = torch.randn(B, T, HEADS, head_dim, dtype=torch.float64)
    got = apply_rope(x, rope_tables(head_dim, T, theta).double())
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angle = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)[None, :, None, :]
    turned = torch.complex(x[..., : head_dim // 2], x[..., head_dim // 2 :]) * torch.polar(
        torch.ones_like(angle), angle
    )
    torch.testing.assert_close(got, torch.cat([turned.real, turned.imag], dim=-1))
