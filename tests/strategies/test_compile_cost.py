"""``compile`` in the cost model and the search: a compiled candidate is its eager prediction
over the measured speed-up, its compile time amortised over the run's steps; searched only
where the profile measured it; never assumed for a group or a what-if target it was not."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from profilers.compile_records import CompileMeasurement, amortised_step_s
from profilers.hardware import lookup_target
from profilers.profile_record import ProbeRow, Profile
from strategies.cost import cost_model_from_profile
from strategies.errors import Unpredictable
from strategies.search import evaluate, rank
from strategies.space import Candidate, SearchRequest, build_space
from tests.strategies import profiles as hp

SPEEDUP = {2: 1.5, 8: 1.1}  # eager / compiled forward+backward, per timed micro-batch size
COMPILE_S = 60.0


def measured(precision: str = "fp32", checkpointing: str = "none", **kw: Any) -> CompileMeasurement:
    fields: dict[str, Any] = dict(
        precision=precision,
        activation_checkpointing=checkpointing,
        status="ok",
        speedup=1.3,
        compile_s=COMPILE_S,
        micro_batch_sizes=tuple(SPEEDUP),
        speedup_by_size=tuple(SPEEDUP.values()),
    )
    return CompileMeasurement(**{**fields, **kw})


def compiled_profile(*records: CompileMeasurement) -> Profile:
    return dataclasses.replace(hp.hand_profile(), compile=records or (measured(),))


def candidate(**changes: Any) -> Candidate:
    fields: dict[str, Any] = dict(
        precision="fp32",
        activation_checkpointing="none",
        parallelism="single",
        world_size=1,
        micro_batch_size=8,
        grad_accum_steps=1,
    )
    return Candidate(**{**fields, **changes})


def test_forward_backward_is_divided_by_the_speedup_at_its_size_and_compile_amortised() -> None:
    cost = cost_model_from_profile(compiled_profile(), 0.9, run_steps=300)
    for micro, speedup in [(2, 1.5), (8, 1.1), (5, 1.3), (1, 1.5)]:  # between: linear in b
        eager = cost.predict(candidate(micro_batch_size=micro, grad_accum_steps=8 // micro))
        compiled = cost.predict(
            candidate(micro_batch_size=micro, grad_accum_steps=8 // micro, compile=True)
        )
        e, c = eager.breakdown.time, compiled.breakdown.time
        assert e is not None and c is not None
        assert c.forward_backward_s == pytest.approx(e.forward_backward_s / speedup, rel=1e-9)
        assert c.optimizer_s == pytest.approx(e.optimizer_s)  # the optimizer is not compiled
        assert compiled.compile_s == COMPILE_S
        assert compiled.amortised_step_time_s == pytest.approx(
            compiled.step_time_s + COMPILE_S / 300
        )
        assert eager.amortised_step_time_s == eager.step_time_s
    assert compiled.to_dict()["amortised_step_time_s"] == compiled.amortised_step_time_s
    assert "compile_s" not in eager.to_dict()


def test_a_short_run_does_not_recoup_the_compile_a_long_one_does() -> None:
    def best(steps: int) -> Candidate:
        cost = cost_model_from_profile(compiled_profile(), 0.9, run_steps=steps)
        pair = [evaluate(cost, candidate(compile=c)) for c in (False, True)]
        return rank(pair)[0].candidate

    assert best(300).compile is False  # 60 s over 300 steps outweighs what each step saves
    assert best(100_000).compile is True


def test_unmeasured_or_failed_groups_are_unpredictable_with_the_reason() -> None:
    failed = measured(
        "fp32", "full", status="error", reason="Unsupported: data-dependent", speedup=None
    )
    cost = cost_model_from_profile(compiled_profile(measured(), failed), 0.9)
    with pytest.raises(Unpredictable, match=r"did not measure torch.compile for bf16/none"):
        cost.predict(candidate(precision="bf16", compile=True))
    with pytest.raises(Unpredictable, match=r"error: Unsupported: data-dependent\): use --no"):
        cost.predict(candidate(activation_checkpointing="full", compile=True))


def test_the_search_turns_compile_on_only_where_measured() -> None:
    request = SearchRequest(global_batch_size=8, world_size=1)
    space = build_space(compiled_profile(), request)
    assert space.compile == (False, True)
    assert {c.compile for c in space.candidates()} == {False, True}
    assert len(space.candidates()) == space.size
    # An old profile (no compile records, no compile rows): eager only, nothing to explain.
    old = build_space(hp.hand_profile(), request)
    assert old.compile == (False,)
    assert not any("compile" in e for e in old.excluded)
    # Skipped for the budget: eager only, the row's reason in the plan's reasons.
    row = ProbeRow(
        probe="compile",
        name="fp32/none/compiled",
        status="skipped",
        reason="time budget spent; --budget-s 300 would cover it",
    )
    skipped = dataclasses.replace(hp.hand_profile(), probes=(row,))
    space = build_space(skipped, request)
    assert space.compile == (False,)
    assert "compile: time budget spent; --budget-s 300 would cover it" in space.excluded


def test_no_compiler_makes_the_dimension_unavailable_with_the_reason() -> None:
    why = "torch.compile on CPU needs a C++ compiler"
    profile = compiled_profile(
        CompileMeasurement(
            precision="fp32", activation_checkpointing="none", status="unavailable", reason=why
        )
    )
    space = build_space(profile, SearchRequest(global_batch_size=8, world_size=1))
    assert space.compile == (False,)
    assert f"compile: {why}" in space.excluded


def test_a_what_if_never_assumes_the_speedup() -> None:
    from strategies.whatif import whatif_cost_model

    request = SearchRequest(global_batch_size=8, world_size=8, target="h100-80gb")
    space = build_space(compiled_profile(), request, target=lookup_target("h100-80gb"))
    assert space.compile == (False,)
    assert any("torchtitan" in e for e in space.excluded)
    model, _ = whatif_cost_model(compiled_profile(), request)
    with pytest.raises(Unpredictable, match="no measured speed-up on a what-if target"):
        model.predict(candidate(parallelism="ddp", world_size=8, micro_batch_size=1, compile=True))


def test_records_round_trip_and_old_profiles_read_as_not_measured() -> None:
    profile = compiled_profile()
    again = Profile.from_dict(profile.to_dict())
    assert again.compile == profile.compile
    data = profile.to_dict()
    del data["compile"]
    assert Profile.from_dict(data).compile == ()
    assert amortised_step_s(0.5, 60.0, 300) == pytest.approx(0.7)


def test_the_compiled_steps_measured_extra_memory_is_added_and_a_saving_is_not_counted() -> None:
    mib = 2**20
    eager_cost = cost_model_from_profile(compiled_profile(), 0.9)
    eager = eager_cost.predict(candidate(compile=False)).breakdown.memory
    unmeasured = eager_cost.predict(candidate(compile=True))
    assert unmeasured.breakdown.memory is not None and eager is not None
    # Profiles from before the measurement: the eager trace, and the prediction says so.
    assert unmeasured.breakdown.memory.traced_bytes == eager.traced_bytes
    assert unmeasured.breakdown.memory.compile_extra_bytes is None
    assert any("did not measure the compiled step" in a for a in unmeasured.breakdown.assumptions)

    # +1 MiB at b=2, +4 MiB at b=8: 0.5 MiB per sample beyond b=2, extended past b=8.
    grows = cost_model_from_profile(
        compiled_profile(measured(extra_bytes_by_size=(1 * mib, 4 * mib))), 0.9
    )
    for micro, extra in [(2, 1 * mib), (8, 4 * mib), (4, 2 * mib), (16, 8 * mib)]:
        p = grows.predict(
            candidate(micro_batch_size=micro, grad_accum_steps=max(8 // micro, 1), compile=True)
        )
        e = eager_cost.predict(
            candidate(micro_batch_size=micro, grad_accum_steps=max(8 // micro, 1))
        )
        assert p.breakdown.memory is not None and e.breakdown.memory is not None
        assert p.breakdown.memory.compile_extra_bytes == extra
        assert p.breakdown.memory.traced_bytes == e.breakdown.memory.traced_bytes + extra
        assert p.peak_memory_bytes > e.peak_memory_bytes
    said = grows.predict(candidate(compile=True))
    assert any("+1.0 MiB at b=2, +4.0 MiB at b=8" in a for a in said.breakdown.assumptions)
    assert said.to_dict()["breakdown"]["memory"]["compile_extra_bytes"] == 4 * mib

    # Inductor's partitioner saved memory: measured, reported, not counted on.
    saves = cost_model_from_profile(
        compiled_profile(measured(extra_bytes_by_size=(-1 * mib, -4 * mib))), 0.9
    )
    s = saves.predict(candidate(compile=True))
    assert s.breakdown.memory is not None
    assert s.breakdown.memory.compile_extra_bytes == 0
    assert s.breakdown.memory.traced_bytes == eager.traced_bytes
    assert any("a saving is not counted on" in a for a in s.breakdown.assumptions)


def test_extra_bytes_line_clamps_at_zero_and_round_trips() -> None:
    m = measured(extra_bytes_by_size=(-2_000, 6_000))  # sizes 2 and 8: 1333.3 B per sample
    assert m.extra_bytes_at(2) == 0 and m.extra_bytes_at(8) == 6_000
    assert m.extra_bytes_at(5) == 2_000 and m.extra_bytes_at(1) == 0
    assert CompileMeasurement.from_dict(m.to_dict()) == m
    assert measured().extra_bytes_at(4) is None  # not measured
    old = measured().to_dict()
    del old["extra_bytes_by_size"]
    assert CompileMeasurement.from_dict(old).extra_bytes_by_size == ()


def test_a_compiled_prediction_carries_the_speedups_uncertainty_and_a_ranks_assumption() -> None:
    from strategies.uncertainty import COMPILE_BETWEEN_CHILDREN, COMPILE_ON_RANKS

    def terms(record: CompileMeasurement, **changes: Any) -> dict[str, tuple[float, str]]:
        cost = cost_model_from_profile(compiled_profile(record), 0.9)
        p = cost.predict(candidate(compile=True, **changes))
        assert p.uncertainty is not None
        return {name: (sigma, text) for name, sigma, text in p.uncertainty.terms}

    eager = cost_model_from_profile(compiled_profile(), 0.9).predict(candidate())
    assert eager.uncertainty is not None
    assert "compile" not in {name for name, _, _ in eager.uncertainty.terms}
    # A quiet child: the between-children scatter, scaled by the forward+backward's share.
    quiet = terms(measured(speedup_log_sd=0.02, pairs_per_size=3))
    sigma, text = quiet["compile"]
    assert 0 < sigma <= COMPILE_BETWEEN_CHILDREN and "1.10×" in text and "3 pairs" in text
    # A noisy child: its own standard error, 0.3 / sqrt(3).
    noisy = terms(measured(speedup_log_sd=0.3, pairs_per_size=3))
    assert noisy["compile"][0] > COMPILE_BETWEEN_CHILDREN
    assert noisy["compile"][0] == pytest.approx(sigma * (0.3 / 3**0.5) / COMPILE_BETWEEN_CHILDREN)
    # An older record without the spread: the between-children part alone.
    assert terms(measured())["compile"][0] == pytest.approx(sigma)
    # On a rank: the single device's speed-up is assumed to hold, and said so.
    ranked = terms(measured(), parallelism="ddp", world_size=2, micro_batch_size=4)
    assert ranked["source"] == (COMPILE_ON_RANKS, ranked["source"][1])
    assert "applied to a ddp/fsdp rank" in ranked["source"][1]


def test_the_childs_ratio_scatter_is_pooled_about_each_sizes_median() -> None:
    import math

    from profilers.phases_compile import ratio_log_sd

    assert ratio_log_sd([[1.2], [1.1]]) is None  # no pair to spare
    # Logs about the medians: (+a, 0, -a) at one size, (0, 0) at the other: 3 dof, ss = 2a².
    a = math.log(1.1)
    assert ratio_log_sd([[1.1 * 1.1, 1.1, 1.0], [1.5, 1.5]]) == pytest.approx(
        math.sqrt(2 * a * a / 3)
    )
