"""A CUDA target's trace gives grouped-query SDPA calls that flash attention cannot take (fp32,
a mask) CUDA's math kernel: its T × T probabilities are kept for backward, as on a GPU, where
the memory-efficient kernel takes no grouped heads. Calls flash takes are left alone."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from profilers.memory_tracing import cuda_grouped_query_sdpa

B, HEADS, KV_HEADS, T, D = 2, 8, 2, 16, 32


def _qkv(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    q = torch.randn(B, HEADS, T, D, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(B, KV_HEADS, T, D, dtype=dtype, requires_grad=True) for _ in range(2))
    return q, k, v


def _kept(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, autocast: bool = False, **kw: object
) -> tuple[torch.Tensor, set[tuple[torch.dtype, tuple[int, ...]]]]:
    kept: set[tuple[torch.dtype, tuple[int, ...]]] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.add((t.dtype, tuple(t.shape)))
        return t

    cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), cast:
        out = F.scaled_dot_product_attention(q, k, v, **kw)  # type: ignore[arg-type]
    out.sum().backward()
    return out, kept


def _scores(kept: set[tuple[torch.dtype, tuple[int, ...]]]) -> set[torch.dtype]:
    """The dtypes of the kept tensors with a T × T score block per head (not the mask's T × T)."""
    return {dtype for dtype, shape in kept if shape[-2:] == (T, T) and len(shape) > 2}


def test_an_fp32_grouped_query_call_keeps_the_math_kernels_probabilities() -> None:
    q, k, v = _qkv()
    cpu, cpu_kept = _kept(q, k, v, is_causal=True, enable_gqa=True)
    assert not _scores(cpu_kept)  # CPU's flash kernel takes fp32 grouped heads
    with cuda_grouped_query_sdpa():
        cuda, cuda_kept = _kept(q, k, v, is_causal=True, enable_gqa=True)
    assert _scores(cuda_kept) == {torch.float32}
    assert torch.allclose(cpu, cuda, atol=1e-5)  # the same attention, another kernel


def test_calls_without_grouped_heads_are_left_to_the_cpu_kernel() -> None:
    """fp32 without grouped heads (k and v repeated, or as many as q's): CUDA's
    memory-efficient kernel takes it, and keeps what CPU's flash kernel keeps."""
    q, _, _ = _qkv()
    k, v = (torch.randn(B, HEADS, T, D, requires_grad=True) for _ in range(2))
    with cuda_grouped_query_sdpa():
        _, kept = _kept(q, k, v, is_causal=True, enable_gqa=True)
    assert not _scores(kept)


def test_under_autocast_a_grouped_call_is_16_bit_and_goes_to_flash_unless_masked() -> None:
    """CUDA's autocast casts SDPA's inputs to 16 bits (RoPE over an fp32 residual stream
    leaves q and k in fp32): flash takes it. With a mask it goes to the math kernel, in bf16."""
    q, k, v = _qkv()
    with cuda_grouped_query_sdpa():
        _, kept = _kept(q, k, v, autocast=True, is_causal=True, enable_gqa=True)
        assert not _scores(kept)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        _, masked = _kept(q, k, v, autocast=True, attn_mask=mask, enable_gqa=True)
    assert _scores(masked) == {torch.bfloat16}
    _, cpu_masked = _kept(q, k, v, autocast=True, attn_mask=mask, enable_gqa=True)
    assert not _scores(cpu_masked)  # CPU's flash kernel takes the mask


def test_the_function_is_restored() -> None:
    before = F.scaled_dot_product_attention
    with cuda_grouped_query_sdpa():
        assert F.scaled_dot_product_attention is not before
    assert F.scaled_dot_product_attention is before
