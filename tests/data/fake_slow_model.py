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


# How many steps each LoopOnFake forward on fake tensors has run, in order (a test reads it).
PROGRESS: list[int] = []


class LoopOnFake(nn.Module):
    """One module whose forward is a Python loop of torch calls and no submodule (as Jamba's
    Mamba scan loops over positions): on fake tensors each step first sleeps ``delay_s``."""

    def __init__(self, dim: int, steps: int, delay_s: float) -> None:
        super().__init__()
        self.decay = nn.Parameter(torch.full((dim,), 0.5))
        self.steps, self.delay_s = steps, delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fake = isinstance(x, FakeTensor)
        if fake:
            PROGRESS.append(0)
        h = x[:, 0]
        for i in range(self.steps):
            if fake:
                time.sleep(self.delay_s)
                PROGRESS[-1] = i + 1
            h = h * self.decay + x[:, i % x.shape[1]]
        return x + h.unsqueeze(1)


class FakeSlowLM(nn.Module):
    def __init__(
        self, vocab_size: int, dim: int, n_layer: int, delay_s: float, loop_steps: int
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, dim)
        self.layers = (
            nn.Sequential(LoopOnFake(dim, loop_steps, delay_s))
            if loop_steps
            else nn.Sequential(*(SlowOnFake(dim, delay_s) for _ in range(n_layer)))
        )
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.embed(input_ids)))


def factory(
    vocab_size: int = 64,
    dim: int = 16,
    n_layer: int = 8,
    delay_s: float = 0.5,
    loop_steps: int = 0,
) -> nn.Module:
    """``loop_steps`` > 0: one :class:`LoopOnFake` layer of that many steps instead."""
    return FakeSlowLM(vocab_size, dim, n_layer, delay_s, loop_steps)
