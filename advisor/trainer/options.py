"""How a training run runs (length, evaluation, checkpoints, device): :class:`RunOptions`.

Torch-free, so that the CLI can read its defaults without importing torch, and so that a
launcher or a parent process can build the ``advisor train`` command of a run from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from strategies.commands import Command
from strategies.config import DEFAULT_STEPS

DEFAULT_EVAL_BATCHES = 4  # global batches of the validation split per evaluation
DEFAULT_KEEP_CHECKPOINTS = 2


def run_steps(steps: int | None, tokens: int | None, *, resume: bool = False) -> int | None:
    """The ``steps`` of a run asked for ``steps`` or ``tokens``: DEFAULT_STEPS when neither,
    except on a resume, which keeps the run's own length (None here:
    ``advisor.training.resumed_options`` reads it, DEFAULT_STEPS for a run not started)."""
    if steps is None and tokens is None:
        return None if resume else DEFAULT_STEPS
    return steps


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    out: Path
    steps: int | None = None
    tokens: int | None = None
    resume: bool = False
    checkpoint_every: int | None = None  # None: about four checkpoints per run
    eval_every: int | None = None  # None: about ten evals per run; 0: only at the end
    eval_batches: int = DEFAULT_EVAL_BATCHES
    # --val-data: the file evaluations read (advisor.data.resolve_data); None: the validation
    # split of the config's data
    val_data: str | None = None
    keep_checkpoints: int = DEFAULT_KEEP_CHECKPOINTS
    device: str = "auto"
    progress: bool = True
    # The per-step lines for a caller (advisor.train(progress=callback)) instead of stderr:
    # this process's only (not passed to a launched rank).
    on_line: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    # The run's notes (a repeated data set, a warm-up as long as the run ...) for a caller
    # instead of stderr ("note: ..." whatever --quiet says): this process's only.
    on_note: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    def train_args(self, plan: Path) -> list[str]:
        """``advisor train`` arguments that run ``plan`` with these options (for a launcher or
        a child process)."""
        command = (
            Command("train")
            .option("plan", plan)
            .option("out", self.out)
            .option("device", self.device)
            .option("eval_batches", self.eval_batches)
            .option("val_data", self.val_data)
            .option("keep_checkpoints", self.keep_checkpoints)
            .option("steps", self.steps)
            .option("tokens", self.tokens)
            .option("checkpoint_every", self.checkpoint_every)
            .option("eval_every", self.eval_every)
            .switch("resume", self.resume)
            .switch("quiet", not self.progress)
        )
        return command.args()
