"""The regret benchmark's analysis: pure functions over its session logs (standard library only).

``benchmarks/regret.py`` measures and writes raw logs; everything it reports is computed here,
from those logs alone, so anyone can re-derive a table from the committed files
(``python benchmarks/regret.py --summarize``) and the rules can be tested on synthetic logs
(tests/benchmarks/test_regret_analysis.py).

Records (one JSON object per line, written by regret.py):

* a **visit**: ``case``, ``kind`` (``grid`` or ``extra``: an advised config that is not in the
  grid, measured apart after the advice), ``pass``, ``order_index``, ``key``, ``layout``,
  ``world_size``, ``tokens_per_step``, ``status``, ``reason``, ``step_s`` (timed steps after the
  warm-up), ``peak_bytes`` (per timed step, the largest rank's resident peak), ``wall_s``;
* an **advisor phase** per case: ``profile`` (wall, status, the profiled overheads),
  ``recommend`` per budget kind (``unconstrained``, ``memory-bound``: wall, status, the advised
  ``key``, the budget it was given) and ``predictions`` (the cost model for every grid config).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

TARGET = 0.97  # advised tokens/s over the best measured config's
WALL_TARGET = 0.10  # advisor wall time (profile + recommend) over one pass of the grid
BUDGET_KINDS = ("unconstrained", "memory-bound")
LAYOUTS = ("single", "ddp", "fsdp")


# -- visit order ----------------------------------------------------------------------------------


def pass_order(keys: Sequence[str], pass_index: int, seed: str) -> list[str]:
    """The order of one pass over the grid. Passes come in pairs: the first of a pair is a
    seeded shuffle, the second its reverse, so a config visited early in one is visited late in
    the other and the host's drift weighs on every config alike. Depends on the keys, the pass
    and the seed only: never on a measurement or on the advice."""
    order = sorted(keys)
    random.Random(f"{seed}/{pass_index // 2}").shuffle(order)
    return order if pass_index % 2 == 0 else order[::-1]


def grid_schedule(keys: Sequence[str], passes: int, seed: str) -> list[tuple[int, int, str]]:
    """Every grid visit of a session's case, in the order they run: (pass, index in the pass,
    key). Each config is visited exactly once per pass; nothing here knows the advice."""
    return [(p, i, key) for p in range(passes) for i, key in enumerate(pass_order(keys, p, seed))]


# -- per-config statistics ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ConfigStats:
    """One config over its visits. ``tokens_per_s`` is the global batch's tokens over the median
    of every timed step of every ok visit (pooled); ``visit_tokens_per_s`` each visit's own, by
    pass (None for a failed visit). ``peak_bytes`` is the largest rank's resident peak, the
    largest over the visits; ``budgeted_bytes`` counts every rank (CPU ranks share the host's
    RAM), as the advisor's ``--memory-budget`` does."""

    key: str
    layout: str
    world_size: int
    visits: int
    visits_ok: int
    status: str
    reason: str
    timed_steps: int
    step_time_s: float | None
    tokens_per_s: float | None
    visit_tokens_per_s: tuple[float | None, ...]
    cv: float | None
    peak_bytes: int | None
    budgeted_bytes: int | None
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["visit_tokens_per_s"] = list(self.visit_tokens_per_s)
        return out


def visit_tokens_per_s(visit: Mapping[str, Any]) -> float | None:
    """One visit's throughput: its tokens per step over the median of its timed steps."""
    steps = visit.get("step_s") or ()
    if visit.get("status") != "ok" or not steps:
        return None
    return float(visit["tokens_per_step"]) / statistics.median(steps)


def coefficient_of_variation(values: Sequence[float]) -> float | None:
    """Sample standard deviation over the mean; None for fewer than two values."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None


def config_stats(visits: Iterable[Mapping[str, Any]]) -> dict[str, ConfigStats]:
    """Every config's statistics from its visits (pass it one case's visits of one kind)."""
    by_key: dict[str, list[Mapping[str, Any]]] = {}
    for v in visits:
        by_key.setdefault(v["key"], []).append(v)
    out: dict[str, ConfigStats] = {}
    for key, mine in by_key.items():
        mine = sorted(mine, key=lambda v: (v["pass"], v.get("order_index", 0)))
        ok = [v for v in mine if v.get("status") == "ok" and v.get("step_s")]
        samples = [float(s) for v in ok for s in v["step_s"]]
        peaks = [int(p) for v in ok for p in v.get("peak_bytes") or ()]
        per_visit = tuple(visit_tokens_per_s(v) for v in mine)
        step = statistics.median(samples) if samples else None
        world = int(mine[0].get("world_size", 1))
        last_failure = next((v for v in reversed(mine) if v.get("status") != "ok"), None)
        out[key] = ConfigStats(
            key=key,
            layout=str(mine[0].get("layout", "single")),
            world_size=world,
            visits=len(mine),
            visits_ok=len(ok),
            status="ok" if samples else (str(last_failure["status"]) if last_failure else "error"),
            reason="" if samples or last_failure is None else str(last_failure.get("reason", "")),
            timed_steps=len(samples),
            step_time_s=step,
            tokens_per_s=float(mine[0]["tokens_per_step"]) / step if step else None,
            visit_tokens_per_s=per_visit,
            cv=coefficient_of_variation([t for t in per_visit if t is not None]),
            peak_bytes=max(peaks) if peaks else None,
            budgeted_bytes=max(peaks) * world if peaks else None,
            wall_s=sum(float(v.get("wall_s", 0.0)) for v in mine),
        )
    return out


def visit_counts(visits: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many visits each config had (failed ones included)."""
    counts: dict[str, int] = {}
    for v in visits:
        counts[v["key"]] = counts.get(v["key"], 0) + 1
    return counts


# -- ranks, regret, the memory-bound budget -------------------------------------------------------


def rank_of(value: float, others: Iterable[float]) -> int:
    """Competition rank ("1224"): one plus how many of ``others`` are strictly faster. A tie
    with the best is rank 1."""
    return 1 + sum(1 for o in others if o > value)


def _fits(stats: ConfigStats, budget_bytes: int | None) -> bool:
    return budget_bytes is None or (
        stats.budgeted_bytes is not None and stats.budgeted_bytes <= budget_bytes
    )


def best_config(stats: Mapping[str, ConfigStats], budget_bytes: int | None = None) -> str | None:
    """The fastest measured config (that measured within ``budget_bytes``); a tie goes to the
    smaller key, so the answer never depends on the order of the log."""
    eligible = [s for s in stats.values() if s.tokens_per_s is not None and _fits(s, budget_bytes)]
    if not eligible:
        return None
    return max(eligible, key=lambda s: (s.tokens_per_s, _reverse_key(s.key))).key


def _reverse_key(key: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in key)


@dataclass(frozen=True, kw_only=True)
class Regret:
    """The advised config against the grid's measured best (within a budget, for the
    memory-bound case). ``in_grid`` False: the advised config is not one of the grid's, so
    there is no grid ratio (it is measured apart, see :func:`apart_ratio`)."""

    advised: str | None
    in_grid: bool
    budget_bytes: int | None
    eligible: int
    best: str | None
    best_tokens_per_s: float | None
    advised_tokens_per_s: float | None
    ratio: float | None
    rank: int | None
    advised_budgeted_bytes: int | None
    advised_fits: bool | None
    advised_status: str | None

    @property
    def meets_target(self) -> bool | None:
        return None if self.ratio is None else self.ratio >= TARGET

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "meets_target": self.meets_target}


def regret(
    stats: Mapping[str, ConfigStats], advised: str | None, budget_bytes: int | None = None
) -> Regret:
    """Grid-measured tokens/s of ``advised`` over the grid's best among the configs that
    measured within ``budget_bytes`` (all of them when None). ``rank`` is the advised config's
    competition rank among those configs and itself (a config over the budget still gets the
    rank it would have, with ``advised_fits`` False)."""
    eligible = [s for s in stats.values() if s.tokens_per_s is not None and _fits(s, budget_bytes)]
    best = best_config(stats, budget_bytes)
    best_tps = stats[best].tokens_per_s if best is not None else None
    mine = stats.get(advised) if advised is not None else None
    tps = mine.tokens_per_s if mine is not None else None
    ratio = tps / best_tps if tps is not None and best_tps else None
    rank = None
    if mine is not None and tps is not None:
        rank = rank_of(tps, [s.tokens_per_s or 0.0 for s in eligible if s.key != mine.key])
    return Regret(
        advised=advised,
        in_grid=mine is not None,
        budget_bytes=budget_bytes,
        eligible=len(eligible),
        best=best,
        best_tokens_per_s=best_tps,
        advised_tokens_per_s=tps,
        ratio=ratio,
        rank=rank,
        advised_budgeted_bytes=mine.budgeted_bytes if mine is not None else None,
        advised_fits=(
            None if mine is None or mine.budgeted_bytes is None else _fits(mine, budget_bytes)
        ),
        advised_status=mine.status if mine is not None else None,
    )


def apart_ratio(
    extra: Mapping[str, ConfigStats], advised: str | None, best_tokens_per_s: float | None
) -> dict[str, Any] | None:
    """An advised config that is not in the grid, measured after the advice by the same
    instrument the same number of times: its tokens/s over the grid's best. Never part of the
    reference (the best is the grid's alone), and labelled as measured apart."""
    mine = extra.get(advised) if advised is not None else None
    if mine is None:
        return None
    tps = mine.tokens_per_s
    return {
        "key": mine.key,
        "visits": mine.visits,
        "visits_ok": mine.visits_ok,
        "status": mine.status,
        "tokens_per_s": tps,
        "budgeted_bytes": mine.budgeted_bytes,
        "ratio_to_grid_best": tps / best_tokens_per_s if tps and best_tokens_per_s else None,
    }


@dataclass(frozen=True, kw_only=True)
class BudgetRule:
    """The memory-bound case's budget, by a rule fixed before any measurement: midway between
    the smallest measured peak of the grid and the measured peak of the unconstrained best
    config, so that the best does not fit and at least one config does. ``budget_bytes`` is
    None (with the reason) when no such budget exists."""

    budget_bytes: int | None
    reason: str
    smallest: str | None = None
    smallest_bytes: int | None = None
    best: str | None = None
    best_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def memory_bound_budget(stats: Mapping[str, ConfigStats]) -> BudgetRule:
    """See :class:`BudgetRule`; peaks in the budget's terms (every rank counted)."""
    measured = {k: s for k, s in stats.items() if s.tokens_per_s is not None and s.budgeted_bytes}
    best = best_config(measured)
    if best is None:
        return BudgetRule(budget_bytes=None, reason="no config of the grid was measured")
    smallest = min(measured.values(), key=lambda s: (s.budgeted_bytes or 0, s.key))
    best_bytes = measured[best].budgeted_bytes or 0
    small_bytes = smallest.budgeted_bytes or 0
    if best_bytes <= small_bytes:
        budget, reason = (
            None,
            (
                "the unconstrained best has the smallest measured peak: no budget excludes it and "
                "admits another config"
            ),
        )
    else:
        budget = (small_bytes + best_bytes) // 2
        reason = "midway between the smallest measured peak and the unconstrained best's"
    return BudgetRule(
        budget_bytes=budget,
        reason=reason,
        smallest=smallest.key,
        smallest_bytes=small_bytes,
        best=best,
        best_bytes=best_bytes,
    )


def budget_fraction(budget_bytes: int, memory_bytes: int) -> float | None:
    """The ``--memory-budget`` fraction F with floor(F × ``memory_bytes``) == ``budget_bytes``
    (how the cost model turns the fraction into bytes); None when the budget exceeds the
    memory."""
    if memory_bytes <= 0 or not 0 < budget_bytes <= memory_bytes:
        return None
    fraction = min(1.0, (budget_bytes + 0.5) / memory_bytes)
    while math.floor(fraction * memory_bytes) > budget_bytes:
        fraction = math.nextafter(fraction, 0.0)
    while math.floor(fraction * memory_bytes) < budget_bytes and fraction < 1.0:
        fraction = math.nextafter(fraction, 1.0)
    return fraction


# -- the host's spread ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Spread:
    """How much the host moves a measurement from one visit to the next.

    ``median_cv``: the median over configs (with two or more ok visits) of the coefficient of
    variation of their visits' tokens/s. ``pass_best``: per pass, the fastest config of that
    pass alone and its tokens/s; ``pass_best_spread``: the largest pass's best over the
    smallest's, minus one. ``value`` is the larger of the two: what the statements compare."""

    median_cv: float | None
    configs_with_repeats: int
    pass_best: tuple[tuple[int, str, float], ...]
    pass_best_spread: float | None

    @property
    def value(self) -> float | None:
        known = [v for v in (self.median_cv, self.pass_best_spread) if v is not None]
        return max(known) if known else None

    @property
    def pass_winners_differ(self) -> bool:
        return len({key for _p, key, _t in self.pass_best}) > 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "median_cv": self.median_cv,
            "configs_with_repeats": self.configs_with_repeats,
            "pass_best": [list(p) for p in self.pass_best],
            "pass_best_spread": self.pass_best_spread,
            "value": self.value,
            "pass_winners_differ": self.pass_winners_differ,
        }


def host_spread(grid_visits: Iterable[Mapping[str, Any]]) -> Spread:
    """:class:`Spread` of one case's grid visits."""
    visits = list(grid_visits)
    stats = config_stats(visits)
    cvs = [s.cv for s in stats.values() if s.cv is not None]
    per_pass: dict[int, list[tuple[float, str]]] = {}
    for v in visits:
        tps = visit_tokens_per_s(v)
        if tps is not None:
            per_pass.setdefault(int(v["pass"]), []).append((tps, v["key"]))
    pass_best = tuple(
        (p, key, tps)
        for p, found in sorted(per_pass.items())
        for tps, key in [max(found, key=lambda t: (t[0], _reverse_key(t[1])))]
    )
    bests = [t for _p, _k, t in pass_best]
    return Spread(
        median_cv=statistics.median(cvs) if cvs else None,
        configs_with_repeats=len(cvs),
        pass_best=pass_best,
        pass_best_spread=max(bests) / min(bests) - 1 if len(bests) > 1 else None,
    )


def spread_statement(ratio: float | None, spread: float | None, target: float = TARGET) -> str:
    """A plain statement when the host's spread exceeds the gap between the ratio and the
    target (the measurement then cannot say on which side of the target the advisor is), or
    when the spread is unknown (one pass); empty otherwise."""
    if ratio is None:
        return ""
    if spread is None:
        return (
            "with one visit per config the host's spread is unknown, and so is this ratio's "
            "uncertainty"
        )
    gap = abs(ratio - target)
    if spread <= gap:
        return ""
    return (
        f"the host's visit-to-visit spread ({spread:.1%}) exceeds the gap between the ratio "
        f"{ratio:.3f} and the {target} target ({gap:.1%}): this measurement cannot tell whether "
        "the target is met"
    )


# -- the cost model against the grid --------------------------------------------------------------


def _error_stats(errors: Sequence[float]) -> dict[str, Any]:
    if not errors:
        return {"n": 0, "median_abs": None, "max_abs": None, "median": None}
    return {
        "n": len(errors),
        "median_abs": statistics.median(abs(e) for e in errors),
        "max_abs": max(abs(e) for e in errors),
        "median": statistics.median(errors),
    }


def prediction_errors(
    stats: Mapping[str, ConfigStats],
    predictions: Mapping[str, Mapping[str, Any]],
    overheads: Mapping[str, Any],
) -> dict[str, dict[str, Any]]:
    """Predicted / measured − 1 per layout (and ``all``), for every grid config:

    * ``time``: step time (``time_unprobed``: only configs whose point the throughput probe
      never ran);
    * ``memory``: the traced peak against the measured resident peak minus the profiled
      per-process (``fixed``) and per-rank (``parallel[layout]``) overheads: what
      ``advisor.validation.LauncherValidator`` reports, like for like with the trace;
    * ``budgeted``: the predicted budgeted bytes against the measured peak in the same terms
      (every rank counted): what the memory budget is checked with.
    """
    fixed = int(overheads.get("fixed") or 0)
    parallel = dict(overheads.get("parallel") or {})
    out: dict[str, dict[str, Any]] = {}
    for group in (*LAYOUTS, "all"):
        time_e: list[float] = []
        unprobed: list[float] = []
        memory_e: list[float] = []
        budget_e: list[float] = []
        configs = unpredictable = 0
        for key, s in stats.items():
            if group not in ("all", s.layout):
                continue
            configs += 1
            p = predictions.get(key) or {}
            if "step_time_s" not in p:
                unpredictable += 1
                continue
            if s.step_time_s:
                e = float(p["step_time_s"]) / s.step_time_s - 1
                time_e.append(e)
                if not p.get("probed", False):
                    unprobed.append(e)
            if s.peak_bytes:
                like = s.peak_bytes - fixed - int(parallel.get(s.layout, 0))
                if p.get("traced_bytes") and like > 0:
                    memory_e.append(float(p["traced_bytes"]) / like - 1)
                if s.budgeted_bytes and p.get("budgeted_bytes"):
                    budget_e.append(float(p["budgeted_bytes"]) / s.budgeted_bytes - 1)
        out[group] = {
            "configs": configs,
            "unpredictable": unpredictable,
            "time": _error_stats(time_e),
            "time_unprobed": _error_stats(unprobed),
            "memory": _error_stats(memory_e),
            "budgeted": _error_stats(budget_e),
        }
    return out


def _interval(value: Any) -> tuple[float, float] | None:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    try:
        low, high = float(value[0]), float(value[1])
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        return None
    return low, high


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Predicted intervals against the grid's measurements: the fraction of configs whose
    measured value lies inside its interval (a 90% interval should hold about 0.9 of them) and
    the median relative width, (high − low) / predicted point."""

    quantity: str
    configs: int
    inside: int
    median_relative_width: float | None

    @property
    def fraction_inside(self) -> float | None:
        return self.inside / self.configs if self.configs else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fraction_inside": self.fraction_inside}


def calibration(
    stats: Mapping[str, ConfigStats], predictions: Mapping[str, Mapping[str, Any]]
) -> list[Calibration]:
    """Calibration of ``step_time_s_interval`` and ``tokens_per_s_interval`` where the
    predictions carry them; empty when none does."""
    out: list[Calibration] = []
    for quantity, measured_of in (
        ("step_time_s", lambda s: s.step_time_s),
        ("tokens_per_s", lambda s: s.tokens_per_s),
    ):
        inside = configs = 0
        widths: list[float] = []
        for key, s in stats.items():
            p = predictions.get(key) or {}
            interval = _interval(p.get(f"{quantity}_interval"))
            measured = measured_of(s)
            if interval is None or measured is None:
                continue
            configs += 1
            inside += interval[0] <= measured <= interval[1]
            point = p.get(quantity)
            if point:
                widths.append((interval[1] - interval[0]) / float(point))
        if configs:
            out.append(
                Calibration(
                    quantity=quantity,
                    configs=configs,
                    inside=inside,
                    median_relative_width=statistics.median(widths) if widths else None,
                )
            )
    return out


# -- what the knobs of issue 14 gain --------------------------------------------------------------

# The knobs a grid had before issue 14: whole-model checkpointing, FSDP resharded after
# forward, the plain loss, eager. A key with any other value uses a new knob.
_PLAIN_CHECKPOINTING = ("none", "full")


def uses_new_knob(key: str) -> bool:
    """Whether a config key (strategies.space.Candidate.key) uses selective checkpointing
    (ops, blocks:K), FSDP kept gathered (/kg), a chunked loss (/lcN) or torch.compile (/tc)."""
    parts = key.split("/")
    return parts[1] not in _PLAIN_CHECKPOINTING or len(parts) > 5


def knob_gain(
    stats: Mapping[str, ConfigStats], budget_bytes: int | None = None
) -> dict[str, Any] | None:
    """The grid's measured best against its best without the new knobs (within
    ``budget_bytes``): what searching them gains on this host. None when the grid holds no
    config with a new knob, or no plain one measured."""
    if not any(uses_new_knob(k) for k in stats):
        return None
    best = best_config(stats, budget_bytes)
    plain = best_config({k: s for k, s in stats.items() if not uses_new_knob(k)}, budget_bytes)
    if best is None or plain is None:
        return None
    best_tps, plain_tps = stats[best].tokens_per_s, stats[plain].tokens_per_s
    assert best_tps is not None and plain_tps is not None
    return {
        "best": best,
        "best_tokens_per_s": best_tps,
        "plain_best": plain,
        "plain_tokens_per_s": plain_tps,
        "gain": best_tps / plain_tps,
        "knob_configs": sum(1 for k in stats if uses_new_knob(k)),
    }


# -- one case of one session ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CaseResult:
    """Everything reported for one model × global batch of one session."""

    session: str
    case: str
    group: str  # what sessions are compared on: model, its args, shape, precisions, quick
    model: str
    role: str
    global_batch_size: int
    passes: int
    configs: int
    configs_measured: int
    visits_per_config: dict[str, int]
    failed: list[dict[str, Any]]
    grid_complete: bool
    grid_pass_wall_s: list[float]
    advisor: dict[str, Any] | None
    regrets: dict[str, dict[str, Any]]
    spread: dict[str, Any]
    statements: dict[str, str]
    prediction_errors: dict[str, dict[str, Any]] | None
    calibration: list[dict[str, Any]] | None
    top: list[dict[str, Any]]
    loadavg: list[float] | None
    stats: list[dict[str, Any]] = field(default_factory=list)
    # Per budget kind: the best config against the best without issue 14's knobs (knob_gain).
    knob_gains: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The grid's visits that logged the host's share others took (sessions from 2026-12-04 on):
    # how many, how many of them on a busy host, the largest share (busy_host).
    busy_host: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def analyse_case(
    *,
    session: str,
    case: Mapping[str, Any],
    visits: Sequence[Mapping[str, Any]],
    advisor: Mapping[str, Any] | None,
) -> CaseResult:
    """One case from its raw records: ``case`` (``id``, ``group``, ``model``, ``role``,
    ``global_batch_size``, ``passes``, ``keys``: the grid), its visits, its advisor phase."""
    keys = list(case["keys"])
    grid_visits = [v for v in visits if v.get("kind", "grid") == "grid" and v["key"] in keys]
    extra_visits = [v for v in visits if v.get("kind") == "extra"]
    stats = config_stats(grid_visits)
    extra = config_stats(extra_visits)
    counts = visit_counts(grid_visits)
    passes = int(case["passes"])
    complete = all(counts.get(k, 0) >= passes for k in keys)
    walls: dict[int, float] = {}
    for v in grid_visits:
        walls[int(v["pass"])] = walls.get(int(v["pass"]), 0.0) + float(v.get("wall_s", 0.0))
    spread = host_spread(grid_visits)
    regrets: dict[str, dict[str, Any]] = {}
    statements: dict[str, str] = {}
    predictions: Mapping[str, Mapping[str, Any]] = {}
    gains: dict[str, dict[str, Any]] = {}
    if (gain := knob_gain(stats)) is not None:
        gains["unconstrained"] = gain
    if advisor is not None:
        predictions = advisor.get("predictions") or {}
        for kind in BUDGET_KINDS:
            rec = (advisor.get("recommend") or {}).get(kind)
            if rec is None:
                continue
            if rec.get("status") == "skipped":
                regrets[kind] = {
                    "skipped": rec.get("reason", ""),
                    "rule": memory_bound_budget(stats).to_dict(),
                }
                continue
            budget = rec.get("budget_bytes") if kind == "memory-bound" else None
            r = regret(stats, rec.get("key"), budget)
            entry = r.to_dict()
            entry["recommend_status"] = rec.get("status")
            entry["apart"] = (
                apart_ratio(extra, rec.get("key"), r.best_tokens_per_s) if not r.in_grid else None
            )
            if kind == "memory-bound":
                entry["rule"] = memory_bound_budget(stats).to_dict()
                if (gain := knob_gain(stats, budget)) is not None:
                    gains[kind] = gain
            regrets[kind] = entry
            text = spread_statement(r.ratio, spread.value)
            if text:
                statements[kind] = text
    overheads = (advisor or {}).get("overheads") or {}
    ranked = sorted(
        (s for s in stats.values() if s.tokens_per_s is not None),
        key=lambda s: (-(s.tokens_per_s or 0.0), s.key),
    )
    loads = [float(v["loadavg"][0]) for v in visits if v.get("loadavg")]
    return CaseResult(
        session=session,
        case=str(case["id"]),
        group=str(case["group"]),
        model=str(case["model"]),
        role=str(case.get("role", "other")),
        global_batch_size=int(case["global_batch_size"]),
        passes=passes,
        configs=len(keys),
        configs_measured=sum(1 for s in stats.values() if s.tokens_per_s is not None),
        visits_per_config={k: counts.get(k, 0) for k in keys},
        failed=[
            {"key": s.key, "status": s.status, "reason": s.reason}
            for s in stats.values()
            if s.tokens_per_s is None
        ],
        grid_complete=complete,
        grid_pass_wall_s=[walls[p] for p in sorted(walls)],
        # The predictions are in the raw log and summarised above: not copied again.
        advisor={k: v for k, v in advisor.items() if k != "predictions"} if advisor else None,
        regrets=regrets,
        spread=spread.to_dict(),
        statements=statements,
        prediction_errors=prediction_errors(stats, predictions, overheads) if predictions else None,
        calibration=[c.to_dict() for c in calibration(stats, predictions)] if predictions else None,
        top=[
            {"key": s.key, "tokens_per_s": s.tokens_per_s, "budgeted_bytes": s.budgeted_bytes}
            for s in ranked[:5]
        ],
        loadavg=[min(loads), max(loads)] if loads else None,
        stats=[s.to_dict() for s in stats.values()],
        knob_gains=gains,
        busy_host=busy_host(grid_visits),
    )


def busy_host(visits: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Of the visits that logged ``host_others_share``: their count, how many ran while others
    took at least the product's BUSY_HOST_SHARE of the host, and the largest share; None when
    none logged it."""
    from strategies.budgets import BUSY_HOST_SHARE

    shares = [
        float(v["host_others_share"]) for v in visits if v.get("host_others_share") is not None
    ]
    if not shares:
        return None
    return {
        "visits": len(shares),
        "busy": sum(1 for x in shares if x >= BUSY_HOST_SHARE),
        "threshold": BUSY_HOST_SHARE,
        "max": max(shares),
    }


# -- every session --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GroupSummary:
    """One model × global batch × budget kind over every session that measured it: each
    session's ratio and rank, and their spread. Nothing is chosen: every finished session is
    listed and counted."""

    group: str
    model: str
    role: str
    global_batch_size: int
    budget: str
    sessions: list[dict[str, Any]]
    ratio_min: float | None
    ratio_median: float | None
    ratio_max: float | None
    statements: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize_sessions(cases: Iterable[CaseResult]) -> list[GroupSummary]:
    """Per group × budget kind, over every session's case (finished or not; an unfinished one
    is listed with its state and left out of the ratio range)."""
    grouped: dict[tuple[str, int, str], list[CaseResult]] = {}
    for c in cases:
        for kind in BUDGET_KINDS:
            if kind in c.regrets or kind == "unconstrained":
                grouped.setdefault((c.group, c.global_batch_size, kind), []).append(c)
    out: list[GroupSummary] = []
    order = sorted(grouped, key=lambda k: (k[0], k[1], BUDGET_KINDS.index(k[2])))
    for group, gbs, kind in order:
        members = grouped[(group, gbs, kind)]
        rows: list[dict[str, Any]] = []
        for c in sorted(members, key=lambda c: c.session):
            r = c.regrets.get(kind)
            rows.append(
                {
                    "session": c.session,
                    "state": _state(c, kind),
                    "advised": r.get("advised") if r else None,
                    "in_grid": r.get("in_grid") if r else None,
                    "ratio": r.get("ratio") if r else None,
                    "rank": r.get("rank") if r else None,
                    "eligible": r.get("eligible") if r else None,
                    "advised_fits": r.get("advised_fits") if r else None,
                    "budget_bytes": r.get("budget_bytes") if r else None,
                    "spread": c.spread.get("value"),
                    "statement": c.statements.get(kind, ""),
                }
            )
        ratios = [row["ratio"] for row in rows if row["ratio"] is not None]
        statements = []
        for row in rows:
            if row["statement"]:
                statements.append(f"session {row['session']}: {row['statement']}")
        if ratios and min(ratios) < TARGET <= max(ratios):
            statements.append(
                f"the sessions disagree: their ratios ({min(ratios):.3f}-{max(ratios):.3f}) lie on "
                f"both sides of the {TARGET} target"
            )
        out.append(
            GroupSummary(
                group=group,
                model=members[0].model,
                role=members[0].role,
                global_batch_size=gbs,
                budget=kind,
                sessions=rows,
                ratio_min=min(ratios) if ratios else None,
                ratio_median=statistics.median(ratios) if ratios else None,
                ratio_max=max(ratios) if ratios else None,
                statements=statements,
            )
        )
    return out


def _state(case: CaseResult, kind: str) -> str:
    if not case.grid_complete:
        return "grid unfinished"
    if case.advisor is None:
        return "advisor not run yet"
    r = case.regrets.get(kind)
    if r is None:
        return "no recommendation"
    if "skipped" in r:
        return f"no memory-bound case: {r['skipped']}"
    if r.get("recommend_status") != "ok":
        return f"recommend failed: {r.get('recommend_status')}"
    if not r.get("in_grid"):
        return "advised config not in the grid"
    if r.get("ratio") is None:
        return f"advised config {r.get('advised_status') or 'not measured'} in the grid"
    return "ok"
