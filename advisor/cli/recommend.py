"""``advisor recommend``: search the config space of a profile and write a validated plan."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from advisor.cli.options import (
    DEFAULT_STEPS,
    check_whatif,
    device_option,
    global_batch_option,
    memory_budget_option,
    out_option,
    pick,
    profile_path_option,
    quiet_option,
    search_options,
    validation_options,
    whatif_options,
)
from profilers.rundir import RunDir
from strategies.commands import Command

if TYPE_CHECKING:
    from strategies.prediction import Prediction

GiB = 2**30


@click.command(short_help="The fastest config that fits a fixed global batch: plan.json.")
@profile_path_option
@global_batch_option(required=True)
@memory_budget_option
@search_options(
    "Most ranks to consider (default: the devices the profile saw; 1 on CPU). With --target: "
    "exactly this many."
)
@validation_options
@click.option(
    "--study-name",
    default=None,
    help="Study name (default: derived from the profile and the request, so a re-run resumes).",
)
@whatif_options
@click.option(
    "--steps",
    "run_steps",
    type=click.IntRange(min=1),
    default=DEFAULT_STEPS,
    show_default=True,
    help="Optimizer steps the plan will train: a compiled candidate's compile time is "
    "amortised over them when ranking.",
)
@out_option("Where plan.json, trials.csv and study.db go (default: the profile's directory).")
@device_option("Where validation runs (auto: the profiled device).")
@quiet_option("No progress lines on stderr.")
def recommend(**params: Any) -> None:
    """Pick the fastest config that fits at a fixed global batch: cost model + Optuna search,
    top-K validated by real runs; writes plan.json and trials.csv."""
    from advisor.recommending import recommend as run_recommend
    from strategies.space import SearchRequest

    profile: Path = params["profile_path"]
    out = params["out"] or (profile if profile.is_dir() else profile.parent)
    check_whatif(params)

    def progress(message: str) -> None:
        if not params["quiet"]:
            click.echo(message, err=True)

    request = SearchRequest(
        **pick(params, "global_batch_size", "memory_budget", "world_size", "trials"),
        **pick(params, "target", "nodes", "network", "study_name", "run_steps", "only"),
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
    print_plan(plan, out)


# The table's width when stdout is not a terminal: wide enough for every column of six rows.
PIPED_TABLE_WIDTH = 160


def print_plan(plan: Any, out: Path) -> None:
    """A short table of the best candidates, the baseline, and the command that trains it."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:
        # Piped or logged (CI, `| tee`): rich would assume 80 columns and cut the cells
        # ("blocks…", "(58,04…"); a log has no width, so give the table what it needs.
        console.width = max(console.width, PIPED_TABLE_WIDTH)
    if plan.estimate:
        click.echo(plan.label)
    measured = {v.candidate.key: v.measured for v in plan.validated}
    search = plan.search
    # How many of the space the profile could price and how many fit: "best of 60" alone read
    # as a choice among 60 where a short profile priced 4 (the reasons say why the rest not).
    screened = search.get("screened") or {}
    priced, fitting = screened.get("priced"), screened.get("fitting")
    counts = (
        f": {priced} priced, {fitting} fit"
        if priced is not None
        and fitting is not None
        and (screened.get("unpriceable") or fitting < priced)
        else ""
    )
    table = Table(
        title=f"best of {search.get('space_size', search.get('num_evaluated', 0))} candidates "
        f"({search.get('mode', '')}){counts}"
    )
    rows = [(plan.candidate, plan.predicted)] + [
        (a.candidate, a.prediction) for a in plan.alternatives if a.prediction is not None
    ]
    rows = rows[:6]
    # The other knobs (loss chunks, FSDP blocks kept gathered, compile, loader workers) get a
    # column when any row shown turns one: two rows must never look the same.
    other = any(candidate.extras() for candidate, _ in rows)
    columns = ("", "prec", "ckpt", "layout", "mb×ga", *(("other",) if other else ()), "GiB")
    for column in (*columns, "pred tok/s (90%)", "meas tok/s"):
        # A narrow terminal folds a cell onto more lines, never cuts it ("blocks…", "(58,04…").
        table.add_column(
            column,
            justify="right" if column.endswith(("s", "GiB", "(90%)")) else "left",
            overflow="fold",
        )
    for i, (candidate, predicted) in enumerate(rows):
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
            *((" ".join(candidate.extras()) or "-",) if other else ()),
            f"{predicted.peak_memory_bytes / GiB:.2f}",
            _with_interval(predicted),
            shown,
        )
    console.print(table)
    # Plain echo below, not rich: a wrapped command line could not be pasted back.
    if _overhead_unmeasured(plan.predicted):
        click.echo(
            "note: the GiB column counts each step's tensors only: the profile did not measure "
            "the training process's own memory (plan.json's reasons say why)"
        )
    baseline = plan.baseline
    if baseline and baseline.candidate is not None and baseline.expected_speedup:
        line = (
            f"vs the naive fp32 loop ({baseline.candidate.label()}): expected "
            f"{baseline.expected_speedup:.2f}×"
        )
        if baseline.measured_speedup is not None:
            line += f", measured {baseline.measured_speedup:.2f}×"
        click.echo(line)
    run = RunDir(out)
    click.echo(f"plan: {run.plan}   trials: {run.trials}")
    if not plan.estimate:
        train = Command("train").option("plan", run.plan).option("out", run.train.root)
        click.echo(f"train it: {train.shell()}")


def _overhead_unmeasured(predicted: Prediction) -> bool:
    """Whether the prediction's peak leaves out the process overhead the profile lacks."""
    from strategies.cost import OVERHEAD_UNMEASURED

    return any(a.startswith(OVERHEAD_UNMEASURED) for a in predicted.breakdown.assumptions)


def _with_interval(predicted: Prediction) -> str:
    """Predicted tokens/s and its 90% interval, when the prediction has one."""
    interval = predicted.tokens_per_s_interval
    point = f"{predicted.tokens_per_s:,.0f}"
    return point if interval is None else f"{point} ({interval[0]:,.0f}–{interval[1]:,.0f})"
