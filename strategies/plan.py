"""The plan: the chosen config, what it is predicted and measured to cost, and why.

Pure: :func:`decide` turns a search's evaluations, the validation measurements and the baseline
into a :class:`Plan`; :meth:`Plan.save` writes ``plan.json`` and ``trials.csv`` (DESIGN.md).
Measurements come from advisor's validators (real short runs); this module only compares them.
The records and their files are in :mod:`strategies.plan_records`, the reasons' wording in
:mod:`strategies.plan_reasons`.

Rules: the best MEASURED candidate wins among those validated; a candidate that could not be
validated (a distributed one before the launcher exists, a what-if) never beats a validated one,
and when it is predicted faster the reasons say so. Without any validated candidate the best
predicted wins and the plan says it was not validated.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from strategies.budgets import LAYOUT_MARGIN
from strategies.config import TrainConfig
from strategies.cost import CostModel, GiB
from strategies.errors import UNPRICED, NothingFits, StrategyError
from strategies.plan_reasons import plan_reasons
from strategies.plan_records import (
    MEASUREMENT_STATUSES,
    PLAN_SCHEMA_VERSION,
    TRIAL_COLUMNS,
    Baseline,
    Measurement,
    Plan,
    Validation,
    trial_rows,
    write_trials_csv,
)
from strategies.prediction import memory_size
from strategies.search import Evaluation, SearchResult, evaluate
from strategies.space import Candidate, SearchSpace, divisors
from strategies.uncertainty import interval_overlaps

__all__ = [
    "LAYOUT_MARGIN",
    "MEASUREMENT_STATUSES",
    "NUM_ALTERNATIVES",
    "PLAN_SCHEMA_VERSION",
    "TRIAL_COLUMNS",
    "Baseline",
    "Measurement",
    "Plan",
    "Validation",
    "decide",
    "naive_baseline",
    "nothing_fits",
    "replacement",
    "top_candidates",
    "trial_rows",
    "write_trials_csv",
]

NUM_ALTERNATIVES = 5


# -- baseline, failure, decision -----------------------------------------------------------------


def naive_baseline(model: CostModel, global_batch_size: int) -> Baseline:
    """The seeds' loop, with the smallest accumulation that fits (DESIGN.md)."""
    last: Evaluation | None = None
    for accum in divisors(global_batch_size):  # ascending accumulation = descending micro-batch
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
    # Over the budget at every accumulation, or not priceable at all (a profile limited to
    # other precisions has no fp32 fit): said apart.
    reason = (
        f"the naive fp32 loop could not be priced ({why})"
        if last is not None and last.prediction is None
        else f"the naive fp32 loop does not fit at any accumulation ({why})"
    )
    return Baseline(candidate=None, predicted=None, reason=reason)


def _unfit_device(model: CostModel) -> StrategyError | None:
    """When even the least traced single-device step (micro-batch 1) needs more than the
    budget, the profile timed nothing (profilers.phases_core): say so and point at a what-if,
    rather than at the fits that are missing because of it. None when some step fits."""
    single = [m for m in model.memory_models if getattr(m, "parallelism", "single") == "single"]
    if not single:
        return None
    least = min(m.predict(1) for m in single)
    if least <= model.budget_bytes:
        return None
    return StrategyError(
        f"the model does not fit this device: its least traced step needs {least / 2**30:.1f} "
        f"GiB at micro-batch 1, the budget is {memory_size(model.budget_bytes)}, so the "
        "profile timed nothing here; plan it for larger devices with --target (e.g. --target "
        "h100-80gb --world-size 64)"
    )


def nothing_fits(evaluations: Sequence[Evaluation], model: CostModel) -> StrategyError:
    """The error for a search with no feasible candidate: the least memory any needs, and the
    knob that would help most, read off that candidate's breakdown."""
    priced = [e for e in evaluations if e.prediction is not None]
    if not priced:
        unfit = _unfit_device(model)
        if unfit is not None:
            return unfit
        # The reason most candidates share leads, the first of the search's order among equals
        # (sorted by name, a memory fit missing for one checkpointing hid the step times
        # missing for none, full and every blocks:K).
        counts = Counter(e.reason for e in evaluations if e.reason)
        reasons = [reason for reason, _ in counts.most_common()]  # ties: the search's order
        if model.interrupted_probes:
            return StrategyError(
                f"{UNPRICED}: Ctrl-C stopped it before "
                f"it measured enough ({model.interrupted_probes} probes cut short, "
                "'interrupted (Ctrl-C)' in its probes.csv): run 'advisor profile' again and "
                "let it finish"
            )
        others = (
            f" ({counts[reasons[0]]} of {sum(counts.values())} candidates; the others' "
            "reasons are in trials.csv)"
            if len(reasons) > 1
            else ""
        )
        return StrategyError(
            f"{UNPRICED}: " + (reasons[0] + others if reasons else "the space is empty")
        )
    smallest = min(priced, key=lambda e: e.prediction.budgeted_bytes if e.prediction else 0)
    p = smallest.prediction
    assert p is not None
    memory = p.breakdown.memory
    assert memory is not None  # the cost model's predictions carry their terms
    state = memory.model_state_bytes
    machine = model.machine
    hints = []
    needed_fraction = p.budgeted_bytes / machine.memory_bytes
    if needed_fraction <= 1:
        # Rounded up: 0.0219 shown as "at least 0.02" failed again at 0.02.
        least = math.ceil(needed_fraction * 100) / 100
        hints.append(f"a larger --memory-budget (at least {least:.2f})")
    if memory.traced_bytes - state > state:
        hints.append("a shorter sequence (--seq-len, then re-profile): activations dominate")
    elif machine.shared_host:
        hints.append("a smaller model or more RAM: CPU ranks share one host's memory")
    elif (fixed := _unsharded_bytes(smallest.candidate, p.budgeted_bytes, state)) > (
        p.budget_bytes
    ):
        hints.append(
            f"tensor or expert parallelism (the advisor does not plan them): {fixed / GiB:.1f} "
            "GiB of each rank do not shrink with more FSDP ranks (a gathered block, its "
            "gradients before their reduce-scatter, activations), so no --world-size fits"
        )
    else:
        hints.append(
            "fsdp over more devices (--world-size): parameters, gradients and optimizer state "
            "dominate and FSDP shards them"
        )
    if machine.estimate:
        hints.append("a --target with more memory")
    unpriced = _unpriced_note(evaluations, smallest.candidate)
    return NothingFits(
        f"nothing fits the memory budget of {memory_size(p.budget_bytes)} "
        f"({model.memory_budget:g} × {memory_size(machine.memory_bytes)} of {machine.name}): "
        f"the smallest candidate ({smallest.candidate.label()}) needs "
        f"{memory_size(p.budgeted_bytes)}{unpriced}; try " + ", or ".join(hints),
        smallest_bytes=p.budgeted_bytes,
        budget_bytes=p.budget_bytes,
    )


def _unpriced_note(evaluations: Sequence[Evaluation], smallest: Candidate) -> str:
    """When the smallest priced candidate does not checkpoint every block and candidates of
    other checkpointing settings could not be priced (they may hold less): how many, and why
    (one of them: full checkpointing, the smallest's precision and layout first), so the
    error sends the user to the profile that prices them, not only to other hardware. Seen
    on Qwen3.5-9B's default profile (2026-12-06): it traced bf16 without checkpointing only,
    and "nothing fits" named tensor parallelism while every checkpointed candidate was
    unpriced. "" otherwise."""
    if smallest.activation_checkpointing == "full":
        return ""
    others = [
        e
        for e in evaluations
        if e.prediction is None
        and e.reason
        and e.candidate.activation_checkpointing != smallest.activation_checkpointing
    ]
    if not others:
        return ""
    example = min(
        others,
        key=lambda e: (
            e.candidate.activation_checkpointing != "full",
            e.candidate.precision != smallest.precision,
            e.candidate.parallelism != smallest.parallelism,
        ),
    )
    return (
        f" (and {len(others)} candidates with other checkpointing were not priced, e.g. "
        f"{example.candidate.label()}: {example.reason})"
    )


def _unsharded_bytes(candidate: Candidate, budgeted: int, state: int) -> int:
    """What an FSDP rank needs beyond its 1/N of the model's state: no more ranks shrink it.
    0 for any other layout."""
    if candidate.parallelism != "fsdp" or candidate.world_size < 1:
        return 0
    return max(budgeted - state // candidate.world_size, 0)


def top_candidates(
    result: SearchResult, k: int, *, layout_margin: float = LAYOUT_MARGIN
) -> list[Evaluation]:
    """What validation measures: the ``k`` best predicted feasible candidates, then the best
    predicted of each parallelism layout not among them if it may be the fastest: its 90%
    tokens/s interval reaches the best prediction's (strategies.uncertainty; without the host's
    drift since the profile, which moves both alike). Predictions
    without intervals (hand-made ones) use ``layout_margin`` of the best prediction instead.
    None when ``k`` is 0."""
    ranked = result.ranked()
    top = ranked[: max(k, 0)]
    if not top:
        return top
    layouts = {e.candidate.parallelism for e in top}
    best = top[0]
    floor = (1.0 - layout_margin) * best.tokens_per_s
    for e in ranked[len(top) :]:
        if e.candidate.parallelism in layouts:
            continue
        overlap = interval_overlaps(
            e.prediction.comparable_tokens_per_s_interval if e.prediction else None,
            best.prediction.comparable_tokens_per_s_interval if best.prediction else None,
        )
        if overlap if overlap is not None else e.tokens_per_s >= floor:
            top.append(e)
            layouts.add(e.candidate.parallelism)
    return top


def replacement(
    ranked: Sequence[Evaluation],
    failed: Evaluation,
    status: str,
    taken: set[str],
) -> Evaluation | None:
    """What validation measures in place of ``failed``, whose visit ended in ``status``: the
    best ranked candidate whose key is not in ``taken`` (measured, or handed out already) and,
    when ``failed`` ran out of memory, predicted to need less memory than it (its memory
    prediction was short; a candidate predicted to need as much would likely fail alike), of
    the same parallelism layout when one is left (a layout's best is among the finalists to
    find out what that layout measures), else of any. After a crash or a timeout, which may be
    the layout's own (a launcher, a collective), of any layout. None when none is left."""
    need = failed.prediction.budgeted_bytes if failed.prediction else None
    eligible = [
        e
        for e in ranked
        if e.candidate.key not in taken
        and e.prediction is not None
        and not (status == "oom" and need is not None and e.prediction.budgeted_bytes >= need)
    ]
    layout = failed.candidate.parallelism if status == "oom" else None
    same = (e for e in eligible if layout is None or e.candidate.parallelism == layout)
    return next(same, eligible[0] if eligible else None)


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
        # Nothing ran: the best prediction, but never one whose own run ran out of memory
        # (its memory prediction is refuted) while a candidate not known to fail is left.
        failed = {v.candidate.key for v in validations if v.measured.status == "oom"}
        winner = next((e for e in ranked if e.candidate.key not in failed), ranked[0])
        winner_measured = None
    assert winner.prediction is not None
    baseline = _with_baseline_measurement(baseline, measurements, winner, winner_measured)
    reasons = plan_reasons(
        winner, winner_measured, ranked, result, space, model, validations, baseline
    )
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
