"""Every row of probes.csv is built here: one :class:`ProbeRow` per probe run, skip or failure.

:func:`row` is the general constructor; the named ones are the shapes the phases repeat:
:func:`skipped` (did not run, and why), :func:`failed` (an isolated child that did not return
``ok``), :func:`raised` (an in-process probe that raised), :func:`measured` (an ``ok`` value
with its unit) and :func:`fit_gap` (a group a fit could not use). A row about one step carries
its spec's fields and, unless named otherwise, the spec's :func:`label`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from profilers.isolate import Outcome
from profilers.profile_record import ProbeRow
from profilers.workload import StepSpec


def label(spec: StepSpec) -> str:
    """``precision/checkpointing/b=micro``, ``xaccum`` when accumulating and ``/lcN`` with the
    loss in N chunks, e.g. fp32/none/b=4, fp32/none/b=4/lc32."""
    text = f"{spec.precision}/{spec.activation_checkpointing}/b={spec.micro_batch_size}"
    text += f"x{spec.grad_accum_steps}" if spec.grad_accum_steps > 1 else ""
    text += f"/lc{spec.loss_chunks}" if spec.loss_chunks > 1 else ""
    return text + ("/compiled" if spec.compile else "")


def one_line(exc: BaseException) -> str:
    """``TypeName: message`` on one line (whitespace collapsed), at most 300 characters."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]


def row(
    probe: str,
    spec: StepSpec | None,
    status: str,
    *,
    reason: str = "",
    wall_s: float = 0.0,
    value: float | None = None,
    unit: str = "",
    name: str | None = None,
) -> ProbeRow:
    """A row of ``probe``; named ``name``, else the spec's label, else the probe itself."""
    kw: dict[str, Any] = {}
    if spec is not None:
        kw = dict(
            precision=spec.precision,
            activation_checkpointing=spec.activation_checkpointing,
            micro_batch_size=spec.micro_batch_size,
            grad_accum_steps=spec.grad_accum_steps,
            world_size=spec.world_size,
        )
    return ProbeRow(
        probe=probe,
        name=name or (label(spec) if spec else probe),
        status=status,
        reason=reason,
        wall_s=wall_s,
        value=value,
        unit=unit,
        **kw,
    )


# How a row skipped for time ends when no budget that covers it is known (yet).
LARGER_BUDGET = "a larger --budget-s gives it more"
# How the reason of a row skipped for time begins.
TIME_SPENT = "time budget spent"


def name_covering_budget(
    rows: list[ProbeRow],
    indices: Iterable[int],
    budget_s: int,
    what: str,
    *,
    at_least: bool = False,
) -> None:
    """Append to each of ``rows[indices]`` (rows skipped for time) the ``--budget-s`` that
    covers every one of them: "; --budget-s N would cover the {what} left out"; with
    ``at_least``, a budget from a lower bound of their time (a trace stopped before its end),
    said so."""
    named = (
        f"--budget-s {budget_s} at least would cover the {what} left out (a trace stopped "
        "before its end gives only a lower bound of its time)"
        if at_least
        else f"--budget-s {budget_s} would cover the {what} left out"
    )
    for index in indices:
        reason = rows[index].reason.removesuffix(f"; {LARGER_BUDGET}")
        rows[index] = dataclasses.replace(rows[index], reason=f"{reason}; {named}")


def skipped(probe: str, spec: StepSpec | None, reason: str, *, name: str | None = None) -> ProbeRow:
    """A probe that did not run, and why (the budget, a prediction, a missing capability)."""
    return row(probe, spec, "skipped", reason=reason, name=name)


def failed(
    probe: str, spec: StepSpec | None, outcome: Outcome, *, name: str | None = None
) -> ProbeRow:
    """An isolated child that ended in oom, timeout or error: its status, reason and wall time."""
    return row(probe, spec, outcome.status, reason=outcome.reason, wall_s=outcome.wall_s, name=name)


def raised(probe: str, spec: StepSpec | None, exc: BaseException, *, wall_s: float) -> ProbeRow:
    """An in-process probe that raised: an error row with the exception on one line; a fake
    trace or count stopped at its deadline (``fake_kernels.TraceOverBudget``) is a skipped row
    that says so."""
    from profilers.fake_kernels import TraceOverBudget

    if isinstance(exc, TraceOverBudget):
        reason = f"{TIME_SPENT}: {exc} ({wall_s:.0f} s); {LARGER_BUDGET}"
        return row(probe, spec, "skipped", reason=reason, wall_s=wall_s)
    return row(probe, spec, "error", reason=one_line(exc), wall_s=wall_s)


def measured(
    probe: str,
    spec: StepSpec | None,
    *,
    value: float | None,
    unit: str,
    wall_s: float,
    name: str | None = None,
    reason: str = "",
) -> ProbeRow:
    """An ``ok`` probe and its headline number; ``reason`` may add context (e.g. threads)."""
    return row(probe, spec, "ok", reason=reason, wall_s=wall_s, value=value, unit=unit, name=name)


def fit_gap(
    probe: str, *, name: str, status: str, reason: str, precision: str, checkpointing: str
) -> ProbeRow:
    """A group whose records a fit could not use (``{probe}_fit``), keyed by its precision and
    checkpointing rather than by one step."""
    return ProbeRow(
        probe=f"{probe}_fit",
        name=name,
        status=status,
        reason=reason,
        precision=precision,
        activation_checkpointing=checkpointing,
    )
