"""The local validator's child: the CPU memory pass hands the profiler's freed heap back before
the next config and the timed steps (a child capped at the budget counts that heap)."""

from __future__ import annotations

import pytest

from advisor.validation import local
from profilers.workload import StepSpec
from strategies.plan import Measurement
from strategies.prediction import Breakdown, MemoryTerms, Prediction
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


MIB = 2**20


def predicted(traced_mib: int, overhead_mib: int, budget_mib: int) -> Prediction:
    """A single-device prediction whose budgeted bytes are the traced peak + an overhead."""
    budgeted = (traced_mib + overhead_mib) * MIB
    memory = MemoryTerms(
        fitted_peak_bytes=traced_mib * MIB,
        phase="forward_backward",
        traced_bytes=traced_mib * MIB,
        rounding_allowance_bytes=0,
        fragmentation_bytes=0,
        fixed_overhead_bytes=overhead_mib * MIB,
        parallel_overhead_bytes=0,
        per_rank_bytes=budgeted,
        ranks_sharing_memory=1,
        budgeted_bytes=budgeted,
        budget_bytes=budget_mib * MIB,
        model_parameter_bytes=0,
        model_gradient_bytes=0,
        model_optimizer_state_bytes=0,
    )
    return Prediction(
        peak_memory_bytes=budgeted,
        budgeted_bytes=budgeted,
        budget_bytes=budget_mib * MIB,
        step_time_s=1.0,
        tokens_per_s=1.0,
        breakdown=Breakdown(memory=memory),
    )


def measured(peak_mib: int) -> Measurement:
    return Measurement(
        status="ok", step_time_s=1.0, tokens_per_s=1.0, peak_memory_bytes=peak_mib * MIB
    )


def test_the_cap_leaves_the_instrument_room_and_the_budget_is_judged_by_the_measured_peak() -> None:
    # The 10th regret session's memory-bound case: 1,122 MiB budget, 556 MiB of process overhead.
    validator = local.LocalValidator(device="cpu", budget_bytes=1122 * MIB)
    isolation = validator._isolation([predicted(536, 556, 1122)])
    assert isolation.memory_limit_bytes == int(1122 * MIB * (1 + local.CAP_HEADROOM))
    # 536 + 556 = 1,092 MiB fits (training held 1,085-1,097); 600 + 556 does not.
    fits = validator._within_budget(measured(536), predicted(536, 556, 1122))
    assert fits.ok
    over = validator._within_budget(measured(600), predicted(536, 556, 1122))
    assert over.status == "oom"
    assert over.reason == (
        "measured peak 600 MiB + the process overhead 556 MiB = 1,156 MiB, over the 1,122 MiB "
        "budget"
    )
    # Without a traced peak to read the overhead from, or off CPU, the measurement stands.
    assert validator._within_budget(
        measured(600),
        Prediction(
            peak_memory_bytes=1, budgeted_bytes=1, budget_bytes=1, step_time_s=1.0, tokens_per_s=1.0
        ),
    ).ok
    gpu = local.LocalValidator(device="cuda", budget_bytes=1122 * MIB)
    assert gpu._isolation([predicted(536, 556, 1122)]).memory_limit_bytes is None
    # On CUDA the measured peak is the whole footprint (reserved + context + workspaces):
    # judged against the budget as it is, with or without a traced peak.
    assert gpu._within_budget(measured(1122), predicted(536, 556, 1122)).ok
    over_gpu = gpu._within_budget(measured(1200), predicted(536, 556, 1122))
    assert over_gpu.status == "oom"
    assert over_gpu.reason == (
        "measured peak 1,200 MiB (reserved + CUDA context + workspaces), over the 1,122 MiB budget"
    )
    assert gpu._within_budget(measured(600), predicted(536, 556, 1122)).ok
