"""Summarise a scripts/gpu_check.sh run: predicted vs measured, per stage, as JSON + markdown.

    python scripts/gpu_summary.py OUT_DIR

Reads only the files the stages wrote (profile.json, plan.json, metrics.jsonl, stages.json), so
it also summarises a partial run. Writes OUT_DIR/summary.json and OUT_DIR/summary.md.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from profilers.metrics_record import read_metrics
from profilers.rundir import RunDir, TrainDir


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _metrics(run: Path, skip: int = 3) -> dict[str, Any] | None:
    train = read_metrics(TrainDir(run).metrics).train
    if not train:
        return None
    steady = train[skip:] or train
    return {
        "steps": len(train),
        "final_loss": train[-1].loss,
        "median_step_time_s": statistics.median(r.step_time_s or 0.0 for r in steady),
        "median_tokens_per_s": statistics.median(r.tokens_per_s or 0.0 for r in steady),
        "peak_memory_bytes": max(r.peak_memory_bytes or 0 for r in steady),
        "peak_memory_kind": train[-1].peak_memory_kind or None,
        "median_mfu": statistics.median(r.mfu or 0.0 for r in steady)
        if steady[0].mfu is not None
        else None,
        "skipped_steps": train[-1].skipped_steps or 0,
        "loss_scale": train[-1].loss_scale,
    }


def _train_config(run: Path) -> dict[str, Any] | None:
    saved = _load(TrainDir(run).train_config)
    if not isinstance(saved, dict):
        return None
    config = saved.get("config", saved)
    keys = (
        "model",
        "model_args",
        "seq_len",
        "precision",
        "micro_batch_size",
        "grad_accum_steps",
        "activation_checkpointing",
        "parallelism",
        "world_size",
    )
    return {k: config.get(k) for k in keys if k in config}


def _ratio(predicted: float | None, measured: float | None) -> float | None:
    if not predicted or not measured:
        return None
    return predicted / measured - 1


def summarise(out: Path) -> dict[str, Any]:
    summary: dict[str, Any] = {"stages": _load(out / "stages.json") or {}}
    profile = _load(RunDir(out / "profile").profile)
    if profile:
        device = profile["device"]
        summary["device"] = {
            "name": device["name"],
            "total_memory_bytes": device["total_memory_bytes"],
            "measured_tflops": {
                k: (v.get("rate") or 0) / 1e12 for k, v in device.get("matmul", {}).items()
            },
            "datasheet": device.get("datasheet"),
            "gpu": device.get("gpu"),
        }
        summary["profile"] = {
            "elapsed_s": profile["elapsed_s"],
            "probes": {
                s: sum(p["status"] == s for p in profile["probes"])
                for s in sorted({p["status"] for p in profile["probes"]})
            },
            "memory_overhead": profile.get("memory_overhead"),
            "memory_checks": profile.get("memory_measured"),
            "flops": (profile.get("model") or {}).get("flops"),
        }
    plan = _load(RunDir(out / "plan").plan)
    if plan:
        summary["plan"] = {
            "config": plan.get("config"),
            "predicted": plan.get("predicted"),
            "measured": plan.get("measured"),
            "baseline": plan.get("baseline"),
            "validated": [
                {
                    "key": v.get("key"),
                    "time_error": v.get("time_error"),
                    "memory_error": v.get("memory_error"),
                    "status": (v.get("measured") or {}).get("status"),
                }
                for v in plan.get("validated", [])
            ],
        }
    runs = {}
    for run in sorted(out.iterdir()):
        if TrainDir(run).metrics.is_file() and (m := _metrics(run)) is not None:
            runs[run.name] = m | {"config": _train_config(run)}
    summary["train"] = runs
    if plan and "train_plan" in runs:
        predicted = plan.get("predicted") or {}
        measured = runs["train_plan"]
        memory = (predicted.get("breakdown") or {}).get("memory") or {}
        summary["plan_vs_training"] = {
            "step_time_error": _ratio(predicted.get("step_time_s"), measured["median_step_time_s"]),
            # Different kinds: the plan's peak is the device's (trace + fragmentation + the
            # per-process fixed bytes), the trainer's the caching allocator's max allocated.
            "peak_memory_error": _ratio(
                predicted.get("peak_memory_bytes"), measured["peak_memory_bytes"]
            ),
            # Like for like: the fitted trace against the allocator's peak (which also holds
            # the libraries' workspaces, part of the plan's fixed bytes).
            "traced_vs_allocated_error": _ratio(
                memory.get("fitted_peak_bytes"), measured["peak_memory_bytes"]
            ),
            "fixed_overhead_bytes": memory.get("fixed_overhead_bytes"),
            "fragmentation_bytes": memory.get("fragmentation_bytes"),
        }
    return summary


def markdown(summary: dict[str, Any]) -> str:
    lines = ["# GPU check", ""]
    if "device" in summary:
        d = summary["device"]
        lines += [
            f"Device: **{d['name']}**, {d['total_memory_bytes'] / 2**30:.1f} GiB; measured "
            "GEMM TFLOP/s: " + ", ".join(f"{k} {v:.1f}" for k, v in d["measured_tflops"].items()),
            "",
        ]
    lines += ["| stage | exit | seconds |", "|---|---|---|"]
    for name, s in sorted(summary.get("stages", {}).items()):
        lines.append(f"| {name} | {s.get('exit')} | {s.get('seconds')} |")
    if summary.get("plan"):
        lines += [
            "",
            "## Validated candidates (predicted / measured - 1)",
            "",
            "| candidate | status | time error | memory error |",
            "|---|---|---|---|",
        ]
        for v in summary["plan"]["validated"]:
            t, m = v["time_error"], v["memory_error"]
            lines.append(
                f"| {v['key']} | {v['status']} | "
                f"{'' if t is None else f'{t:+.1%}'} | "
                f"{'' if m is None else f'{m:+.1%}'} |"
            )
    if summary.get("train"):
        lines += [
            "",
            "## Training runs",
            "",
            "| run | steps | loss | step s | tok/s | peak GiB | MFU | skipped |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, r in summary["train"].items():
            mfu = "" if r["median_mfu"] is None else f"{r['median_mfu']:.1%}"
            lines.append(
                f"| {name} | {r['steps']} | {r['final_loss']:.3f} | "
                f"{r['median_step_time_s']:.4f} | {r['median_tokens_per_s']:,.0f} | "
                f"{r['peak_memory_bytes'] / 2**30:.2f} | {mfu} | {r['skipped_steps']} |"
            )
    if summary.get("plan_vs_training"):
        e = summary["plan_vs_training"]
        fmt = lambda x: "n/a" if x is None else f"{x:+.1%}"  # noqa: E731
        lines += [
            "",
            f"Plan vs its training run: step time {fmt(e['step_time_error'])}; the plan's "
            f"device peak vs the trainer's allocator peak {fmt(e['peak_memory_error'])}; the "
            f"fitted trace vs the allocator peak {fmt(e['traced_vs_allocated_error'])} "
            "(predicted / measured - 1).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/gpu_summary.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    summary = summarise(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = markdown(summary)
    (out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
