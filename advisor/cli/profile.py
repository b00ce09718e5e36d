"""``advisor profile``: short probes of a model on the real device → profile.json."""

from __future__ import annotations

import time
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
from profilers.defaults import TRACE_TARGETS
from profilers.rundir import RunDir


@click.command(short_help="Probe a model on this device: profile.json, probes.csv.")
@model_options
@default_seq_len_option()
@device_option("Device to probe.")
@probe_options
@click.option(
    "--trace-for",
    type=click.Choice(TRACE_TARGETS),
    default=None,
    help="The device the memory traces are for. Default: the probed device. 'cuda' on a CPU "
    "traces as a CUDA GPU holds memory (512-byte blocks, CUDA autocast's fp32 norms and "
    "softmax): a profile for a what-if (recommend/predict --target).",
)
@out_option("Directory for profile.json and probes.csv. Default runs/profile-TIMESTAMP.")
@quiet_option()
def profile(**params: Any) -> None:
    """Measure memory, step time, communication and input speed of a model with short probes;
    writes profile.json and probes.csv."""
    # The budget counts from here: parsing --model-arg imports torch (seconds on a busy host),
    # which the budget's clock did not see (--budget-s 10 ended 7 s later than its own count).
    started = time.perf_counter()
    from advisor.profiling import ProfileRequest, over_budget
    from advisor.profiling import profile as run

    request = ProfileRequest(
        **workload(params), **probing(params), trace_for=params["trace_for"], started_at=started
    )
    out = params["out"] or default_out("profile")
    with budget_progress("profile", enabled=not params["quiet"]) as progress:
        result = run(request, out, progress)
    summarize(result, out)
    overrun = over_budget(time.perf_counter() - started, request.budget_s)
    if overrun is not None:
        click.echo(overrun, err=True)


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
    stale = stale_plan(out, result.created)
    if stale is not None:
        click.echo(stale, err=True)
    busy = busy_while_timing(result.throughput)
    if busy is not None:
        click.echo(
            f"warning: other processes took up to {busy:.0%} of this host's CPU time while the "
            "profile timed steps: its step times read slow; re-profile when the host is quiet",
            err=True,
        )


def stale_plan(out: Path, created: str) -> str | None:
    """A warning when ``out`` holds a plan made from another profile than the one just written
    there (a re-profile into a finished run replaced the profile the plan was searched on;
    the report pairs them and flags it, but nothing said so here)."""
    import json

    from reports.runfiles import made_from_another_profile

    try:
        plan = json.loads(RunDir(out).plan.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(plan, dict) or made_from_another_profile(plan, created) is None:
        return None
    return (
        f"warning: {RunDir(out).plan} was made from the profile this one replaced: run "
        f"'advisor recommend --profile {RunDir(out).profile} --global-batch-size N --out {out}' "
        "again for a plan of this profile (or profile into another --out)"
    )


def busy_while_timing(timings: Any) -> float | None:
    """The largest share of the host others took while the profile timed steps, when it
    reaches BUSY_HOST_SHARE; else None."""
    from profilers.throughput import largest_host_share
    from strategies.budgets import BUSY_HOST_SHARE

    worst = largest_host_share(timings)
    return worst if worst is not None and worst >= BUSY_HOST_SHARE else None
