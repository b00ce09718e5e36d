"""Small readers shared by the sections: plan entries as strategies' records, measurements,
steady-state medians. Keys, labels and predicted terms are strategies' own (Candidate,
Prediction): the report reads them, it does not re-implement them."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from profilers.metrics_record import TrainRecord
from reports.fmt import num
from strategies.config import HYPERPARAMETER_KEYS
from strategies.prediction import Prediction
from strategies.space import KNOBS, Candidate


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def candidate(data: Any) -> Candidate | None:
    """strategies' Candidate of a candidate, config or trials.csv row; None when incomplete (a
    damaged or hand-made file): it then has no key and matches no other."""
    knobs = mapping(data)
    try:
        return Candidate.from_dict({k: knobs[k] for k in KNOBS if knobs.get(k) is not None})
    except (TypeError, ValueError):
        return None


def plan_candidate(plan: Mapping[str, Any] | None) -> Candidate | None:
    """The chosen config's knobs."""
    return candidate(mapping(plan).get("config"))


def same_candidate(a: Candidate | None, b: Candidate | None) -> bool:
    return a is not None and b is not None and a.key == b.key


def prediction(data: Any) -> Prediction | None:
    """strategies' Prediction of a plan entry's ``predicted``; None when absent or damaged."""
    try:
        return Prediction.from_dict(mapping(data))
    except (KeyError, TypeError, ValueError):
        return None


def ok_measurement(m: Any) -> Mapping[str, Any] | None:
    """A measurement dict that holds a usable throughput, else None."""
    m = mapping(m)
    if m.get("status") == "ok" and num(m.get("tokens_per_s")) is not None:
        return m
    return None


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def steady_state(records: Sequence[TrainRecord], key: str) -> list[float]:
    """Values of ``key`` after the warm-up steps (the first tenth, at least one step, of a run
    of more than three steps): the first steps pay for allocation and lazy initialisation."""
    kept = [v for r in records if (v := num(getattr(r, key))) is not None]
    if len(kept) > 3:
        kept = kept[max(1, len(kept) // 10) :]
    return kept


def setting_differences(planned: Mapping[str, Any], trained: Mapping[str, Any]) -> tuple[str, ...]:
    """The hyper-parameters a training run was given other values of than its plan's
    (``advisor train --plan P --lr X``): ``"lr 1e+30 (the plan's 0.001)"`` each. Until
    2026-12-07 the page showed the plan's values as what trained (audit 41, D3)."""
    if not planned or not trained:
        return ()
    out = []
    for key in HYPERPARAMETER_KEYS:
        if key not in trained or key not in planned:
            continue
        a, b = planned[key], trained[key]
        x, y = num(a), num(b)
        same = (
            abs(x - y) <= 1e-12 * max(abs(x), abs(y)) if x is not None and y is not None else a == b
        )
        if not same:
            out.append(f"{key} {_plain(b)} (the plan's {_plain(a)})")
    return tuple(out)


def _plain(value: Any) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def whatif_target(plan: Mapping[str, Any] | None) -> str:
    """The hardware a what-if plan (``recommend --target``: ``"estimate": true``) was made for,
    as its label names it ("8× NVIDIA H100 SXM5 80GB"); "" for a plan of the profiled host."""
    plan = mapping(plan)
    if plan.get("estimate") is not True:
        return ""
    label = str(plan.get("label") or "")
    where = label.removeprefix("ESTIMATE for ").split(":")[0].strip()
    return where or str(mapping(plan.get("machine")).get("name") or "other hardware")


def trained_elsewhere(
    plan: Mapping[str, Any] | None, train_config: Mapping[str, Any] | None
) -> bool:
    """Whether a training run of a what-if plan ran on another kind of device than the plan's
    target (``advisor train --plan`` of an H100 plan on this CPU): its measurements are then
    of this host, and no prediction of the plan describes them."""
    if not whatif_target(plan):
        return False
    machine = mapping(mapping(plan).get("machine"))
    target = str(machine.get("kind") or "cuda")
    device = str(mapping(train_config).get("device") or "").split(":")[0]
    if device != target:
        return True
    # The same kind: which GPU (train_config.json's device_name, since 2026-12-07); an H100
    # plan trained on an A10 is that A10's measurement. A name the table does not know is
    # not the target's; an older file without the name is taken at its kind.
    name = mapping(train_config).get("device_name")
    if not isinstance(name, str) or not name:
        return False
    from profilers.hardware import match_device

    spec = match_device(name)
    return spec is None or spec.name != machine.get("name")
