"""``advisor tune``'s pure parts: what is tuned, over which ranges, and what a study leaves on disk.

The tuned hyper-parameters are TrainConfig keys (``lr``, ``warmup_steps``, ``weight_decay``,
named ``lr``, ``warmup``, ``wd`` on the command line). A tuned plan differs from the plan it
came from in those keys only, plus ``min_lr``, which keeps its ratio to ``lr`` (the cosine
schedule decays to ``min_lr``, and TrainConfig requires ``min_lr <= lr``): every speed key and
the global batch are the plan's, so the speed advice still holds.

Each trial trains the same number of tokens and is scored by its final held-out eval loss;
the eval curve along the way is what the pruner sees. Records here are written by
:mod:`advisor.tuning` and read by the report (``OUT/tune/study.json``, ``OUT/tune/trials.jsonl``,
``OUT/tuned_plan.json``: :class:`profilers.rundir.TuneDir`). No device code, no Optuna at
import time.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profilers.rundir import write_atomically
from strategies.config import HYPERPARAMETER_KEYS, ConfigError, TrainConfig

if TYPE_CHECKING:
    import optuna

DEFAULT_TUNE_TRIALS = 12
EVALS_PER_TRIAL = 10  # evaluations per trial: the points the pruner can stop a trial at
MIN_TRIAL_STEPS = 2  # one intermediate evaluation to prune on, and the final one
# Successive halving (ASHA, Li et al. 2020 "A System for Massively Parallel Hyperparameter
# Tuning"; Optuna's SuccessiveHalvingPruner): a trial goes on past rung k (its eval at step
# r·3^k, r the first rung) only while its eval loss is in the best third of the trials that
# reached that rung. Chosen over the median rule because its cost is bounded by construction
# and it prunes from the second trial on, asynchronously (several workers); the median rule
# waits for its startup trials to complete, then stops about half of the rest. The first rung
# r is the first eval after the longest warm-up a trial can have (first_rung): with the default
# warm-up range (up to a fifth of a trial) and 10 evals per trial the rungs sit at 20% and 60%
# of a trial, so once the study has a few trials a new one costs on average
# 0.2 + 0.4/3 + 0.4/9 ≈ 0.38 of a full trial (measured: benchmarks/results/tune/). Before, the
# first rung was the first eval (10%), inside the warm-up: a trial was judged while its learning
# rate was still ramping up, which favours short warm-ups (half the trials stopped there).
REDUCTION_FACTOR = 3
# Spearman's rank correlation needs this many scored trials to say anything.
MIN_TRIALS_FOR_SENSITIVITY = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamRange:
    """One tuned hyper-parameter: ``name`` on the command line, ``key`` in TrainConfig."""

    name: str
    key: str
    low: float
    high: float
    log: bool = False
    integer: bool = False

    def __post_init__(self) -> None:
        shown = f"--params {self.name}={self.low:g}:{self.high:g}"
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ConfigError(f"{shown}: both ends must be finite numbers")
        if self.low >= self.high:
            raise ConfigError(f"{shown}: the range is empty; write LOW:HIGH with LOW < HIGH")
        if self.log and self.low <= 0:
            raise ConfigError(f"{shown}: {self.name} is searched on a log scale, LOW must be > 0")
        if self.low < 0:
            raise ConfigError(f"{shown}: {self.name} cannot be negative; use LOW >= 0")
        if self.integer and (self.low != int(self.low) or self.high != int(self.high)):
            raise ConfigError(f"{shown}: {self.name} counts steps, use whole numbers")

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "low": self.low,
            "high": self.high,
            "log": self.log,
            "integer": self.integer,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParamRange:
        return cls(
            name=str(data["name"]),
            key=str(data["key"]),
            low=float(data["low"]),
            high=float(data["high"]),
            log=bool(data.get("log", False)),
            integer=bool(data.get("integer", False)),
        )


# Command-line name -> TrainConfig key, in display order.
PARAM_KEYS: dict[str, str] = {"lr": "lr", "warmup": "warmup_steps", "wd": "weight_decay"}
DEFAULT_PARAMS = ",".join(PARAM_KEYS)
assert set(PARAM_KEYS.values()) <= set(HYPERPARAMETER_KEYS)


def default_ranges(config: TrainConfig, trial_steps: int) -> dict[str, ParamRange]:
    """Ranges around the plan: lr from a tenth to ten times the plan's (log scale, the usual
    search span), warm-up from none to a fifth of a trial (or the plan's own, when longer and
    within the trial), weight decay 0 to 0.3 (AdamW's common values are 0 to 0.1; GPT-3 used
    0.1)."""
    return {
        "lr": ParamRange(name="lr", key="lr", low=config.lr / 10, high=config.lr * 10, log=True),
        "warmup": ParamRange(
            name="warmup",
            key="warmup_steps",
            low=0,
            high=max(
                1,
                trial_steps // 5,
                config.warmup_steps if config.warmup_steps <= trial_steps else 0,
            ),
            integer=True,
        ),
        "wd": ParamRange(name="wd", key="weight_decay", low=0.0, high=0.3),
    }


def parse_params(text: str | None, defaults: Mapping[str, ParamRange]) -> tuple[ParamRange, ...]:
    """``--params lr,warmup,wd`` (default ranges) or ``lr=1e-4:1e-2,wd=0:0.2`` (own ranges)."""
    names: list[str] = []
    ranges: list[ParamRange] = []
    for item in (text if text is not None else DEFAULT_PARAMS).split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, span = item.partition("=")
        name = name.strip()
        if name not in defaults:
            raise ConfigError(
                f"--params: unknown parameter {name!r}; tune any of {', '.join(defaults)} "
                "(optionally NAME=LOW:HIGH)"
            )
        if name in names:
            raise ConfigError(f"--params names {name} twice: give each parameter once")
        names.append(name)
        base = defaults[name]
        if not sep:
            ranges.append(base)
            continue
        low, colon, high = span.partition(":")
        try:
            bounds = float(low), float(high)
        except ValueError:
            bounds = None
        if not colon or bounds is None:
            raise ConfigError(
                f"--params {item}: write the range as {name}=LOW:HIGH with two numbers, e.g. "
                f"{name}={base.low:g}:{base.high:g}"
            )
        ranges.append(
            ParamRange(
                name=name,
                key=base.key,
                low=bounds[0],
                high=bounds[1],
                log=base.log,
                integer=base.integer,
            )
        )
    if not ranges:
        raise ConfigError(f"--params is empty: name what to tune, e.g. --params {DEFAULT_PARAMS}")
    return tuple(ranges)


def trial_steps(config: TrainConfig, tokens_per_trial: int) -> int:
    """Optimizer steps of a trial: whole global batches within ``tokens_per_trial``, the same
    for every trial. Too few for an intermediate and a final evaluation is a ConfigError."""
    steps = tokens_per_trial // config.tokens_per_step
    if tokens_per_trial < 1 or steps < MIN_TRIAL_STEPS:
        need = MIN_TRIAL_STEPS * config.tokens_per_step
        raise ConfigError(
            f"--tokens-per-trial {tokens_per_trial:,} is too few for one evaluation to prune on: "
            f"a step of this plan trains {config.tokens_per_step:,} tokens (global batch "
            f"{config.global_batch_size} x seq {config.seq_len}); give at least {need:,}"
        )
    return steps


def eval_every(steps: int) -> int:
    """The eval interval of a trial of ``steps`` steps (about EVALS_PER_TRIAL evaluations)."""
    return max(1, steps // EVALS_PER_TRIAL)


def longest_warmup(config: TrainConfig, ranges: Sequence[ParamRange]) -> int:
    """The most warm-up steps any trial of the study can have: the top of the ``warmup`` range
    when it is tuned, else the plan's own warm-up (every trial keeps it)."""
    tuned = next((r for r in ranges if r.key == "warmup_steps"), None)
    return int(tuned.high) if tuned is not None else int(config.warmup_steps)


def first_rung(steps: int, every: int, warmup: int) -> int:
    """The step of the pruner's first rung: the first evaluation at or after ``warmup`` steps,
    so no trial is judged while its learning rate is still ramping up (a trial with a long
    warm-up is behind early by construction, not because its values are worse). When the
    warm-up reaches the end of a trial, the last evaluation before the final one."""
    last_before_end = max(every, (steps - 1) // every * every)
    at_warmup = max(every, -(-warmup // every) * every)
    return min(at_warmup, last_before_end)


def tuned_config(config: TrainConfig, values: Mapping[str, Any]) -> TrainConfig:
    """``config`` with ``values`` (TrainConfig keys) for its hyper-parameters; ``min_lr`` keeps
    its ratio to ``lr``. Every speed key and the global batch stay as they are."""
    unknown = sorted(set(values) - set(PARAM_KEYS.values()))
    if unknown:
        raise ConfigError(
            f"advisor tune tunes {', '.join(PARAM_KEYS.values())}, not {', '.join(unknown)}"
        )
    changes: dict[str, Any] = dict(values)
    if "warmup_steps" in changes:
        changes["warmup_steps"] = round(float(changes["warmup_steps"]))
    if "lr" in changes:
        changes["lr"] = float(changes["lr"])
        changes["min_lr"] = config.min_lr / config.lr * changes["lr"]
    if "weight_decay" in changes:
        changes["weight_decay"] = float(changes["weight_decay"])
    tuned = config.replace(**changes)
    changed = speed_changes(config, tuned)
    assert not changed, f"tuning changed speed keys {changed}"  # programmer invariant
    return tuned


def speed_changes(a: TrainConfig, b: TrainConfig) -> list[str]:
    """TrainConfig keys other than the hyper-parameters on which ``a`` and ``b`` differ."""
    da, db = a.to_dict(), b.to_dict()
    return sorted(k for k in da if k not in HYPERPARAMETER_KEYS and da[k] != db.get(k))


def plan_values(config: TrainConfig, ranges: Sequence[ParamRange]) -> dict[str, Any]:
    """The plan's own values of the tuned parameters, by name (the study's first trial)."""
    return {r.name: getattr(config, r.key) for r in ranges}


def study_name(config: TrainConfig, ranges: Sequence[ParamRange], tokens_per_trial: int) -> str:
    """The same for the same plan, ranges and trial length (a re-run resumes, workers share),
    different otherwise. Hyper-parameters the study tunes are left out of the digest."""
    tuned = {r.key for r in ranges} | ({"min_lr"} if any(r.key == "lr" for r in ranges) else set())
    payload = json.dumps(
        {
            "config": {k: v for k, v in config.to_dict().items() if k not in tuned},
            "ranges": [r.to_dict() for r in ranges],
            "tokens_per_trial": tokens_per_trial,
        },
        sort_keys=True,
        default=str,
    )
    return "advisor-tune-" + hashlib.sha256(payload.encode()).hexdigest()[:16]


def suggest(trial: optuna.Trial, ranges: Sequence[ParamRange]) -> dict[str, Any]:
    """The trial's values, by parameter name."""
    values: dict[str, Any] = {}
    for r in ranges:
        if r.integer:
            values[r.name] = trial.suggest_int(r.name, int(r.low), int(r.high))
        else:
            values[r.name] = trial.suggest_float(r.name, r.low, r.high, log=r.log)
    return values


def config_values(ranges: Sequence[ParamRange], params: Mapping[str, Any]) -> dict[str, Any]:
    """Trial parameters by name -> TrainConfig values by key."""
    return {r.key: params[r.name] for r in ranges if r.name in params}


def make_pruner(first_rung_step: int) -> optuna.pruners.BasePruner:
    """Successive halving with its first rung at ``first_rung_step`` (see REDUCTION_FACTOR and
    first_rung)."""
    import optuna

    return optuna.pruners.SuccessiveHalvingPruner(
        min_resource=first_rung_step, reduction_factor=REDUCTION_FACTOR
    )


def make_sampler(seed: int | None, trials: int) -> optuna.samplers.BaseSampler:
    """TPE, with a third of the trials (at least 3) sampled at random first: the default 10
    would leave a 12-trial study almost random."""
    import optuna

    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(3, trials // 3))


# -- records on disk ------------------------------------------------------------------------------

STATES = ("complete", "pruned", "failed", "running", "waiting")


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalPoint:
    step: int
    tokens: int
    eval_loss: float

    def to_list(self) -> list[Any]:
        return [self.step, self.tokens, self.eval_loss]

    @classmethod
    def from_list(cls, data: Sequence[Any]) -> EvalPoint:
        return cls(step=int(data[0]), tokens=int(data[1]), eval_loss=float(data[2]))


@dataclass(frozen=True, kw_only=True, slots=True)
class TrialRecord:
    """One trial of the study (a line of OUT/tune/trials.jsonl).

    ``params``: the tuned values by parameter name; ``evals``: its eval curve as far as it ran;
    ``score``: the final eval loss (complete trials only); ``tokens``: tokens it trained;
    ``reason``: why it was pruned or failed; ``directory``: its training directory, relative
    to OUT (empty when it ran in another worker's OUT); ``rerun_as``: a failed trial whose
    parameters were queued again (its worker was stopped, or it failed and stopped the
    study): the number of the trial that re-runs them."""

    number: int
    state: str
    params: Mapping[str, Any]
    evals: tuple[EvalPoint, ...] = ()
    score: float | None = None
    tokens: int = 0
    reason: str = ""
    wall_s: float = 0.0
    worker: str = ""
    directory: str = ""
    rerun_as: int | None = None

    def __post_init__(self) -> None:
        assert self.state in STATES, self.state

    @property
    def last_loss(self) -> float | None:
        return self.evals[-1].eval_loss if self.evals else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "state": self.state,
            "params": dict(self.params),
            "evals": [e.to_list() for e in self.evals],
            "score": self.score,
            "tokens": self.tokens,
            "reason": self.reason,
            "wall_s": round(self.wall_s, 3),
            "worker": self.worker,
            "directory": self.directory,
            "rerun_as": self.rerun_as,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialRecord:
        score = data.get("score")
        rerun = data.get("rerun_as")
        return cls(
            number=int(data["number"]),
            state=str(data["state"]),
            params=dict(data.get("params") or {}),
            evals=tuple(EvalPoint.from_list(e) for e in data.get("evals") or ()),
            score=float(score) if score is not None else None,
            tokens=int(data.get("tokens") or 0),
            reason=str(data.get("reason") or ""),
            wall_s=float(data.get("wall_s") or 0.0),
            worker=str(data.get("worker") or ""),
            directory=str(data.get("directory") or ""),
            rerun_as=int(rerun) if rerun is not None else None,
        )


def trial_counts(records: Sequence[TrialRecord]) -> dict[str, int]:
    """Trials by outcome: complete, pruned, failed, and re-run (a failed trial whose
    parameters were queued again: an interrupted or killed worker's, or one that failed and
    stopped the study) -- those are not failures of the study's values and not counted twice;
    running and waiting ones (a study in progress) only when there are some."""
    counts = {"complete": 0, "pruned": 0, "failed": 0, "re-run": 0}
    for r in records:
        if r.rerun_as is not None:
            counts["re-run"] += 1
        else:
            counts[r.state] = counts.get(r.state, 0) + 1  # running, waiting: while it runs
    return counts


def counts_text(counts: Mapping[str, int]) -> str:
    """'3 complete, 1 pruned, 0 failed' (and ', 2 stopped and re-queued' when trials were re-run;
    running and waiting ones when there are any): the CLI's and the report's words alike."""
    text = (
        f"{counts.get('complete', 0)} complete, {counts.get('pruned', 0)} pruned, "
        f"{counts.get('failed', 0)} failed"
    )
    rerun = counts.get("re-run", 0)
    text += f", {rerun} stopped and re-queued" if rerun else ""
    for state in ("running", "waiting"):
        text += f", {counts[state]} {state}" if counts.get(state) else ""
    return text


def best_trial(records: Sequence[TrialRecord]) -> TrialRecord | None:
    """The complete trial with the lowest final eval loss (ties: the earlier trial)."""
    scored = [r for r in records if r.state == "complete" and r.score is not None]
    return min(scored, key=lambda r: (r.score, r.number)) if scored else None


def write_trials(path: Path, records: Sequence[TrialRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r.to_dict()) + "\n" for r in sorted(records, key=lambda r: r.number))
    write_atomically(path, text)


def read_trials(path: Path) -> list[TrialRecord]:
    """The records of a trials.jsonl; unreadable lines are skipped (the file is rewritten whole
    and atomically, so only a hand-edited one has them)."""
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(TrialRecord.from_dict(json.loads(line)))
        except (ValueError, KeyError, TypeError, AssertionError):
            continue
    return records


# -- sensitivity ----------------------------------------------------------------------------------


def _ranks(values: Sequence[float]) -> list[float]:
    """Average ranks (ties share the mean of their positions), 1-based."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on average ranks); None when undefined."""
    if len(xs) != len(ys) or len(xs) < 2:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return None
    return cov / math.sqrt(vx * vy)


@dataclass(frozen=True, kw_only=True, slots=True)
class Sensitivity:
    """How the eval loss moves with one parameter across the study's trials.

    ``rho``: Spearman's rank correlation between the parameter and the eval loss at
    ``step`` (the last evaluation every scored trial reached, so pruned trials count too):
    +1 the loss always rises with the parameter, -1 always falls, 0 no monotone relation.
    A rank statistic, so the log scale of lr does not matter. Chosen over Optuna's fANOVA
    importance, which needs scikit-learn (not a dependency) and reports no direction."""

    name: str
    rho: float | None
    step: int
    trials: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rho": self.rho, "step": self.step, "trials": self.trials}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sensitivity:
        rho = data.get("rho")
        return cls(
            name=str(data["name"]),
            rho=float(rho) if rho is not None else None,
            step=int(data.get("step") or 0),
            trials=int(data.get("trials") or 0),
        )


def sensitivity(records: Sequence[TrialRecord], names: Sequence[str]) -> list[Sensitivity]:
    """One :class:`Sensitivity` per parameter name, over the trials with an eval curve."""
    curves = [r for r in records if r.evals and r.state in ("complete", "pruned")]
    if not curves:
        return [Sensitivity(name=n, rho=None, step=0, trials=0) for n in names]
    step = min(r.evals[-1].step for r in curves)
    losses: list[float] = []
    kept: list[TrialRecord] = []
    for r in curves:
        at = [e.eval_loss for e in r.evals if e.step <= step]
        if at and math.isfinite(at[-1]):
            losses.append(at[-1])
            kept.append(r)
    out = []
    for name in names:
        pairs = [
            (float(r.params[name]), loss)
            for r, loss in zip(kept, losses, strict=True)
            if name in r.params
        ]
        rho = None
        if len(pairs) >= MIN_TRIALS_FOR_SENSITIVITY:
            rho = spearman([p[0] for p in pairs], [p[1] for p in pairs])
        out.append(Sensitivity(name=name, rho=rho, step=step, trials=len(pairs)))
    return out


@dataclass(frozen=True, kw_only=True)
class TuningSummary:
    """OUT/tune/study.json: what was tuned, how, and what it found and cost."""

    study_name: str
    storage: str  # redacted
    pruner: str
    sampler: str
    trials_asked: int
    tokens_per_trial: int
    steps_per_trial: int
    eval_every: int
    ranges: tuple[ParamRange, ...]
    plan: str  # the plan that was tuned
    tuned_plan: str
    base_values: Mapping[str, Any]  # the plan's own values, by parameter name
    best_number: int | None
    best_values: Mapping[str, Any]
    best_score: float | None
    base_score: float | None  # the plan's own values' final eval loss (trial 0) when scored
    counts: Mapping[str, int]
    tokens_trained: int  # all trials of the study together
    sensitivity: tuple[Sensitivity, ...] = ()
    command: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    # False while the study runs (or after it was stopped): the best so far, no tuned plan
    # written by it yet (``tuned_plan`` is then empty). study.json is rewritten after every
    # trial, so it always describes the same study as trials.jsonl beside it.
    finished: bool = True

    @property
    def cost_runs(self) -> float:
        """The study's cost as a multiple of one trial (= one full run at the trial length)."""
        return self.tokens_trained / self.tokens_per_trial if self.tokens_per_trial else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "study_name": self.study_name,
            "storage": self.storage,
            "pruner": self.pruner,
            "sampler": self.sampler,
            "trials_asked": self.trials_asked,
            "tokens_per_trial": self.tokens_per_trial,
            "steps_per_trial": self.steps_per_trial,
            "eval_every": self.eval_every,
            "ranges": [r.to_dict() for r in self.ranges],
            "plan": self.plan,
            "tuned_plan": self.tuned_plan,
            "base_values": dict(self.base_values),
            "best_number": self.best_number,
            "best_values": dict(self.best_values),
            "best_score": self.best_score,
            "base_score": self.base_score,
            "counts": dict(self.counts),
            "tokens_trained": self.tokens_trained,
            "cost_runs": round(self.cost_runs, 4),
            "sensitivity": [s.to_dict() for s in self.sensitivity],
            "command": list(self.command),
            "notes": list(self.notes),
            "finished": self.finished,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TuningSummary:
        best_score, base_score = data.get("best_score"), data.get("base_score")
        best_number = data.get("best_number")
        return cls(
            study_name=str(data["study_name"]),
            storage=str(data.get("storage", "")),
            pruner=str(data.get("pruner", "")),
            sampler=str(data.get("sampler", "")),
            trials_asked=int(data.get("trials_asked") or 0),
            tokens_per_trial=int(data["tokens_per_trial"]),
            steps_per_trial=int(data["steps_per_trial"]),
            eval_every=int(data.get("eval_every") or 0),
            ranges=tuple(ParamRange.from_dict(r) for r in data.get("ranges") or ()),
            plan=str(data.get("plan", "")),
            tuned_plan=str(data.get("tuned_plan", "")),
            base_values=dict(data.get("base_values") or {}),
            best_number=int(best_number) if best_number is not None else None,
            best_values=dict(data.get("best_values") or {}),
            best_score=float(best_score) if best_score is not None else None,
            base_score=float(base_score) if base_score is not None else None,
            counts={str(k): int(v) for k, v in (data.get("counts") or {}).items()},
            tokens_trained=int(data.get("tokens_trained") or 0),
            sensitivity=tuple(Sensitivity.from_dict(s) for s in data.get("sensitivity") or ()),
            command=tuple(str(w) for w in data.get("command") or ()),
            notes=tuple(str(n) for n in data.get("notes") or ()),
            finished=bool(data.get("finished", True)),
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> TuningSummary:
        return cls.from_dict(json.loads(path.read_text()))
