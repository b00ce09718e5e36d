"""Why the plan chose what it chose: the reasons plan.json lists, one line each.

The search's notes and counts, the chosen candidate (measured or only predicted), candidates
that could not be validated, the best alternative for each knob, and the baseline.
"""

from __future__ import annotations

from collections.abc import Sequence

from strategies.budgets import BUSY_HOST_SHARE
from strategies.cost import OVERHEAD_UNMEASURED, CostModel, GiB, missing_fit_group
from strategies.plan_records import Baseline, Measurement, Validation
from strategies.search import Evaluation, SearchResult, rank
from strategies.space import SearchSpace, precision_flag


def _fmt_tps(value: float) -> str:
    return f"{value:,.0f} tok/s"


_GROUPS, _PRECISION = "\x00groups\x00", "\x00precision\x00"


def unpredictable_lines(evaluations: Sequence[Evaluation]) -> list[str]:
    """One line per kind of missing measurement, naming every (precision, checkpointing)
    group it concerns, most candidates first. One line per group before: 36 lines of "12
    candidates could not be predicted: the profile has no memory fit for bf16 with blocks:7
    checkpointing ..." for a short profile of bert-base."""
    counts: dict[str, int] = {}
    groups: dict[str, dict[str, list[str]]] = {}  # kind -> precision -> checkpointing settings
    for e in evaluations:
        if e.prediction is not None:
            continue
        p, c = e.candidate.precision, e.candidate.activation_checkpointing
        kind = e.reason
        group = missing_fit_group(p, c)
        if group in kind:
            kind = kind.replace(group, _GROUPS).replace(precision_flag(p), _PRECISION)
            settings = groups.setdefault(kind, {}).setdefault(p, [])
            if c not in settings:
                settings.append(c)
        counts[kind] = counts.get(kind, 0) + 1
    out = []
    for kind, count in sorted(counts.items(), key=lambda item: -item[1]):
        text = kind
        if kind in groups:
            by_precision = groups[kind]
            named = ", or ".join(
                f"{p} with {_either(settings)} checkpointing"
                for p, settings in by_precision.items()
            )
            flags = " or ".join(precision_flag(p) for p in by_precision)
            text = kind.replace(_GROUPS, f"for {named}").replace(_PRECISION, flags)
        out.append(f"{count} candidates could not be predicted: {text}")
    return out


def _either(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def plan_reasons(
    winner: Evaluation,
    winner_measured: Measurement | None,
    ranked: Sequence[Evaluation],
    result: SearchResult,
    space: SearchSpace,
    model: CostModel,
    validations: Sequence[Validation],
    baseline: Baseline,
) -> list[str]:
    """plan.json's ``reasons``, one line each, in the order the module docstring lists."""
    out: list[str] = []
    p = winner.prediction
    assert p is not None
    budget = model.budget_bytes
    out.extend(result.summary()["notes"])
    total = result.space_size if result.screened else len(result.evaluations)
    out.append(
        f"{result.num_fitting} of {total} candidates fit the budget of "
        f"{budget / GiB:.2f} GiB ({model.memory_budget:g} × {model.machine.memory_bytes / GiB:.2f}"
        f" GiB, {model.machine.name})"
    )
    out.extend(unpredictable_lines(result.evaluations))
    out.extend(a for a in model.assumptions if a.startswith(OVERHEAD_UNMEASURED))
    for excluded in space.excluded:
        out.append(f"not considered: {excluded}")
    if winner_measured is not None:
        num_ok = sum(v.measured.ok for v in validations)
        visits = winner_measured.visits
        over = f" over {visits} separate runs" if visits > 1 else ""
        out.append(
            f"chosen: {winner.candidate.label()}: measured "
            f"{_fmt_tps(winner_measured.tokens_per_s or 0)}{over} (predicted "
            f"{_fmt_tps(p.tokens_per_s)}), "
            + (
                "the only validated candidate"
                if num_ok == 1
                else f"the fastest of {num_ok} validated candidates"
            )
        )
    else:
        why = "what-if estimates are never measured" if p.estimate else "no candidate was validated"
        out.append(
            f"chosen: {winner.candidate.label()}: predicted {_fmt_tps(p.tokens_per_s)} "
            f"(not validated: {why})"
        )
    top = ranked[0]
    if top.candidate.key != winner.candidate.key and winner_measured is None:
        out.append(
            f"the top predicted candidate ({top.candidate.label()}) and every one ranked above "
            "the chosen one ran out of memory when validated: the chosen one is the best "
            "predicted that was not seen to fail"
        )
    elif top.candidate.key != winner.candidate.key:
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
    busy = busy_host_reason(validations)
    if busy:
        out.append(busy)
    out.extend(_knob_reasons(winner, result.evaluations, validations))
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


def busy_host_reason(validations: Sequence[Validation]) -> str | None:
    """A line when any validated config was measured while others took at least
    :data:`BUSY_HOST_SHARE` of the host's CPU time, else None."""
    shares = [
        (v.measured.host_others_share, v.candidate.label())
        for v in validations
        if v.measured.host_others_share is not None
    ]
    busy = [(s, label) for s, label in shares if s >= BUSY_HOST_SHARE]
    if not busy:
        return None
    worst, label = max(busy)
    return (
        f"validation shared a busy host: other processes took up to {worst:.0%} of its CPU time "
        f"while {len(busy)} of {len(shares)} validated configs were measured ({label} the "
        "most); a busy moment slows every config, multi-threaded ones more, so these "
        "measurements may rank the configs by that moment: re-run 'advisor recommend' when "
        "the host is quiet"
    )


def _knob_reasons(
    winner: Evaluation,
    evaluations: Sequence[Evaluation],
    validations: Sequence[Validation] = (),
) -> list[str]:
    """For each knob, the best candidate that differs from the winner in it (and agrees on the
    other knobs; a different world size also splits the batch differently), and why it lost:
    its prediction against the chosen one's, and, when both were measured, the measurements
    (the decision's evidence: a predicted "1.00×" beside a measured 0.58× read as a coin
    toss)."""
    measured = {
        v.candidate.key: v.measured.tokens_per_s
        for v in validations
        if v.measured.ok and v.measured.tokens_per_s
    }
    chosen_measured = measured.get(winner.candidate.key)
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
            alt_measured = measured.get(alt.candidate.key)
            both = (
                f"; measured {_fmt_tps(alt_measured)}, {alt_measured / chosen_measured:.2f}× "
                f"the chosen config's {_fmt_tps(chosen_measured)}"
                if alt_measured and chosen_measured
                else ""
            )
            out.append(
                f"{name} {mine}: the best alternative ({alt.candidate.label()}) is predicted "
                f"{_fmt_tps(alt.tokens_per_s)}, {ratio:.2f}× the chosen config{both}"
            )
        else:
            alt = differing[0]
            why = "is over the budget" if alt.prediction is not None else "cannot be predicted"
            out.append(
                f"{name} {mine}: no alternative is feasible; e.g. {alt.candidate.label()} {why}: "
                f"{alt.reason}"
            )
    return out
