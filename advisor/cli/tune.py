"""``advisor tune``: tune lr, warm-up and weight decay at a plan's config; write tuned_plan.json."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import click

from advisor.cli.options import (
    POSITIVE,
    TOKENS,
    device_option,
    out_option,
    quiet_option,
    val_data_option,
)
from strategies.config import DEFAULT_STEPS
from strategies.tuning import (
    DEFAULT_PARAMS,
    DEFAULT_TUNE_TRIALS,
    EvalPoint,
    TrialRecord,
    counts_text,
)


def _params_text(params: Mapping[str, Any]) -> str:
    return " ".join(
        f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
    )


class CliTuneProgress:
    """One line per finished trial; on a terminal, a bar over the running trial's steps."""

    def __init__(self, quiet: bool, trials: int) -> None:
        self.quiet = quiet
        self.trials = trials
        self.bar: Any = None
        self.task: Any = None

    @contextlib.contextmanager
    def shown(self) -> Iterator[CliTuneProgress]:
        if self.quiet or not sys.stderr.isatty():
            yield self
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("[bold]{task.fields[title]}"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=Console(file=sys.stderr),
            transient=True,
        ) as bar:
            self.bar = bar
            yield self
        self.bar = None

    def _echo(self, text: str) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.console.print(text, highlight=False, markup=False)
        else:
            click.echo(text, err=True)

    def message(self, text: str) -> None:
        self._echo(text)

    def trial_started(self, number: int, params: Mapping[str, Any], steps: int) -> None:
        if self.bar is not None:
            if self.task is not None:
                self.bar.remove_task(self.task)
            self.task = self.bar.add_task(
                _params_text(params), total=steps, title=f"trial {number}"
            )
        else:
            self._echo(f"trial {number}: {_params_text(params)}")

    def trial_evaluated(self, number: int, point: EvalPoint, steps: int) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.update(
                self.task,
                completed=point.step,
                description=f"step {point.step}/{steps}, eval loss {point.eval_loss:.4f}",
            )

    def trial_finished(self, record: TrialRecord, steps: int) -> None:
        if record.state == "complete" and record.score is not None:
            how = f"complete: eval loss {record.score:.4f} after {steps} steps"
        elif record.reason.startswith(record.state):
            how = record.reason  # "pruned at step 40 (eval loss ...)"
        else:
            how = f"{record.state}: {record.reason}" if record.reason else record.state
        self._echo(f"trial {record.number} ({_params_text(record.params)}) {how}")


@click.command(short_help="Tune lr, warm-up, weight decay at a plan: tuned_plan.json.")
@click.option(
    "--plan",
    "plan_path",
    required=True,
    type=click.Path(path_type=Path),
    help="plan.json from 'advisor recommend' (or its run directory).",
)
@click.option(
    "--trials",
    type=POSITIVE,
    default=DEFAULT_TUNE_TRIALS,
    show_default=True,
    help="Trials the study runs in all (several workers on one --storage share them).",
)
@click.option(
    "--tokens-per-trial",
    type=TOKENS,
    default=None,
    help="Tokens each trial trains, the same for all (whole global batches). Default: "
    f"{DEFAULT_STEPS} steps of the plan.",
)
@click.option(
    "--params",
    default=DEFAULT_PARAMS,
    show_default=True,
    help="What to tune: any of lr (log scale), warmup (steps), wd (weight decay), each "
    "optionally NAME=LOW:HIGH, e.g. lr=1e-4:1e-2,wd=0:0.2. Default ranges: lr from 1/10 to "
    "10x the plan's, warmup 0 to a fifth of a trial, wd 0 to 0.3.",
)
@click.option(
    "--storage",
    default=None,
    help="Optuna storage URL, also shared by several workers (e.g. postgresql+psycopg2://...); "
    "default sqlite:///OUT/study.db.",
)
@val_data_option(
    "Score the trials on this file instead of the plan's data's validation split (the same "
    "forms as advisor train's --val-data: text read as the plan's data is, FILE.jsonl[:FIELD], "
    "a .bin or .npy of token ids, or a directory's val.bin or *val* shards); a study of its own."
)
@out_option("Where tuned_plan.json and tune/ go (default: the plan's directory).")
@device_option("Where the trials train.")
@quiet_option("No progress lines on stderr.")
def tune(**params: Any) -> None:
    """Tune the learning rate, warm-up and weight decay at a plan's config: an Optuna study of
    short real training runs scored by held-out loss, hopeless ones pruned; writes
    tuned_plan.json (same speed config) for 'advisor train --plan'."""
    from advisor.tuning import TuneRequest
    from advisor.tuning import tune as run_tune

    request = TuneRequest(
        trials=params["trials"],
        tokens_per_trial=params["tokens_per_trial"],
        params=params["params"],
        storage=params["storage"],
        device=params["device"],
        val_data=params["val_data"],
    )
    from advisor.run import sigterm_stops_the_run

    display = CliTuneProgress(params["quiet"], params["trials"])
    with display.shown(), sigterm_stops_the_run():
        result = run_tune(params["plan_path"], request, out=params["out"], progress=display)
    summarize(result)


def summarize(result: Any) -> None:
    summary = result.summary
    best = result.best
    click.echo(
        f"study {summary.study_name}: {len(result.trials)} trials "
        f"({counts_text(summary.counts)}), cost "
        f"{summary.cost_runs:.2f}x one trial of {summary.tokens_per_trial:,} tokens"
    )
    line = f"best: trial {best.number} ({_params_text(best.params)}), eval loss {best.score:.4f}"
    if summary.base_score is not None:
        line += f"; the plan's own values: {summary.base_score:.4f}"
    click.echo(line)
    click.echo(f"tuned plan: {result.plan_path}")
    click.echo(f"train it:   advisor train --plan {result.plan_path}")
