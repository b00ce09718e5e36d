"""The GPT block's LayerNorms keep their input in its own dtype (issue 13, item 2).

Pre-LN: a norm's output only feeds projections, so under autocast it is returned in the
autocast dtype (the cast each projection would make), and its backward keeps the input as it
came: bf16 on an FSDP rank with bf16 parameters, where ``F.layer_norm`` under CUDA's autocast
keeps an fp32 upcast (CPU's autocast does not upcast it: the CPU test checks the accounting the
profiler's CPU traces rely on, the GPU test that CUDA now keeps the same). Values are
``nn.LayerNorm``'s, bit for bit in fp32.
"""

from __future__ import annotations

import pytest
import torch

from advisor.models.common import InputLayerNorm
from advisor.models.gpt import Block, GPTConfig
from tests.advisor.saved_tensors import saved_activations

H, HEADS, T, B = 64, 4, 16, 2


@pytest.mark.parametrize("bias", [True, False])
def test_values_and_gradients_are_layer_norms_bit_for_bit_in_fp32(bias: bool) -> None:
    torch.manual_seed(0)
    ours, ref = InputLayerNorm(H, bias=bias), torch.nn.LayerNorm(H, bias=bias)
    with torch.no_grad():
        for p, q in zip(ours.parameters(), ref.parameters(), strict=True):
            p.normal_()
            q.copy_(p)
    x = torch.randn(B, T, H, requires_grad=True)
    y, y_ref = ours(x), ref(x)
    assert torch.equal(y, y_ref)
    grad = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, *ours.parameters()], grad)
    want = torch.autograd.grad(y_ref, [x, *ref.parameters()], grad)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, low_ref = ours(x), ref(x)
    assert low.dtype == torch.bfloat16 and torch.equal(low, low_ref.to(torch.bfloat16))


def test_gradients_are_exact_in_fp64() -> None:
    norm = InputLayerNorm(8).double()
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(norm, (x,))


def test_a_bf16_block_keeps_no_fp32_copy_of_its_residual_stream() -> None:
    check_bf16_block("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_a_bf16_block_keeps_no_fp32_copy_of_its_residual_stream() -> None:
    """Where F.layer_norm under CUDA's autocast would keep an fp32 upcast of each norm input."""
    check_bf16_block("cuda")


def check_bf16_block(device: str) -> None:
    """An FSDP rank's block: bf16 parameters and input under autocast."""
    config = GPTConfig(n_layer=1, n_head=HEADS, n_embd=H, block_size=T)
    block = Block(config).to(device, torch.bfloat16)
    x = torch.randn(B, T, H, dtype=torch.bfloat16, device=device, requires_grad=True)
    kept = saved_activations(block, x)
    full_width = [t for t in kept if t.numel() == B * T * H]
    assert full_width and all(t.dtype == torch.bfloat16 for t in full_width), [
        (t.dtype, tuple(t.shape)) for t in full_width
    ]
    # Per token, at 2 bytes: the 2 norm inputs, the attention input (the first norm's output),
    # q, k, v, SDPA's output (the output projection reads a view of it), the MLP input, GELU's
    # input and output (4H each): the textbook 32 H bytes (benchmarks/activation_bytes.py);
    # beyond it only the norms' mean and rstd and SDPA's log-sum-exp.
    per_token = sum(t.untyped_storage().nbytes() for t in kept) / (B * T)
    textbook = 2 * (2 * H + H + 3 * H + H + H + 2 * 4 * H)
    assert textbook <= per_token <= textbook * 1.03, (per_token, textbook)
