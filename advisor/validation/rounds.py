"""Routing configs to validators, and repeated visits of the close contenders.

:func:`validate_rounds` is what recommend calls: every finalist once through :func:`route`, then
the close contenders (within :data:`TIE_MARGIN` of the fastest) again, at different moments and
in alternating order, their samples pooled, so that a near tie is decided by more than one
moment of a shared host.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence

from advisor.validation.validator import Validator
from strategies.budgets import BUSY_HOST_SHARE, DEFAULT_VALIDATE_ROUNDS, TIE_MARGIN
from strategies.config import TrainConfig
from strategies.cost import Prediction
from strategies.plan import Measurement
from strategies.space import Candidate


def route(
    configs: Sequence[TrainConfig],
    predictions: Sequence[Prediction],
    validators: Sequence[Validator],
) -> list[Measurement]:
    """Measure each config with the first validator that accepts it (batched per validator)."""
    results: list[Measurement | None] = [None] * len(configs)
    batches: dict[int, list[int]] = {}
    for i, config in enumerate(configs):
        refusals = []
        for j, validator in enumerate(validators):
            why = validator.unsupported_reason(config)
            if why is None:
                batches.setdefault(j, []).append(i)
                break
            refusals.append(why)
        else:
            reason = "; ".join(refusals) or "no validator"
            results[i] = Measurement(status="not_validated", reason=reason)
    for j, indices in batches.items():
        measured = validators[j].validate(
            [configs[i] for i in indices], [predictions[i] for i in indices]
        )
        for i, m in zip(indices, measured, strict=True):
            results[i] = m
    return [m if m is not None else Measurement(status="error", reason="lost") for m in results]


# -- close contenders: more visits, at different moments ---------------------------------------
# (TIE_MARGIN and DEFAULT_VALIDATE_ROUNDS, with their measurements: strategies.budgets)


def merge_measurements(first: Measurement, again: Measurement) -> Measurement:
    """One measurement from two visits of the same config: the samples pooled (throughput from
    their median), the larger memory peak and host share, the walls summed. A failed visit
    wins: a config that ran out of memory or crashed once is not one to recommend."""
    visits = first.visits + again.visits
    wall = first.wall_s + again.wall_s
    shares = [s for s in (first.host_others_share, again.host_others_share) if s is not None]
    first = dataclasses.replace(first, host_others_share=max(shares, default=None))
    if not first.ok:
        return dataclasses.replace(first, visits=visits, wall_s=wall)
    if not again.ok:
        reason = f"visit {visits}: {again.reason}"
        if first.tokens_per_s:
            reason += f" (earlier visits measured {first.tokens_per_s:,.0f} tok/s)"
        return dataclasses.replace(
            again,
            reason=reason,
            visits=visits,
            wall_s=wall,
            host_others_share=first.host_others_share,
        )
    assert first.step_time_s and first.tokens_per_s
    tokens_per_step = first.tokens_per_s * first.step_time_s
    samples = first.step_samples_s + again.step_samples_s
    step = statistics.median(samples)
    return dataclasses.replace(
        first,
        step_time_s=step,
        tokens_per_s=tokens_per_step / step,
        peak_memory_bytes=max(first.peak_memory_bytes or 0, again.peak_memory_bytes or 0),
        step_samples_s=samples,
        wall_s=wall,
        visits=visits,
    )


def contenders(measurements: Sequence[Measurement], margin: float = TIE_MARGIN) -> list[int]:
    """Indices of the measured configs within ``margin`` of the fastest, fastest first."""
    ok = [(m.tokens_per_s or 0.0, i) for i, m in enumerate(measurements) if m.ok]
    band = _band(measurements, margin)
    return [i for t, i in sorted(ok, reverse=True) if t >= band]


def _band(measurements: Sequence[Measurement], margin: float) -> float:
    """The tokens/s a config needs to be within ``margin`` of the fastest measured one."""
    return (1.0 - margin) * max((m.tokens_per_s or 0.0 for m in measurements if m.ok), default=0.0)


# Failures a finalist's first visit may end in that another candidate may not: it ran out of
# memory, crashed, or ran past its time. "not_validated" (no validator takes the config) is not
# one: a replacement of the same kind would be refused alike.
REPLACEABLE = frozenset({"oom", "error", "timeout"})

# Given the index of a config whose first visit failed and that measurement, the config to
# measure in its place (and its prediction), or None.
Replace = Callable[[int, Measurement], tuple[TrainConfig, Prediction] | None]


def backfill(
    configs: list[TrainConfig],
    predictions: list[Prediction],
    results: list[Measurement],
    validators: Sequence[Validator],
    replace: Replace,
    say: Callable[[str], None],
) -> None:
    """In place: for each config whose visit failed (:data:`REPLACEABLE`), measure the one
    ``replace`` names instead, appended to the three lists; a replacement that fails is
    replaced in turn, until ``replace`` has none left."""
    pending = [i for i, m in enumerate(results) if m.status in REPLACEABLE]
    while pending:
        extra = [(i, nxt) for i in pending if (nxt := replace(i, results[i])) is not None]
        if not extra:
            return
        for i, (config, _) in extra:
            failed, instead = Candidate.from_config(configs[i]), Candidate.from_config(config)
            say(
                f"validation: {failed.label()} failed ({results[i].status}); measuring "
                f"{instead.label()} in its place"
            )
        start = len(configs)
        configs += [config for _, (config, _) in extra]
        predictions += [prediction for _, (_, prediction) in extra]
        measured = route(configs[start:], predictions[start:], validators)
        results += measured
        pending = [start + k for k, m in enumerate(measured) if m.status in REPLACEABLE]


def validate_rounds(
    configs: Sequence[TrainConfig],
    predictions: Sequence[Prediction],
    validators: Sequence[Validator],
    *,
    rounds: int = DEFAULT_VALIDATE_ROUNDS,
    margin: float = TIE_MARGIN,
    progress: Callable[[str], None] | None = None,
    replace: Replace | None = None,
) -> list[Measurement]:
    """:func:`route` every config once, then up to ``rounds - 1`` more visits of the close
    contenders (within ``margin`` of the fastest), each round in the reverse order of the one
    before, samples pooled.

    One short visit measures the host's state at that moment as much as the config: two configs
    a few percent apart can swap places from one minute to the next (a multi-threaded process
    suffers more from a busy neighbour than single-threaded ranks do). Visiting the contenders
    again, in reverse order each round, spreads that drift over all of them, like the
    profiler's interleaved timing does within one process. A config whose one visit fell below
    its prediction's 90% interval, and which would be a contender as predicted, is visited
    again too (:func:`suspects`): one slow moment of the host must not rule out the
    predicted best. So is a config whose latest visit ran on a busy host (:func:`busy_visits`:
    others took at least :data:`BUSY_HOST_SHARE` of its CPU time meanwhile). Stops early when a
    round leaves fewer than two configs to compare.

    With ``replace``, a config whose first visit failed (out of memory, crashed, timed out) is
    replaced by the one ``replace`` names (:func:`backfill`), so that a failure among the
    finalists does not leave fewer configs measured; the replacements' measurements follow the
    given configs' in the returned list, in the order they were made.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    say = progress or (lambda _m: None)
    configs, predictions = list(configs), list(predictions)
    results = route(configs, predictions, validators)
    if replace is not None:
        backfill(configs, predictions, results, validators, replace, say)
    latest = list(results)  # each config's last visit alone
    order = list(range(len(configs)))
    doubted: set[int] = set()
    for r in range(1, rounds):
        close = set(contenders(results, margin))
        band = _band(results, margin)
        # A doubted config stays while its latest visit alone is within the margin: pooled
        # with the slow one, two visits can still sit outside it; a third decides.
        doubted = {i for i in doubted if latest[i].ok and (latest[i].tokens_per_s or 0.0) >= band}
        busy = set(busy_visits(latest)) - close
        doubted = (doubted | set(suspects(results, predictions, margin)) | busy) - close
        if len(close | doubted) < 2:
            break
        order = [i for i in reversed(order) if i in close | doubted]
        why = []
        if doubted - busy:
            why.append(
                f"{len(doubted - busy)} measured below the 90% interval of a prediction that "
                "would make them contenders"
            )
        if busy:
            why.append(f"{len(busy)} measured while others took a busy share of the host")
        configs_close = f"{len(close)} config{'' if len(close) == 1 else 's'}"
        say(
            f"validation round {r + 1}/{rounds}: {configs_close} within {margin:.0%} of "
            "the fastest" + "".join(f" and {w}" for w in why) + ", measuring them again"
        )
        again = route([configs[i] for i in order], [predictions[i] for i in order], validators)
        for i, m in zip(order, again, strict=True):
            results[i] = merge_measurements(results[i], m)
            latest[i] = m
    return results


def busy_visits(latest: Sequence[Measurement], share: float = BUSY_HOST_SHARE) -> list[int]:
    """Indices of configs whose latest visit ran while other processes took at least
    ``share`` of the host's CPU time (Measurement.host_others_share): that visit measured the
    moment as much as the config, so another visit at another moment may tell them apart."""
    return [
        i
        for i, m in enumerate(latest)
        if m.ok and m.host_others_share is not None and m.host_others_share >= share
    ]


def suspects(
    measurements: Sequence[Measurement],
    predictions: Sequence[Prediction | None],
    margin: float = TIE_MARGIN,
) -> list[int]:
    """Indices of configs visited once whose visit fell below their prediction's 90% interval
    (strategies.uncertainty) and outside ``margin`` of the fastest, while the interval itself
    reaches that band: as predicted they would be contenders, as measured once they are not.
    The profile's error and the host's moment both fit that; a second visit tells them apart
    (the 8th regret session's validation measured a config once at 1,208 tok/s, 26% below the
    grid's 1,625-1,641, and dropped it). The interval leaves out the host's drift since the
    profile (Prediction.comparable_tokens_per_s_interval), which moves every config of one
    validation alike. Predictions without an interval raise no doubt."""
    band = _band(measurements, margin)
    out = []
    for i, (m, p) in enumerate(zip(measurements, predictions, strict=True)):
        interval = p.comparable_tokens_per_s_interval if p is not None else None
        if not m.ok or m.visits != 1 or interval is None or m.tokens_per_s is None:
            continue
        if m.tokens_per_s < min(interval[0], band) and interval[1] >= band:
            out.append(i)
    return out
