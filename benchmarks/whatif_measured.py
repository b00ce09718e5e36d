"""Does ``advisor predict --target`` match our own GPU runs? Step time, row by row.

``whatif_published.py`` holds the what-if against published tables; this one holds it against
runs of our own trainer on a lent GPU, from the results ``scripts/gpu_check.sh`` committed under
``benchmarks/results/gpu_*/``. A row is a configuration that ran alone on the device:

* ``validated``: each candidate ``advisor recommend --validate-top`` measured (plan.json; the
  median of its visits' timed steps);
* ``train``: the runs the script trains alone (``train_plan``, ``real_*``): the median step after
  the first three.

The runs the script starts together (``train_fp16``, ``train_ddp_w1``, ``train_fsdp_w1``, beside
the GPU tests) shared the device and are left out. Each row is predicted the way
``whatif_published.py`` predicts a published run: a trace-only profile of the model shape, built
on this CPU (no GPU timing at all), then :func:`advisor.recommending.predict` with the device's
datasheet row as ``target``. Nothing is fitted on these rows.

Run ``python benchmarks/whatif_measured.py`` (``--runs DIR ...`` to pick result directories).
Writes ``benchmarks/results/whatif_measured.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import whatif_published as wp  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
ALONE_RUNS = ("train_plan",)  # plus every real_* run
SKIP_STEPS = 3  # the first steps carry warm-up (the cuBLAS handles, the allocator's first segments)


@dataclass(frozen=True)
class Measured:
    source: str  # result directory / run or candidate
    config: dict[str, Any]
    target: str
    step_time_s: float
    peak_allocated_bytes: int | None = None


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def measured_rows(run_dir: Path) -> list[Measured]:
    """The rows one ``gpu_check.sh`` result directory holds (see the module docstring)."""
    from profilers.hardware import match_device
    from profilers.rundir import RunDir, TrainDir

    profile = RunDir(run_dir / "profile").profile
    if not profile.is_file():
        return []
    spec = match_device(_json(profile)["device"]["name"])
    if spec is None:
        return []
    rows = []
    plan = RunDir(run_dir / "plan").plan
    if plan.is_file():
        data = _json(plan)
        base = data["config"]
        for v in data.get("validated", []):
            measured = v.get("measured") or {}
            if measured.get("status") == "ok" and measured.get("step_time_s"):
                rows.append(
                    Measured(
                        source=f"{run_dir.name}: validated {v['key']}",
                        config={**base, **v["candidate"]},
                        target=spec.key,
                        step_time_s=float(measured["step_time_s"]),
                    )
                )
    for run in sorted(run_dir.iterdir()):
        if not (run.name in ALONE_RUNS or run.name.startswith("real_")):
            continue
        metrics, config = TrainDir(run).metrics, TrainDir(run).train_config
        if not (metrics.is_file() and config.is_file()):
            continue
        train = [
            r for r in map(json.loads, metrics.read_text().splitlines()) if r["kind"] == "train"
        ][SKIP_STEPS:]
        if not train:
            continue
        rows.append(
            Measured(
                source=f"{run_dir.name}: {run.name}",
                config=_json(config)["config"],
                target=spec.key,
                step_time_s=statistics.median(r["step_time_s"] for r in train),
                peak_allocated_bytes=max(r["peak_memory_bytes"] for r in train),
            )
        )
    return rows


def gpu_check_row(
    model: str, model_args: Mapping[str, Any], run: Mapping[str, Any], target: str, label: str
) -> Any:
    """A one-GPU run ``scripts/gpu_check.sh`` trains, as this script will predict it once it
    ran (the step is not known yet: 1 s): for a prediction written down before any GPU ran it."""
    config = {
        "model": model,
        "model_args": dict(model_args),
        **run,
        "global_batch_size": run["micro_batch_size"] * run["grad_accum_steps"],
        "parallelism": "single",
        "world_size": 1,
    }
    return as_row(Measured(source=label, config=config, target=target, step_time_s=1))


def as_row(m: Measured) -> Any:
    """The measured run as a ``whatif_published.Row`` (its trace-only profile and prediction)."""
    c = m.config
    args = {**c.get("model_args", {})}
    if c["model"].startswith("gpt"):
        args.setdefault("block_size", c["seq_len"])  # the shape's key: as the run built it
    return wp.Row(
        row=m.source,
        tune=False,
        label=m.source,
        model=c["model"],
        model_args=args,
        target=m.target,
        n_gpus=c.get("world_size", 1),
        nodes=1,
        network=None,
        seq_len=c["seq_len"],
        micro_batch_size=c["micro_batch_size"],
        grad_accum_steps=c["grad_accum_steps"],
        global_batch_size=c["global_batch_size"],
        precision=c["precision"],
        activation_checkpointing=c["activation_checkpointing"],
        parallelism=c.get("parallelism", "single"),
        tokens_per_s_per_gpu=c["seq_len"] * c["global_batch_size"] / m.step_time_s,
        mfu_percent=0.0,
        source=m.source,
        source_name="measured here",
    )


# scripts/gpu_check.sh's attention pair: real_<shape>_sdpa and real_<shape>_eager, the same model
# but for how its attention runs (benchmarks/models/eager_gpt.py).
PAIR_SUFFIXES = ("_sdpa", "_eager")


def attention_pairs(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per eager/SDPA pair in ``results`` (same result directory, same run name but for the
    suffix): the measured and the predicted eager/SDPA step ratio."""
    by_source = {r["source"]: r for r in results}
    pairs = []
    for source, sdpa in sorted(by_source.items()):
        if not source.endswith(PAIR_SUFFIXES[0]):
            continue
        eager = by_source.get(source[: -len(PAIR_SUFFIXES[0])] + PAIR_SUFFIXES[1])
        if eager is None:
            continue
        measured = eager["measured_step_time_s"] / sdpa["measured_step_time_s"]
        predicted = eager["predicted_step_time_s"] / sdpa["predicted_step_time_s"]
        pairs.append(
            {
                "pair": source[: -len(PAIR_SUFFIXES[0])],
                "measured_ratio": measured,
                "predicted_ratio": predicted,
                "error": predicted / measured - 1,
            }
        )
    return pairs


def rms_log_errors(results: list[dict[str, Any]]) -> dict[str, tuple[int, float]]:
    """Per precision: (rows, root mean square of log(predicted / measured)), the spread the
    what-if's interval is sized by where no published run exists (fp32)."""
    by: dict[str, list[float]] = {}
    for r in results:
        by.setdefault(r["config"]["precision"], []).append(r["error"])
    return {p: (len(errors), wp.rms_log_error(errors)) for p, errors in sorted(by.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="*", type=Path, default=sorted(RESULTS.glob("gpu_*")))
    args = parser.parse_args(argv)
    measured = [m for d in args.runs for m in measured_rows(d)]
    if not measured:
        print("no GPU result directory with a profile: run scripts/gpu_check.sh on a GPU first")
        return 2
    rows = [as_row(m) for m in measured]
    results = []
    for m, row in zip(measured, rows, strict=True):
        predicted = wp.predict_row(row, wp.profile_for(row, rows))["predicted"]
        step = predicted["step_time_s"]
        results.append(
            {
                "source": m.source,
                "target": m.target,
                "config": {k: m.config.get(k) for k in ("model", "model_args", "seq_len")}
                | {
                    k: m.config.get(k)
                    for k in (
                        "precision",
                        "activation_checkpointing",
                        "micro_batch_size",
                        "grad_accum_steps",
                    )
                },
                "measured_step_time_s": m.step_time_s,
                "predicted_step_time_s": step,
                "error": step / m.step_time_s - 1,
                "parts_s": (predicted["breakdown"]["time"] or {}).get("forward_backward_parts"),
                "measured_peak_allocated_bytes": m.peak_allocated_bytes,
                "predicted_traced_peak_bytes": predicted["breakdown"]["memory"][
                    "fitted_peak_bytes"
                ],
            }
        )
    errors = [abs(r["error"]) for r in results]
    lines = [
        "# What-if (`advisor predict --target`) vs our own GPU runs",
        "",
        "Step time predicted from a trace-only CPU profile and the device's datasheet row, "
        "against the median measured step (predicted / measured - 1). Nothing fitted on these "
        "rows. `benchmarks/whatif_measured.py`.",
        "",
        "| run | target | precision | ckpt | mb×ga | measured s | predicted s | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r["config"]
        lines.append(
            f"| {r['source']} | {r['target']} | {c['precision']} | "
            f"{c['activation_checkpointing']} | {c['micro_batch_size']}×{c['grad_accum_steps']} | "
            f"{r['measured_step_time_s']:.4f} | {r['predicted_step_time_s']:.4f} | "
            f"{r['error']:+.1%} |"
        )
    lines += [
        "",
        f"{len(results)} rows: median |error| {statistics.median(errors):.1%}, "
        f"max {max(errors):.1%}.",
        "",
        *(
            f"- {precision}: {n} rows, RMS log error {rms:.3f}"
            + (" (strategies.uncertainty.WHAT_IF_FP32)" if precision == "fp32" else "")
            for precision, (n, rms) in rms_log_errors(results).items()
        ),
    ]
    pairs = attention_pairs(results)
    if pairs:
        lines += [
            "",
            "Eager attention against SDPA, the same model (`benchmarks/models/eager_gpt.py`): "
            "the eager/SDPA step ratio, measured and predicted (predicted / measured - 1).",
            "",
            "| pair | measured eager/SDPA | predicted | error |",
            "|---|---|---|---|",
            *(
                f"| {p['pair']} | {p['measured_ratio']:.2f}× | {p['predicted_ratio']:.2f}× | "
                f"{p['error']:+.1%} |"
                for p in pairs
            ),
        ]
    text = "\n".join(lines) + "\n"
    (RESULTS / "whatif_measured.md").write_text(text)
    (RESULTS / "whatif_measured.json").write_text(json.dumps(results, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
