"""The local validator's child: the CPU memory pass hands the profiler's freed heap back before
the next config and the timed steps (a child capped at the budget counts that heap)."""

from __future__ import annotations

import pytest

from advisor.validation import local
from profilers.workload import StepSpec
from tests.profilers.toy_workload import ToyWorkload


def test_the_cpu_memory_pass_releases_freed_memory_after_each_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    released: list[int] = []
    monkeypatch.setattr(local, "release_freed_memory", lambda: released.append(1))
    specs = [
        StepSpec(seq_len=32, micro_batch_size=2),
        StepSpec(seq_len=32, micro_batch_size=2, grad_accum_steps=4),
    ]
    out = local._memory_pass(ToyWorkload(), specs, "cpu")  # type: ignore[arg-type]
    assert [r["status"] for r in out] == ["ok", "ok"]
    assert len(released) == len(specs)
    # Four micro-batches hold what two do, plus the two others' inputs (2 int64 tensors each).
    assert out[1]["peak"] - out[0]["peak"] > 0


def test_releasing_freed_memory_is_safe_to_call() -> None:
    local.release_freed_memory()  # glibc: malloc_trim; elsewhere a no-op
    local.release_freed_memory()
