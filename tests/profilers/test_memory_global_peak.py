"""The trackers update the step's peak only (memory_tracing.GlobalPeakOnly), not every module's
at each op as torch's MemTracker does: a trace must read exactly what torch's own bookkeeping
gives, one-device and FSDP rank, peaks, breakdowns and windows alike (benchmarks/trace_speed.py
times the two ways)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from torch.distributed._tools.mem_tracker import MemTracker

from advisor.workload import AdvisorWorkload
from profilers.isolate import Isolation, run_isolated
from profilers.memory_tracing import GlobalPeakOnly, _StepMemTracker
from profilers.workload import StepSpec
from tests.profilers.trace_fields import trace_fields

WORKLOAD = AdvisorWorkload(model="llama-tiny", model_args={"n_layer": 3})


def _fields(spec: StepSpec) -> dict[str, Any]:
    return trace_fields(WORKLOAD, spec)


def _both_ways(spec: StepSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    mixin: Any = GlobalPeakOnly
    ours = mixin.__dict__["_update_peak_stats"]
    after = _fields(spec)
    mixin._update_peak_stats = MemTracker._update_peak_stats  # torch's walk, for comparison
    try:
        before = _fields(spec)
    finally:
        mixin._update_peak_stats = ours
    return before, after


@pytest.fixture
def restored() -> Iterator[None]:
    yield
    assert "_update_peak_stats" in GlobalPeakOnly.__dict__


def test_the_one_device_tracker_skips_the_module_walk() -> None:
    # the mixin's method, not torch's, runs at each op
    assert _StepMemTracker._update_peak_stats is GlobalPeakOnly._update_peak_stats


@pytest.mark.parametrize(
    ("precision", "checkpointing", "accumulation"),
    [("bf16", "none", 1), ("fp32", "blocks:1", 2)],
)
def test_a_one_device_trace_reads_what_torchs_bookkeeping_reads(
    precision: str, checkpointing: str, accumulation: int, restored: None
) -> None:
    spec = StepSpec(
        seq_len=32,
        micro_batch_size=2,
        grad_accum_steps=accumulation,
        precision=precision,
        activation_checkpointing=checkpointing,
    )
    before, after = _both_ways(spec)
    assert after["peak_bytes"] > 0 and after.get("window_peaks")
    assert after == before


def test_an_fsdp_rank_reads_what_torchs_bookkeeping_reads() -> None:
    spec = StepSpec(
        seq_len=32,
        micro_batch_size=2,
        precision="bf16",
        activation_checkpointing="full",
        parallelism="fsdp",
        world_size=2,
    )
    # a child: the fake process group is process-wide
    outcome = run_isolated(Isolation(timeout_s=300, num_threads=1), _both_ways, spec)
    assert outcome.ok, f"{outcome.reason}\n{outcome.traceback}"
    before, after = outcome.value
    assert after["peak_bytes"] > 0
    assert after == before
