"""The plan: the chosen config, what it is predicted and measured to cost, and why.

Pure: :func:`decide` turns a search's evaluations, the validation measurements and the baseline
into a :class:`Plan`; :meth:`Plan.save` writes ``plan.json`` and ``trials.csv`` (DESIGN.md).
Measurements come from advisor's validators (real short runs); this module only compares them.

Rules: the best MEASURED candidate wins among those validated; a candidate that could not be
validated (a distributed one before the launcher exists, a what-if) never beats a validated one,
and when it is predicted faster the reasons say so. Without any validated candidate the best
predicted wins and the plan says it was not validated.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profilers.rundir import RunDir
from strategies.budgets import LAYOUT_MARGIN
from strategies.config import TrainConfig
from strategies.cost import CostModel, GiB, Prediction
from strategies.errors import NothingFits, StrategyError
from strategies.search import Evaluation, SearchResult, evaluate, rank
from strategies.space import KNOBS, Candidate, SearchSpace

PLAN_SCHEMA_VERSION = 1
MEASUREMENT_STATUSES = ("ok", "oom", "timeout", "error", "not_validated")
NUM_ALTERNATIVES = 5


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurement:
    """A short real run of one config, or why there is none (``status != "ok"``).

    ``peak_memory_bytes`` is what the device's allocator reports at the step's peak (CPU: the
    allocator's peak, process overhead excluded; CUDA: reserved at the peak plus the context and
    workspaces), ``memory_kind`` says which. ``step_time_s`` is the median timed step
    (forward+backward of every micro-batch + optimizer), data loading excluded. ``visits``: how
    many separate short runs the samples were pooled from (close contenders are re-measured at
    different moments, see advisor.validation.validate_rounds); ``peak_memory_bytes`` is then
    the largest of them and ``wall_s`` their sum.
    """

    status: str
    reason: str = ""
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    memory_kind: str = ""
    step_samples_s: tuple[float, ...] = ()
    device: str = ""
    validator: str = ""
    wall_s: float = 0.0
    visits: int = 1

    def __post_init__(self) -> None:
        if self.status not in MEASUREMENT_STATUSES:
            raise ValueError(
                f"unknown measurement status {self.status!r}: one of {MEASUREMENT_STATUSES}"
            )

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.tokens_per_s is not None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "step_samples_s": list(self.step_samples_s)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["step_samples_s"] = tuple(kwargs.get("step_samples_s", ()))
        return cls(**kwargs)


@dataclass(frozen=True, kw_only=True, slots=True)
class Validation:
    """Predicted against measured for one validated (or not validatable) candidate."""

    candidate: Candidate
    predicted: Prediction
    measured: Measurement

    @property
    def time_error(self) -> float | None:
        """predicted / measured − 1 for the step time (0.1 = predicted 10% slow)."""
        m = self.measured
        if not m.ok or not m.step_time_s:
            return None
        return self.predicted.step_time_s / m.step_time_s - 1

    @property
    def memory_error(self) -> float | None:
        """Traced peak / measured allocator peak − 1 (the like-for-like pair: overheads that the
        allocator does not see are excluded from both)."""
        m = self.measured
        if not m.ok or not m.peak_memory_bytes:
            return None
        traced = self.predicted.traced_bytes
        if not traced:
            return None
        return traced / m.peak_memory_bytes - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate.to_dict(),
            "key": self.candidate.key,
            "predicted": self.predicted.to_dict(),
            "measured": self.measured.to_dict(),
            "time_error": self.time_error,
            "memory_error": self.memory_error,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Validation:
        return cls(
            candidate=Candidate.from_dict(data["candidate"]),
            predicted=Prediction.from_dict(data["predicted"]),
            measured=Measurement.from_dict(data["measured"]),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Baseline:
    """The seeds' naive loop: fp32, the whole global batch in one micro-batch if it fits (else
    the smallest accumulation that fits), no checkpointing, one device, no loader workers."""

    candidate: Candidate | None
    predicted: Prediction | None
    measured: Measurement | None = None
    reason: str = ""
    expected_speedup: float | None = None  # plan predicted tokens/s over the baseline's
    measured_speedup: float | None = None  # plan measured tokens/s over the baseline's

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.candidate.to_dict() if self.candidate else None,
            "key": self.candidate.key if self.candidate else None,
            "predicted": self.predicted.to_dict() if self.predicted else None,
            "measured": self.measured.to_dict() if self.measured else None,
            "reason": self.reason,
            "expected_speedup": self.expected_speedup,
            "measured_speedup": self.measured_speedup,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Baseline:
        config, predicted, measured = (
            data.get("config"),
            data.get("predicted"),
            data.get("measured"),
        )
        return cls(
            candidate=Candidate.from_dict(config) if config else None,
            predicted=Prediction.from_dict(predicted) if predicted else None,
            measured=Measurement.from_dict(measured) if measured else None,
            reason=str(data.get("reason", "")),
            expected_speedup=data.get("expected_speedup"),
            measured_speedup=data.get("measured_speedup"),
        )


@dataclass(frozen=True, kw_only=True)
class Plan:
    """plan.json: ``config`` (a TrainConfig) is what ``advisor train --plan`` runs."""

    config: TrainConfig
    predicted: Prediction
    measured: Measurement | None
    baseline: Baseline | None
    reasons: tuple[str, ...]
    validated: tuple[Validation, ...] = ()
    alternatives: tuple[Evaluation, ...] = ()
    search: Mapping[str, Any] = field(default_factory=dict)
    space: Mapping[str, Any] = field(default_factory=dict)
    machine: Mapping[str, Any] = field(default_factory=dict)
    estimate: bool = False
    label: str = ""
    profile: Mapping[str, Any] = field(default_factory=dict)
    evaluations: tuple[Evaluation, ...] = ()  # trials.csv only; not in plan.json
    schema_version: int = PLAN_SCHEMA_VERSION

    @property
    def candidate(self) -> Candidate:
        return Candidate.from_config(self.config)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "estimate": self.estimate,
            "label": self.label,
            "config": self.config.to_dict(),
            "predicted": self.predicted.to_dict(),
            "measured": self.measured.to_dict() if self.measured else {},
            "baseline": self.baseline.to_dict() if self.baseline else {},
            "reasons": list(self.reasons),
            "validated": [v.to_dict() for v in self.validated],
            "alternatives": [a.to_dict() for a in self.alternatives],
            "search": dict(self.search),
            "space": dict(self.space),
            "machine": dict(self.machine),
            "profile": dict(self.profile),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        version = data.get("schema_version")
        if version != PLAN_SCHEMA_VERSION:
            raise StrategyError(
                f"plan schema version {version!r} is not {PLAN_SCHEMA_VERSION}: re-run "
                "'advisor recommend'"
            )
        measured, baseline = data.get("measured"), data.get("baseline")
        return cls(
            config=TrainConfig.from_dict(data["config"]),
            predicted=Prediction.from_dict(data["predicted"]),
            measured=Measurement.from_dict(measured) if measured else None,
            baseline=Baseline.from_dict(baseline) if baseline else None,
            reasons=tuple(data.get("reasons", ())),
            validated=tuple(Validation.from_dict(v) for v in data.get("validated", ())),
            alternatives=tuple(Evaluation.from_dict(a) for a in data.get("alternatives", ())),
            search=dict(data.get("search", {})),
            space=dict(data.get("space", {})),
            machine=dict(data.get("machine", {})),
            estimate=bool(data.get("estimate", False)),
            label=str(data.get("label", "")),
            profile=dict(data.get("profile", {})),
        )

    def save(self, directory: Path) -> tuple[Path, Path]:
        """Write ``plan.json`` and ``trials.csv`` atomically (temp file + rename)."""
        directory.mkdir(parents=True, exist_ok=True)
        run = RunDir(directory)
        plan_path = run.plan
        tmp = plan_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        tmp.replace(plan_path)
        trials_path = run.trials
        write_trials_csv(trials_path, self)
        return plan_path, trials_path


# -- trials.csv -----------------------------------------------------------------------------------

TRIAL_COLUMNS: tuple[str, ...] = (
    "trial",
    "key",
    *KNOBS,
    "global_batch_size",
    "predicted_peak_memory_bytes",
    "predicted_budgeted_bytes",
    "budget_bytes",
    "predicted_step_time_s",
    "predicted_tokens_per_s",
    "feasible",
    "rejection_reason",
    "estimate",
    "validation_status",
    "measured_step_time_s",
    "measured_tokens_per_s",
    "measured_peak_memory_bytes",
    "chosen",
    "baseline",
)


def trial_rows(plan: Plan) -> list[dict[str, Any]]:
    """One tidy row per candidate the search evaluated (trials.csv)."""
    measured = {v.candidate.key: v.measured for v in plan.validated}
    if plan.baseline and plan.baseline.candidate and plan.baseline.measured:
        measured.setdefault(plan.baseline.candidate.key, plan.baseline.measured)
    chosen = plan.candidate.key
    baseline = plan.baseline.candidate.key if plan.baseline and plan.baseline.candidate else None
    rows = []
    for e in plan.evaluations:
        p, m = e.prediction, measured.get(e.candidate.key)
        rows.append(
            {
                "trial": e.trial_number,
                "key": e.candidate.key,
                **e.candidate.to_dict(),
                "global_batch_size": e.candidate.global_batch_size,
                "predicted_peak_memory_bytes": p.peak_memory_bytes if p else None,
                "predicted_budgeted_bytes": p.budgeted_bytes if p else None,
                "budget_bytes": p.budget_bytes if p else None,
                "predicted_step_time_s": p.step_time_s if p else None,
                "predicted_tokens_per_s": p.tokens_per_s if p else None,
                "feasible": e.feasible,
                "rejection_reason": e.reason,
                "estimate": plan.estimate,
                "validation_status": m.status if m else "",
                "measured_step_time_s": m.step_time_s if m else None,
                "measured_tokens_per_s": m.tokens_per_s if m else None,
                "measured_peak_memory_bytes": m.peak_memory_bytes if m else None,
                "chosen": e.candidate.key == chosen,
                "baseline": e.candidate.key == baseline,
            }
        )
    return rows


def write_trials_csv(path: Path, plan: Plan) -> None:
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(TRIAL_COLUMNS))
        writer.writeheader()
        for row in trial_rows(plan):
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    tmp.replace(path)


# -- baseline, failure, decision -----------------------------------------------------------------


def naive_baseline(model: CostModel, global_batch_size: int) -> Baseline:
    """The seeds' loop, with the smallest accumulation that fits (DESIGN.md)."""
    divisors = [d for d in range(1, global_batch_size + 1) if global_batch_size % d == 0]
    last: Evaluation | None = None
    for accum in divisors:  # ascending accumulation = descending micro-batch
        candidate = Candidate(
            precision="fp32",
            activation_checkpointing="none",
            parallelism="single",
            world_size=1,
            micro_batch_size=global_batch_size // accum,
            grad_accum_steps=accum,
        )
        last = evaluate(model, candidate)
        if last.feasible:
            how = (
                "the whole global batch in one micro-batch"
                if accum == 1
                else (f"accumulation {accum}, the smallest that fits")
            )
            return Baseline(
                candidate=candidate,
                predicted=last.prediction,
                reason=f"the naive fp32 loop on one device: {how}",
            )
    why = last.reason if last else "no global batch"
    return Baseline(
        candidate=None,
        predicted=None,
        reason=f"the naive fp32 loop fits at no accumulation ({why})",
    )


def nothing_fits(evaluations: Sequence[Evaluation], model: CostModel) -> StrategyError:
    """The error for a search with no feasible candidate: the least memory any needs, and the
    knob that would help most, read off that candidate's breakdown."""
    priced = [e for e in evaluations if e.prediction is not None]
    if not priced:
        reasons = sorted({e.reason for e in evaluations if e.reason})
        return StrategyError(
            "no candidate could be predicted from this profile: "
            + (reasons[0] if reasons else "the space is empty")
        )
    smallest = min(priced, key=lambda e: e.prediction.budgeted_bytes if e.prediction else 0)
    p = smallest.prediction
    assert p is not None
    memory = p.breakdown.memory
    assert memory is not None  # the cost model's predictions carry their terms
    state = memory.state_bytes
    machine = model.machine
    hints = []
    needed_fraction = p.budgeted_bytes / machine.memory_bytes
    if needed_fraction <= 1:
        hints.append(f"a larger --memory-budget (at least {needed_fraction:.2f})")
    if memory.traced_bytes - state > state:
        hints.append("a shorter sequence (--seq-len, then re-profile): activations dominate")
    elif machine.shared_host:
        hints.append("a smaller model or more RAM: CPU ranks share one host's memory")
    else:
        hints.append(
            "fsdp over more devices (--world-size): parameters, gradients and optimizer state "
            "dominate and FSDP shards them"
        )
    if machine.estimate:
        hints.append("a --target with more memory")
    return NothingFits(
        f"nothing fits the memory budget of {p.budget_bytes / GiB:.2f} GiB "
        f"({model.memory_budget:g} × {machine.memory_bytes / GiB:.2f} GiB of {machine.name}): "
        f"the smallest candidate ({smallest.candidate.label()}) needs "
        f"{p.budgeted_bytes / GiB:.2f} GiB; try " + ", or ".join(hints),
        smallest_bytes=p.budgeted_bytes,
        budget_bytes=p.budget_bytes,
    )


def top_candidates(
    result: SearchResult, k: int, *, layout_margin: float = LAYOUT_MARGIN
) -> list[Evaluation]:
    """What validation measures: the ``k`` best predicted feasible candidates, then the best
    predicted of each parallelism layout not among them if it is within ``layout_margin`` of
    the best prediction (none when ``k`` is 0)."""
    ranked = result.ranked()
    top = ranked[: max(k, 0)]
    if not top:
        return top
    layouts = {e.candidate.parallelism for e in top}
    floor = (1.0 - layout_margin) * top[0].tokens_per_s
    for e in ranked[len(top) :]:
        if e.candidate.parallelism not in layouts and e.tokens_per_s >= floor:
            top.append(e)
            layouts.add(e.candidate.parallelism)
    return top


def decide(
    *,
    base: TrainConfig,
    model: CostModel,
    space: SearchSpace,
    result: SearchResult,
    measurements: Mapping[str, Measurement],
    baseline: Baseline,
    label: str = "",
    profile_info: Mapping[str, Any] | None = None,
) -> Plan:
    """The plan from a finished search and whatever was measured (keyed by candidate key).

    Raises :class:`NothingFits` when no candidate fits the budget.
    """
    ranked = result.ranked()
    if not ranked:
        raise nothing_fits(result.evaluations, model)
    validations = tuple(
        Validation(
            candidate=e.candidate, predicted=e.prediction, measured=measurements[e.candidate.key]
        )
        for e in ranked
        if e.candidate.key in measurements and e.prediction is not None
    )
    measured_ok = [v for v in validations if v.measured.ok]
    if measured_ok:
        best = max(measured_ok, key=lambda v: v.measured.tokens_per_s or 0.0)
        winner = next(e for e in ranked if e.candidate.key == best.candidate.key)
        winner_measured: Measurement | None = best.measured
    else:
        winner, winner_measured = ranked[0], None
    assert winner.prediction is not None
    baseline = _with_baseline_measurement(baseline, measurements, winner, winner_measured)
    reasons = _reasons(winner, winner_measured, ranked, result, space, model, validations, baseline)
    alternatives = tuple(e for e in ranked if e.candidate.key != winner.candidate.key)
    return Plan(
        config=winner.candidate.apply(base),
        predicted=winner.prediction,
        measured=winner_measured,
        baseline=baseline,
        reasons=tuple(reasons),
        validated=validations,
        alternatives=alternatives[:NUM_ALTERNATIVES],
        search=result.summary(),
        space=space.to_dict(),
        machine=model.machine.to_dict(),
        estimate=model.machine.estimate,
        label=label,
        profile=dict(profile_info or {}),
        evaluations=result.evaluations,
    )


def _with_baseline_measurement(
    baseline: Baseline,
    measurements: Mapping[str, Measurement],
    winner: Evaluation,
    winner_measured: Measurement | None,
) -> Baseline:
    if baseline.candidate is None or baseline.predicted is None:
        return baseline
    measured = measurements.get(baseline.candidate.key)
    expected = winner.tokens_per_s / baseline.predicted.tokens_per_s
    speedup = None
    if measured and measured.ok and winner_measured and winner_measured.ok:
        speedup = (winner_measured.tokens_per_s or 0.0) / (measured.tokens_per_s or 1.0)
    return dataclasses.replace(
        baseline, measured=measured, expected_speedup=expected, measured_speedup=speedup
    )


def _fmt_tps(value: float) -> str:
    return f"{value:,.0f} tok/s"


def _reasons(
    winner: Evaluation,
    winner_measured: Measurement | None,
    ranked: Sequence[Evaluation],
    result: SearchResult,
    space: SearchSpace,
    model: CostModel,
    validations: Sequence[Validation],
    baseline: Baseline,
) -> list[str]:
    out: list[str] = []
    p = winner.prediction
    assert p is not None
    budget = model.budget_bytes
    num_feasible = len(ranked)
    out.extend(result.summary()["notes"])
    out.append(
        f"{num_feasible} of {len(result.evaluations)} candidates fit the budget of "
        f"{budget / GiB:.2f} GiB ({model.memory_budget:g} × {model.machine.memory_bytes / GiB:.2f}"
        f" GiB, {model.machine.name})"
    )
    unpredictable: dict[str, int] = {}
    for e in result.evaluations:
        if e.prediction is None:
            unpredictable[e.reason] = unpredictable.get(e.reason, 0) + 1
    for reason, count in sorted(unpredictable.items(), key=lambda item: -item[1]):
        out.append(f"{count} candidates could not be predicted: {reason}")
    for excluded in space.excluded:
        out.append(f"not considered: {excluded}")
    if winner_measured is not None:
        num_ok = sum(v.measured.ok for v in validations)
        visits = winner_measured.visits
        over = f" over {visits} separate runs" if visits > 1 else ""
        out.append(
            f"chosen: {winner.candidate.label()}: measured "
            f"{_fmt_tps(winner_measured.tokens_per_s or 0)}{over} (predicted "
            f"{_fmt_tps(p.tokens_per_s)}), the fastest of {num_ok} validated candidates"
        )
    else:
        why = "what-if estimates are never measured" if p.estimate else "no candidate was validated"
        out.append(
            f"chosen: {winner.candidate.label()}: predicted {_fmt_tps(p.tokens_per_s)} "
            f"(not validated: {why})"
        )
    top = ranked[0]
    if top.candidate.key != winner.candidate.key:
        out.append(
            f"the top predicted candidate ({top.candidate.label()}, {_fmt_tps(top.tokens_per_s)}) "
            "measured slower than the chosen one: the measurement wins"
        )
    best_measured = winner_measured.tokens_per_s if winner_measured else None
    for v in validations:
        if v.measured.ok:
            continue
        faster = best_measured is None or v.predicted.tokens_per_s > best_measured
        note = " and is predicted faster than the chosen one" if faster and winner_measured else ""
        out.append(
            f"{v.candidate.label()}: not validated ({v.measured.status}: {v.measured.reason}){note}"
        )
    out.extend(_knob_reasons(winner, result.evaluations))
    if baseline.candidate is not None and baseline.predicted is not None:
        speed = (
            f"expected speed-up {baseline.expected_speedup:.2f}×"
            if baseline.expected_speedup
            else ""
        )
        if baseline.measured_speedup is not None:
            speed += f", measured {baseline.measured_speedup:.2f}×"
        out.append(
            f"baseline ({baseline.reason}: {baseline.candidate.label()}): predicted "
            f"{_fmt_tps(baseline.predicted.tokens_per_s)}; {speed}"
        )
    else:
        out.append(f"baseline: {baseline.reason}")
    return out


def _knob_reasons(winner: Evaluation, evaluations: Sequence[Evaluation]) -> list[str]:
    """For each knob, the best candidate that differs from the winner in it (and agrees on the
    other knobs; a different world size also splits the batch differently), and why it lost."""
    groups = {
        "precision": ("precision",),
        "activation checkpointing": ("activation_checkpointing",),
        "parallelism": ("parallelism", "world_size"),
        "micro-batch/accumulation": ("micro_batch_size", "grad_accum_steps"),
        "loader workers": ("num_workers",),
    }
    batch = groups["micro-batch/accumulation"]
    w = winner.candidate
    out = []
    for name, fields in groups.items():
        fixed = [
            f
            for g in groups.values()
            if g != fields and not (fields == groups["parallelism"] and g == batch)
            for f in g
        ]
        differing = [
            e
            for e in evaluations
            if any(getattr(e.candidate, f) != getattr(w, f) for f in fields)
            and all(getattr(e.candidate, f) == getattr(w, f) for f in fixed)
        ]
        if not differing:
            continue
        mine = ", ".join(str(getattr(w, f)) for f in fields)
        feasible = rank(differing)
        if feasible:
            alt = feasible[0]
            ratio = alt.tokens_per_s / winner.tokens_per_s if winner.tokens_per_s else 0.0
            out.append(
                f"{name} {mine}: the best alternative ({alt.candidate.label()}) is predicted "
                f"{_fmt_tps(alt.tokens_per_s)}, {ratio:.2f}× the chosen config"
            )
        else:
            alt = differing[0]
            why = "is over the budget" if alt.prediction is not None else "cannot be predicted"
            out.append(
                f"{name} {mine}: no alternative is feasible; e.g. {alt.candidate.label()} {why}: "
                f"{alt.reason}"
            )
    return out
