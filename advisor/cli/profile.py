"""``advisor profile``: short probes of a model on the real device → profile.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from advisor.cli.options import (
    default_seq_len_option,
    device_option,
    model_options,
    out_option,
    probe_options,
    quiet_option,
)
from advisor.cli.progress import budget_progress
from advisor.cli.train import default_out
from profilers.rundir import RunDir
from strategies.config import DEFAULT_DATA, DEFAULT_MODEL


@click.command()
@model_options
@default_seq_len_option()
@device_option("Device to probe.")
@probe_options
@out_option("Directory for profile.json and probes.csv. Default runs/profile-TIMESTAMP.")
@quiet_option()
def profile(**params: Any) -> None:
    """Measure memory, step time, communication and input speed of a model with short probes;
    writes profile.json and probes.csv."""
    from advisor.models import parse_model_args
    from advisor.profiling import ProfileRequest
    from advisor.profiling import profile as run

    request = ProfileRequest(
        model=params["model"] or DEFAULT_MODEL,
        model_args=parse_model_args(params["model_arg"]),
        data=params["data"] or DEFAULT_DATA,
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
        f"({counts}); wrote {RunDir(out).profile} and {RunDir(out).probes}"
    )
