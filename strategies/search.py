"""The search: an Optuna study, driven ask/tell, over the candidates of a search space.

advisor owns the loop (STYLE.md: ``study.optimize()`` is only a loop over ask/tell) so it
decides where a trial runs; today every trial is the cost model, a pure function. The study
maximises predicted tokens/s; a candidate over the memory budget is told with its constraint
violation (TPE's ``constraints_func``) and recorded infeasible with the reason, one the profile
cannot predict is told with value 0 and the missing measurement as the reason.

Enumerate or sample. The cost model prices a candidate in ~20 µs; what a trial costs is the
storage: measured on this 2-vCPU host with SQLite in WAL mode, ~30 ms per ask/suggest/tell
(~140 ms with SQLite's default rollback journal, which fsyncs every write), and a TPE trial
~60-80 ms (the sampler's own time on top). On a hand-made 8-GPU profile with 780 candidates
(global batch 1024): enumerating all took 24.5 s; TPE found the exact optimum in 3 of 3 seeds
with 128 trials (7-11 s), and came within 2.5% with 64 or 32 trials (2-3 s). So the sampled
search defaults to :data:`DEFAULT_TRIALS` = 128 trials, and any space of at most
:data:`ENUMERATE_MAX` = 256 candidates (about the same wall time, and exact) or at most the
trial budget asked for is enumerated instead, and the plan says so.

Resumable and shareable. The study lives in any Optuna RDB storage (``sqlite:///RUN/study.db``
by default, PostgreSQL for several hosts) under a name derived from the profile and the
request, so re-running the same command after a kill loads it (``load_if_exists``) and skips
candidates already told; several workers on one study split the work: enumeration enqueues
candidates in short chunks and Optuna pops each waiting trial atomically (a row lock on
PostgreSQL; SQLite has none, so two workers may pop one trial together and the second tell is
dropped). A candidate is priced once or, when two workers enqueue it at the same moment, twice
(deterministically the same; measured: 5-10% of 116 candidates with two workers).
Every worker ranks ALL trials of the study, so they agree on the result. Opening the storage,
stale trials, the enumeration sampler and the trial parameters are :mod:`strategies.study`'s.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profilers.rundir import RunDir
from strategies.budgets import DEFAULT_TRIALS
from strategies.cost import CostModel, GiB, Prediction
from strategies.errors import Unpredictable
from strategies.space import Candidate, SearchSpace
from strategies.study import (
    ATTR,
    EnumerationSampler,
    candidate_from_params,
    enumeration_sampler_class,
    fail_stale,
    finished_trials,
    open_study,
    quiet_optuna,
    redact,
    suggest_candidate,
    trial_key,
    trial_params,
)

if TYPE_CHECKING:
    import optuna

ENUMERATE_MAX = 256
CHUNK = 16  # candidates enqueued at a time: keeps Optuna's waiting-queue scans short
TAKEOVER_S = 5.0  # enumeration re-prices a candidate RUNNING elsewhere for this long

Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class Evaluation:
    """One candidate priced by the cost model: feasible, or rejected with the reason."""

    candidate: Candidate
    prediction: Prediction | None
    reason: str = ""
    trial_number: int | None = None

    @property
    def feasible(self) -> bool:
        return self.prediction is not None and self.prediction.fits and not self.reason

    @property
    def tokens_per_s(self) -> float:
        """What the search maximises: tokens/s over the whole run (a compiled candidate's
        compile time amortised over its steps; an eager one's is its per-step figure)."""
        return self.prediction.amortised_tokens_per_s if self.prediction else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate.to_dict(),
            "key": self.candidate.key,
            "feasible": self.feasible,
            "reason": self.reason,
            "trial_number": self.trial_number,
            "predicted": self.prediction.to_dict() if self.prediction else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evaluation:
        predicted = data.get("predicted")
        return cls(
            candidate=Candidate.from_dict(data["candidate"]),
            prediction=Prediction.from_dict(predicted) if predicted else None,
            reason=str(data.get("reason", "")),
            trial_number=data.get("trial_number"),
        )


def evaluate(model: CostModel, candidate: Candidate) -> Evaluation:
    """Price one candidate; an over-budget or unpredictable one gets its reason."""
    try:
        prediction = model.predict(candidate)
    except Unpredictable as exc:
        return Evaluation(candidate=candidate, prediction=None, reason=str(exc))
    if prediction.fits:
        return Evaluation(candidate=candidate, prediction=prediction)
    memory = prediction.breakdown.memory
    sharing = memory.ranks_sharing_memory if memory else 1
    whose = f" ({sharing} ranks on one host)" if sharing > 1 else ""
    reason = (
        f"needs {prediction.budgeted_bytes / GiB:.2f} GiB{whose} > budget "
        f"{prediction.budget_bytes / GiB:.2f} GiB"
    )
    return Evaluation(candidate=candidate, prediction=prediction, reason=reason)


def rank(evaluations: Sequence[Evaluation]) -> list[Evaluation]:
    """Feasible candidates, best first: predicted tokens/s, then less memory, then the key."""
    feasible = [e for e in evaluations if e.feasible]
    return sorted(
        feasible,
        key=lambda e: (
            -e.tokens_per_s,
            e.prediction.budgeted_bytes if e.prediction else 0,
            e.candidate.key,
        ),
    )


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """What a search found: every distinct candidate in the study, and how it got there."""

    mode: str  # "enumerate" | "sample"
    space_size: int
    trial_budget: int
    evaluations: tuple[Evaluation, ...]
    study_name: str
    storage: str
    trials_before: int  # finished trials already in the study when this run started
    trials_told: int  # trials this run told
    wall_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    def ranked(self) -> list[Evaluation]:
        return rank(self.evaluations)

    def summary(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "space_size": self.space_size,
            "trial_budget": self.trial_budget,
            "num_evaluated": len(self.evaluations),
            "num_feasible": sum(e.feasible for e in self.evaluations),
            "study_name": self.study_name,
            "storage": redact(self.storage),
            "trials_before": self.trials_before,
            "trials_told": self.trials_told,
            "wall_s": self.wall_s,
            "notes": list(self.notes),
        }


def choose_mode(space_size: int, trials: int | None) -> tuple[str, int]:
    """("enumerate" | "sample", trial budget): enumerate whenever it costs no more trials."""
    budget = trials or DEFAULT_TRIALS
    if space_size <= max(budget, ENUMERATE_MAX):
        return "enumerate", space_size
    return "sample", budget


def study_name_for(profile_digest: str, space: SearchSpace, model: CostModel) -> str:
    """A name that is the same for the same profile, space and budget (resume, share) and
    differs otherwise (a different request never mixes into another's study)."""
    payload = json.dumps(
        {
            "profile": profile_digest,
            "space": space.to_dict(),
            "budget_bytes": model.budget_bytes,
            "machine": model.machine.to_dict(),
            # The run's length ranks compiled candidates (their compile amortised): a study
            # that searches compile is per run length; one that does not keeps its name.
            **({"run_steps": model.run_steps} if True in space.compile else {}),
        },
        sort_keys=True,
    )
    return "advisor-" + hashlib.sha256(payload.encode()).hexdigest()[:16]


def default_storage(run_dir: Path) -> str:
    return f"sqlite:///{RunDir(run_dir).study.resolve()}"


# -- the loop -------------------------------------------------------------------------------------


def run_search(
    space: SearchSpace,
    model: CostModel,
    *,
    storage: str,
    study_name: str,
    trials: int | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> SearchResult:
    """Search ``space`` under ``model`` in the study ``study_name`` at ``storage``.

    Re-running with the same arguments resumes (told candidates are not told again; a sampled
    search continues towards its trial budget). Raises :class:`StrategyError` for a storage it
    cannot open.
    """
    started = time.perf_counter()
    mode, budget = choose_mode(space.size, trials)
    say = progress or (lambda _message: None)
    with quiet_optuna():
        enumerator = enumeration_sampler_class()() if mode == "enumerate" else None
        study = open_study(storage, study_name, seed, enumerator)
        fail_stale(study)
        before = finished_trials(study)
        done = {trial_key(t, space) for t in before} - {None}
        say(
            f"{mode} {space.size} candidates in study {study_name}"
            + (f" ({len(done)} already told)" if done else "")
        )
        if enumerator is not None:
            told = _enumerate(study, space, model, done, enumerator, say)
        else:
            told = _sample(study, space, model, done, budget, say)
        finished = finished_trials(study)
    evaluations = _collect(finished, space, model)
    notes = []
    if mode == "enumerate":
        notes.append(
            f"the space has {space.size} candidates (≤ {max(budget, ENUMERATE_MAX)}): "
            "enumerated exhaustively"
        )
    else:
        notes.append(f"the space has {space.size} candidates: Optuna's TPE sampled {budget} trials")
    if before:
        notes.append(f"resumed study {study_name}: {len(before)} trials were already told")
    return SearchResult(
        mode=mode,
        space_size=space.size,
        trial_budget=budget,
        evaluations=tuple(evaluations),
        study_name=study_name,
        storage=storage,
        trials_before=len(before),
        trials_told=told,
        wall_s=time.perf_counter() - started,
        notes=tuple(notes),
    )


def _enumerate(
    study: optuna.Study,
    space: SearchSpace,
    model: CostModel,
    done: set[str | None],
    enumerator: EnumerationSampler,
    say: Progress,
) -> int:
    """Enqueue missing candidates a chunk at a time and pop waiting trials until every
    candidate of the space has a finished trial. A candidate only RUNNING elsewhere (another
    worker, or one killed mid-trial) is taken over after :data:`TAKEOVER_S`: pricing takes
    milliseconds, so a trial running longer has no live worker."""
    from optuna.trial import TrialState

    candidates = [c for c in space.candidates() if c.key not in done]
    # Chunks are random samples of what is left, a quarter of it at most: two workers that
    # read the study at the same moment then enqueue mostly different candidates (expected
    # overlap chunk² / left) instead of the same run (the result does not depend on order).
    rng = random.SystemRandom()
    told, waited = 0, 0.0
    total, reported = len(candidates), 0
    while candidates:
        complete, queued = set(), set()
        for t in study.get_trials(deepcopy=False):
            if t.state == TrialState.COMPLETE:
                complete.add(trial_key(t, space))
            elif t.state in (TrialState.WAITING, TrialState.RUNNING):
                queued.add(trial_key(t, space))
        candidates = [c for c in candidates if c.key not in complete]
        if not candidates:
            break
        fresh = [c for c in candidates if c.key not in queued]
        if not fresh:
            if waited < TAKEOVER_S:
                time.sleep(0.25)
                waited += 0.25
                continue
            fresh, waited = candidates, 0.0
        chunk = rng.sample(fresh, max(1, min(CHUNK, len(fresh) // 4)))
        for candidate in chunk:
            study.enqueue_trial(trial_params(candidate))
        # Pop waiting trials (ours or another worker's) until the queue is empty. When the
        # other worker empties it between the check and the ask, Optuna creates a fresh trial:
        # the enumeration sampler gives it a candidate of this chunk instead of a random one.
        spare = [c for c in fresh if c not in chunk] or chunk
        while study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            enumerator.next_params = trial_params(spare.pop() if len(spare) > 1 else spare[0])
            told += _tell(study, study.ask(), space, model) is not None
        if told * 4 // max(1, total) > reported:  # a line per quarter of the space, not per chunk
            reported = told * 4 // max(1, total)
            say(f"told {told} trials; {len(candidates) - len(chunk)} candidates left")
    return told


def _sample(
    study: optuna.Study,
    space: SearchSpace,
    model: CostModel,
    done: set[str | None],
    budget: int,
    say: Progress,
) -> int:
    distinct = set(done)
    told = 0
    # A sampler may propose a candidate again; those are told (TPE learns from them) but do
    # not count towards the budget. The cap stops a sampler that only repeats itself.
    for _ in range(4 * budget):
        if len(distinct) >= budget:
            break
        key = _tell(study, study.ask(), space, model)
        if key is not None:
            told += 1
            distinct.add(key)
        if told % 32 == 0:
            say(f"sampled {told} trials, {len(distinct)} distinct candidates")
    return told


def _tell(
    study: optuna.Study, trial: optuna.Trial, space: SearchSpace, model: CostModel
) -> str | None:
    """Price the trial's candidate and tell it; the key, or None when another worker told
    the same trial first. SQLite has no SELECT ... FOR UPDATE, so two workers can pop one
    waiting trial together; they price it identically and the second tell is dropped."""
    from optuna.exceptions import UpdateFinishedTrialError

    try:
        with warnings.catch_warnings():
            # "constraint is already set": the other worker of such a pair got there first.
            warnings.filterwarnings("ignore", message="The constraint value is ignored")
            return _price_and_tell(study, trial, space, model)
    except UpdateFinishedTrialError:
        return None
    except ValueError as exc:  # study.tell's own check: "Cannot tell a COMPLETE trial."
        if "Cannot tell a" in str(exc):
            return None
        raise


def _price_and_tell(
    study: optuna.Study, trial: optuna.Trial, space: SearchSpace, model: CostModel
) -> str:
    candidate = suggest_candidate(trial, space)
    result = evaluate(model, candidate)
    prediction = result.prediction
    if prediction is None:
        constraint = 1.0  # unpredictable: treat as violated so TPE steers away
    else:
        constraint = (prediction.budgeted_bytes - prediction.budget_bytes) / GiB
    if hasattr(trial, "set_constraint"):  # Optuna >= 5; 4.x reads it via constraints_func
        trial.set_constraint("over_budget_gib", constraint)
    trial.set_user_attr(
        ATTR,
        {
            "key": candidate.key,
            "feasible": result.feasible,
            "reason": result.reason,
            "constraint": [constraint],
            "peak_memory_bytes": prediction.peak_memory_bytes if prediction else None,
            "step_time_s": prediction.step_time_s if prediction else None,
            "tokens_per_s": prediction.tokens_per_s if prediction else None,
        },
    )
    study.tell(trial, result.tokens_per_s)
    return candidate.key


def _collect(
    trials: Sequence[optuna.trial.FrozenTrial], space: SearchSpace, model: CostModel
) -> list[Evaluation]:
    """One evaluation per distinct candidate of the study (first trial wins), recomputed:
    the cost model is deterministic, so every worker gets the same ones."""
    seen: dict[str, Evaluation] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        candidate = candidate_from_params(trial.params, space)
        if candidate is None or candidate.key in seen:
            continue
        result = evaluate(model, candidate)
        seen[candidate.key] = Evaluation(
            candidate=candidate,
            prediction=result.prediction,
            reason=result.reason,
            trial_number=trial.number,
        )
    return list(seen.values())
