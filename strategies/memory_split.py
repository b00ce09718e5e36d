"""Where a predicted per-rank peak goes: parameters, gradients, optimizer state, activations,
temporaries and overhead (what tracing cannot see), adding up to the prediction.

The cost model's :class:`strategies.prediction.MemoryTerms` name the parameter, gradient and
optimizer-state bytes, an FSDP rank's terms and DDP's buckets; how the rest of a traced peak
splits into gradients, activations and temporaries is read off the profile's own traces of
that (precision, checkpointing), interpolated in micro-batch size since every category is
affine in it (DESIGN.md, "Measuring well"), and scaled to the predicted total. The report's
memory chart draws this; nothing else re-derives the model's arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from profilers.memory_records import MemoryTrace
from strategies.prediction import MemoryTerms
from strategies.space import Candidate

CATEGORIES: tuple[str, ...] = (
    "parameters",
    "gradients",
    "optimizer state",
    "activations",
    "temporaries",
    "overhead",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class MemorySplit:
    """Bytes per :data:`CATEGORIES`, summing to the predicted peak. ``split``: "traced" when
    the profile's traces split the rest, "estimated" when none of the config's group exists."""

    parts: Mapping[str, int]
    split: str


def _traces_for(traces: Sequence[MemoryTrace], c: Candidate) -> list[MemoryTrace]:
    """Single-device traces of the candidate's (precision, checkpointing), those with (or
    without) accumulation as the candidate has it when there are any."""
    return _same_accumulation(_group(traces, c), c) or _group(traces, c)


def _group(traces: Sequence[MemoryTrace], c: Candidate) -> list[MemoryTrace]:
    return [
        t
        for t in traces
        if t.spec.precision == c.precision
        and t.spec.activation_checkpointing == c.activation_checkpointing
        and t.spec.parallelism == "single"
        and t.spec.loss_chunks == c.loss_chunks
    ]


def _same_accumulation(group: Sequence[MemoryTrace], c: Candidate) -> list[MemoryTrace]:
    accumulating = c.grad_accum_steps > 1
    return [t for t in group if (t.spec.grad_accum_steps > 1) == accumulating]


def _untraced_gradient_copy(
    memory: MemoryTerms, c: Candidate, traces: Sequence[MemoryTrace], rest: float
) -> float:
    """The gradient copy an accumulating single-device or DDP candidate holds at its
    forward/backward peak when the profile has no accumulating trace of its group: the cost
    model then prices that peak as the non-accumulating fit plus every gradient's bytes
    (profilers.memory_model, README "a missing accumulation trace is priced by adding every
    gradient's bytes"), and the non-accumulating traces' shares hold no gradients at their
    peak. Until 2026-12-07 those bytes were split by those shares: a gpt-tiny 1×8 showed 4.79
    KiB of gradients and 12.8 MiB more activations."""
    if (
        c.grad_accum_steps <= 1
        or c.parallelism == "fsdp"
        or memory.phase == "optimizer_step"
        or _same_accumulation(_group(traces, c), c)
    ):
        return 0.0
    return min(rest, float(memory.model_gradient_bytes))


def _phase_parts(trace: MemoryTrace, phase: str) -> dict[str, float]:
    b = (
        trace.optimizer_step_breakdown
        if phase == "optimizer_step"
        else (trace.forward_backward_breakdown)
    )
    return {
        "gradients": float(b.gradients),
        "activations": float(b.activations),
        "temporaries": float(b.temporaries + b.other + b.communication),
    }


def _interpolated_shares(
    traces: Sequence[MemoryTrace], micro_batch: int, phase: str
) -> dict[str, float] | None:
    """gradients/activations/temporaries at ``micro_batch``: the traces' values, linear in b
    between (or beyond) the two nearest traced sizes."""
    points: dict[int, dict[str, float]] = {}
    for t in traces:
        if t.spec.micro_batch_size > 0:
            points[t.spec.micro_batch_size] = _phase_parts(t, phase)
    if not points:
        return None
    if micro_batch in points or len(points) == 1:
        return points.get(micro_batch) or next(iter(points.values()))
    sizes = sorted(points, key=lambda b: (abs(b - micro_batch), b))[:2]
    b0, b1 = sorted(sizes)
    out = {}
    for k in points[b0]:
        slope = (points[b1][k] - points[b0][k]) / (b1 - b0)
        out[k] = max(points[b0][k] + slope * (micro_batch - b0), 0.0)
    return out


def split_memory(
    memory: MemoryTerms, peak_bytes: int, candidate: Candidate, traces: Sequence[MemoryTrace]
) -> MemorySplit:
    """The predicted ``peak_bytes`` of ``candidate`` (its terms: ``memory``) by category."""
    total = peak_bytes
    traced = memory.traced_bytes or total
    world = max(candidate.world_size, 1)
    params = float(memory.model_parameter_bytes)
    optimizer = float(memory.model_optimizer_state_bytes)
    overhead = max(total - traced, 0)
    split = "traced"
    if memory.fsdp is not None:
        # ZeRO-3-like sharding (strategies.cost, _fsdp_memory): state / N; the gathered units
        # are transient (temporaries), the reduce-scatter buffer holds gradients, activations
        # as on one device.
        params, optimizer = params / world, optimizer / world
        grads = memory.model_gradient_bytes / world + memory.fsdp.reduce_scatter_buffer_bytes
        activations = float(memory.fsdp.activation_bytes)
        temporaries = max(traced - params - optimizer - grads - activations, 0.0)
    else:
        # A traced FSDP rank (resharded to this world size) holds 1/N of the parameters,
        # gradients and optimizer state (MemoryTerms names the whole model's); the rest of its
        # peak splits as the single device's traces split theirs, their gradients 1/N. Until
        # 2026-12-05 the whole model's were drawn, so a 6.7B Llama's rank on 8 GPUs showed 25
        # GiB of parameters and 50 GiB of optimizer state under a 61.6 GiB peak.
        shards = world if candidate.parallelism == "fsdp" else 1
        params, optimizer = params / shards, optimizer / shards
        buckets = float(memory.ddp_gradient_buckets_bytes or 0)
        rest = max(traced - params - optimizer - buckets, 0.0)
        shares = _interpolated_shares(
            _traces_for(traces, candidate), candidate.micro_batch_size, memory.phase
        )
        copy = 0.0
        if shares is None or sum(shares.values()) <= 0:
            split = "estimated"
            live = memory.phase == "optimizer_step" or candidate.grad_accum_steps > 1
            grads = min(rest, float(memory.model_gradient_bytes) / shards) if live else 0.0
            shares = {"gradients": grads, "activations": rest - grads, "temporaries": 0.0}
        else:
            shares = {**shares, "gradients": shares["gradients"] / shards}
            copy = _untraced_gradient_copy(memory, candidate, traces, rest)
            rest -= copy
        scale = rest / sum(shares.values()) if sum(shares.values()) > 0 else 0.0
        grads = shares["gradients"] * scale + buckets + copy
        activations = shares["activations"] * scale
        temporaries = shares["temporaries"] * scale
    parts = {
        "parameters": round(params),
        "gradients": round(grads),
        "optimizer state": round(optimizer),
        "activations": round(activations),
        "temporaries": round(temporaries),
        "overhead": round(overhead),
    }
    # Rounding and clamping may leave a few bytes either way: the largest of the parts split
    # from the rest absorbs them, so the parts add up.
    absorbing = max(("temporaries", "activations", "gradients"), key=lambda k: parts[k])
    parts[absorbing] = max(parts[absorbing] + total - sum(parts.values()), 0)
    return MemorySplit(parts=parts, split=split)
