"""Small readers shared by the sections: candidate labels, plan entries, steady-state medians."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from reports.fmt import num

KNOBS = (
    "precision",
    "activation_checkpointing",
    "parallelism",
    "world_size",
    "micro_batch_size",
    "grad_accum_steps",
    "num_workers",
)


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def layout(c: Mapping[str, Any]) -> str:
    parallelism = str(c.get("parallelism") or "single")
    return "single" if parallelism == "single" else f"{parallelism}×{c.get('world_size', '?')}"


def candidate_key(c: Mapping[str, Any]) -> str:
    """The same identity as strategies' Candidate.key (``fp32/none/single1/mb8xga1/nw0``)."""
    return (
        f"{c.get('precision')}/{c.get('activation_checkpointing')}/{c.get('parallelism')}"
        f"{c.get('world_size')}/mb{c.get('micro_batch_size')}xga{c.get('grad_accum_steps')}"
        f"/nw{c.get('num_workers', 0)}"
    )


def short_label(c: Mapping[str, Any]) -> str:
    """Chart-axis label: ``fp32 · ckpt · 8×1`` (layout and workers only when not the default)."""
    parts = [str(c.get("precision", "?"))]
    if c.get("activation_checkpointing") not in (None, "none"):
        parts.append("ckpt")
    if c.get("parallelism") not in (None, "single"):
        parts.append(layout(c))
    parts.append(f"{c.get('micro_batch_size', '?')}×{c.get('grad_accum_steps', '?')}")
    if c.get("num_workers"):
        parts.append(f"{c['num_workers']}w")
    return " · ".join(parts)


def long_label(c: Mapping[str, Any]) -> str:
    """As strategies' Candidate.label(): ``bf16, full checkpointing, ddp×2, micro-batch 4 × 8
    accumulation``."""
    parts = [str(c.get("precision", "?"))]
    if c.get("activation_checkpointing") not in (None, "none"):
        parts.append(f"{c['activation_checkpointing']} checkpointing")
    parts.append(layout(c))
    parts.append(
        f"micro-batch {c.get('micro_batch_size', '?')} × {c.get('grad_accum_steps', '?')} "
        "accumulation"
    )
    if c.get("num_workers"):
        parts.append(f"{c['num_workers']} loader workers")
    return ", ".join(parts)


def plan_candidate(plan: Mapping[str, Any]) -> dict[str, Any]:
    config = mapping(plan.get("config"))
    return {k: config[k] for k in KNOBS if k in config}


def ok_measurement(m: Any) -> Mapping[str, Any] | None:
    """A measurement dict that holds a usable throughput, else None."""
    m = mapping(m)
    if m.get("status") == "ok" and num(m.get("tokens_per_s")) is not None:
        return m
    return None


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def steady_state(records: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """Values of ``key`` after the warm-up steps (the first tenth, at least one step, of a run
    of more than three steps): the first steps pay for allocation and lazy initialisation."""
    values = [(r.get("step"), num(r.get(key))) for r in records]
    kept = [v for _s, v in values if v is not None]
    if len(kept) > 3:
        kept = kept[max(1, len(kept) // 10) :]
    return kept
