"""The ``gpt-small`` preset with a mixture of experts in place of every block's MLP, run the way
Hugging Face transformers runs its MoE layers (``integrations/moe.py: grouped_mm_experts_forward``):
a linear router, softmax top-k, the routed rows sorted by expert, one ``torch._grouped_mm`` per
projection over the stacked experts (the rows cast to the weights' dtype first, as transformers
does), the routing weights, the rows gathered back and summed over the top-k. Everything else
(attention, embeddings, ``--model-arg`` names) is the preset's; ``n_experts`` and ``top_k`` are
added. Each expert is the preset's MLP (GELU, 4 × width).

``--model benchmarks/models/moe_gpt.py:moe_gpt --model-arg n_experts=8 --model-arg top_k=2 ...``

What it is for: ``scripts/gpu_check.sh`` trains it, so ``benchmarks/whatif_measured.py`` holds
the what-if's pricing of expert GEMMs (at their recorded shapes: ``profilers/expert_gemms.py``)
against a GPU, and the run checks that bf16 autocast reaches the experts' grouped GEMMs
(``advisor/trainer/autocast_ops.py``) without transformers on the GPU image.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from advisor.models.gpt import GPT, GPTConfig


class MoE(nn.Module):
    def __init__(self, cfg: GPTConfig, n_experts: int, top_k: int) -> None:
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k={top_k} must be between 1 and n_experts={n_experts}")
        h, f = cfg.n_embd, 4 * cfg.n_embd
        self.n_experts, self.top_k = n_experts, top_k
        self.router = nn.Linear(h, n_experts, bias=False)
        # (experts, out, in), as transformers stores them; the GEMMs take the transpose
        self.up = nn.Parameter(torch.empty(n_experts, f, h))
        self.down = nn.Parameter(torch.empty(n_experts, h, f))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        flat = x.reshape(b * t, h)
        probs = F.softmax(self.router(flat), dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        experts = chosen.reshape(-1)
        order = torch.argsort(experts, stable=True)
        rows = flat[order // self.top_k]
        per_expert = torch.histc(
            experts.float(), bins=self.n_experts, min=0, max=self.n_experts - 1
        )
        offsets = torch.cumsum(per_expert, dim=0).to(torch.int32)
        up = torch._grouped_mm(rows.to(self.up.dtype), self.up.transpose(-2, -1), offs=offsets)
        act = F.gelu(up, approximate="tanh")
        down = torch._grouped_mm(act.to(self.down.dtype), self.down.transpose(-2, -1), offs=offsets)
        weighted = down * weights.reshape(-1)[order].unsqueeze(-1).to(down.dtype)
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        out = weighted[back].view(b * t, self.top_k, h).sum(dim=1)
        return out.view(b, t, h).to(x.dtype)


def moe_gpt(n_experts: int = 8, top_k: int = 2, **kwargs: object) -> GPT:
    """``GPT(GPTConfig(**kwargs))`` with every block's MLP a mixture of ``n_experts`` experts,
    ``top_k`` per token."""
    cfg = GPTConfig(**kwargs)  # type: ignore[arg-type]
    model = GPT(cfg)
    for block in model.blocks:
        block.mlp = MoE(cfg, n_experts, top_k)
    if not model.wte.weight.is_meta:
        model.init_weights()
        residual = 0.02 / math.sqrt(2 * cfg.n_layer)
        for block in model.blocks:
            moe = block.mlp
            assert isinstance(moe, MoE)
            nn.init.normal_(moe.up, std=0.02)
            nn.init.normal_(moe.down, std=residual)
            nn.init.normal_(moe.router.weight, std=0.02)
    return model
