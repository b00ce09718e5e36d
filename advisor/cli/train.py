"""``advisor train``: run a plan (or explicit flags) end to end."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click

from advisor.cli.options import (
    NON_NEGATIVE,
    POSITIVE,
    config_options,
    explicit_config,
    model_options,
)
from advisor.launch import under_torchrun

DEFAULT_STEPS = 300


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
    elif resume and out is not None and (out / "train_config.json").is_file():
        try:
            saved = json.loads((out / "train_config.json").read_text())
            base = TrainConfig.from_dict(saved["config"])
        except (KeyError, json.JSONDecodeError) as exc:
            raise ConfigError(
                f"{out}/train_config.json is damaged ({exc}): pass the flags "
                "of the original run explicitly"
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
@click.option(
    "--steps",
    type=POSITIVE,
    default=None,
    help=f"Optimizer steps to run (default {DEFAULT_STEPS} unless --tokens).",
)
@click.option("--tokens", type=POSITIVE, default=None, help="Train for this many tokens instead.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Run directory (metrics.jsonl, checkpoints/). Default runs/train-TIMESTAMP.",
)
@click.option("--resume", is_flag=True, help="Continue the run in --out from its last checkpoint.")
@click.option(
    "--checkpoint-every",
    type=POSITIVE,
    default=None,
    help="Save a checkpoint every N steps (default: about 4 per run, and at the end).",
)
@click.option(
    "--keep-checkpoints",
    type=POSITIVE,
    default=2,
    show_default=True,
    help="How many recent checkpoints to keep.",
)
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
    help="Validation global batches per eval (the same samples for any micro/accum/rank split).",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="Where to train.",
)
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
@click.option("--quiet", is_flag=True, help="No progress display.")
def train(**params: Any) -> None:
    """Train a model with a plan or explicit TrainConfig flags; writes metrics.jsonl and
    checkpoints under --out."""
    from advisor.trainer.loop import RunOptions
    from advisor.trainer.loop import train as run_training

    out = params["out"]
    if params["resume"] and out is None:
        raise click.UsageError("--resume needs --out naming the run to continue")
    config = resolve_train_config(params["plan"], out, params["resume"], params)
    steps = params["steps"]
    if steps is None and params["tokens"] is None:
        steps = DEFAULT_STEPS
    options = RunOptions(
        out=out or default_out("train"),
        steps=steps,
        tokens=params["tokens"],
        resume=params["resume"],
        checkpoint_every=params["checkpoint_every"],
        eval_every=params["eval_every"],
        eval_batches=params["eval_batches"],
        keep_checkpoints=params["keep_checkpoints"],
        device=params["device"],
        progress=not params["quiet"],
    )
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
    plan = options.out / "launch_config.json"
    plan.write_text(json.dumps({"config": config.to_dict()}, indent=2) + "\n")
    args = options.train_args(plan)
    if spec.nnodes > 1:
        click.echo("run on every node (with --out on a shared filesystem):", err=True)
        for command in node_commands(spec, args):
            click.echo(f"  {command}", err=True)
    launch(spec, args)
