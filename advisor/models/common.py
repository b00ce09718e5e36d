"""What the built-in model families share: their weight initialisation and length check."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


@torch.no_grad()
def init_parameters(module: nn.Module, matrix: Callable[[str, nn.Parameter], object]) -> None:
    """Initialise every parameter in registration order (so the same seed gives the same
    weights): matrices by ``matrix(name, p)``, biases to 0, norm scales to 1."""
    for name, p in module.named_parameters():
        if p.dim() >= 2:
            matrix(name, p)
        elif name.endswith("bias"):
            nn.init.zeros_(p)
        else:
            nn.init.ones_(p)


def check_length(length: int, limit: int, field: str) -> None:
    """A ValueError naming the fix when a batch's sequences are longer than the model allows
    (``field``: the config field that sets the limit)."""
    if length > limit:
        raise ValueError(
            f"sequence length {length} exceeds the model's {field} {limit}: use a shorter "
            f"--seq-len or --model-arg {field}={length}"
        )


def check_heads(n_embd: int, n_head: int) -> None:
    """A ValueError naming the fix when the attention heads do not split the width."""
    if n_embd % n_head:
        raise ValueError(
            f"n_embd ({n_embd}) must be divisible by n_head ({n_head}): fix the --model-arg values"
        )
