"""A memory fit without its smallest size is floored by its windows at micro-batch 1
(profilers.memory_model.floored_by_windows): the line through 4 and 8 alone read up to 20% low
there."""

from __future__ import annotations

import dataclasses

import pytest

from advisor.workload import AdvisorWorkload
from profilers.memory import trace_step_memory
from profilers.memory_model import fit_memory, floored_by_windows
from profilers.memory_records import MemoryTrace
from profilers.workload import StepSpec


def _trace(workload: AdvisorWorkload, setting: str, b: int) -> MemoryTrace:
    # As a profile traces (a deep model from 3- and 4-block copies, extended in depth).
    spec = StepSpec(seq_len=128, micro_batch_size=b, activation_checkpointing=setting)
    return trace_step_memory(workload, spec, target_device_type="cuda")


@pytest.mark.parametrize(
    ("model", "setting", "exact"),
    [
        # The peak at micro-batch 1-3 is the end of backward, nearly flat in b: within 0.02%.
        ("gpt-small", "none", True),
        # Its window B bends within itself: closer, still below (the traced hinge fixes it).
        ("gpt-tiny", "ops", False),
    ],
)
def test_the_windows_floor_a_fit_traced_at_4_and_8_without_passing_the_truth(
    model: str, setting: str, exact: bool
) -> None:
    workload = AdvisorWorkload(model)
    traces = {b: _trace(workload, setting, b) for b in (1, 2, 4, 8)}
    fitted = fit_memory([traces[4], traces[8]])
    line = dataclasses.replace(fitted.forward_backward, floor=None)
    assert fitted.windows and fitted.forward_backward.floor is not None
    for b in (1, 2):
        truth = traces[b].forward_backward_peak_bytes
        floored = fitted.forward_backward.predict(b)
        assert line.predict(b) <= floored <= truth * (1 + 1e-6), b
        if exact:
            assert floored == pytest.approx(truth, rel=1e-3), b
    assert line.predict(1) < traces[1].forward_backward_peak_bytes * 0.95
    # From 4 up the line alone holds: the floor changes nothing there.
    for b in (4, 8, 16):
        assert fitted.forward_backward.predict(b) == line.predict(b)
    # With accumulation priced from the gradients' bytes, the floor moves up with them.
    shift = fitted.forward_backward_accumulating.predict(1) - fitted.forward_backward.predict(1)
    assert fitted.accumulation_source == "gradient_bytes" and shift == fitted.gradient_bytes


def test_a_traced_smallest_size_or_no_windows_leaves_the_fit_as_it_is() -> None:
    workload = AdvisorWorkload("gpt-tiny")
    traces = [_trace(workload, "ops", b) for b in (1, 4, 8)]
    hinged = fit_memory(traces)
    assert hinged.forward_backward.floor == traces[0].forward_backward_peak_bytes
    two = fit_memory(traces[1:])
    assert floored_by_windows(dataclasses.replace(two.forward_backward, floor=None), ()) == (
        dataclasses.replace(two.forward_backward, floor=None)
    )
