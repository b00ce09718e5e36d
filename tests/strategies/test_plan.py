"""The decision: measured beats predicted, unvalidated never wins silently, baseline, files."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from strategies.config import TrainConfig
from strategies.cost import CostModel, cost_model_from_profile
from strategies.errors import NothingFits, StrategyError
from strategies.plan import (
    TRIAL_COLUMNS,
    Measurement,
    Plan,
    decide,
    naive_baseline,
    replacement,
    top_candidates,
)
from strategies.search import Evaluation, SearchResult, evaluate
from strategies.space import SearchRequest, SearchSpace, build_space
from tests.strategies.profiles import MB, SEQ_LEN, GiB, hand_profile, priced, searched

BASE = TrainConfig(model="gpt-tiny", seq_len=SEQ_LEN)


def _result(space: SearchSpace, model: CostModel) -> SearchResult:
    evaluations = tuple(evaluate(model, c) for c in space.candidates())
    return SearchResult(
        mode="enumerate",
        space_size=space.size,
        trial_budget=space.size,
        evaluations=evaluations,
        study_name="s",
        storage="sqlite:///x.db",
        trials_before=0,
        trials_told=space.size,
        wall_s=0.0,
        notes=("enumerated exhaustively",),
    )


def _plan(
    model: CostModel, global_batch: int, measurements: dict | None = None, world_size: int = 1
) -> Plan:
    profile = hand_profile()
    space = build_space(
        profile, SearchRequest(global_batch_size=global_batch, world_size=world_size)
    )
    result = _result(space, model)
    return decide(
        base=BASE,
        model=model,
        space=space,
        result=result,
        measurements=measurements or {},
        baseline=naive_baseline(model, global_batch),
    )


def ok(tokens_per_s: float) -> Measurement:
    return Measurement(
        status="ok", step_time_s=1.0, tokens_per_s=tokens_per_s, peak_memory_bytes=10 * MB
    )


def test_without_validation_the_best_prediction_wins_and_says_so(model: CostModel) -> None:
    plan = _plan(model, 16)
    assert plan.measured is None
    assert plan.config.global_batch_size == 16
    assert plan.predicted.tokens_per_s == max(
        e.tokens_per_s for e in plan.evaluations if e.feasible
    )
    assert any("not validated: no candidate was validated" in r for r in plan.reasons)


def test_the_best_measured_candidate_wins_over_the_best_predicted(model: CostModel) -> None:
    ranked = _plan(model, 16).evaluations
    ordered = sorted((e for e in ranked if e.feasible), key=lambda e: -e.tokens_per_s)
    first, second = ordered[0].candidate, ordered[1].candidate
    plan = _plan(model, 16, {first.key: ok(100.0), second.key: ok(200.0)})
    assert plan.candidate == second
    assert plan.measured is not None and plan.measured.tokens_per_s == 200.0
    assert any("measured slower than the chosen one" in r for r in plan.reasons)
    validated = {v.candidate.key: v for v in plan.validated}
    assert validated[second.key].time_error == pytest.approx(plan.predicted.step_time_s / 1.0 - 1)


def test_a_knob_alternative_that_was_measured_too_is_compared_by_its_measurement(
    model: CostModel,
) -> None:
    """The per-knob reasons compared predictions only: a measured winner beside a measured
    alternative read "1.00× the chosen config" where the runs said 0.58× (gpt-tiny, mb 8×1 vs
    4×2, both predicted alike). Both figures are said when both were measured."""
    ranked = _plan(model, 16).evaluations
    ordered = sorted((e for e in ranked if e.feasible), key=lambda e: -e.tokens_per_s)
    first = ordered[0]
    # the best alternative of the batch split, all other knobs equal
    other = next(
        e
        for e in ordered[1:]
        if e.candidate.micro_batch_size != first.candidate.micro_batch_size
        and (e.candidate.precision, e.candidate.activation_checkpointing, e.candidate.layout)
        == (
            first.candidate.precision,
            first.candidate.activation_checkpointing,
            first.candidate.layout,
        )
    )
    plan = _plan(model, 16, {first.candidate.key: ok(200.0), other.candidate.key: ok(116.0)})
    assert plan.candidate == first.candidate
    line = next(r for r in plan.reasons if r.startswith("micro-batch/accumulation"))
    assert line.endswith(
        "the chosen config; measured 116 tok/s, 0.58× the chosen config's 200 tok/s"
    ), line
    unmeasured = _plan(model, 16, {first.candidate.key: ok(200.0)})
    line = next(r for r in unmeasured.reasons if r.startswith("micro-batch/accumulation"))
    assert line.endswith("the chosen config"), line


def test_an_unvalidated_candidate_never_beats_a_measured_one_silently() -> None:
    gpu = cost_model_from_profile(hand_profile(kind="cuda"), 0.9)
    plan = _plan(gpu, 16, world_size=2)
    best = plan.candidate
    # Suppose the best predicted is distributed and cannot be measured yet.
    if best.parallelism == "single":
        pytest.skip("the hand-made GPU profile predicts single fastest")
    single = next(
        e
        for e in sorted(plan.evaluations, key=lambda e: -e.tokens_per_s)
        if e.feasible and e.candidate.parallelism == "single"
    )
    measurements = {
        best.key: Measurement(status="not_validated", reason="needs the distributed launcher"),
        single.candidate.key: ok(50.0),
    }
    decided = _plan(gpu, 16, measurements, world_size=2)
    assert decided.candidate == single.candidate
    assert any(
        "not validated (not_validated: needs the distributed launcher) and is predicted faster" in r
        for r in decided.reasons
    )


def test_a_baseline_that_cannot_be_priced_says_so_apart_from_one_that_does_not_fit() -> None:
    no_fp32 = cost_model_from_profile(hand_profile(precisions=("bf16",)), 0.9)
    baseline = naive_baseline(no_fp32, 8)
    assert baseline.candidate is None
    assert baseline.reason.startswith("the naive fp32 loop could not be priced (")
    tiny = cost_model_from_profile(hand_profile(memory_bytes=2**20), 0.9)
    baseline = naive_baseline(tiny, 8)
    assert baseline.candidate is None
    assert baseline.reason.startswith("the naive fp32 loop does not fit at any accumulation (")


def test_the_baseline_is_the_naive_loop_with_the_smallest_accumulation_that_fits() -> None:
    roomy = cost_model_from_profile(hand_profile(), 0.9)
    baseline = naive_baseline(roomy, 32)
    assert baseline.candidate is not None
    assert (baseline.candidate.micro_batch_size, baseline.candidate.grad_accum_steps) == (32, 1)
    # 32 sequences x 10 MB of activations do not fit in 0.9 x 256 MB; 8 x 10 MB do.
    tight = cost_model_from_profile(hand_profile(memory_bytes=256 * 2**20), 0.9)
    baseline = naive_baseline(tight, 32)
    assert baseline.candidate is not None
    assert baseline.candidate.precision == "fp32"
    assert baseline.candidate.activation_checkpointing == "none"
    assert baseline.candidate.grad_accum_steps > 1
    assert "smallest that fits" in baseline.reason
    plan = _plan(tight, 32)
    assert plan.baseline is not None
    assert plan.baseline.expected_speedup == pytest.approx(
        plan.predicted.tokens_per_s / baseline.predicted.tokens_per_s  # type: ignore[union-attr]
    )


def test_a_tight_budget_leads_to_accumulation_or_checkpointing_not_failure() -> None:
    for memory in (128 * 2**20, 64 * 2**20, 40 * 2**20):
        tight = cost_model_from_profile(hand_profile(memory_bytes=memory), 0.9)
        plan = _plan(tight, 32)
        chosen = plan.candidate
        assert chosen.grad_accum_steps > 1 or chosen.activation_checkpointing == "full"
        assert plan.predicted.budgeted_bytes <= plan.predicted.budget_bytes
    # 40 MiB: micro-batch 4 fits only with checkpointing, and checkpointing one block of the
    # four (blocks:1) is the least recompute that leaves room; full would recompute all four.
    chosen = plan.candidate
    assert (chosen.micro_batch_size, chosen.activation_checkpointing) == (4, "blocks:1")


def test_nothing_fits_names_the_smallest_need_and_a_knob() -> None:
    tiny = cost_model_from_profile(hand_profile(memory_bytes=16 * 2**20), 0.9)
    with pytest.raises(NothingFits) as info:
        _plan(tiny, 8)
    message = str(info.value)
    # Under 1 GiB in MiB: "0.01 GiB (0.9 × 0.02 GiB)" said little.
    assert message.startswith("nothing fits the memory budget of 14.40 MiB (0.9 × 16.00 MiB")
    assert (
        "the smallest candidate (fp32, full checkpointing, single, micro-batch 1 × 8 "
        "accumulation) needs 19.07 MiB" in message
    )
    # Parameters, gradients and Adam state dominate; CPU ranks share the host's RAM.
    assert message.endswith("try a smaller model or more RAM: CPU ranks share one host's memory")
    assert info.value.smallest_bytes > info.value.budget_bytes
    # On GPUs the same need is answered by sharding, and a budget below the need by raising it.
    gpu = cost_model_from_profile(hand_profile(kind="cuda", memory_bytes=24 * 2**20), 0.5)
    with pytest.raises(
        NothingFits,
        match=r"a larger --memory-budget \(at least 0\.\d+\), or "
        "fsdp over more devices",
    ):
        _plan(gpu, 8)


def test_nothing_fits_says_which_checkpointed_candidates_went_unpriced() -> None:
    """A profile whose budget traced no checkpointing only (Qwen3.5-9B's default one): the
    error names the unpriced full-checkpointing candidates and the profile that prices them,
    not only hardware; with full priced (and not fitting either) it says nothing of them."""
    traced_none = hand_profile(kind="cuda", memory_bytes=24 * 2**20, checkpointing=("none",))
    with pytest.raises(NothingFits) as info:
        _plan(cost_model_from_profile(traced_none, 0.5), 8)
    message = str(info.value)
    assert "(and " in message and "candidates with other checkpointing were not priced" in message
    # the example: full checkpointing at the smallest candidate's precision (bf16 here)
    assert "e.g. bf16, full checkpointing" in message
    assert "no memory fit for bf16 with full checkpointing" in message
    both = hand_profile(kind="cuda", memory_bytes=24 * 2**20)
    with pytest.raises(NothingFits) as info:
        _plan(cost_model_from_profile(both, 0.5), 8)
    assert "not priced" not in str(info.value)


def test_a_model_that_fits_nowhere_here_points_at_a_what_if_not_at_missing_fits() -> None:
    """A 70B model on a 24 GiB host: the profile traced it but timed nothing (no step fits),
    so no candidate has a time fit; the error says why and names --target."""
    import dataclasses

    profile = hand_profile(memory_bytes=16 * 2**20)
    profile = dataclasses.replace(profile, fits=dataclasses.replace(profile.fits, time=()))
    model = cost_model_from_profile(profile, 0.9)
    with pytest.raises(StrategyError) as info:
        _plan(model, 8)
    message = str(info.value)
    assert message.startswith("the model does not fit this device: its least traced step needs")
    assert "--target" in message and "timed nothing" in message


def test_plan_round_trips_and_writes_plan_json_and_trials_csv(
    tmp_path: Path, model: CostModel
) -> None:
    plan = _plan(model, 8)
    plan_path, trials_path = plan.save(tmp_path)
    data = json.loads(plan_path.read_text())
    for key in (
        "config",
        "predicted",
        "measured",
        "baseline",
        "reasons",
        "validated",
        "alternatives",
        "search",
        "estimate",
    ):
        assert key in data
    for key in ("peak_memory_bytes", "step_time_s", "tokens_per_s", "breakdown"):
        assert key in data["predicted"]
    assert TrainConfig.from_dict(data["config"]) == plan.config
    again = Plan.from_dict(data)
    assert again.config == plan.config and again.reasons == plan.reasons
    rows = list(csv.DictReader(trials_path.open()))
    assert list(rows[0]) == list(TRIAL_COLUMNS)
    assert len(rows) == len(plan.evaluations)
    assert sum(r["chosen"] == "True" for r in rows) == 1
    assert all(
        int(r["micro_batch_size"]) * int(r["grad_accum_steps"]) * int(r["world_size"]) == 8
        for r in rows
    )


def test_budget_is_a_fraction_of_available_ram_on_cpu() -> None:
    model = cost_model_from_profile(hand_profile(memory_bytes=10 * GiB), 0.5)
    assert model.budget_bytes == 5 * GiB


def test_finalists_include_the_best_of_a_layout_the_top_k_left_out_when_close() -> None:
    """Top 3 all distributed; the best single config, 10% behind, is validated too; the best
    fsdp one, 20% behind, is not (outside the 15% margin); k=0 validates nothing."""
    result = searched(
        priced("ddp", 4, 1000.0),
        priced("ddp", 2, 980.0),
        priced("ddp", 1, 950.0),
        priced("single", 8, 900.0),
        priced("single", 4, 890.0),
        priced("fsdp", 4, 800.0),
    )
    top = top_candidates(result, 3)
    assert [(e.candidate.parallelism, e.candidate.micro_batch_size) for e in top] == [
        ("ddp", 4), ("ddp", 2), ("ddp", 1), ("single", 8),
    ]  # fmt: skip
    assert len(top_candidates(result, 3, layout_margin=0.25)) == 5
    assert len(top_candidates(result, 3, layout_margin=0.0)) == 3
    assert top_candidates(result, 0) == []
    assert [e.candidate.micro_batch_size for e in top_candidates(result, 1)] == [4, 8]


def test_a_candidate_that_ran_out_of_memory_is_not_chosen_when_nothing_validated(
    model: CostModel,
) -> None:
    ranked = sorted(
        (e for e in _plan(model, 16).evaluations if e.feasible), key=lambda e: -e.tokens_per_s
    )
    first, second, third = (e.candidate for e in ranked[:3])
    oom = Measurement(status="oom", reason="RuntimeError: DefaultCPUAllocator: can't allocate")
    plan = _plan(model, 16, {first.key: oom, second.key: oom})
    assert plan.candidate == third and plan.measured is None
    assert any("ran out of memory when validated" in r for r in plan.reasons)
    assert any("not validated: no candidate was validated" in r for r in plan.reasons)
    # A failure that says nothing about memory does not refute the prediction.
    crashed = Measurement(status="error", reason="the child process did not start")
    assert _plan(model, 16, {first.key: crashed}).candidate == first
    # Every fitting candidate out of memory: still a plan (the best prediction), said so.
    every = {e.candidate.key: oom for e in ranked}
    assert _plan(model, 16, every).candidate == first


def _needing(layout: str, micro: int, tokens_per_s: float, budgeted: int) -> Evaluation:
    e = priced(layout, micro, tokens_per_s)
    assert e.prediction is not None
    prediction = dataclasses.replace(e.prediction, budgeted_bytes=budgeted)
    return dataclasses.replace(e, prediction=prediction)


def test_a_failed_finalist_is_replaced_by_the_next_ranked_one_not_taken() -> None:
    """After running out of memory, the replacement must be predicted to need less than the
    config that did, of the same layout while one is left, else of any; after a crash or a
    timeout, the next ranked of any layout. Taken keys are skipped."""
    big, same, small, smaller, smallest = (
        _needing("single", 8, 1000.0, 900),
        _needing("single", 4, 950.0, 900),
        _needing("ddp", 4, 900.0, 600),
        _needing("single", 2, 800.0, 500),
        _needing("ddp", 1, 700.0, 400),
    )
    ranked = [big, same, small, smaller, smallest]
    taken = {big.candidate.key}
    assert replacement(ranked, big, "oom", taken) is smaller  # single, needing less
    assert replacement(ranked, big, "error", taken) is same
    assert replacement(ranked, big, "timeout", taken | {same.candidate.key}) is small
    assert replacement(ranked, small, "oom", taken) is smallest  # ddp, needing less
    assert replacement(ranked, big, "oom", taken | {smaller.candidate.key}) is small  # none left
    assert replacement(ranked, smallest, "oom", {e.candidate.key for e in ranked[:4]}) is None


def test_a_validation_on_a_busy_host_says_so_in_the_reasons(model: CostModel) -> None:
    ranked = _plan(model, 16).evaluations
    ordered = sorted((e for e in ranked if e.feasible), key=lambda e: -e.tokens_per_s)
    first, second = ordered[0].candidate, ordered[1].candidate

    def at(share: float | None, tps: float) -> Measurement:
        return dataclasses.replace(ok(tps), host_others_share=share)

    quiet = _plan(model, 16, {first.key: at(0.02, 200.0), second.key: at(None, 100.0)})
    assert not any("busy host" in r for r in quiet.reasons)
    busy = _plan(model, 16, {first.key: at(0.3, 200.0), second.key: at(0.55, 100.0)})
    line = next(r for r in busy.reasons if "busy host" in r)
    assert line.startswith(
        "validation shared a busy host: other processes took up to 55% of its CPU time while "
        f"2 of 2 validated configs were measured ({second.label()} the most)"
    )
    assert "re-run 'advisor recommend' when the host is quiet" in line
    # Round-trips through plan.json.
    validated = {v.candidate.key: v for v in busy.validated}
    assert validated[second.key].measured.host_others_share == 0.55
    again = Measurement.from_dict(validated[second.key].measured.to_dict())
    assert again.host_others_share == 0.55


def test_when_more_fsdp_ranks_cannot_help_the_error_says_so() -> None:
    """A 671B DeepSeek-V3 over 1,024 H100s: 10 TB of state is 10 GiB a rank, but one gathered
    MoE block, its fp32 gradients and the activations need 161 GiB whatever the world size:
    "fsdp over more devices" was the wrong advice."""
    from types import SimpleNamespace

    from strategies.plan import nothing_fits
    from strategies.space import Candidate

    def evaluation(world: int, budgeted: float) -> SimpleNamespace:
        candidate = Candidate(
            precision="bf16",
            activation_checkpointing="full",
            parallelism="fsdp",
            world_size=world,
            micro_batch_size=1,
            grad_accum_steps=2,
        )
        state = 10_000 * 2**30
        memory = SimpleNamespace(model_state_bytes=state, traced_bytes=int(budgeted * 2**30))
        prediction = SimpleNamespace(
            budgeted_bytes=int(budgeted * 2**30),
            budget_bytes=72 * 2**30,
            breakdown=SimpleNamespace(memory=memory),
        )
        return SimpleNamespace(candidate=candidate, prediction=prediction)

    machine = SimpleNamespace(
        memory_bytes=80 * 2**30, shared_host=False, estimate=True, name="H100"
    )
    model = SimpleNamespace(machine=machine, memory_budget=0.9)
    stuck = nothing_fits([evaluation(1024, 171.2)], model)  # type: ignore[arg-type, list-item]
    assert "tensor or expert parallelism" in str(stuck)
    assert "161.4 GiB of each rank do not shrink with more FSDP ranks" in str(stuck)
    assert "fsdp over more devices" not in str(stuck)
    # 64 ranks: 156 GiB of state a rank, 15 GiB beyond it: more ranks do help
    shardable = nothing_fits([evaluation(64, 171.2)], model)  # type: ignore[arg-type, list-item]
    assert "fsdp over more devices" in str(shardable)


def test_the_memory_budget_the_error_suggests_is_rounded_up_so_it_fits() -> None:
    """A need of 2.19% of the device was shown as "at least 0.02", and --memory-budget 0.02
    failed again with the same line."""
    from types import SimpleNamespace

    from strategies.plan import nothing_fits
    from strategies.space import Candidate

    candidate = Candidate(
        precision="fp32",
        activation_checkpointing="full",
        parallelism="single",
        world_size=1,
        micro_batch_size=1,
        grad_accum_steps=8,
    )
    memory = SimpleNamespace(model_state_bytes=2**20, traced_bytes=2**20)
    need = int(0.0219 * 100 * 2**30)
    prediction = SimpleNamespace(
        budgeted_bytes=need, budget_bytes=2**30, breakdown=SimpleNamespace(memory=memory)
    )
    machine = SimpleNamespace(
        memory_bytes=100 * 2**30, shared_host=False, estimate=False, name="GPU"
    )
    model = SimpleNamespace(machine=machine, memory_budget=0.01)
    error = nothing_fits(
        [SimpleNamespace(candidate=candidate, prediction=prediction)],  # type: ignore[list-item]
        model,  # type: ignore[arg-type]
    )
    assert "a larger --memory-budget (at least 0.03)" in str(error)


def test_with_nothing_predictable_the_reason_most_candidates_share_leads() -> None:
    """Sorted by name, one checkpointing's missing memory fit ("no memory fit ...") hid the
    step times missing for every other ("no step-time fit ..."): the most common reason
    leads, the search's first among equals, with how many candidates it covers."""
    from types import SimpleNamespace

    from strategies.plan import nothing_fits

    def evaluation(reason: str) -> SimpleNamespace:
        return SimpleNamespace(prediction=None, reason=reason)

    evaluations = (
        [evaluation("the profile has no step-time fit for bf16 with none")] * 4
        + [evaluation("the profile has no memory fit for bf16 with ops")] * 4
        + [evaluation("the profile has no step-time fit for bf16 with full")] * 2
    )
    machine = SimpleNamespace(memory_bytes=2**30, shared_host=True, estimate=False, name="CPU")
    model = SimpleNamespace(machine=machine, memory_models=(), interrupted_probes=0)
    error = nothing_fits(evaluations, model)  # type: ignore[arg-type]
    assert str(error) == (
        "no candidate could be predicted from this profile: the profile has no step-time fit "
        "for bf16 with none (4 of 10 candidates; the others' reasons are in trials.csv)"
    )
    one = nothing_fits([evaluation("only this")], model)  # type: ignore[list-item, arg-type]
    assert str(one) == "no candidate could be predicted from this profile: only this"
    # A profile a Ctrl-C cut short: finish it, whatever each candidate lacks.
    cut = SimpleNamespace(machine=machine, memory_models=(), interrupted_probes=7)
    stopped = str(nothing_fits(evaluations, cut))  # type: ignore[arg-type]
    assert "Ctrl-C stopped it before it measured enough (7 probes cut short" in stopped
    assert stopped.endswith("run 'advisor profile' again and let it finish")
