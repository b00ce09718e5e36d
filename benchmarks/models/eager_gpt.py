"""The ``gpt-small`` preset with its attention written out by hand, as nanoGPT's fallback path
and many users' own models do: ``softmax(q·kᵀ/√d, causal mask) · v`` in plain ops, no
``F.scaled_dot_product_attention``. Everything else (weights, init, shapes, ``--model-arg``
names) is the preset's.

``--model benchmarks/models/eager_gpt.py:eager_gpt --model-arg n_layer=12 ...``

What it is for: ``scripts/gpu_check.sh`` trains it beside the preset at the same shape, so
``benchmarks/whatif_measured.py`` holds the what-if's pricing of eager attention (the counted
traffic over the T×T scores, ``profilers/eager_attention.py``) against a GPU, and the measured
eager/SDPA step ratio against the predicted one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from advisor.models.gpt import GPT, CausalSelfAttention, GPTConfig


class EagerCausalSelfAttention(CausalSelfAttention):
    causal: torch.Tensor

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__(cfg)
        mask = torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool).tril()
        self.register_buffer(
            "causal", mask.view(1, 1, cfg.block_size, cfg.block_size), persistent=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        scores = scores.masked_fill(~self.causal[:, :, :t, :t], float("-inf"))
        probs = F.softmax(scores, dim=-1)  # fp32 under autocast (softmax is on its fp32 list)
        y = probs @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, c)))


def eager_gpt(**kwargs: object) -> GPT:
    """``GPT(GPTConfig(**kwargs))`` with every block's attention eager (same parameters)."""
    cfg = GPTConfig(**kwargs)  # type: ignore[arg-type]
    model = GPT(cfg)
    for block in model.blocks:
        block.attn = EagerCausalSelfAttention(cfg)
    if not model.wte.weight.is_meta:
        model.init_weights()
    return model
