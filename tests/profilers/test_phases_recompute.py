"""The profiler's recompute phase: the checkpointed groups the core traced but had no time to
time are timed beside their plain step in one child, and priced as the plain fit plus that
same-child delta instead of the counted FLOPs ratio."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from profilers.fit import AffineFit
from profilers.phases_recompute import recompute_phase, untimed_groups
from profilers.probe_run import ProbeRun, ProfileOptions
from profilers.throughput import StepTiming, TimeModel, delta_time_model
from profilers.workload import StepSpec


def _plain(precision: str = "fp32", **changes: Any) -> TimeModel:
    model = TimeModel(
        precision=precision,
        activation_checkpointing="none",
        seq_len=64,
        parallelism="single",
        world_size=1,
        device="cpu",
        forward_backward=AffineFit(intercept=0.0, slope=0.2, xs=(1.0, 2.0), ys=(0.2, 0.4)),
        optimizer_s=0.001,
    )
    return dataclasses.replace(model, **changes)


def _traced(precision: str, setting: str, *sizes: int, **extra: Any) -> list[Any]:
    return [
        SimpleNamespace(
            spec=StepSpec(
                seq_len=64,
                micro_batch_size=b,
                precision=precision,
                activation_checkpointing=setting,
                **extra,
            )
        )
        for b in sizes
    ]


def _timing(b: int, setting: str, fb: tuple[float, ...]) -> StepTiming:
    return StepTiming(
        spec=StepSpec(seq_len=64, micro_batch_size=b, activation_checkpointing=setting),
        device="cpu",
        num_warmup=1,
        forward_backward_s=fb,
        optimizer_s=tuple(0.01 for _ in fb),
    )


def test_untimed_groups_are_the_skipped_checkpointed_ones_a_plan_can_price() -> None:
    traces = [
        *_traced("fp32", "full", 2, 4),
        *_traced("fp32", "ops", 2, 4),
        *_traced("fp32", "ops-half", 2),  # one size: no memory fit
        *_traced("bf16", "full", 2, 4),  # its precision's plain step was not timed
        *_traced("fp32", "blocks:2", 2, 4, grad_accum_steps=2),  # accumulating: not a fit
    ]
    skipped = [
        ("fp32", "ops"),
        ("fp32", "full"),
        ("fp32", "ops-half"),
        ("bf16", "full"),
        ("fp32", "blocks:2"),
    ]
    timed = [_plain(), _plain("fp16")]
    # The core's priority order is kept (ops before full here, as given).
    assert untimed_groups(skipped, timed, traces) == [("fp32", "ops"), ("fp32", "full")]
    # A plain fit that is itself a delta, a rank's, or the chunked loss's is no base.
    for other in (
        _plain(delta_from="full"),
        _plain(parallelism="ddp", world_size=2),
        _plain(loss_chunks=4),
    ):
        assert untimed_groups(skipped, [other], traces) == []


def test_delta_model_is_the_plain_fit_plus_the_same_child_difference() -> None:
    plain = _plain()  # 0.2 s per sequence
    base = [_timing(1, "none", (0.30, 0.32, 0.31)), _timing(2, "none", (0.50, 0.52))]
    full = [_timing(1, "full", (0.40, 0.41, 0.42)), _timing(2, "full", (0.70, 0.71))]
    model = delta_time_model(plain, base, full)
    # Medians: +0.10 at b=1, +0.195 at b=2 -> delta 0.005 + 0.095 b on top of 0.2 b.
    assert model.forward_backward.predict(1) == pytest.approx(0.2 + 0.10)
    assert model.forward_backward.predict(4) == pytest.approx(0.8 + 0.005 + 0.095 * 4)
    assert model.split_ratio is None and model.split_threads == 0
    # A recompute's delta measured below zero at a size (noise) counts as zero there.
    faster = [_timing(1, "full", (0.25,)), _timing(2, "full", (0.70,))]
    floored = delta_time_model(plain, base, faster, non_negative=True)
    assert floored.forward_backward.predict(1) == pytest.approx(0.2)
    assert floored.forward_backward.predict(2) == pytest.approx(0.4 + 0.19)
    assert delta_time_model(plain, base, faster).forward_backward.predict(1) < 0.2
    with pytest.raises(ValueError, match="two sizes"):
        delta_time_model(plain, base[:1], full[:1])


def test_delta_from_round_trips_and_older_records_read_as_fitted() -> None:
    model = dataclasses.replace(_plain(), activation_checkpointing="full", delta_from="none")
    data = model.to_dict()
    assert TimeModel.from_dict(data) == model
    assert "delta_from" not in _plain().to_dict()  # unchanged records for fitted groups
    assert TimeModel.from_dict(_plain().to_dict()).delta_from == ""


def _run(budget_s: float) -> tuple[ProbeRun, Any]:
    from advisor.workload import AdvisorWorkload

    workload = AdvisorWorkload("gpt-tiny", {"n_layer": 2, "n_embd": 64})
    options = ProfileOptions(seq_len=64, budget_s=budget_s, trace_micro_batch_sizes=(1, 2, 4))
    return ProbeRun(workload, options, None), workload


CORE_TIMINGS = [_timing(1, "none", (0.02, 0.02)), _timing(2, "none", (0.03, 0.03))]
SKIPPED = [("fp32", "full"), ("fp32", "ops")]
TRACES = [*_traced("fp32", "full", 2, 4), *_traced("fp32", "ops", 2, 4)]


@pytest.mark.slow  # one timing child of six steps per round: ~10-20 s on two shared cores
def test_phase_times_each_group_beside_the_plain_step() -> None:
    run, _ = _run(budget_s=600)
    result = recompute_phase(run, SKIPPED, CORE_TIMINGS, [_plain()], TRACES)
    assert [(m.activation_checkpointing, m.delta_from) for m in result.time_models] == [
        ("full", "none"),
        ("ops", "none"),
    ]
    # Every timing of the child, the plain steps beside them too (re-derivable from the file).
    assert sorted(
        (t.spec.activation_checkpointing, t.spec.micro_batch_size) for t in result.timings
    ) == [("full", 1), ("full", 2), ("none", 1), ("none", 2), ("ops", 1), ("ops", 2)]
    rows = [r for r in run.rows if "recompute delta" in (r.reason or "")]
    assert len(rows) == 6 and all(r.status == "ok" for r in rows)  # none, full, ops x 2 sizes


def test_groups_the_share_cannot_cover_get_a_row_and_keep_the_derivation() -> None:
    run, _ = _run(budget_s=1)  # no room for a child: nothing runs
    result = recompute_phase(run, SKIPPED, CORE_TIMINGS, [_plain()], TRACES)
    assert result.time_models == [] and result.timings == []
    skipped = [r for r in run.rows if r.status == "skipped"]
    assert [r.name for r in skipped] == ["fp32/full recompute", "fp32/ops recompute"]
    assert all("a larger --budget-s times it" in (r.reason or "") for r in skipped)


def test_the_delta_carries_its_own_standard_error_from_paired_rounds() -> None:
    """Round i of a side-by-side child times every group once, so the i-th samples pair up;
    the delta's standard error is their differences' over the step, the larger size's."""
    import math
    import statistics

    plain = _plain()
    base = [_timing(1, "none", (0.30, 0.32, 0.31)), _timing(2, "none", (0.50, 0.60, 0.55))]
    full = [_timing(1, "full", (0.40, 0.41, 0.42)), _timing(2, "full", (0.70, 0.62, 0.75))]
    model = delta_time_model(plain, base, full)
    small = statistics.stdev([0.10, 0.09, 0.11]) / math.sqrt(3) / model.forward_backward.predict(1)
    large = statistics.stdev([0.20, 0.02, 0.20]) / math.sqrt(3) / model.forward_backward.predict(2)
    assert large > small
    assert model.delta_sd == pytest.approx(large)
    # The same samples in another order within each size pair differently: read as paired.
    shuffled = [_timing(1, "full", (0.40, 0.41, 0.42)), _timing(2, "full", (0.62, 0.70, 0.75))]
    assert delta_time_model(plain, base, shuffled).delta_sd != pytest.approx(large)
    # One round at a size: no spread to read, so no error is claimed.
    single = [_timing(1, "full", (0.40,)), _timing(2, "full", (0.70, 0.62, 0.75))]
    assert delta_time_model(plain, base, single).delta_sd is None
    # Written only when known; read back as it was; a fitted group has none.
    assert TimeModel.from_dict(model.to_dict()) == model
    assert "delta_sd" not in _plain().to_dict() and _plain().delta_sd is None
