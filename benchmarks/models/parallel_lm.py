"""A held-out model of the regret benchmark:
``--model benchmarks/models/parallel_lm.py:parallel_lm``.

A small decoder written as a user would write one, with none of the built-in presets' code: each
block runs attention and the MLP side by side from one LayerNorm (the GPT-J / PaLM "parallel"
block), learned positions, no biases, untied output head. Its shape was fixed before any run
and was never used to choose a constant or margin of the advisor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ParallelBlock(nn.Module):
    def __init__(self, dim: int, n_head: int, mlp_ratio: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.up = nn.Linear(dim, mlp_ratio * dim, bias=False)
        self.down = nn.Linear(mlp_ratio * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        b, t, c = h.shape
        q, k, v = self.qkv(h).view(b, t, 3, self.n_head, c // self.n_head).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        attn = attn.transpose(1, 2).reshape(b, t, c)
        return x + self.proj(attn) + self.down(F.gelu(self.up(h)))


class ParallelLM(nn.Module):
    """Causal LM: ``forward(input_ids) -> logits``; the blocks are ``self.blocks``."""

    def __init__(
        self, vocab_size: int, dim: int, n_layer: int, n_head: int, mlp_ratio: int, max_seq_len: int
    ) -> None:
        super().__init__()
        if dim % n_head:
            raise ValueError(f"dim {dim} is not a multiple of n_head {n_head}")
        self.vocab_size, self.dim, self.n_head, self.max_seq_len = (
            vocab_size,
            dim,
            n_head,
            max_seq_len,
        )
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(max_seq_len, dim)
        self.blocks = nn.ModuleList(ParallelBlock(dim, n_head, mlp_ratio) for _ in range(n_layer))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.embed(input_ids) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def parallel_lm(
    vocab_size: int = 256,
    dim: int = 192,
    n_layer: int = 3,
    n_head: int = 4,
    mlp_ratio: int = 3,
    max_seq_len: int = 512,
) -> nn.Module:
    """Byte-level by default (vocab 256), so ``advisor``'s default data trains it directly."""
    return ParallelLM(vocab_size, dim, n_layer, n_head, mlp_ratio, max_seq_len)
