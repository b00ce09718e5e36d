"""``advisor profile``: run the probes on a model and write profile.json and probes.csv."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.errors import UsageProblem
from advisor.version import __version__
from profilers.checkpointing import profiled as profiled_checkpointing
from profilers.defaults import DEFAULT_PROFILE_BUDGET_S
from profilers.profile_record import Profile
from profilers.profiler import Progress
from profilers.workload import ModelFacts
from strategies.config import DEFAULT_DATA, DEFAULT_MODEL, DEFAULT_SEQ_LEN


@dataclass(frozen=True, kw_only=True)
class ProfileRequest:
    model: str = DEFAULT_MODEL
    model_args: Mapping[str, Any] = field(default_factory=dict)
    data: str = DEFAULT_DATA
    tokenizer: str | None = None
    seq_len: int = DEFAULT_SEQ_LEN
    device: str = "auto"
    budget_s: float = DEFAULT_PROFILE_BUDGET_S
    precisions: tuple[str, ...] | None = None
    # Activation-checkpointing settings to measure; None: profiled() (none, full, ops, the
    # middle blocks:K). ops-half is measured only when asked.
    checkpointing: tuple[str, ...] | None = None
    comm: bool = True
    # The device the memory traces are for (profilers.defaults.TRACE_TARGETS, checked by the
    # CLI and the API); None: the probed device's kind.
    trace_for: str | None = None


def resolve_device_name(name: str) -> str:
    import torch

    if name not in ("auto", "cpu", "cuda"):
        raise UsageProblem(f"unknown --device {name!r}: use auto, cpu or cuda")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageProblem("--device cuda but no CUDA device is visible: use --device cpu")
    return "cuda:0" if name == "cuda" or (name == "auto" and torch.cuda.is_available()) else "cpu"


def profiled_settings(asked: Sequence[str] | None, facts: ModelFacts) -> tuple[str, ...]:
    """The checkpointing settings a profile measures: ``asked`` (checked against the model,
    none first, each once), else none only without repeated blocks, and with them none, full,
    ops and the middle blocks:K."""
    if not asked:
        return profiled_checkpointing(facts.num_layers) if facts.repeated_blocks else ("none",)
    settings: list[str] = ["none"]
    for value in asked:
        problem = facts.checkpointing_problem(value)
        if problem:
            raise UsageProblem(f"--checkpointing {value}: {problem}")
        if value not in settings:
            settings.append(value)
    return tuple(settings)


def profile(request: ProfileRequest, out: Path, progress: Progress | None = None) -> Profile:
    """Validate the request cheaply, run every probe, write ``out``/profile.json + probes.csv.
    ``request.budget_s`` counts from this call: importing torch and reading the model's facts
    (seconds for a 70B model) are part of it."""
    started = time.perf_counter()
    from advisor.data import resolve_data
    from advisor.trainer.loop import check_shapes
    from advisor.workload import AdvisorWorkload
    from profilers.profiler import ProfileInterrupted, ProfileOptions, run_profile
    from strategies.config import TrainConfig

    if not (0 < request.budget_s < math.inf):  # nan fails both comparisons
        raise UsageProblem(
            f"--budget-s must be a positive number of seconds, got {request.budget_s}"
        )
    device = resolve_device_name(request.device)
    workload = AdvisorWorkload(
        request.model, dict(request.model_args), request.data, request.tokenizer
    )
    facts = workload.facts()  # a bad model spec fails here, before any probe
    source = resolve_data(
        request.data,
        tokenizer=request.tokenizer,
        model_vocab=facts.vocab_size,
        min_tokens=request.seq_len + 1,
        model=request.model,
    )
    check_shapes(
        TrainConfig(model=request.model, data=request.data, seq_len=request.seq_len), facts, source
    )
    options = ProfileOptions(
        seq_len=request.seq_len,
        device=device,
        budget_s=request.budget_s,
        precisions=request.precisions,
        checkpointing=profiled_settings(request.checkpointing, facts),
        comm=request.comm,
        trace_for=request.trace_for,
        tool={"advisor": __version__, "data": source.description},
        started_at=started,
    )
    # An --out that cannot hold the files fails now (a file in its way: one line from the
    # CLI), not after the whole budget of probes; after the cheap checks above, so a bad
    # model spec leaves no empty directory behind.
    out.mkdir(parents=True, exist_ok=True)
    try:
        result = run_profile(workload, options, progress)
    except ProfileInterrupted as exc:  # Ctrl-C: what was measured is kept, then it goes on
        exc.profile.save(out)
        exc.saved_to = out
        raise
    result.save(out)
    return result
