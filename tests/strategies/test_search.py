"""The Optuna search: enumerate or sample, resume after an interruption, de-duplicate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

import strategies.search as search
from strategies.cost import CostModel
from strategies.search import choose_mode, rank, run_search
from strategies.space import SearchRequest, SearchSpace, build_space
from tests.strategies.profiles import hand_profile


def _space(global_batch: int = 16, **kwargs: Any) -> SearchSpace:
    return build_space(hand_profile(), SearchRequest(global_batch_size=global_batch, **kwargs))


def _storage(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'study.db'}"


def _complete_keys(storage: str, name: str) -> list[str]:
    study = optuna.load_study(study_name=name, storage=storage)
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    return [t.user_attrs[search.ATTR]["key"] for t in trials]


def test_mode_enumerates_whenever_it_costs_no_more_trials() -> None:
    assert choose_mode(100, None) == ("enumerate", 100)
    assert choose_mode(search.ENUMERATE_MAX + 1, None) == ("sample", search.DEFAULT_TRIALS)
    assert choose_mode(1000, 2000) == ("enumerate", 1000)


def test_a_small_space_is_enumerated_exhaustively_and_says_so(
    tmp_path: Path, model: CostModel
) -> None:
    space = _space(8)
    result = run_search(space, model, storage=_storage(tmp_path), study_name="s")
    assert result.mode == "enumerate"
    assert {e.candidate.key for e in result.evaluations} == {c.key for c in space.candidates()}
    assert "enumerated exhaustively" in result.summary()["notes"][0]
    best = result.ranked()[0]
    assert best == rank(list(result.evaluations))[0]
    assert all(best.tokens_per_s >= e.tokens_per_s for e in result.evaluations if e.feasible)


def test_an_interrupted_enumeration_resumes_where_it_stopped(
    tmp_path: Path, model: CostModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker dies mid-trial (leaving a RUNNING trial and queued ones); the re-run tells
    only what is missing, takes the dead trial over, and every candidate is told once."""
    space = _space(16)
    storage = _storage(tmp_path)
    monkeypatch.setattr(search, "CHUNK", 4)
    monkeypatch.setattr(search, "TAKEOVER_S", 0.5)
    calls = {"n": 0}
    real = search.evaluate

    def dying(model: CostModel, candidate: object) -> object:
        calls["n"] += 1
        if calls["n"] == space.size + 7:  # the screen priced each candidate once first
            raise KeyboardInterrupt  # the kill, inside a trial
        return real(model, candidate)  # type: ignore[arg-type]

    monkeypatch.setattr(search, "evaluate", dying)
    with pytest.raises(KeyboardInterrupt):
        run_search(space, model, storage=storage, study_name="s")
    assert len(_complete_keys(storage, "s")) == 6
    monkeypatch.setattr(search, "evaluate", real)
    result = run_search(space, model, storage=storage, study_name="s")
    assert result.trials_before == 6
    assert result.trials_told == space.size - 6
    keys = _complete_keys(storage, "s")
    assert sorted(keys) == sorted(c.key for c in space.candidates())  # each exactly once
    assert any("resumed study" in note for note in result.notes)
    again = run_search(space, model, storage=storage, study_name="s")
    assert again.trials_told == 0
    assert again.ranked()[0].candidate == result.ranked()[0].candidate


def test_a_space_too_large_to_screen_is_sampled_and_a_rerun_continues_towards_the_budget(
    tmp_path: Path, model: CostModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(search, "ENUMERATE_MAX", 4)
    monkeypatch.setattr(search, "SCREEN_S", -1.0)  # the screen gives up at once
    space = _space(16)
    storage = _storage(tmp_path)
    first = run_search(space, model, storage=storage, study_name="s", trials=6)
    assert first.mode == "sample"
    assert len(first.evaluations) == 6
    assert "too many to price" in first.notes[0] and "sampled 6 trials" in first.notes[0]
    second = run_search(space, model, storage=storage, study_name="s", trials=9)
    assert second.trials_before >= 6
    assert len(second.evaluations) == 9  # continued, not restarted


def test_a_screened_space_holds_the_budgets_best_and_a_rerun_continues(
    tmp_path: Path, model: CostModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More priced candidates than trials: the study holds the trial budget's best by the
    in-memory screen, so the search's best is the space's best, found without sampling."""
    monkeypatch.setattr(search, "ENUMERATE_MAX", 4)
    space = _space(16)
    everything = [search.evaluate(model, c) for c in space.candidates()]
    storage = _storage(tmp_path)
    first = run_search(space, model, storage=storage, study_name="s", trials=6)
    assert first.mode == "screen" and first.trial_budget == 6
    assert len(first.evaluations) == 6
    assert [e.candidate for e in first.ranked()] == [e.candidate for e in rank(everything)[:6]]
    assert "the study holds the 6 best" in first.notes[0]
    second = run_search(space, model, storage=storage, study_name="s", trials=9)
    assert second.trials_before == 6 and second.trials_told == 3  # continued, not restarted
    assert [e.candidate for e in second.ranked()] == [e.candidate for e in rank(everything)[:9]]


def test_when_nothing_fits_the_screened_study_holds_the_smallest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from strategies.cost import cost_model_from_profile
    from tests.strategies.profiles import GiB

    monkeypatch.setattr(search, "ENUMERATE_MAX", 4)
    tiny = cost_model_from_profile(hand_profile(memory_bytes=GiB // 1024), 0.9)
    space = _space(16)
    everything = [search.evaluate(tiny, c) for c in space.candidates()]
    assert not any(e.feasible for e in everything)
    result = run_search(space, tiny, storage=_storage(tmp_path), study_name="s", trials=5)
    smallest = min(e.prediction.budgeted_bytes for e in everything if e.prediction)
    told = [e.prediction.budgeted_bytes for e in result.evaluations if e.prediction]
    assert len(told) == 5 and min(told) == smallest


def test_candidates_the_profile_cannot_price_stay_out_of_the_study_with_their_reason(
    tmp_path: Path,
) -> None:
    """No step-time fit for checkpointing: its candidates are never trials, but every one
    is in the result (trials.csv, the plan's reasons) with the missing measurement named."""
    from strategies.cost import cost_model_from_profile

    profile = hand_profile(timed_checkpointing=("none",), with_flops=False)
    space = build_space(profile, SearchRequest(global_batch_size=16))
    model = cost_model_from_profile(profile, 0.9)
    storage = _storage(tmp_path)
    result = run_search(space, model, storage=storage, study_name="s")
    unpriced = [e for e in result.evaluations if e.prediction is None]
    # full, and blocks:K (priced on the line through none and full)
    full = [c for c in space.candidates() if c.activation_checkpointing != "none"]
    assert {e.candidate.key for e in unpriced} == {c.key for c in full}
    assert all(e.trial_number is None and "step-time fit" in e.reason for e in unpriced)
    assert len(result.evaluations) == space.size
    told = set(_complete_keys(storage, "s"))
    assert told == {c.key for c in space.candidates()} - {c.key for c in full}
    assert f"{len(full)} the profile cannot price stayed out of the study" in result.notes[0]


def test_infeasible_candidates_are_told_with_their_reason(tmp_path: Path) -> None:
    from strategies.cost import cost_model_from_profile
    from tests.strategies.profiles import GiB

    tight = cost_model_from_profile(hand_profile(memory_bytes=GiB // 8), 0.9)
    result = run_search(_space(32), tight, storage=_storage(tmp_path), study_name="s")
    rejected = [e for e in result.evaluations if not e.feasible]
    assert rejected and all("> budget" in e.reason for e in rejected)
    assert result.ranked()  # and something still fits


def test_an_unopenable_storage_is_a_clear_error(model: CostModel) -> None:
    from strategies.errors import StrategyError

    with pytest.raises(StrategyError, match="cannot open the study storage"):
        run_search(_space(4), model, storage="nosuchdb://x", study_name="s")


def test_at_equal_predicted_speed_bf16_ranks_before_fp16_whatever_their_memory() -> None:
    # A what-if prices bf16 and fp16 at one datasheet peak: equal speed, and a memory gap
    # between them is one of measurement coverage (a 7.6B Qwen2's fp16 fit lacked the
    # micro-batch-1 trace bf16's had, and read 2.5 GiB less), not of the step.
    from types import SimpleNamespace

    from strategies.config import TrainConfig
    from strategies.search import Evaluation
    from strategies.space import Candidate

    def evaluation(precision: str, gib: float, tokens: float) -> Evaluation:
        config = TrainConfig(model="gpt-tiny", seq_len=64, precision=precision)
        predicted = SimpleNamespace(
            fits=True, amortised_tokens_per_s=tokens, budgeted_bytes=gib * 2**30
        )
        return Evaluation(candidate=Candidate.from_config(config), prediction=predicted)  # type: ignore[arg-type]

    fp16, bf16 = evaluation("fp16", 68.6, 1000.0), evaluation("bf16", 71.1, 1000.0)
    assert rank([fp16, bf16]) == [bf16, fp16]
    faster = evaluation("fp16", 71.1, 1001.0)  # speed still comes first
    assert rank([bf16, faster]) == [faster, bf16]
    lean = evaluation("fp32", 10.0, 1000.0)  # fp32 and bf16 at one speed: less memory first
    assert rank([bf16, lean])[0] == lean
