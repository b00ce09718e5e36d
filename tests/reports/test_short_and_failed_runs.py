"""A search that chose nothing and a training run too short for a steady rate: the page states
what they measured, not numbers they cannot support (audit 42, D17)."""

from __future__ import annotations

from pathlib import Path

import pytest

from advisor.recommending import recommend
from reports import build_view
from strategies.space import SearchRequest
from tests.reports.runs import make_hand_run


@pytest.fixture(scope="module")
def nothing_fits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_hand_run(tmp_path_factory.mktemp("nothing"), plan=False)
    with pytest.raises(Exception, match="nothing fits"):
        recommend(
            root / "profile.json", SearchRequest(global_batch_size=8, memory_budget=1e-4), out=root
        )
    assert (root / "trials.csv").is_file() and not (root / "plan.json").exists()
    return root


def test_a_tiny_budget_is_not_shown_as_zero(nothing_fits: Path) -> None:
    """--memory-budget 0.0001 of 16 GiB is 1.64 MiB: trials.csv's reasons, in GiB to two
    decimals, read 'needs 0.33 GiB > budget 0.00 GiB'."""
    view = build_view(nothing_fits)
    reasons = [r.rejection_reason for r in view.trials if r.rejection_reason.startswith("needs")]
    assert reasons and not any("0.00 GiB" in r for r in reasons)
    assert all(r.endswith("> budget 1.64 MiB") for r in reasons), reasons[:3]
    lead = view.section("candidates").lead[0]
    assert "0 fit the budget of 1.64 MiB" in lead


def test_a_search_that_chose_nothing_is_not_asked_for_again(nothing_fits: Path) -> None:
    """The Summary said 'no recommendation yet: run advisor recommend', the command that had
    just found nothing."""
    note = build_view(nothing_fits).section("summary").note
    assert note.startswith("The search chose nothing: none of its ")
    assert "the smallest it could price (" in note and "run 'advisor recommend" not in note


@pytest.mark.parametrize("steps", [1, 3])
def test_a_run_too_short_for_a_steady_rate_says_so(tmp_path: Path, steps: int) -> None:
    run = make_hand_run(tmp_path / "run", steps=steps, total_steps=steps)
    view = build_view(run)
    assert view.training is not None and view.training.warmup_included
    assert [r.role for r in view.validations if r.role == "training"] == []
    facts = {f.label: f for f in view.section("training").facts}
    what = "1 step" if steps == 1 else f"{steps} steps"
    assert facts["median throughput"].value.endswith(f"({what}, warm-up included)")
    assert "no steady rate" in facts["median throughput"].hint
    if steps == 1:
        assert facts["loss"].value.endswith("(one step)") and "→" not in facts["loss"].value
    assert "too few to leave the warm-up step out" in view.section("training").lead[0]
    summary = view.section("summary")
    ran = next(s for s in summary.lead if s.startswith("Training ran"))
    unit = "step" if steps == 1 else "steps"
    assert ran.startswith(f"Training ran {steps} of {steps} {unit} at a median ")
    assert "warm-up included" in ran
    speedup = next(f for f in summary.facts if f.label.startswith("speed-up"))
    assert "in training" not in speedup.value
    # its peak memory is still a measurement of the plan's config
    assert any(s.role == "measured" for c in view.section("memory").charts for s in c.series)


def test_a_run_long_enough_keeps_its_training_row(hand_run: Path) -> None:
    view = build_view(hand_run)
    assert view.training is not None and not view.training.warmup_included
    assert any(r.role == "training" for r in view.validations)


def test_a_search_that_could_price_nothing_points_at_the_profile_not_the_budget() -> None:
    """It said none of the candidates 'fits the budget' and suggested a larger
    --memory-budget when no candidate had been priced at all."""
    import dataclasses

    from reports.candidates import TrialRow
    from reports.summary import _nothing_chosen
    from strategies.space import Candidate

    row = TrialRow(
        trial=0,
        candidate=Candidate(
            precision="bf16",
            activation_checkpointing="none",
            parallelism="single",
            world_size=1,
            micro_batch_size=8,
            grad_accum_steps=1,
        ),
        predicted_peak_bytes=None,
        predicted_tokens_per_s=None,
        predicted_step_time_s=None,
        feasible=False,
        rejection_reason="the profile has no step-time fit for bf16",
        validation_status="",
        measured_tokens_per_s=None,
        measured_peak_bytes=None,
        chosen=False,
        baseline=False,
    )
    note = _nothing_chosen([row, dataclasses.replace(row, trial=1)])
    assert note.startswith("The search chose nothing: none of its 2 candidates could be priced")
    assert "fits the budget" not in note and "--memory-budget" not in note
