"""The plan's records and its files: what was measured, validated and chosen.

:class:`Measurement` (a short real run, or why there is none), :class:`Validation` (predicted
against measured), :class:`Baseline` (the seeds' naive loop) and :class:`Plan` (plan.json), with
:meth:`Plan.save` writing ``plan.json`` and ``trials.csv`` (DESIGN.md). :mod:`strategies.plan`
decides; this module only holds and writes what it decided.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profilers.rundir import RunDir, write_atomically, write_csv_atomically
from strategies.config import TrainConfig
from strategies.cost import Prediction
from strategies.errors import StrategyError
from strategies.search import Evaluation
from strategies.space import KNOBS, Candidate

PLAN_SCHEMA_VERSION = 1
MEASUREMENT_STATUSES = ("ok", "oom", "timeout", "error", "not_validated")


@dataclass(frozen=True, kw_only=True, slots=True)
class Measurement:
    """A short real run of one config, or why there is none (``status != "ok"``).

    ``peak_memory_bytes`` is what the device's allocator reports at the step's peak (CPU: the
    allocator's peak, process overhead excluded; CUDA: reserved at the peak plus the context and
    workspaces), ``memory_kind`` says which. ``step_time_s`` is the median timed step
    (forward+backward of every micro-batch + optimizer), data loading excluded. ``visits``: how
    many separate short runs the samples were pooled from (close contenders are re-measured at
    different moments, see advisor.validation.validate_rounds); ``peak_memory_bytes`` is then
    the largest of them and ``wall_s`` their sum. ``host_others_share``: the largest share of
    the host's CPU time that other processes (and a hypervisor's steal) took during its visits
    (profilers.host_activity; None where it could not be read): a busy host slows every config,
    multi-threaded ones more, so such a measurement ranks configs by the moment as well.
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
    host_others_share: float | None = None

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
        write_atomically(run.plan, json.dumps(self.to_dict(), indent=1) + "\n")
        write_trials_csv(run.trials, self)
        return run.plan, run.trials


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
    baseline = plan.baseline.candidate.key if plan.baseline and plan.baseline.candidate else None
    return evaluation_rows(
        plan.evaluations,
        estimate=plan.estimate,
        measured=measured,
        chosen=plan.candidate.key,
        baseline=baseline,
    )


def evaluation_rows(
    evaluations: Sequence[Evaluation],
    *,
    estimate: bool,
    measured: Mapping[str, Measurement] | None = None,
    chosen: str | None = None,
    baseline: str | None = None,
) -> list[dict[str, Any]]:
    """trials.csv's rows of ``evaluations``: those of a plan, or of a search that found none
    (nothing chosen, nothing measured: each row's reason is why)."""
    measured = measured or {}
    rows = []
    for e in evaluations:
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
                "estimate": estimate,
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
    write_csv_atomically(path, TRIAL_COLUMNS, trial_rows(plan))


def write_unplanned_trials_csv(
    path: Path, evaluations: Sequence[Evaluation], *, estimate: bool
) -> None:
    """trials.csv of a search that chose nothing: every candidate with why it was dropped."""
    write_csv_atomically(path, TRIAL_COLUMNS, evaluation_rows(evaluations, estimate=estimate))
