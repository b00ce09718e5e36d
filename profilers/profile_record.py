"""profile.json: everything the probes measured about one workload on one device.

The strategies read it (cost model, search); the report shows it. Keys are stable
(DESIGN.md): ``device, model, memory, throughput, communication, input, fits`` plus the
provenance and per-probe status this module adds. Every nested record keeps its own
``to_dict``/``from_dict``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profilers.comm_records import CommFit, CommRun, CommSample
from profilers.compile_records import CompileMeasurement
from profilers.device import DeviceInfo
from profilers.flops import FlopCount
from profilers.memory_model import MemoryModel
from profilers.memory_records import CpuStepMemory, CudaStepMemory, MemoryTrace
from profilers.rundir import RunDir, profile_path, write_atomically, write_csv_atomically
from profilers.stopping import INTERRUPTED
from profilers.throughput import StepTiming, TimeModel
from profilers.workload import ModelFacts

SCHEMA_VERSION = 1
PROBE_STATUSES = ("ok", "oom", "timeout", "error", "skipped", "unsupported")
# INTERRUPTED: the reason of a probe a Ctrl-C kept from finishing (profilers.stopping).


def interrupted_probes(rows: Iterable[ProbeRow]) -> int:
    """How many of a profile's probe rows a Ctrl-C cut short."""
    return sum(1 for row in rows if row.reason == INTERRUPTED)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeRow:
    """One probe run: a row of probes.csv (tidy: one observation per row)."""

    # device | model | flops | memory | memory_distributed | memory_check | throughput |
    # compile | communication | input
    probe: str
    name: str  # e.g. "fp32/none/b=4"
    status: str  # one of PROBE_STATUSES
    reason: str = ""
    wall_s: float = 0.0
    precision: str | None = None
    activation_checkpointing: str | None = None
    micro_batch_size: int | None = None
    grad_accum_steps: int | None = None
    world_size: int | None = None
    value: float | None = None  # the probe's headline number, in ``unit``
    unit: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeRow:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, kw_only=True, slots=True)
class InputSample:
    """Data-loader speed at one ``num_workers`` against the model's consumption."""

    num_workers: int
    micro_batch_size: int
    seq_len: int
    batches_per_s: float
    status: str = "ok"
    reason: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.batches_per_s * self.micro_batch_size * self.seq_len

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "tokens_per_s": self.tokens_per_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InputSample:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryOverhead:
    """What the fake trace cannot see, measured on the device and added by the cost model.

    ``fixed_bytes``: outside the allocator (CUDA context and workspaces; on CPU the process's
    resident memory beyond tensors: interpreter, libraries, including those that building a
    step imports, such as ``torch._dynamo`` from the optimizer). ``fragmentation_fraction``:
    reserved over allocated minus one at the peak (CUDA caching allocator); 0 on CPU.
    ``trace_error_fraction``: largest |measured - traced| / measured over the real checks.
    ``parallel_bytes``: per parallelism (``ddp``, ``fsdp``), what one rank's process holds
    beyond ``fixed_bytes`` (process group, the wrapper's modules); measured on CPU, where the
    ranks' processes share the budgeted RAM, empty on a GPU.
    """

    fixed_bytes: int = 0
    fragmentation_fraction: float = 0.0
    trace_error_fraction: float = 0.0
    parallel_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    method: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryOverhead:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True, kw_only=True)
class Fits:
    memory: tuple[MemoryModel, ...] = ()
    time: tuple[TimeModel, ...] = ()
    communication: tuple[CommFit, ...] = ()

    def memory_model(
        self,
        precision: str,
        checkpointing: str,
        *,
        parallelism: str = "single",
        world_size: int = 1,
        loss_chunks: int = 1,
        num_layers: int = 0,
        fsdp_reshard_after_forward: bool = True,
    ) -> MemoryModel | None:
        """The fit for this configuration; per rank for ``ddp``/``fsdp``. ``blocks:K`` without
        a fit of its own is interpolated in K when ``num_layers`` (the model's L) is given
        (profilers.checkpointing_fits)."""
        found = next(
            (
                m
                for m in self.memory
                if m.precision == precision
                and m.activation_checkpointing == checkpointing
                and m.parallelism == parallelism
                and m.world_size == world_size
                and m.loss_chunks == loss_chunks
                and m.fsdp_reshard_after_forward == fsdp_reshard_after_forward
            ),
            None,
        )
        if found is not None or not num_layers:
            return found
        from profilers.checkpointing_fits import blocks_memory_model

        def same_layout(setting: str) -> MemoryModel | None:
            return self.memory_model(
                precision,
                setting,
                parallelism=parallelism,
                world_size=world_size,
                loss_chunks=loss_chunks,
                fsdp_reshard_after_forward=fsdp_reshard_after_forward,
            )

        return blocks_memory_model(same_layout, checkpointing, num_layers)

    def time_model(
        self,
        precision: str,
        checkpointing: str,
        *,
        parallelism: str = "single",
        world_size: int = 1,
        loss_chunks: int = 1,
        num_layers: int = 0,
    ) -> TimeModel | None:
        """The step-time fit; ``blocks:K`` interpolated in K as :meth:`memory_model` does."""
        found = next(
            (
                t
                for t in self.time
                if t.precision == precision
                and t.activation_checkpointing == checkpointing
                and t.parallelism == parallelism
                and t.world_size == world_size
                and t.loss_chunks == loss_chunks
            ),
            None,
        )
        if found is not None or not num_layers:
            return found
        from profilers.checkpointing_fits import blocks_time_model

        return blocks_time_model(
            self._same_layout(precision, parallelism, world_size, loss_chunks),
            checkpointing,
            num_layers,
        )

    def blocks_time_span(
        self,
        precision: str,
        checkpointing: str,
        *,
        num_layers: int,
        parallelism: str = "single",
        world_size: int = 1,
        loss_chunks: int = 1,
    ) -> tuple[TimeModel, TimeModel, float] | None:
        """The timed settings around an untimed ``blocks:K`` and K's place between them
        (:func:`profilers.checkpointing_fits.blocks_time_span`)."""
        from profilers.checkpointing_fits import blocks_time_span

        return blocks_time_span(
            self._same_layout(precision, parallelism, world_size, loss_chunks),
            checkpointing,
            num_layers,
        )

    def _same_layout(
        self, precision: str, parallelism: str, world_size: int, loss_chunks: int
    ) -> Callable[[str], TimeModel | None]:
        def same_layout(setting: str) -> TimeModel | None:
            return self.time_model(
                precision,
                setting,
                parallelism=parallelism,
                world_size=world_size,
                loss_chunks=loss_chunks,
            )

        return same_layout

    def comm_fit(self, collective: str, world_size: int) -> CommFit | None:
        return next(
            (
                c
                for c in self.communication
                if c.collective == collective and c.world_size == world_size
            ),
            None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "memory": [m.to_dict() for m in self.memory],
            "time": [t.to_dict() for t in self.time],
            "communication": [c.to_dict() for c in self.communication],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fits:
        return cls(
            memory=tuple(MemoryModel.from_dict(m) for m in data.get("memory", ())),
            time=tuple(TimeModel.from_dict(t) for t in data.get("time", ())),
            communication=tuple(CommFit.from_dict(c) for c in data.get("communication", ())),
        )


@dataclass(frozen=True, kw_only=True)
class Profile:
    workload: dict[str, Any]  # model, model_args, data, tokenizer, seq_len
    device: DeviceInfo
    model: ModelFacts
    flops: FlopCount | None = None
    memory: tuple[MemoryTrace, ...] = ()
    memory_measured: tuple[CpuStepMemory | CudaStepMemory, ...] = ()
    memory_overhead: MemoryOverhead = field(default_factory=MemoryOverhead)
    throughput: tuple[StepTiming, ...] = ()
    communication: tuple[CommSample, ...] = ()
    communication_runs: tuple[CommRun, ...] = ()
    input: tuple[InputSample, ...] = ()
    # torch.compile per group (profilers.phases_compile); empty (old profiles): not measured.
    compile: tuple[CompileMeasurement, ...] = ()
    fits: Fits = field(default_factory=Fits)
    probes: tuple[ProbeRow, ...] = ()
    tool: dict[str, Any] = field(default_factory=dict)  # versions of advisor, torch, python ...
    created: str = ""
    budget_s: float | None = None
    elapsed_s: float = 0.0
    # The precisions ``advisor profile --precision`` was limited to (None: every one the device
    # runs): the search plans only these (strategies.space.build_space).
    precisions: tuple[str, ...] | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def seq_len(self) -> int:
        return int(self.workload["seq_len"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "created": self.created,
            "tool": self.tool,
            "workload": self.workload,
            "device": self.device.to_dict(),
            "model": {
                **self.model.to_dict(),
                "flops": self.flops.to_dict() if self.flops else None,
            },
            "memory": [t.to_dict() for t in self.memory],
            "memory_measured": [
                {"kind": "cuda" if isinstance(m, CudaStepMemory) else "cpu", **m.to_dict()}
                for m in self.memory_measured
            ],
            "memory_overhead": self.memory_overhead.to_dict(),
            "throughput": [t.to_dict() for t in self.throughput],
            "communication": [s.to_dict() for s in self.communication],
            "communication_runs": [r.to_dict() for r in self.communication_runs],
            "input": [s.to_dict() for s in self.input],
            "compile": [c.to_dict() for c in self.compile],
            "fits": self.fits.to_dict(),
            "probes": [p.to_dict() for p in self.probes],
            "budget_s": self.budget_s,
            "elapsed_s": self.elapsed_s,
            "precisions": list(self.precisions) if self.precisions is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"profile schema version {version!r} is not {SCHEMA_VERSION}: re-run "
                "'advisor profile' with this version of advisor"
            )
        _check_profile_types(data)
        model = dict(data["model"])
        flops = model.pop("flops", None)
        measured: list[CpuStepMemory | CudaStepMemory] = []
        for m in data.get("memory_measured", ()):
            measured.append(
                CudaStepMemory.from_dict(m)
                if m.get("kind") == "cuda"
                else CpuStepMemory.from_dict(m)
            )
        return cls(
            schema_version=version,
            created=data.get("created", ""),
            tool=dict(data.get("tool", {})),
            workload=dict(data["workload"]),
            device=DeviceInfo.from_dict(data["device"]),
            model=ModelFacts.from_dict(model),
            flops=FlopCount.from_dict(flops) if flops else None,
            memory=tuple(MemoryTrace.from_dict(t) for t in data.get("memory", ())),
            memory_measured=tuple(measured),
            memory_overhead=MemoryOverhead.from_dict(data.get("memory_overhead", {})),
            throughput=tuple(StepTiming.from_dict(t) for t in data.get("throughput", ())),
            communication=tuple(CommSample.from_dict(s) for s in data.get("communication", ())),
            communication_runs=tuple(
                CommRun.from_dict(r) for r in data.get("communication_runs", ())
            ),
            input=tuple(InputSample.from_dict(s) for s in data.get("input", ())),
            compile=tuple(CompileMeasurement.from_dict(c) for c in data.get("compile", ())),
            fits=Fits.from_dict(data.get("fits", {})),
            probes=tuple(ProbeRow.from_dict(p) for p in data.get("probes", ())),
            budget_s=data.get("budget_s"),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
            precisions=(tuple(data["precisions"]) if data.get("precisions") is not None else None),
        )

    # -- files ------------------------------------------------------------------------------------
    def save(self, directory: Path) -> tuple[Path, Path]:
        """Write ``profile.json`` and ``probes.csv`` into ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        run = RunDir(directory)
        write_atomically(run.profile, json.dumps(self.to_dict(), indent=1) + "\n")
        write_probes_csv(run.probes, self.probes)
        return run.profile, run.probes


def write_probes_csv(path: Path, rows: Sequence[ProbeRow]) -> None:
    names = [f.name for f in dataclasses.fields(ProbeRow)]
    write_csv_atomically(path, names, (row.to_dict() for row in rows))


def load_profile(path: str | Path) -> Profile:
    """Read a profile.json (or the directory holding one); ValueError names the fix."""
    path = profile_path(path)
    if not path.is_file():
        raise ValueError(f"profile {path} does not exist: run 'advisor profile' first")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"profile {path} is not valid JSON ({exc}): re-run 'advisor profile'"
        ) from None
    # Valid JSON that is not an object (``[1, 2]``, ``null``) has no fields to read: say so
    # here, as the plan loaders do, rather than fail on the first ``data.get``.
    if not isinstance(data, dict):
        raise ValueError(
            f"profile {path} is not a profile (its JSON is {_json_kind(data)}, not an "
            "object): re-run 'advisor profile'"
        )
    try:
        return Profile.from_dict(data)
    except KeyError as exc:
        raise ValueError(
            f"profile {path} is incomplete (missing {exc}): re-run 'advisor profile'"
        ) from None
    except (TypeError, AttributeError) as exc:
        # A field of the wrong JSON type (a list where an object belongs ...).
        raise ValueError(
            f"profile {path} is not a profile ({exc}): re-run 'advisor profile'"
        ) from None


def _json_kind(value: Any) -> str:
    """What a parsed JSON value is, in JSON's own words."""
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: bool is an int
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an object" if isinstance(value, dict) else "an array"


# -- field types ----------------------------------------------------------------------------------
# A field of the wrong JSON type (``"peak_bytes": "12"``, ``"seq_len": true``, ``null`` for a
# number) would pass ``from_dict`` (most records keep what they read) and fail far away, in the
# cost model or the search, or quietly plan nonsense. :func:`_check_profile_types` checks every
# field a record declares against its annotation first: int fields take JSON integers (not
# booleans), float fields integers or floats (not booleans; NaN and infinities as before), str
# strings, bool true/false, ``X | None`` also null, tuples and lists arrays (a fixed-length tuple
# that many items), dicts and records objects, and a tuple of ``(str, X)`` pairs the object its
# ``to_dict`` writes for it. Keys a record does not declare (derived ones such as
# ``tokens_per_s``, or a newer advisor's) and missing ones are left to ``from_dict``.


class _WrongType(TypeError):
    """A JSON value that is not the type its field declares; ``str`` names the field."""

    def __init__(self, expected: str, value: Any, *path: str) -> None:
        super().__init__()
        self.expected = expected
        self.value = value
        self.path = list(path)  # innermost first: each level adds its own as it unwinds

    def __str__(self) -> str:
        where = "".join(reversed(self.path)).lstrip(".")
        got = _json_kind(self.value)
        if type(self.value) is float and "whole" in self.expected:
            got = repr(self.value)  # a fraction where a whole number belongs: says more
        elif isinstance(self.value, list | tuple) and "items" in self.expected:
            got = f"an array of {len(self.value)} items"  # a fixed-length array's
        return f"{where}: expected {self.expected}, got {got}"


@dataclass(frozen=True, slots=True)
class _Scalar:
    """A JSON scalar of one of ``allowed`` exact types (a JSON boolean is no number)."""

    allowed: frozenset[type]
    expected: str

    def __call__(self, value: Any) -> None:
        if type(value) not in self.allowed:
            raise _WrongType(self.expected, value)


_Check = Callable[[Any], None]
_CHECKS: dict[Any, _Check] = {}
_NULL = type(None)


def _segment(key: str) -> str:
    return f".{key}" if key.isidentifier() else f"[{json.dumps(key)}]"


def _optional(inner: _Check) -> _Check:
    if isinstance(inner, _Scalar):  # one type test
        return _Scalar(inner.allowed | {_NULL}, f"{inner.expected} or null")

    def check(value: Any) -> None:
        if value is not None:
            try:
                inner(value)
            except _WrongType as exc:
                if not exc.path:  # this value itself: null would have done too
                    exc.expected += " or null"
                raise

    return check


def _at(inner: _Check, item: Any, segment: str) -> None:
    """Check ``item`` with ``inner``; a wrong type names ``segment`` in its path."""
    if isinstance(inner, _Scalar):  # most fields and items: one type test, no call
        if type(item) not in inner.allowed:
            raise _WrongType(inner.expected, item, segment)
        return
    try:
        inner(item)
    except _WrongType as exc:
        exc.path.append(segment)
        raise


def _items(inner: _Check, length: int | None = None) -> _Check:
    """An array whose items all pass ``inner``; of ``length`` items when given."""
    expected = "an array" if length is None else f"an array of {length} items"

    def check(value: Any) -> None:
        if not isinstance(value, list | tuple) or (length is not None and len(value) != length):
            raise _WrongType(expected, value)
        for index, item in enumerate(value):
            _at(inner, item, f"[{index}]")

    return check


def _tuple_items(checks: Sequence[_Check]) -> _Check:
    """A fixed-length array: item i passes ``checks[i]``."""
    expected = f"an array of {len(checks)} items"

    def check(value: Any) -> None:
        if not isinstance(value, list | tuple) or len(value) != len(checks):
            raise _WrongType(expected, value)
        for index, (inner, item) in enumerate(zip(checks, value, strict=True)):
            _at(inner, item, f"[{index}]")

    return check


def _values(inner: _Check) -> _Check:
    """An object whose values all pass ``inner`` (JSON keys are strings)."""

    def check(value: Any) -> None:
        if not isinstance(value, Mapping):
            raise _WrongType("an object", value)
        for key, item in value.items():
            _at(inner, item, _segment(key))

    return check


def _record(fields: Mapping[str, _Check]) -> _Check:
    """An object whose keys named in ``fields`` pass their checks; other keys are not read.
    ``fields`` may be filled after the call (a record that holds its own kind)."""

    def check(value: Any) -> None:
        if not isinstance(value, Mapping):
            raise _WrongType("an object", value)
        for key, item in value.items():
            inner = fields.get(key)
            if inner is not None:
                _at(inner, item, _segment(key))

    return check


def _dataclass_fields(cls: type) -> dict[str, _Check]:
    hints = typing.get_type_hints(cls)
    return {f.name: _type_check(hints[f.name]) for f in dataclasses.fields(cls)}


def _type_check(annotation: Any) -> _Check:
    """The check of a JSON value against a field's annotation (built once per type)."""
    found = _CHECKS.get(annotation)
    if found is not None:
        return found
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        fields: dict[str, _Check] = {}
        _CHECKS[annotation] = check = _record(fields)
        fields.update(_dataclass_fields(annotation))  # after: a record may hold its own kind
        return check
    _CHECKS[annotation] = check = _build_type_check(annotation)
    return check


_SCALARS = {
    bool: _Scalar(frozenset({bool}), "true or false"),
    int: _Scalar(frozenset({int}), "a whole number"),
    float: _Scalar(frozenset({int, float}), "a number"),
    str: _Scalar(frozenset({str}), "a string"),
}


def _build_type_check(annotation: Any) -> _Check:
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (types.UnionType, typing.Union) and _NULL in args and len(args) == 2:
        return _optional(_type_check(next(a for a in args if a is not _NULL)))
    if origin is list and len(args) == 1:
        return _items(_type_check(args[0]))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item, item_args = args[0], typing.get_args(args[0])
        if typing.get_origin(item) is tuple and len(item_args) == 2 and item_args[0] is str:
            return _values(_type_check(item_args[1]))  # (name, X) pairs: written as an object
        return _items(_type_check(item))
    if origin is tuple and args and Ellipsis not in args:
        return _tuple_items([_type_check(a) for a in args])
    if origin is dict and len(args) == 2:
        return _values(_type_check(args[1]))
    return lambda _: None  # Any, or a type this check does not know: from_dict decides


def _measured_row() -> _Check:
    """A memory_measured row: a CUDA step's fields for ``"kind": "cuda"``, else a CPU step's
    (as :meth:`Profile.from_dict` reads it)."""
    cuda, cpu = _type_check(CudaStepMemory), _type_check(CpuStepMemory)

    def check(value: Any) -> None:
        if isinstance(value, Mapping) and value.get("kind") == "cuda":
            cuda(value)
        else:
            cpu(value)

    return check


@functools.cache
def _profile_check() -> _Check:
    """The check of a whole profile (built on first use)."""
    fields = _dataclass_fields(Profile)
    # As to_dict writes them: the FLOP count inside "model", measured rows by their kind.
    flops = fields.pop("flops")
    fields["model"] = _record({**_dataclass_fields(ModelFacts), "flops": flops})
    fields["memory_measured"] = _items(_measured_row())
    # The workload's description is free-form (a workload names its own keys) but for
    # the sequence length, which every profile's reader takes as a whole number.
    fields["workload"] = _record({"seq_len": _SCALARS[int]})
    return _record(fields)


def _check_profile_types(data: Mapping[str, Any]) -> None:
    """Raise ``_WrongType`` (a TypeError naming the field, e.g. ``memory[3].peak_bytes``) for
    the first field of ``data`` whose JSON type its record does not declare."""
    _profile_check()(data)
