"""Does the validation child time a config as `advisor train` does? An A/B on one host.

recommend validates single-device finalists in an isolated child
(``advisor.validation.local.measure_configs``: a memory pass, then the configs' steps
interleaved round-robin, 2 warm-up + 3 timed steps each) while the regret benchmark's grid
measures every config as a short ``advisor train`` run (``regret.measure_config``: a fresh
process, loader, loss sync, metrics writes; 2 warm-up + 3 timed steps). In the 12th regret
session the two disagreed 4x on one config (bert-tiny, gbs 16, single micro-batch 16: 7,099
tok/s validated, 31,184 in both grid passes) and the advice lost 32% to it. If the instruments
themselves differ, validation ranks configs on a scale the reference does not share.

This measures both instruments on the same configs, alternating which goes first each round
(child, train, train, child, ...), and records the host's load average at every visit. Per
config it reports the median over rounds of each instrument's per-visit median step time and
their ratio child / train (1.0: they agree), and the per-visit spread of the ratio. Each
visit also logs the share of the host's CPU time other processes took meanwhile
(``host_others_share``, profilers.host_activity; ``results/validation_agreement/``, gbs 16 of
2026-12-04, predates it; ``results/validation_agreement_gbs8/`` logs it at every visit).

    python benchmarks/validation_agreement.py          # bert-tiny and hf-gpt2, gbs 16, 4 rounds
    python benchmarks/validation_agreement.py --out benchmarks/results/validation_agreement

The configs are fixed before any run: at the global batch, the single-device micro-batch
splits the regret grid holds at both ends and one in between (mb = gbs, mb = gbs/8 with
accumulation 8) without checkpointing, and mb = gbs/4 with full checkpointing (a memory-bound
case's kind of winner).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Run as a script only benchmarks/ is on the path: the repository root makes `benchmarks.`
# importable (a second entry when imported from the tests is harmless).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

INSTRUMENTS = ("child", "train")


def config_label(micro_batch: int, accum: int, checkpointing: str) -> str:
    return f"mb{micro_batch}xga{accum}/{checkpointing}"


def plan_configs(global_batch: int) -> list[tuple[int, int, str]]:
    """(micro-batch, accumulation, checkpointing) per config: see the module's docstring."""
    out = [(global_batch, 1, "none")]
    if global_batch >= 8:
        out.append((global_batch // 8, 8, "none"))
    if global_batch >= 4:
        out.append((global_batch // 4, 4, "full"))
    return out


def visit_median(step_s: Sequence[float] | None) -> float | None:
    return statistics.median(step_s) if step_s else None


def summarize(visits: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, config): each instrument's median over rounds of its per-visit median step
    time, their ratio child / train, and the ratio within each round (the two instruments'
    visits of one round sit minutes apart at most)."""
    groups: dict[tuple[str, str], dict[str, dict[int, float]]] = {}
    for v in visits:
        m = visit_median(v.get("step_s"))
        if m is None:
            continue
        by = groups.setdefault((v["model"], v["config"]), {i: {} for i in INSTRUMENTS})
        by[v["instrument"]][int(v["round"])] = m
    rows: list[dict[str, Any]] = []
    for (model, config), by in groups.items():
        child, train = by["child"], by["train"]
        row: dict[str, Any] = {
            "model": model,
            "config": config,
            "child_s": statistics.median(child.values()) if child else None,
            "train_s": statistics.median(train.values()) if train else None,
            "rounds": len(set(child) & set(train)),
        }
        per_round = [child[r] / train[r] for r in sorted(set(child) & set(train))]
        row["ratio"] = (
            row["child_s"] / row["train_s"] if row["child_s"] and row["train_s"] else None
        )
        row["round_ratios"] = [round(x, 3) for x in per_round]
        row["ratio_min"] = min(per_round) if per_round else None
        row["ratio_max"] = max(per_round) if per_round else None
        rows.append(row)
    return rows


def table(rows: Sequence[Mapping[str, Any]], loads: Sequence[float]) -> str:
    lines = [
        "| model | config | rounds | child step (s) | train step (s) | child / train | per round |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else "—"
        rounds = ", ".join(f"{x:.2f}" for x in r["round_ratios"])
        lines.append(
            f"| {r['model']} | {r['config']} | {r['rounds']} | {r['child_s'] or 0:.4f} | "
            f"{r['train_s'] or 0:.4f} | {ratio} | {rounds} |"
        )
    ratios = [r["ratio"] for r in rows if r["ratio"]]
    if ratios:
        lines.append("")
        lines.append(
            f"Median child / train over {len(ratios)} configs: {statistics.median(ratios):.3f} "
            f"(range {min(ratios):.3f}-{max(ratios):.3f}); 1-minute load average at the visits "
            f"{min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} CPUs."
        )
    return "\n".join(lines) + "\n"


def _child_visit(configs: Sequence[Any]) -> list[dict[str, Any]]:
    """The product's validation child on ``configs`` (all of them at once, as recommend runs
    its finalists that fit together)."""
    from advisor.validation.local import _workload_args, measure_configs
    from profilers.isolate import Isolation, run_isolated

    outcome = run_isolated(
        Isolation(timeout_s=900),
        measure_configs,
        _workload_args(configs[0]),
        [c.step_spec() for c in configs],
        "cpu",
        warmup=2,
        rounds=3,
        interleave=True,
    )
    if not outcome.ok:
        return [{"status": outcome.status, "reason": outcome.reason} for _ in configs]
    return [
        {"status": r["status"], "step_s": r.get("samples"), "peak_bytes": r.get("peak")}
        for r in outcome.value
    ]


def _train_visit(config: Any, scratch: Path) -> dict[str, Any]:
    from benchmarks.regret import measure_config

    got = measure_config(config, warmup=2, steps=3, timeout_s=900, scratch=scratch)
    return {k: got.get(k) for k in ("status", "reason", "step_s", "warmup_step_s", "process_s")}


def run(models: Sequence[str], global_batch: int, rounds: int, out: Path | None) -> int:
    from benchmarks.regret import Settings, in_repo, model_entry
    from profilers.host_activity import HostMeter
    from strategies.config import DEFAULT_DATA, TrainConfig

    seq_len = Settings().seq_len  # the regret grid's
    visits: list[dict[str, Any]] = []
    raw = (out / "visits.jsonl").open("w") if out else None
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"validation-agreement-{os.getpid()}"
    with in_repo():
        for model in models:
            entry = model_entry(model)
            configs = [
                TrainConfig(
                    model=entry.spec,
                    model_args=dict(entry.args),
                    data=DEFAULT_DATA,
                    seq_len=seq_len,
                    global_batch_size=global_batch,
                    micro_batch_size=mb,
                    grad_accum_steps=ga,
                    activation_checkpointing=ckpt,
                )
                for mb, ga, ckpt in plan_configs(global_batch)
            ]
            labels = [config_label(mb, ga, ck) for mb, ga, ck in plan_configs(global_batch)]
            for rnd in range(rounds):
                order = INSTRUMENTS if rnd % 2 == 0 else INSTRUMENTS[::-1]
                for instrument in order:
                    load = os.getloadavg()[0]
                    started = time.time()
                    with HostMeter() as meter:
                        if instrument == "child":
                            got = _child_visit(configs)
                        else:
                            got = [_train_visit(c, scratch) for c in configs]
                    share = meter.others_share
                    for label, g in zip(labels, got, strict=True):
                        record = {
                            "model": model,
                            "config": label,
                            "round": rnd,
                            "instrument": instrument,
                            "load1": round(load, 2),
                            "wall_s": round(time.time() - started, 2),
                            "host_others_share": None if share is None else round(share, 4),
                            **g,
                        }
                        visits.append(record)
                        if raw:
                            raw.write(json.dumps(record) + "\n")
                            raw.flush()
                        med = visit_median(g.get("step_s"))
                        shown = f"{med:.4f} s" if med else g.get("status")
                        print(
                            f"{model} round {rnd + 1} {instrument:5s} {label}: {shown}", flush=True
                        )
    rows = summarize(visits)
    text = table(rows, [v["load1"] for v in visits])
    print("\n" + text)
    if out:
        if raw:
            raw.close()
        header = (
            f"# Validation child vs `advisor train` ({', '.join(models)}; gbs {global_batch}, "
            f"fp32, seq {seq_len}; {rounds} rounds alternating)\n\n"
            f"`python benchmarks/validation_agreement.py --models {' '.join(models)} "
            f"--global-batch-size {global_batch} --rounds {rounds} --out {out}`\n\n"
        )
        (out / "summary.md").write_text(header + text)
        (out / "summary.json").write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["bert-tiny", "hf-gpt2"])
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, help="folder: visits.jsonl, summary.{md,json}")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.global_batch_size < 1:
        parser.error("--rounds and --global-batch-size must be 1 or more")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    return run(args.models, args.global_batch_size, args.rounds, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
