"""``advisor predict``: what would this exact config cost? JSON on stdout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from advisor.cli.options import budget_option, config_options, explicit_config
from advisor.cli.recommend import whatif_options


@click.command()
@click.option(
    "--profile",
    "profile_path",
    required=True,
    type=click.Path(path_type=Path),
    help="profile.json from 'advisor profile' (or its directory).",
)
@config_options
@budget_option
@whatif_options
def predict(**params: Any) -> None:
    """Predict peak memory, step time and tokens/s of one config (TrainConfig flags) from a
    profile, with the breakdown, as JSON."""
    from advisor.errors import UsageProblem
    from advisor.recommend import predict as run_predict
    from advisor.recommend import read_profile
    from strategies.config import TrainConfig, compose_config
    from strategies.errors import StrategyError

    if params["target"] is None and (params["nodes"] != 1 or params["network"]):
        raise click.UsageError("--nodes and --network plan for other hardware: add --target")
    profile = read_profile(params["profile_path"])
    workload = profile.workload
    base = TrainConfig(
        model=workload["model"],
        model_args=dict(workload.get("model_args") or {}),
        seq_len=int(workload["seq_len"]),
    )
    config = compose_config(base, explicit_config(params))
    try:
        result = run_predict(
            profile,
            config,
            memory_budget=params["memory_budget"],
            target=params["target"],
            nodes=params["nodes"],
            network=params["network"],
        )
    except StrategyError as exc:
        raise UsageProblem(str(exc)) from None
    click.echo(json.dumps(result, indent=1))
