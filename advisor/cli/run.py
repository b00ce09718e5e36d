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
    default_global_batch_option,
    default_seq_len_option,
    device_option,
    hyperparameter_options,
    hyperparameters,
    memory_budget_option,
    model_options,
    out_option,
    pick,
    probe_options,
    probing,
    quiet_option,
    resume_option,
    run_length_options,
    search_options,
    train_output_options,
    validation_options,
    workload,
)
from advisor.cli.progress import budget_progress
from advisor.cli.train import default_out
from profilers.rundir import RunDir

ProgressFn = Callable[[str, float], None]


class CliRunProgress:
    """One header and one closing line per stage; the profile's budget bar, a spinner with the
    search's latest message on a terminal (plain lines otherwise), the trainer's own bar."""

    def __init__(self, quiet: bool, stages: int = 4) -> None:
        self.quiet = quiet
        self.stages = stages
        self.train_progress = not quiet
        self.interactive = sys.stderr.isatty()

    @contextlib.contextmanager
    def stage(self, index: int, name: str, description: str) -> Iterator[ProgressFn]:
        if self.quiet:
            yield lambda _m, _f: None
            return
        click.echo(
            click.style(f"[{index}/{self.stages}] {name}: {description}", bold=True), err=True
        )
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
        color = {"done": "green", "skipped": "cyan"}.get(status, "red")
        if status == "skipped":  # no header line was drawn: name the stage here
            shown = f"{name}: skipped"
        elif detail.startswith(f"{status} ("):  # "interrupted (SIGTERM)": the word once
            signal, _, detail = detail.partition(": ")  # then where the stage stopped, if said
            shown = f"{signal} after {elapsed_s:.0f} s"
        else:
            shown = f"{status} in {elapsed_s:.0f} s"
        click.echo(
            "  " + click.style(shown, fg=color) + (f": {detail}" if detail else ""), err=True
        )

    def note(self, text: str) -> None:
        click.echo(f"note: {text}", err=True)  # also with --quiet, as the trainer's notes


@click.command("run", short_help="Profile, recommend, train and report, into one run directory.")
@model_options
@default_seq_len_option()
@default_global_batch_option()
@run_length_options
@out_option("Run directory. Default runs/run-TIMESTAMP.")
@resume_option("Continue the run in --out: reuse its profile and plan, resume training.")
@device_option("Device to profile, validate and train on.")
@probe_options
@memory_budget_option
@search_options("Most ranks to consider (default: the devices the profile saw; 1 on CPU).")
@validation_options
@hyperparameter_options
@click.option(
    "--tune-trials",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Between recommend and train, tune lr / warm-up / weight decay with this many trials "
    "of the run's length ('advisor tune'; pruned trials stop early), then train the tuned "
    "plan. 0: off.",
)
@train_output_options
@quiet_option()
def run(**params: Any) -> None:
    """Profile, recommend, train and report in one go, into one run directory. With no
    arguments: gpt-tiny on Python's own sources, three to five minutes on two CPU cores."""
    from advisor.run import RunRequest
    from advisor.run import run as run_all

    if params["steps"] is not None and params["tokens"] is not None:
        raise click.UsageError("give --steps or --tokens, not both")
    out: Path = params["out"] or default_out("run")
    if params["resume"] and params["out"] is None:
        raise click.UsageError("--resume needs --out naming the run to continue")
    request = RunRequest(
        **workload(params),
        **probing(params),
        **pick(params, "global_batch_size", "steps", "tokens", "memory_budget", "world_size"),
        **pick(params, "trials", "validate_top", "validate_rounds", "storage", "only"),
        **pick(params, "eval_every", "eval_batches", "val_data"),
        **pick(params, "checkpoint_every", "keep_checkpoints"),
        config_overrides=hyperparameters(params),
        tune_trials=params["tune_trials"],
        resume=params["resume"],
    )
    started = time.time()
    try:
        stages = 5 if params["tune_trials"] else 4
        result = run_all(request, out, CliRunProgress(params["quiet"], stages))
    except BaseException:
        report = RunDir(out).report
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
    tune = next((s for s in result.stages if s.name == "tune"), None)
    if tune is not None and tune.status == "done":
        click.echo(f"tuned: {tune.detail}; plan in {RunDir(result.out).tuned_plan}")
    train = next((s for s in result.stages if s.name == "train"), None)
    if train is not None:
        click.echo(f"trained: {train.detail}; metrics in {RunDir(result.out).train.metrics}")
    if result.report is not None:
        click.echo(f"report: {result.report}")
