"""``advisor train``: run a plan (or explicit flags) end to end."""

from __future__ import annotations

import json
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
    default=10,
    show_default=True,
    help="Validation micro-batches per eval.",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="Where to train.",
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
    result = run_training(config, options)
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
