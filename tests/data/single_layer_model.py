"""A one-layer language model with no container of layers (``--model FILE.py:factory``)."""

from __future__ import annotations

import torch
from torch import nn


class OneLayerLM(nn.Module):
    def __init__(self, vocab_size: int, dim: int, n_head: int, max_seq_len: int) -> None:
        super().__init__()
        self.vocab_size, self.max_seq_len = vocab_size, max_seq_len
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(max_seq_len, dim)
        self.layer = nn.TransformerEncoderLayer(
            dim, n_head, dim_feedforward=4 * dim, dropout=0.0, batch_first=True, norm_first=True
        )
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        x = self.embed(input_ids) + self.pos(torch.arange(t, device=input_ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=input_ids.device)
        return self.head(self.layer(x, src_mask=mask, is_causal=True))


def factory(
    vocab_size: int = 256, dim: int = 32, n_head: int = 2, max_seq_len: int = 128
) -> nn.Module:
    return OneLayerLM(vocab_size, dim, n_head, max_seq_len)
