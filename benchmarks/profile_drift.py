"""How far a shared host drifts between a profile and a later run: the ``drift`` part of every
CPU interval (strategies.uncertainty.PROFILE_TO_RUN_DRIFT_SHARED), re-derived from results.

Nothing is measured here. benchmarks/profiler_accuracy.py re-times, in the children that measure
its truth (minutes after the profile), the micro-batch sizes the profile itself timed, and
records per precision × checkpointing group ``drift`` = those step times now / the profile's.
This script reads every such result file under benchmarks/results/ and reports, per model and
pooled over the **tuning** models (gpt-tiny, llama-tiny: the only ones the constant is chosen
on), the root mean square of log(drift): the relative standard deviation of the profile's step
time against a later run's, about no drift. The held-out models' figures are printed beside
them, for information; they play no part in the constant.

A file whose model failed (no rows) is skipped and named; a group appears once per file and
settings (its sizes share one drift).

    python benchmarks/profile_drift.py     # prints the table, writes results/profile_drift.*
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TUNING = ("gpt-tiny", "llama-tiny")
# Result files whose rows another file repeats: the selective run's first attempt, whose
# gpt-tiny and llama-tiny failed and whose bert-tiny rows the final file reuses (its header
# says so). Counted once, there.
REPEATED = {
    "profiler_accuracy_selective_fp32.first_run.json": "its rows are repeated in "
    "profiler_accuracy_selective_fp32.json (bert-tiny; the other models failed in it)",
}


def drift_rows(name: str, data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per (settings, model, precision, checkpointing) with a recorded drift."""
    sets = data.get("by_settings") or [{"name": "favourable", "models": data.get("models", [])}]
    out: list[dict[str, Any]] = []
    for settings in sets:
        for model in settings.get("models", []):
            seen: dict[tuple[str, str], float] = {}
            for row in model.get("rows") or []:
                drift = (row.get("time") or {}).get("drift")
                if drift:
                    seen[(row["precision"], row["activation_checkpointing"])] = float(drift)
            out += [
                {
                    "file": name,
                    "settings": settings.get("name", ""),
                    "model": model["model"],
                    "precision": precision,
                    "checkpointing": checkpointing,
                    "drift": drift,
                }
                for (precision, checkpointing), drift in seen.items()
            ]
    return out


def rms_log(drifts: Iterable[float]) -> float | None:
    """Root mean square of log(drift), about 0 (no drift); None without values."""
    logs = [math.log(d) for d in drifts]
    return math.sqrt(sum(x * x for x in logs) / len(logs)) if logs else None


def summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    by_model: dict[str, list[float]] = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r["drift"])
    tuning = [d for m in TUNING for d in by_model.get(m, [])]
    return {
        "tuning_models": list(TUNING),
        "tuning": {"groups": len(tuning), "rms_log_drift": rms_log(tuning)},
        "models": {
            m: {
                "role": "tuning" if m in TUNING else "held-out",
                "groups": len(v),
                "rms_log_drift": rms_log(v),
                "min": min(v),
                "max": max(v),
            }
            for m, v in sorted(by_model.items())
        },
    }


def markdown(result: Mapping[str, Any]) -> str:
    s = result["summary"]
    lines = [
        "# A shared host's drift between a profile and a later run",
        "",
        "drift = the profile's own probed sizes re-timed after it (in profiler_accuracy.py's "
        "truth children) / the profile's step time; per group. RMS = root mean square of "
        "log(drift). The interval's `drift` part is chosen on the tuning models only.",
        "",
        "| model | role | groups | drift min–max | RMS log(drift) |",
        "|---|---|---|---|---|",
    ]
    for model, m in s["models"].items():
        lines.append(
            f"| {model} | {m['role']} | {m['groups']} | {m['min']:.2f}–{m['max']:.2f} | "
            f"{m['rms_log_drift']:.3f} |"
        )
    t = s["tuning"]
    value = "–" if t["rms_log_drift"] is None else f"**{t['rms_log_drift']:.3f}**"
    lines += [f"| tuning, pooled | | {t['groups']} | | {value} |", "", "Files read:", ""]
    lines += [f"- {f}" for f in result["files"]]
    lines += [f"- {f} (skipped: {why})" for f, why in result["skipped"].items()]
    lines += ["", "Rows:", "", "| file | settings | model | precision | checkpointing | drift |"]
    lines.append("|---|---|---|---|---|---|")
    lines += [
        f"| {r['file']} | {r['settings']} | {r['model']} | {r['precision']} | "
        f"{r['checkpointing']} | {r['drift']:.3f} |"
        for r in result["rows"]
    ]
    return "\n".join(lines) + "\n"


def collect(results: Path) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    files: list[str] = []
    skipped: dict[str, str] = {}
    for path in sorted(results.glob("profiler_accuracy*.json")):
        if path.name in REPEATED:
            skipped[path.name] = REPEATED[path.name]
            continue
        found = drift_rows(path.name, json.loads(path.read_text()))
        if found:
            files.append(path.name)
            rows += found
        else:
            skipped[path.name] = "no drift recorded"
    return {"files": files, "skipped": skipped, "rows": rows, "summary": summary(rows)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    result = collect(args.results)
    if not result["rows"]:
        print(f"error: no profiler_accuracy*.json with drift under {args.results}", file=sys.stderr)
        return 2
    (args.results / "profile_drift.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (args.results / "profile_drift.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
