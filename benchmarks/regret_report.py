"""Markdown of the regret benchmark: one session's summary, and the summary of every session.

Pure rendering of what ``regret_analysis`` computed from the raw logs; no number is made here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks import regret_analysis as analysis

MiB = 2**20
ROLES = (
    ("held-out", "Held-out models (the headline: no part in choosing the advisor's constants)"),
    (
        "tuning",
        "Tuning set (the advisor's margins were chosen on these models: not a held-out result)",
    ),
    ("other", "Other models"),
)


def _num(value: float | None, fmt: str = ",.0f") -> str:
    return "–" if value is None else format(value, fmt)


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "–"
    return f"{100 * value:+.0f}%" if signed else f"{100 * value:.0f}%"


def _mib(value: float | None) -> str:
    return "–" if value is None else f"{value / MiB:,.0f} MiB"


def _yes(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "NO")


def settings_line(meta: Mapping[str, Any]) -> str:
    s, env = meta["settings"], meta.get("environment", {})
    state = f"finished {meta['finished']}" if meta.get("finished") else "UNFINISHED"
    dirty = env.get("git_dirty_files")
    return (
        f"Session {meta['session']} ({state}"
        f"{', QUICK' if s.get('quick') else ''}): models {', '.join(s['models'])}; global batches "
        f"{', '.join(map(str, s['global_batch_sizes']))}; seq {s['seq_len']}; world size up to "
        f"{s['world_size']}; precisions {'+'.join(s['precisions'])}; checkpointing "
        f"{'+'.join(s['checkpointing'])}; {s['passes']} passes, each config once per pass in "
        f"alternating order; a visit = `advisor train` of {s['warmup']} warm-up + {s['steps']} "
        f"timed steps. torch {env.get('torch', '?')}, {env.get('cpu_count', '?')} CPUs "
        f"({env.get('cpu', '?')}), commit {str(env.get('git_commit', ''))[:10] or '?'}"
        f"{f' (+{dirty} changed files)' if dirty else ''}."
    )


def _advisor_s(case: analysis.CaseResult, kind: str) -> str:
    adv = case.advisor or {}
    rec = (adv.get("recommend") or {}).get(kind) or {}
    profile = (adv.get("profile") or {}).get("wall_s")
    if profile is None or "wall_s" not in rec:
        return "–"
    return f"{profile + rec['wall_s']:.0f} ({profile:.0f} + {rec['wall_s']:.0f})"


def _wall_ratio(case: analysis.CaseResult, kind: str) -> str:
    adv = case.advisor or {}
    rec = (adv.get("recommend") or {}).get(kind) or {}
    profile = (adv.get("profile") or {}).get("wall_s")
    if profile is None or "wall_s" not in rec or not case.grid_pass_wall_s:
        return "–"
    one_pass = sum(case.grid_pass_wall_s) / len(case.grid_pass_wall_s)
    ratio = (profile + rec["wall_s"]) / one_pass
    return f"{ratio:.2f} ({_yes(ratio <= analysis.WALL_TARGET)})"


def _busy(busy: Mapping[str, Any] | None) -> str:
    if not busy:
        return ""
    return (
        f"; other processes took ≥ {busy['threshold']:.0%} of the host's CPU time during "
        f"{busy['busy']} of {busy['visits']} visits (at most {busy['max']:.0%})"
    )


def case_markdown(case: analysis.CaseResult) -> list[str]:
    visits = sorted(set(case.visits_per_config.values()))
    lines = [
        f"### {case.model} ({case.role}), global batch {case.global_batch_size}",
        "",
        f"Grid: {case.configs} configs, {case.configs_measured} measured, visits per config "
        f"{'/'.join(map(str, visits))} of {case.passes}"
        f"{'' if case.grid_complete else ' (GRID UNFINISHED)'}; wall per pass "
        f"{', '.join(f'{w:.0f} s' for w in case.grid_pass_wall_s) or '–'}; load average "
        f"{'–' if not case.loadavg else f'{case.loadavg[0]:.1f}-{case.loadavg[1]:.1f}'}"
        f"{_busy(case.busy_host)}.",
        "",
    ]
    if case.advisor is None:
        lines += ["The advisor has not run yet for this case.", ""]
    else:
        lines += [
            "| budget | advised | rank | advised tok/s (grid) | grid best | best tok/s | "
            f"ratio (≥ {analysis.TARGET}) | advised peak / budget | advisor s (profile + "
            f"recommend) | advisor s / one pass (≤ {analysis.WALL_TARGET}) |",
            "|" + "---|" * 10,
        ]
        for kind in analysis.BUDGET_KINDS:
            r = case.regrets.get(kind)
            if r is None:
                continue
            if "skipped" in r:
                lines.append(f"| {kind} | no case: {r['skipped']} |" + " |" * 8)
                continue
            if r.get("recommend_status") != "ok":
                lines.append(f"| {kind} | recommend {r.get('recommend_status')} |" + " |" * 8)
                continue
            budget = r.get("budget_bytes")
            peak = r.get("advised_budgeted_bytes")
            memory = _mib(peak) + (
                f" / {_mib(budget)} ({_yes(r.get('advised_fits'))})" if budget else ""
            )
            if r.get("rank") is None:
                rank = "not in grid" if not r.get("in_grid") else str(r.get("advised_status"))
            elif r.get("advised_fits") is False:
                rank = f"over budget (would rank {r['rank']}; {r['eligible']} fit)"
            else:
                rank = f"{r['rank']} of {r['eligible']}"
            ratio = r.get("ratio")
            meets = None if ratio is None else ratio >= analysis.TARGET
            lines.append(
                f"| {kind} | {r.get('advised')} | {rank} | {_num(r.get('advised_tokens_per_s'))} "
                f"| {r.get('best') or '–'} | {_num(r.get('best_tokens_per_s'))} | "
                f"**{_num(ratio, '.3f')}** ({_yes(meets)}) "
                f"| {memory} | {_advisor_s(case, kind)} | {_wall_ratio(case, kind)} |"
            )
        lines.append("")
        for kind in analysis.BUDGET_KINDS:
            r = case.regrets.get(kind) or {}
            rule = r.get("rule")
            if kind == "memory-bound" and rule:
                lines.append(
                    f"- memory-bound budget rule: smallest measured peak {rule.get('smallest')} "
                    f"{_mib(rule.get('smallest_bytes'))}, unconstrained best {rule.get('best')} "
                    f"{_mib(rule.get('best_bytes'))} → budget {_mib(rule.get('budget_bytes'))} "
                    f"({rule.get('reason')}); peaks count every rank."
                )
            apart = r.get("apart")
            if apart:
                lines.append(
                    f"- {kind}: the advised config {apart['key']} is NOT in the grid. Measured "
                    f"apart, after the advice, by the same instrument ({apart['visits_ok']}/"
                    f"{apart['visits']} visits ok): {_num(apart.get('tokens_per_s'))} tok/s = "
                    f"{_num(apart.get('ratio_to_grid_best'), '.3f')} × the grid's best (not a "
                    "grid ratio)."
                )
            elif r.get("recommend_status") == "ok" and not r.get("in_grid"):
                lines.append(f"- {kind}: the advised config {r.get('advised')} is NOT in the grid.")
            rec = ((case.advisor or {}).get("recommend") or {}).get(kind) or {}
            own = rec.get("measured_by_recommend") or {}
            if own.get("tokens_per_s"):
                lines.append(
                    f"- {kind}: recommend's own validation measured the advised config at "
                    f"{own['tokens_per_s']:,.0f} tok/s over {own.get('visits', 1)} visit(s) "
                    f"({own.get('validator', '')}); {len(rec.get('validated') or [])} configs "
                    "validated."
                )
    spread = case.spread
    bests = "; ".join(
        f"pass {p + 1}: {key} {tps:,.0f}" for p, key, tps in spread.get("pass_best") or ()
    )
    lines += [
        f"- host spread: median coefficient of variation of a config's visits "
        f"{_pct(spread.get('median_cv'))} ({spread.get('configs_with_repeats', 0)} configs); "
        f"the best of each pass alone: {bests or '–'} (spread "
        f"{_pct(spread.get('pass_best_spread'))}"
        f"{', the passes crowned different configs' if spread.get('pass_winners_differ') else ''})."
    ]
    for kind, gain in case.knob_gains.items():
        lines.append(
            f"- {kind}: the new knobs (selective checkpointing, FSDP kept gathered, chunked "
            f"loss; {gain['knob_configs']} of the grid's configs) gain "
            f"**{gain['gain']:.3f}×** on this host: best {gain['best']} "
            f"{gain['best_tokens_per_s']:,.0f} tok/s against the best without them "
            f"{gain['plain_best']} {gain['plain_tokens_per_s']:,.0f}."
        )
    for kind, text in case.statements.items():
        lines.append(f"- **{kind}: {text}.**")
    lines.append("")
    if case.prediction_errors:
        lines += [
            "Cost model (`advisor predict`) vs this grid, predicted / measured − 1: median "
            "|error| / max |error| (median signed error, n). Memory: traced peak vs measured "
            "resident peak minus the profiled process overheads; budgeted: predicted vs measured "
            "peak × ranks.",
            "",
            "| layout | configs | step time | step time, unprobed points | memory | budgeted | "
            "unpredictable |",
            "|---|---|---|---|---|---|---|",
        ]

        def cell(stats: Mapping[str, Any]) -> str:
            if not stats["n"]:
                return "–"
            return (
                f"{_pct(stats['median_abs'])} / {_pct(stats['max_abs'])} "
                f"({_pct(stats['median'], signed=True)}, {stats['n']})"
            )

        for group, e in case.prediction_errors.items():
            if not e["configs"]:
                continue
            lines.append(
                f"| {group} | {e['configs']} | {cell(e['time'])} | {cell(e['time_unprobed'])} | "
                f"{cell(e['memory'])} | {cell(e['budgeted'])} | {e['unpredictable']} |"
            )
        lines.append("")
        if case.calibration:
            for c in case.calibration:
                lines.append(
                    f"- calibration of the predicted {c['quantity']} interval: "
                    f"{c['inside']}/{c['configs']} measured inside "
                    f"({_pct(c['fraction_inside'])}; nominal 90%), median relative width "
                    f"{_pct(c['median_relative_width'])}."
                )
        else:
            lines.append("- calibration: no intervals in predictions.")
    top = ", ".join(f"{t['key']} {t['tokens_per_s']:,.0f}" for t in case.top)
    lines.append(f"- fastest measured: {top or '–'}.")
    if case.failed:
        lines.append(
            "- failed: "
            + "; ".join(f"{f['key']} {f['status']} ({f['reason'][:80]})" for f in case.failed)
        )
    lines.append("")
    return lines


def session_markdown(meta: Mapping[str, Any], cases: Sequence[analysis.CaseResult]) -> str:
    lines = [
        f"# Regret of `advisor recommend`: session {meta['session']}",
        "",
        settings_line(meta),
        "",
        "Regret = the advised config's tokens/s as measured by the grid (before the advice) / "
        "the grid's best (memory-bound: the best that measured within the budget). Rank: "
        "competition rank among those configs.",
        "",
    ]
    for case in cases:
        lines += case_markdown(case)
    return "\n".join(lines).rstrip() + "\n"


def _session_cell(s: Mapping[str, Any]) -> str:
    if s["ratio"] is None:
        return f"– ({s['state']})"
    over = ", over budget" if s.get("advised_fits") is False else ""
    return f"{s['ratio']:.3f} ({s['rank']}{over})"


def all_sessions_markdown(
    sessions: Sequence[tuple[Mapping[str, Any], Sequence[analysis.CaseResult]]],
    groups: Sequence[analysis.GroupSummary],
) -> str:
    setups = sorted({g.group for g in groups})
    legend = {group: chr(ord("A") + i) if i < 26 else str(i) for i, group in enumerate(setups)}
    lines = [
        "# Regret of `advisor recommend`: every session",
        "",
        f"{len(sessions)} session(s) in this directory, all of them read; none is chosen or "
        "left out. Each session's raw logs (visits.jsonl, advisor.jsonl, session.json) and its "
        "own summary.md are in its directory; `python benchmarks/regret.py --summarize` "
        "rewrites this file from them.",
        "",
    ]
    for role, title in ROLES:
        mine = [g for g in groups if g.role == role]
        if not mine:
            continue
        lines += [
            f"## {title}",
            "",
            "| model | setup | global batch | budget | ratio per session (rank) | sessions with a "
            f"ratio | min / median / max ratio (≥ {analysis.TARGET}) | host spread per session |",
            "|" + "---|" * 8,
        ]
        for g in mine:
            per = ", ".join(_session_cell(s) for s in g.sessions)
            with_ratio = sum(1 for s in g.sessions if s["ratio"] is not None)
            spreads = ", ".join(_pct(s["spread"]) for s in g.sessions)
            lines.append(
                f"| {g.model} | {legend[g.group]} | {g.global_batch_size} | {g.budget} | {per} | "
                f"{with_ratio}/{len(g.sessions)} | {_num(g.ratio_min, '.3f')} / "
                f"{_num(g.ratio_median, '.3f')} / {_num(g.ratio_max, '.3f')} | {spreads} |"
            )
        lines.append("")
        for g in mine:
            for text in g.statements:
                lines.append(
                    f"- {g.model}, global batch {g.global_batch_size}, {g.budget}: {text}."
                )
        lines.append("")
    lines += ["Setups:", ""]
    lines += [f"- {legend[group]}: {group}" for group in setups]
    lines += ["", "Sessions:", ""]
    for meta, _cases in sessions:
        lines.append(f"- {settings_line(meta)}")
    return "\n".join(lines).rstrip() + "\n"
