"""A small language model with a frozen parameter (``--model FILE.py:factory``): a fixed
positional table kept as ``nn.Parameter(requires_grad=False)``, as some models keep theirs
(ERNIE-4.5-MoE keeps its expert-score correction bias that way)."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class FrozenTableLM(nn.Module):
    def __init__(self, vocab_size: int, dim: int, n_layer: int, max_seq_len: int) -> None:
        super().__init__()
        self.vocab_size, self.max_seq_len = vocab_size, max_seq_len
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Parameter(torch.randn(max_seq_len, dim) * 0.02, requires_grad=False)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(n_layer))
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) + self.pos[: input_ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def factory(
    vocab_size: int = 256, dim: int = 32, n_layer: int = 2, max_seq_len: int = 128
) -> nn.Module:
    return FrozenTableLM(vocab_size, dim, n_layer, max_seq_len)
