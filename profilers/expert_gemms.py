"""The grouped GEMMs of a mixture-of-experts step, shape by shape, for a what-if to price.

Hugging Face transformers runs each MoE layer's experts as one ``torch._grouped_mm`` per
projection (``integrations/moe.py: grouped_mm_experts_forward``): the S = tokens × top-k routed
rows, sorted by expert, times the stacked weights of all E experts, ``(S, K) @ (E, K, N)``. The
FLOP count sees those FLOPs (:func:`profilers.fake_kernels.grouped_mm_flops`) but not their
shapes, and a roofline needs the shapes: each expert multiplies only ~S/E rows (a fine-grained
MoE — 128 experts, top-8 — gives a few hundred rows per expert at a 4k-token micro-batch), and
every call reads all E experts' weights, so a layer's expert GEMMs can be bound by the weights'
bytes, not by their FLOPs. Priced as one dense FFN of the block's width (what the what-if did
until 2026-12-05), they ran at a large GEMM's efficiency with one expert's weights.

:func:`count_expert_gemms` runs one forward+backward under ``FakeTensorMode`` (no allocation)
and records every forward call of the op whose second operand is the stacked experts (2-D × 3-D):
experts E, reduction K, output width N, routed rows per training token (S / tokens, the top-k
of the router) and how many such calls one step makes (one per MoE layer). Backward's calls are
the forward's gradients (a what-if derives them) and are not recorded. For a deep model the
calls are counted on two shallow copies and extended in depth (:func:`profilers.memory_blocks.
counted_in_depth`). A model without the op records nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from profilers.fake_kernels import run_fake_step
from profilers.memory_blocks import counted_in_depth
from profilers.workload import StepSpec, Workload

# One entry of the record (profile.json ``flops.expert_gemms``), per distinct forward shape.
FIELDS: tuple[str, ...] = ("experts", "k", "n", "rows_per_token", "calls")

Shape = tuple[int, int, int, int]  # experts, K, N, routed rows of the counted micro-batch


def count_expert_gemms(workload: Workload, spec: StepSpec) -> list[dict[str, float]]:
    """The forward grouped GEMMs of ``workload``'s step at ``spec`` (one device, fp32, no
    checkpointing: the shapes do not depend on them), one dict of :data:`FIELDS` per distinct
    shape, sorted; empty for a model without grouped GEMMs. Raises what the fake trace raises."""
    base = dataclasses.replace(
        spec,
        precision="fp32",
        grad_accum_steps=1,
        parallelism="single",
        world_size=1,
        activation_checkpointing="none",
    )
    calls = counted_in_depth(workload, lambda w: _count(w, base))
    tokens = base.micro_batch_size * base.seq_len
    return [
        {
            "experts": float(experts),
            "k": float(k),
            "n": float(n),
            "rows_per_token": rows / tokens,
            "calls": float(count),
        }
        for (experts, k, n, rows), count in sorted(calls.items())
        if count > 0
    ]


def _count(workload: Workload, spec: StepSpec) -> dict[Shape, int]:
    recorder = _recorder_class()()
    run_fake_step(workload, spec, recorder)
    return dict(recorder.calls)


_RECORDER: list[type] = []


def _recorder_class() -> type:
    """The dispatch mode's class, built once (torch is imported where it is used)."""
    if _RECORDER:
        return _RECORDER[0]
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class ExpertGemmRecorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: dict[Shape, int] = {}

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):  # type: ignore[no-untyped-def]
            op = getattr(torch.ops.aten, "_grouped_mm", None)
            if (
                op is not None
                and func is op.default
                and torch._C._current_graph_task_id() == -1  # forward, not the autograd engine
                and args[0].dim() == 2
                and args[1].dim() == 3
            ):
                rows, k = args[0].shape
                experts, _, n = args[1].shape
                key = (int(experts), int(k), int(n), int(rows))
                self.calls[key] = self.calls.get(key, 0) + 1
            return func(*args, **(kwargs or {}))

    _RECORDER.append(ExpertGemmRecorder)
    return ExpertGemmRecorder
