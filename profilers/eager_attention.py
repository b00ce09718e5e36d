"""Attention without a fused kernel: what it does to the T×T score matrices, counted.

A model whose attention is plain code — ``softmax(q @ kᵀ · scale + mask) @ v`` — instead of
``F.scaled_dot_product_attention`` materialises the scores of every head: B·H·T² elements per
layer, read and written by each element-wise op between the two matmuls (scaling, Gemma 2's
soft-capping ``tanh``, the mask, the softmax and its fp32 upcast, dropout) and again by their
backward. transformers builds Gemma 2 and gpt-oss this way (no SDPA path: soft-capping and
attention sinks), and so does any hand-written attention of a bring-your-own model. At long
sequences this traffic rivals the matmuls: a flash kernel keeps the scores in on-chip memory and
moves none of it. The what-if's roofline (:mod:`strategies.roofline`) priced such attention as a
flash kernel, so it was optimistic by up to the whole traffic.

:func:`count_score_traffic` runs one forward+backward of the workload's step under
``FakeTensorMode`` (no allocation) with a dispatch mode that counts, for every ATen op touching a
*score-shaped* tensor (T queries by T keys, or a few more keys: :func:`extra_keys`; at least
two heads' worth of elements), the bytes
it reads and writes — by the dtypes the step really runs, so bf16 autocast's upcasts are
counted as they happen — and the FLOPs of the batched matmuls that produce or consume scores
(Q·Kᵀ and P·V forward; their four gradients backward), split into forward and backward by
whether the autograd engine is running. Views move nothing and are left out; a broadcast
operand (the mask) counts its storage once, not its expanded size. Per training token, no
recompute: checkpointing replays the forward's part.

The count is for a GPU: the step is traced on fake CPU tensors, under CUDA's autocast policy
for the ops where CPU's differs and scores pass through them (a softmax without ``dtype`` runs
in fp32 on CUDA, in bf16 under CPU autocast: :func:`profilers.memory_tracing.
cuda_autocast_fp32_ops`). Limits: the HF eager paths have no device branch, so a GPU runs the
same ATen ops; a fused kernel a GPU would pick (none in eager mode) is not seen.
A ``[B, T, h]`` activation whose hidden size equals T is not taken for scores (fewer than two
heads' worth of elements).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from profilers.fake_kernels import run_fake_step
from profilers.memory_blocks import counted_in_depth
from profilers.workload import StepSpec, Workload

# What the count keeps, per token of one micro-batch (forward+backward, no recompute):
# profilers.flops.ScoreTraffic's fields.
FIELDS: tuple[str, ...] = (
    "forward_bytes",
    "backward_bytes",
    "forward_gemm_flops",
    "backward_gemm_flops",
)


def count_score_traffic(workload: Workload, spec: StepSpec) -> dict[str, float]:
    """The score traffic of ``workload``'s step at ``spec`` (its precision and sequence; one
    device, no checkpointing), per token; from shallow copies when the blocks allow it (each
    count is affine in the blocks), else the whole model. Raises what the fake trace raises."""
    base = dataclasses.replace(spec, grad_accum_steps=1, parallelism="single", world_size=1)
    base = dataclasses.replace(base, activation_checkpointing="none")
    counts = counted_in_depth(workload, lambda w: _count(w, base))
    tokens = base.micro_batch_size * base.seq_len
    return {k: max(counts.get(k, 0), 0) / tokens for k in FIELDS}


def _count(workload: Workload, spec: StepSpec) -> dict[str, int]:
    from profilers.memory_tracing import cuda_autocast_fp32_ops

    counter = score_counter(spec.micro_batch_size, spec.seq_len)
    # the what-if prices a GPU: a 16-bit step under CUDA's autocast lists (its softmax in fp32)
    run_fake_step(workload, spec, counter, cuda_autocast_fp32_ops())
    return dict(counter.counts)


def extra_keys(seq_len: int) -> int:
    """Key columns beyond T a score matrix may have: gpt-oss concatenates one attention-sink
    column per head before its softmax ([B, H, T, T+1]); a few learned memory tokens would add
    a few more. Up to T/16 (at least 1)."""
    return max(1, seq_len // 16)


def _nbytes(t: Any) -> int:
    """Bytes a kernel moves for ``t``: its elements, or its storage when smaller (an expanded
    operand reads its storage once)."""
    size = int(t.numel()) * int(t.element_size())
    try:
        return min(size, int(t.untyped_storage().nbytes()))
    except Exception:  # no storage to ask (a tensor subclass): its elements
        return size


_COUNTER: list[type] = []


def score_counter(batch: int, seq_len: int) -> Any:
    """A dispatch mode (enter it around a step) whose ``counts`` (:data:`FIELDS`, totals)
    are the score traffic of a micro-batch of ``batch`` sequences of ``seq_len`` tokens."""
    return _counter_class()(batch, seq_len)


def _counter_class() -> type:
    """The dispatch mode's class, built once (torch is imported where it is used)."""
    if _COUNTER:
        return _COUNTER[0]
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    aten = torch.ops.aten
    matmuls = {aten.bmm.default, aten.baddbmm.default}

    def storage(t: Any) -> Any:
        try:
            return StorageWeakRef(t.untyped_storage())
        except Exception:
            return None

    class ScoreCounter(TorchDispatchMode):
        def __init__(self, batch: int, seq_len: int) -> None:
            super().__init__()
            self.seq_len = seq_len
            self.max_keys = seq_len + extra_keys(seq_len)
            self.min_numel = 2 * batch * seq_len * seq_len
            self.counts = dict.fromkeys(FIELDS, 0)

        def is_score(self, t: Any) -> bool:
            return (
                isinstance(t, torch.Tensor)
                and t.dim() >= 3
                and t.shape[-2] == self.seq_len
                and self.seq_len <= t.shape[-1] <= self.max_keys
                and t.numel() >= self.min_numel
            )

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            if func.namespace != "aten" or func.is_view:
                return out
            inputs = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
            outputs = [a for a in tree_leaves(out) if isinstance(a, torch.Tensor)]
            if not any(self.is_score(t) for t in (*inputs, *outputs)):
                return out
            phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
            if func in matmuls:
                a, b = args[-2], args[-1]  # baddbmm(self, batch1, batch2): the last two
                flops = 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
                self.counts[f"{phase}_gemm_flops"] += int(flops)
                return out
            if not func._schema.is_mutable:
                # An out-of-place op whose outputs are all its inputs' storage (_unsafe_view,
                # alias) moves nothing.
                owned = {storage(t) for t in inputs}
                if outputs and all(
                    (ref := storage(t)) is not None and ref in owned for t in outputs
                ):
                    return out
            moved = sum(_nbytes(t) for t in (*inputs, *outputs))
            self.counts[f"{phase}_bytes"] += int(moved)
            return out

    _COUNTER.append(ScoreCounter)
    return ScoreCounter
