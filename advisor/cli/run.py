"""``advisor run``: profile → recommend → train → report into one run directory."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from advisor.cli.options import (
    NON_NEGATIVE,
    POSITIVE,
    PRECISIONS,
    budget_option,
    model_options,
    validation_options,
)
from advisor.cli.progress import budget_progress
from advisor.cli.train import default_out
from advisor.run import DEFAULT_BUDGET_S, DEFAULT_GLOBAL_BATCH_SIZE, DEFAULT_STEPS

ProgressFn = Callable[[str, float], None]


class CliRunProgress:
    """One header and one closing line per stage; the profile's budget bar, a spinner with the
    search's latest message on a terminal (plain lines otherwise), the trainer's own bar."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.train_progress = not quiet
        self.interactive = sys.stderr.isatty()

    @contextlib.contextmanager
    def stage(self, index: int, name: str, description: str) -> Iterator[ProgressFn]:
        if self.quiet:
            yield lambda _m, _f: None
            return
        click.echo(click.style(f"[{index}/4] {name}: {description}", bold=True), err=True)
        if name == "profile":
            with budget_progress("profile") as update:
                yield update or (lambda _m, _f: None)
        elif name in ("recommend", "report") and self.interactive:
            from rich.console import Console

            with Console(file=sys.stderr).status(name) as status:
                yield lambda message, _f: status.update(f"{name}: {message}")
        else:
            yield lambda message, _f: click.echo(f"  {message}", err=True)

    def finished(self, name: str, status: str, detail: str, elapsed_s: float) -> None:
        if self.quiet:
            return
        took = f" in {elapsed_s:.0f} s" if status != "skipped" else ""
        color = {"done": "green", "skipped": "cyan"}.get(status, "red")
        click.echo(
            "  " + click.style(f"{status}{took}", fg=color) + (f": {detail}" if detail else ""),
            err=True,
        )


@click.command("run")
@model_options
@click.option(
    "--seq-len", type=POSITIVE, default=128, show_default=True, help="Tokens per sequence."
)
@click.option(
    "--global-batch-size",
    type=POSITIVE,
    default=DEFAULT_GLOBAL_BATCH_SIZE,
    show_default=True,
    help="Sequences per optimizer step, held fixed by the search.",
)
@click.option(
    "--steps",
    type=POSITIVE,
    default=None,
    help=f"Optimizer steps to train (default {DEFAULT_STEPS} unless --tokens).",
)
@click.option("--tokens", type=POSITIVE, default=None, help="Train for this many tokens instead.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Run directory. Default runs/run-TIMESTAMP.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the run in --out: reuse its profile and plan, resume training.",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="Device to profile, validate and train on.",
)
@click.option(
    "--budget-s",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_BUDGET_S,
    show_default=True,
    help="Time budget of the profile's probes, in seconds.",
)
@click.option(
    "--precision",
    "precisions",
    type=click.Choice(PRECISIONS),
    multiple=True,
    help="Consider only these precisions (repeatable; default: all the device runs).",
)
@click.option("--no-comm", is_flag=True, help="Skip the communication probe.")
@budget_option
@click.option(
    "--world-size",
    type=POSITIVE,
    default=None,
    help="Most ranks to consider (default: the devices the profile saw; 1 on CPU).",
)
@click.option(
    "--trials", type=POSITIVE, default=None, help="Trial budget of a sampled search (default 128)."
)
@validation_options
@click.option(
    "--storage", default=None, help="Optuna storage URL (default sqlite:///OUT/study.db)."
)
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), help="Peak learning rate.")
@click.option("--min-lr", type=click.FloatRange(min=0), help="Floor of the cosine decay.")
@click.option("--warmup-steps", type=NON_NEGATIVE, help="Linear warm-up steps.")
@click.option("--weight-decay", type=click.FloatRange(min=0), help="AdamW weight decay.")
@click.option("--grad-clip", type=click.FloatRange(min=0), help="Max grad norm; 0 disables.")
@click.option("--seed", type=int, help="Seed for weights and data order.")
@click.option(
    "--eval-every",
    type=NON_NEGATIVE,
    default=None,
    help="Eval loss every N steps (default: about 10 per run; 0: only at the end).",
)
@click.option(
    "--eval-batches",
    type=POSITIVE,
    default=4,
    show_default=True,
    help="Validation batches per eval.",
)
@click.option(
    "--checkpoint-every", type=POSITIVE, default=None, help="Save a checkpoint every N steps."
)
@click.option(
    "--keep-checkpoints", type=POSITIVE, default=2, show_default=True, help="Checkpoints kept."
)
@click.option("--quiet", is_flag=True, help="No progress display.")
def run(**params: Any) -> None:
    """Profile, recommend, train and report in one go, into one run directory. With no
    arguments: gpt-tiny on Python's own sources, about ten minutes on two CPU cores."""
    from advisor.models import parse_model_args
    from advisor.run import CONFIG_OVERRIDE_KEYS, RunRequest
    from advisor.run import run as run_all

    if params["steps"] is not None and params["tokens"] is not None:
        raise click.UsageError("give --steps or --tokens, not both")
    out: Path = params["out"] or default_out("run")
    if params["resume"] and params["out"] is None:
        raise click.UsageError("--resume needs --out naming the run to continue")
    request = RunRequest(
        model=params["model"] or "gpt-tiny",
        model_args=parse_model_args(params["model_arg"]),
        data=params["data"] or "stdlib",
        tokenizer=params["tokenizer"],
        seq_len=params["seq_len"],
        global_batch_size=params["global_batch_size"],
        steps=params["steps"],
        tokens=params["tokens"],
        device=params["device"],
        budget_s=params["budget_s"],
        precisions=tuple(params["precisions"]) or None,
        comm=not params["no_comm"],
        memory_budget=params["memory_budget"],
        world_size=params["world_size"],
        trials=params["trials"],
        validate_top=params["validate_top"],
        validate_rounds=params["validate_rounds"],
        storage=params["storage"],
        config_overrides={k: params[k] for k in CONFIG_OVERRIDE_KEYS if params.get(k) is not None},
        eval_every=params["eval_every"],
        eval_batches=params["eval_batches"],
        checkpoint_every=params["checkpoint_every"],
        keep_checkpoints=params["keep_checkpoints"],
        resume=params["resume"],
    )
    started = time.time()
    try:
        result = run_all(request, out, CliRunProgress(params["quiet"]))
    except BaseException:
        report = out / "report.html"
        if report.is_file() and report.stat().st_mtime >= started:
            click.echo(f"the report of the partial run: {report}", err=True)
        raise
    summarize(result)


def summarize(result: Any) -> None:
    plan = result.plan
    if plan is not None:
        line = f"recommended: {plan.candidate.label()}"
        baseline = plan.baseline
        if baseline is not None and baseline.measured_speedup is not None:
            line += f" ({baseline.measured_speedup:.2f}× the naive fp32 loop, measured)"
        elif baseline is not None and baseline.expected_speedup:
            line += f" ({baseline.expected_speedup:.2f}× the naive fp32 loop, predicted)"
        click.echo(line)
    train = next((s for s in result.stages if s.name == "train"), None)
    if train is not None:
        click.echo(f"trained: {train.detail}; metrics in {result.out / 'train' / 'metrics.jsonl'}")
    if result.report is not None:
        click.echo(f"report: {result.report}")
