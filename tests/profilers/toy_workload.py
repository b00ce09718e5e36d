"""A tiny, self-contained Workload for profiler tests that must not depend on advisor.

It follows the contract in profilers/workload.py (a small pre-LN GPT, AdamW, autocast,
GradScaler for fp16, non-reentrant checkpointing per block). Integration tests also run the
probes on advisor's real workload.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils.checkpoint import checkpoint

from profilers.workload import Batch, ModelFacts, StepSpec, StepStats

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class ToyGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, max_len: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(_Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight
        self.checkpointing = False

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointing else block(x)
        return self.head(self.ln_f(x))


class ToyStep:
    def __init__(
        self, workload: ToyWorkload, spec: StepSpec, device: torch.device, from_meta: bool
    ) -> None:
        self.spec, self.device, self.workload = spec, device, workload
        w = workload
        if from_meta:
            # Real meta tensors, built outside the caller's FakeTensorMode (the contract).
            with unset_fake_temporarily(), torch.device("meta"):
                model = ToyGPT(w.vocab, w.d, w.layers, w.heads, w.max_len)
            model.to_empty(device=device)
            model.head.weight = model.wte.weight
        else:
            model = ToyGPT(w.vocab, w.d, w.layers, w.heads, w.max_len).to(device)
        model.checkpointing = spec.activation_checkpointing == "full"
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, foreach=True)
        self.scaler = torch.amp.GradScaler(device.type, enabled=spec.precision == "fp16")

    def synthetic_batches(self, generator: torch.Generator | None = None) -> list[Batch]:
        shape = (self.spec.micro_batch_size, self.spec.seq_len)
        out = []
        for _ in range(self.spec.grad_accum_steps):
            ids = torch.randint(0, self.workload.vocab, shape, generator=generator)
            out.append(
                {"input_ids": ids.to(self.device), "labels": torch.roll(ids, -1, 1).to(self.device)}
            )
        return out

    def forward_backward(self, batches: Sequence[Batch]) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        dtype = _DTYPES.get(self.spec.precision)
        for batch in batches:
            with torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
                logits = self.model(batch["input_ids"])
                loss = F.cross_entropy(logits.float().flatten(0, 1), batch["labels"].flatten())
            loss = loss / len(batches)
            self.scaler.scale(loss).backward()
            total += loss.detach()
        return total

    def optimizer_step(self) -> StepStats:
        self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.spec.grad_clip or math.inf
        )
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return StepStats(grad_norm=norm)

    def step(self, batches: Sequence[Batch]) -> tuple[torch.Tensor, StepStats]:
        loss = self.forward_backward(batches)
        return loss, self.optimizer_step()


@dataclass(frozen=True)
class ToyWorkload:
    vocab: int = 256
    d: int = 64
    layers: int = 2
    heads: int = 4
    max_len: int = 128

    def facts(self) -> ModelFacts:
        m = ToyGPT(self.vocab, self.d, self.layers, self.heads, self.max_len)
        n = sum(p.numel() for p in m.parameters())
        return ModelFacts(
            name="toy",
            family="gpt",
            objective="causal_lm",
            num_params=n,
            num_trainable_params=n,
            num_embedding_params=m.wte.weight.numel() + m.wpe.weight.numel(),
            num_layers=self.layers,
            hidden_size=self.d,
            num_heads=self.heads,
            vocab_size=self.vocab,
            max_seq_len=self.max_len,
            block_class="_Block",
            ffn_hidden_size=4 * self.d,
            tied_embeddings=True,
        )

    def build_step(
        self, spec: StepSpec, device: str | torch.device, *, from_meta: bool = False
    ) -> ToyStep:
        return ToyStep(self, spec, torch.device(device), from_meta)
