"""``advisor train``: run a plan (or explicit flags) end to end."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from advisor.cli.options import (
    POSITIVE,
    config_options,
    device_option,
    explicit_config,
    model_options,
    out_option,
    quiet_option,
    resume_option,
    run_length_options,
    run_options,
    train_output_options,
)
from advisor.launch import LaunchSpec, launched_rank, under_torchrun
from advisor.training import default_out as default_out
from advisor.training import needs_launch, resolve_train_config, whatif_plan
from advisor.training import train as run_training
from profilers import rundir

# Set by advisor.train (the Python API) for the ranks it launches: the file where rank 0
# appends its notes and its result as JSON lines, which the caller reads to report as a
# single-process run does (through its on_note, and its return value). Its ranks' stdout then
# goes to rundir.RANKS_STDOUT in the run directory: a library call prints nothing of its own.
API_REPORT_ENV = "ADVISOR_API_REPORT"


def _api_report() -> Path | None:
    """The report file of a rank that advisor.train launched, else None (the CLI's ranks
    report on their own stdout and stderr)."""
    value = os.environ.get(API_REPORT_ENV)
    return Path(value) if value and launched_rank() else None


def _report(path: Path, record: dict[str, Any]) -> None:
    """Append one record (one write of one line: ranks and the reader share the file)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def _stdout_to(path: Path) -> None:
    """This process's stdout (fd 1, its children's too) appended to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
    finally:
        os.close(fd)


@click.command(short_help="Train a plan or explicit flags, here or through torchrun.")
@click.option(
    "--plan",
    type=click.Path(),
    default=None,
    help="plan.json from 'advisor recommend', tuned_plan.json from 'advisor tune', or a run "
    "directory (its plan.json; one holding tuned_plan.json asks which to train); flags given "
    "too override it, a new --micro-batch-size or --world-size keeping its global batch.",
)
@model_options
@config_options
@run_length_options
@out_option("Run directory (metrics.jsonl, checkpoints/). Default runs/train-TIMESTAMP.")
@resume_option("Continue the run in --out from its last checkpoint.")
@train_output_options
@device_option("Where to train.")
@click.option(
    "--nnodes",
    type=POSITIVE,
    default=1,
    show_default=True,
    help="Nodes of a multi-node job (torchrun --nnodes).",
)
@click.option(
    "--node-rank",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="This node's index in a multi-node job (torchrun --node-rank).",
)
@click.option(
    "--rdzv-endpoint",
    default=None,
    metavar="HOST:PORT",
    help="Rendezvous address (node 0) of a multi-node job (torchrun --rdzv-endpoint).",
)
@quiet_option("No progress display (notes, 'note: ...', and errors still print).")
def train(**params: Any) -> None:
    """Train a model with a plan or explicit TrainConfig flags, on one device or (ddp, fsdp)
    through torchrun; writes metrics.jsonl, checkpoints/ and train_config.json under --out."""
    # numpy before torch: torch's C module imports numpy and swallows any exception that
    # import raises, so a Ctrl-C in that ~50 ms (about 1 s after the command started) was
    # lost and the run trained on as if never interrupted (rc 0).
    import numpy  # noqa: F401

    out = params["out"]
    if params["resume"] and out is None:
        raise click.UsageError("--resume needs --out naming the run to continue")
    config = resolve_train_config(params["plan"], out, params["resume"], explicit_config(params))
    options = run_options(params, out or default_out("train"), resume=params["resume"])
    report = _api_report()
    if report is not None:
        _stdout_to(options.out / rundir.RANKS_STDOUT)
        options = dataclasses.replace(options, on_note=lambda text: _report(report, {"note": text}))
    spec = None
    if needs_launch(config):
        spec = LaunchSpec(
            world_size=config.world_size,
            nnodes=params["nnodes"],
            node_rank=params["node_rank"],
            rdzv_endpoint=params["rdzv_endpoint"],
        )
    planned_for = None if params["resume"] else whatif_plan(params["plan"])
    if planned_for and not under_torchrun():
        click.echo(
            f"note: {params['plan']} is a what-if plan for {planned_for}: its speed and memory "
            "were predicted there, not here; this trains its layout on this host",
            err=True,
        )
    result = run_training(
        config,
        options,
        launch=spec,
        say=lambda m: click.echo(m, err=True),
        planned_for=planned_for,
    )
    if result is None:
        return  # the ranks trained (torchrun); rank 0 reported for the job
    if os.environ.get("RANK", "0") != "0":
        return  # rank 0 reports for the job
    if report is not None:
        _report(
            report, {"result": {"already_complete": bool(result.extra.get("already_complete"))}}
        )
    if result.extra.get("already_complete"):
        click.echo(
            f"{options.out} already finished {result.steps} steps; nothing to do "
            "(raise --steps to train further)"
        )
        return
    eval_text = f", eval loss {result.eval_loss:.4f}" if result.eval_loss is not None else ""
    click.echo(
        f"trained {result.steps} steps ({result.tokens:,} tokens): loss {result.final_loss:.4f}"
        f"{eval_text}; metrics in {result.metrics_path}, checkpoint {result.checkpoint}"
    )
