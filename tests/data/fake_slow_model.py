"""A model whose layers are slow only on fake tensors (``--model FILE.py:factory``): each layer
sleeps when its input is a FakeTensor, so a test can hold a trace or count past a deadline while
real steps stay fast. Its layers are an ``nn.Sequential``: no repeated blocks to trace from
shallow copies, so every trace is of the whole model (as Jamba's and Zamba2's are)."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor


class SlowOnFake(nn.Module):
    def __init__(self, dim: int, delay_s: float) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.delay_s = delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, FakeTensor):
            time.sleep(self.delay_s)
        return x + torch.relu(self.linear(x))


class FakeSlowLM(nn.Module):
    def __init__(self, vocab_size: int, dim: int, n_layer: int, delay_s: float) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, dim)
        self.layers = nn.Sequential(*(SlowOnFake(dim, delay_s) for _ in range(n_layer)))
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.embed(input_ids)))


def factory(
    vocab_size: int = 64, dim: int = 16, n_layer: int = 8, delay_s: float = 0.5
) -> nn.Module:
    return FakeSlowLM(vocab_size, dim, n_layer, delay_s)
