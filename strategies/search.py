"""The search: an Optuna study, driven ask/tell, over the candidates of a search space.

advisor owns the loop (STYLE.md: ``study.optimize()`` is only a loop over ask/tell) so it
decides where a trial runs; today every trial is the cost model, a pure function. The study
maximises predicted tokens/s; a candidate over the memory budget is told with its constraint
violation (TPE's ``constraints_func``) and recorded infeasible with the reason, one the profile
cannot predict is told with value 0 and the missing measurement as the reason.

Screen, then enumerate or sample. The cost model prices a candidate in ~20 µs on a measured
profile (2.5 ms on a 70B what-if); what a trial costs is the storage: measured on this 2-vCPU
host with SQLite in WAL mode, ~30 ms per ask/suggest/tell (~140 ms with SQLite's default
rollback journal, which fsyncs every write), and a TPE trial ~60-80 ms (the sampler's own time
on top). So every candidate is first priced in memory (:func:`screen`, at most
:data:`SCREEN_S`): the candidates the profile cannot price (no memory fit or step-time fit for
their group) never enter the study and keep their reason (trials.csv rows without a trial
number). The study then holds the priceable ones: all of them when they are at most
:data:`ENUMERATE_MAX` = 256 or the trial budget asked for (exact), else the trial budget's
best by the screen (mode "screen": the fitting ones fastest first, then the rest by least
memory, so "nothing fits" still names the smallest). Before the screen, a 70B what-if's
480-candidate space, 4 of them fitting and 312 unpriceable, was sampled by TPE and missed all
four. A space the screen cannot price in time is sampled by TPE as before: on a hand-made
8-GPU profile with 780 candidates (global batch 1024), enumerating all took 24.5 s; TPE found
the exact optimum in 3 of 3 seeds with 128 trials (7-11 s), and came within 2.5% with 64 or
32 trials (2-3 s), hence :data:`DEFAULT_TRIALS` = 128. The plan says which mode ran.

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
from strategies.budgets import DEFAULT_TRIALS, SCREEN_S
from strategies.cost import CostModel, GiB, Prediction
from strategies.errors import Unpredictable
from strategies.prediction import memory_size
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
        f"needs {memory_size(prediction.budgeted_bytes)}{whose} > budget "
        f"{memory_size(prediction.budget_bytes)}"
    )
    return Evaluation(candidate=candidate, prediction=prediction, reason=reason)


def rank(evaluations: Sequence[Evaluation]) -> list[Evaluation]:
    """Feasible candidates, best first: predicted tokens/s, then bf16 before fp16, then less
    memory, then the key.

    At equal predicted speed bf16 goes first: it needs no loss scaling (fp32's exponent
    range), and where the two tie the prediction cannot tell them apart (a what-if prices both
    at one datasheet peak), so a memory difference between them is one of measurement
    coverage, not of the step: a 7.6B Qwen2's what-if chose fp16 at 68.6 GiB over the same
    bf16 step at 71.1, fp16's fit lacking the micro-batch-1 trace that bf16's had."""
    feasible = [e for e in evaluations if e.feasible]
    return sorted(
        feasible,
        key=lambda e: (
            -e.tokens_per_s,
            e.candidate.precision == "fp16",
            e.prediction.budgeted_bytes if e.prediction else 0,
            e.candidate.key,
        ),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Screen:
    """Every candidate of a space priced in memory: ``priced`` (fitting or over the budget)
    and ``unpriceable`` (no prediction; the reason says which measurement is missing)."""

    priced: tuple[Evaluation, ...]
    unpriceable: tuple[Evaluation, ...]
    wall_s: float

    def counts(self) -> dict[str, int]:
        return {
            "priced": len(self.priced),
            "fitting": sum(e.feasible for e in self.priced),
            "unpriceable": len(self.unpriceable),
        }

    def best(self, n: int) -> list[Candidate]:
        """The ``n`` candidates the study should hold when it cannot hold every priced one:
        the fitting ones, fastest first (:func:`rank`), then the rest by least memory."""
        fitting = rank(self.priced)
        over = sorted(
            (e for e in self.priced if not e.feasible),
            key=lambda e: (e.prediction.budgeted_bytes if e.prediction else 0, e.candidate.key),
        )
        return [e.candidate for e in [*fitting, *over][:n]]


def screen(space: SearchSpace, model: CostModel, *, limit_s: float | None = None) -> Screen | None:
    """Price every candidate of ``space`` in memory; None when that takes over ``limit_s``
    (default :data:`SCREEN_S`; the space is then sampled without a screen)."""
    limit_s = SCREEN_S if limit_s is None else limit_s
    started = time.perf_counter()
    priced: list[Evaluation] = []
    unpriceable: list[Evaluation] = []
    for i, candidate in enumerate(space.candidates()):
        if i % 32 == 0 and time.perf_counter() - started > limit_s:
            return None
        result = evaluate(model, candidate)
        (priced if result.prediction is not None else unpriceable).append(result)
    return Screen(
        priced=tuple(priced),
        unpriceable=tuple(unpriceable),
        wall_s=time.perf_counter() - started,
    )


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """What a search found: every distinct candidate in the study, and how it got there."""

    mode: str  # "enumerate" | "screen" | "sample"
    space_size: int
    trial_budget: int
    evaluations: tuple[Evaluation, ...]
    study_name: str
    storage: str
    trials_before: int  # finished trials already in the study when this run started
    trials_told: int  # trials this run told
    wall_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    # The in-memory screen's counts over the whole space (priced, fitting, unpriceable); empty
    # when the space was too large to screen.
    screened: Mapping[str, int] = field(default_factory=dict)

    @property
    def num_fitting(self) -> int:
        """Candidates of the space that fit: the screen's count (the study may hold fewer)."""
        if self.screened:
            return self.screened["fitting"]
        return sum(e.feasible for e in self.evaluations)

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
            **({"screened": dict(self.screened)} if self.screened else {}),
        }


def choose_mode(space_size: int, trials: int | None) -> tuple[str, int]:
    """("enumerate" | "sample", trial budget): enumerate whenever it costs no more trials."""
    budget = trials or DEFAULT_TRIALS
    if space_size <= max(budget, ENUMERATE_MAX):
        return "enumerate", space_size
    return "sample", budget


def choose_from_screen(priced: Screen, trials: int | None) -> tuple[str, int, list[Candidate]]:
    """("enumerate" | "screen", trial budget, the candidates the study holds): every priced
    candidate whenever that costs no more trials, else the budget's best by the screen."""
    budget = trials or DEFAULT_TRIALS
    count = len(priced.priced)
    if count <= max(budget, ENUMERATE_MAX):
        return "enumerate", count, [e.candidate for e in priced.priced]
    return "screen", budget, priced.best(budget)


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
    say = progress or (lambda _message: None)
    priced = screen(space, model)
    if priced is None:
        mode, budget = choose_mode(space.size, trials)
        chosen = space.candidates() if mode == "enumerate" else []
    else:
        mode, budget, chosen = choose_from_screen(priced, trials)
        say(
            f"screen: priced {space.size} candidates in {priced.wall_s:.1f} s: "
            f"{len(priced.priced)} predictable ({sum(e.feasible for e in priced.priced)} fit), "
            f"{len(priced.unpriceable)} not (reasons in trials.csv)"
        )
    with quiet_optuna():
        enumerator = enumeration_sampler_class()() if mode != "sample" else None
        study = open_study(storage, study_name, seed, enumerator)
        fail_stale(study)
        before = finished_trials(study)
        done = {trial_key(t, space) for t in before} - {None}
        say(
            f"{mode} {len(chosen) if enumerator else space.size} candidates in study "
            f"{study_name}" + (f" ({len(done)} already told)" if done else "")
        )
        if enumerator is not None:
            told = _enumerate(study, space, chosen, model, done, enumerator, say)
        else:
            told = _sample(study, space, model, done, budget, say)
        finished = finished_trials(study)
    known = {e.candidate.key: e for e in priced.priced} if priced is not None else {}
    evaluations = _collect(finished, space, model, known)
    if priced is not None:  # the unpriceable ones the study never saw, with their reason
        seen = {e.candidate.key for e in evaluations}
        evaluations.extend(e for e in priced.unpriceable if e.candidate.key not in seen)
    notes = [_mode_note(mode, space.size, budget, priced)]
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
        screened=priced.counts() if priced is not None else {},
    )


def _mode_note(mode: str, size: int, budget: int, priced: Screen | None) -> str:
    """The plan's line on how the space was searched."""
    if priced is None:
        if mode == "enumerate":
            return (
                f"the space has {size} candidates (≤ {max(budget, ENUMERATE_MAX)}): "
                "enumerated exhaustively"
            )
        return (
            f"the space has {size} candidates, too many to price in {SCREEN_S:g} s: Optuna's "
            f"TPE sampled {budget} trials"
        )
    head = f"the space has {size} candidates, all priced in memory first"
    left = len(priced.unpriceable)
    without = f"; {left} the profile cannot price stayed out of the study" if left else ""
    if mode == "enumerate":
        n = len(priced.priced)
        return f"{head}{without}; " + (
            "the one priced candidate evaluated"
            if n == 1
            else f"the {n} priced ones enumerated exhaustively"
        )
    return (
        f"{head}{without}; the study holds the {budget} best of the {len(priced.priced)} "
        "priced ones (the fitting ones fastest first, then the least memory)"
    )


def _enumerate(
    study: optuna.Study,
    space: SearchSpace,
    chosen: Sequence[Candidate],
    model: CostModel,
    done: set[str | None],
    enumerator: EnumerationSampler,
    say: Progress,
) -> int:
    """Enqueue the ``chosen`` candidates not yet told a chunk at a time and pop waiting trials
    until each has a finished trial. A candidate only RUNNING elsewhere (another worker, or one
    killed mid-trial) is taken over after :data:`TAKEOVER_S`: pricing takes milliseconds, so a
    trial running longer has no live worker."""
    from optuna.trial import TrialState

    candidates = [c for c in chosen if c.key not in done]
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
            left = len(candidates) - len(chunk)
            say(
                f"told {told} trial{'s' if told != 1 else ''}; {left} "
                f"candidate{'s' if left != 1 else ''} left"
            )
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
    trials: Sequence[optuna.trial.FrozenTrial],
    space: SearchSpace,
    model: CostModel,
    known: Mapping[str, Evaluation] | None = None,
) -> list[Evaluation]:
    """One evaluation per distinct candidate of the study (first trial wins), recomputed:
    the cost model is deterministic, so every worker gets the same ones (``known``: the
    screen's, not priced again)."""
    seen: dict[str, Evaluation] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        candidate = candidate_from_params(trial.params, space)
        if candidate is None or candidate.key in seen:
            continue
        result = (known or {}).get(candidate.key) or evaluate(model, candidate)
        seen[candidate.key] = Evaluation(
            candidate=candidate,
            prediction=result.prediction,
            reason=result.reason,
            trial_number=trial.number,
        )
    return list(seen.values())
