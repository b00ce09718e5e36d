"""A user factory whose logits turn NaN after a few forward passes (divergence tests)."""

from __future__ import annotations

import torch
from torch import nn


class NanAfter(nn.Module):
    def __init__(self, calls: int, vocab_size: int = 256, hidden: int = 16) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.calls, self.seen = calls, 0
        self.embed = nn.Embedding(vocab_size, hidden)
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(2))
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        x = self.embed(input_ids)
        for block in self.blocks:
            x = torch.relu(block(x))
        logits = self.head(x)
        return logits * float("nan") if self.seen > self.calls else logits


def factory(calls: int = 3) -> nn.Module:
    return NanAfter(calls)
