"""``advisor report``: (re)render RUN/report.html from the run files alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


@click.command("report", short_help="One self-contained HTML page about a run directory.")
@click.argument("run_dir", metavar="RUN", type=click.Path(path_type=Path))
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Where to write the page (default RUN/report.html).",
)
def report(**params: Any) -> None:
    """Render one self-contained HTML page about a run directory: the recommendation and why,
    device and model facts, memory, candidates, predicted vs measured, communication, training
    curves and the commands to reproduce it. Works on partial runs (profile only, no training)."""
    from advisor.errors import UsageProblem
    from reports import ReportError, write_report

    try:
        path = write_report(params["run_dir"], params["out"])
    except ReportError as exc:
        raise UsageProblem(str(exc)) from None
    click.echo(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
