"""The analysis of ``trainer_overhead.py``: from the raw log of its runs to its results.

Pure (no torch, no processes): every number of ``results/trainer_overhead.{json,md}`` is derived
here from the lines of ``results/trainer_overhead_runs.jsonl``, so the committed results can be
re-derived (``python benchmarks/trainer_overhead.py --analyze RUNS.jsonl``) and every statistic
is tested on synthetic inputs (tests/benchmarks/test_overhead_analysis.py).

The runs log holds one JSON object per line, tagged by ``record``:

* ``session``: when and where (environment, method, settings); one per invocation;
* ``config``: one benchmarked config (its TrainConfig, layout, step counts);
* ``run``: one training run, raw: the wall-clock end of every step (rank 0), the process CPU
  time at the end of every step on every rank, every step's loss, the process wall time;
* ``end``: the invocation finished (total wall time, load average).

A run's numbers (steady-state tokens/s, tokens per CPU second, CPU share) and each pair's ratios
are recomputed from those lists; nothing derived is trusted from the log.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

TARGET_RATIO = 0.97
SIDES = ("advisor", "hand")
LAYOUTS = ("single", "ddp", "fsdp")


def pair_order(pair: int) -> tuple[str, str]:
    """Which side runs first in pair ``pair``: (advisor, hand), (hand, advisor), ... alternating,
    so a slow drift of the host's load favours neither side."""
    return SIDES if pair % 2 == 0 else (SIDES[1], SIDES[0])


def step_durations(times: Sequence[float], warmup: int) -> list[float]:
    """Durations of steps warmup+1..N (``times[k]`` = end of step k+1; warmup >= 1)."""
    if warmup < 1:
        raise ValueError(f"warmup must be >= 1 (the window starts at a step's end), got {warmup}")
    return [b - a for a, b in zip(times[warmup - 1 : -1], times[warmup:], strict=True)]


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """One run's steady-state numbers (window = end of step ``warmup`` to end of the last step).

    Distributed runs: wall clock from rank 0 (whose ``loss.item()`` ends a step after the loss
    all-reduce, so every rank has finished it), CPU time summed over the ranks; ``cpu_share``
    is then the ranks' CPU seconds over (wall seconds x ranks), the fraction of its cores the
    job got (1-thread ranks; gloo's own threads can push it slightly above 1).
    """

    side: str
    pair: int
    position: int  # 0: ran first in its pair
    tokens_per_s: float  # steady-state window, wall clock
    tokens_per_cpu_s: float  # same window, process CPU time (all ranks)
    cpu_share: float  # CPU s / (wall s x ranks) in the window: < 1 when others took the cores
    median_step_tokens_per_s: float
    window_s: float
    cpu_window_s: tuple[float, ...]  # per rank
    process_s: float


def run_result(run: Mapping[str, Any]) -> RunResult:
    """The steady-state numbers of one raw ``run`` record (see the module docstring)."""
    steps, warmup = int(run["steps"]), int(run["warmup"])
    times: Sequence[float] = run["times"]
    cpu: Sequence[Sequence[float]] = run["cpu"]
    if not 1 <= warmup < steps:
        raise ValueError(f"warmup {warmup} must be in 1..steps-1 ({steps} steps)")
    if len(times) != steps or not cpu or any(len(c) != steps for c in cpu):
        lengths = [len(c) for c in cpu]
        raise ValueError(
            f"{run['side']} run of pair {run['pair']} logged {len(times)} step times and "
            f"{lengths} CPU readings per rank, expected {steps}"
        )
    tokens_per_step = int(run["tokens_per_step"])
    tokens = (steps - warmup) * tokens_per_step
    window = times[-1] - times[warmup - 1]
    cpu_windows = tuple(c[-1] - c[warmup - 1] for c in cpu)
    cpu_window = sum(cpu_windows)
    if window <= 0 or cpu_window <= 0:
        raise ValueError(f"empty window: {window} s wall, {cpu_window} s CPU")
    return RunResult(
        side=str(run["side"]),
        pair=int(run["pair"]),
        position=int(run["position"]),
        tokens_per_s=tokens / window,
        tokens_per_cpu_s=tokens / cpu_window,
        cpu_share=cpu_window / (window * len(cpu)),
        median_step_tokens_per_s=tokens_per_step / statistics.median(step_durations(times, warmup)),
        window_s=window,
        cpu_window_s=cpu_windows,
        process_s=float(run["process_s"]),
    )


@dataclass(frozen=True, kw_only=True)
class LossAgreement:
    """Do two runs' per-step losses agree? The "same work" check, never assumed."""

    steps: int
    max_abs_diff: float  # inf when one side is NaN/inf where the other is not
    max_rel_diff: float
    identical_steps: int  # bit for bit
    first_different_step: int | None  # 1-based; None when all are identical


def compare_losses(a: Sequence[float], b: Sequence[float]) -> LossAgreement:
    """Per-step comparison of two loss curves of equal length (a length mismatch raises: the
    runs did not do the same number of steps, and no diff could say they did the same work)."""
    if len(a) != len(b):
        raise ValueError(f"loss curves differ in length: {len(a)} vs {len(b)} steps")
    if not a:
        raise ValueError("no losses to compare")
    abs_diffs, rel_diffs = [], []
    identical, first = 0, None
    for step, (x, y) in enumerate(zip(a, b, strict=True), start=1):
        same = x == y or (math.isnan(x) and math.isnan(y))
        identical += same
        if not same and first is None:
            first = step
        if same:
            diff = 0.0
        elif math.isfinite(x) and math.isfinite(y):
            diff = abs(x - y)
        else:
            diff = math.inf
        abs_diffs.append(diff)
        scale = max(abs(x), abs(y))
        rel_diffs.append(diff / scale if diff and math.isfinite(diff) and scale else diff)
    return LossAgreement(
        steps=len(a),
        max_abs_diff=max(abs_diffs),
        max_rel_diff=max(rel_diffs),
        identical_steps=identical,
        first_different_step=first,
    )


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and (max - min) / median in percent."""
    if not values:
        raise ValueError("no values")
    med = statistics.median(values)
    return {
        "median": med,
        "min": min(values),
        "max": max(values),
        "spread_pct": 100.0 * (max(values) - min(values)) / med if med else math.nan,
    }


def pair_summary(pair: int, adv: RunResult, hand: RunResult, agreement: LossAgreement) -> dict:
    """One interleaved pair: advisor / hand ratios of wall and CPU tokens/s, and the loss check."""
    return {
        "pair": pair,
        "order": list(pair_order(pair)),
        "ratio": adv.tokens_per_s / hand.tokens_per_s,
        "cpu_ratio": adv.tokens_per_cpu_s / hand.tokens_per_cpu_s,
        "advisor_tokens_per_s": adv.tokens_per_s,
        "hand_tokens_per_s": hand.tokens_per_s,
        "advisor_cpu_share": adv.cpu_share,
        "hand_cpu_share": hand.cpu_share,
        "max_abs_loss_diff": agreement.max_abs_diff,
        "max_rel_loss_diff": agreement.max_rel_diff,
        "identical_loss_steps": agreement.identical_steps,
        "first_different_loss_step": agreement.first_different_step,
        "loss_steps": agreement.steps,
    }


def config_summary(runs: Sequence[RunResult], pairs: Sequence[Mapping[str, Any]]) -> dict:
    """The headline of one config: medians over pairs (ratios) and over runs (tokens/s)."""
    if not pairs:
        raise ValueError("no complete pair")
    ratios = [p["ratio"] for p in pairs]
    cpu_ratios = [p["cpu_ratio"] for p in pairs]

    def side(name: str) -> list[RunResult]:
        return [r for r in runs if r.side == name]

    adv, hand = side("advisor"), side("hand")
    return {
        "ratio": spread(ratios),
        "cpu_ratio": spread(cpu_ratios),
        "min_cpu_share": min(r.cpu_share for r in runs),
        "advisor_tokens_per_s": spread([r.tokens_per_s for r in adv]),
        "hand_tokens_per_s": spread([r.tokens_per_s for r in hand]),
        "advisor_tokens_per_cpu_s": spread([r.tokens_per_cpu_s for r in adv]),
        "hand_tokens_per_cpu_s": spread([r.tokens_per_cpu_s for r in hand]),
        "advisor_median_step_tokens_per_s": statistics.median(
            r.median_step_tokens_per_s for r in adv
        ),
        "hand_median_step_tokens_per_s": statistics.median(
            r.median_step_tokens_per_s for r in hand
        ),
        "max_abs_loss_diff": max(p["max_abs_loss_diff"] for p in pairs),
        "max_rel_loss_diff": max(p["max_rel_loss_diff"] for p in pairs),
        "all_losses_identical": all(p["identical_loss_steps"] == p["loss_steps"] for p in pairs),
        "meets_target": statistics.median(ratios) >= TARGET_RATIO,
        "meets_target_cpu_time": statistics.median(cpu_ratios) >= TARGET_RATIO,
    }


def analyze_config(config: Mapping[str, Any], runs: Sequence[Mapping[str, Any]]) -> dict:
    """One config's results entry from its ``config`` record and its raw ``run`` records.

    Pairs are matched by their index; a pair missing a side (a run that failed or a kill) is
    left out of the statistics and counted in ``incomplete_pairs``.
    """
    results = {(r["pair"], r["side"]): run_result(r) for r in runs}
    losses = {(r["pair"], r["side"]): r["losses"] for r in runs}
    pairs, incomplete = [], []
    for pair in sorted({p for p, _ in results}):
        if (pair, "advisor") not in results or (pair, "hand") not in results:
            incomplete.append(pair)
            continue
        agreement = compare_losses(losses[pair, "advisor"], losses[pair, "hand"])
        pairs.append(pair_summary(pair, results[pair, "advisor"], results[pair, "hand"], agreement))
    ordered = sorted(results.values(), key=lambda r: (r.pair, r.position))
    entry = {
        key: config[key]
        for key in (
            "name",
            "base",
            "layout",
            "world_size",
            "train_config",
            "threads",
            "steps",
            "warmup_steps_excluded",
            "tokens_per_step",
            "calibration_step_s",
        )
        if key in config
    }
    entry["pairs"] = pairs
    entry["incomplete_pairs"] = incomplete
    entry["runs"] = [{**asdict(r), "cpu_window_s": list(r.cpu_window_s)} for r in ordered]
    entry["summary"] = config_summary(ordered, pairs) if pairs else None
    return entry


def analyze(records: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The results of the last session in a runs log (what the live run writes at its end)."""
    session: Mapping[str, Any] | None = None
    configs: dict[str, Mapping[str, Any]] = {}
    runs: dict[str, list[Mapping[str, Any]]] = {}
    failures: dict[str, list[Mapping[str, Any]]] = {}
    end: Mapping[str, Any] | None = None
    for record in records:
        kind = record.get("record")
        if kind == "session":  # a new invocation: only the last one counts
            session, configs, runs, failures, end = record, {}, {}, {}, None
        elif kind == "config":
            configs[record["name"]] = record
            runs.setdefault(record["name"], [])
        elif kind == "run":
            runs.setdefault(record["config"], []).append(record)
        elif kind == "failure":
            failures.setdefault(record["config"], []).append(record)
        elif kind == "end":
            end = record
    if session is None:
        raise ValueError("the runs log holds no session record")
    environment = dict(session.get("environment", {}))
    if end is not None and "loadavg_end" in end:
        environment["loadavg_end"] = end["loadavg_end"]
    return {
        "benchmark": "trainer_overhead",
        "created": session.get("created"),
        "quick": session.get("quick", False),
        "partial": end is None,
        "target_ratio": TARGET_RATIO,
        "method": session.get("method", {}),
        "environment": environment,
        "configs": [
            {
                **analyze_config(c, runs.get(name, [])),
                "failures": [
                    {k: f[k] for k in ("side", "pair", "reason") if k in f}
                    for f in failures.get(name, [])
                ],
            }
            for name, c in configs.items()
        ],
        "total_s": end.get("total_s") if end is not None else None,
    }


def layout_label(entry: Mapping[str, Any]) -> str:
    layout = entry.get("layout", "single")
    return layout if layout == "single" else f"{layout}×{entry.get('world_size', '?')}"


def _range(s: Mapping[str, float], fmt: str) -> str:
    return f"{s['median']:{fmt}} ({s['min']:{fmt}}–{s['max']:{fmt}})"


def render_markdown(results: Mapping[str, Any]) -> str:
    """The results table (also printed), one row per config × layout, and how to read it."""
    lines = [
        "| config | layout | model | seq | micro-batch | accum | precision | act. ckpt | threads "
        "per process | steps (warm-up) | advisor tok/s median (min–max) | hand-written tok/s "
        "median (min–max) | ratio median (min–max) | CPU-time ratio median (min–max) | min CPU "
        "share | pairs | max abs loss diff (identical) | ≥ 0.97 (wall / CPU) |",
        "|" + "---|" * 18,
    ]
    for c in results["configs"]:
        t, s = c["train_config"], c["summary"]
        model = t["model"] + (
            " " + ",".join(f"{k}={v}" for k, v in t["model_args"].items())
            if t["model_args"]
            else ""
        )
        head = (
            f"| {c['name']} | {layout_label(c)} | {model} | {t['seq_len']} | "
            f"{t['micro_batch_size']} | {t['grad_accum_steps']} | {t['precision']} | "
            f"{t['activation_checkpointing']} | {c['threads']} | "
            f"{c['steps']} ({c['warmup_steps_excluded']}) | "
        )
        if s is None:
            lines.append(head + "— | — | — | — | — | 0 | — | — |")
            continue
        identical = "yes" if s["all_losses_identical"] else "no"
        lines.append(
            head + f"{_range(s['advisor_tokens_per_s'], ',.0f')} | "
            f"{_range(s['hand_tokens_per_s'], ',.0f')} | "
            f"**{s['ratio']['median']:.3f}** ({s['ratio']['min']:.3f}–{s['ratio']['max']:.3f}) | "
            f"{_range(s['cpu_ratio'], '.3f')} | {s['min_cpu_share']:.2f} | {len(c['pairs'])} | "
            f"{s['max_abs_loss_diff']:.1e} ({identical}) | "
            f"{'yes' if s['meets_target'] else 'NO'} / "
            f"{'yes' if s['meets_target_cpu_time'] else 'NO'} |"
        )
    m, env = results["method"], results["environment"]
    total = results.get("total_s")
    load = env.get("loadavg_start", [math.nan])[0]
    quiet = m.get("advisor_quiet", False)
    lines += [
        "",
        "Ratio = advisor / hand-written steady-state tokens/s (wall clock), per interleaved pair "
        "(order alternates), median over pairs. CPU-time ratio: the same with process CPU "
        "seconds (summed over the ranks of a ddp/fsdp job), which other tenants of a shared "
        "host barely move; CPU share = CPU s / (wall s × processes) of a run's window (< 1: "
        "the run waited for a core). Each run is a fresh process (ddp/fsdp: a fresh torchrun "
        "job, gloo, one process per rank); advisor progress display "
        f"{'off (--quiet)' if quiet else 'on (plain lines to a file)'}; eval and checkpoint "
        "once after the last step in both loops. Max abs loss diff: per-step losses of advisor "
        "against the hand loop in the same pair (identical: bit for bit at every step of every "
        f"pair). torch {env.get('torch', '?')}, {env.get('cpu_count', '?')} CPUs, load average "
        f"at start {load:.1f}"
        + (f", total {total / 60:.1f} min." if total is not None else ", partial (no end)."),
    ]
    return "\n".join(lines) + "\n"
