"""Per-step overhead of ``advisor train`` against a minimal hand-written PyTorch loop.

Both sides do the same work with the same TrainConfig: the same model (built with
``advisor.models.build_model`` under the same seed, so the weights are identical), the same token
windows, precision, micro-batch, accumulation, activation checkpointing, AdamW and
warm-up+cosine schedule, and the same number of optimizer steps. The hand-written loops
(``overhead_loops.py``) are what nanoGPT does (direct indexing into the token memmap, autocast,
loss / accum, backward, clip, AdamW, ``zero_grad(set_to_none=True)``, ``loss.item()`` per step);
they use neither AdvisorStep nor the Trainer. Identical work is checked, not assumed: the
per-step losses of each pair are compared.

Three layouts at one global batch: a single process, and DDP and FSDP2 at world size 2 on
CPU (gloo), one process per rank. Distributed advisor runs go through the product's own
launch: ``advisor train --plan CONFIG`` sees a ddp/fsdp plan and starts torchrun itself
(``advisor.launch``: ``torch.distributed.run`` with the product's torchrun arguments); the
hand-written loops run under ``python -m torch.distributed.run`` with the same arguments.

Method: every run is a fresh subprocess (same interpreter, same ``torch.set_num_threads`` and
OMP/MKL thread variables, per rank for ddp/fsdp), so neither side inherits the other's warm
caches or allocator state. Runs are interleaved in pairs whose order alternates (A B, B A, ...)
so slow drift in the load of this shared machine cancels, and the statistic is the median over
pairs of the ratio of steady-state tokens/s (advisor / hand-written). Steady state = wall time
from the end of step ``W`` to the end of the last step, where the end of a step is the moment its
``loss.item()`` returned on rank 0 (advisor's ``elapsed_s`` in metrics.jsonl; the same
``perf_counter`` point in the hand loop), so everything the loops do per step -- data loading,
metrics.jsonl writes, progress, advisor's per-step peak-memory gather -- is inside the window.
Eval and checkpointing: advisor always evaluates and saves once after the last step; both
loops do exactly that (and nothing else), after the measured window.

This host's two vCPUs are shared with other tenants, so wall-clock pairs can differ by 30-60%
for reasons neither loop controls. Each run therefore also records process CPU time at the same
step ends on every rank (advisor's through a wrapper around the trainer's step method that
reads ``time.process_time()`` when it returns): the CPU-time ratio measures the per-step work
each loop does and barely moves with the load; the CPU share (CPU s / (wall s x processes)) of
each run says how contended it was. Processes use one thread by default: a 2-thread OpenMP
team on this host stalls whenever another tenant takes one of the cores.

Every run's raw lists (step end times, CPU times per rank, losses) go to PREFIX_runs.jsonl as
it finishes; the results (PREFIX.json, PREFIX.md) are derived from that log alone
(``overhead_analysis.py``), and ``--analyze PREFIX_runs.jsonl`` derives them again.

Run ``python benchmarks/trainer_overhead.py`` (full) or ``--quick`` (a smoke run on a shrunken
model); ``--layouts single`` is the single-process comparison alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

# Run as a script (also by torchrun's ranks) only benchmarks/ is on the path: the repository
# root makes `benchmarks.` importable (a second entry when imported from the tests is harmless).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.overhead_analysis import (
    LAYOUTS,
    analyze,
    pair_order,
    render_markdown,
    run_result,
    step_durations,
)
from benchmarks.overhead_loops import hand_file, run_hand
from profilers.metrics_record import read_metrics
from profilers.rundir import TrainDir
from strategies.commands import Command
from strategies.config import (
    DEFAULT_DATA,
    DEFAULT_MODEL,
    DEFAULT_SEQ_LEN,
    TrainConfig,
    load_plan_config,
)

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parents[1]
DEFAULT_PREFIX = REPO / "benchmarks" / "results" / "trainer_overhead"
DEFAULT_WORLD_SIZE = 2
CHILDREN = ("advisor", "advisor-rank", "hand")


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
    parallelism: str = "single"
    world_size: int = 1
    base: str = ""  # the single-process config this one was derived from ("": itself)

    @property
    def global_batch_size(self) -> int:
        return self.micro_batch_size * self.grad_accum_steps * self.world_size

    def train_config(self) -> TrainConfig:
        """The full TrainConfig both sides run (validated by strategies.config)."""
        return TrainConfig(
            model=self.model,
            model_args=self.model_args,
            data=self.data,
            seq_len=self.seq_len,
            micro_batch_size=self.micro_batch_size,
            grad_accum_steps=self.grad_accum_steps,
            global_batch_size=self.global_batch_size,
            precision=self.precision,
            activation_checkpointing=self.activation_checkpointing,
            parallelism=self.parallelism,
            world_size=self.world_size,
        )

    def for_layout(self, layout: str, world_size: int) -> BenchConfig:
        """The same global batch on ``world_size`` ranks of ``layout`` (ddp, fsdp): each rank
        takes 1/world of the accumulation steps when they divide, else of the micro-batch."""
        if layout == "single":
            return self
        if layout not in LAYOUTS or world_size < 2:
            raise ValueError(f"layout {layout!r} at world size {world_size}: use ddp or fsdp, >= 2")
        mb, accum = self.micro_batch_size, self.grad_accum_steps
        if accum % world_size == 0:
            accum //= world_size
        elif mb % world_size == 0:
            mb //= world_size
        else:
            raise ValueError(
                f"{self.name}: neither accumulation {accum} nor micro-batch {mb} divides by "
                f"world size {world_size}"
            )
        name = f"{self.model}-{self.precision}-{layout}{world_size}-mb{mb}"
        name += f"-accum{accum}" if accum > 1 else ""
        name += "-ac" if self.activation_checkpointing != "none" else ""
        return replace(
            self,
            name=name,
            micro_batch_size=mb,
            grad_accum_steps=accum,
            parallelism=layout,
            world_size=world_size,
            base=self.name,
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


def bench_configs(
    names: Sequence[str] | None, layouts: Sequence[str], world_size: int, quick: bool
) -> list[BenchConfig]:
    """Every (base config, layout) to run, grouped by base config, layouts in the given order."""
    bases = [c for c in CONFIGS if not names or c.name in names]
    if quick:
        bases = [replace(c, model_args=dict(QUICK_MODEL_ARGS)) for c in bases]
    return [base.for_layout(layout, world_size) for base in bases for layout in layouts]


# -- children: one training run (or one rank of one) each, in a fresh process -------------------
def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def cpu_file(out: Path, rank: int) -> Path:
    """Where an advisor rank leaves its process CPU time at the end of each step."""
    return out / f"cpu-rank{rank}.json"


def record_step_cpu_times(out: Path) -> Callable[[], None]:
    """Read process CPU time whenever the trainer's step method returns (every rank; the
    moment ``elapsed_s`` was read); returns the function that saves the list. The wrapper adds
    one ``process_time()`` call per step (~1 us) and changes nothing else the trainer does."""
    from advisor.trainer.loop import Trainer

    cpu: list[float] = []
    original = Trainer._train_step

    def _train_step(self: Trainer, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        cpu.append(time.process_time())
        return result

    Trainer._train_step = _train_step  # type: ignore[method-assign]

    def save() -> None:
        if out.is_dir():
            cpu_file(out, int(os.environ.get("RANK", "0"))).write_text(json.dumps(cpu))

    return save


def route_ranks_through_this_file(out: Path, threads: int) -> None:
    """Make the product's launcher start each rank as ``python THIS --child advisor-rank ...
    -- ARGS`` instead of ``python -m advisor ARGS``: the same torchrun arguments, environment and
    rank arguments (``advisor.launch.launch``, unchanged), and the rank entry calls the same
    ``advisor.cli.main(ARGS)`` that ``python -m advisor`` calls, after installing the CPU-time
    reader (which must live in the rank's own process)."""
    import torch.distributed.run as torchrun

    original = torchrun.run

    def run(args: argparse.Namespace) -> None:
        if not (args.module and args.training_script == "advisor"):
            raise RuntimeError(f"unexpected torchrun program {args.training_script!r}")
        args.module = False
        args.training_script = str(SCRIPT)
        own = ["--child", "advisor-rank", "--threads", str(threads), "--run-dir", str(out)]
        args.training_script_args = [*own, "--", *args.training_script_args]
        original(args)

    torchrun.run = run


def advisor_train_args(config_path: Path, steps: int, out: Path, quiet: bool) -> list[str]:
    """``advisor train`` as the benchmark runs it: eval only after the last step
    (``--eval-every 0``), the only checkpoint the final one (``--checkpoint-every STEPS``)."""
    return (
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


def run_advisor_child(
    config_path: Path, steps: int, out: Path, quiet: bool, threads: int, distributed: bool
) -> None:
    """``advisor train`` through its real CLI entry point (click parsing included). A ddp/fsdp
    plan makes it launch its ranks through torchrun, as a user's ``advisor train`` does."""
    from advisor.cli import main

    args = advisor_train_args(config_path, steps, out, quiet)
    if distributed:
        route_ranks_through_this_file(out, threads)
        main(args)
        return
    save = record_step_cpu_times(out)
    try:
        main(args)
    finally:
        save()


def run_advisor_rank(out: Path, args: list[str]) -> None:
    """One rank of a distributed ``advisor train`` (what ``python -m advisor ARGS`` runs)."""
    from advisor.cli import main

    save = record_step_cpu_times(out)
    try:
        main(args)
    finally:
        save()


# -- parent: orchestration -----------------------------------------------------------------------
def _thread_env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def torchrun_prefix(world_size: int) -> list[str]:
    """``python -m torch.distributed.run`` with the arguments the product's launcher uses."""
    from advisor.launch import LaunchSpec

    spec = LaunchSpec(world_size=world_size)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *spec.torchrun_args(),
        f"--monitor-interval={spec.monitor_interval_s}",
        "--max-restarts=0",
    ]


def child_command(
    side: str, config_path: Path, steps: int, out: Path, threads: int, quiet: bool, world: int
) -> list[str]:
    """The command line of one run. advisor: always one process (its CLI launches torchrun for
    a distributed plan); hand-written: torchrun's ranks for world size > 1."""
    own = [str(SCRIPT), "--child", side, "--config-file", str(config_path), "--steps", str(steps)]
    own += ["--run-dir", str(out), "--threads", str(threads)]
    own += ["--advisor-quiet"] if quiet else []
    if side == "hand" and world > 1:
        return [*torchrun_prefix(world), *own]
    return [sys.executable, *own]


def launch(
    side: str,
    config_path: Path,
    steps: int,
    out: Path,
    threads: int,
    quiet: bool,
    world: int,
) -> float:
    """Run one side in fresh process(es); returns the wall time from spawn to exit."""
    cmd = child_command(side, config_path, steps, out, threads, quiet, world)
    log = out.with_suffix(".log")
    started = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=REPO, env=_thread_env(threads), stdout=f, stderr=f)
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{side} run failed (exit {proc.returncode}):\n{tail}")
    return time.perf_counter() - started


def read_run(
    side: str, out: Path, world: int
) -> tuple[list[float], list[list[float]], list[float]]:
    """(wall time at the end of each step on rank 0, process CPU time at the end of each step on
    each rank, loss of each step), steps in order."""
    if side == "hand":
        ranks = [json.loads(hand_file(out, r).read_text()) for r in range(world)]
        return ranks[0]["times"], [r["cpu"] for r in ranks], ranks[0]["losses"]
    train = sorted(read_metrics(TrainDir(out).metrics).train, key=lambda r: r.step)
    cpu = [json.loads(cpu_file(out, r).read_text()) for r in range(world)]
    # A step without either value is left out: the analysis' step count check reports it.
    times = [r.elapsed_s for r in train if r.elapsed_s is not None]
    return times, cpu, [r.loss for r in train if r.loss is not None]


class RunsLog:
    """PREFIX_runs.jsonl: every record of this invocation, appended and fsynced as it happens
    (a kill loses at most the run in flight); also kept in memory for the analysis."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = open(path, "w")  # noqa: SIM115 - open for the whole invocation

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()


def calibrate_steps(
    config_path: Path,
    warmup: int,
    seconds: float,
    threads: int,
    world: int,
    workdir: Path,
    cap: int,
) -> tuple[int, float]:
    """Measured steps so an uncontended run's steady window lasts at least ``seconds``.

    The fastest probe step is the estimate: a probe slowed by other tenants would otherwise
    shorten every run of the config.
    """
    probe = warmup + 4
    out = workdir / "calibrate"
    launch("hand", config_path, probe, out, threads, quiet=True, world=world)
    times, _, _ = read_run("hand", out, world)
    shutil.rmtree(out)
    step_s = min(step_durations(times, warmup))
    return min(cap, max(3, math.ceil(seconds / step_s))), step_s


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def bench_config(bench: BenchConfig, args: argparse.Namespace, workdir: Path, log: RunsLog) -> None:
    """Calibrate (unless --steps), then run the interleaved pairs; every record goes to ``log``."""
    config = bench.train_config()
    world = config.world_size
    workdir = workdir / bench.name
    workdir.mkdir()
    config_path = workdir / "config.json"  # the TrainConfig both sides run (advisor: --plan)
    config_path.write_text(json.dumps(config.to_dict()))
    tokens_per_step = config.tokens_per_step
    calibration_step_s = None
    measured = args.steps
    if measured is None:
        measured, calibration_step_s = calibrate_steps(
            config_path,
            args.warmup_steps,
            args.seconds,
            args.threads,
            world,
            workdir,
            args.max_steps,
        )
    steps = args.warmup_steps + measured
    log.write(
        {
            "record": "config",
            "name": bench.name,
            "base": bench.base or bench.name,
            "layout": bench.parallelism,
            "world_size": world,
            "train_config": config.to_dict(),
            "threads": args.threads,
            "steps": steps,
            "warmup_steps_excluded": args.warmup_steps,
            "tokens_per_step": tokens_per_step,
            "calibration_step_s": calibration_step_s,
        }
    )
    say(
        f"[{bench.name}] {args.pairs} pairs x {steps} steps ({args.warmup_steps} warm-up excluded)"
        + (f", calibrated at {calibration_step_s:.3f} s/step" if calibration_step_s else "")
    )
    for pair in range(args.pairs):
        for position, side in enumerate(pair_order(pair)):
            out = workdir / f"{side}-{pair}"
            try:
                process_s = launch(
                    side, config_path, steps, out, args.threads, args.advisor_quiet, world
                )
                times, cpu, losses = read_run(side, out, world)
                record = {
                    "record": "run",
                    "config": bench.name,
                    "side": side,
                    "pair": pair,
                    "position": position,
                    "steps": steps,
                    "warmup": args.warmup_steps,
                    "tokens_per_step": tokens_per_step,
                    "times": times,
                    "cpu": cpu,
                    "losses": losses,
                    "process_s": process_s,
                }
                run_result(record)  # complete? (every step timed on every rank)
            except (RuntimeError, OSError, ValueError, KeyError) as exc:
                log.write(
                    {
                        "record": "failure",
                        "config": bench.name,
                        "side": side,
                        "pair": pair,
                        "reason": str(exc)[-2000:],
                    }
                )
                say(f"[{bench.name}] pair {pair}: {side} run FAILED: {str(exc)[-500:]}")
                continue
            finally:
                shutil.rmtree(out, ignore_errors=True)  # checkpoints: tens of MB per run
            log.write(record)
        entry = analyze(log.records)["configs"][-1]
        done = [p for p in entry["pairs"] if p["pair"] == pair]
        if done:
            p = done[0]
            say(
                f"[{bench.name}] pair {pair}: advisor {p['advisor_tokens_per_s']:,.0f} tok/s, "
                f"hand {p['hand_tokens_per_s']:,.0f} tok/s, ratio {p['ratio']:.3f} (CPU-time "
                f"{p['cpu_ratio']:.3f}; CPU share {p['advisor_cpu_share']:.2f}/"
                f"{p['hand_cpu_share']:.2f}), max |dloss| {p['max_abs_loss_diff']:.2e} "
                f"({p['identical_loss_steps']}/{p['loss_steps']} steps identical)"
            )


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


def runs_path(prefix: Path) -> Path:
    """PREFIX_runs.jsonl beside PREFIX.json and PREFIX.md."""
    return prefix.with_name(prefix.name + "_runs.jsonl")


def write_results(prefix: Path, results: dict[str, Any]) -> str:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    table = render_markdown(results)
    prefix.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    prefix.with_suffix(".md").write_text("# Trainer overhead\n\n" + table)
    return table


def parse_layouts(text: str) -> tuple[str, ...]:
    """``single,ddp,fsdp`` -> the layouts, in that order, without repeats."""
    layouts = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    unknown = [x for x in layouts if x not in LAYOUTS]
    if not layouts or unknown:
        raise argparse.ArgumentTypeError(
            f"layouts must be a comma-separated subset of {','.join(LAYOUTS)}, got {text!r}"
        )
    return layouts


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Smoke run: small model, 1 pair.")
    parser.add_argument("--pairs", type=int, default=None, help="Interleaved pairs (default 5).")
    parser.add_argument(
        "--layouts",
        type=parse_layouts,
        default=LAYOUTS,
        help="Comma-separated layouts to compare: single (one process), ddp, fsdp (world size "
        f"--world-size, gloo, under torchrun). Default: {','.join(LAYOUTS)}.",
    )
    parser.add_argument(
        "--world-size",
        type=int,
        default=DEFAULT_WORLD_SIZE,
        help=f"Ranks of the ddp/fsdp runs (default {DEFAULT_WORLD_SIZE}); the global batch stays.",
    )
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
        help="torch.set_num_threads (and OMP/MKL_NUM_THREADS) in every process (every rank). "
        "Default 1: on a shared 2-vCPU host a 2-thread OpenMP team stalls whenever another "
        "tenant takes a core, making runs 3-30x slower and incomparable.",
    )
    parser.add_argument(
        "--config",
        action="append",
        choices=[c.name for c in CONFIGS],
        help="Run only this config (repeatable; default all); --layouts says where.",
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
        help=f"Results prefix (writes PREFIX.json, PREFIX.md and PREFIX_runs.jsonl; default "
        f"{DEFAULT_PREFIX} for the full run, a temporary directory with --quick).",
    )
    parser.add_argument(
        "--analyze",
        type=Path,
        default=None,
        metavar="RUNS_JSONL",
        help="Run nothing: derive the results again from a runs log (its last session), print "
        "the table, and write PREFIX.json and PREFIX.md if --out is given.",
    )
    # Internal: one training run (or one rank of one) in this (fresh) process.
    parser.add_argument("--child", choices=CHILDREN, help=argparse.SUPPRESS)
    parser.add_argument("--config-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    own, rest = split_rank_args(list(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(own)
    args.rank_args = rest
    if args.child is None and args.analyze is None:
        if args.pairs is None:
            args.pairs = 1 if args.quick else 5
        if args.warmup_steps is None:
            args.warmup_steps = 2 if args.quick else 3
        if args.quick and args.steps is None:
            args.steps = 8
        if args.pairs < 1 or args.warmup_steps < 1 or (args.steps is not None and args.steps < 2):
            parser.error("--pairs and --warmup-steps must be >= 1 and --steps >= 2")
        if args.world_size < 2 and set(args.layouts) - {"single"}:
            parser.error("--world-size must be >= 2 for ddp and fsdp")
    return args


def split_rank_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """This file's own arguments, and an advisor rank's (everything after ``--``)."""
    if "--" in argv:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        _set_threads(args.threads)
        if args.child == "advisor":
            distributed = load_plan_config(args.config_file).parallelism != "single"
            run_advisor_child(
                args.config_file,
                args.steps,
                args.run_dir,
                args.advisor_quiet,
                args.threads,
                distributed,
            )
        elif args.child == "advisor-rank":
            run_advisor_rank(args.run_dir, args.rank_args)
        else:
            run_hand(args.config_file, args.steps, args.run_dir)
        return 0

    if args.analyze is not None:
        records = [json.loads(line) for line in args.analyze.read_text().splitlines() if line]
        results = analyze(records)
        table = (
            write_results(args.out, results) if args.out is not None else render_markdown(results)
        )
        print(table)
        return 0

    configs = bench_configs(args.config, args.layouts, args.world_size, args.quick)
    prefix = args.out
    if prefix is None:
        prefix = (
            Path(tempfile.mkdtemp(prefix="trainer_overhead-quick-")) / "trainer_overhead"
            if args.quick
            else DEFAULT_PREFIX
        )
    started = time.perf_counter()
    log = RunsLog(runs_path(prefix))
    log.write(
        {
            "record": "session",
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "quick": args.quick,
            "argv": list(sys.argv[1:] if argv is None else argv),
            "method": {
                "pairs": args.pairs,
                "layouts": list(args.layouts),
                "world_size": args.world_size,
                "order": "alternating per pair: (advisor, hand), (hand, advisor), ...",
                "statistic": "median over pairs of advisor/hand steady-state tokens/s",
                "steady_state": "wall time from the end of the last warm-up step to the end of "
                "the last step (end = loss.item() returned on rank 0)",
                "cpu_time": "process CPU time at the same step ends, summed over the ranks",
                "advisor_quiet": args.advisor_quiet,
                "eval_and_checkpoint": "once, after the last step, in both loops",
                "fresh_process_per_run": True,
                "distributed_launch": "advisor: its CLI's own torchrun launch; hand-written: "
                "python -m torch.distributed.run with the same arguments; gloo",
            },
            "environment": _environment(args.threads),
        }
    )
    try:
        with tempfile.TemporaryDirectory(prefix="trainer_overhead-") as tmp:
            for bench in configs:
                bench_config(bench, args, Path(tmp), log)
                write_results(prefix, analyze(log.records))  # partial until the end record
        log.write(
            {
                "record": "end",
                "total_s": time.perf_counter() - started,
                "loadavg_end": list(os.getloadavg()),
            }
        )
    finally:
        log.close()
    table = write_results(prefix, analyze(log.records))
    print(table)
    say(f"wrote {prefix.with_suffix('.json')}, {prefix.with_suffix('.md')} and {log.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
