"""Models whose layers are not in an ``nn.ModuleList`` (``--model FILE.py:factory`` tests).

``factory``: the whole language model as one ``nn.Sequential`` (embedding, causal Transformer
layers, norm, head); ``nested``: the layers in an ``nn.Sequential`` inside an
``nn.ModuleDict``; ``shared_hybrid``: an ``nn.ModuleList`` of two kinds of layer in turn whose
attention layers all call one shared layer (as Zamba2's hybrid layers do), one kind holding a
small list of its own. All train; none has a stack of blocks the advisor can recompute or wrap
one by one. ``hybrid`` (two kinds of layer in turn, nothing shared: Jamba's attention and Mamba
layers) has one since 2026-12-05.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CausalLayer(nn.Module):
    """Pre-norm causal self-attention and MLP (SDPA), as in GPT-2."""

    def __init__(self, dim: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


def factory(vocab_size: int = 256, dim: int = 32, n_head: int = 2, n_layer: int = 2) -> nn.Module:
    return nn.Sequential(
        nn.Embedding(vocab_size, dim),
        *(CausalLayer(dim, n_head) for _ in range(n_layer)),
        nn.LayerNorm(dim),
        nn.Linear(dim, vocab_size, bias=False),
    )


class NestedLM(nn.Module):
    def __init__(self, vocab_size: int, dim: int, n_head: int, n_layer: int) -> None:
        super().__init__()
        self.parts = nn.ModuleDict(
            {
                "embed": nn.Embedding(vocab_size, dim),
                "body": nn.Sequential(*(CausalLayer(dim, n_head) for _ in range(n_layer))),
                "head": nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, vocab_size)),
            }
        )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.parts["body"](self.parts["embed"](input_ids))
        return self.parts["head"](x)


def nested(vocab_size: int = 256, dim: int = 32, n_head: int = 2, n_layer: int = 2) -> nn.Module:
    return NestedLM(vocab_size, dim, n_head, n_layer)


class GatedMixer(nn.Module):
    """A second kind of layer (a stand-in for a Mamba layer): a gated MLP whose gates are a
    one-item ModuleList, as Zamba2's shared layers keep their adapters."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mix = nn.Linear(dim, dim)
        self.gates = nn.ModuleList([nn.Linear(dim, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.mix(h) * torch.sigmoid(self.gates[0](h))


class HybridLM(nn.Module):
    def __init__(self, vocab_size: int, dim: int, n_head: int, n_layer: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(
            CausalLayer(dim, n_head) if i % 2 else GatedMixer(dim) for i in range(n_layer)
        )
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def hybrid(vocab_size: int = 256, dim: int = 32, n_head: int = 2, n_layer: int = 4) -> nn.Module:
    return HybridLM(vocab_size, dim, n_head, n_layer)


class SharedCall(nn.Module):
    """A layer that runs a layer shared with others through an adapter of its own (Zamba2's
    hybrid layers and their shared transformer block)."""

    def __init__(self, shared: nn.Module, dim: int) -> None:
        super().__init__()
        self.shared = shared
        self.adapter = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(x + self.adapter(x))


class SharedHybridLM(HybridLM):
    def __init__(self, vocab_size: int, dim: int, n_head: int, n_layer: int) -> None:
        super().__init__(vocab_size, dim, n_head, 0)
        shared = CausalLayer(dim, n_head)
        self.layers = nn.ModuleList(
            SharedCall(shared, dim) if i % 2 else GatedMixer(dim) for i in range(n_layer)
        )


def shared_hybrid(
    vocab_size: int = 256, dim: int = 32, n_head: int = 2, n_layer: int = 4
) -> nn.Module:
    return SharedHybridLM(vocab_size, dim, n_head, n_layer)
