"""Reproduce: the exact commands (single node and torchrun) and the versions behind the numbers."""

from __future__ import annotations

import platform
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from profilers.defaults import DEFAULT_MEMORY_BUDGET
from profilers.rundir import PLAN, PROFILE, RunDir
from reports.common import mapping, setting_differences, whatif_target
from reports.fmt import count as fmt_count
from reports.fmt import num
from reports.model import CodeBlock, Section, Table, cell
from reports.runfiles import RunFiles
from strategies.budgets import DEFAULT_VALIDATE_ROUNDS, DEFAULT_VALIDATE_TOP_K
from strategies.commands import Command, torchrun_args, torchrun_command
from strategies.config import (
    CONFIG_FLAG_KEYS,
    DEFAULT_DATA,
    DEFAULT_GLOBAL_BATCH_SIZE,
    DEFAULT_MODEL,
    DEFAULT_STEPS,
    HYPERPARAMETER_KEYS,
    WORKLOAD_KEYS,
)
from strategies.restrict import only_args, read_recorded

CHARTJS_VERSION = "4.6.1"
CHARTJS_ZOOM_VERSION = "2.2.0"


@dataclass(frozen=True, kw_only=True, slots=True)
class Commands:
    run: str  # the whole job again
    steps: tuple[str, ...]  # profile, recommend, (tune,) train
    train_flags: str  # the plan's config as explicit flags (no plan file needed)
    torchrun: tuple[str, ...]
    tune: str = ""  # advisor tune's command, when the run has a study
    world_size: int = 1
    # What trained, as explicit flags, when the training run overrode the plan's settings
    # (``overrides``: "lr 1e+30 (the plan's 0.001)" ...)
    trained_flags: str = ""
    overrides: tuple[str, ...] = ()
    target: str = ""  # a what-if plan's hardware ("8× NVIDIA H100 SXM5 80GB"), else ""
    nodes: int = 1  # the machines a what-if plan spreads its ranks over


def _workload(run: RunFiles) -> dict[str, Any]:
    """model, model_args, data, tokenizer, seq_len: from the profile, else the plan, else the
    training run's config."""
    sources = [
        mapping(mapping(run.profile).get("workload")),
        mapping(mapping(run.plan).get("config")),
        mapping(mapping(run.train_config).get("config")),
    ]
    out: dict[str, Any] = {}
    for key in WORKLOAD_KEYS:
        for source in sources:
            if source.get(key) is not None:
                out[key] = source[key]
                break
    return out


def _with_workload(name: str, w: Mapping[str, Any]) -> Command:
    """``advisor NAME`` with the workload's flags (what a profile measured)."""
    return (
        Command(name)
        .model(w.get("model", DEFAULT_MODEL), mapping(w.get("model_args")))
        .option("data", w.get("data"), default=DEFAULT_DATA)
        .option("tokenizer", w.get("tokenizer") or None)
        .option("seq_len", w.get("seq_len"))
    )


def _torchrun(world: int, train_args: list[str], nodes: int = 1) -> tuple[str, ...]:
    """The training launched by hand: one node, and two nodes when the ranks split evenly; a
    plan over ``nodes`` machines (a what-if's --nodes) on those machines only."""
    if nodes > 1 and world % nodes == 0:
        spread = torchrun_args(
            world // nodes, nnodes=nodes, node_rank=None, rdzv_endpoint="NODE0_HOST:29500"
        )
        return (torchrun_command(spread, train_args),)
    out = [torchrun_command(torchrun_args(world), train_args)]
    if world > 1 and world % 2 == 0:
        two_nodes = torchrun_args(
            world // 2, nnodes=2, node_rank=None, rdzv_endpoint="NODE0_HOST:29500"
        )
        out.append(torchrun_command(two_nodes, train_args))
    return tuple(out)


def _where(run: RunFiles) -> tuple[Path, Path]:
    """(the profile file, the plan's directory) the step-by-step commands use: this run's own,
    or, for a plan or study made away from them, the files the plan and the study name. Until
    2026-12-07 a tune directory's page told 'advisor recommend --profile RUN/profile.json', a
    file that did not exist (audit 41, D11a)."""
    files = RunDir(run.root)
    profile = files.profile
    recorded = Path(str(mapping(mapping(run.plan).get("profile")).get("path") or ""))
    if not profile.is_file() and str(recorded) not in ("", "."):
        found = next((p for p in (recorded, recorded / PROFILE) if p.is_file()), None)
        if found is not None and run.profile is not None:
            profile = found
    plan_dir = run.root
    studied = str(mapping(run.tuning).get("plan") or "")
    if not files.plan.is_file() and studied and Path(studied).is_file():
        plan_dir = Path(studied).parent
    return profile, plan_dir


def commands(run: RunFiles) -> Commands:
    files = RunDir(run.root)
    train_dir = run.train_dir or files.train.root
    w = _workload(run)
    plan = mapping(run.plan)
    tuned = mapping(run.tuned_plan)
    planned = mapping(tuned.get("config")) or mapping(plan.get("config"))
    trained = mapping(mapping(run.train_config).get("config"))
    config = planned or trained
    info = mapping(run.run_info)
    asked = mapping(info.get("request"))
    # What the search was asked: the plan's record, else (recommend failed or never ran)
    # what advisor run was asked (the steps dropped a failed run's --memory-budget 0.0001).
    request = mapping(mapping(plan.get("profile")).get("request")) or asked
    profile_file, plan_dir = _where(run)
    total = num(mapping(run.train_config).get("total_steps"))
    steps = int(total if total is not None else info.get("steps") or DEFAULT_STEPS)
    gbs = config.get("global_batch_size") or request.get("global_batch_size")
    gbs = gbs or DEFAULT_GLOBAL_BATCH_SIZE
    recorded = info.get("command")
    target = whatif_target(plan)
    nodes = int(num(request.get("nodes")) or 1) if target else 1
    if isinstance(recorded, list) and recorded:
        whole = shlex.join([str(a) for a in recorded])
    else:
        whole = (
            _with_workload("run", w)
            .option("global_batch_size", gbs)
            .option("steps", steps)
            # a run directory tuned by hand (advisor tune): the whole job tunes too
            .option("tune_trials", mapping(run.tuning).get("trials_asked") or None)
            .option("out", run.root)
            .shell()
        )
    budget = num(mapping(run.profile).get("budget_s"))
    # What advisor run asked for (run.json), else what the profile recorded: the settings the
    # profile measured (the step-by-step profile dropped --checkpointing ops-half, and so did
    # not measure it again) and how the plan was validated.
    precisions = asked.get("precisions") or mapping(run.profile).get("precisions") or ()
    # A profile traced for a GPU on this CPU (--trace-for cuda, what a what-if wants): the
    # line without it traces for the CPU, and the plan it makes prices other memory.
    fits = mapping(mapping(run.profile).get("fits")).get("memory") or ()
    traced_for = {str(mapping(m).get("target_device_type") or "") for m in fits}
    device_kind = str(mapping(mapping(run.profile).get("device")).get("kind") or "")
    trace_for = "cuda" if "cuda" in traced_for and device_kind != "cuda" else None
    profile = (
        _with_workload("profile", w)
        .option("budget_s", budget or None)
        .option("trace_for", trace_for)
        .repeated("precision", [str(p) for p in precisions])
        .repeated("checkpointing", [str(c) for c in asked.get("checkpointing") or ()])
        .option("comm", asked.get("comm"), default=True)
    )
    recommend = (
        Command("recommend")
        .option("profile", profile_file)
        .option("global_batch_size", gbs)
        .option("memory_budget", num(request.get("memory_budget")), default=DEFAULT_MEMORY_BUDGET)
        .option("world_size", request.get("world_size") or None)
        # The run length a compiled candidate's compile was amortised over (absent: default).
        .option("steps", request.get("run_steps"), default=DEFAULT_STEPS)
        .repeated("only", only_args(read_recorded(request.get("only")) or {}))
        .option("validate_top", asked.get("validate_top"), default=DEFAULT_VALIDATE_TOP_K)
        .option("validate_rounds", asked.get("validate_rounds"), default=DEFAULT_VALIDATE_ROUNDS)
        # A what-if's hardware: without it the line planned for this host (audit 42).
        .option("target", request.get("target") or None)
        .option("nodes", request.get("nodes"), default=1)
        .option("network", request.get("network") or None)
    )
    recorded_tune = mapping(run.tuning).get("command")
    tune = ""
    if isinstance(recorded_tune, list) and recorded_tune:
        tune = shlex.join([str(a) for a in recorded_tune])
    elif run.tuning is not None:
        tune = Command("tune").option("plan", files.plan).option("out", run.root).shell()
    plan_file = files.tuned_plan if run.tuned_plan is not None else plan_dir / PLAN
    # The run's evaluation and checkpoint cadence (train_config.json keeps them since
    # 2026-12-06): without them a re-run logged other evals.
    kept = mapping(mapping(run.train_config).get("options"))
    explicit = (
        _with_workload("train", w)
        .options(config, keys=[k for k in CONFIG_FLAG_KEYS if k != "seq_len"])
        .option("steps", steps)
    )
    # What trained, when it was not the plan ('advisor train --plan P --lr X'): until
    # 2026-12-07 only the plan's values were given as the run's exact commands (audit 41, D3).
    overrides = setting_differences(planned, trained) if planned and trained else ()
    as_trained = (
        _with_workload("train", {k: trained[k] for k in WORKLOAD_KEYS if k in trained} or w)
        .options(trained, keys=[k for k in CONFIG_FLAG_KEYS if k != "seq_len"])
        .option("steps", steps)
        if overrides
        else None
    )
    # Profile and plan only (or a failed recommend): the plan the step before writes.
    planned_run = bool(plan or run.tuned_plan is not None or not trained)
    train = Command("train").option("plan", plan_file) if planned_run else explicit
    if planned_run:
        # The hyper-parameters the run was given on top of its plan, as it was given them.
        for key in HYPERPARAMETER_KEYS:
            if trained and key in trained and planned.get(key) != trained.get(key):
                train.option(key, trained[key])
        train.option("steps", steps)
    for command in (train,) if train is explicit else (train, explicit, as_trained):
        if command is None:
            continue
        for key in ("eval_every", "checkpoint_every", "eval_batches", "val_data"):
            command.option(key, kept.get(key))
        command.option("out", train_dir)
    # A training run alone (advisor train --model ... --out): its own command is the recipe;
    # a profile and a plan it never read are no steps of it (audit 41, D11f).
    alone = not planned_run and run.profile is None
    profile_line = profile.option("out", profile_file.parent).shell()
    recommend_line = recommend.option("out", plan_dir).shell()
    train_line = train.shell()
    if nodes > 1:
        # one line a node, as advisor train takes a multi-node job (R: the node's rank)
        train_line += " " + shlex.join(
            ["--nnodes", str(nodes), "--node-rank", "R", "--rdzv-endpoint", "NODE0_HOST:29500"]
        )
    if target:
        # advisor run plans for this host: a what-if is its profile and recommend --target.
        whole = profile_line + "\n" + recommend_line
    return Commands(
        run=whole,
        steps=(train.shell(),)
        if alone
        else (
            profile_line,
            recommend_line,
            *((tune,) if tune else ()),
            train_line,
        ),
        train_flags=explicit.shell(),
        torchrun=_torchrun(int(num(config.get("world_size")) or 1), train.args(), nodes),
        tune=tune,
        target=target,
        nodes=nodes,
        world_size=int(num(config.get("world_size")) or 1),
        trained_flags=as_trained.shell() if as_trained is not None else "",
        overrides=overrides,
    )


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions(run: RunFiles) -> dict[str, str]:
    """What produced the numbers (the profile's record), then what rendered the page."""
    out = {str(k): str(v) for k, v in mapping(mapping(run.profile).get("tool")).items()}
    train_device = mapping(run.train_config).get("device")
    if train_device:
        out["training device"] = str(train_device)
    out["report: transformer-advisor"] = _version("transformer-advisor")
    out["report: jinja2"] = _version("jinja2")
    out["report: Chart.js"] = f"{CHARTJS_VERSION} (+ chartjs-plugin-zoom {CHARTJS_ZOOM_VERSION})"
    out["report: python"] = platform.python_version()
    return out


def reproduce_section(run: RunFiles) -> tuple[Section, Commands]:
    c = commands(run)
    has_plan = run.plan is not None
    study = mapping(run.tuning)
    whole_hint = ""
    if run.run_info is None and study.get("steps_per_trial"):
        # advisor run --tune-trials gives each trial the training's length (audit 41, D11d)
        whole_hint = (
            "advisor run gives each tuning trial the training's length; this study's trials "
            f"were {study['steps_per_trial']} steps ({fmt_count(study.get('tokens_per_trial'))} "
            "tokens): the 'advisor tune' line of Step by step repeats the study as it ran."
        )
    whole_title = (
        "The whole job again (profile → recommend → "
        + ("tune → " if c.tune else "")
        + "train → report)"
    )
    if c.target:
        whole_title = (
            f"The what-if again: profile this host, then plan for {c.target} (advisor run "
            "plans for the host it runs on)"
        )
    blocks = [
        CodeBlock(title=whole_title, text=c.run, hint=whole_hint),
        CodeBlock(
            title="Step by step",
            text="\n".join(c.steps),
            # 'advisor profile --out' into a finished run replaces its profile (it is not
            # refused, as this hint said until 2026-12-07), orphaning the plan.
            hint="Each writes where this run did, over its files ('advisor profile' replaces "
            "the profile its plan was made from): give each a new --out, and the next its "
            "new paths, to keep this run."
            + (
                f" The train line is for {c.target}: run it there (on this host it trains "
                "the same layout at this host's speed)."
                if c.target
                else ""
            ),
        ),
    ]
    if (has_plan or run.train_config) and c.steps != (c.train_flags,):
        title = (
            "Train the recommended config with explicit flags (no plan file needed)"
            if has_plan
            else "Train what this run trained with explicit flags"
        )
        blocks.append(CodeBlock(title=title, text=c.train_flags))
    if c.trained_flags:
        blocks.append(
            CodeBlock(
                title="Train what this run trained (the plan with the training's own "
                "settings) with explicit flags",
                text=c.trained_flags,
                hint="The training run was given other settings than the plan's: "
                + "; ".join(c.overrides)
                + ". The Step by step train line gives them too.",
            )
        )
    if has_plan or c.world_size > 1:  # a ddp/fsdp run trained without a plan too
        launch = "single node" + (", then each of two nodes" if len(c.torchrun) > 1 else "")
        if c.nodes > 1:
            launch = f"the same line on each of the plan's {c.nodes} nodes"
        blocks.append(
            CodeBlock(
                title=f"Through torchrun ({launch})",
                text="\n".join(c.torchrun),
                hint="advisor train launches torchrun itself for ddp/fsdp plans; these are the "
                "same jobs launched by hand.",
            )
        )
    blocks.append(
        CodeBlock(
            title="Re-render this page from the run files",
            text=shlex.join(["advisor", "report", str(run.root)]),
        )
    )
    table = Table(
        columns=("tool", "version"),
        rows=tuple((cell(k), cell(v)) for k, v in versions(run).items()),
    )
    return Section(id="reproduce", title="Reproduce", code=tuple(blocks), tables=(table,)), c
