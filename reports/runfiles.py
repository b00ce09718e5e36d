"""Read a run directory's files as plain data, tolerating what is missing or damaged.

The report is built from the files alone (DESIGN.md's layout), never from live objects, so that
``advisor report RUN`` re-renders any run, also a partial one (profile only, no training yet) or
one written by another version. Every reader returns plain dicts and lists; a file that exists
but cannot be read becomes a ``problem`` shown on the page instead of an exception.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profilers.metrics_record import EvalRecord, Metrics, TrainRecord, read_metrics

# INTERRUPTED: the one-line "error" advisor run records for a stage stopped by Ctrl-C.
from profilers.profile_record import INTERRUPTED as INTERRUPTED
from profilers.rundir import METRICS, PLAN, PROFILE, TRAIN, RunDir, TrainDir

# run.json's status of a stage that Ctrl-C or SIGTERM stopped (its detail: :func:`interruption`).
# Until 2026-12-07 such a stage was recorded "failed" with the detail "interrupted (Ctrl-C)"
# whatever the signal: :func:`is_interruption` reads both.
INTERRUPTED_STATUS = "interrupted"


def interruption(signum: int | None) -> str:
    """run.json's detail of a stage stopped by ``signum``: SIGINT (or None, a plain
    KeyboardInterrupt) is :data:`INTERRUPTED`, "interrupted (Ctrl-C)"; SIGTERM is
    "interrupted (SIGTERM)", as the CLI's error line says it."""
    if signum is None or signum == signal.SIGINT:
        return INTERRUPTED
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    return f"interrupted ({name})"


def is_interruption(detail: str) -> bool:
    """Whether a stage's recorded detail says a signal stopped it (:func:`interruption`)."""
    return detail == INTERRUPTED or (detail.startswith("interrupted (") and detail.endswith(")"))


class ReportError(ValueError):
    """The run directory cannot be reported on; the message names the fix."""


@dataclass(frozen=True, kw_only=True)
class RunFiles:
    """Everything a report reads. ``None``/empty where the file is absent."""

    root: Path
    profile: Mapping[str, Any] | None = None
    probes: tuple[Mapping[str, Any], ...] = ()
    plan: Mapping[str, Any] | None = None
    trials: tuple[Mapping[str, Any], ...] = ()
    metrics: Metrics = field(default_factory=Metrics)
    train_config: Mapping[str, Any] | None = None
    run_info: Mapping[str, Any] | None = None  # run.json, written by ``advisor run``
    train_dir: Path | None = None
    has_study: bool = False
    # advisor tune's files (OUT/tuned_plan.json, OUT/tune/study.json, OUT/tune/trials.jsonl)
    tuned_plan: Mapping[str, Any] | None = None
    tuning: Mapping[str, Any] | None = None
    tune_trials: tuple[Mapping[str, Any], ...] = ()
    problems: tuple[str, ...] = field(default_factory=tuple)
    # Stages run.json records as failed or interrupted (stage → its one-line error, or
    # :func:`interruption`'s detail), unless a later command redid the stage: its output is
    # newer than run.json.
    failed_stages: Mapping[str, str] = field(default_factory=dict)

    @property
    def train_records(self) -> list[TrainRecord]:
        """The optimizer steps that logged a loss."""
        return [r for r in self.metrics.train if r.loss is not None]

    @property
    def eval_records(self) -> list[EvalRecord]:
        return [r for r in self.metrics.evals if r.eval_loss is not None]

    @property
    def empty(self) -> bool:
        return not (
            self.profile
            or self.plan
            or self.trials
            or self.metrics.records
            or self.train_config
            or self.tuned_plan
            or self.tuning
        )


def _read_json(path: Path, problems: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        problems.append(f"{path.name} could not be read ({type(exc).__name__}: {exc})")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path.name} is not a JSON object")
        return None
    return data


def _cell(value: str) -> Any:
    """A CSV cell as the value it was written from: '' → None, True/False, int, float, str."""
    if value == "":
        return None
    if value in ("True", "False"):
        return value == "True"
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)
    except ValueError:
        return value
    return number if math.isfinite(number) else None


def _read_csv(path: Path, problems: list[str]) -> tuple[dict[str, Any], ...]:
    if not path.is_file():
        return ()
    try:
        with open(path, newline="") as f:
            return tuple(
                {k: _cell(v or "") for k, v in row.items() if k} for row in csv.DictReader(f)
            )
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        problems.append(f"{path.name} could not be read ({type(exc).__name__}: {exc})")
        return ()


def _read_metrics(path: Path, problems: list[str]) -> Metrics:
    try:
        metrics = read_metrics(path)
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{path.name} could not be read ({type(exc).__name__}: {exc})")
        return Metrics()
    if metrics.unreadable_lines:  # lines cut by a kill
        problems.append(f"{path.name}: {metrics.unreadable_lines} unreadable line(s) skipped")
    return metrics


def _read_jsonl(path: Path, problems: list[str]) -> tuple[dict[str, Any], ...]:
    if not path.is_file():
        return ()
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{path.name} could not be read ({type(exc).__name__}: {exc})")
        return ()
    out, bad = [], 0
    for line in lines:
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(value, dict):
            out.append(value)
        else:
            bad += 1
    if bad:
        problems.append(f"{path.name}: {bad} unreadable line(s) skipped")
    return tuple(out)


def find_train_dir(root: Path) -> Path | None:
    """RUN/train (the layout of ``advisor run``), or RUN itself when it is a training run."""
    for candidate in (RunDir(root).train, TrainDir(root)):
        if candidate.metrics.is_file() or candidate.train_config.is_file():
            return candidate.root
    return None


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def failed_stages(
    run_info: Mapping[str, Any] | None, files: RunDir, train: TrainDir | None
) -> dict[str, str]:
    """The stages of ``advisor run`` that failed or were interrupted (stage → the one-line
    error run.json keeps, or "interrupted (SIGTERM)" ...), in run order. One is dropped when the
    stage's output is newer than run.json: a later command (``advisor recommend``, ``advisor
    train --resume``) redid it since."""
    stages = (run_info or {}).get("stages")
    if not isinstance(stages, Mapping):
        return {}
    outputs = {
        "profile": files.profile,
        "recommend": files.plan,
        "tune": files.tune.study,
        "train": (train or files.train).metrics,
    }
    logged = _mtime(files.run_log)
    out: dict[str, str] = {}
    for name, output in outputs.items():
        record = stages.get(name)
        if not isinstance(record, Mapping) or record.get("status") not in (
            "failed",
            INTERRUPTED_STATUS,
        ):
            continue
        made = _mtime(output)
        if made is not None and (logged is None or made > logged):
            continue
        out[name] = " ".join(str(record.get("detail") or "").split()) or "no reason recorded"
    return out


def _plan_profile(plan: Mapping[str, Any]) -> tuple[dict[str, Any], Path] | None:
    """The profile ``plan`` was made from, when it is not in the plan's directory (``advisor
    recommend --out`` elsewhere): the path the plan records (as given to recommend, so
    relative to where it ran), if the profile there is the same one (its creation time).
    Without this a what-if planned into its own directory was reported with no profile."""
    info = plan.get("profile")
    if not isinstance(info, Mapping) or not info.get("path") or not info.get("created"):
        return None
    path = Path(str(info["path"]))
    for candidate in (path, path / PROFILE):
        if candidate.is_file():
            data = _read_json(candidate, [])
            if data is not None and data.get("created") == info["created"]:
                return data, candidate.parent
    return None


def made_from_another_profile(plan: Mapping[str, Any], created: Any) -> str | None:
    """The creation time of the profile ``plan`` was made from, when it is not the profile
    created at ``created`` (a later ``advisor profile --out`` into the plan's directory
    replaced the profile beside it); None when they belong together or either is unknown."""
    info = plan.get("profile")
    made_from = info.get("created") if isinstance(info, Mapping) else None
    if not made_from or not created or made_from == created:
        return None
    return str(made_from)


def _plan_of_another_profile(run: RunFiles, root: Path) -> str:
    """Why the page's plan and profile do not belong together, or "" (the page then mixed
    the two)."""
    if run.profile is None or run.plan is None:
        return ""
    here = run.profile.get("created")
    made_from = made_from_another_profile(run.plan, here)
    if made_from is None:
        return ""
    return (
        f"{PLAN} was made from a profile created {made_from}, not from the {PROFILE} here "
        f"(created {here}): re-run 'advisor recommend --profile {root} --global-batch-size N "
        f"--out {root}' for a plan of this profile"
    )


def load_run(root: str | Path) -> RunFiles:
    """Read every run file under ``root``; ReportError when there is no run there at all."""
    root = Path(root)
    if not root.exists():
        raise ReportError(f"run directory {root} does not exist: pass the --out of 'advisor run'")
    if not root.is_dir():
        raise ReportError(f"{root} is not a directory: pass the run directory, not a file in it")
    problems: list[str] = []
    files = RunDir(root)
    train_dir = find_train_dir(root)
    train = TrainDir(train_dir) if train_dir else None
    run = RunFiles(
        root=root,
        profile=_read_json(files.profile, problems),
        probes=_read_csv(files.probes, problems),
        plan=_read_json(files.plan, problems),
        trials=_read_csv(files.trials, problems),
        metrics=_read_metrics(train.metrics, problems) if train else Metrics(),
        train_config=_read_json(train.train_config, problems) if train else None,
        run_info=_read_json(files.run_log, problems),
        train_dir=train_dir,
        has_study=files.study.is_file(),
        tuned_plan=_read_json(files.tuned_plan, problems),
        tuning=_read_json(files.tune.study, problems),
        tune_trials=_read_jsonl(files.tune.trials, problems),
        problems=tuple(problems),
    )
    if run.plan is None and run.tuned_plan is not None:
        # advisor tune --out elsewhere than the plan: the tuned plan is the plan with tuned
        # hyper-parameters (its search, prediction and profile are the plan's).
        run = dataclasses.replace(run, plan=run.tuned_plan)
    if run.profile is None and run.plan is not None:
        found = _plan_profile(run.plan)
        if found is not None:
            # recommend --out elsewhere than the profile: the plan names the profile it used.
            profile, where = found
            probes = _read_csv(RunDir(where).probes, problems)
            run = dataclasses.replace(run, profile=profile, probes=probes)
    mismatch = _plan_of_another_profile(run, root)
    if mismatch:
        run = dataclasses.replace(run, problems=(*run.problems, mismatch))
    run = dataclasses.replace(run, failed_stages=failed_stages(run.run_info, files, train))
    # A run stopped by Ctrl-C in its first stage has its log only: the page says how to go on
    # (a run whose input was refused has nothing to show: the error line says it all).
    stopped = any(is_interruption(d) for d in run.failed_stages.values())
    if run.empty and not problems and not stopped:
        raise ReportError(
            f"{root} holds no run files ({PROFILE}, {PLAN}, {TRAIN}/{METRICS}): run "
            f"'advisor run --out {root}' (or 'advisor profile --out {root}') first"
        )
    return run
