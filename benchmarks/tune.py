"""``advisor tune`` against the default hyper-parameters and an LR range test, at equal tokens.

For each model (gpt-tiny, llama-tiny; seq 128, global batch 8, fp32, one process, Python's own
sources) and one run length (``--steps``, default 100 optimizer steps = 102,400 tokens):

- **tuned**: ``advisor tune`` (the Python API, ``seed=0`` for the sampler) over lr (log, 1/10 to
  10x the default), warm-up (0 to a fifth of the run) and weight decay (0 to 0.3), ``--trials``
  trials (default 24), each trial the full run length, successive-halving pruning. Its number is
  the best trial's final eval loss; with ``--rerun`` the tuned plan is also trained again by
  ``advisor train --plan tuned_plan.json`` for the same steps, which must give the same loss
  (training is deterministic per seed; the table shows both).
- **default**: the plan's own values (lr 1e-3, warm-up 20, weight decay 0.1). It is the study's
  trial 0: the same config, steps, eval schedule and seed as a separate ``advisor train``
  (``advisor tune`` runs each trial as exactly that), so it is not trained twice.
- **LR range test** (Smith 2017, "Cyclical Learning Rates", sec. 3.3: increase the lr linearly
  during a short run and watch the loss): ``advisor train`` for ``--lrrt-steps`` steps (default
  40) with ``warmup_steps`` equal to the run and ``lr`` = LRRT_MAX (0.1), so the trainer's own
  linear warm-up sweeps the lr from LRRT_MAX/40 to LRRT_MAX, one step per value. Rule: smooth
  the training loss (EMA, beta 0.8, bias-corrected); the *divergence lr* is the lr of the first
  step after the smoothed minimum whose smoothed loss is back above the minimum plus half the
  distance from the first smoothed value down to the minimum (non-finite counts too); the pick is
  a tenth of it (a tenth of the minimum's lr if nothing diverges). The pick then trains the run
  with the default warm-up and weight decay (``min_lr`` a tenth of it, as the default's).

Cost: the tokens the study trained (all trials, pruned ones up to where they stopped) / the
tokens of one run; the LR range test's the same way. Every run is a fresh ``python -m advisor``
process; held-out loss is the trainer's own eval (4 global batches of the validation split).
Every run's metrics.jsonl is kept under ``benchmarks/results/tune/MODEL/``; results.json and
results.md are derived from those files alone (``--analyze`` derives them again).

    python benchmarks/tune.py --rerun         # the committed results
    python benchmarks/tune.py --analyze
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from profilers.metrics_record import read_metrics  # noqa: E402
from profilers.rundir import STUDY, RunDir, TrainDir  # noqa: E402
from strategies.config import TrainConfig  # noqa: E402
from strategies.plan_records import Plan  # noqa: E402
from strategies.prediction import Prediction  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "tune"
MODELS = ("gpt-tiny", "llama-tiny")
SEQ_LEN = 128
GLOBAL_BATCH = 8
LRRT_MAX = 0.1
EMA_BETA = 0.8


def plan_for(model: str) -> Plan:
    config = TrainConfig(
        model=model,
        data="stdlib",
        seq_len=SEQ_LEN,
        global_batch_size=GLOBAL_BATCH,
        micro_batch_size=GLOBAL_BATCH,
        grad_accum_steps=1,
    )
    # No search ran: the benchmark needs a config to tune, not advice on its speed.
    return Plan(
        config=config,
        predicted=Prediction(
            peak_memory_bytes=0,
            budgeted_bytes=0,
            budget_bytes=1,
            step_time_s=0.0,
            tokens_per_s=0.0,
            estimate=True,
        ),
        measured=None,
        baseline=None,
        reasons=("benchmark plan: fp32, one process, micro-batch 8 (no speed search)",),
        estimate=True,
        label="benchmarks/tune.py",
    )


def advisor(*args: str) -> None:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "advisor", *args], cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"advisor {' '.join(args)} failed with exit {done.returncode}")
    print(f"  ({time.perf_counter() - started:.0f} s) advisor {' '.join(args)}", flush=True)


def train(plan: Path, out: Path, steps: int, *extra: str) -> None:
    if out.exists():
        shutil.rmtree(out)
    advisor(
        "train", "--plan", str(plan), "--out", str(out), "--steps", str(steps),
        "--eval-every", str(max(1, steps // 10)), "--checkpoint-every", str(steps),
        "--keep-checkpoints", "1", "--quiet", *extra,
    )  # fmt: skip
    shutil.rmtree(TrainDir(out).checkpoints, ignore_errors=True)


def run_model(
    model: str,
    steps: int,
    trials: int,
    lrrt_steps: int,
    seed: int,
    rerun: bool,
    results: Path,
    parts: tuple[str, ...] = ("study", "lrrt"),
) -> None:
    """The model's study (and the tuned plan's re-run) and its LR range test; ``parts`` runs
    one of them (they are independent: two processes can run them side by side)."""
    out = results / model
    plan = plan_for(model)
    if "study" in parts:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        study(out, plan, steps, trials, seed, rerun)
    if "lrrt" in parts:
        out.mkdir(parents=True, exist_ok=True)
        range_test(out, plan, steps, lrrt_steps)


def study(out: Path, plan: Plan, steps: int, trials: int, seed: int, rerun: bool) -> None:
    plan_path = RunDir(out).plan
    plan_path.write_text(json.dumps(plan.to_dict(), indent=1) + "\n")
    tokens = steps * plan.config.tokens_per_step
    print(f"{plan.config.model}: study of {trials} trials of {steps} steps", flush=True)
    import advisor as api

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        api.tune(
            plan_path,
            trials=trials,
            tokens_per_trial=tokens,
            storage=f"sqlite:///{Path(tmp) / STUDY}",
            out=out,
            device="cpu",
            seed=seed,
        )
        wall = time.perf_counter() - started
    wall_file = RunDir(out).tune.root / "wall_s.json"
    wall_file.write_text(json.dumps({"study_wall_s": round(wall, 1)}) + "\n")
    if rerun:
        train(RunDir(out).tuned_plan, out / "tuned_run", steps)


def range_test(out: Path, plan: Plan, steps: int, lrrt_steps: int) -> None:
    """The sweep (the trainer's linear warm-up is the sweep), then its pick for the run."""
    print(f"{plan.config.model}: LR range test of {lrrt_steps} steps", flush=True)
    sweep = dataclasses.replace(plan.config, lr=LRRT_MAX, min_lr=LRRT_MAX, warmup_steps=lrrt_steps)
    sweep_plan = out / "lrrt_plan.json"
    sweep_plan.write_text(json.dumps({"config": sweep.to_dict()}, indent=1) + "\n")
    train(sweep_plan, out / "lrrt", lrrt_steps)
    pick = lrrt_pick(TrainDir(out / "lrrt").metrics)
    picked = dataclasses.replace(plan.config, lr=pick["pick_lr"], min_lr=pick["pick_lr"] / 10)
    picked_plan = out / "lrrt_pick_plan.json"
    picked_plan.write_text(json.dumps({"config": picked.to_dict()}, indent=1) + "\n")
    train(picked_plan, out / "lrrt_pick_run", steps)


def lrrt_pick(metrics: Path) -> dict[str, Any]:
    """The LR range test's rule (module docstring) over a sweep's metrics.jsonl."""
    records = read_metrics(metrics).train
    lrs = [float(r.lr or 0.0) for r in records]
    losses = [float(r.loss) if r.loss is not None else math.inf for r in records]
    smooth, avg = [], 0.0
    for i, loss in enumerate(losses):
        if not math.isfinite(loss):
            smooth.append(math.inf)
            continue
        avg = EMA_BETA * avg + (1 - EMA_BETA) * loss
        smooth.append(avg / (1 - EMA_BETA ** (i + 1)))
    finite = [s for s in smooth if math.isfinite(s)]
    best = min(range(len(smooth)), key=lambda i: smooth[i])
    threshold = smooth[best] + 0.5 * (finite[0] - smooth[best])
    diverged = next((i for i in range(best + 1, len(smooth)) if not smooth[i] < threshold), None)
    base = lrs[diverged] if diverged is not None else lrs[best]
    return {
        "min_loss_lr": lrs[best],
        "divergence_lr": lrs[diverged] if diverged is not None else None,
        "pick_lr": base / 10,
        "rule": "a tenth of the divergence lr (EMA 0.8; divergence: past the minimum, above "
        "min + (first - min)/2); a tenth of the minimum's lr when nothing diverged",
    }


def _complete(directory: Path) -> tuple[int, float] | None:
    """(steps, final eval loss) of a training directory whose run reached its last step."""
    files = TrainDir(directory)
    if not files.metrics.is_file() or not files.train_config.is_file():
        return None
    total = json.loads(files.train_config.read_text()).get("total_steps")
    records = read_metrics(files.metrics)
    if not records.train or records.train[-1].step != total or not records.evals:
        return None
    last = records.evals[-1]
    return (int(total), last.eval_loss) if last.step == total and last.eval_loss else None


def analyze() -> dict[str, Any]:
    """One row per model from its files; what has not run (yet) is None and listed."""
    rows = []
    for model in MODELS:
        out = RESULTS / model
        if not out.is_dir():
            continue
        files = RunDir(out).tune
        per_step = plan_for(model).config.tokens_per_step
        missing = []
        study = json.loads(files.study.read_text()) if files.study.is_file() else None
        trials = []
        if files.trials.is_file():
            trials = [json.loads(line) for line in files.trials.read_text().splitlines()]
        # Trial 0 is the plan's own values (the study enqueues them first): in the study's own
        # folder since 2026-12-07, directly under tune/ in results tuned before.
        first = files.trial(study["study_name"], 0).root if study else None
        if first is None or not first.is_dir():
            first = files.root / "trial_0000"
        default = _complete(first)
        steps = study["steps_per_trial"] if study else (default[0] if default else None)
        run_tokens = steps * per_step if steps else None
        if study is None:
            missing.append("the study did not finish: tuned values and study cost missing")
        lrrt_metrics = TrainDir(out / "lrrt").metrics
        lrrt = lrrt_pick(lrrt_metrics) if lrrt_metrics.is_file() else None
        pick = _complete(out / "lrrt_pick_run")
        if lrrt is None or pick is None:
            missing.append("the LR range test's pick did not finish its run")
        lrrt_tokens = read_metrics(lrrt_metrics).train[-1].tokens if lrrt is not None else None
        tuned = json.loads(RunDir(out).tuned_plan.read_text())["config"] if study else None
        rerun = _complete(out / "tuned_run")
        wall_file = files.root / "wall_s.json"
        rows.append(
            {
                "model": model,
                "steps": steps,
                "tokens": run_tokens,
                "default_lr": plan_for(model).config.lr,
                "default_eval_loss": default[1] if default else None,
                "lrrt_pick_lr": lrrt["pick_lr"] if lrrt else None,
                "lrrt_divergence_lr": lrrt["divergence_lr"] if lrrt else None,
                "lrrt_min_loss_lr": lrrt["min_loss_lr"] if lrrt else None,
                "lrrt_eval_loss": pick[1] if pick else None,
                "lrrt_tokens": lrrt_tokens,
                "lrrt_cost_runs": lrrt_tokens / run_tokens if lrrt_tokens and run_tokens else None,
                "tuned": {k: tuned[k] for k in ("lr", "warmup_steps", "weight_decay")}
                if tuned
                else None,
                "tuned_best_trial_eval_loss": study["best_score"] if study else None,
                "tuned_eval_loss": rerun[1] if rerun else None,
                "study_trials": len(trials),
                "study_trial_states": [t["state"] for t in trials],
                "study_counts": study["counts"] if study else None,
                "study_cost_runs": study["tokens_trained"] / run_tokens
                if study and run_tokens
                else None,
                "study_wall_s": json.loads(wall_file.read_text())["study_wall_s"]
                if wall_file.is_file()
                else None,
                "sensitivity": {s["name"]: s["rho"] for s in study["sensitivity"]}
                if study
                else None,
                "missing": missing,
            }
        )
    return {"rows": rows, "lrrt_rule": lrrt_pick.__doc__, "method": __doc__.split("\n\n")[0]}


def table(result: dict[str, Any]) -> str:
    def f(v: Any, spec: str = ".4f") -> str:
        return "–" if v is None else format(v, spec)

    lines = [
        "| model | steps (tokens) | default: eval loss | LR range test: lr → eval loss | "
        "tuned: lr, warm-up, wd → eval loss of the re-run (of the best trial) | study: trials "
        "(complete/pruned) | study cost (× one run) | LRRT cost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        t = r["tuned"]
        c = r["study_counts"]
        tuned = (
            f"{t['lr']:.3g}, {t['warmup_steps']}, {t['weight_decay']:.3f} → "
            f"{f(r['tuned_eval_loss'])} ({f(r['tuned_best_trial_eval_loss'])})"
            if t
            else "not finished"
        )
        counts = f" ({c.get('complete', 0)}/{c.get('pruned', 0)})" if c else " (running)"
        tokens = f" ({r['tokens']:,})" if r["tokens"] else ""
        lrrt = (
            f"{r['lrrt_pick_lr']:.3g} → {f(r['lrrt_eval_loss'])}"
            if r["lrrt_pick_lr"] is not None
            else "not finished"
        )
        lines.append(
            f"| {r['model']} | {r['steps'] or '–'}{tokens} | "
            f"{f(r['default_eval_loss'])} (lr {r['default_lr']:g}) | {lrrt} | {tuned} | "
            f"{r['study_trials']}{counts} | {f(r['study_cost_runs'], '.2f')} | "
            f"{f(r['lrrt_cost_runs'], '.2f')} |"
        )
    for r in result["rows"]:
        for note in r["missing"]:
            lines.append(f"\n{r['model']}: {note}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--lrrt-steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument(
        "--rerun", action="store_true", help="also train the tuned plan again (a determinism check)"
    )
    parser.add_argument("--analyze", action="store_true", help="derive results, train nothing")
    parser.add_argument(
        "--parts", default="study,lrrt", help="study, lrrt or both (independent of each other)"
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="where the models' run directories go (the analysis reads benchmarks/results/tune)",
    )
    args = parser.parse_args()
    if not args.analyze:
        for model in args.models.split(","):
            run_model(
                model,
                args.steps,
                args.trials,
                args.lrrt_steps,
                args.seed,
                args.rerun,
                args.results,
                tuple(args.parts.split(",")),
            )
    result = analyze()
    (RESULTS / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    text = table(result)
    (RESULTS / "results.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
