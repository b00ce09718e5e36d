"""``advisor export``: a plan as another training stack's native config."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

# The format names, written here without importing the exporters (advisor --help stays
# instant); tests/advisor/test_export_cli.py checks they equal advisor.exporters.FORMATS.
FORMAT_CHOICES = ("hf", "accelerate", "lightning", "deepspeed", "torchtitan")


@click.command(
    "export",
    short_help="A plan in another stack's format: hf, deepspeed, torchtitan ...",
)
@click.argument("plan", metavar="RUN_OR_PLAN", type=click.Path(path_type=Path))
@click.option(
    "--to",
    "to",
    required=True,
    type=click.Choice(FORMAT_CHOICES),
    help="The stack to write for: hf (TrainingArguments JSON), accelerate (config YAML), "
    "lightning (Trainer/LightningCLI YAML), deepspeed (ds_config.json), torchtitan (TOML).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=True, file_okay=True),
    default=None,
    help="File to write, or a directory (ending in / or existing) for the stack's usual file "
    "name (default: print the file to stdout). For hf the header goes to FILE.advisor.txt, "
    "since its JSON takes no extra keys.",
)
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    default=None,
    help="Optimizer steps the lr schedule spans (default: the run's training length, else "
    "advisor train's default).",
)
def export(**params: Any) -> None:
    """Write the plan of RUN_OR_PLAN (a run directory or a plan.json) as the native config of
    another training stack, with a header: which plan, predicted and measured speed, and every
    knob that has no equivalent there. The global batch is the plan's in every format.

    A run directory that advisor tune has tuned exports RUN/tuned_plan.json (the same config,
    tuned lr, warm-up and weight decay); pass RUN/plan.json for the untuned plan."""
    from advisor.exporters import export_plan, write_export

    result = export_plan(params["plan"], params["to"], steps=params["steps"])
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
    if result.sidecar:
        click.echo(result.sidecar, err=True, nl=False)
    if params["out"] is None:
        click.echo(result.text, nl=False)
        return
    out = Path(params["out"])
    for path in write_export(result, out, into_directory=params["out"].endswith(("/", os.sep))):
        click.echo(f"wrote {path}")
    if result.launch:
        click.echo(f"launch: {result.launch}")
    if result.unmapped:
        click.echo(f"{len(result.unmapped)} knob(s) have no equivalent: see the header")
