"""``recommend``: from a profile to a validated plan (the library behind ``advisor recommend``).

    profile.json → cost model → search space → Optuna study (ask/tell, resumable) → top-K
    validated by short real runs → plan.json + trials.csv

The search and the decision are pure (strategies); what needs the device is the validation,
done here by pluggable :class:`advisor.validation.Validator`s. A what-if plan (``--target``) is
never validated: its numbers are estimates for hardware that is not here.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from advisor.errors import UsageProblem
from advisor.validation import (
    LauncherValidator,
    LocalValidator,
    Validator,
    validate_rounds,
)
from profilers.profile_record import Profile, interrupted_probes, load_profile
from profilers.rundir import RunDir, profile_path
from strategies.budgets import DEFAULT_VALIDATE_ROUNDS, DEFAULT_VALIDATE_TOP_K
from strategies.config import DEFAULT_STEPS, ConfigError, TrainConfig
from strategies.cost import CostModel, Prediction, cost_model_from_profile
from strategies.errors import StrategyError
from strategies.plan import (
    Baseline,
    Measurement,
    Plan,
    decide,
    naive_baseline,
    replacement,
    top_candidates,
)
from strategies.plan_records import write_unplanned_trials_csv
from strategies.search import SearchResult, default_storage, run_search, study_name_for
from strategies.space import SearchRequest, SearchSpace, build_space
from strategies.whatif import resolve_target, whatif_cost_model


def read_profile(profile: str | Path | Profile) -> Profile:
    """A Profile, or a UsageProblem naming the fix (missing, not JSON, wrong version)."""
    if isinstance(profile, Profile):
        return profile
    try:
        return load_profile(profile)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None


def profile_digest(profile: str | Path | Profile) -> str:
    """Identity of a profile's content: a re-profiled device gets a new study, the same file
    the same study (its bytes, so that a newer advisor reading it differently still resumes)."""
    if not isinstance(profile, Profile):
        return hashlib.sha256(profile_path(profile).read_bytes()).hexdigest()
    text = json.dumps(profile.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _profiled_fields(profile: Profile) -> dict[str, Any]:
    """The TrainConfig keys the profile fixes: its model and sequence length. UsageProblem
    when the profile's workload does not name them as a profile writes them (a hand-edited
    or damaged file: a missing or non-numeric ``seq_len`` failed with a traceback)."""
    workload = profile.workload
    model, args, seq_len = (
        workload.get("model"),
        workload.get("model_args"),
        workload.get("seq_len"),
    )
    problem = None
    if not isinstance(model, str) or not model:
        problem = f"its workload names no model (model: {model!r})"
    elif args is not None and not isinstance(args, dict):
        problem = f"its workload's model_args is {args!r}, not an object"
    elif isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        problem = f"its workload's seq_len is {seq_len!r}, not a positive whole number"
    if problem is not None:
        raise UsageProblem(f"the profile is damaged ({problem}): re-run 'advisor profile'")
    return {"model": model, "model_args": dict(args or {}), "seq_len": seq_len}


def profiled_config(profile: Profile) -> TrainConfig:
    """The profiled model and sequence length at the defaults: what ``advisor predict``
    composes a config's flags onto."""
    return TrainConfig(**_profiled_fields(profile))


def base_config(profile: Profile, request: SearchRequest) -> TrainConfig:
    """The TrainConfig every candidate shares: the profiled workload + the request's keys."""
    workload = profile.workload
    fields: dict[str, Any] = {
        **_profiled_fields(profile),
        "global_batch_size": request.global_batch_size,
        "micro_batch_size": request.global_batch_size,
    }
    if workload.get("data"):
        fields["data"] = workload["data"]
    if workload.get("tokenizer"):
        fields["tokenizer"] = workload["tokenizer"]
    fields.update(request.config_overrides)
    try:
        return TrainConfig(**fields)
    except (ConfigError, TypeError) as exc:
        raise UsageProblem(f"the profile's workload is not a valid config: {exc}") from None


def cost_model_for(profile: Profile, request: SearchRequest) -> tuple[CostModel, str]:
    """(the cost model, its estimate label or ""): measured, or a what-if for ``--target``."""
    if request.target is not None:
        return whatif_cost_model(profile, request)
    return cost_model_from_profile(profile, request.memory_budget, run_steps=request.run_steps), ""


def validation_device(profile: Profile, device: str = "auto") -> str:
    """The device validation runs on: the profiled one (``auto``), or ``device`` when it is
    that kind. UsageProblem for another kind, before the search: a CPU profile with
    ``--device cuda`` on a host without a GPU was planned unvalidated, "the profiled device
    (cuda) is not available here", exit 0."""
    wanted = profile.device.kind if device == "auto" else device
    if not wanted.startswith("cuda") and wanted != "cpu":
        raise UsageProblem(f"unknown --device {device!r}: use auto, cpu or cuda")
    if wanted.split(":")[0] != profile.device.kind:
        raise UsageProblem(
            f"the profile was measured on {profile.device.kind}, not {wanted}: validate on the "
            "profiled device (--device auto) or profile this one first"
        )
    return wanted


def default_validators(
    profile: Profile,
    model: CostModel,
    *,
    device: str = "auto",
    progress: Callable[[str], None] | None = None,
) -> list[Validator]:
    """The local single-device validator on the profiled device, when this machine has it."""
    wanted = validation_device(profile, device)
    if wanted.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            from advisor.validation import Unvalidated

            return [Unvalidated(reason="the profiled device (cuda) is not available here")]
    if wanted.startswith("cuda"):
        import torch

        max_world = torch.cuda.device_count()
    else:
        max_world = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    return [
        LocalValidator(device=wanted, budget_bytes=model.budget_bytes, progress=progress),
        LauncherValidator(
            device=wanted,
            max_world_size=max_world,
            fixed_overhead_bytes=profile.memory_overhead.fixed_bytes,
            parallel_overhead_bytes=dict(profile.memory_overhead.parallel_bytes),
            budget_bytes=model.budget_bytes,
            progress=progress,
        ),
    ]


def recommend(
    profile: str | Path | Profile,
    request: SearchRequest,
    *,
    validate_top_k: int = DEFAULT_VALIDATE_TOP_K,
    validation_rounds: int = DEFAULT_VALIDATE_ROUNDS,
    storage: str | None = None,
    out: Path | None = None,
    device: str = "auto",
    validators: Sequence[Validator] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """Search the config space of ``profile`` for ``request`` and return the plan.

    ``storage``: an Optuna RDB URL; default ``sqlite:///OUT/study.db`` (``out`` is then
    required). Re-running the same call resumes the study. ``validate_top_k``: how many of
    the best predicted candidates to measure (0: none); the baseline is measured too when it
    fits, and the best of a layout the top K left out when it is close
    (strategies.plan.top_candidates). ``validation_rounds``: how many times the close
    contenders (within advisor.validation.TIE_MARGIN of the fastest) are measured, at
    different moments, before the fastest wins (1: every finalist once). ``validators``: default
    :func:`default_validators`. With ``out`` the plan is saved there (plan.json, trials.csv).
    Raises strategies' errors (NothingFits ...) and UsageProblem for bad input.
    """
    say = progress or (lambda _m: None)
    if validate_top_k < 0:
        raise UsageProblem(f"--validate-top must be 0 or more, got {validate_top_k}")
    if validation_rounds < 1:
        raise UsageProblem(f"--validate-rounds must be 1 or more, got {validation_rounds}")
    prof = read_profile(profile)
    if out is not None:  # an --out that cannot hold the plan fails now, not after the search
        out.mkdir(parents=True, exist_ok=True)
    if cut := interrupted_probes(prof.probes):
        say(
            f"note: Ctrl-C stopped this profile before it finished ({cut} probes cut short): "
            "the plan is from what it measured; 'advisor profile' again measures everything"
        )
    base = base_config(prof, request)
    if validators is None and validate_top_k and request.target is None:
        validation_device(prof, device)  # a device validation cannot use fails now
    target = resolve_target(request)[0] if request.target is not None else None
    model, label = cost_model_for(prof, request)
    space = build_space(prof, request, target=target)
    result = _search(profile, request, model, space, storage=storage, out=out, progress=say)
    baseline = naive_baseline(model, request.global_batch_size)
    measurements = _validate_finalists(
        prof,
        model,
        base,
        result,
        baseline,
        top_k=validate_top_k,
        rounds=validation_rounds,
        validators=validators,
        device=device,
        progress=say,
    )
    try:
        plan = decide(
            base=base,
            model=model,
            space=space,
            result=result,
            measurements=measurements,
            baseline=baseline,
            label=label,
            profile_info=_profile_info(profile, prof, request),
        )
    except StrategyError:
        if out is not None:  # no plan: trials.csv still says why each candidate was dropped
            write_unplanned_trials_csv(
                RunDir(out).trials, result.evaluations, estimate=model.machine.estimate
            )
        raise
    if out is not None:
        plan.save(out)
    return plan


def _search(
    profile: str | Path | Profile,
    request: SearchRequest,
    model: CostModel,
    space: SearchSpace,
    *,
    storage: str | None,
    out: Path | None,
    progress: Callable[[str], None],
) -> SearchResult:
    """The search step of :func:`recommend`: the study at ``storage`` (default
    ``sqlite:///OUT/study.db``), named after the profile and the request unless named."""
    if storage is None:
        if out is None:
            raise UsageProblem("pass --out DIR (for DIR/study.db) or --storage URL")
        out.mkdir(parents=True, exist_ok=True)
        storage = default_storage(out)
    name = request.study_name or study_name_for(profile_digest(profile), space, model)
    result = run_search(
        space,
        model,
        storage=storage,
        study_name=name,
        trials=request.trials,
        seed=request.seed,
        progress=progress,
    )
    progress(f"search: {result.mode} of {result.space_size} candidates in {result.wall_s:.1f} s")
    return result


def _validate_finalists(
    prof: Profile,
    model: CostModel,
    base: TrainConfig,
    result: SearchResult,
    baseline: Baseline,
    *,
    top_k: int,
    rounds: int,
    validators: Sequence[Validator] | None,
    device: str,
    progress: Callable[[str], None],
) -> dict[str, Measurement]:
    """The validation step of :func:`recommend`: the finalists (strategies.plan.top_candidates,
    and the baseline) measured through :func:`validate_rounds`, keyed by candidate key; none
    when ``top_k`` is 0 or the model is a what-if estimate. A finalist whose first visit fails
    (out of memory, crashed, timed out) is replaced by the next ranked candidate not measured
    (after running out of memory, one predicted to need less: strategies.plan.replacement), at
    most ``top_k`` replacements in all, so a wrong memory prediction near the budget does not
    leave the decision to fewer measured configs."""
    measurements: dict[str, Measurement] = {}
    top = top_candidates(result, top_k)
    if top and top_k and not model.machine.estimate:
        chosen = list(top)
        if baseline.candidate and all(e.candidate.key != baseline.candidate.key for e in chosen):
            from strategies.search import evaluate

            chosen.append(evaluate(model, baseline.candidate))
        configs = [e.candidate.apply(base) for e in chosen]
        predictions = [e.prediction for e in chosen if e.prediction is not None]
        if validators is None:
            validators = default_validators(prof, model, device=device, progress=progress)
        # A finalist (or a replacement) whose visit failed is replaced, at most top_k times
        # in all (strategies.plan.replacement); the baseline is measured as it is.
        finalists = {e.candidate.key for e in top}
        ranked = result.ranked()
        first = len(chosen)

        def replace(i: int, m: Measurement) -> tuple[TrainConfig, Prediction] | None:
            failed = chosen[i]
            if failed.candidate.key not in finalists or len(chosen) - first >= top_k:
                return None
            taken = {e.candidate.key for e in chosen}
            instead = replacement(ranked, failed, m.status, taken)
            if instead is None or instead.prediction is None:
                return None
            chosen.append(instead)
            finalists.add(instead.candidate.key)
            return instead.candidate.apply(base), instead.prediction

        measured = validate_rounds(
            configs, predictions, validators, rounds=rounds, progress=progress, replace=replace
        )
        for e, m in zip(chosen, measured, strict=True):
            measurements[e.candidate.key] = m
    return measurements


def _profile_info(
    profile: str | Path | Profile, prof: Profile, request: SearchRequest
) -> dict[str, Any]:
    """What plan.json records of the profile and the request."""
    return {
        "path": str(profile) if not isinstance(profile, Profile) else "",
        "device": prof.device.name,
        "created": prof.created,
        "request": request.to_dict(),
    }


def predict_config(
    profile: str | Path | Profile,
    config: TrainConfig,
    *,
    memory_budget: float = 0.9,
    target: str | None = None,
    nodes: int = 1,
    network: str | None = None,
    steps: int | None = None,
) -> tuple[Prediction, str]:
    """(what ``config`` would cost, the cost model's label): :func:`predict`'s record."""
    prof = read_profile(profile)
    # A setting this model cannot run (blocks:L, which is 'full'; no repeated blocks) says so,
    # not that the profile lacks a fit a larger budget would add.
    problem = prof.model.checkpointing_problem(config.activation_checkpointing)
    if problem is not None:
        raise UsageProblem(problem)
    request = SearchRequest(
        global_batch_size=config.global_batch_size,
        memory_budget=memory_budget,
        world_size=config.world_size,
        target=target,
        nodes=nodes,
        network=network,
        run_steps=steps if steps is not None else DEFAULT_STEPS,
    )
    model, label = cost_model_for(prof, request)
    return model.predict_config(config), label


def predict(profile: str | Path | Profile, config: TrainConfig, **options: Any) -> dict[str, Any]:
    """What ``config`` would cost on the profiled device (or, with ``target``, an estimate):
    :func:`predict_config`'s record as ``advisor predict`` prints it; ``options`` are its
    keywords (``memory_budget``, ``target``, ``nodes``, ``network``, ``steps``: the run's
    length, over which a compiled config's compile time is amortised).

    Returns ``{"config", "predicted": {peak_memory_bytes, step_time_s, tokens_per_s,
    step_time_s_interval, tokens_per_s_interval (90%), uncertainty, fits, breakdown ...},
    "estimate", "label"}``. Raises strategies' Unpredictable when the profile
    lacks a measurement the config needs.
    """
    prediction, label = predict_config(profile, config, **options)
    return {
        "config": config.to_dict(),
        "predicted": prediction.to_dict(),
        "estimate": prediction.estimate,
        "label": label,
    }
