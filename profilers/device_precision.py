"""Precision checks: can the device train in each autocast precision, and how fast against fp32.

One pre-LN Transformer block runs an autocast forward+backward per precision: a tiny one to see
that it runs at all (:func:`try_autocast_step`), a step-sized one timed against fp32
(:func:`precision_benchmarks`), with :mod:`profilers.device_bench`'s timing discipline.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from profilers.device_bench import SKIPPED, device_sync, time_call
from profilers.device_records import PrecisionCheck
from profilers.workload import PRECISIONS

if TYPE_CHECKING:
    import torch


def _probe_block(d: int, heads: int) -> torch.nn.Module:
    """One pre-LN Transformer block (attention via SDPA, 4x GELU MLP): the work a step does."""
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = (
                z.view(b, t, heads, d // heads).transpose(1, 2)
                for z in self.qkv(self.ln1(x)).split(d, dim=2)
            )
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    return Block()


_AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}


def _autocast_step(block: torch.nn.Module, x: torch.Tensor, precision: str) -> None:
    import torch

    dtype = getattr(torch, _AUTOCAST.get(precision, "bfloat16"))
    block.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=dtype, enabled=precision in _AUTOCAST):
        loss = block(x).float().square().mean()
    loss.backward()


def try_autocast_step(dev: torch.device, precision: str) -> str | None:
    import torch

    try:
        block = _probe_block(16, 2).to(dev)
        _autocast_step(block, torch.randn(1, 8, 16, device=dev), precision)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    except Exception as exc:
        return (
            f"an autocast {precision} forward+backward failed on {dev}: "
            f"{type(exc).__name__}: {exc}; use --precision fp32"
        )
    return None


def precision_benchmarks(
    dev: torch.device, budget_s: float, reasons: Mapping[str, str | None]
) -> dict[str, PrecisionCheck]:
    """Time one block's forward+backward per supported precision, interleaved round-robin
    (a neighbour's load then hits every precision alike) until the budget is spent."""
    import torch

    batch, seq, d, heads = (8, 1024, 1024, 16) if dev.type == "cuda" else (2, 128, 256, 4)
    ok = [p for p in PRECISIONS if reasons.get(p) is None]
    out = {p: PrecisionCheck(precision=p, reason=r) for p, r in reasons.items() if r is not None}
    deadline, sync = time.perf_counter() + budget_s, device_sync(dev)
    samples: dict[str, list[float]] = {p: [] for p in ok}
    warmups: dict[str, float] = {}
    try:
        block = _probe_block(d, heads).to(dev)
        x = torch.randn(batch, seq, d, device=dev)
        steps = {p: functools.partial(_autocast_step, block, x, p) for p in ok}
        for p in ok:
            if time.perf_counter() >= deadline:
                break
            warmups[p] = time_call(steps[p], sync)
        # One timed round whatever the deadline: a first call carries one-time work (on an
        # H200, bf16's first forward+backward took 1.33 s against 35 ms for fp32's, the
        # kernels' set-up), so a warm-up alone says nothing of a precision's speed. A timed
        # call costs at most about its warm-up, already spent.
        for p in warmups:
            samples[p].append(time_call(steps[p], sync))
        progressed = True
        while progressed:
            progressed = False
            for p in warmups:
                expected = statistics.median(samples[p])
                if len(samples[p]) < 7 and time.perf_counter() + expected <= deadline:
                    samples[p].append(time_call(steps[p], sync))
                    progressed = True
    except Exception as exc:  # e.g. OOM at the probe size: support is known, speed is not
        error = f"{type(exc).__name__}: {exc}"
        out.update({p: PrecisionCheck(precision=p, tokens=batch * seq, error=error) for p in ok})
        return {p: out[p] for p in PRECISIONS if p in out}
    # Timed samples only: a warm-up's time is no speed (above).
    medians = {p: statistics.median(s) for p, s in samples.items() if s}
    for p in ok:
        median = medians.get(p)
        fp32 = medians.get("fp32")
        out[p] = PrecisionCheck(
            precision=p,
            tokens=batch * seq,
            samples_s=tuple(samples[p]) or ((warmups[p],) if p in warmups else ()),
            warmup_only=p in warmups and not samples[p],
            speedup_vs_fp32=fp32 / median if fp32 and median else None,
            error=None if p in warmups else SKIPPED,
        )
    return {p: out[p] for p in PRECISIONS if p in out}
