"""MemoryModel.resharded with per-window bytes, on numbers chosen so the answer is known.

A world-2 FSDP rank of a deep model with full checkpointing peaks at the end of backward, where
its sharded gradients are live; at more ranks those shrink and another window can hold the peak.
The traces that make such windows are checked against direct traces in
tests/profilers/test_memory_distributed.py; here only the arithmetic.
"""

from __future__ import annotations

import pytest

from profilers.checkpointing_fits import blocks_memory_model
from profilers.fit import fit_hinged
from profilers.memory_model import MemoryModel

GiB = 2**30
# Per micro-batch size: (most unsharded, most sharded) bytes per window. Window 1: the loss,
# activations heavy; window 2: the end of backward, every gradient shard live.
POINTS = (
    (1, ((20 * GiB, 400 * GiB), (10 * GiB, 520 * GiB))),
    (4, ((50 * GiB, 400 * GiB), (12 * GiB, 520 * GiB))),
)


def _model(accumulation_source: str = "gradient_bytes", **kw: object) -> MemoryModel:
    peaks = [max(r + s for r, s in w) for _, w in POINTS]
    fb = fit_hinged([1.0, 4.0], [float(p) for p in peaks])
    return MemoryModel(
        precision="bf16",
        activation_checkpointing="full",
        seq_len=2048,
        target_device_type="cuda",
        forward_backward=fb,
        forward_backward_accumulating=fb.shifted(130 * GiB),
        optimizer_step=fit_hinged([1.0, 4.0], [530.0 * GiB, 530.0 * GiB]),
        accumulation_source=accumulation_source,
        parameter_bytes=130 * GiB,
        gradient_bytes=130 * GiB,
        optimizer_state_bytes=260 * GiB,
        resident_bytes=390 * GiB,
        parallelism="fsdp",
        world_size=2,
        reshard_points=POINTS,
        **kw,  # type: ignore[arg-type]
    )


def test_the_peak_follows_the_window_that_wins_at_the_new_world_size() -> None:
    two = _model()
    assert two.forward_backward.predict(1) == 530 * GiB  # the end of backward wins at 2
    at_64 = two.resharded(64)
    # At 64 ranks: window 1 = 20 + 400/32 = 32.5 GiB, window 2 = 10 + 520/32 = 26.25 GiB.
    assert at_64.forward_backward.predict(1) == pytest.approx(32.5 * GiB, rel=1e-9)
    assert at_64.forward_backward.predict(4) == pytest.approx(62.5 * GiB, rel=1e-9)
    # The bound it replaces keeps the gradients live at the world-2 peak: far higher.
    state = two.parameter_bytes + two.optimizer_state_bytes
    kept = two.forward_backward.mapped(1.0, -state * (1 - 2 / 64)).predict(1)
    assert kept > 150 * GiB
    # Resharding again from the result is the same as resharding once.
    again = at_64.resharded(2).resharded(64)
    assert again.forward_backward.predict(1) == pytest.approx(32.5 * GiB, rel=1e-6)


def test_without_an_accumulation_trace_all_gradient_shards_are_live_beside_each_window() -> None:
    at_64 = _model().resharded(64)
    everything = (130 + 260 + 130) * GiB / 32
    # The larger unsharded part (window 1) beside the whole sharded state, not the traced
    # gradients counted twice (the shift by gradient_bytes).
    assert at_64.predict(1, 8) == pytest.approx(20 * GiB + everything, rel=1e-6)
    assert at_64.predict(1, 8) >= at_64.predict(1, 1)


def test_an_accumulation_trace_keeps_its_own_reshard() -> None:
    two = _model("offset")
    expected = two.forward_backward_accumulating.mapped(1.0, -(520 * GiB) * (1 - 2 / 64))
    assert two.resharded(64).forward_backward_accumulating.predict(4) == pytest.approx(
        expected.predict(4)
    )


def test_records_without_windows_reshard_by_the_bound() -> None:
    old = MemoryModel.from_dict({**_model().to_dict(), "reshard_points": []})
    assert old.reshard_points == ()
    state = old.parameter_bytes + old.optimizer_state_bytes
    bound = old.forward_backward.mapped(1.0, -state * (1 - 2 / 64)).predict(1)
    assert old.resharded(64).forward_backward.predict(1) == pytest.approx(bound)
    assert MemoryModel.from_dict(_model().to_dict()).reshard_points == POINTS


def test_a_blocks_k_line_between_two_fits_has_no_windows() -> None:
    full, none = _model(), _model()
    fits = {"full": full, "none": none}
    line = blocks_memory_model(fits.get, "blocks:40", 80)
    assert line is not None and line.reshard_points == ()
