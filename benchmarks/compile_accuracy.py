"""How well does a profile predict a compiled step at sizes it never ran? (issue 14, item 2)

For each model (default gpt-tiny, on which the compile uncertainty's constant was chosen, and
llama-tiny, held out), ``run_profile`` (the orchestrator behind ``advisor profile``) profiles
fp32 with checkpointing none and full, communication and input probes off, with a budget large
enough for its compile phase (``--budget-s``, default 300 s): the compile probe measures the
speed-up at the two sizes the throughput probe timed (2 and 8 here) and the cold compile.

Then, for each group the profile compiled, the truth at micro-batch sizes the probes did NOT
run (3, 6, 12): one fresh child (the probe's own ``_compile_child``: an empty inductor cache,
each size compiled with static shapes, then eager and compiled steps round-robin) gives the
measured eager and compiled step (forward+backward + optimizer, median of the rounds) and the
paired speed-up at each size.

Compared with the cost model's compute for the same candidates (``MeasuredTime.compute``: the
eager time fit, divided by the measured speed-up interpolated in micro-batch for the compiled
one): the compiled step's error, the eager step's error in the same child (the host's drift
between the profile and the truth, which the compiled error also carries), and the predicted
against the measured speed-up (drift cancels in a ratio of steps timed side by side).
Targets: |time error| <= 10% as ``profiler_accuracy.py``'s.

Each invocation is a session written to its own directory (``--out``, default
``benchmarks/results/compile_accuracy/session-TIMESTAMP``): ``results.json`` and ``results.md``
derived from the raw files beside them (``MODEL/profile.json``, ``MODEL/truth-GROUP.json``);
``--analyze --out DIR`` derives them again.

    python benchmarks/compile_accuracy.py [--models gpt-tiny,llama-tiny] [--budget-s 300]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "compile_accuracy"
MODELS = ("gpt-tiny", "llama-tiny")
TUNING = ("gpt-tiny",)  # COMPILE_BETWEEN_CHILDREN was measured on it
SIZES = (3, 6, 12)
SEQ_LEN = 128
TRUTH_BUDGET_S = 60.0  # the truth child's interleaved timing, after its compiles
TIME_TARGET = 0.10


def profile_model(model: str, budget_s: float, out: Path) -> Any:
    from advisor.workload import AdvisorWorkload
    from profilers.probe_run import ProfileOptions
    from profilers.profiler import run_profile

    options = ProfileOptions(
        seq_len=SEQ_LEN,
        budget_s=budget_s,
        precisions=("fp32",),
        checkpointing=("none", "full"),
        time_micro_batch_sizes=(2, 8),
        comm=False,
        input_workers=(),
    )
    profile = run_profile(
        AdvisorWorkload(model=model, model_args={}),
        options,
        lambda message, spent: print(f"  [{spent:4.0%}] {message}", flush=True),
    )
    profile.save(out)
    return profile


def measure_truth(model: str, checkpointing: str) -> dict[str, Any]:
    from advisor.workload import AdvisorWorkload
    from profilers.isolate import Isolation, run_isolated
    from profilers.phases_compile import _compile_child
    from profilers.workload import StepSpec

    specs = [
        StepSpec(seq_len=SEQ_LEN, micro_batch_size=b, activation_checkpointing=checkpointing)
        for b in SIZES
    ]
    outcome = run_isolated(
        Isolation(timeout_s=900),
        _compile_child,
        AdvisorWorkload(model=model, model_args={}),
        specs,
        "cpu",
        TRUTH_BUDGET_S,
    )
    if not outcome.ok:
        return {"error": outcome.reason}
    return dict(outcome.value)


def compare(profile: Any, checkpointing: str, truth: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per truth size: predicted and measured eager and compiled steps, and speed-ups."""
    from profilers.throughput import StepTiming
    from strategies.sources import MeasuredTime
    from strategies.space import Candidate

    time = MeasuredTime.from_profile(profile)
    timings = [StepTiming.from_dict(d) for d in truth["timings"]]
    rows = []
    for b in SIZES:
        measured = {
            t.spec.compile: t for t in timings if t.spec.micro_batch_size == b
        }  # False: eager, True: compiled

        def predicted(compile: bool, b: int = b) -> tuple[float, float]:
            c = Candidate(
                precision="fp32",
                activation_checkpointing=checkpointing,
                parallelism="single",
                world_size=1,
                micro_batch_size=b,
                grad_accum_steps=1,
                compile=compile,
            )
            compute = time.compute(c)
            return compute.forward_backward_s + compute.optimizer_s, compute.forward_backward_s

        (eager_step, eager_fb), (compiled_step, compiled_fb) = predicted(False), predicted(True)
        eager_t, compiled_t = measured[False], measured[True]
        pairs = [
            e / c
            for e, c in zip(eager_t.forward_backward_s, compiled_t.forward_backward_s, strict=False)
            if c > 0
        ]
        rows.append(
            {
                "micro_batch_size": b,
                "predicted_eager_s": eager_step,
                "measured_eager_s": eager_t.median_step_s,
                "predicted_compiled_s": compiled_step,
                "measured_compiled_s": compiled_t.median_step_s,
                "predicted_speedup": eager_fb / compiled_fb,
                "measured_speedup": statistics.median(pairs) if pairs else None,
                "rounds": len(pairs),
            }
        )
    return rows


def error(predicted: float, measured: float | None) -> float | None:
    return None if not measured else predicted / measured - 1.0


def summarize(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median and max |error| of the compiled step, the eager step and the speed-up, tuning and
    held-out models apart."""
    out: dict[str, Any] = {}
    for label, keep in (("tuning", True), ("held-out", False)):
        rows = [
            r
            for m in results
            if (m["model"] in TUNING) == keep
            for g in m["groups"]
            for r in g.get("rows", ())
        ]
        if not rows:
            continue
        part: dict[str, Any] = {"configs": len(rows)}
        for name, p, m in (
            ("compiled", "predicted_compiled_s", "measured_compiled_s"),
            ("eager", "predicted_eager_s", "measured_eager_s"),
            ("speedup", "predicted_speedup", "measured_speedup"),
        ):
            errors = [e for r in rows if (e := error(r[p], r[m])) is not None]
            part[name] = {
                "median_abs": statistics.median(abs(e) for e in errors),
                "max_abs": max(abs(e) for e in errors),
                "median_signed": statistics.median(errors),
            }
        out[label] = part
    return out


def table_lines(results: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        "| model | checkpointing | b | compiled: predicted / measured (error) | "
        "eager, same child (error) | speed-up: predicted / measured |",
        "|---|---|---|---|---|---|",
    ]
    for m in results:
        for g in m["groups"]:
            if "reason" in g:
                lines.append(f"| {m['model']} | {g['checkpointing']} | – | {g['reason']} | | |")
                continue
            for r in g["rows"]:
                ce = error(r["predicted_compiled_s"], r["measured_compiled_s"])
                ee = error(r["predicted_eager_s"], r["measured_eager_s"])
                speedup = r["measured_speedup"]
                lines.append(
                    f"| {m['model']} | {g['checkpointing']} | {r['micro_batch_size']} | "
                    f"{r['predicted_compiled_s']:.3f} / {r['measured_compiled_s']:.3f} s "
                    f"({ce:+.1%}) | {r['predicted_eager_s']:.3f} / {r['measured_eager_s']:.3f} s "
                    f"({ee:+.1%}) | {r['predicted_speedup']:.2f}× / "
                    + (f"{speedup:.2f}×" if speedup else "–")
                    + " |"
                )
    return lines


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    lines = [
        "| models | configs | compiled step: median / max abs error (median signed) | "
        "eager step, same child | speed-up | target ≤ 10% |",
        "|---|---|---|---|---|---|",
    ]
    for label, part in summary.items():

        def cell(name: str, part: Mapping[str, Any] = part) -> str:
            e = part[name]
            return f"{e['median_abs']:.1%} / {e['max_abs']:.1%} ({e['median_signed']:+.1%})"

        met = "yes" if part["compiled"]["median_abs"] <= TIME_TARGET else "**no**"
        lines.append(
            f"| {label} | {part['configs']} | {cell('compiled')} | {cell('eager')} | "
            f"{cell('speedup')} | {met} (median) |"
        )
    return lines


def analyze(models: Sequence[str], out: Path) -> dict[str, Any]:
    """Every number from the raw files of the session directory ``out``."""
    from profilers.profile_record import load_profile

    results: list[dict[str, Any]] = []
    for model in models:
        profile = load_profile(out / model)
        groups: list[dict[str, Any]] = []
        for checkpointing in ("none", "full"):
            record = next(
                (m for m in profile.compile if m.activation_checkpointing == checkpointing), None
            )
            if record is None or not record.ok:
                why = record.reason if record is not None else "not reached by the profile"
                groups.append({"checkpointing": checkpointing, "reason": why})
                continue
            truth = json.loads((out / model / f"truth-{checkpointing}.json").read_text())
            if "error" in truth:
                groups.append({"checkpointing": checkpointing, "reason": truth["error"]})
                continue
            groups.append(
                {
                    "checkpointing": checkpointing,
                    "profile_speedup_by_size": dict(
                        zip(record.micro_batch_sizes, record.speedup_by_size, strict=False)
                    ),
                    "rows": compare(profile, checkpointing, truth),
                }
            )
        results.append({"model": model, "groups": groups})
    return {"results": results, "summary": summarize(results)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--analyze", action="store_true", help="derive results, measure nothing")
    parser.add_argument("--out", type=Path, default=None, help="the session's directory")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    import time

    import torch

    session = args.out or RESULTS / time.strftime("session-%Y%m%dT%H%M%SZ", time.gmtime())
    if not args.analyze:
        for model in models:
            out = session / model
            out.mkdir(parents=True, exist_ok=True)
            print(f"{model}: profile (fp32, none/full, {args.budget_s:.0f} s)", flush=True)
            profile = profile_model(model, args.budget_s, out)
            for record in profile.compile:
                if not record.ok:
                    continue
                mode = record.activation_checkpointing
                print(f"{model}: truth of fp32/{mode} at b={SIZES}", flush=True)
                truth = measure_truth(model, mode)
                (out / f"truth-{mode}.json").write_text(json.dumps(truth, indent=1) + "\n")
    derived = analyze(models, session)
    derived["setup"] = (
        f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} CPUs; seq "
        f"{SEQ_LEN}, fp32; profile --budget-s {args.budget_s:.0f} (compile measured at b=2, 8); "
        f"truth at b={', '.join(map(str, SIZES))}: one child per group, its compiles then "
        f"eager and compiled steps round-robin ({TRUTH_BUDGET_S:.0f} s)"
    )
    (session / "results.json").write_text(json.dumps(derived, indent=1) + "\n")
    text = [
        f"# Compiled step time: predicted at unprobed sizes vs measured ({session.name})",
        "",
        derived["setup"],
        "",
        *summary_lines(derived["summary"]),
        "",
        *table_lines(derived["results"]),
    ]
    (session / "results.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
