"""BERT-style encoder with a masked-LM head (post-LayerNorm, as in Devlin et al. 2018)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from advisor.errors import UsageProblem
from advisor.models.common import check_heads, check_length, check_sizes, init_parameters


@dataclass(kw_only=True)
class BertConfig:
    vocab_size: int = 30522
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    ffn_hidden: int = 3072
    max_position: int = 512
    dropout: float = 0.0
    layer_norm_eps: float = 1e-12
    # Token id used for [MASK]; None means the last id of the vocabulary.
    mask_token_id: int | None = None

    def __post_init__(self) -> None:
        check_sizes(self, "vocab_size", "n_layer", "n_head", "n_embd", "ffn_hidden", "max_position")
        mask = self.mask_token_id
        # An id outside the vocabulary fails only at the first step, as an embedding IndexError.
        if mask is not None and (
            isinstance(mask, bool) or not isinstance(mask, int) or not 0 <= mask < self.vocab_size
        ):
            raise UsageProblem(
                f"--model-arg mask_token_id={mask}: mask_token_id must be a token id from 0 to "
                f"{self.vocab_size - 1} (vocab_size - 1, the default)"
            )


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.attn_out = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.ln_attn = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(cfg.n_embd, cfg.ffn_hidden)
        self.ffn_out = nn.Linear(cfg.ffn_hidden, cfg.n_embd)
        self.ln_ffn = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=False, dropout_p=self.dropout if self.training else 0.0
        )
        x = self.ln_attn(x + self.drop(self.attn_out(y.transpose(1, 2).reshape(b, t, c))))
        return self.ln_ffn(x + self.drop(self.ffn_out(F.gelu(self.ffn_in(x)))))


class BertForMLM(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        check_heads(cfg.n_embd, cfg.n_head)
        self.config = cfg
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.position_embeddings = nn.Embedding(cfg.max_position, cfg.n_embd)
        self.ln_emb = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.n_layer))
        # MLM head: transform, then decoder tied to the word embeddings plus a bias.
        self.head_dense = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.head_ln = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_eps)
        self.decoder = nn.Linear(cfg.n_embd, cfg.vocab_size)
        self.tie_weights()
        if not self.word_embeddings.weight.is_meta:
            self.init_weights()

    def tie_weights(self) -> None:
        self.decoder.weight = self.word_embeddings.weight

    def get_output_embeddings(self) -> nn.Linear:
        """The output head, the last op of forward (Hugging Face's name: chunked losses use it)."""
        return self.decoder

    def init_weights(self) -> None:
        init_parameters(self, lambda _name, p: nn.init.trunc_normal_(p, std=0.02))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        check_length(t, self.config.max_position, "max_position")
        pos = torch.arange(t, device=input_ids.device)
        x = self.drop(self.ln_emb(self.word_embeddings(input_ids) + self.position_embeddings(pos)))
        for block in self.blocks:
            x = block(x)
        return self.decoder(self.head_ln(F.gelu(self.head_dense(x))))
