"""The compile probe (profilers.phases_compile): the speed-up from steps timed side by side, the
cold compile time, and what it records when it cannot run (no C++ compiler, no budget)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from profilers.budget import SHARES
from profilers.compile_records import CompileMeasurement
from profilers.phases_compile import compile_phase, measurement_from_child, paired_speedups
from profilers.probe_run import ProbeRun, ProfileOptions
from profilers.throughput import StepTiming
from profilers.workload import StepSpec

SEQ = 32


def timing(micro: int, fb: tuple[float, ...], *, compiled: bool = False) -> StepTiming:
    return StepTiming(
        spec=StepSpec(seq_len=SEQ, micro_batch_size=micro, compile=compiled),
        device="cpu",
        num_warmup=1,
        forward_backward_s=fb,
        optimizer_s=(0.01,) * len(fb),
    )


def test_speedup_is_the_median_of_same_round_ratios_and_compile_the_first_step_excess() -> None:
    # Round 2 is slow for both (the host got busy): its pair's ratio is still ~2, where a
    # ratio of medians taken in different children would have compared the host's moods.
    timings = [
        timing(2, (0.20, 0.60, 0.22)),
        timing(2, (0.10, 0.30, 0.11), compiled=True),
        timing(8, (0.80, 0.82, 0.84)),
        timing(8, (0.64, 0.66, 0.70), compiled=True),
    ]
    assert paired_speedups(timings, 2) == pytest.approx([2.0, 2.0, 2.0])
    value: dict[str, Any] = {
        "first_step_s": [0.5, 20.3, 0.9, 15.0],
        "timings": [t.to_dict() for t in timings],
    }
    m = measurement_from_child("fp32", "none", value)
    assert m.ok and m.micro_batch_sizes == (2, 8)
    assert m.speedup_by_size == pytest.approx((2.0, 1.2424242), rel=1e-6)
    assert m.speedup == pytest.approx(statistics_median([2, 2, 2, 0.8 / 0.64, 0.82 / 0.66, 1.2]))
    # The compiled step's first step at b=2 minus the median eager step there (0.22 + 0.01).
    assert m.compile_s == pytest.approx(20.3 - 0.23)
    assert m.speedup_at(5) == pytest.approx((2.0 + 1.2424242) / 2, rel=1e-6)
    assert CompileMeasurement.from_dict(m.to_dict()) == m


def test_extra_bytes_are_compiled_minus_eager_per_size_and_need_every_peak() -> None:
    timings = [
        timing(2, (0.2,)),
        timing(2, (0.1,), compiled=True),
        timing(8, (0.8,)),
        timing(8, (0.6,), compiled=True),
    ]
    value: dict[str, Any] = {
        "first_step_s": [0.5, 20.0, 0.9, 15.0],
        "timings": [t.to_dict() for t in timings],
        "transient_bytes": [1000, 900, 4000, 4500],
    }
    assert measurement_from_child("fp32", "none", value).extra_bytes_by_size == (-100, 500)
    value["transient_bytes"] = [1000, None, 4000, 4500]  # the allocator could not say once
    assert measurement_from_child("fp32", "none", value).extra_bytes_by_size == ()
    del value["transient_bytes"]  # a child from before the measurement
    assert measurement_from_child("fp32", "none", value).extra_bytes_by_size == ()


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.slow
@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device"),
            ],
        ),
    ],
)
def test_the_compile_child_times_both_steps_and_measures_both_peaks(device: str) -> None:
    # The real child on a one-block toy: a cold compile at each size, interleaved timing, then
    # each step's forward+backward allocator peak (CPU: the profiler's memory events; CUDA:
    # the caching allocator's peak counter).
    from advisor.workload import AdvisorWorkload
    from profilers.compile_records import compile_unavailable
    from profilers.phases_compile import _compile_child

    if compile_unavailable(device):
        pytest.skip(compile_unavailable(device))
    args = {"n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": 128, "block_size": 16}
    workload = AdvisorWorkload(model="gpt-tiny", model_args=args)
    specs = [StepSpec(seq_len=16, micro_batch_size=b) for b in (1, 4)]
    value = _compile_child(workload, specs, device, 1.0)  # one round: the budget is spent
    m = measurement_from_child("fp32", "none", value)
    assert m.ok and m.micro_batch_sizes == (1, 4) and m.compile_s and m.compile_s > 0
    assert m.speedup is not None and m.speedup > 0
    peaks = value["transient_bytes"]
    assert len(peaks) == 4 and all(isinstance(p, int) and p > 0 for p in peaks)
    assert peaks[2] > peaks[0] and peaks[3] > peaks[1]  # b=4 holds more than b=1
    assert len(m.extra_bytes_by_size) == 2


def statistics_median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def core(groups: list[tuple[str, str]]) -> list[StepTiming]:
    return [
        StepTiming(
            spec=StepSpec(seq_len=SEQ, micro_batch_size=b, precision=p, activation_checkpointing=c),
            device="cpu",
            num_warmup=1,
            forward_backward_s=(0.1 * b,),
            optimizer_s=(0.01,),
        )
        for p, c in groups
        for b in (2, 8)
    ]


def run_with(budget_s: float) -> ProbeRun:
    # No child runs in these tests: the workload is never used.
    return ProbeRun(object(), ProfileOptions(seq_len=SEQ, budget_s=budget_s), None)  # type: ignore[arg-type]


def test_without_a_cpp_compiler_every_timed_group_is_unavailable_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    groups = [("fp32", "none"), ("fp32", "full")]
    run = run_with(600)
    found = compile_phase(run, [*groups, ("bf16", "none")], core(groups))
    assert [(m.group, m.status) for m in found] == [(g, "unavailable") for g in groups]
    assert all("needs a C++ compiler" in m.reason for m in found)
    assert [r.status for r in run.rows] == ["unsupported"]


def test_a_short_budget_skips_every_group_with_the_budget_that_would_cover_it() -> None:
    groups = [("fp32", "none"), ("bf16", "none")]
    run = run_with(60)
    assert compile_phase(run, groups, core(groups)) == []
    assert [r.name for r in run.rows] == ["fp32/none/compiled", "bf16/none/compiled"]
    for row in run.rows:
        assert row.status == "skipped" and row.probe == "compile"
        assert "time budget spent before compile was measured" in row.reason
        suggested = int(row.reason.rsplit("--budget-s ", 1)[1].split()[0])
        assert suggested > 60 and suggested % 30 == 0


def test_the_budget_shares_still_sum_to_one() -> None:
    assert sum(SHARES.values()) == pytest.approx(1.0)
    assert list(SHARES).index("compile") > list(SHARES).index("throughput")


def test_a_group_that_spends_the_share_leaves_the_next_a_budget_above_this_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first group's child takes the whole share (here: fails after it); the second is
    # skipped, and the budget its row names must cover what the first took plus its own need,
    # so it is above the budget this profile had (it once named the same --budget-s).
    import types

    from profilers import phases_compile
    from profilers.isolate import Outcome

    monkeypatch.setattr(phases_compile, "compile_unavailable", lambda device: None)
    now = [1000.0]
    monkeypatch.setattr(phases_compile, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    groups = [("fp32", "none"), ("fp32", "full")]
    run = run_with(900)
    share = run.clock.share("compile")

    def child(*args: Any, **kwargs: Any) -> Outcome:
        now[0] += share - 1.0
        return Outcome(status="timeout", reason="ran past its time", wall_s=share - 1.0)

    monkeypatch.setattr(run, "isolated", child)
    found = compile_phase(run, groups, core(groups))
    assert [(m.group, m.status) for m in found] == [(("fp32", "none"), "timeout")]
    skipped = [r for r in run.rows if r.status == "skipped"]
    assert [r.name for r in skipped] == ["fp32/full/compiled"]
    suggested = int(skipped[0].reason.rsplit("--budget-s ", 1)[1].split()[0])
    assert suggested > 900 and suggested % 30 == 0
