"""The Export record: one plan written in one stack's native format."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Export:
    """``settings``: the native settings (keyword arguments or the config mapping); ``text``: the
    file content, with the header where the format can hold one; ``filename``: the suggested file
    name; ``unmapped``: the plan's knobs that have no equivalent in the stack, one line each,
    each starting with the TrainConfig key it is about; ``launch``: the launch command line.
    ``sidecar``: the header as plain text when the file cannot hold it (JSON that the stack's
    own parser rejects extra keys in): written next to the file as ``FILE.advisor.txt``.
    ``notes``: which plan file of a run directory was exported and why (its tuned plan or not),
    also in the header; the command prints them on stderr."""

    format: str
    settings: dict[str, Any]
    text: str
    filename: str
    unmapped: tuple[str, ...]
    launch: str | None
    sidecar: str | None = None
    notes: tuple[str, ...] = ()
