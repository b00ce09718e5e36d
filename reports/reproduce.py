"""Reproduce: the exact commands (single node and torchrun) and the versions behind the numbers."""

from __future__ import annotations

import json
import platform
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from reports.common import mapping
from reports.fmt import num
from reports.model import CodeBlock, Section, Table, cell
from reports.runfiles import RunFiles

CHARTJS_VERSION = "4.6.1"
CHARTJS_ZOOM_VERSION = "2.2.0"


@dataclass(frozen=True, kw_only=True, slots=True)
class Commands:
    run: str  # the whole job again
    steps: tuple[str, ...]  # profile, recommend, train
    train_flags: str  # the plan's config as explicit flags (no plan file needed)
    torchrun: tuple[str, ...]


def model_flags(model: Any, model_args: Mapping[str, Any]) -> list[str]:
    out = ["--model", str(model)]
    for key, value in model_args.items():
        literal = value if isinstance(value, str) else json.dumps(value)
        out += ["--model-arg", f"{key}={literal}"]
    return out


def _workload(run: RunFiles) -> dict[str, Any]:
    """model, model_args, data, tokenizer, seq_len: from the profile, else the plan, else the
    training run's config."""
    sources = [
        mapping(mapping(run.profile).get("workload")),
        mapping(mapping(run.plan).get("config")),
        mapping(mapping(run.train_config).get("config")),
    ]
    out: dict[str, Any] = {}
    for key in ("model", "model_args", "data", "tokenizer", "seq_len"):
        for source in sources:
            if source.get(key) is not None:
                out[key] = source[key]
                break
    return out


def commands(run: RunFiles) -> Commands:
    root = str(run.root)
    plan_path = str(run.root / "plan.json")
    train_dir = str(run.train_dir or run.root / "train")
    w = _workload(run)
    flags = model_flags(w.get("model", "gpt-tiny"), mapping(w.get("model_args")))
    if w.get("data") not in (None, "stdlib"):
        flags += ["--data", str(w["data"])]
    if w.get("tokenizer"):
        flags += ["--tokenizer", str(w["tokenizer"])]
    if w.get("seq_len") is not None:
        flags += ["--seq-len", str(w["seq_len"])]
    plan = mapping(run.plan)
    config = mapping(plan.get("config")) or mapping(mapping(run.train_config).get("config"))
    request = mapping(mapping(plan.get("profile")).get("request"))
    total = num(mapping(run.train_config).get("total_steps"))
    info = mapping(run.run_info)
    steps = ["--steps", str(int(total if total is not None else info.get("steps") or 300))]
    budget = num(mapping(run.profile).get("budget_s"))
    gbs = config.get("global_batch_size") or request.get("global_batch_size") or 8
    recorded = info.get("command")
    if isinstance(recorded, list) and recorded:
        whole = shlex.join([str(a) for a in recorded])
    else:
        whole = shlex.join(
            ["advisor", "run", *flags, "--global-batch-size", str(gbs), *steps, "--out", root]
        )
    profile_cmd = ["advisor", "profile", *flags]
    if budget:
        profile_cmd += ["--budget-s", f"{budget:g}"]
    recommend_cmd = ["advisor", "recommend", "--profile", str(run.root / "profile.json")]
    recommend_cmd += ["--global-batch-size", str(gbs)]
    if num(request.get("memory_budget")) not in (None, 0.9):
        recommend_cmd += ["--memory-budget", f"{request['memory_budget']:g}"]
    if request.get("world_size"):
        recommend_cmd += ["--world-size", str(request["world_size"])]
    train_cmd = ["advisor", "train", "--plan", plan_path, *steps, "--out", train_dir]
    explicit = ["advisor", "train", *flags]
    for key in (
        "global_batch_size",
        "micro_batch_size",
        "grad_accum_steps",
        "precision",
        "activation_checkpointing",
        "parallelism",
        "world_size",
        "lr",
        "min_lr",
        "warmup_steps",
        "weight_decay",
        "grad_clip",
        "seed",
        "num_workers",
    ):
        if config.get(key) is not None:
            value = config[key]
            explicit += [
                "--" + key.replace("_", "-"),
                f"{value:g}" if isinstance(value, float) else str(value),
            ]
    explicit += [*steps, "--out", train_dir]
    world = int(num(config.get("world_size")) or 1)
    tail = ["-m", "advisor", "train", "--plan", plan_path, *steps, "--out", train_dir]
    torchrun = [shlex.join(["torchrun", "--standalone", f"--nproc-per-node={world}", *tail])]
    if world > 1 and world % 2 == 0:
        torchrun.append(
            shlex.join(
                [
                    "torchrun",
                    "--nnodes=2",
                    f"--nproc-per-node={world // 2}",
                    "--rdzv-backend=c10d",
                    "--rdzv-endpoint=NODE0_HOST:29500",
                    "--rdzv-id=advisor",
                    "--node-rank=R",
                    *tail,
                ]
            )
        )
    return Commands(
        run=whole,
        steps=(
            shlex.join([*profile_cmd, "--out", root]),
            shlex.join([*recommend_cmd, "--out", root]),
            shlex.join(train_cmd),
        ),
        train_flags=shlex.join(explicit),
        torchrun=tuple(torchrun),
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
    blocks = [
        CodeBlock(title="The whole job again (profile → recommend → train → report)", text=c.run),
        CodeBlock(title="Step by step", text="\n".join(c.steps)),
    ]
    if has_plan or run.train_config:
        blocks.append(
            CodeBlock(
                title="Train the recommended config with explicit flags (no plan file needed)",
                text=c.train_flags,
            )
        )
    if has_plan:
        blocks.append(
            CodeBlock(
                title="Through torchrun (single node"
                + (", then each of two nodes)" if len(c.torchrun) > 1 else ")"),
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
