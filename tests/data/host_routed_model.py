"""A small mixture-of-experts language model that routes on the host (``--model
FILE.py:factory``): each layer counts its tokens per expert with ``.tolist()`` and splits
them by those counts, as transformers' JetMoE and many hand-written MoE layers do. A fake
tensor has no values to count, so no fake trace can run its step."""

from __future__ import annotations

import torch
from torch import nn


class HostRoutedMoE(nn.Module):
    def __init__(self, dim: int, num_experts: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
            for _ in range(num_experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = self.norm(x).reshape(-1, x.shape[-1])
        weight, chosen = self.router(flat).softmax(-1).max(-1)
        order = chosen.argsort()
        counts = torch.bincount(chosen, minlength=len(self.experts)).tolist()  # on the host
        parts = torch.split(flat[order], counts)
        out = torch.cat([expert(part) for expert, part in zip(self.experts, parts, strict=True)])
        routed = torch.empty_like(out).index_copy(0, order, out) * weight.unsqueeze(-1)
        return x + routed.reshape(x.shape)


class HostRoutedLM(nn.Module):
    def __init__(self, vocab_size: int, dim: int, n_layer: int, num_experts: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, dim)
        self.blocks = nn.ModuleList(HostRoutedMoE(dim, num_experts) for _ in range(n_layer))
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def factory(
    vocab_size: int = 256, dim: int = 32, n_layer: int = 2, num_experts: int = 4
) -> nn.Module:
    return HostRoutedLM(vocab_size, dim, n_layer, num_experts)
