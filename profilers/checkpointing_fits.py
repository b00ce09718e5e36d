"""Fits of ``blocks:K`` checkpointing for any K, from the measured settings around it.

A profile measures ``none``, ``full`` and one middle ``blocks:M`` (M = L // 2); every other K
is priced from them, so the search can price any K without a trace or a timing of each.

Memory, from the windows of the traces (:func:`windowed_blocks_model`). Each checkpointed
block keeps only its input instead of its activations, a saving s per block; the trace of a
model with repeated blocks keeps its forward+backward peak per window
(``MemoryTrace.window_peaks``), split where the last block's backward ends, and the peak of
blocks:K is the larger of the two parts, each exact from three traces:

* before that moment (window "F", and "A" under autocast) every block's saved tensors are
  live at the window's peak, and blocks:K never checkpoints the last block
  (profilers.checkpointing.checkpointed_blocks), so each window's peak is a line in K,
  P(K) = P(0) - K * s: the line through none and blocks:M, window by window;
* after it (window "B"), at block j's backward (j = L-2 .. 0) the live bytes are those at
  the top of backward, less d for each block below the top (its activations freed, its
  gradients made) and less s for each checkpointed block below j (saved input instead of
  activations; block j's own are live either way, saved or recomputed):
  B(K) = max over j of [B(none) - (L-2-j) * d - s * |checkpointed blocks below j|], s from
  window "A" (or "F") of none and blocks:M, d from B(none) and B(full) over L-2 blocks
  (when the top wins in full, d stands in at s: exact at the peak all the same).

The model is checked against the measured blocks:M (its B must come out no lower than
measured) and not used when it fails, when a setting has no windows (records before they
were kept; a distributed rank's windows are per block) or L < 3: then the line in K between
the nearest measured settings prices it. That line is never below the truth (the peak, a
max of lines in K, is convex) but not exact: the savings per block shrink towards K = L
(gpt-tiny, seq 128: 15.8, 13.7, 11.5, 0 MB; blocks:L-1 peaks as full does), so the line
over-predicted blocks:3 of 4 by up to 14.8% in the profiler accuracy benchmark. Traced
against whole traces (tests/profilers/test_checkpointing_windows.py): gpt-tiny, llama-tiny
and bert-tiny, fp32 and bf16, with and without accumulation, every K within a millionth at
the traced sizes (between them as close as the measured settings' own fits over b).

Time. A ``blocks:K`` step recomputes the forward of K blocks where ``full`` recomputes all L:
t(K) = t(none) + (K / L) · (t(full) - t(none)), through the middle timing when there is one.

Each phase's affine fit (intercept, slope, floor) is interpolated coefficient-wise; where both
anchors are pure lines, this is the line between their predictions at every micro-batch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from profilers.checkpointing import (
    BLOCKS_PREFIX,
    FULL,
    NONE,
    checkpointed_blocks,
    parse_checkpointing,
)
from profilers.fit import AffineFit, envelope, fit_hinged
from profilers.memory_model import MemoryModel
from profilers.throughput import TimeModel

_M = TypeVar("_M", MemoryModel, TimeModel)
# How far (a fraction) the windowed model may fall below the measured blocks:M's window B
# before it is not used (fit residuals: the windows are fitted over b one by one).
_CHECK = 0.001


def lerp_fit(low: AffineFit, high: AffineFit, w: float) -> AffineFit:
    """The fit a fraction ``w`` of the way from ``low`` to ``high`` (no samples of its own)."""
    if low.pieces or high.pieces:
        raise ValueError("an envelope of fits is not interpolated piece by piece")
    # A floor is the peak at the smallest traced size. When only one fit has one (the other
    # was traced at two sizes: a plain line), the other's value there stands in for its
    # floor, so the line in between is floored at the values it runs between. Dropping the
    # floor left only the lines' intercepts: a 46.7B Mixtral's blocks:1 at 64 ranks,
    # micro-batch 1, read 57.6 GiB between none's 65.6 and blocks:16's 45.0.
    floor = None
    if low.floor is not None or high.floor is not None:
        floored = low if low.floor is not None else high
        at = floor_at(floored)
        low_floor = low.floor if low.floor is not None else low.predict(at)
        high_floor = high.floor if high.floor is not None else high.predict(at)
        floor = low_floor + w * (high_floor - low_floor)
    return AffineFit(
        intercept=low.intercept + w * (high.intercept - low.intercept),
        slope=low.slope + w * (high.slope - low.slope),
        xs=(),
        ys=(),
        floor=floor,
    )


def floor_at(fit: AffineFit) -> float:
    """The micro-batch a floored fit's floor stands for: its smallest traced size when the
    floor is the peak traced there (:func:`profilers.fit.fit_hinged`), else 1 (a floor from
    the step's windows at micro-batch 1, the smallest size untraced:
    profilers.memory_model.floored_by_windows). Reading the other anchor at the smallest
    traced size instead put fp32/none's peak at micro-batch 4 into blocks:1's floor at 1 (a
    Llama-3-8B shape at sequence 8192, traced at 4 and 8: 1,512 GiB against none's 458)."""
    if fit.xs:
        smallest = min(fit.xs)
        at_smallest = [y for x, y in zip(fit.xs, fit.ys, strict=False) if x == smallest]
        if smallest <= 1 or (at_smallest and fit.floor == max(at_smallest)):
            return smallest
    return 1.0


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


def _bracket(anchors: Mapping[int, _M], k: int) -> tuple[int, int] | None:
    below = [a for a in anchors if a <= k]
    above = [a for a in anchors if a >= k]
    if not below or not above:
        return None
    return max(below), min(above)


def blocks_memory_model(
    lookup: Callable[[str], MemoryModel | None],
    setting: str,
    num_layers: int,
    *,
    windowed: bool = True,
) -> MemoryModel | None:
    """The memory fit of ``blocks:K``: from the windows of the measured settings
    (:func:`windowed_blocks_model`) unless ``windowed`` is False or they cannot, else the line
    between the nearest measured settings (``lookup(setting)``: the fit of that setting in the
    same layout, or None), ``full`` standing at K = L; None when ``setting`` is not
    ``blocks:K`` with 0 < K < L or the anchors around K are missing. ``windowed=False`` for
    anchors resharded to another world size: their window fits are the traced world's."""
    parsed = parse_checkpointing(setting)
    if parsed.kind != "blocks" or not 0 < parsed.blocks < num_layers:
        return None
    anchors = _anchors(lookup, num_layers, num_layers)
    if windowed:
        model = windowed_blocks_model(anchors, parsed.blocks, num_layers)
        if model is not None:
            return model
    return _interpolate(anchors, parsed.blocks, setting, _lerp_memory)


def windowed_blocks_model(
    anchors: Mapping[int, MemoryModel], k: int, num_layers: int
) -> MemoryModel | None:
    """``blocks:K``'s memory fit from the window fits of ``none`` (anchor 0), a measured
    ``blocks:M`` (the nearest to K) and ``full`` (anchor L), per the model in this module's
    docstring: each window of blocks:K at the sizes they were traced at, fitted over b, and
    the largest window at any b (an envelope); None when one of them has no windows, L < 3,
    or the model fails its check against the measured ``blocks:M`` (then the line in K
    prices it). With accumulation the same from their window fits with accumulation: at the
    sizes traced so when there are two, else each window of the fit without accumulation
    moved by what the model adds to that window at the one size traced so (as each traced
    setting's windows are: ``accumulation_source`` "offset"); without such fits, the line
    in K's."""
    none, full = anchors.get(0), anchors.get(num_layers)
    middles = sorted((m for m in anchors if 0 < m < num_layers), key=lambda m: (abs(m - k), -m))
    if none is None or full is None or not middles or num_layers < 3 or not 0 < k < num_layers:
        return None
    m = middles[0]
    trio = (none, anchors[m], full)
    sizes = sorted({x for model in trio for x in model.forward_backward.xs})
    plain = _window_peaks([t.windows for t in trio], m, k, num_layers, sizes)
    if plain is None or len(sizes) < 2:
        return None
    pieces = {name: fit_hinged(sizes, values) for name, values in plain.items()}
    low, high = _bracket(anchors, k) or (0, num_layers)
    line = _lerp_memory(
        anchors[low], anchors[high], (k - low) / (high - low) if high > low else 0.0
    )
    accumulating = line.forward_backward_accumulating
    traced = sorted({x for model in trio for x in model.forward_backward_accumulating.xs})
    added = _window_peaks([t.windows_accumulating for t in trio], m, k, num_layers, traced)
    if added is not None and len(traced) >= 2:
        accumulating = envelope([fit_hinged(traced, v) for v in added.values()])
    elif added is not None and traced:
        at = traced[0]
        accumulating = envelope(
            [fit.shifted(added[name][0] - fit.predict(at)) for name, fit in pieces.items()]
        )
    return dataclasses.replace(
        line,
        activation_checkpointing=f"{BLOCKS_PREFIX}{k}",
        # No sizes of its own (as the line in K's): derived from the measured settings.
        forward_backward=envelope(list(pieces.values())),
        forward_backward_accumulating=accumulating,
    )


def _window_peaks(
    windows: Sequence[Sequence[tuple[str, AffineFit]]],
    m: int,
    k: int,
    num_layers: int,
    sizes: Sequence[float],
) -> dict[str, list[float]] | None:
    """blocks:K's peak per window at each of ``sizes``, from the window fits of none,
    blocks:M and full (``windows``, in that order); None where the model does not apply."""
    names = [name for name, _ in windows[0]]
    # full's windows before B may be cut differently (its last block's recompute ends the
    # autocast window "F" early in fp32), and only its B is read.
    if (
        "B" not in names
        or len(names) < 2
        or [n for n, _ in windows[1]] != names
        or "B" not in dict(windows[2])
    ):
        return None
    none, middle, full = (dict(w) for w in windows)
    blocks_k = checkpointed_blocks(f"{BLOCKS_PREFIX}{k}", num_layers)
    blocks_m = checkpointed_blocks(f"{BLOCKS_PREFIX}{m}", num_layers)
    pre = [name for name in names if name != "B"]
    out: dict[str, list[float]] = {name: [] for name in names}
    for b in sizes:
        terms = _after_terms(none, middle, full, pre[-1], m, num_layers, b)
        if terms is None:
            return None
        # The check: the model must not fall below what blocks:M itself measured.
        if _after_peak(terms, blocks_m, num_layers) < middle["B"].predict(b) * (1 - _CHECK):
            return None
        out["B"].append(_after_peak(terms, blocks_k, num_layers))
        for name in pre:
            at_none, at_m = none[name].predict(b), middle[name].predict(b)
            out[name].append(at_none + k / m * (at_m - at_none))
    return out


def _after_terms(
    none: Mapping[str, AffineFit],
    middle: Mapping[str, AffineFit],
    full: Mapping[str, AffineFit],
    last_pre: str,
    m: int,
    num_layers: int,
    b: float,
) -> tuple[float, float, float] | None:
    """(B(none), saving per checkpointed block, change per block of backward) at b, or None
    when checkpointing raised a peak (the model's premise)."""
    saving = (none[last_pre].predict(b) - middle[last_pre].predict(b)) / m
    top = none["B"].predict(b)
    step = (top - full["B"].predict(b)) / (num_layers - 2)
    if saving < 0 or step < 0:
        return None
    return top, saving, step


def _after_peak(terms: tuple[float, float, float], checkpointed: Sequence[int], L: int) -> float:
    """Window B's peak: the largest over the backward of blocks j = L-2 .. 0 of B(none) less
    one step per block below the top and one saving per checkpointed block below j."""
    top, saving, step = terms
    marked, below, peak = set(checkpointed), 0, -math.inf
    for j in range(L - 1):  # one pass: an 80-block model is priced per candidate
        peak = max(peak, top - (L - 2 - j) * step - saving * below)
        below += j in marked
    return peak


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
    return blocks_span(lookup, setting, num_layers)


def blocks_memory_span(
    lookup: Callable[[str], MemoryModel | None], setting: str, num_layers: int
) -> tuple[MemoryModel, MemoryModel, float] | None:
    """:func:`blocks_span` of memory fits: the anchors a ``blocks:K`` fit without a trace of
    its own stands between, for a caller that interpolates what it derives from each anchor
    (strategies.cost: an FSDP rank's activations from each one's windows) rather than their
    coefficients, which keep no windows."""
    return blocks_span(lookup, setting, num_layers)


def blocks_span(
    lookup: Callable[[str], _M | None], setting: str, num_layers: int
) -> tuple[_M, _M, float] | None:
    """The measured settings around ``blocks:K`` (``lookup``: a setting's fit in one layout,
    or None) and how far between them K lies, ``(low, high, w)``; the same setting twice
    (w = 0) when K itself was measured; None when ``setting`` is not ``blocks:K`` with
    0 < K < L or a side has no anchor."""
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
        windows=(),
        windows_accumulating=(),
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
