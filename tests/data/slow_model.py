"""A tiny GPT whose forward sleeps a little, so a test can signal a run in the middle of it."""

from __future__ import annotations

import time

import torch

from advisor.models.gpt import GPT, GPTConfig


class SlowGPT(GPT):
    def __init__(self, cfg: GPTConfig, delay_s: float) -> None:
        super().__init__(cfg)
        self.delay_s = delay_s

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        return super().forward(input_ids)


def factory(delay_s: float = 0.03, n_layer: int = 1, n_embd: int = 32) -> torch.nn.Module:
    return SlowGPT(
        GPTConfig(vocab_size=256, n_layer=n_layer, n_head=4, n_embd=n_embd, block_size=64), delay_s
    )
