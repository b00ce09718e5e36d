"""Predicted step times carry a 90% interval made of named parts (strategies/uncertainty.py)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from profilers.fit import fit_affine
from profilers.profile_record import Profile
from profilers.throughput import StepTiming
from profilers.workload import StepSpec
from strategies.config import TrainConfig
from strategies.cost import CostModel, cost_model_from_profile
from strategies.plan import top_candidates
from strategies.prediction import Prediction
from strategies.search import Evaluation
from strategies.uncertainty import (
    EXTRAPOLATION_PER_LOG_DISTANCE,
    HOST_DRIFT_DEDICATED,
    HOST_DRIFT_SHARED,
    PROFILE_TO_RUN_DRIFT_SHARED,
    Uncertainty,
    busy_term,
    delta_term,
    drift_term,
    extrapolation_distance,
    extrapolation_term,
    fit_terms,
    host_term,
    interval_overlaps,
    source_term,
)
from tests.strategies.profiles import SEQ_LEN, hand_profile, priced, searched, time_model

# Four sizes, three samples each, a few percent of scatter about t = 0.01 + 0.002·b.
_XS = [b for b in (1, 2, 4, 8) for _ in range(3)]
_NOISE = [0.97, 1.0, 1.03, 1.02, 0.99, 0.98, 0.96, 1.04, 1.0, 1.01, 0.98, 1.01]
NOISY = fit_affine(_XS, [(0.01 + 0.002 * b) * e for b, e in zip(_XS, _NOISE, strict=True)])


def _terms(x: float) -> dict[str, float]:
    return {name: sigma for name, sigma, _ in fit_terms(NOISY, x, 1.0)}


def test_the_fit_term_grows_with_distance_from_the_probed_sizes() -> None:
    inside, edge, far = _terms(3), _terms(8), _terms(32)
    assert inside["fit"] < edge["fit"] < far["fit"]
    assert inside["sample"] == edge["sample"] == far["sample"]  # one measurement's scatter
    assert 0.01 < inside["sample"] < 0.05  # the samples scatter by a few percent


def test_a_fit_without_residual_freedom_has_no_fit_terms() -> None:
    assert fit_terms(fit_affine([2, 8], [0.1, 0.2]), 4, 1.0) == []


def test_inside_the_probed_sizes_there_is_no_extrapolation_part() -> None:
    """Every size from the smallest probed to the largest keeps exactly the parts it had."""
    for b in (1, 2, 3, 5, 8):
        assert "extrapolation" not in _terms(b)
        assert extrapolation_term(NOISY, b, 1.0) is None
    # A fit that keeps no sizes (shifted) has nothing to measure a distance from.
    assert extrapolation_term(NOISY.shifted(0.01), 64, 1.0) is None


def _extrapolation(fit: object, b: float) -> float:
    term = extrapolation_term(fit, b, 1.0)  # type: ignore[arg-type]
    return 0.0 if term is None else term[1]


def test_the_extrapolation_part_widens_with_the_distance_outside_either_side() -> None:
    """Probed at 2 and 4 (one sample each, as a GPU profile times them: no residuals), a
    prediction at 16 is no longer as certain as one at 4: the part grows monotonically with
    the distance, as a ratio to the nearest probed size, below the range as above it."""
    two_four = fit_affine([2, 4], [0.05, 0.09])
    above = [_extrapolation(two_four, b) for b in (4, 5, 6, 8, 16, 64)]
    assert above[0] == 0.0 and all(a < b for a, b in itertools.pairwise(above))
    assert above[4] == pytest.approx(EXTRAPOLATION_PER_LOG_DISTANCE * math.log(4))
    below = [_extrapolation(two_four, b) for b in (2, 1.5, 1, 0.5)]
    assert below[0] == 0.0 and all(a < b for a, b in itertools.pairwise(below))
    # Symmetric in the ratio: 1 is as far below 2 as 8 is above 4.
    assert _extrapolation(two_four, 1) == pytest.approx(_extrapolation(two_four, 8))
    assert extrapolation_distance((2, 4), 16) == pytest.approx(math.log(4))
    assert extrapolation_distance((), 16) == 0.0
    # Scale-free: 16 from 2-4 is as far as 64 from 8-16.
    assert _extrapolation(two_four, 16) == pytest.approx(
        _extrapolation(fit_affine([8, 16], [0.1, 0.2]), 64)
    )
    # There for a fit without residuals too, where it is the only fit part.
    (term,) = fit_terms(two_four, 16, 1.0)
    assert term[0] == "extrapolation" and "4× above the probed 2-4" in term[2]
    # Weighted like the other fit parts: the micro-batches' share of the step.
    assert fit_terms(two_four, 16, 0.5)[0][1] == pytest.approx(term[1] / 2)
    # Beside a noisy fit's own parts, which it leaves as they were.
    far = fit_terms(NOISY, 32, 1.0)
    assert [n for n, _, _ in far] == ["fit", "sample", "extrapolation"]
    assert far[2][1] == pytest.approx(EXTRAPOLATION_PER_LOG_DISTANCE * math.log(4))


def _two_four_profile(profile: Profile) -> Profile:
    """The hand profile with its step times probed at micro-batch 2 and 4, three samples each
    scattering by 0.2%: a line the residuals call very certain."""
    xs = [2.0] * 3 + [4.0] * 3
    noise = [1.0, 1.002, 0.998, 1.001, 0.999, 1.0]
    times = tuple(
        dataclasses.replace(
            m,
            forward_backward=fit_affine(
                xs, [(0.01 + 0.02 * x) * e for x, e in zip(xs, noise, strict=True)]
            ),
        )
        for m in profile.fits.time
    )
    return dataclasses.replace(profile, fits=dataclasses.replace(profile.fits, time=times))


@pytest.mark.parametrize("shared_host", [True, False])
def test_a_prediction_far_outside_the_probed_sizes_has_a_wider_interval(
    profile: Profile, shared_host: bool
) -> None:
    """The defect: probed at 2 and 4, the plan's interval at micro-batch 16 was micro-batch
    4's (×/÷ 1.036 vs 1.034 on a device the job owns), as if 16 had been measured."""
    model = cost_model_from_profile(_two_four_profile(profile), memory_budget=0.9)
    model = dataclasses.replace(
        model, machine=dataclasses.replace(model.machine, shared_host=shared_host, estimate=False)
    )

    def predicted(b: int) -> Prediction:
        return _prediction(model, micro_batch_size=b, grad_accum_steps=1, global_batch_size=b)

    def factor(p: Prediction) -> float:
        assert p.uncertainty is not None
        return p.uncertainty.factor()

    inside = [predicted(b) for b in (2, 3, 4)]
    for p in inside:
        assert p.uncertainty is not None
        assert "extrapolation" not in [n for n, _, _ in p.uncertainty.terms]
    outside = [predicted(b) for b in (6, 8, 16, 32)]
    factors = [factor(p) for p in (inside[-1], *outside)]
    assert all(a < b for a, b in itertools.pairwise(factors))
    # Materially: before, the residuals' leverage alone moved it by 0.1-0.2%.
    assert factors[3] > 1.03 * factors[0]
    at_16 = outside[2].uncertainty
    assert at_16 is not None
    (sigma,) = [s for n, s, _ in at_16.terms if n == "extrapolation"]
    assert sigma == pytest.approx(EXTRAPOLATION_PER_LOG_DISTANCE * math.log(4), rel=0.05)
    # The interval around the point widens too, both ends, not only its parts.
    at4, at16 = inside[-1].step_time_interval_s, outside[2].step_time_interval_s
    assert at4 is not None and at16 is not None
    (low4, high4), (low16, high16) = at4, at16
    assert high16 / outside[2].step_time_s > high4 / inside[-1].step_time_s
    assert low16 / outside[2].step_time_s < low4 / inside[-1].step_time_s
    # It differs from candidate to candidate: comparisons between candidates keep it.
    assert "extrapolation" in [n for n, _, _ in at_16.comparable().terms]


def test_a_blocks_k_time_outside_its_anchors_sizes_has_the_extrapolation_part(
    profile: Profile,
) -> None:
    """blocks:K is interpolated between the timed none and full (no fit of its own): at
    micro-batch 16, 4× past both anchors' probed 2-4, its interval was micro-batch 4's."""
    model = cost_model_from_profile(_two_four_profile(profile), memory_budget=0.9)

    def terms(b: int) -> dict[str, float]:
        p = _prediction(
            model,
            micro_batch_size=b,
            grad_accum_steps=1,
            global_batch_size=b,
            activation_checkpointing="blocks:1",
        )
        assert p.uncertainty is not None and "interpolated" in p.breakdown.time.compute_source
        return {n: s for n, s, _ in p.uncertainty.terms}

    assert "extrapolation" not in terms(3)
    far = terms(16)
    # weighted by the micro-batches' share of the step (the optimizer step is timed apart)
    assert 0.9 * EXTRAPOLATION_PER_LOG_DISTANCE * math.log(4) < far["extrapolation"]
    assert far["extrapolation"] <= EXTRAPOLATION_PER_LOG_DISTANCE * math.log(4)
    assert "source" in far  # the interpolation's own part stays


def test_the_fit_terms_scale_with_the_share_of_the_step() -> None:
    full = {n: s for n, s, _ in fit_terms(NOISY, 4, 1.0)}
    half = {n: s for n, s, _ in fit_terms(NOISY, 4, 0.5)}
    assert half["sample"] == pytest.approx(full["sample"] / 2)


def test_the_interval_is_a_factor_either_side_and_its_parts_add_in_quadrature() -> None:
    u = Uncertainty(terms=(("a", 0.03, ""), ("b", 0.04, "")))
    assert u.sigma == pytest.approx(0.05)
    low, high = u.step_time_interval(2.0)
    assert low * high == pytest.approx(4.0)  # symmetric in log space
    assert high / 2.0 == pytest.approx(math.exp(1.6448536 * 0.05))
    assert Uncertainty.from_dict(u.to_dict()) == u


def test_host_drift_is_measured_for_shared_hosts_and_assumed_for_owned_devices() -> None:
    name, sigma, source = host_term(True, 3.5, 2)
    assert (name, sigma) == ("host", HOST_DRIFT_SHARED) and "load 3.5 on 2 CPUs" in source
    name, sigma, source = host_term(False, None, None)
    assert sigma == HOST_DRIFT_DEDICATED and "assumed" in source


def _drift_sigmas(p: Prediction) -> list[float]:
    assert p.uncertainty is not None
    return [sigma for name, sigma, _ in p.uncertainty.terms if name == "drift"]


def test_a_shared_host_adds_its_drift_since_the_profile_which_comparisons_leave_out(
    model: CostModel,
) -> None:
    """The drift between the profile's moment and a run's widens the stated interval; when
    candidates measured together are compared (validation), it moves both alike and is left
    out, so the comparable interval is exactly the interval without that part."""
    shared = dataclasses.replace(
        model, machine=dataclasses.replace(model.machine, shared_host=True, estimate=False)
    )
    p = _prediction(shared, micro_batch_size=4, grad_accum_steps=2)
    assert p.uncertainty is not None and _drift_sigmas(p) == [PROFILE_TO_RUN_DRIFT_SHARED]
    assert drift_term() in p.uncertainty.terms
    rest = Uncertainty(terms=tuple(t for t in p.uncertainty.terms if t[0] != "drift"))
    assert p.uncertainty.comparable() == rest
    assert p.uncertainty.sigma == pytest.approx(math.hypot(rest.sigma, PROFILE_TO_RUN_DRIFT_SHARED))
    full, comparable = p.tokens_per_s_interval, p.comparable_tokens_per_s_interval
    assert full is not None and comparable is not None
    assert full[0] < comparable[0] < p.tokens_per_s < comparable[1] < full[1]
    assert comparable[1] / p.tokens_per_s == pytest.approx(rest.factor())
    # A device the job owns, and a what-if for hardware never measured: no such drift.
    owned = dataclasses.replace(
        model, machine=dataclasses.replace(model.machine, shared_host=False, estimate=False)
    )
    q = _prediction(owned, micro_batch_size=4, grad_accum_steps=2)
    assert q.uncertainty is not None and _drift_sigmas(q) == []
    assert q.comparable_tokens_per_s_interval == pytest.approx(q.tokens_per_s_interval)
    what_if = dataclasses.replace(
        model, machine=dataclasses.replace(model.machine, shared_host=True, estimate=True)
    )
    assert _drift_sigmas(_prediction(what_if, micro_batch_size=4, grad_accum_steps=2)) == []


def _busy(p: Prediction) -> list[float]:
    assert p.uncertainty is not None
    return [sigma for name, sigma, _ in p.uncertainty.terms if name == "busy"]


def test_a_busy_profile_widens_the_interval_to_reach_a_quiet_run(profile: Profile) -> None:
    """Others took 40% of the host while the profile timed steps: a step that got 60% of it
    may read up to 1/0.6 slow, so the interval's lower end reaches at least 0.6 of the point,
    and comparisons between candidates widen too (groups timed at different moments)."""
    assert busy_term(0.0) is None and busy_term(-0.01) is None
    alone = Uncertainty(terms=(busy_term(0.4),))  # type: ignore[arg-type]
    assert alone.factor() == pytest.approx(1 / 0.6)
    assert busy_term(1.0) is not None  # a host entirely taken: still finite
    timed = StepTiming(
        spec=StepSpec(seq_len=SEQ_LEN, micro_batch_size=2),
        device="cpu",
        num_warmup=1,
        forward_backward_s=(0.1, 0.1),
        optimizer_s=(0.01, 0.01),
    )

    def predicted(*shares: float | None) -> Prediction:
        timings = tuple(dataclasses.replace(timed, host_others_share=s) for s in shares)
        model = cost_model_from_profile(
            dataclasses.replace(profile, throughput=timings), memory_budget=0.9
        )
        return _prediction(model, micro_batch_size=4, grad_accum_steps=2)

    quiet, unmeasured, busy = predicted(0.0, 0.0), predicted(None), predicted(0.05, 0.4, None)
    assert _busy(quiet) == _busy(unmeasured) == []
    assert quiet.uncertainty == unmeasured.uncertainty
    assert _busy(busy) == [pytest.approx(-math.log(0.6) / 1.6448536269514722)]
    low, _ = busy.step_time_interval_s or (0.0, 0.0)
    assert low <= 0.6 * busy.step_time_s
    wide, narrow = busy.comparable_tokens_per_s_interval, quiet.comparable_tokens_per_s_interval
    assert wide and narrow and wide[1] - wide[0] > narrow[1] - narrow[0]
    # A device the job owns runs the step itself: the host's CPUs being busy is not counted.
    model = cost_model_from_profile(
        dataclasses.replace(
            profile, throughput=(dataclasses.replace(timed, host_others_share=0.4),)
        ),
        memory_budget=0.9,
    )
    owned = dataclasses.replace(
        model, machine=dataclasses.replace(model.machine, shared_host=False, estimate=False)
    )
    assert _busy(_prediction(owned, micro_batch_size=4, grad_accum_steps=2)) == []


def test_the_contender_test_leaves_the_common_drift_out() -> None:
    """fsdp 25% behind the best: with their own parts only (σ 5%: ×/÷ 1.09) the intervals do
    not meet; counting the drift both share (σ 13%) they would, and fsdp would be validated
    for a reason that moves it and the best alike."""

    def spread(layout: str, tokens_per_s: float) -> Evaluation:
        return priced(
            layout,
            4,
            tokens_per_s,
            uncertainty=Uncertainty(terms=(("host", 0.05, ""), drift_term())),
        )

    result = searched(spread("ddp", 1000.0), spread("fsdp", 750.0))
    best, other = result.ranked()
    assert best.prediction and other.prediction
    assert interval_overlaps(
        other.prediction.tokens_per_s_interval, best.prediction.tokens_per_s_interval
    )
    assert [e.candidate.parallelism for e in top_candidates(result, 1)] == ["ddp"]


def _prediction(model: CostModel, **config: object) -> Prediction:
    return model.predict_config(TrainConfig(model="gpt-tiny", seq_len=SEQ_LEN, **config))  # type: ignore[arg-type]


def test_every_measured_prediction_carries_an_interval(model: CostModel) -> None:
    p = _prediction(model, micro_batch_size=4, grad_accum_steps=2, precision="fp32")
    assert p.uncertainty is not None
    low, high = p.step_time_interval_s or (0.0, 0.0)
    assert low < p.step_time_s < high
    t_low, t_high = p.tokens_per_s_interval or (0.0, 0.0)
    assert t_low < p.tokens_per_s < t_high
    assert t_low * high == pytest.approx(p.tokens_per_s * p.step_time_s)
    data = p.to_dict()
    assert data["step_time_s_interval"] == [low, high]
    assert Prediction.from_dict(data).step_time_interval_s == (low, high)


def test_what_was_not_measured_widens_the_interval(profile: Profile) -> None:
    model = cost_model_from_profile(profile, memory_budget=0.9)
    single = _prediction(model, micro_batch_size=4, grad_accum_steps=2)
    ddp = _prediction(
        model, micro_batch_size=2, grad_accum_steps=2, world_size=2, parallelism="ddp"
    )
    fsdp = _prediction(
        model, micro_batch_size=2, grad_accum_steps=2, world_size=2, parallelism="fsdp"
    )
    assert single.uncertainty and ddp.uncertainty and fsdp.uncertainty
    assert single.uncertainty.sigma < ddp.uncertainty.sigma <= fsdp.uncertainty.sigma
    sources = {source for _, _, source in ddp.uncertainty.terms}
    assert source_term("cpu_ddp")[2] in sources


def test_a_derived_checkpointing_time_says_so() -> None:
    profile = hand_profile(timed_checkpointing=("none",))
    model = cost_model_from_profile(profile, memory_budget=0.9)
    p = _prediction(model, micro_batch_size=4, grad_accum_steps=2, activation_checkpointing="full")
    assert p.uncertainty is not None
    assert source_term("derived_checkpointing") in p.uncertainty.terms


def _evaluation(layout: str, micro: int, tokens_per_s: float, sigma: float | None) -> Evaluation:
    spread = None if sigma is None else Uncertainty(terms=(("host", sigma, ""),))
    return priced(layout, micro, tokens_per_s, uncertainty=spread)


def test_a_layout_whose_interval_reaches_the_best_is_a_contender() -> None:
    # fsdp is 30% behind, beyond the fixed 15% margin, but both intervals are wide (σ 10%:
    # ×/÷ 1.18): its upper bound reaches the best's lower bound.
    wide = searched(
        _evaluation("ddp", 4, 1000.0, 0.10),
        _evaluation("fsdp", 4, 720.0, 0.10),
    )
    assert [e.candidate.parallelism for e in top_candidates(wide, 1)] == ["ddp", "fsdp"]
    # Narrow intervals (σ 1%): the single config 10% behind cannot be the fastest.
    narrow = searched(
        _evaluation("ddp", 4, 1000.0, 0.01),
        _evaluation("single", 8, 900.0, 0.01),
    )
    assert [e.candidate.parallelism for e in top_candidates(narrow, 1)] == ["ddp"]
    # Without intervals (hand-made predictions) the fixed margin decides, as before.
    bare = searched(_evaluation("ddp", 4, 1000.0, None), _evaluation("single", 8, 900.0, None))
    assert [e.candidate.parallelism for e in top_candidates(bare, 1)] == ["ddp", "single"]


def test_interval_overlap() -> None:
    assert interval_overlaps((80.0, 95.0), (90.0, 110.0)) is True
    assert interval_overlaps((70.0, 85.0), (90.0, 110.0)) is False
    assert interval_overlaps(None, (90.0, 110.0)) is None


def test_a_what_if_prediction_is_an_estimate_with_its_own_term(model: CostModel) -> None:
    what_if = dataclasses.replace(
        model, machine=dataclasses.replace(model.machine, estimate=True, shared_host=False)
    )
    p = _prediction(what_if, micro_batch_size=4, grad_accum_steps=2, precision="bf16")
    assert p.uncertainty is not None
    assert source_term("what_if") in p.uncertainty.terms
    assert source_term("what_if_fp32") not in p.uncertainty.terms
    assert host_term(False, None, None)[1] in [s for _, s, _ in p.uncertainty.terms]
    # fp32, which no published run used, carries its own (measured, much wider) part instead
    fp32 = _prediction(what_if, micro_batch_size=4, grad_accum_steps=2, precision="fp32")
    assert fp32.uncertainty is not None
    assert source_term("what_if_fp32") in fp32.uncertainty.terms
    assert source_term("what_if") not in fp32.uncertainty.terms
    (low, high), (low16, high16) = fp32.step_time_interval_s, p.step_time_interval_s  # type: ignore[misc]
    assert high / low > 2 * (high16 / low16)


def test_a_timed_delta_adds_its_own_standard_error() -> None:
    """full timed as a delta beside none (the recompute phase) and the loss chunks' cost: each
    delta's standard error, read from its paired rounds, is a term over the step, in
    quadrature when a candidate carries both; a delta of one round claims nothing."""
    full = dataclasses.replace(time_model("fp32", "full"), delta_from="none", delta_sd=0.05)
    chunks = dataclasses.replace(time_model("fp32", "none"), loss_chunks=4, delta_sd=0.08)
    profile = hand_profile(timed_checkpointing=("none",), extra_time=(full, chunks))
    chunked = tuple(dataclasses.replace(m, loss_chunks=4) for m in profile.fits.memory)
    fits = dataclasses.replace(profile.fits, memory=(*profile.fits.memory, *chunked))
    model = cost_model_from_profile(dataclasses.replace(profile, fits=fits), memory_budget=0.9)

    def delta_sigma(**config: object) -> float | None:
        p = _prediction(model, micro_batch_size=4, grad_accum_steps=2, **config)
        assert p.uncertainty is not None and p.breakdown is not None
        deltas = [s for name, s, _ in p.uncertainty.terms if name == "delta"]
        return deltas[0] if deltas else None

    assert delta_sigma() is None  # none: fitted through its own timings
    ckpt = delta_sigma(activation_checkpointing="full")
    # 5% of full's forward+backward, weighted by the micro-batches' share of the step (< 1)
    assert ckpt is not None and 0.03 < ckpt < 0.05
    alone = delta_sigma(loss_chunks=4)
    both = delta_sigma(activation_checkpointing="full", loss_chunks=4)
    # Both in quadrature: more than the recompute's alone (over a longer step than the
    # chunks' alone, so not necessarily more than theirs in relative terms).
    assert alone is not None and both is not None and both > ckpt
    assert delta_term(0.02)[:2] == ("delta", 0.02)
    unknown = dataclasses.replace(full, delta_sd=None)
    profile = hand_profile(timed_checkpointing=("none",), extra_time=(unknown,))
    model = cost_model_from_profile(profile, memory_budget=0.9)
    assert delta_sigma(activation_checkpointing="full") is None
