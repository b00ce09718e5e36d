"""What the cost model predicts, as typed records: the machine, the prediction and its terms.

:class:`Prediction` is what plan.json, trials.csv, ``advisor predict`` and the report carry for
a candidate; its :class:`Breakdown` holds the terms the totals were added up from (memory per
rank, time per step, communication, the assumptions made), so nothing downstream re-derives the
model. Every record writes the keys plan.json has always had, in the same order (other tools
read them), and reads them back tolerantly: a report may render an older or hand-made plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from profilers.metrics_record import finite_number
from strategies.uncertainty import Uncertainty

MiB = 2**20
GiB = 2**30


def memory_size(num_bytes: float) -> str:
    """A memory amount in messages: ``12.34 GiB`` from 1 GiB (two decimals, as trials.csv's
    reasons always had), below it in MiB, KiB or B as the report writes sizes
    (reports.fmt.size: ``1.64 MiB``, ``412.3 MiB``); a budget of --memory-budget 0.0001 read
    "0.00 GiB" in trials.csv and in the error."""
    if abs(num_bytes) >= GiB:
        return f"{num_bytes / GiB:.2f} GiB"
    for unit, scale in (("MiB", MiB), ("KiB", 1024)):
        if abs(num_bytes) >= scale:
            value = num_bytes / scale
            return f"{value:.2f} {unit}" if abs(value) < 100 else f"{value:.1f} {unit}"
    return f"{num_bytes:.0f} B"


def _float(data: Mapping[str, Any], key: str) -> float:
    """A number read from a plan tolerantly, as every run-file value is: 0 when missing or
    not finite."""
    return finite_number(data.get(key)) or 0.0


def _int(data: Mapping[str, Any], key: str, old_key: str | None = None) -> int:
    """``key``'s number, or ``old_key``'s (the name an older file used) when ``key`` is absent."""
    if key not in data and old_key is not None:
        key = old_key
    return int(_float(data, key))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _as_dict(record: Any) -> dict[str, Any]:
    """A flat record's fields in declaration order; an optional one (default None) only when
    set, as plan.json has always written them."""
    return {
        f.name: getattr(record, f.name)
        for f in fields(record)
        if not (f.default is None and getattr(record, f.name) is None)
    }


def _fields_of(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of a flat record read tolerantly: a missing number is 0, a missing
    text its default or "", an optional field None."""
    readers = {"int": _int, "float": _float}
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.type in readers:
            out[f.name] = readers[str(f.type)](data, f.name)
        elif f.default is None:
            out[f.name] = data.get(f.name)
        else:
            fallback = f.default if isinstance(f.default, str) else ""
            out[f.name] = str(data.get(f.name) or fallback)
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Machine:
    """Where the candidates run: the memory they are budgeted against and what ranks share.

    ``memory_bytes``: one device's memory (GPU), or the RAM available to the job on a CPU host.
    ``fixed_overhead_bytes``: per process, outside what the fake trace counts (CUDA context and
    workspaces; on CPU the interpreter and libraries). ``parallel_overhead_bytes``: what a
    ddp/fsdp rank holds on top of that (CPU: its process group and the wrapper's modules),
    per parallelism. ``shared_host``: the ranks of a multi-rank candidate are processes on
    this one host sharing its cores and its RAM (CPU).
    """

    kind: str
    name: str
    memory_bytes: int
    fixed_overhead_bytes: int = 0
    parallel_overhead_bytes: Mapping[str, int] = field(default_factory=dict)
    fragmentation_fraction: float = 0.0
    shared_host: bool = False
    estimate: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "fixed_overhead_bytes": self.fixed_overhead_bytes,
            "parallel_overhead_bytes": dict(self.parallel_overhead_bytes),
            "fragmentation_fraction": self.fragmentation_fraction,
            "shared_host": self.shared_host,
            "estimate": self.estimate,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Machine:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


# -- memory ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class FsdpMemory:
    """The terms of an FSDP rank's forward/backward peak (strategies.cost, ``_fsdp_memory``)."""

    sharded_state_bytes: int  # (parameters + gradients + optimizer state) / N
    gathered_units_bytes: int  # the root and two blocks unsharded, in the compute dtype
    reduce_scatter_buffer_bytes: int  # one block's fp32 gradients before reduce-scatter
    activation_bytes: int  # as on one device
    optimizer_phase_bytes: int  # the optimizer-step peak / N
    root_params: int
    params_per_block: int

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FsdpMemory:
        return cls(**_fields_of(cls, data))


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryTerms:
    """One rank's predicted peak, term by term.

    ``traced_bytes`` is the fake-traced peak for this layout (+ the CUDA rounding allowance),
    what a measured allocator peak compares with; ``per_rank_bytes`` adds fragmentation and the
    fixed and per-rank overheads; ``budgeted_bytes`` is what the budget holds (every rank
    together on a CPU host). At most one of ``source`` (a per-rank trace of this very layout),
    ``ddp_gradient_buckets_bytes`` and ``fsdp`` (the analytic reshaping) is set.
    """

    fitted_peak_bytes: int
    phase: str  # "forward_backward" | "optimizer_step": where the peak falls
    traced_bytes: int
    rounding_allowance_bytes: int
    fragmentation_bytes: int
    fixed_overhead_bytes: int
    parallel_overhead_bytes: int
    per_rank_bytes: int
    ranks_sharing_memory: int
    budgeted_bytes: int
    budget_bytes: int
    # The WHOLE model's parameters, gradients and optimizer state (JSON: ``model_…``); a rank
    # holds 1/``state_shards`` of them (JSON: ``rank_…``): FSDP shards them over its ranks.
    model_parameter_bytes: int
    model_gradient_bytes: int
    model_optimizer_state_bytes: int
    state_shards: int = 1
    source: str | None = None
    ddp_gradient_buckets_bytes: int | None = None
    fsdp: FsdpMemory | None = None
    # torch.compile: what the compiled forward+backward measured beyond the eager one (in
    # traced_bytes); None when eager, or compiled without that measurement.
    compile_extra_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.fsdp is not None:
            out["fsdp"] = self.fsdp.to_dict()
        out["fitted_peak_bytes"] = self.fitted_peak_bytes
        if self.source is not None:
            out["source"] = self.source
        if self.ddp_gradient_buckets_bytes is not None:
            out["ddp_gradient_buckets_bytes"] = self.ddp_gradient_buckets_bytes
        if self.compile_extra_bytes is not None:
            out["compile_extra_bytes"] = self.compile_extra_bytes
        for name in _MEMORY_TOTALS:
            out[name] = getattr(self, name)
        # What a rank holds of the state beside the whole model's: read together with
        # per_rank_bytes, a 70B model's 282 GB of parameters are 4.4 GB on each of 64 ranks.
        out["state_shards"] = self.state_shards
        for part in _STATE_PARTS:
            out[f"rank_{part}"] = getattr(self, f"rank_{part}")
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryTerms:
        fsdp = data.get("fsdp")
        buckets = data.get("ddp_gradient_buckets_bytes")
        return cls(
            fitted_peak_bytes=_int(data, "fitted_peak_bytes"),
            phase=str(data.get("phase") or "forward_backward"),
            traced_bytes=_int(data, "traced_bytes"),
            rounding_allowance_bytes=_int(data, "rounding_allowance_bytes"),
            fragmentation_bytes=_int(data, "fragmentation_bytes"),
            fixed_overhead_bytes=_int(data, "fixed_overhead_bytes"),
            parallel_overhead_bytes=_int(data, "parallel_overhead_bytes"),
            per_rank_bytes=_int(data, "per_rank_bytes"),
            ranks_sharing_memory=_int(data, "ranks_sharing_memory") or 1,
            budgeted_bytes=_int(data, "budgeted_bytes"),
            budget_bytes=_int(data, "budget_bytes"),
            # Files written before 2026-12-07 name the whole model's state without "model_".
            **{f"model_{part}": _int(data, f"model_{part}", part) for part in _STATE_PARTS},
            state_shards=_int(data, "state_shards") or 1,
            source=str(data["source"]) if data.get("source") is not None else None,
            ddp_gradient_buckets_bytes=int(buckets) if buckets is not None else None,
            fsdp=FsdpMemory.from_dict(fsdp) if isinstance(fsdp, Mapping) else None,
            compile_extra_bytes=(
                int(data["compile_extra_bytes"])
                if data.get("compile_extra_bytes") is not None
                else None
            ),
        )

    @property
    def model_state_bytes(self) -> int:
        """Parameters, gradients and optimizer state of the whole (unsharded) model."""
        return (
            self.model_parameter_bytes
            + self.model_gradient_bytes
            + self.model_optimizer_state_bytes
        )

    @property
    def rank_parameter_bytes(self) -> int:
        """A rank's share of the parameters (their fp32 master copy; 1/N under FSDP)."""
        return self.model_parameter_bytes // self.state_shards

    @property
    def rank_gradient_bytes(self) -> int:
        """A rank's share of the gradients, once reduced (1/N under FSDP)."""
        return self.model_gradient_bytes // self.state_shards

    @property
    def rank_optimizer_state_bytes(self) -> int:
        """A rank's share of the optimizer state (1/N under FSDP)."""
        return self.model_optimizer_state_bytes // self.state_shards


_MEMORY_TOTALS = (
    "phase",
    "traced_bytes",
    "rounding_allowance_bytes",
    "fragmentation_bytes",
    "fixed_overhead_bytes",
    "parallel_overhead_bytes",
    "per_rank_bytes",
    "ranks_sharing_memory",
    "budgeted_bytes",
    "budget_bytes",
    "model_parameter_bytes",
    "model_gradient_bytes",
    "model_optimizer_state_bytes",
)
_STATE_PARTS = ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes")


# -- communication and time -----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class DdpCommunication:
    """One all-reduce of the gradients per optimizer step, in DDP's buckets."""

    collective: str = "all_reduce"
    buckets: int
    bytes: int
    backward_s: float  # the backward the buckets overlap with
    source: str
    overlap: str | None = None  # why none of it overlaps (CPU ranks), when so

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DdpCommunication:
        return cls(**_fields_of(cls, data))


@dataclass(frozen=True, kw_only=True, slots=True)
class FsdpCommunication:
    """All-gathers (forward, backward) and reduce-scatters of every unit, per micro-batch."""

    collectives: str = "all_gather (forward, backward) + reduce_scatter per micro-batch"
    all_gather_bytes: int
    reduce_scatter_bytes: int
    exposed_forward_s: float
    exposed_backward_s: float
    source: str
    overlap: str | None = None
    # CPU ranks: FSDP2's own work beyond the collectives' wire time, inside the exposed
    # communication (strategies.cost.FSDP_CPU_STEP_S / FSDP_CPU_COLLECTIVE_S); None elsewhere.
    cpu_overhead_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return _as_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FsdpCommunication:
        return cls(**_fields_of(cls, data))


MEASURED_COMMUNICATION = "inside the measured multi-rank step time"

Communication = DdpCommunication | FsdpCommunication | str | None


def communication_to_dict(comm: Communication) -> dict[str, Any]:
    """plan.json's ``time.communication``: {} on one device, a note when it was measured inside
    the step time, else the collectives' terms."""
    if comm is None:
        return {}
    if isinstance(comm, str):
        return {"note": comm}
    return comm.to_dict()


def communication_from_dict(data: Mapping[str, Any]) -> Communication:
    if "collectives" in data:
        return FsdpCommunication.from_dict(data)
    if "collective" in data:
        return DdpCommunication.from_dict(data)
    if "note" in data:
        return str(data["note"])
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeTerms:
    """One optimizer step's predicted time, term by term:
    step = micro_batches × forward_backward + optimizer + exposed communication (+ input)."""

    forward_backward_s: float  # one micro-batch on one rank, sharing of the host applied
    micro_batches: int
    optimizer_s: float
    communication_s: float  # every collective of the step
    exposed_communication_s: float  # the part that compute does not hide
    communication: Communication
    input_s: float
    compute_source: str
    step_s: float
    # forward_backward_s by part (gemm, attention, memory_bound, launch) for an estimate.
    forward_backward_parts: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        parts = (
            {"forward_backward_parts": dict(self.forward_backward_parts)}
            if self.forward_backward_parts
            else {}
        )
        return {
            "forward_backward_s": self.forward_backward_s,
            **parts,
            "micro_batches": self.micro_batches,
            "optimizer_s": self.optimizer_s,
            "communication_s": self.communication_s,
            "exposed_communication_s": self.exposed_communication_s,
            "communication": communication_to_dict(self.communication),
            "input_s": self.input_s,
            "compute_source": self.compute_source,
            "step_s": self.step_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimeTerms:
        return cls(
            forward_backward_s=_float(data, "forward_backward_s"),
            micro_batches=_int(data, "micro_batches"),
            optimizer_s=_float(data, "optimizer_s"),
            communication_s=_float(data, "communication_s"),
            exposed_communication_s=_float(data, "exposed_communication_s"),
            communication=communication_from_dict(_mapping(data.get("communication"))),
            input_s=_float(data, "input_s"),
            compute_source=str(data.get("compute_source") or ""),
            step_s=_float(data, "step_s"),
            forward_backward_parts={
                str(k): float(v) for k, v in _mapping(data.get("forward_backward_parts")).items()
            },
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Breakdown:
    """The terms of a prediction and the assumptions made; empty for a hand-made one."""

    memory: MemoryTerms | None = None
    time: TimeTerms | None = None
    assumptions: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        if self.memory is None and self.time is None and not self.assumptions:
            return {}
        return {
            "memory": self.memory.to_dict() if self.memory else {},
            "time": self.time.to_dict() if self.time else {},
            "assumptions": list(self.assumptions),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Breakdown:
        memory, time = _mapping(data.get("memory")), _mapping(data.get("time"))
        return cls(
            memory=MemoryTerms.from_dict(memory) if memory else None,
            time=TimeTerms.from_dict(time) if time else None,
            assumptions=tuple(str(a) for a in data.get("assumptions") or ()),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    """What one candidate is predicted to cost.

    ``peak_memory_bytes``: one rank's peak, overheads included. ``budgeted_bytes``: what is
    compared with ``budget_bytes``: the per-rank peak on a GPU, every rank together on a CPU
    host (they share its RAM). ``breakdown`` holds the terms and the assumptions made;
    ``estimate`` is True for what-if predictions (never measurements).
    """

    peak_memory_bytes: int
    budgeted_bytes: int
    budget_bytes: int
    step_time_s: float
    tokens_per_s: float
    estimate: bool = False
    breakdown: Breakdown = field(default_factory=Breakdown)
    uncertainty: Uncertainty | None = None
    # torch.compile: the cold compile the run pays once, spread over its ``run_steps`` steps
    # (0: eager, nothing to amortise).
    compile_s: float = 0.0
    run_steps: int = 0

    @property
    def fits(self) -> bool:
        return self.budgeted_bytes <= self.budget_bytes

    @property
    def amortised_step_time_s(self) -> float:
        """Seconds per step over the whole run, its compile included (the search ranks by it:
        a 300-step run may not recoup a minute of compilation that a 100k-step run does)."""
        if not self.compile_s or self.run_steps < 1:
            return self.step_time_s
        return self.step_time_s + self.compile_s / self.run_steps

    @property
    def amortised_tokens_per_s(self) -> float:
        return self.tokens_per_s * self.step_time_s / self.amortised_step_time_s

    @property
    def step_time_interval_s(self) -> tuple[float, float] | None:
        """The step time's 90% interval (strategies.uncertainty), if known."""
        if self.uncertainty is None:
            return None
        return self.uncertainty.step_time_interval(self.step_time_s)

    @property
    def tokens_per_s_interval(self) -> tuple[float, float] | None:
        """Tokens/s over the same interval (a slower step is fewer tokens per second)."""
        return self._tokens_per_s_interval(self.uncertainty)

    @property
    def comparable_tokens_per_s_interval(self) -> tuple[float, float] | None:
        """The tokens/s interval without the parts every candidate of one profile shares
        (a shared host's drift since the profile: strategies.uncertainty.COMMON_TERMS): what
        validation compares candidates measured together with."""
        return self._tokens_per_s_interval(self.uncertainty and self.uncertainty.comparable())

    def _tokens_per_s_interval(self, u: Uncertainty | None) -> tuple[float, float] | None:
        if u is None:
            return None
        interval = u.step_time_interval(self.step_time_s)
        tokens = self.tokens_per_s * self.step_time_s
        return tokens / interval[1], tokens / interval[0]

    @property
    def traced_bytes(self) -> int | None:
        """The traced peak (what an allocator's measured peak compares with), if known."""
        memory = self.breakdown.memory
        return memory.traced_bytes if memory is not None and memory.traced_bytes else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "peak_memory_bytes": self.peak_memory_bytes,
            "budgeted_bytes": self.budgeted_bytes,
            "budget_bytes": self.budget_bytes,
            "fits": self.fits,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            **self._interval_dict(),
            **self._compile_dict(),
            "estimate": self.estimate,
            "breakdown": self.breakdown.to_dict(),
        }

    def _compile_dict(self) -> dict[str, Any]:
        if not self.compile_s:
            return {}
        return {
            "compile_s": self.compile_s,
            "run_steps": self.run_steps,
            "amortised_step_time_s": self.amortised_step_time_s,
            "amortised_tokens_per_s": self.amortised_tokens_per_s,
        }

    def _interval_dict(self) -> dict[str, Any]:
        step, tokens = self.step_time_interval_s, self.tokens_per_s_interval
        if self.uncertainty is None or step is None or tokens is None:
            return {}
        return {
            "step_time_s_interval": list(step),
            "tokens_per_s_interval": list(tokens),
            "uncertainty": self.uncertainty.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Prediction:
        return cls(
            peak_memory_bytes=int(data["peak_memory_bytes"]),
            budgeted_bytes=int(data["budgeted_bytes"]),
            budget_bytes=int(data["budget_bytes"]),
            step_time_s=float(data["step_time_s"]),
            tokens_per_s=float(data["tokens_per_s"]),
            compile_s=float(data.get("compile_s", 0.0)),
            run_steps=int(data.get("run_steps", 0)),
            estimate=bool(data.get("estimate", False)),
            breakdown=Breakdown.from_dict(_mapping(data.get("breakdown"))),
            uncertainty=(
                Uncertainty.from_dict(_mapping(data["uncertainty"]))
                if data.get("uncertainty")
                else None
            ),
        )
