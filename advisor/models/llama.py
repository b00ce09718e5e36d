"""Llama-style decoder: RMSNorm, SwiGLU MLP, rotary position embeddings, grouped-query attention."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from advisor.models.common import (
    check_length,
    check_sizes,
    compute_dtype,
    init_parameters,
    norm_output_dtype,
)


@dataclass(kw_only=True)
class LlamaConfig:
    vocab_size: int = 128256
    n_layer: int = 16
    n_head: int = 32
    n_kv_head: int = 8
    n_embd: int = 2048
    ffn_hidden: int = 8192
    max_seq_len: int = 8192
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    tie_weights: bool = True

    def __post_init__(self) -> None:
        check_sizes(
            self,
            "vocab_size",
            "n_layer",
            "n_head",
            "n_kv_head",
            "n_embd",
            "ffn_hidden",
            "max_seq_len",
        )


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm that keeps only its input (in the input's own dtype) and the inverse RMS.

    Computed in fp32 (fp64 for fp64) whatever the input's dtype, as Meta's and torchtitan's
    RMSNorm. Under autocast the output comes in the autocast dtype, so the projections that
    read it share ONE low-precision copy instead of each casting an fp32 output again; a bf16
    input (an FSDP rank with bf16 parameters) is kept as bf16, not as an fp32 upcast.
    ``F.rms_norm`` under autocast keeps an fp32 input and an fp32 normalised copy for its
    backward (benchmarks/activation_bytes.py). Forward values equal ``F.rms_norm``'s.
    """

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype
    ) -> torch.Tensor:
        xf = x.to(compute_dtype(x))
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd * weight.to(xf.dtype)).to(out_dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        x, weight, rstd = ctx.saved_tensors
        normed = x.to(rstd.dtype) * rstd
        grad = grad.to(rstd.dtype)
        grad_weight = (grad * normed).sum(dim=tuple(range(grad.dim() - 1)))
        scaled = grad * weight.to(rstd.dtype)
        grad_x = rstd * (scaled - normed * (scaled * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None, None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _RMSNormFunction.apply(x, self.weight, self.eps, norm_output_dtype(x))
        return out


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> torch.Tensor:
    """cos/sin tables, shape (max_seq_len, head_dim) with cos in the first half (RoFormer §3.4),
    on the default device. Computed on the CPU: on ``meta`` (a meta build) ``arange`` runs
    through torch's Python references, whose first call imports torch._dynamo (~4 s)."""
    f32, cpu = torch.float32, torch.device("cpu")
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=f32, device=cpu) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=f32, device=cpu), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.get_default_device())


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x1, x2) = halves of the head dimension; x: (b, t, heads, head_dim).

    Applied before the heads are transposed (as torchtitan does): the rotated q then keeps the
    (b, t, heads, head_dim) layout through SDPA, whose output the output projection reads as a
    view instead of a copy (a copy on CPU when q was made contiguous in (b, heads, t, ...)).
    """
    half = x.shape[-1] // 2
    table = table[: x.shape[1], None, :].to(x.dtype)  # (t, 1, head_dim): broadcast over heads
    cos, sin = table[..., :half], table[..., half:]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head = cfg.n_head, cfg.n_kv_head
        self.head_dim = cfg.n_embd // cfg.n_head
        self.wq = nn.Linear(cfg.n_embd, cfg.n_head * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.n_embd, cfg.n_kv_head * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.n_embd, cfg.n_kv_head * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_head * self.head_dim, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = apply_rope(self.wq(x).view(b, t, self.n_head, self.head_dim), rope).transpose(1, 2)
        k = apply_rope(self.wk(x).view(b, t, self.n_kv_head, self.head_dim), rope).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)
        grouped = self.n_kv_head != self.n_head  # grouped-query attention: k/v heads shared
        if grouped and q.dtype not in (torch.float16, torch.bfloat16):
            # fp32: SDPA's enable_gqa runs only in the flash and math kernels on CUDA (not
            # memory-efficient attention, fp32's kernel), so k/v are repeated to every head.
            k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
            grouped = False
        # 16-bit: the kernel reads each k/v head for its group; no repeated copies are kept.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=False)
        self.w3 = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # SwiGLU (Shazeer 2020)


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        if cfg.n_embd % cfg.n_head or cfg.n_head % cfg.n_kv_head:
            raise ValueError(
                f"n_embd ({cfg.n_embd}) must be divisible by n_head ({cfg.n_head}) and n_head by "
                f"n_kv_head ({cfg.n_kv_head}): fix the --model-arg values"
            )
        if (cfg.n_embd // cfg.n_head) % 2:
            # RoPE rotates pairs: the two halves of each head (apply_rope).
            raise ValueError(
                f"the head dimension n_embd / n_head ({cfg.n_embd} / {cfg.n_head}) must be even "
                "for rotary embeddings: fix the --model-arg values"
            )
        self.config = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.output = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        # Recomputed by init_weights (a meta-built model has none); not saved in checkpoints.
        self.register_buffer(
            "rope",
            rope_tables(cfg.n_embd // cfg.n_head, cfg.max_seq_len, cfg.rope_theta),
            persistent=False,
        )
        self.tie_weights()
        if not self.tok_embeddings.weight.is_meta:
            self.init_weights()

    def tie_weights(self) -> None:
        if self.config.tie_weights:
            self.output.weight = self.tok_embeddings.weight

    def get_output_embeddings(self) -> nn.Linear:
        """The output head, the last op of forward (Hugging Face's name: chunked losses use it)."""
        return self.output

    @torch.no_grad()
    def init_weights(self) -> None:
        cfg = self.config
        rope = self.get_buffer("rope")
        rope.copy_(rope_tables(cfg.n_embd // cfg.n_head, cfg.max_seq_len, cfg.rope_theta))
        residual = 0.02 / math.sqrt(2 * cfg.n_layer)

        def matrix(name: str, p: nn.Parameter) -> None:
            out_proj = name.endswith(("wo.weight", "w2.weight"))
            nn.init.normal_(p, mean=0.0, std=residual if out_proj else 0.02)

        init_parameters(self, matrix)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        check_length(input_ids.shape[1], self.config.max_seq_len, "max_seq_len")
        x = self.tok_embeddings(input_ids)
        for block in self.blocks:
            x = block(x, self.rope)
        return self.output(self.norm(x))
