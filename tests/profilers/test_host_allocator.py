"""profilers.host_allocator: the timing children pin glibc malloc's thresholds on a CPU."""

from __future__ import annotations

import ctypes
import sys

import pytest

from profilers import host_allocator
from profilers.workload import StepSpec
from tests.profilers.toy_workload import ToyWorkload

GLIBC = sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt only")
def test_glibc_accepts_both_thresholds() -> None:
    assert host_allocator.steady_malloc() is True


def test_elsewhere_it_changes_nothing_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_allocator.sys, "platform", "darwin")
    assert host_allocator.steady_malloc() is False


class _FakeLibc:
    """A C library whose mallopt answers ``answer``; ``glibc=False``: no gnu_get_libc_version."""

    def __init__(self, answer: int, *, glibc: bool = True) -> None:
        self.calls: list[tuple[int, int]] = []
        self.answer = answer
        if glibc:
            self.gnu_get_libc_version = lambda: b"2.36"

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.answer


@pytest.mark.parametrize(
    "libc, expected",
    [(_FakeLibc(1), True), (_FakeLibc(0), False), (_FakeLibc(1, glibc=False), False)],
)
def test_only_a_glibc_that_accepts_both_reads_as_set(
    monkeypatch: pytest.MonkeyPatch, libc: _FakeLibc, expected: bool
) -> None:
    monkeypatch.setattr(host_allocator.sys, "platform", "linux")
    monkeypatch.setattr(host_allocator.ctypes, "CDLL", lambda _name: libc)
    assert host_allocator.steady_malloc() is expected
    if expected:  # both thresholds, the mmap one first: pinning it stops glibc adapting either
        assert libc.calls == [
            (host_allocator.M_MMAP_THRESHOLD, host_allocator.MMAP_THRESHOLD_BYTES),
            (host_allocator.M_TRIM_THRESHOLD, host_allocator.TRIM_THRESHOLD_BYTES),
        ]
    elif not hasattr(libc, "gnu_get_libc_version"):
        assert libc.calls == []  # musl's mallopt is a stub: not called


@pytest.mark.parametrize("device, pinned", [("cpu", True), ("cuda", False)])
def test_the_step_timing_children_pin_them_on_a_cpu_only(
    monkeypatch: pytest.MonkeyPatch, device: str, pinned: bool
) -> None:
    from profilers import phases_time, throughput

    calls: list[str] = []
    monkeypatch.setattr(host_allocator, "steady_malloc", lambda: calls.append("pinned") or True)
    # Stop each child right after its set-up: only whether it pinned the thresholds matters.
    stop = RuntimeError("stopped after set-up")

    def halt(*_args: object, **_kwargs: object) -> None:
        raise stop

    monkeypatch.setattr(phases_time, "_time_two_sizes", halt)
    monkeypatch.setattr(throughput, "measure_interleaved", halt)
    workload = ToyWorkload(d=16, layers=1, heads=2, max_len=16)
    spec = StepSpec(seq_len=8, micro_batch_size=1)
    with pytest.raises(RuntimeError, match="stopped"):
        phases_time._timing_child(workload, spec, 4, device, 30.0)
    with pytest.raises(RuntimeError, match="stopped"):
        throughput.interleaved_child(workload, [spec], device, 30.0, 1)
    assert calls == (["pinned", "pinned"] if pinned else [])
