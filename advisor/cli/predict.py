"""``advisor predict``: what would this exact config cost? JSON on stdout."""

from __future__ import annotations

import json
from typing import Any

import click

from advisor.cli.options import (
    DEFAULT_STEPS,
    check_whatif,
    config_options,
    explicit_config,
    memory_budget_option,
    pick,
    profile_path_option,
    whatif_options,
)


@click.command(short_help="What one config would cost: memory, step time, tokens/s.")
@profile_path_option
@config_options
@memory_budget_option
@whatif_options
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=None,
    help=f"Optimizer steps of the run (default {DEFAULT_STEPS}): --compile's compile time is "
    "amortised over them (amortised_step_time_s).",
)
def predict(**params: Any) -> None:
    """Predict peak memory, step time and tokens/s of one config (TrainConfig flags) from a
    profile, with the breakdown, as JSON."""
    from advisor.recommending import predict as run_predict
    from advisor.recommending import profiled_config, read_profile
    from strategies.config import compose_config

    check_whatif(params)
    profile = read_profile(params["profile_path"])
    config = compose_config(profiled_config(profile), explicit_config(params))
    result = run_predict(
        profile, config, **pick(params, "memory_budget", "target", "nodes", "network", "steps")
    )
    click.echo(json.dumps(result, indent=1))
