"""The search with selective checkpointing: blocks:K priced for every K from the measured
settings, ops only when measured, and the least recompute that fits a tight budget."""

from __future__ import annotations

import dataclasses

import pytest

from profilers.fit import AffineFit, fit_hinged
from strategies.cost import backward_share, cost_model_from_profile
from strategies.search import evaluate, rank
from strategies.space import Candidate, SearchRequest, build_space
from tests.strategies.profiles import flop_count, hand_profile, memory_model, time_model


def candidate(setting: str, micro: int = 4, accum: int = 1) -> Candidate:
    return Candidate(
        precision="fp32",
        activation_checkpointing=setting,
        parallelism="single",
        world_size=1,
        micro_batch_size=micro,
        grad_accum_steps=accum,
    )


def test_blocks_k_is_priced_on_the_line_between_none_and_full() -> None:
    model = cost_model_from_profile(hand_profile(), 0.9)
    none, full = (model.predict(candidate(s)) for s in ("none", "full"))
    for k in (1, 2, 3):
        got = model.predict(candidate(f"blocks:{k}"))
        # Memory: full stands at K = L = 4 (the peak is convex in K: the line is safe).
        memory = none.peak_memory_bytes + k / 4 * (full.peak_memory_bytes - none.peak_memory_bytes)
        assert got.peak_memory_bytes == pytest.approx(memory, rel=1e-6)
        # Time: each checkpointed block recomputes its forward: a quarter of full's extra.
        step = none.step_time_s + k / 4 * (full.step_time_s - none.step_time_s)
        assert got.step_time_s == pytest.approx(step, rel=1e-6)
        assert "interpolated: blocks:" in got.breakdown.time.compute_source
        # Said so: no traces of its own, and no windows in this profile.
        (note,) = [a for a in got.breakdown.assumptions if a.startswith("memory of blocks:")]
        assert "on the line in K" in note


def test_blocks_k_with_windows_is_priced_from_them_and_says_so() -> None:
    """Window fits (MB, over b) as none, blocks:2 and full of 4 blocks trace them: a saving
    s = 2 + 2b per checkpointed block before the last block's backward, a step d = 5 + b per
    block after it. blocks:3 (blocks 0-2) before: 100 + 10b - 3s = 94 + 4b; after: the top of
    backward at block 2, 90 + 8b - 2s = 86 + 4b, block 1's 83 + 5b, block 0's 80 + 6b. At
    b = 4: 110 MB, before (the line in K through blocks:2 and full says 112)."""
    mb = 1e6

    def windows(
        f: tuple[float, float], b: tuple[float, float]
    ) -> tuple[tuple[str, AffineFit], ...]:
        return (
            ("F", AffineFit(intercept=f[0] * mb, slope=f[1] * mb, xs=(1.0, 8.0), ys=())),
            ("B", AffineFit(intercept=b[0] * mb, slope=b[1] * mb, xs=(1.0, 8.0), ys=())),
        )

    shapes = {
        "none": ((100, 10), (90, 8)),
        "blocks:2": ((96, 6), (88, 6)),
        "full": ((80, 5), (80, 6)),
    }
    base = hand_profile()
    traced = []
    for setting, (f, b) in shapes.items():
        fits = windows(f, b)
        traced.append(
            dataclasses.replace(
                memory_model("fp32", "none"),
                activation_checkpointing=setting,
                forward_backward=fit_hinged(
                    [1.0, 8.0], [max(fit.predict(x) for _, fit in fits) for x in (1.0, 8.0)]
                ),
                windows=fits,
            )
        )
    kept = [
        m
        for m in base.fits.memory
        if (m.precision, m.activation_checkpointing) not in {("fp32", s) for s in shapes}
    ]
    fits = dataclasses.replace(base.fits, memory=(*traced, *kept))
    model = cost_model_from_profile(dataclasses.replace(base, fits=fits), 0.9)
    got = model.predict(candidate("blocks:3"))
    assert got.breakdown.memory.fitted_peak_bytes == pytest.approx(110 * mb, abs=1)
    (note,) = [a for a in got.breakdown.assumptions if a.startswith("memory of blocks:3")]
    assert "from the windows of the traced fp32 none" in note
    # A traced setting says nothing of the kind.
    assert not any(
        a.startswith("memory of")
        for a in model.predict(candidate("blocks:2")).breakdown.assumptions
    )


def test_blocks_k_below_the_timed_sizes_is_between_the_kept_physical_anchors() -> None:
    """Timed at micro-batch 2 and 8 with a negative intercept (noise), none's fit is kept
    physical below 2 (in proportion to b); the coefficient-wise line in K was not, and the
    8th regret session advised blocks:3 at micro-batch 1 as faster than none for that alone."""
    base = hand_profile()
    none = dataclasses.replace(
        time_model("fp32", "none"),
        forward_backward=AffineFit(
            intercept=-0.0021, slope=0.0865, xs=(2.0, 8.0), ys=(0.1709, 0.6899)
        ),
    )
    full = dataclasses.replace(
        time_model("fp32", "full"),
        forward_backward=AffineFit(
            intercept=-0.0128, slope=0.0968, xs=(2.0, 8.0), ys=(0.1808, 0.7616)
        ),
        delta_from="none",
    )
    kept = [
        t
        for t in base.fits.time
        if (t.precision, t.activation_checkpointing) not in (("fp32", "none"), ("fp32", "full"))
    ]
    fits = dataclasses.replace(base.fits, time=(none, full, *kept))
    model = cost_model_from_profile(dataclasses.replace(base, fits=fits), 0.9)
    steps = [
        model.predict(candidate(s, micro=1, accum=8)).step_time_s
        for s in ("none", "blocks:1", "blocks:2", "blocks:3", "full")
    ]
    assert steps == sorted(steps) and steps[0] < steps[-1]
    # On the line between the two guarded anchors: none at 0.1709 / 2 per micro-batch.
    quarter = steps[0] + (steps[-1] - steps[0]) / 4
    assert steps[1] == pytest.approx(quarter, rel=1e-9)


def test_a_measured_middle_k_is_an_anchor_of_the_line() -> None:
    base = hand_profile()
    mid = dataclasses.replace(memory_model("fp32", "none"), activation_checkpointing="blocks:2")
    mid = dataclasses.replace(
        mid, forward_backward=AffineFit(intercept=1.0e7, slope=5.0e6, xs=(1.0, 4.0), ys=())
    )
    fits = dataclasses.replace(base.fits, memory=(*base.fits.memory, mid))
    model = cost_model_from_profile(dataclasses.replace(base, fits=fits), 0.9)
    none = model.memory_model("fp32", "none").forward_backward.predict(4)
    assert model.memory_model("fp32", "blocks:2") == mid  # traced: used as it is
    one = model.memory_model("fp32", "blocks:1").forward_backward.predict(4)
    assert mid.forward_backward.predict(4) == pytest.approx(3.0e7)
    # blocks:1 halfway between none (K = 0) and the traced blocks:2, not the none-full line.
    assert one == pytest.approx((none + 3.0e7) / 2)


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ("ops", "ops checkpointing: the profile did not"),
        ("ops-half", "ops-half checkpointing (torchtitan's 'op'): not measured by this profile"),
    ],
)
def test_a_per_op_setting_is_searched_only_when_the_profile_measured_it(
    setting: str, reason: str
) -> None:
    plain = hand_profile()
    space = build_space(plain, SearchRequest(global_batch_size=8))
    assert space.checkpointing == ("none", "full", "blocks:1", "blocks:2", "blocks:3")
    (line,) = [e for e in space.excluded if e.startswith(reason)]
    assert "advisor profile" in line  # the command that measures it
    memory = dataclasses.replace(memory_model("fp32", "none"), activation_checkpointing=setting)
    time = dataclasses.replace(time_model("fp32", "none"), activation_checkpointing=setting)
    fits = dataclasses.replace(
        plain.fits, memory=(*plain.fits.memory, memory), time=(*plain.fits.time, time)
    )
    measured = dataclasses.replace(plain, fits=fits)
    assert setting in build_space(measured, SearchRequest(global_batch_size=8)).checkpointing


def test_a_tight_budget_takes_the_least_recompute_that_fits() -> None:
    model = cost_model_from_profile(hand_profile(), 0.9)
    peaks = {
        s: model.predict(candidate(s, micro=8)).budgeted_bytes
        for s in ("none", "blocks:1", "blocks:2", "blocks:3", "full")
    }
    assert list(peaks.values()) == sorted(peaks.values(), reverse=True)
    # A budget between blocks:2's and blocks:1's need at micro-batch 8 (no accumulation).
    budget = (peaks["blocks:1"] + peaks["blocks:2"]) // 2
    memory = int(budget / 0.9 / model.memory_budget * 0.9) + 1
    tight = cost_model_from_profile(
        hand_profile(memory_bytes=memory, precisions=("fp32",)), model.memory_budget
    )
    assert peaks["blocks:2"] <= tight.budget_bytes < peaks["blocks:1"]
    space = build_space(
        hand_profile(memory_bytes=memory, precisions=("fp32",)),
        SearchRequest(global_batch_size=8),
    )
    ranked = rank([evaluate(tight, c) for c in space.candidates() if c.grad_accum_steps == 1])
    assert ranked[0].candidate.activation_checkpointing == "blocks:2"


def test_backward_share_grows_with_the_recomputed_blocks() -> None:
    flops = flop_count()
    shares = [backward_share(s, flops, 4) for s in ("none", "blocks:2", "full")]
    assert shares[0] == pytest.approx(2 / 3) and shares[2] == pytest.approx(3 / 4)
    assert shares[0] < shares[1] < shares[2]
    # Without counted FLOPs: (2 + f) / (3 + f), f the recomputed fraction; ops recomputes no
    # matmul.
    assert backward_share("blocks:2", None, 4) == pytest.approx(2.5 / 3.5)
    assert backward_share("ops", None, 4) == pytest.approx(2 / 3)
