"""``advisor train``: run a plan (or explicit flags) end to end."""

from __future__ import annotations

import json
import os
import time
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
from advisor.launch import under_torchrun
from profilers.rundir import TrainDir


def default_out(prefix: str) -> Path:
    return Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"


def resolve_train_config(
    plan: str | None, out: Path | None, resume: bool, params: dict[str, Any]
) -> Any:
    """Plan file, else the resumed run's saved config, else defaults; then explicit flags."""
    from strategies.config import ConfigError, TrainConfig, compose_config, load_plan_config

    base = TrainConfig()
    if plan is not None:
        base = load_plan_config(plan)
    elif resume and out is not None and TrainDir(out).train_config.is_file():
        saved_path = TrainDir(out).train_config
        try:
            saved = json.loads(saved_path.read_text())
            base = TrainConfig.from_dict(saved["config"])
        except (KeyError, json.JSONDecodeError) as exc:
            raise ConfigError(
                f"{saved_path} is damaged ({exc}): pass the flags of the original run explicitly"
            ) from None
    return compose_config(base, explicit_config(params))


@click.command()
@click.option(
    "--plan",
    type=click.Path(),
    default=None,
    help="plan.json from 'advisor recommend'; flags given too override it.",
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
@quiet_option()
def train(**params: Any) -> None:
    """Train a model with a plan or explicit TrainConfig flags; writes metrics.jsonl and
    checkpoints under --out."""
    from advisor.trainer.loop import train as run_training

    out = params["out"]
    if params["resume"] and out is None:
        raise click.UsageError("--resume needs --out naming the run to continue")
    config = resolve_train_config(params["plan"], out, params["resume"], params)
    options = run_options(params, out or default_out("train"), resume=params["resume"])
    # DDP/FSDP need a process group even on one rank: torchrun provides it.
    if (config.world_size > 1 or config.parallelism != "single") and not under_torchrun():
        launch_ranks(config, options, params)
        return
    result = run_training(config, options)
    if os.environ.get("RANK", "0") != "0":
        return  # rank 0 reports for the job
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


def launch_ranks(config: Any, options: Any, params: dict[str, Any]) -> None:
    """Re-run this command once per rank through torchrun, with the resolved config as a plan."""
    from advisor.launch import LaunchSpec, launch, node_commands

    spec = LaunchSpec(
        world_size=config.world_size,
        nnodes=params["nnodes"],
        node_rank=params["node_rank"],
        rdzv_endpoint=params["rdzv_endpoint"],
    )
    options.out.mkdir(parents=True, exist_ok=True)
    plan = TrainDir(options.out).launch_config
    plan.write_text(json.dumps({"config": config.to_dict()}, indent=2) + "\n")
    args = options.train_args(plan)
    if spec.nnodes > 1:
        click.echo("run on every node (with --out on a shared filesystem):", err=True)
        for command in node_commands(spec, args):
            click.echo(f"  {command}", err=True)
    launch(spec, args)
