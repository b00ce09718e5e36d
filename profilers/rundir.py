"""The run directory: where every file of RUN/ and of a training directory lives (one owner).

Other tools, tests and the report read these files (DESIGN.md, "Contracts on disk"), so each
name is written here once and imported everywhere else; nothing else spells a run file's name.
It lives in the lowest package because the profiler writes the first of them; it imports
nothing but the standard library.

    RUN/                        advisor run --out RUN
      profile.json, probes.csv    advisor profile    (profilers.profile_record.Profile.save)
      plan.json, trials.csv       advisor recommend  (strategies.plan.Plan.save)
      study.db                    its Optuna study   (strategies.search.default_storage)
      run.json                    advisor run's log  (advisor.run)
      report.html                 advisor report     (reports.render.write_report)
      train/                      a training directory, below
      tuned_plan.json             advisor tune: the plan with tuned hyper-parameters
      tune/                       its evidence, below

    TUNE/                       advisor tune --out OUT: OUT/tune (strategies.tuning)
      study.json                  the study: ranges, pruner, best trial, sensitivity, cost
      trials.jsonl                one line per trial: params, eval curve, state
      STUDY/trial_NNNN/           each trial's training directory (metrics.jsonl, plan.json),
                                  in a folder per study (study.json's study_name)

    TRAIN/                      advisor train --out TRAIN  (RUN/train for advisor run)
      metrics.jsonl               one line per step and per eval (profilers.metrics_record)
      train_config.json           the config, total steps, device, data, model facts
      launch_config.json          the resolved config handed to torchrun's ranks
      checkpoints/step_NNNNNNNN/  one directory per checkpoint (advisor.trainer.checkpoint)
      checkpoints/latest          the name of the newest one
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROFILE = "profile.json"
PROBES = "probes.csv"
PLAN = "plan.json"
TRIALS = "trials.csv"
STUDY = "study.db"
RUN_LOG = "run.json"
REPORT = "report.html"
TRAIN = "train"
TUNED_PLAN = "tuned_plan.json"
TUNE = "tune"
TUNE_STUDY = "study.json"
TUNE_TRIALS = "trials.jsonl"
TRIAL_PLAN = "plan.json"

METRICS = "metrics.jsonl"
TRAIN_CONFIG = "train_config.json"
LAUNCH_CONFIG = "launch_config.json"
CHECKPOINTS = "checkpoints"
LATEST_CHECKPOINT = "latest"
CHECKPOINT_PREFIX = "step_"
# The stderr of the training child 'advisor run' starts (appended by each resume), and the
# ranks' stdout of a ddp/fsdp run that the Python API launched (a library call prints nothing).
TRAIN_LOG = "train.log"
RANKS_STDOUT = "stdout.log"
CHECKPOINT_NAME = re.compile(rf"^{CHECKPOINT_PREFIX}(\d{{8}})$")


def checkpoint_name(step: int) -> str:
    """``step_00000300``: zero-padded so that names sort in step order."""
    return f"{CHECKPOINT_PREFIX}{step:08d}"


@dataclass(frozen=True, slots=True)
class TrainDir:
    """A training run's directory (``advisor train --out``)."""

    root: Path

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def train_config(self) -> Path:
        return self.root / TRAIN_CONFIG

    @property
    def launch_config(self) -> Path:
        return self.root / LAUNCH_CONFIG

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    @property
    def latest_checkpoint(self) -> Path:
        """The pointer file naming the newest checkpoint (present once one was saved)."""
        return self.checkpoints / LATEST_CHECKPOINT

    def checkpoint_dirs(self) -> list[Path]:
        """The complete checkpoints, oldest first (staging directories are not listed)."""
        if not self.checkpoints.is_dir():
            return []
        return sorted(p for p in self.checkpoints.iterdir() if CHECKPOINT_NAME.match(p.name))


@dataclass(frozen=True, slots=True)
class TuneDir:
    """The evidence of ``advisor tune --out OUT``: ``OUT/tune``."""

    root: Path

    @property
    def study(self) -> Path:
        return self.root / TUNE_STUDY

    @property
    def trials(self) -> Path:
        return self.root / TUNE_TRIALS

    def trial(self, study: str, number: int) -> TrainDir:
        """Trial ``number`` of ``study``'s training directory (``advisor-tune-…/trial_0003``).

        One folder per study: trial numbers restart at 0 in each study, and a later study in
        the same OUT (other ranges, another trial length) overwrote an earlier one's trials.
        """
        return TrainDir(self.root / study / f"trial_{number:04d}")

    def trial_plan(self, study: str, number: int) -> Path:
        """The plan trial ``number`` of ``study`` trained (``advisor train --plan`` of it)."""
        return self.trial(study, number).root / TRIAL_PLAN


@dataclass(frozen=True, slots=True)
class RunDir:
    """The directory of ``advisor run --out RUN`` (also of ``advisor profile/recommend``)."""

    root: Path

    @property
    def profile(self) -> Path:
        return self.root / PROFILE

    @property
    def probes(self) -> Path:
        return self.root / PROBES

    @property
    def plan(self) -> Path:
        return self.root / PLAN

    @property
    def trials(self) -> Path:
        return self.root / TRIALS

    @property
    def study(self) -> Path:
        return self.root / STUDY

    @property
    def run_log(self) -> Path:
        return self.root / RUN_LOG

    @property
    def report(self) -> Path:
        return self.root / REPORT

    @property
    def train(self) -> TrainDir:
        return TrainDir(self.root / TRAIN)

    @property
    def tuned_plan(self) -> Path:
        return self.root / TUNED_PLAN

    @property
    def tune(self) -> TuneDir:
        return TuneDir(self.root / TUNE)


def profile_path(path: str | Path) -> Path:
    """A profile.json given as the file or as the directory that holds it."""
    path = Path(path)
    return path / PROFILE if path.is_dir() else path


# -- writing ------------------------------------------------------------------------------------


def write_atomically(path: Path, data: str | bytes, *, durable: bool = False) -> None:
    """Write ``path`` so that it holds either its old content or the complete new one, never
    half of it: a temporary file beside it (named per process, so ranks never share one), then
    a rename. ``durable``: also fsync the file before the rename (checkpoint pointers, resumed
    metrics), so a power loss cannot leave the new name pointing at unwritten data. Text is
    written as given (no newline translation)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def write_csv_atomically(
    path: Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]
) -> None:
    """A tidy CSV (probes.csv, trials.csv): the header, then one line per row, None as ""."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(columns))
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    write_atomically(path, text.getvalue())
