"""The affine and hinged fits shared by the memory, time and communication models."""

from __future__ import annotations

import pytest

from profilers.fit import AffineFit, fit_affine, fit_hinged


def test_affine_fit_recovers_a_line_and_keeps_residuals() -> None:
    fit = fit_affine([1, 2, 4], [3.0, 5.0, 9.0])
    assert fit.intercept == pytest.approx(1.0) and fit.slope == pytest.approx(2.0)
    assert fit.max_relative_residual == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="two or more distinct"):
        fit_affine([2, 2], [1.0, 1.0])


def test_hinged_fit_follows_the_bend_a_single_line_misses() -> None:
    # gpt-tiny fp32 forward/backward peaks (MiB): flat until the activations dominate.
    xs, ys = [1, 4, 8], [51.71, 56.94, 74.22]
    hinged, line = fit_hinged(xs, ys), fit_affine([1, 4], ys[:2])
    truth_at_12 = 74.22 + 4 * 4.32
    assert hinged.predict(12) == pytest.approx(truth_at_12, rel=1e-3)
    assert line.predict(12) < 0.9 * truth_at_12  # the straight line through the bend
    assert hinged.predict(1) == pytest.approx(51.71)
    assert hinged.predict(2) >= 51.71  # never below the floor


def test_hinged_fit_with_two_sizes_is_the_affine_fit_and_round_trips() -> None:
    assert fit_hinged([1, 4], [2.0, 5.0]) == fit_affine([1, 4], [2.0, 5.0])
    hinged = fit_hinged([1, 4, 8], [10.0, 12.0, 20.0])
    assert AffineFit.from_dict(hinged.to_dict()) == hinged
    moved = hinged.shifted(3.0)
    assert moved.predict(1) == pytest.approx(hinged.predict(1) + 3)
    assert moved.predict(8) == pytest.approx(hinged.predict(8) + 3)
