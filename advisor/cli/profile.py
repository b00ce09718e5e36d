"""``advisor profile``: short probes of a model on the real device → profile.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from advisor.cli.options import POSITIVE, PRECISIONS, model_options
from advisor.cli.progress import budget_progress
from advisor.cli.train import default_out


@click.command()
@model_options
@click.option(
    "--seq-len",
    type=POSITIVE,
    default=128,
    show_default=True,
    help="Tokens per sequence to profile at (the plan keeps it).",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="Device to probe.",
)
@click.option(
    "--budget-s",
    type=click.FloatRange(min=0, min_open=True),
    default=120.0,
    show_default=True,
    help="Time budget for all probes, in seconds.",
)
@click.option(
    "--precision",
    "precisions",
    type=click.Choice(PRECISIONS),
    multiple=True,
    help="Profile only these precisions (repeatable; default: all the device runs).",
)
@click.option("--no-comm", is_flag=True, help="Skip the communication probe.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Directory for profile.json and probes.csv. Default runs/profile-TIMESTAMP.",
)
@click.option("--quiet", is_flag=True, help="No progress display.")
def profile(**params: Any) -> None:
    """Measure memory, step time, communication and input speed of a model with short probes;
    writes profile.json and probes.csv."""
    from advisor.models import parse_model_args
    from advisor.profiling import ProfileRequest
    from advisor.profiling import profile as run

    request = ProfileRequest(
        model=params["model"] or "gpt-tiny",
        model_args=parse_model_args(params["model_arg"]),
        data=params["data"] or "stdlib",
        tokenizer=params["tokenizer"],
        seq_len=params["seq_len"],
        device=params["device"],
        budget_s=params["budget_s"],
        precisions=tuple(params["precisions"]) or None,
        comm=not params["no_comm"],
    )
    out = params["out"] or default_out("profile")
    with budget_progress("profile", enabled=not params["quiet"]) as progress:
        result = run(request, out, progress)
    summarize(result, out)


def summarize(result: Any, out: Path) -> None:
    statuses: dict[str, int] = {}
    for row in result.probes:
        statuses[row.status] = statuses.get(row.status, 0) + 1
    counts = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    click.echo(
        f"profiled {result.model.name} on {result.device.name} in {result.elapsed_s:.0f}s "
        f"({counts}); wrote {out / 'profile.json'} and {out / 'probes.csv'}"
    )
