"""The co-residency benchmark's summary: the median over processes of per-process medians."""

from __future__ import annotations

from benchmarks.timing_coresident import summarize


def test_summary_is_the_median_of_each_process_median_per_size() -> None:
    samples = {
        "pair": [{"2": [1.0, 3.0, 2.0], "8": [4.0, 4.0, 5.0]}, {"2": [9.0, 9.0, 9.0], "8": [6.0]}],
        "alone8": [{"8": [1.0, 2.0, 30.0]}, {"8": [2.0]}, {"8": [10.0]}],
    }
    assert summarize(samples) == {"pair": {"2": 5.5, "8": 5.0}, "alone8": {"8": 2.0}}
