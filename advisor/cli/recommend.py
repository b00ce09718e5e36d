"""``advisor recommend``: search the config space of a profile and write a validated plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from advisor.cli.options import POSITIVE, budget_option, validation_options

GiB = 2**30


def whatif_options(f: Any) -> Any:
    """--target / --nodes / --network: plan for hardware you don't have (estimates)."""
    f = click.option(
        "--network",
        default=None,
        help="With --nodes > 1: the inter-node network (profilers.hardware.NETWORKS key, "
        "default ib-ndr-400).",
    )(f)
    f = click.option(
        "--nodes",
        type=POSITIVE,
        default=1,
        show_default=True,
        help="With --target: machines the world size is spread over.",
    )(f)
    f = click.option(
        "--target",
        default=None,
        help="What-if: plan for this device from the datasheet table (e.g. h100-80gb, "
        "a100-80gb) instead of the profiled one; results are labelled estimates.",
    )(f)
    return f


@click.command()
@click.option(
    "--profile",
    "profile_path",
    required=True,
    type=click.Path(path_type=Path),
    help="profile.json from 'advisor profile' (or its directory).",
)
@click.option(
    "--global-batch-size",
    type=POSITIVE,
    required=True,
    help="Sequences per optimizer step, held fixed: micro x accumulation x world size.",
)
@budget_option
@click.option(
    "--world-size",
    type=POSITIVE,
    default=None,
    help="Most ranks to consider (default: the devices the profile saw; 1 on CPU). With "
    "--target: exactly this many.",
)
@click.option(
    "--trials",
    type=POSITIVE,
    default=None,
    help="Trial budget of a sampled search (default 128); smaller spaces are enumerated.",
)
@validation_options
@click.option(
    "--storage",
    default=None,
    help="Optuna storage URL shared by several workers (e.g. postgresql+psycopg2://...); "
    "default sqlite:///OUT/study.db.",
)
@click.option(
    "--study-name",
    default=None,
    help="Study name (default: derived from the profile and the request, so a re-run resumes).",
)
@whatif_options
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Where plan.json, trials.csv and study.db go (default: the profile's directory).",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="Where validation runs (auto: the profiled device).",
)
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
def recommend(**params: Any) -> None:
    """Pick the fastest config that fits at a fixed global batch: cost model + Optuna search,
    top-K validated by real runs; writes plan.json and trials.csv."""
    from advisor.errors import UsageProblem
    from advisor.recommend import recommend as run_recommend
    from strategies.errors import StrategyError
    from strategies.space import SearchRequest

    profile: Path = params["profile_path"]
    out = params["out"] or (profile if profile.is_dir() else profile.parent)
    if params["target"] is None and (params["nodes"] != 1 or params["network"]):
        raise click.UsageError("--nodes and --network plan for other hardware: add --target")

    def progress(message: str) -> None:
        if not params["quiet"]:
            click.echo(message, err=True)

    try:
        request = SearchRequest(
            global_batch_size=params["global_batch_size"],
            memory_budget=params["memory_budget"],
            world_size=params["world_size"],
            trials=params["trials"],
            target=params["target"],
            nodes=params["nodes"],
            network=params["network"],
            study_name=params["study_name"],
        )
        plan = run_recommend(
            profile,
            request,
            validate_top_k=params["validate_top"],
            validation_rounds=params["validate_rounds"],
            storage=params["storage"],
            out=out,
            device=params["device"],
            progress=progress,
        )
    except StrategyError as exc:
        raise UsageProblem(str(exc)) from None
    print_plan(plan, out)


def print_plan(plan: Any, out: Path) -> None:
    """A short table of the best candidates, the baseline, and the command that trains it."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if plan.estimate:
        click.echo(plan.label)
    measured = {v.candidate.key: v.measured for v in plan.validated}
    table = Table(
        title=f"best of {plan.search.get('num_evaluated', 0)} candidates "
        f"({plan.search.get('mode', '')})"
    )
    for column in ("", "prec", "ckpt", "layout", "mb×ga", "GiB", "pred tok/s", "meas tok/s"):
        table.add_column(column, justify="right" if column.endswith(("s", "GiB")) else "left")
    rows = [(plan.candidate, plan.predicted)] + [
        (a.candidate, a.prediction) for a in plan.alternatives if a.prediction is not None
    ]
    for i, (candidate, predicted) in enumerate(rows[:6]):
        m = measured.get(candidate.key)
        if m is None:
            shown = ""
        elif m.ok:
            shown = f"{m.tokens_per_s:,.0f}"
        else:
            shown = m.status.replace("_", " ")
        table.add_row(
            "chosen" if i == 0 else str(i + 1),
            candidate.precision,
            candidate.activation_checkpointing,
            candidate.layout,
            f"{candidate.micro_batch_size}×{candidate.grad_accum_steps}",
            f"{predicted.peak_memory_bytes / GiB:.2f}",
            f"{predicted.tokens_per_s:,.0f}",
            shown,
        )
    console.print(table)
    # Plain echo below, not rich: a wrapped command line could not be pasted back.
    baseline = plan.baseline
    if baseline and baseline.candidate is not None and baseline.expected_speedup:
        line = (
            f"vs the naive fp32 loop ({baseline.candidate.label()}): expected "
            f"{baseline.expected_speedup:.2f}×"
        )
        if baseline.measured_speedup is not None:
            line += f", measured {baseline.measured_speedup:.2f}×"
        click.echo(line)
    click.echo(f"plan: {out / 'plan.json'}   trials: {out / 'trials.csv'}")
    if not plan.estimate:
        click.echo(f"train it: advisor train --plan {out / 'plan.json'} --out {out / 'train'}")
