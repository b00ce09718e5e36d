"""Take the advice home: a plan written as the native config of another training stack.

:func:`export_plan` turns a plan (the record, a plan.json or a run directory) into an
:class:`Export` for one of :data:`FORMATS`: the settings, the file text with a header saying
which plan it came from, what was predicted and measured, and every knob that has no
equivalent in that stack (never dropped silently), and the launch line. :func:`read_back`
parses an export's text the way the stack would and returns the layout-defining knobs, so a
round trip can check that the global batch, precision, checkpointing and layout survived.

Exporting needs none of the stacks installed (the files are written here); reading YAML back
needs PyYAML, and checking the files against the stacks' own parsers needs the ``export`` extra.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from advisor.errors import UsageProblem
from advisor.exporters import accelerate, deepspeed, hf, lightning, torchtitan
from advisor.exporters.record import Export
from advisor.exporters.source import load_plan, make_source
from strategies.plan_records import Plan

FORMATS: tuple[str, ...] = ("hf", "accelerate", "lightning", "deepspeed", "torchtitan")
_MODULES = {
    "hf": hf,
    "accelerate": accelerate,
    "lightning": lightning,
    "deepspeed": deepspeed,
    "torchtitan": torchtitan,
}
# What read_back returns, for every format (None: the format cannot hold it).
READ_BACK_KEYS: tuple[str, ...] = (
    "global_batch_size",
    "precision",
    "activation_checkpointing",
    "parallelism",
    "world_size",
)

__all__ = [
    "FORMATS",
    "READ_BACK_KEYS",
    "Export",
    "export_plan",
    "load_plan",
    "read_back",
    "write_export",
]


def _module(fmt: str) -> Any:
    try:
        return _MODULES[fmt]
    except (KeyError, TypeError):
        raise UsageProblem(
            f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}"
        ) from None


def export_plan(plan: Plan | str | Path, to: str, *, steps: int | None = None) -> Export:
    """``plan`` (a Plan, a plan.json or a run directory) as ``to``'s native config.

    A run directory exports its tuned plan (``RUN/tuned_plan.json``, written by advisor tune)
    when it has one tuned at ``RUN/plan.json``'s config, else ``RUN/plan.json``; the export's
    ``notes`` (and header) say which.

    ``steps``: the optimizer steps the lr schedule spans (default: the run's own training
    length when ``plan`` is a run directory that trained this plan, else advisor train's
    default), stated in the header.
    """
    module = _module(to)
    source = make_source(plan, steps=steps)
    export: Export = module.build(source)
    return dataclasses.replace(export, notes=source.notes)


def read_back(fmt: str, text: str, *, launch: str | None = None) -> dict[str, Any]:
    """The global batch, precision, activation checkpointing, parallelism and world size that
    the stack reads from an export's ``text`` (plus its ``launch`` line for ``hf``, whose
    world size is torchrun's). A value the format cannot hold is None."""
    module = _module(fmt)
    try:
        values: dict[str, Any] = module.read_back(text, launch)
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageProblem(
            f"this is not a {fmt} export advisor can read ({' '.join(str(exc).split())}): "
            f"write it with 'advisor export --to {fmt}'"
        ) from None
    return values


def write_export(result: Export, out: Path, *, into_directory: bool = False) -> list[Path]:
    """Write an export's file to ``out`` (a directory, existing or ``into_directory``:
    ``out/result.filename``) and, when its file cannot hold the header (hf's JSON), the header
    beside it as ``FILE.advisor.txt``; atomically. The paths written."""
    from profilers.rundir import write_atomically

    if into_directory or out.is_dir():
        out = out / result.filename
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(out, result.text)
    written = [out]
    if result.sidecar:
        note = out.with_name(out.name + ".advisor.txt")
        write_atomically(note, result.sidecar)
        written.append(note)
    return written
