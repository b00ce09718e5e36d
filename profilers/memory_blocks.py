"""Trace a deep model's step from two shallow copies of it: the blocks are identical.

A fake-tensor trace costs per op, not per byte, so its time grows with the number of layers: a
124M model took ~10 s per trace on two cores, a 13B one 20-80 s, and a profile traces each
precision x checkpointing at several sizes. The repeated blocks of a Transformer are identical,
so the step of a model with L blocks is traced with only K1 = 2 and K2 = 3 of them (the same
embedding, head, loss and optimizer) and every byte count is extended to L along the line
through the two: x(L) = x(K1) + (L - K1) * (x(K2) - x(K1)). The cost no longer depends on L.

Why a line holds. Parameters, gradients, optimizer state and what stays live grow by one block's
worth per block. A *peak* is a maximum over the step's timeline, and a maximum of lines is a line
only if the same moment wins at every L, so forward+backward is traced in two windows whose
winning moment does not move with L (``memory_tracing._StepMemTracker.split_after``):

* window A, from a micro-batch's forward to the end of the last block's backward: every
  moment's live memory is what the step holds plus (blocks whose activations are saved) x one
  block's activations, and the most blocks are saved at the head, the loss and the last
  block's backward, the same place at every L;
* window B, the rest of backward: at block j (counting down) j blocks' activations and the
  later blocks' gradients are live, a line in j whose maximum is at one end of the range, the
  same end at every L; K1 = 2 is the depth where both ends coincide, so the line through K1 and
  K2 follows whichever end wins for L >= 2.

The optimizer step is one phase whose peak holds everything at once: a line. Each window's
breakdown is extended separately and the larger at L is the forward+backward peak.

Every checkpointing setting that treats all blocks alike scales: ``none``, ``full`` and ``ops``
(each block saves the same matmul outputs). ``blocks:K`` does not (K of L blocks differ, which
no shallow copy reproduces): it is traced whole, and only once per profile, at K = L // 2
(profilers.checkpointing_fits prices the other K).
The tests trace presets with and without scaling and require the same bytes.

A model whose first P blocks are built unlike the rest (DeepSeek-V3's 3 dense layers before its
MoE layers: ``ModelFacts.uniform_blocks_from``) is traced from copies that keep those P blocks
and 2 and 3 of the others: the prefix is the same in both copies and in the model, every later
block adds the same bytes, and the winning moments stay put (the last block, the head, the
ends of backward's range). Blocks that repeat with a period p (``ModelFacts.block_period``:
Llama 4 Maverick, period 4) are copied 2 and 3 periods at a time: within each phase of the
period the bytes are affine in the index, so the same argument holds phase by phase. The tests
trace DeepSeek-V3 and Llama 4 shapes both ways too (single device; FSDP/DDP ranks of DeepSeek-V3
shapes) and require the same bytes. A model with no such pattern is traced whole.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from profilers.checkpointing import parse_checkpointing
from profilers.fake_kernels import TraceOverBudget
from profilers.memory_records import MemoryBreakdown, MemoryTrace
from profilers.workload import BlockScalableWorkload, StepSpec, Workload

SCALE_FROM_BLOCKS: tuple[int, int] = (2, 3)
# Scale only models at least this deep: below it the two shallow traces cost about as much as
# the model's own (2 + 3 blocks against L).
MIN_LAYERS_TO_SCALE = 6

_T = TypeVar("_T")
_K = TypeVar("_K", bound=Hashable)

if TYPE_CHECKING:
    from profilers.memory_tracing import RawTrace


@dataclasses.dataclass(frozen=True)
class DepthScaling:
    """How a deep model is counted or traced from two shallow copies of itself.

    ``layers``: the model's blocks; ``prefix``: the first blocks, built unlike the rest
    (``ModelFacts.uniform_blocks_from``); ``period``: how often the others repeat
    (``ModelFacts.block_period``); ``depths``: the copies' blocks, the prefix and a whole number
    of periods each, one period apart."""

    layers: int
    prefix: int
    period: int
    depths: tuple[int, int]

    def extend(self, low: Mapping[_K, int], high: Mapping[_K, int]) -> dict[_K, int]:
        """Integers per key counted on the two copies, extended along their line to
        ``layers`` blocks (a key one copy lacks counts 0 there)."""
        k1, k2 = self.depths
        return {
            key: low.get(key, 0)
            + (self.layers - k1) * (high.get(key, 0) - low.get(key, 0)) // (k2 - k1)
            for key in sorted(set(low) | set(high), key=repr)
        }


def depth_scaling(
    workload: Workload,
    base: tuple[int, int] = SCALE_FROM_BLOCKS,
    min_layers: int = MIN_LAYERS_TO_SCALE,
) -> DepthScaling | None:
    """How ``workload`` is extended in depth, else None (not a :class:`BlockScalableWorkload`,
    or too shallow). The copies keep the blocks built unlike the rest
    (``ModelFacts.uniform_blocks_from``: DeepSeek-V3's dense layers before its MoE ones) and
    ``base`` periods of the others (``ModelFacts.block_period``: 2 when dense and MoE layers
    alternate); the line runs through them, one period apart. Until 2026-12-05 the copies were
    always the first 2 and 3 blocks: a DeepSeek-V3 shape was counted and traced as 61 dense
    layers (no expert GEMM at all)."""
    if not isinstance(workload, BlockScalableWorkload):
        return None
    facts = workload.facts()
    prefix, period = facts.uniform_blocks_from, max(facts.block_period, 1)
    if facts.num_layers < prefix + min_layers * period or (facts.num_layers - prefix) % period:
        return None
    depths = (prefix + base[0] * period, prefix + base[1] * period)
    return DepthScaling(layers=facts.num_layers, prefix=prefix, period=period, depths=depths)


def counted_in_depth(
    workload: Workload, count: Callable[[Workload], Mapping[_K, int]]
) -> dict[_K, int]:
    """``count`` of ``workload`` (integers per key, each affine in the number of blocks: FLOPs,
    bytes, calls of an op), from shallow copies extended
    to the model's depth when it is deep enough (:func:`depth_scaling`: after any blocks
    built unlike the rest), else, or when a shallow copy cannot run (a forward that needs all
    its blocks), of the whole model."""
    scaling = depth_scaling(workload)
    if scaling is not None:
        assert isinstance(workload, BlockScalableWorkload)
        try:
            low, high = (count(workload.with_blocks(k)) for k in scaling.depths)
        except TraceOverBudget:  # the profile's time is spent: not whole either
            raise
        except Exception:  # count it whole
            pass
        else:
            return scaling.extend(low, high)
    return dict(count(workload))


def trace_scaled(
    workload: BlockScalableWorkload,
    spec: StepSpec,
    *,
    cuda_rounding: bool,
    num_layers: int,
    depths: tuple[int, int] = SCALE_FROM_BLOCKS,
) -> MemoryTrace:
    """The trace of ``spec`` on the full model, from traces of two shallow copies with
    ``depths`` blocks."""
    from profilers.memory_tracing import last_block, trace_raw

    require_identical_blocks(spec)
    started = time.perf_counter()
    k1, k2 = depths
    raws = [
        trace_raw(
            workload.with_blocks(k),
            spec,
            cuda_rounding=cuda_rounding,
            split_after=last_block(workload),
        )
        for k in (k1, k2)
    ]
    if set(raws[0].windows) != set(raws[1].windows):
        raise ValueError(
            f"the {k1}- and {k2}-block traces saw different windows "
            f"({sorted(raws[0].windows)} vs {sorted(raws[1].windows)})"
        )
    low, high = raws
    scaled = extend_raw(
        low, high, windows={k: (k, k) for k in low.windows}, blocks=(k1, k2), num_layers=num_layers
    )
    trace = scaled.assemble(spec, cuda_rounding=cuda_rounding, started=started)
    return dataclasses.replace(trace, scaled_from_blocks=(k1, k2))


def require_identical_blocks(spec: StepSpec) -> None:
    """ValueError when ``spec`` treats its blocks differently (``blocks:K``: K of L
    checkpointed), which no shallow copy reproduces."""
    if parse_checkpointing(spec.activation_checkpointing).kind == "blocks":
        raise ValueError(
            f"{spec.activation_checkpointing} checkpointing treats blocks differently: trace "
            "the whole model"
        )


def extend_raw(
    low: RawTrace,
    high: RawTrace,
    *,
    windows: Mapping[str, tuple[str, str]],
    blocks: tuple[int, int],
    num_layers: int,
) -> RawTrace:
    """The raw trace at ``num_layers`` blocks from ``low`` and ``high``, traced with ``blocks``
    blocks: every byte count along the line through the two. ``windows`` names each window of
    the result by the window of ``low`` and of ``high`` that holds the same moment."""
    k1, k2 = blocks

    def at(x1: int, x2: int) -> int:
        return x1 + (num_layers - k1) * (x2 - x1) // (k2 - k1)

    def breakdown(b1: MemoryBreakdown, b2: MemoryBreakdown) -> MemoryBreakdown:
        return _fieldwise(b1, b2, at)

    return dataclasses.replace(
        low,
        windows={k: breakdown(low.windows[a], high.windows[b]) for k, (a, b) in windows.items()},
        optimizer_step=breakdown(low.optimizer_step, high.optimizer_step),
        parameter_bytes=at(low.parameter_bytes, high.parameter_bytes),
        gradient_bytes=at(low.gradient_bytes, high.gradient_bytes),
        optimizer_state_bytes=at(low.optimizer_state_bytes, high.optimizer_state_bytes),
        resident_bytes=at(low.resident_bytes, high.resident_bytes),
        reshard_windows={
            k: (
                at(low.reshard_windows[a][0], high.reshard_windows[b][0]),
                at(low.reshard_windows[a][1], high.reshard_windows[b][1]),
            )
            for k, (a, b) in windows.items()
            if a in low.reshard_windows and b in high.reshard_windows
        },
    )


def _fieldwise(a: _T, b: _T, combine: Any) -> _T:
    values: Mapping[str, Any] = {
        f.name: combine(getattr(a, f.name), getattr(b, f.name))
        for f in dataclasses.fields(a)  # type: ignore[arg-type]
    }
    return dataclasses.replace(a, **values)  # type: ignore[type-var]
