"""Learning-rate schedule: linear warm-up, then cosine decay to ``min_lr`` (Loshchilov & Hutter
2017, "SGDR"; the warm-up+cosine recipe of GPT-3 and nanoGPT)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class WarmupCosine:
    """lr at optimizer step ``s`` (0-based) as a factor of the base lr, for ``LambdaLR``.

    A dataclass rather than a closure so ``LambdaLR.state_dict`` can save and restore it.
    """

    lr: float
    min_lr: float
    warmup_steps: int
    total_steps: int

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (self.lr - self.min_lr)

    def __call__(self, step: int) -> float:
        return self.lr_at(step) / self.lr
