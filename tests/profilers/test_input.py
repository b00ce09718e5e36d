"""The input probe keeps its budget: worker start-up comes out of it, not on top of it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from profilers.input import START_UP_TOOK_IT, measure_loader, probe_input
from profilers.workload import StepSpec

SPEC = StepSpec(seq_len=8, micro_batch_size=2)


class SlowStart:
    """A loader whose every start (workers spawning, the first fetch) takes ``start_s``, then
    delivers a batch every ``batch_s``."""

    def __init__(self, start_s: float, batch_s: float = 0.01) -> None:
        self.start_s, self.batch_s = start_s, batch_s

    def data_batches(self, spec: StepSpec, num_workers: int, num_batches: int) -> Iterator[Any]:
        time.sleep(self.start_s)
        for _ in range(num_batches):
            yield None
            time.sleep(self.batch_s)


def test_worker_start_ups_come_out_of_the_budget() -> None:
    """Three settings whose start-up alone (0.5 s each) outlasts a 1 s budget: the profile
    used to spend 3 × (start-up + its third) — here about 2.5 s — on the last phase."""
    started = time.perf_counter()
    samples = probe_input(SlowStart(0.5), SPEC, (0, 1, 2), budget_s=1.0)
    elapsed = time.perf_counter() - started
    assert elapsed < 1.0 + 0.5 + 0.3  # at most one start-up past the deadline
    assert [s.num_workers for s in samples] == [0, 1, 2]
    assert samples[0].status == "ok" and samples[0].batches_per_s > 0
    skipped = [s for s in samples if s.status == "skipped"]
    assert skipped and all(s.reason == START_UP_TOOK_IT for s in skipped)
    assert samples[-1].status == "skipped"


def test_a_quick_loader_measures_every_setting_within_the_budget() -> None:
    started = time.perf_counter()
    samples = probe_input(SlowStart(0.0), SPEC, (0, 1, 2), budget_s=0.6)
    assert time.perf_counter() - started < 0.6 + 0.5
    assert [s.status for s in samples] == ["ok", "ok", "ok"]
    assert all(s.batches_per_s > 0 for s in samples)


def test_a_first_batch_after_the_deadline_is_a_skipped_sample() -> None:
    sample = measure_loader(SlowStart(0.2), SPEC, 0, deadline=time.perf_counter() + 0.1)
    assert (sample.status, sample.reason, sample.batches_per_s) == ("skipped", START_UP_TOOK_IT, 0)


def test_a_broken_loader_is_an_error_sample_not_a_crash() -> None:
    class Broken:
        def data_batches(self, *args: Any) -> Iterator[Any]:
            raise OSError("no such file: tokens.bin")

    (sample,) = probe_input(Broken(), SPEC, (0,), budget_s=1.0)
    assert sample.status == "error" and sample.reason == "OSError: no such file: tokens.bin"
