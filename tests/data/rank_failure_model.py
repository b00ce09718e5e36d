"""A user factory whose forward fails on one rank after a few calls (distributed failure tests)."""

from __future__ import annotations

import os

import torch
from torch import nn


class FailOnRank(nn.Module):
    def __init__(self, rank: int, calls: int, vocab_size: int = 256, hidden: int = 16) -> None:
        super().__init__()
        self.vocab_size, self.rank, self.calls, self.seen = vocab_size, rank, calls, 0
        self.embed = nn.Embedding(vocab_size, hidden)
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(2))
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.seen += 1
        if self.seen > self.calls and os.environ.get("RANK") == str(self.rank):
            raise RuntimeError(f"injected failure on rank {self.rank}")
        x = self.embed(input_ids)
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def factory(rank: int = 1, calls: int = 3) -> nn.Module:
    return FailOnRank(rank, calls)
