"""Fits of ``blocks:K`` checkpointing for any K, from the measured settings around it.

A profile measures ``none``, ``full`` and one middle ``blocks:K`` (K = L // 2); every other K is
a line between the nearest two measured anchors, so the search can price any K without a
trace or a timing of each.

Memory. Each checkpointed block keeps only its input instead of its activations, so at any
one moment of the step the live bytes are affine in K; the peak is the largest over the
step's moments, a maximum of lines, hence convex in K. A line between two measured anchors
(``none`` at K = 0, the middle ``blocks:K``, ``full`` at K = L) is then never below the truth
between them: on the safe side of a memory budget, and exact where one moment holds the peak
throughout. Traced here (4 blocks, seq_len 128, micro-batch 8): gpt-tiny with n_embd 32 is
exactly linear in K (the loss's moment wins throughout); in the presets the per-block savings
shrink with K (gpt-tiny: 15.8, 13.7, 11.5, 0 MB: checkpointing the last block too saves
nothing at the peak), so the line through the middle anchor over-predicts blocks:1 by 1.1%
(llama-tiny 1.6%) and blocks:3 by 7.9% (llama-tiny 12.0%); through none and full alone by up
to 14% (20%). Tests: tests/advisor/test_memory_selective.py.

Time. A ``blocks:K`` step recomputes the forward of K blocks where ``full`` recomputes all L:
t(K) = t(none) + (K / L) · (t(full) - t(none)), through the middle timing when there is one.

Each phase's affine fit (intercept, slope, floor) is interpolated coefficient-wise; where both
anchors are pure lines, this is the line between their predictions at every micro-batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

from profilers.checkpointing import BLOCKS_PREFIX, FULL, NONE, parse_checkpointing
from profilers.fit import AffineFit
from profilers.memory_model import MemoryModel
from profilers.throughput import TimeModel

_M = TypeVar("_M", MemoryModel, TimeModel)


def lerp_fit(low: AffineFit, high: AffineFit, w: float) -> AffineFit:
    """The fit a fraction ``w`` of the way from ``low`` to ``high`` (no samples of its own)."""
    floor = (
        None
        if low.floor is None or high.floor is None
        else low.floor + w * (high.floor - low.floor)
    )
    return AffineFit(
        intercept=low.intercept + w * (high.intercept - low.intercept),
        slope=low.slope + w * (high.slope - low.slope),
        xs=(),
        ys=(),
        floor=floor,
    )


def _anchors(lookup: Callable[[str], _M | None], num_layers: int, full_at: int) -> dict[int, _M]:
    """Measured models by the number of checkpointed blocks they stand for: ``none`` at 0,
    each measured ``blocks:K`` at K, ``full`` at ``full_at`` unless a ``blocks:K`` is there."""
    out: dict[int, _M] = {}
    settings = [(0, NONE), (full_at, FULL)]
    settings += [(k, f"{BLOCKS_PREFIX}{k}") for k in range(1, num_layers)]
    for k, setting in settings:
        found = lookup(setting)
        if found is not None:
            out[k] = found
    return out


def _bracket(anchors: dict[int, _M], k: int) -> tuple[int, int] | None:
    below = [a for a in anchors if a <= k]
    above = [a for a in anchors if a >= k]
    if not below or not above:
        return None
    return max(below), min(above)


def blocks_memory_model(
    lookup: Callable[[str], MemoryModel | None], setting: str, num_layers: int
) -> MemoryModel | None:
    """The memory fit of ``blocks:K``: the line between the nearest measured settings
    (``lookup(setting)``: the fit of that setting in the same layout, or None), ``full``
    standing at K = L; None when ``setting`` is not ``blocks:K`` with 0 < K < L or the
    anchors around K are missing."""
    parsed = parse_checkpointing(setting)
    if parsed.kind != "blocks" or not 0 < parsed.blocks < num_layers:
        return None
    anchors = _anchors(lookup, num_layers, num_layers)
    return _interpolate(anchors, parsed.blocks, setting, _lerp_memory)


def blocks_time_model(
    lookup: Callable[[str], TimeModel | None], setting: str, num_layers: int
) -> TimeModel | None:
    """The step-time fit of ``blocks:K``: the line between the nearest timed settings
    (``full`` recomputing all L blocks); None without anchors around K."""
    span = blocks_time_span(lookup, setting, num_layers)
    return None if span is None else interpolated_time(*span, setting)


def interpolated_time(low: TimeModel, high: TimeModel, w: float, setting: str) -> TimeModel:
    """``setting``'s time model a fraction ``w`` of the way from ``low`` to ``high`` (the
    anchor itself when both are the same)."""
    model = low if low is high else _lerp_time(low, high, w)
    return dataclasses.replace(model, activation_checkpointing=setting)


def blocks_time_span(
    lookup: Callable[[str], TimeModel | None], setting: str, num_layers: int
) -> tuple[TimeModel, TimeModel, float] | None:
    """The two timed settings around ``blocks:K`` and how far between them K lies, ``(low,
    high, w)``, for a caller that interpolates their *predictions* rather than their
    coefficients: a fit is kept physical outside its timed sizes
    (strategies.sources.affine_seconds: below the smallest a line with a negative intercept
    scales in proportion to b), and the coefficient-wise line has no timed sizes to do that
    with. The 8th regret session advised blocks:3 at micro-batch 1 as 1.6% faster than none
    for that reason alone (none's guarded 0.0856 s against the bare line's 0.0841 s)."""
    parsed = parse_checkpointing(setting)
    if parsed.kind != "blocks" or not 0 < parsed.blocks < num_layers:
        return None
    anchors = _anchors(lookup, num_layers, num_layers)
    span = _bracket(anchors, parsed.blocks)
    if span is None:
        return None
    lo, hi = span
    w = 0.0 if lo == hi else (parsed.blocks - lo) / (hi - lo)
    return anchors[lo], anchors[hi], w


def _interpolate(
    anchors: dict[int, _M], k: int, setting: str, lerp: Callable[[_M, _M, float], _M]
) -> _M | None:
    span = _bracket(anchors, k)
    if span is None:
        return None
    lo, hi = span
    if lo == hi:
        return dataclasses.replace(anchors[lo], activation_checkpointing=setting)
    return dataclasses.replace(
        lerp(anchors[lo], anchors[hi], (k - lo) / (hi - lo)), activation_checkpointing=setting
    )


def _lerp_memory(low: MemoryModel, high: MemoryModel, w: float) -> MemoryModel:
    return dataclasses.replace(
        low,
        forward_backward=lerp_fit(low.forward_backward, high.forward_backward, w),
        forward_backward_accumulating=lerp_fit(
            low.forward_backward_accumulating, high.forward_backward_accumulating, w
        ),
        optimizer_step=lerp_fit(low.optimizer_step, high.optimizer_step, w),
        # Windows are not on the line: an FSDP fit reshards by the bound instead.
        reshard_points=(),
    )


def _lerp_time(low: TimeModel, high: TimeModel, w: float) -> TimeModel:
    ratio = (
        low.split_ratio + w * (high.split_ratio - low.split_ratio)
        if low.split_ratio is not None and high.split_ratio is not None
        else low.split_ratio
    )
    return dataclasses.replace(
        low,
        forward_backward=lerp_fit(low.forward_backward, high.forward_backward, w),
        optimizer_s=low.optimizer_s + w * (high.optimizer_s - low.optimizer_s),
        split_ratio=ratio,
    )


def line_error(
    low: MemoryModel | TimeModel,
    high: MemoryModel | TimeModel,
    middle: MemoryModel | TimeModel,
    w: float,
    micro_batch_size: int,
) -> float:
    """(line - measured) / measured at ``micro_batch_size`` for the middle anchor, the line
    running between ``low`` and ``high`` a fraction ``w`` of the way: how far the model in K
    is from what was measured (memory: the step's peak; time: forward+backward seconds)."""
    if isinstance(middle, MemoryModel):
        assert isinstance(low, MemoryModel) and isinstance(high, MemoryModel)
        line: float = _lerp_memory(low, high, w).predict(micro_batch_size)
        measured: float = middle.predict(micro_batch_size)
    else:
        assert isinstance(low, TimeModel) and isinstance(high, TimeModel)
        line = _lerp_time(low, high, w).forward_backward_s(micro_batch_size)
        measured = middle.forward_backward_s(micro_batch_size)
    return (line - measured) / measured if measured else 0.0
