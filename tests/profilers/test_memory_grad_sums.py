"""Autograd's in-place gradient sums, replayed in the fake trace (profilers/memory_grad_sums.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch._C._profiler import _EventType
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode

from profilers.memory_grad_sums import GradSumsInPlace
from profilers.memory_tracing import _StepMemTracker
from profilers.memory_truth import _walk


class _Running(TorchDispatchMode):
    """Runs every op and records it (what reaches the mode after the mixin's rewrite)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Any] = []
        self.recording = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if self.recording:
            self.ops.append(func)
        return func(*args, **(kwargs or {}))


class _Recorder(GradSumsInPlace, _Running):
    def calibrate_grad_sums(self) -> None:
        self.recording = False
        try:
            super().calibrate_grad_sums()
        finally:
            self.recording = True


def _tied(weight: torch.Tensor) -> torch.Tensor:
    # A tied embedding and head: the weight's two gradients meet in AccumulateGrad's buffer.
    ids = torch.zeros(2, 3, dtype=torch.long)
    hidden = torch.nn.functional.embedding(ids, weight)
    return (hidden @ weight.t()).sum()


def _twice(weight: torch.Tensor) -> torch.Tensor:
    # AddBackward hands the same gradient to both of its inputs: the sum is of one tensor twice.
    hidden = torch.ones(2, 8) @ weight
    return (hidden + hidden).sum()


class _AddInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 1

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad + grad.neg()  # an add inside a formula: a new tensor in any engine


def _formula(weight: torch.Tensor) -> torch.Tensor:
    return _AddInBackward.apply(weight).sum()


@contextlib.contextmanager
def _recording(*, calibrate: bool = True) -> Iterator[_Recorder]:
    with FakeTensorMode():
        recorder = _Recorder()
        with recorder:
            if calibrate:
                recorder.calibrate_grad_sums()
            yield recorder


def _backward(loss_of: Callable[[torch.Tensor], torch.Tensor], recorder: _Recorder) -> None:
    weight = torch.empty(8, 4, requires_grad=True)
    recorder.ops.clear()
    loss_of(weight).backward()


def test_calibration_reads_an_exclusive_gradient() -> None:
    with _recording() as recorder:
        assert recorder._sums_exclusive is not None
        assert min(recorder._sums_exclusive) >= 1


def test_a_tied_weight_is_summed_in_place() -> None:
    with _recording() as recorder:
        _backward(_tied, recorder)
    assert recorder.grad_sums_in_place == 1
    assert torch.ops.aten.add_.Tensor in recorder.ops
    assert torch.ops.aten.add.Tensor not in recorder.ops


@pytest.mark.parametrize("loss_of", [_twice, _formula], ids=["same-tensor", "formula-add"])
def test_other_adds_stay_out_of_place(loss_of: Callable[[torch.Tensor], torch.Tensor]) -> None:
    with _recording() as recorder:
        _backward(loss_of, recorder)
    assert recorder.grad_sums_in_place == 0
    assert torch.ops.aten.add.Tensor in recorder.ops


def test_without_calibration_nothing_is_rewritten() -> None:
    with _recording(calibrate=False) as recorder:
        _backward(_tied, recorder)
    assert recorder.grad_sums_in_place == 0
    assert torch.ops.aten.add.Tensor in recorder.ops


def _shared(weight: torch.Tensor) -> torch.Tensor:
    # One weight in two products: its two gradients (weight-sized, fresh) meet at the end of
    # backward, where everything else is small, so the step's peak is at their sum.
    return (torch.ones(2, 256) @ weight).sum() + (torch.ones(3, 256) @ weight).sum()


def _traced_peak(*, calibrate: bool) -> int:
    """Peak bytes of the storages the step creates, as MemTracker traces them (fake)."""
    with FakeTensorMode():
        weight = torch.nn.Parameter(torch.empty(256, 64))
        tracker = _StepMemTracker()
        if calibrate:
            with tracker:
                tracker.calibrate_grad_sums()
        with tracker:
            _shared(weight).backward()
            snapshot = tracker.get_tracker_snapshot("peak")
    return sum(device["Total"] for device in snapshot.values())


def _allocator_peak() -> int:
    """The same, measured by the CPU allocator on real tensors: its peak over the step, less
    the level before it. Everything is allocated and freed inside the profiled region: the
    profiler's count does not see frees of blocks it did not see allocated."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        weight = torch.nn.Parameter(torch.zeros(256, 64))
        with record_function("step"):
            _shared(weight).backward()
        del weight
    assert prof.profiler is not None and prof.profiler.kineto_results is not None
    events = list(_walk(prof.profiler.kineto_results.experimental_event_tree()))
    (window,) = [e for e in events if e.name == "step" and e.tag == _EventType.TorchOp]
    allocations = sorted(
        (e.start_time_ns, e.extra_fields.total_allocated)  # type: ignore[union-attr]
        for e in events
        if e.tag == _EventType.Allocation
    )
    before = max(total for t, total in allocations if t < window.start_time_ns)
    inside = [total for t, total in allocations if t >= window.start_time_ns]
    return max(inside) - before


def test_the_traced_peak_matches_the_allocator_where_it_falls_on_a_sum() -> None:
    traced, out_of_place, measured = (
        _traced_peak(calibrate=True),
        _traced_peak(calibrate=False),
        _allocator_peak(),
    )
    weight_bytes = 256 * 64 * 4
    # Small tensors (the products' outputs and their gradients) are released at slightly
    # different moments by the real and the fake engine: a few hundred bytes either way.
    assert abs(traced - measured) <= 1024
    # Summed out of place (as before) the trace read high by about one weight-sized buffer.
    assert out_of_place - measured >= weight_bytes - 4096
