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
    # When the budget started: a time.perf_counter() reading taken as the command started
    # (the CLI's, before parsing --model-arg imported torch); None: when profile() is called.
    started_at: float | None = None


# The shortest --budget-s a profile is started for. Whatever the budget, a profile runs the
# device benchmarks, reads the model's facts and starts its baseline's timing child (at least
# profilers.probe_run.MIN_CHILD_SHARE_S, its start-up included): --budget-s 1 took 45 s on the
# 2-vCPU host and measured no step time. A budget this short still overruns on a slow host; the
# CLI then says by how much (advisor.cli.profile).
MIN_PROFILE_BUDGET_S = 10.0
# How far past --budget-s a profile may end before the CLI warns (README: within +10%).
BUDGET_OVERRUN = 1.1


def check_budget(budget_s: float) -> None:
    """UsageProblem unless ``budget_s`` is a finite number of seconds a profile can keep to."""
    if not (0 < budget_s < math.inf):  # nan fails both comparisons
        raise UsageProblem(f"--budget-s must be a positive number of seconds, got {budget_s}")
    if budget_s < MIN_PROFILE_BUDGET_S:
        raise UsageProblem(
            f"--budget-s {budget_s:g} is too short for a profile: the device benchmarks and "
            f"its first real steps take longer whatever the budget; give --budget-s "
            f"{MIN_PROFILE_BUDGET_S:g} or more (default {DEFAULT_PROFILE_BUDGET_S:g})"
        )


def over_budget(took_s: float, budget_s: float) -> str | None:
    """A warning when the profile ended past its budget and the 10% the README allows: what
    runs whatever the budget (the device benchmarks, a first real step, the baseline's
    timing child) took longer on this host than the budget gave, and the budget that gives
    them room; else None."""
    if took_s <= budget_s * BUDGET_OVERRUN:
        return None
    return (
        f"warning: this profile took {took_s:.0f} s, past its --budget-s {budget_s:g} (and "
        f"the {BUDGET_OVERRUN - 1:.0%} it may run over): the device benchmarks, a first real "
        "step and the baseline's timing run whatever the budget, and took longer here; give "
        f"--budget-s {math.ceil(took_s)} or more to leave them room"
    )


def check_out(out: Path) -> None:
    """Raise the OSError that writing ``out`` (a directory, created with its parents) would
    raise later, without creating anything: a file in its way or above it, or an existing
    ancestor this process cannot write (checked before any probe: the CLI names the path
    and the fix in one line)."""
    import errno
    import os

    if out.exists() and not out.is_dir():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(out))
    ancestor = out
    while not ancestor.exists():
        if ancestor.is_symlink():  # a dangling link: mkdir would fail on it
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(ancestor))
        ancestor = ancestor.parent
    if not ancestor.is_dir():  # a file above --out
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(ancestor))
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(ancestor))


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
    ``request.budget_s`` counts from ``request.started_at`` (when the command started, before
    it imported torch to parse the model's arguments), else from this call: importing torch
    and reading the model's facts (seconds for a 70B model) are part of it."""
    started = time.perf_counter() if request.started_at is None else request.started_at
    check_budget(request.budget_s)
    # An --out that cannot hold the files fails now (a file in its way, no permission: one
    # line from the CLI), before the model is built, not after the whole
    # budget of probes; nothing is created yet, so a bad model spec leaves no empty directory.
    check_out(out)
    from advisor.data import resolve_data
    from advisor.trainer.loop import check_shapes
    from advisor.workload import AdvisorWorkload
    from profilers.profiler import ProfileInterrupted, ProfileOptions, run_profile
    from strategies.config import TrainConfig

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
        need_val=False,  # a profile never evaluates: a --val-data run has no val split here
    )
    check_shapes(
        TrainConfig(model=request.model, data=request.data, seq_len=request.seq_len), facts, source
    )
    options = ProfileOptions(
        seq_len=request.seq_len,
        device=device,
        budget_s=request.budget_s,
        # each once (--precision fp32 --precision fp32 traced every fp32 group twice)
        precisions=tuple(dict.fromkeys(request.precisions)) if request.precisions else None,
        checkpointing=profiled_settings(request.checkpointing, facts),
        comm=request.comm,
        trace_for=request.trace_for,
        tool={"advisor": __version__, "data": source.description},
        started_at=started,
    )
    out.mkdir(parents=True, exist_ok=True)
    try:
        result = run_profile(workload, options, progress)
    except ProfileInterrupted as exc:  # Ctrl-C: what was measured is kept, then it goes on
        exc.profile.save(out)
        exc.saved_to = out
        raise
    result.save(out)
    return result
