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
    probing,
    quiet_option,
    workload,
)
from advisor.cli.progress import budget_progress
from advisor.cli.train import default_out
from profilers.rundir import RunDir


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
    from advisor.profiling import ProfileRequest
    from advisor.profiling import profile as run

    request = ProfileRequest(**workload(params), **probing(params))
    out = params["out"] or default_out("profile")
    with budget_progress("profile", enabled=not params["quiet"]) as progress:
        result = run(request, out, progress)
    summarize(result, out)


def summarize(result: Any, out: Path) -> None:
    statuses: dict[str, int] = {}
    for row in result.probes:
        statuses[row.status] = statuses.get(row.status, 0) + 1
    counts = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items()))
    from reports.fmt import model_label

    workload = result.workload or {}
    built = model_label(
        workload.get("model") or result.model.name,
        workload.get("model_args"),
        result.model.num_params,
    )
    click.echo(
        f"profiled {built} on {result.device.name} in {result.elapsed_s:.0f}s "
        f"({counts}); wrote {RunDir(out).profile} and {RunDir(out).probes}"
    )
