"""What the search may turn: ``--only KNOB=V1,V2`` (advisor recommend, advisor run, the API).

The profile decides what the search *can* price; the user may allow less: a stack that runs no
chunked loss or no torch.compile, a cluster where only FSDP is used, a data loader that needs a
micro-batch of at least 4, or a benchmark whose reference grid holds fewer knobs than the
advisor knows (benchmarks/regret.py: an advised config outside the grid has no regret).
``only`` narrows each named knob to the values asked; every other knob keeps what the profile
allows. A value the profile cannot price is named in the plan's reasons beside the ones left
out; a knob with no value left is an error that says what this profile can price.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from profilers.checkpointing import parse_checkpointing
from profilers.workload import PARALLELISMS, PRECISIONS
from strategies.errors import StrategyError

__all__ = [
    "KNOB_NAMES",
    "narrow",
    "normalize_only",
    "only_args",
    "parse_only",
    "read_recorded",
    "reasons_by_value",
    "same_only",
]

T = TypeVar("T")

# The knobs ``only`` restricts: the Candidate field, then the other names a user may type
# (hyphens are read as underscores).
_ALIASES: dict[str, str] = {
    "precision": "precision",
    "activation_checkpointing": "activation_checkpointing",
    "checkpointing": "activation_checkpointing",
    "parallelism": "parallelism",
    "micro_batch_size": "micro_batch_size",
    "num_workers": "num_workers",
    "loss_chunks": "loss_chunks",
    "fsdp_reshard_after_forward": "fsdp_reshard_after_forward",
    "compile": "compile",
}
KNOB_NAMES: tuple[str, ...] = tuple(dict.fromkeys(_ALIASES.values()))

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _choice(choices: Sequence[str]) -> Callable[[str, Any], str]:
    def parse(knob: str, value: Any) -> str:
        text = str(value).strip()
        if text not in choices:
            raise StrategyError(
                f"--only {knob}={text}: unknown value; choose from {', '.join(choices)}"
            )
        return text

    return parse


def _checkpointing(knob: str, value: Any) -> str:
    text = str(value).strip()
    try:
        parsed = parse_checkpointing(text)
    except ValueError as exc:
        raise StrategyError(f"--only {knob}={text}: {exc}") from None
    return f"blocks:{parsed.blocks}" if parsed.kind == "blocks" else parsed.kind  # blocks:02


def _integer(least: int) -> Callable[[str, Any], int]:
    def parse(knob: str, value: Any) -> int:
        if isinstance(value, bool):
            raise StrategyError(f"--only {knob}={value}: a whole number is needed")
        try:
            number = int(str(value).strip())
        except ValueError:
            raise StrategyError(f"--only {knob}={value}: a whole number is needed") from None
        if number < least:
            raise StrategyError(f"--only {knob}={number}: must be at least {least}")
        return number

    return parse


def _boolean(knob: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise StrategyError(f"--only {knob}={value}: use true or false")


_PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "precision": _choice(PRECISIONS),
    "activation_checkpointing": _checkpointing,
    "parallelism": _choice(PARALLELISMS),
    "micro_batch_size": _integer(1),
    "num_workers": _integer(0),
    "loss_chunks": _integer(1),
    "fsdp_reshard_after_forward": _boolean,
    "compile": _boolean,
}


def _knob(name: str) -> str:
    knob = _ALIASES.get(str(name).strip().replace("-", "_"))
    if knob is None:
        raise StrategyError(
            f"--only {name}: not a knob the search turns; choose from "
            f"{', '.join(n.replace('_', '-') for n in _ALIASES)}"
        )
    return knob


def normalize_only(only: Mapping[str, Any] | None) -> dict[str, tuple[Any, ...]]:
    """``{knob: values}`` with each knob's canonical name (the Candidate field) and typed values
    in the order given, duplicates dropped. A value may be one item, a sequence, or a string of
    comma-separated items (``{"checkpointing": "none,full"}``). StrategyError names a bad knob or
    value."""
    return _merge((only or {}).items())


def parse_only(items: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """``--only`` arguments (``KNOB=V1,V2``, repeatable; a knob given twice keeps both lists)."""
    pairs = []
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not name.strip():
            raise StrategyError(
                f"--only {item}: write KNOB=VALUES, e.g. --only checkpointing=none,full"
            )
        if not values.strip():
            raise StrategyError(f"--only {item}: give at least one value after '='")
        pairs.append((name.strip(), values))
    return _merge(pairs)


def _merge(pairs: Iterable[tuple[str, Any]]) -> dict[str, tuple[Any, ...]]:
    """Each (name as the user wrote it, values) read and merged by canonical knob; errors quote
    the name as written."""
    out: dict[str, list[Any]] = {}
    for name, raw in pairs:
        knob = _knob(name)
        items: Iterable[Any]
        if isinstance(raw, str):
            items = [v for v in raw.split(",") if v.strip()]
        elif isinstance(raw, Iterable):
            items = list(raw)
        else:
            items = [raw]
        values = [_PARSERS[knob](name, v) for v in items]
        if not values:
            raise StrategyError(f"--only {name}=: give at least one value, e.g. {_example(knob)}")
        kept = out.setdefault(knob, [])
        kept.extend(v for v in values if v not in kept)
    return {knob: tuple(values) for knob, values in out.items()}


def read_recorded(only: Any) -> dict[str, tuple[Any, ...]] | None:
    """A plan's recorded ``only`` (plan.json's request; absent: unrestricted) read back, or
    None when it cannot be (a plan written by other code)."""
    if only is None:
        return {}
    if not isinstance(only, Mapping):
        return None
    try:
        return normalize_only(only)
    except StrategyError:
        return None


def same_only(a: Mapping[str, Sequence[Any]], b: Mapping[str, Sequence[Any]]) -> bool:
    """Whether two restrictions allow the same values (the order values were given in aside)."""
    return {k: set(v) for k, v in a.items()} == {k: set(v) for k, v in b.items()}


# How a knob is written back (``--only checkpointing=...``): the short name a user types.
_DISPLAY = {"activation_checkpointing": "checkpointing"}


def only_args(only: Mapping[str, Sequence[Any]]) -> list[str]:
    """The ``--only`` arguments that :func:`parse_only` reads back as ``only``."""
    return [
        f"{_DISPLAY.get(knob, knob.replace('_', '-'))}={','.join(_show(v) for v in values)}"
        for knob, values in only.items()
    ]


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _example(knob: str) -> str:
    return {
        "precision": "bf16",
        "activation_checkpointing": "none,full",
        "parallelism": "fsdp",
        "micro_batch_size": "4,8",
        "num_workers": "0",
        "loss_chunks": "1",
        "fsdp_reshard_after_forward": "true",
        "compile": "false",
    }[knob]


def narrow(
    knob: str,
    available: Sequence[T],
    only: Mapping[str, Sequence[Any]],
    *,
    reasons: Mapping[Any, str] | None = None,
    otherwise: str = "",
) -> tuple[tuple[T, ...], tuple[str, ...]]:
    """(the values of ``knob`` the search keeps, lines for the plan's reasons).

    Without ``knob`` in ``only``: everything available, no line. Otherwise the available values
    that were asked for, in the space's order; a line for those left out by the user and one per
    asked value the profile cannot price (``reasons[value]`` says why, else ``otherwise``).
    StrategyError when nothing asked for is available.
    """
    asked = only.get(knob)
    if asked is None:
        return tuple(available), ()
    why = reasons or {}
    kept = tuple(v for v in available if v in asked)
    flag = f"--only {only_args({knob: asked})[0]}"
    name = _DISPLAY.get(knob, knob.replace("_", "-"))
    missing = [v for v in asked if v not in available]
    unknown = otherwise or "the profile did not measure it: re-run 'advisor profile' to measure it"
    if not kept:
        shown = ", ".join(_show(v) for v in available) or "nothing"
        details = "; ".join(dict.fromkeys(why.get(v) or unknown for v in missing))
        raise StrategyError(
            f"{flag}: nothing asked for can be searched ({details}); this search can price "
            f"{name} {shown}"
        )
    lines = []
    left = [v for v in available if v not in asked]
    if left:
        lines.append(f"{name} {', '.join(_show(v) for v in left)}: left out by {flag}")
    lines.extend(
        f"{name} {_show(v)}: asked for by {flag} but {why.get(v) or unknown}" for v in missing
    )
    return kept, tuple(lines)


def reasons_by_value(lines: Sequence[str]) -> dict[str, str]:
    """The space's excluded lines keyed by the value each names first ("ops-half checkpointing
    (...): not measured ...", "bf16: the device ..."), for :func:`narrow`."""
    out: dict[str, str] = {}
    for line in lines:
        out.setdefault(line.split(" ", 1)[0].rstrip(":,"), line)
    return out
