"""The cost model of TODAY's code against a finished regret session's grid.

A regret session (benchmarks/regret.py) logs the cost model's prediction of every grid config as
the code stood when it ran. When the cost model changes afterwards, this script asks the new
code the same questions from the same profiles and compares both with the same measurements:
per layout, the step-time error and the calibration of the 90% intervals, before (the session's
own predictions, advisor.jsonl) and now. Nothing is measured; the grid and the profiles are the
session's.

The profiles come from the session's scratch directory (``results/regret_work/<session>/``,
git-ignored) and are copied into the session's committed directory (``profiles/<case>.json``)
the first time, so the comparison can be re-derived from the repository alone afterwards.
Writes ``repredicted.json`` and ``repredicted.md`` beside the session's logs.

    python benchmarks/regret_repredict.py                      # the latest session
    python benchmarks/regret_repredict.py 20261202T121821Z     # a named one
    python benchmarks/regret_repredict.py --all --tag drift    # every session with profiles

``--tag T`` writes ``repredicted.T.json``/``.md`` instead of ``repredicted.*``, so an earlier
re-ask that a session's NOTE cites stays as it was. ``--all`` re-asks every session whose
profiles are kept (or still in the scratch directory) and also writes one table over them,
``repredicted[.T].md`` in the sessions directory: per case, the intervals' calibration
before and now, pooled at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repo root

from benchmarks import regret
from benchmarks import regret_analysis as analysis


def profile_path(session_dir: Path, case_id: str) -> Path | None:
    """The case's profile.json: the committed copy, else the scratch one (copied in)."""
    kept = session_dir / "profiles" / f"{case_id}.json"
    if kept.is_file():
        return kept
    from profilers.rundir import RunDir

    scratch = RunDir(regret.SCRATCH / session_dir.name / case_id / "profile").profile
    if not scratch.is_file():
        return None
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(scratch, kept)
    return kept


def compare(
    stats: Mapping[str, analysis.ConfigStats],
    before: Mapping[str, Mapping[str, Any]],
    now: Mapping[str, Mapping[str, Any]],
    overheads: Mapping[str, Any],
) -> dict[str, Any]:
    """Per layout: step-time errors and interval calibration of both sets of predictions."""
    out: dict[str, Any] = {}
    for name, preds in (("before", before), ("now", now)):
        errors = analysis.prediction_errors(stats, preds, overheads)
        out[name] = {
            "time": {layout: e["time"] for layout, e in errors.items()},
            "calibration": {
                c.quantity: c.to_dict()
                for c in analysis.calibration(stats, preds)
                if c.quantity == "step_time_s"
            },
        }
    return out


def repredict(session_dir: Path) -> dict[str, Any]:
    from profilers.profile_record import load_profile

    meta = json.loads((session_dir / "session.json").read_text())
    settings = regret.Settings.from_dict(meta["settings"])
    cases = {c.id: c for c in regret.build_cases(settings)}
    visits = regret.read_jsonl(session_dir / "visits.jsonl")
    advisor_records = {a["case"]: a for a in regret.read_jsonl(session_dir / "advisor.jsonl")}
    result: dict[str, Any] = {"session": meta["session"], "commit": _commit(), "cases": {}}
    for case_meta in meta["cases"]:
        case_id = case_meta["id"]
        record = advisor_records.get(case_id)
        path = profile_path(session_dir, case_id)
        if record is None or path is None or case_id not in cases:
            result["cases"][case_id] = {"skipped": "no advisor phase or no profile kept"}
            continue
        case = cases[case_id]
        if case.keys != list(case_meta["keys"]):
            raise SystemExit(f"error: {case_id}: today's grid differs from the session's")
        profile = load_profile(path)
        now = regret.predictions(profile, case, settings)
        stats = analysis.config_stats(
            v for v in visits if v["case"] == case_id and v.get("kind", "grid") == "grid"
        )
        result["cases"][case_id] = {
            "model": case_meta["model"],
            "role": case_meta.get("role", "other"),
            **compare(stats, record.get("predictions") or {}, now, record.get("overheads") or {}),
            "predictions_now": now,
        }
    return result


def _commit() -> str:
    short = regret.git("rev-parse", "--short=10", "HEAD")
    dirty = regret.git("status", "--porcelain", "--untracked-files=no")
    return (short + (" (+uncommitted changes)" if dirty else "")) if short else "unknown"


def _cell(e: Mapping[str, Any]) -> str:
    if not e or not e.get("n"):
        return "–"
    return f"{e['median_abs']:.0%} / {e['max_abs']:.0%} ({e['median']:+.0%}, n={e['n']})"


def _inside(calibration: Mapping[str, Any]) -> str:
    c = calibration.get("step_time_s") or {}
    if not c:
        return "–"
    width = c["median_relative_width"]
    return f"{c['inside']}/{c['configs']} ({c['fraction_inside']:.0%}), width {width:.0%}"


def markdown(result: Mapping[str, Any]) -> str:
    lines = [
        f"# Session {result['session']}: the cost model re-asked at {result['commit']}",
        "",
        "Same grid, same profiles, same measurements; only the code that predicts changed. "
        "Step time, predicted / measured − 1: median |error| / max |error| (median signed, n); "
        "90% intervals: configs measured inside, median relative width.",
        "",
        "| case | layout | step time before | step time now | inside before | inside now |",
        "|---|---|---|---|---|---|",
    ]
    for case_id, c in result["cases"].items():
        if "skipped" in c:
            lines.append(f"| {case_id} | – | {c['skipped']} | | | |")
            continue
        for layout in (*analysis.LAYOUTS, "all"):
            before, now = c["before"]["time"].get(layout), c["now"]["time"].get(layout)
            inside = (
                (_inside(c["before"]["calibration"]), _inside(c["now"]["calibration"]))
                if layout == "all"
                else ("", "")
            )
            lines.append(
                f"| {case_id} ({c['role']}) | {layout} | {_cell(before or {})} | "
                f"{_cell(now or {})} | {inside[0]} | {inside[1]} |"
            )
    return "\n".join(lines) + "\n"


def has_profiles(session_dir: Path) -> bool:
    """Whether any case of the session has a profile to re-ask (kept or in the scratch)."""
    meta = json.loads((session_dir / "session.json").read_text())
    return any(
        (session_dir / "profiles" / f"{c['id']}.json").is_file()
        or (regret.SCRATCH / session_dir.name / c["id"] / "profile").is_dir()
        for c in meta["cases"]
    )


def calibration_table(results: Sequence[Mapping[str, Any]], commit: str) -> str:
    """One row per case of every re-asked session: the step-time intervals' calibration
    before (as logged) and now, the median signed error now; pooled over all at the end."""
    lines = [
        f"# The 90% intervals re-asked at {commit}, every session with profiles",
        "",
        "Same grids, same profiles, same measurements; only the code that predicts changed. "
        "Inside: grid configs whose measured step time lies in the predicted 90% interval "
        "(median relative width); signed: median predicted / measured − 1.",
        "",
        "| session | case | inside before | inside now | signed now |",
        "|---|---|---|---|---|",
    ]
    pooled = {"before": [0, 0], "now": [0, 0]}
    for result in results:
        for case_id, c in result["cases"].items():
            if "skipped" in c:
                continue
            for name in pooled:
                cal = c[name]["calibration"].get("step_time_s") or {}
                pooled[name][0] += int(cal.get("inside") or 0)
                pooled[name][1] += int(cal.get("configs") or 0)
            signed = (c["now"]["time"].get("all") or {}).get("median")
            lines.append(
                f"| {result['session']} | {case_id} ({c['role']}) | "
                f"{_inside(c['before']['calibration'])} | {_inside(c['now']['calibration'])} | "
                f"{'–' if signed is None else f'{signed:+.0%}'} |"
            )
    cells = [f"{i}/{n} ({i / n:.0%})" if n else "–" for i, n in (pooled["before"], pooled["now"])]
    lines.append(f"| all | pooled | {cells[0]} | {cells[1]} | |")
    return "\n".join(lines) + "\n"


def _stem(tag: str | None) -> str:
    return f"repredicted.{tag}" if tag else "repredicted"


def _write(session_dir: Path, result: Mapping[str, Any], tag: str | None) -> str:
    stem = _stem(tag)
    (session_dir / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (session_dir / f"{stem}.md").write_text(text)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("session", nargs="?", default=None, help="Default: the latest session.")
    parser.add_argument("--sessions", type=Path, default=regret.SESSIONS)
    parser.add_argument(
        "--all", action="store_true", help="Every session with profiles, and one table over them."
    )
    parser.add_argument(
        "--tag", default=None, help="Write repredicted.TAG.* (keeps earlier re-asks as they are)."
    )
    args = parser.parse_args(argv)
    if args.tag is not None and not args.tag.replace("-", "").replace("_", "").isalnum():
        print(f"error: --tag {args.tag!r}: use letters, digits, '-' or '_'", file=sys.stderr)
        return 2
    names = sorted(p.name for p in args.sessions.iterdir() if (p / "session.json").is_file())
    if args.all:
        if args.session is not None:
            print("error: --all re-asks every session: name none", file=sys.stderr)
            return 2
        results = []
        for name in names:
            if has_profiles(args.sessions / name):
                results.append(repredict(args.sessions / name))
                _write(args.sessions / name, results[-1], args.tag)
        if not results:
            print(f"error: no session under {args.sessions} kept its profiles", file=sys.stderr)
            return 2
        text = calibration_table(results, results[-1]["commit"])
        (args.sessions / f"{_stem(args.tag)}.md").write_text(text)
        print(text)
        return 0
    name = args.session or (names[-1] if names else None)
    if name is None or not (args.sessions / name / "session.json").is_file():
        print(f"error: no session {name!r} under {args.sessions}", file=sys.stderr)
        return 2
    print(_write(args.sessions / name, repredict(args.sessions / name), args.tag))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
