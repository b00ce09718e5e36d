"""The metrics.jsonl record: what the trainer writes per optimizer step and per evaluation.

One owner for the line format that the trainer writes (advisor.trainer.loop), and that
validation (advisor.validation.LauncherValidator), ``advisor run``'s summary and the report
(reports.training) read. Records are typed; :func:`parse_record` reads a line written by any
version tolerantly (a missing or non-finite number is None), because the report must render
partial and hand-made runs too. Key names and order are the file format (DESIGN.md): keep them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

TRAIN_KIND = "train"
EVAL_KIND = "eval"


def finite_number(value: Any) -> float | None:
    """A finite float, or None (missing, null, NaN, a non-number)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _integer(value: Any) -> int | None:
    x = finite_number(value)
    return int(x) if x is not None else None


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainRecord:
    """One optimizer step. ``peak_memory_bytes`` is the largest rank's peak (CUDA:
    ``max_memory_allocated``; CPU: the resident high-water mark, ``peak_memory_kind`` says
    which); ``peak_memory_bytes_per_rank`` only for distributed runs, ``loss_scale`` only fp16.
    Fields are None only when read from a line that lacks them."""

    kind: ClassVar[str] = TRAIN_KIND

    step: int
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    tokens: int | None = None
    step_time_s: float | None = None
    data_time_s: float | None = None
    tokens_per_s: float | None = None
    peak_memory_bytes: int | None = None
    peak_memory_kind: str = ""
    mfu: float | None = None
    skipped_steps: int | None = None
    elapsed_s: float | None = None
    peak_memory_bytes_per_rank: tuple[int, ...] | None = None
    loss_scale: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The line as the trainer writes it: every field, the optional two only when set."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _OPTIONAL_TRAIN_KEYS and value is None:
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainRecord:
        ranks = data.get("peak_memory_bytes_per_rank")
        per_rank = None
        if isinstance(ranks, Sequence) and not isinstance(ranks, str):
            per_rank = tuple(int(v) for v in ranks if _integer(v) is not None)
        return cls(
            step=_integer(data.get("step")) or 0,
            loss=finite_number(data.get("loss")),
            lr=finite_number(data.get("lr")),
            grad_norm=finite_number(data.get("grad_norm")),
            tokens=_integer(data.get("tokens")),
            step_time_s=finite_number(data.get("step_time_s")),
            data_time_s=finite_number(data.get("data_time_s")),
            tokens_per_s=finite_number(data.get("tokens_per_s")),
            peak_memory_bytes=_integer(data.get("peak_memory_bytes")),
            peak_memory_kind=str(data.get("peak_memory_kind") or ""),
            mfu=finite_number(data.get("mfu")),
            skipped_steps=_integer(data.get("skipped_steps")),
            elapsed_s=finite_number(data.get("elapsed_s")),
            peak_memory_bytes_per_rank=per_rank,
            loss_scale=finite_number(data.get("loss_scale")),
        )


_OPTIONAL_TRAIN_KEYS = frozenset({"peak_memory_bytes_per_rank", "loss_scale"})


@dataclass(frozen=True, kw_only=True, slots=True)
class EvalRecord:
    """One evaluation: the held-out loss after ``step`` (``tokens`` trained so far)."""

    kind: ClassVar[str] = EVAL_KIND

    step: int
    eval_loss: float | None
    tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "step": self.step,
            "eval_loss": self.eval_loss,
            "tokens": self.tokens,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalRecord:
        return cls(
            step=_integer(data.get("step")) or 0,
            eval_loss=finite_number(data.get("eval_loss")),
            tokens=_integer(data.get("tokens")),
        )


MetricsRecord = TrainRecord | EvalRecord


def parse_record(data: Any) -> MetricsRecord | None:
    """The record of one decoded line; None for what is not a metrics record. A line without
    ``kind`` (older files) is an eval record when it has ``eval_loss``, else a step."""
    if not isinstance(data, Mapping):
        return None
    kind = data.get("kind")
    if kind == EVAL_KIND or (kind is None and "eval_loss" in data):
        return EvalRecord.from_dict(data)
    if kind in (TRAIN_KIND, None):
        return TrainRecord.from_dict(data)
    return None


def encode(record: MetricsRecord) -> str:
    """The JSON line of a record (no newline)."""
    return json.dumps(record.to_dict(), allow_nan=True)


@dataclass(frozen=True, slots=True)
class Metrics:
    """A metrics.jsonl as read: its records in file order, and how many lines were unreadable
    (cut by a kill, or damaged)."""

    records: tuple[MetricsRecord, ...] = ()
    unreadable_lines: int = 0

    @property
    def train(self) -> list[TrainRecord]:
        return [r for r in self.records if isinstance(r, TrainRecord)]

    @property
    def evals(self) -> list[EvalRecord]:
        return [r for r in self.records if isinstance(r, EvalRecord)]


def parse_lines(text: str) -> Metrics:
    records: list[MetricsRecord] = []
    unreadable = 0
    for line in text.splitlines():
        try:
            decoded = json.loads(line)
        except json.JSONDecodeError:
            unreadable += 1
            continue
        record = parse_record(decoded)
        if record is not None:
            records.append(record)
    return Metrics(records=tuple(records), unreadable_lines=unreadable)


def read_metrics(path: Path) -> Metrics:
    """The records of ``path`` (empty when it does not exist). OSError/UnicodeDecodeError of a
    file that exists but cannot be read propagate: the caller decides how to report them."""
    if not path.is_file():
        return Metrics()
    return parse_lines(path.read_text())
