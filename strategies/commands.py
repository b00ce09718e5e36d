"""``advisor`` command lines: the one place that writes options as arguments.

``advisor run`` records its own command (run.json), the trainer re-runs itself per rank through
torchrun, validation trains candidates in a child, ``advisor run`` trains its plan in a child,
and the report prints commands that reproduce a run. They all build their argument lists here,
so a value is written the same way everywhere and reads back as the same value.

Flag names mirror the option's key (``micro_batch_size`` -> ``--micro-batch-size``, DESIGN.md);
the few that do not (``--model-arg``, ``--no-comm``) have helpers below.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PROGRAM = "advisor"


def flag(key: str) -> str:
    """``--micro-batch-size`` for ``micro_batch_size``."""
    return "--" + key.replace("_", "-")


def cli_value(value: Any) -> str:
    """A value as the command line writes it and parses it back unchanged: floats in their
    shortest ``%g`` form when that is exact (``120``, ``0.001``, ``1e-05``), else ``repr``."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return str(value)


def model_arg(key: str, value: Any) -> str:
    """``KEY=VALUE`` for ``--model-arg``. The CLI (advisor.models.parse_model_args) reads a
    value as a JSON literal, else true/false/none, else the text itself: a string is written
    bare when it reads back as itself (``hf:gpt2``), JSON-quoted when it would not (``"12"``);
    everything else as JSON."""
    if isinstance(value, str) and _reads_back_as_text(value):
        return f"{key}={value}"
    return f"{key}={json.dumps(value)}"


def _reads_back_as_text(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return text.strip().lower() not in ("true", "false", "none")
    return False


class Command:
    """An ``advisor`` command line, built option by option.

    ``option(key, value, default=...)`` leaves the option out when the value is None or equals
    the default: recorded commands then show what was asked, not every default.
    """

    _MISSING: Any = object()

    def __init__(self, *words: str) -> None:
        self.words: list[str] = list(words)

    def option(self, key: str, value: Any, *, default: Any = _MISSING) -> Command:
        if value is None or (default is not Command._MISSING and value == default):
            return self
        if isinstance(value, bool):  # a --key/--no-key flag pair
            self.words.append(flag(key) if value else "--no-" + flag(key)[2:])
            return self
        self.words += [flag(key), cli_value(value)]
        return self

    def options(self, values: Mapping[str, Any], keys: Iterable[str] | None = None) -> Command:
        """``--key value`` for each of ``keys`` (default: every key) that ``values`` holds."""
        for key in values if keys is None else keys:
            if key in values:
                self.option(key, values[key])
        return self

    def repeated(self, key: str, values: Sequence[Any]) -> Command:
        """The flag once per value (``--precision bf16 --precision fp32``)."""
        for value in values:
            self.option(key, value)
        return self

    def switch(self, key: str, on: bool) -> Command:
        """A bare flag (``--resume``) when ``on``."""
        if on:
            self.words.append(flag(key))
        return self

    def model(self, model: Any, model_args: Mapping[str, Any] | None = None) -> Command:
        self.words += ["--model", str(model)]
        for key, value in (model_args or {}).items():
            self.words += ["--model-arg", model_arg(key, value)]
        return self

    def args(self) -> list[str]:
        """The arguments after the program name (for ``python -m advisor`` or torchrun)."""
        return list(self.words)

    def argv(self) -> list[str]:
        """``advisor`` and the arguments."""
        return [PROGRAM, *self.words]

    def shell(self) -> str:
        """The command line, quoted for a POSIX shell."""
        return shlex.join(self.argv())


def command(name: str) -> Command:
    """A new ``advisor NAME ...`` command line."""
    return Command(name)


def torchrun_args(
    nproc_per_node: int,
    *,
    nnodes: int = 1,
    node_rank: int | str | None = 0,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "advisor",
) -> list[str]:
    """torchrun's own options (what goes between ``torchrun`` and ``-m advisor``): standalone
    on one node, else a c10d rendezvous at ``rdzv_endpoint`` (node 0's HOST:PORT).
    ``node_rank`` None leaves ``--node-rank`` out: c10d numbers the nodes itself and torchrun
    ignores the flag there (with a warning), so a line for every node need not carry it."""
    if rdzv_endpoint is None:
        return ["--standalone", f"--nproc-per-node={nproc_per_node}"]
    return [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        f"--rdzv-id={rdzv_id}",
        *([] if node_rank is None else [f"--node-rank={node_rank}"]),
    ]


def torchrun_command(launcher_args: Sequence[str], advisor_args: Sequence[str]) -> str:
    """``torchrun LAUNCHER_ARGS -m advisor ADVISOR_ARGS``, quoted for a POSIX shell."""
    return shlex.join(["torchrun", *launcher_args, "-m", PROGRAM, *advisor_args])
