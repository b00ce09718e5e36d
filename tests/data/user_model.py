"""User model factories for ``--model FILE.py:factory`` tests (loaded by path and by module name).

Each factory is a small, self-contained case: a working language model, and the ways a user's
factory goes wrong (not a module, raising, an ``advisor_blocks`` that names no ModuleList).
``no_blocks`` has no ModuleList of blocks: it trains without the knobs that need them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mix = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mix(self.norm(x))


class TinyLM(nn.Module):
    """Per-token MLP stack: enough for a loss and gradients, nothing to learn about attention."""

    def __init__(self, vocab_size: int, dim: int, n_layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(n_layers))
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def tiny_lm(vocab_size: int = 64, dim: int = 16, n_layers: int = 2) -> nn.Module:
    return TinyLM(vocab_size, dim, n_layers)


@dataclass
class Output:
    logits: torch.Tensor
    aux: float = 0.0


class LogitsOutputLM(TinyLM):
    """Returns an output object with a ``.logits`` attribute, as Hugging Face models do."""

    def forward(self, input_ids: torch.Tensor) -> Output:  # type: ignore[override]
        return Output(logits=super().forward(input_ids))


def logits_output_lm() -> nn.Module:
    return LogitsOutputLM(64, 16, 2)


class NamedBlocksLM(TinyLM):
    """Two ModuleLists; ``advisor_blocks`` points at the smaller one."""

    advisor_blocks = "adapters"

    def __init__(self) -> None:
        super().__init__(64, 16, 2)
        self.adapters = nn.ModuleList(nn.Linear(16, 16, bias=False) for _ in range(3))


def named_blocks_lm() -> nn.Module:
    return NamedBlocksLM()


def not_a_module() -> dict[str, int]:
    return {"vocab_size": 64}


def raises() -> nn.Module:
    raise RuntimeError("out of coffee")


class WrongBlocksLM(TinyLM):
    """``advisor_blocks`` names the output head, not a list of layers."""

    advisor_blocks = "head"

    def __init__(self) -> None:
        super().__init__(64, 16, 2)


def wrong_named_blocks() -> nn.Module:
    return WrongBlocksLM()


def no_blocks() -> nn.Module:
    return nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 64))


NOT_CALLABLE = 3
