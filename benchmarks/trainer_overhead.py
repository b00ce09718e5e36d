"""Per-step overhead of ``advisor train`` against a minimal hand-written PyTorch loop.

Both sides do the same work with the same TrainConfig: the same model (built with
``advisor.models.build_model`` under the same seed, so the weights are identical), the same token
windows, precision, micro-batch, accumulation, activation checkpointing, fused AdamW and
warm-up+cosine schedule, and the same number of optimizer steps. The hand-written loop is what
nanoGPT does (direct indexing into the token memmap, autocast, loss / accum, backward, clip,
AdamW, ``zero_grad(set_to_none=True)``, ``loss.item()`` per step); it uses neither AdvisorStep nor
the Trainer. Identical work is checked, not assumed: the per-step losses of each pair are compared.

Method: every run is a fresh subprocess (same interpreter, same ``torch.set_num_threads`` and
OMP/MKL thread variables), so neither side inherits the other's warm caches or allocator state.
Runs are interleaved in pairs whose order alternates (A B, B A, A B, ...) so slow drift in the
load of this shared machine cancels, and the statistic is the median over pairs of the ratio of
steady-state tokens/s (advisor / hand-written). Steady state = wall time from the end of step
``W`` to the end of the last step, where the end of a step is the moment its ``loss.item()``
returned (advisor's ``elapsed_s`` in metrics.jsonl; the same ``perf_counter`` point in the hand
loop), so everything the loops do per step -- data loading, metrics.jsonl writes, progress --
is inside the window. Eval and checkpointing: advisor always evaluates and saves once after the
last step; both loops do exactly that (and nothing else), after the measured window.

This host's two vCPUs are shared with other tenants, so wall-clock pairs can differ by 30-60%
for reasons neither loop controls. Each run therefore also records process CPU time at the same
step ends (advisor's through a one-line wrapper around ``MetricsLog.write``): the CPU-time ratio
measures the per-step work each loop does and barely moves with the load; the CPU share
(CPU s / wall s) of each run says how contended it was. Runs use one thread by default: a
2-thread OpenMP team on this host stalls whenever another tenant takes one of the cores
(the same small matmul measured anywhere from 0.4 to 32 ms).

Run ``python benchmarks/trainer_overhead.py`` (full, ~20 min on 2 busy vCPUs) or ``--quick``
(a smoke run on a shrunken model, well under a minute).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from profilers.metrics_record import TrainRecord, read_metrics
from profilers.rundir import TrainDir
from strategies.commands import Command
from strategies.config import (
    DEFAULT_DATA,
    DEFAULT_MODEL,
    DEFAULT_SEQ_LEN,
    TrainConfig,
    load_plan_config,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PREFIX = REPO / "benchmarks" / "results" / "trainer_overhead"
TARGET_RATIO = 0.97
SIDES = ("advisor", "hand")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """One row of the benchmark: the TrainConfig fields it sets (model, data and sequence length:
    TrainConfig's defaults)."""

    name: str
    model: str = DEFAULT_MODEL
    model_args: dict[str, Any] = field(default_factory=dict)
    data: str = DEFAULT_DATA
    seq_len: int = DEFAULT_SEQ_LEN
    micro_batch_size: int = 8
    grad_accum_steps: int = 1
    precision: str = "fp32"
    activation_checkpointing: str = "none"

    def train_config(self) -> TrainConfig:
        """The full TrainConfig both sides run (validated by strategies.config)."""
        return TrainConfig(
            model=self.model,
            model_args=self.model_args,
            data=self.data,
            seq_len=self.seq_len,
            micro_batch_size=self.micro_batch_size,
            grad_accum_steps=self.grad_accum_steps,
            global_batch_size=self.micro_batch_size * self.grad_accum_steps,
            precision=self.precision,
            activation_checkpointing=self.activation_checkpointing,
        )


# Same global batch (8 sequences of 128 tokens) in both: the second trades micro-batch for
# accumulation and recomputes every block, the knobs the advisor's search turns.
CONFIGS = (
    BenchConfig(name="gpt-tiny-fp32-mb8"),
    BenchConfig(
        name="gpt-tiny-fp32-mb2-accum4-ac",
        micro_batch_size=2,
        grad_accum_steps=4,
        activation_checkpointing="full",
    ),
)
# --quick: the same code paths on a model small enough for a smoke test.
QUICK_MODEL_ARGS = {"n_layer": 2, "n_embd": 64, "n_head": 2}


# -- children: one training run each, in a fresh process ---------------------------------------
def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def run_advisor_child(config_path: Path, steps: int, out: Path, quiet: bool) -> None:
    """``advisor train`` through its real CLI entry point (click parsing included)."""
    from advisor.cli import main

    # eval-every 0: eval only after the last step; checkpoint-every = steps: only the final save.
    args = (
        Command("train")
        .option("plan", config_path)
        .option("steps", steps)
        .option("out", out)
        .option("eval_every", 0)
        .option("checkpoint_every", steps)
        .option("device", "cpu")
        .switch("quiet", quiet)
        .args()
    )
    # Process CPU time at each train record, for the contention-robust statistic. The wrapper
    # adds one process_time() call per step (~1 us) and changes nothing else the loop does.
    from advisor.trainer.metrics import MetricsLog

    cpu: list[float] = []
    original = MetricsLog.write

    def write(self: MetricsLog, record: Any) -> None:
        if isinstance(record, TrainRecord):
            cpu.append(time.process_time())
        original(self, record)

    MetricsLog.write = write  # type: ignore[method-assign]
    try:
        main(args)
    finally:
        if out.is_dir():
            (out / "cpu.json").write_text(json.dumps(cpu))


def run_hand_child(config_path: Path, steps: int, out: Path) -> None:
    """The minimal nanoGPT-style loop; writes ``out/hand.json`` (step end times, losses).

    Deliberately none of advisor's step, trainer, loader, optimizer or schedule code: it is the
    hand-written baseline they are measured against. Shared: the model builder, the data source,
    and WindowDataset to check the first batch and for the final eval.
    """
    import contextlib

    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    from advisor.data import WindowDataset, resolve_data
    from advisor.data.loader import _STREAM_WINDOW, mix
    from advisor.models import build_model

    cfg = load_plan_config(config_path)
    seq_len, mb, accum = cfg.seq_len, cfg.micro_batch_size, cfg.grad_accum_steps
    global_batch = mb * accum

    torch.manual_seed(cfg.seed)
    adapter = build_model(cfg.model, cfg.model_args)
    model = adapter.module
    vocab = adapter.vocab_size

    class Checkpointed(nn.Module):
        def __init__(self, block: nn.Module) -> None:
            super().__init__()
            self.block = block

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = checkpoint(self.block, x, use_reentrant=False)
            return out

    if cfg.activation_checkpointing == "full":
        blocks = adapter.blocks()
        for i, block in enumerate(blocks):
            blocks[i] = Checkpointed(block)
    model.train()

    # Data: the run's sample g is the window at hash(seed, g) -- the positions advisor's
    # WindowDataset draws; computed up front like nanoGPT's torch.randint, read per step below.
    source = resolve_data(
        cfg.data, tokenizer=cfg.tokenizer, model_vocab=vocab, min_tokens=seq_len + 1
    )
    data = source.tokens("train")
    span = len(data) - seq_len
    starts = [mix(cfg.seed, g, _STREAM_WINDOW) % span for g in range(steps * global_batch)]

    def get_batch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        first = step * global_batch + micro * mb
        ix = starts[first : first + mb]
        x = torch.from_numpy(np.stack([data[i : i + seq_len] for i in ix]).astype(np.int64))
        y = torch.from_numpy(np.stack([data[i + 1 : i + 1 + seq_len] for i in ix]).astype(np.int64))
        return x, y

    # Guard against silently different data: the first micro-batch must be advisor's.
    objective = adapter.make_objective(source.vocab_size)
    reference = WindowDataset(source, "train", seq_len, cfg.seed, objective)
    x0, y0 = get_batch(0, 0)
    for k in range(mb):
        item = reference[k]
        assert torch.equal(x0[k], item["input_ids"]) and torch.equal(y0[k], item["labels"])

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    base_lr, min_lr, warmup = cfg.lr, cfg.min_lr, cfg.warmup_steps
    optimizer = torch.optim.AdamW(groups, lr=base_lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.precision)
    ctx: Any = contextlib.nullcontext() if dtype is None else torch.autocast("cpu", dtype=dtype)
    scaler = torch.amp.GradScaler("cpu", enabled=cfg.precision == "fp16")

    def get_lr(it: int) -> float:  # linear warm-up, then cosine to min_lr (nanoGPT)
        if it < warmup:
            lr = base_lr * (it + 1) / warmup
        else:
            progress = min(1.0, (it - warmup) / max(1, steps - warmup))
            lr = min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (base_lr - min_lr)
        return base_lr * (lr / base_lr)  # as LambdaLR forms it: base x factor, same bits

    times: list[float] = []
    cpu: list[float] = []  # process CPU time at each step end (not part of the loop's work)
    losses: list[float] = []
    t0 = time.perf_counter()
    for it in range(steps):
        lr = get_lr(it)
        for group in optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros(())
        for micro in range(accum):
            x, y = get_batch(it, micro)
            with ctx:
                logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, vocab), y.view(-1)) / accum
            scaler.scale(loss).backward()
            total += loss.detach()
        scaler.unscale_(optimizer)
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total.item())  # the one host sync per step
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time())

    # What advisor does once after its last step (outside the measured window): an eval over
    # 10 validation micro-batches and a checkpoint of model + optimizer.
    val = WindowDataset(source, "val", seq_len, cfg.seed, objective)
    model.eval()
    with torch.no_grad():
        for i in range(10):
            items = [val[j] for j in range(i * mb, (i + 1) * mb)]
            xv = torch.stack([item["input_ids"] for item in items])
            yv = torch.stack([item["labels"] for item in items])
            with ctx:
                logits = model(xv)
            F.cross_entropy(logits.float().view(-1, vocab), yv.view(-1))
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, out / "ckpt.pt")
    (out / "hand.json").write_text(json.dumps({"times": times, "cpu": cpu, "losses": losses}))


# -- parent: orchestration and statistics --------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RunResult:
    side: str
    pair: int
    position: int  # 0: ran first in its pair
    tokens_per_s: float  # steady-state window, wall clock
    tokens_per_cpu_s: float  # same window, process CPU time
    cpu_share: float  # CPU s / wall s in the window: < 1 when other tenants took the core
    median_step_tokens_per_s: float
    window_s: float
    process_s: float
    losses: list[float]


def _thread_env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def launch(side: str, config_path: Path, steps: int, out: Path, threads: int, quiet: bool) -> float:
    """Run one side in a fresh interpreter; returns the process wall time."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", side]
    cmd += ["--config-file", str(config_path), "--steps", str(steps), "--run-dir", str(out)]
    cmd += ["--threads", str(threads)] + (["--advisor-quiet"] if quiet else [])
    log = out.with_suffix(".log")
    started = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=REPO, env=_thread_env(threads), stdout=f, stderr=f)
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{side} run failed (exit {proc.returncode}):\n{tail}")
    return time.perf_counter() - started


def read_run(side: str, out: Path) -> tuple[list[float], list[float], list[float]]:
    """(wall time and CPU time at the end of each step, loss of each step), steps in order."""
    if side == "hand":
        data = json.loads((out / "hand.json").read_text())
        return data["times"], data["cpu"], data["losses"]
    train = sorted(read_metrics(TrainDir(out).metrics).train, key=lambda r: r.step)
    cpu = json.loads((out / "cpu.json").read_text())
    # A step without either value is left out: the step count check in one_run reports it.
    times = [r.elapsed_s for r in train if r.elapsed_s is not None]
    return times, cpu, [r.loss for r in train if r.loss is not None]


def step_durations(times: Sequence[float], warmup: int) -> list[float]:
    """Durations of steps warmup+1..N (``times[k]`` = end of step k+1; warmup >= 1)."""
    return [b - a for a, b in zip(times[warmup - 1 : -1], times[warmup:], strict=True)]


def one_run(
    side: str,
    pair: int,
    position: int,
    config_path: Path,
    steps: int,
    warmup: int,
    tokens_per_step: int,
    threads: int,
    quiet: bool,
    workdir: Path,
) -> RunResult:
    out = workdir / f"{side}-{pair}"
    process_s = launch(side, config_path, steps, out, threads, quiet)
    times, cpu, losses = read_run(side, out)
    shutil.rmtree(out)  # checkpoints: tens of MB per run
    if len(times) != steps or len(cpu) != steps:
        raise RuntimeError(f"{side} run logged {len(times)}/{len(cpu)} steps, expected {steps}")
    tokens = (steps - warmup) * tokens_per_step
    window = times[-1] - times[warmup - 1]
    cpu_window = cpu[-1] - cpu[warmup - 1]
    return RunResult(
        side=side,
        pair=pair,
        position=position,
        tokens_per_s=tokens / window,
        tokens_per_cpu_s=tokens / cpu_window,
        cpu_share=cpu_window / window,
        median_step_tokens_per_s=tokens_per_step / statistics.median(step_durations(times, warmup)),
        window_s=window,
        process_s=process_s,
        losses=losses,
    )


def calibrate_steps(
    config_path: Path, warmup: int, seconds: float, threads: int, workdir: Path, cap: int
) -> tuple[int, float]:
    """Measured steps so an uncontended run's steady window lasts at least ``seconds``.

    The fastest probe step is the estimate: a probe slowed by other tenants would otherwise
    shorten every run of the config.
    """
    probe = warmup + 4
    launch("hand", config_path, probe, workdir / "calibrate", threads, quiet=True)
    times, _, _ = read_run("hand", workdir / "calibrate")
    step_s = min(step_durations(times, warmup))
    return min(cap, max(3, math.ceil(seconds / step_s))), step_s


def _spread(values: Sequence[float]) -> dict[str, float]:
    med = statistics.median(values)
    return {
        "median": med,
        "min": min(values),
        "max": max(values),
        "spread_pct": 100.0 * (max(values) - min(values)) / med,
    }


def bench_config(bench: BenchConfig, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    config = bench.train_config()
    workdir = workdir / bench.name
    workdir.mkdir()
    config_path = workdir / "config.json"  # the TrainConfig both sides run (advisor: --plan)
    config_path.write_text(json.dumps(config.to_dict()))
    tokens_per_step = config.tokens_per_step
    calibration_step_s = None
    measured = args.steps
    if measured is None:
        measured, calibration_step_s = calibrate_steps(
            config_path, args.warmup_steps, args.seconds, args.threads, workdir, args.max_steps
        )
    steps = args.warmup_steps + measured
    print(
        f"[{bench.name}] {args.pairs} pairs x {steps} steps ({args.warmup_steps} warm-up excluded)"
        + (f", calibrated at {calibration_step_s:.3f} s/step" if calibration_step_s else ""),
        file=sys.stderr,
        flush=True,
    )
    runs: list[RunResult] = []
    pairs: list[dict[str, Any]] = []
    for pair in range(args.pairs):
        order = SIDES if pair % 2 == 0 else SIDES[::-1]
        result = {}
        for position, side in enumerate(order):
            run = one_run(
                side,
                pair,
                position,
                config_path,
                steps,
                args.warmup_steps,
                tokens_per_step,
                args.threads,
                args.advisor_quiet,
                workdir,
            )
            runs.append(run)
            result[side] = run
        adv, hand = result["advisor"], result["hand"]
        ratio = adv.tokens_per_s / hand.tokens_per_s
        cpu_ratio = adv.tokens_per_cpu_s / hand.tokens_per_cpu_s
        loss_diff = max(abs(a - b) for a, b in zip(adv.losses, hand.losses, strict=True))
        pairs.append(
            {
                "pair": pair,
                "order": list(order),
                "ratio": ratio,
                "cpu_ratio": cpu_ratio,
                "advisor_tokens_per_s": adv.tokens_per_s,
                "hand_tokens_per_s": hand.tokens_per_s,
                "advisor_cpu_share": adv.cpu_share,
                "hand_cpu_share": hand.cpu_share,
                "max_abs_loss_diff": loss_diff,
            }
        )
        print(
            f"[{bench.name}] pair {pair}: advisor {adv.tokens_per_s:,.0f} tok/s, hand "
            f"{hand.tokens_per_s:,.0f} tok/s, ratio {ratio:.3f} (CPU-time {cpu_ratio:.3f}; CPU "
            f"share {adv.cpu_share:.2f}/{hand.cpu_share:.2f}), max |dloss| {loss_diff:.2e}",
            file=sys.stderr,
            flush=True,
        )
    ratios = [p["ratio"] for p in pairs]
    summary = {
        "ratio": _spread(ratios),
        "cpu_ratio": _spread([p["cpu_ratio"] for p in pairs]),
        "min_cpu_share": min(r.cpu_share for r in runs),
        "advisor_tokens_per_s": _spread([r.tokens_per_s for r in runs if r.side == "advisor"]),
        "hand_tokens_per_s": _spread([r.tokens_per_s for r in runs if r.side == "hand"]),
        "advisor_tokens_per_cpu_s": _spread(
            [r.tokens_per_cpu_s for r in runs if r.side == "advisor"]
        ),
        "hand_tokens_per_cpu_s": _spread([r.tokens_per_cpu_s for r in runs if r.side == "hand"]),
        "advisor_median_step_tokens_per_s": statistics.median(
            r.median_step_tokens_per_s for r in runs if r.side == "advisor"
        ),
        "hand_median_step_tokens_per_s": statistics.median(
            r.median_step_tokens_per_s for r in runs if r.side == "hand"
        ),
        "max_abs_loss_diff": max(p["max_abs_loss_diff"] for p in pairs),
        "meets_target": statistics.median(ratios) >= TARGET_RATIO,
        "meets_target_cpu_time": statistics.median(p["cpu_ratio"] for p in pairs) >= TARGET_RATIO,
    }
    return {
        "name": bench.name,
        "train_config": config.to_dict(),
        "threads": args.threads,
        "steps": steps,
        "warmup_steps_excluded": args.warmup_steps,
        "tokens_per_step": tokens_per_step,
        "calibration_step_s": calibration_step_s,
        "pairs": pairs,
        "runs": [{k: v for k, v in asdict(r).items() if k != "losses"} for r in runs],
        "summary": summary,
    }


def _environment(threads: int) -> dict[str, Any]:
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "loadavg_start": list(os.getloadavg()),
    }


def render_markdown(results: dict[str, Any]) -> str:
    lines = [
        "| config | model | seq | micro-batch | accum | precision | act. ckpt | threads | steps "
        "(warm-up) | advisor tok/s median (min–max) | hand-written tok/s median (min–max) | "
        "ratio median (min–max) | CPU-time ratio median (min–max) | min CPU share | pairs | "
        "max abs loss diff | ≥ 0.97 (wall / CPU) |",
        "|" + "---|" * 17,
    ]
    for c in results["configs"]:
        t, s = c["train_config"], c["summary"]
        model = t["model"] + (
            " " + ",".join(f"{k}={v}" for k, v in t["model_args"].items())
            if t["model_args"]
            else ""
        )
        a, h, r, cr = (
            s["advisor_tokens_per_s"],
            s["hand_tokens_per_s"],
            s["ratio"],
            s["cpu_ratio"],
        )
        lines.append(
            f"| {c['name']} | {model} | {t['seq_len']} | {t['micro_batch_size']} | "
            f"{t['grad_accum_steps']} | {t['precision']} | {t['activation_checkpointing']} | "
            f"{c['threads']} | {c['steps']} ({c['warmup_steps_excluded']}) | "
            f"{a['median']:,.0f} ({a['min']:,.0f}–{a['max']:,.0f}) | "
            f"{h['median']:,.0f} ({h['min']:,.0f}–{h['max']:,.0f}) | "
            f"**{r['median']:.3f}** ({r['min']:.3f}–{r['max']:.3f}) | "
            f"{cr['median']:.3f} ({cr['min']:.3f}–{cr['max']:.3f}) | {s['min_cpu_share']:.2f} | "
            f"{len(c['pairs'])} | "
            f"{s['max_abs_loss_diff']:.1e} | {'yes' if s['meets_target'] else 'NO'} / "
            f"{'yes' if s['meets_target_cpu_time'] else 'NO'} |"
        )
    m = results["method"]
    lines += [
        "",
        "Ratio = advisor / hand-written steady-state tokens/s (wall clock), per interleaved pair "
        "(order alternates), median over pairs. CPU-time ratio: the same with process CPU "
        "seconds, which other tenants of a shared host barely move; CPU share = CPU s / wall s "
        "of a run's window (< 1: the run waited for a core). Each run is a fresh process; "
        "advisor progress "
        f"display {'off (--quiet)' if m['advisor_quiet'] else 'on (plain lines to a file)'}; "
        "eval and checkpoint once after the last step in both loops. "
        f"torch {results['environment']['torch']}, {results['environment']['cpu_count']} CPUs, "
        f"load average at start {results['environment']['loadavg_start'][0]:.1f}, "
        f"total {results['total_s'] / 60:.1f} min.",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Smoke run: small model, 1 pair.")
    parser.add_argument("--pairs", type=int, default=None, help="Interleaved pairs (default 5).")
    parser.add_argument(
        "--seconds",
        type=float,
        default=30.0,
        help="Target steady-state seconds per run; sets the step count by calibration.",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="Measured steps per run (skips calibration)."
    )
    parser.add_argument(
        "--warmup-steps", type=int, default=None, help="Steps excluded at the start (default 3)."
    )
    parser.add_argument("--max-steps", type=int, default=2000, help="Cap on calibrated steps.")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads (and OMP/MKL_NUM_THREADS) in every run. Default 1: on a "
        "shared 2-vCPU host a 2-thread OpenMP team stalls whenever another tenant takes a core, "
        "making runs 3-30x slower and incomparable.",
    )
    parser.add_argument(
        "--config",
        action="append",
        choices=[c.name for c in CONFIGS],
        help="Run only this config (repeatable; default all).",
    )
    parser.add_argument(
        "--advisor-quiet",
        action="store_true",
        help="Pass --quiet to advisor train (default: its progress lines are on).",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"Results prefix (writes PREFIX.json and PREFIX.md; default {DEFAULT_PREFIX} for "
        "the full run, a temporary directory with --quick).",
    )
    # Internal: one training run in this (fresh) process.
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--config-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is None:
        if args.pairs is None:
            args.pairs = 1 if args.quick else 5
        if args.warmup_steps is None:
            args.warmup_steps = 2 if args.quick else 3
        if args.quick and args.steps is None:
            args.steps = 8
        if args.pairs < 1 or args.warmup_steps < 1 or (args.steps is not None and args.steps < 2):
            parser.error("--pairs and --warmup-steps must be >= 1 and --steps >= 2")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        _set_threads(args.threads)
        if args.child == "advisor":
            run_advisor_child(args.config_file, args.steps, args.run_dir, args.advisor_quiet)
        else:
            run_hand_child(args.config_file, args.steps, args.run_dir)
        return 0

    configs = [c for c in CONFIGS if not args.config or c.name in args.config]
    if args.quick:
        configs = [replace(c, model_args=dict(QUICK_MODEL_ARGS)) for c in configs]
    started = time.perf_counter()
    environment = _environment(args.threads)
    with tempfile.TemporaryDirectory(prefix="trainer_overhead-") as tmp:
        results_per_config = [bench_config(c, args, Path(tmp)) for c in configs]
    environment["loadavg_end"] = list(os.getloadavg())
    results = {
        "benchmark": "trainer_overhead",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": args.quick,
        "target_ratio": TARGET_RATIO,
        "method": {
            "pairs": args.pairs,
            "order": "alternating per pair: (advisor, hand), (hand, advisor), ...",
            "statistic": "median over pairs of advisor/hand steady-state tokens/s",
            "steady_state": "wall time from the end of the last warm-up step to the end of the "
            "last step (end = loss.item() returned)",
            "advisor_quiet": args.advisor_quiet,
            "eval_and_checkpoint": "once, after the last step, in both loops",
            "fresh_process_per_run": True,
        },
        "environment": environment,
        "configs": results_per_config,
        "total_s": time.perf_counter() - started,
    }
    prefix = args.out
    if prefix is None:
        prefix = (
            Path(tempfile.mkdtemp(prefix="trainer_overhead-quick-")) / "trainer_overhead"
            if args.quick
            else DEFAULT_PREFIX
        )
    prefix.parent.mkdir(parents=True, exist_ok=True)
    table = render_markdown(results)
    prefix.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    prefix.with_suffix(".md").write_text("# Trainer overhead\n\n" + table)
    print(table)
    print(f"wrote {prefix.with_suffix('.json')} and {prefix.with_suffix('.md')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
