"""``advisor tune``: an Optuna study over the learning rate, warm-up and weight decay at a plan's
config, each trial a real short ``advisor train`` run, scored by held-out eval loss.

    OUT/tuned_plan.json          the plan with the winning values (every speed key unchanged)
    OUT/tune/study.json          ranges, pruner, best trial, sensitivity, cost (TuningSummary)
    OUT/tune/trials.jsonl        one line per trial of the study (TrialRecord)
    OUT/tune/STUDY/trial_NNNN/   each trial's plan.json, metrics.jsonl, stderr.log (per study)

Every trial trains the same tokens (whole global batches) with ``eval_every`` set for about ten
evaluations; each eval line is read from the trial's metrics.jsonl as it appears, reported to
Optuna, and a trial the pruner stops is ended with SIGTERM. A trial is ``python -m advisor
train --plan`` in a child process, so a ddp/fsdp plan goes through torchrun exactly as
``advisor train`` runs it, and the memory is the trainer's alone.

The loop is ask/tell (as :func:`strategies.search.run_search`) so advisor decides where a trial
runs. The study lives in ``--storage`` (default ``sqlite:///OUT/study.db``) under a name derived
from the plan, the ranges and the trial length: re-running the command resumes it, and several
workers with one ``--storage`` share it (each runs trials until the study holds ``trials``).
A trial left RUNNING by a killed worker (its process gone on this host, or no eval reported
for :data:`ABANDONED_S` from another) is marked failed and its parameters re-queued, so the
study still reaches ``trials`` scored trials.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from advisor.errors import AdvisorError, UsageProblem
from advisor.trainer.options import DEFAULT_EVAL_BATCHES, RunOptions
from profilers.rundir import PLAN, RunDir, TrainDir, TuneDir, write_atomically
from strategies.commands import Command
from strategies.config import DEFAULT_STEPS, TrainConfig
from strategies.tuning import (
    DEFAULT_PARAMS,
    DEFAULT_TUNE_TRIALS,
    REDUCTION_FACTOR,
    EvalPoint,
    ParamRange,
    TrialRecord,
    TuningSummary,
    best_trial,
    config_values,
    default_ranges,
    eval_every,
    first_rung,
    longest_warmup,
    make_pruner,
    make_sampler,
    parse_params,
    plan_values,
    sensitivity,
    study_name,
    suggest,
    trial_counts,
    trial_steps,
    tuned_config,
    write_trials,
)

if TYPE_CHECKING:
    import optuna

    from advisor.data.token_source import TokenSource
    from strategies.plan_records import Plan

ATTR = "advisor_tune"  # each trial's user attribute: worker, heartbeat, then its outcome
BASELINE_ATTR = "advisor_tune_baseline"
REQUEUED_ATTR = "advisor_tune_requeued_from"  # on a re-queued trial: the number it replaces
ABANDONED_S = 1800.0  # a RUNNING trial of another host with no eval for this long has no worker
POLL_S = 0.25  # how often a running trial's metrics.jsonl is read
# OUT/tune/PREVIOUS_TUNED_PLAN: OUT/tuned_plan.json as it was when a new study started
PREVIOUS_TUNED_PLAN = "previous_tuned_plan.json"
WAIT_S = 1.0  # how often a finished worker looks whether the others' trials are done
STOP_GRACE_S = 60.0  # a pruned trial's SIGTERM -> exit (it saves a checkpoint first)


@dataclass(frozen=True, kw_only=True)
class TuneRequest:
    """What ``advisor tune`` was asked (each field mirrors a flag)."""

    trials: int = DEFAULT_TUNE_TRIALS
    tokens_per_trial: int | None = None  # None: DEFAULT_STEPS global batches of the plan
    params: str | None = None  # "lr,warmup,wd" or "lr=1e-4:1e-2,..." (None: DEFAULT_PARAMS)
    storage: str | None = None  # None: sqlite:///OUT/study.db
    device: str = "auto"
    eval_batches: int = DEFAULT_EVAL_BATCHES
    seed: int | None = None  # the sampler's; None: fresh per worker (trials' losses are seeded)
    # --val-data: the file the trials are scored on (None: the plan's data's validation split);
    # a study of its own (:func:`prepare`)
    val_data: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.trials, int) or self.trials < 1:
            raise UsageProblem(f"--trials must be a positive integer, got {self.trials!r}")
        if self.tokens_per_trial is not None and self.tokens_per_trial < 1:
            raise UsageProblem(
                f"--tokens-per-trial must be a positive integer, got {self.tokens_per_trial}"
            )

    def command(self, plan: Path, out: Path) -> list[str]:
        """The ``advisor tune`` command line (for study.json and the report; no --storage: a
        database URL may hold a password)."""
        return (
            Command("tune")
            .option("plan", plan)
            .option("trials", self.trials, default=DEFAULT_TUNE_TRIALS)
            .option("tokens_per_trial", self.tokens_per_trial)
            .option("params", self.params, default=DEFAULT_PARAMS)
            .option("device", self.device, default="auto")
            .option("val_data", self.val_data)
            .option("out", out)
            .argv()
        )


@dataclass(frozen=True, kw_only=True)
class TuneResult:
    """What ``advisor.tune`` returns: the tuned plan (written to ``plan_path``), the study's
    summary (OUT/tune/study.json) and every trial (OUT/tune/trials.jsonl)."""

    plan: Plan
    plan_path: Path
    summary: TuningSummary
    trials: tuple[TrialRecord, ...]
    best: TrialRecord
    out: Path


# -- one trial ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TrialSpec:
    """One trial to run: ``config`` for ``steps`` steps, an eval every ``eval_every``."""

    number: int
    config: TrainConfig
    steps: int
    eval_every: int
    directory: TrainDir
    plan: Path
    device: str = "auto"
    eval_batches: int = DEFAULT_EVAL_BATCHES
    val_data: str | None = None


@dataclass(frozen=True, kw_only=True)
class TrialOutcome:
    """``state``: complete | pruned (stopped by the pruner) | diverged | failed."""

    state: str
    evals: tuple[EvalPoint, ...] = ()
    reason: str = ""
    exit_code: int = 0
    tokens: int | None = None  # tokens trained (a pruned run goes on a little past its eval)


# ``on_eval(point)`` -> True when the trial should stop now (pruned).
OnEval = Callable[[EvalPoint], bool]


class TrialRunner(Protocol):
    """Runs one trial, calling ``on_eval`` for each evaluation as it happens, in step order,
    and stopping the run when it returns True. Must not raise for a failed run: the outcome
    says how it ended."""

    def __call__(self, spec: TrialSpec, on_eval: OnEval) -> TrialOutcome: ...


def term_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` (Linux): the child (a trial, ``advisor run``'s training) gets SIGTERM
    (and saves, then exits) when the process that started it dies (profilers.orphans)."""
    from profilers.orphans import kill_with_parent

    return kill_with_parent(signum=signal.SIGTERM)


class ChildTrainer:
    """The real runner: ``python -m advisor train --plan`` in a child, its metrics.jsonl read as
    it grows. Works for every layout: a ddp/fsdp plan's child launches its ranks itself."""

    def __call__(self, spec: TrialSpec, on_eval: OnEval) -> TrialOutcome:
        options = RunOptions(
            out=spec.directory.root,
            steps=spec.steps,
            eval_every=spec.eval_every,
            eval_batches=spec.eval_batches,
            val_data=spec.val_data,
            checkpoint_every=spec.steps,  # one checkpoint, at the end (deleted after)
            keep_checkpoints=1,
            device=spec.device,
            progress=False,
        )
        log = spec.directory.root / "stderr.log"
        evals: list[EvalPoint] = []
        stopped = False
        offset = 0
        with open(log, "w") as err:
            child = subprocess.Popen(
                [sys.executable, "-m", "advisor", *options.train_args(spec.plan)],
                stdout=subprocess.DEVNULL,
                stderr=err,
                preexec_fn=term_with_parent(),
            )
            try:
                while True:
                    done = child.poll() is not None
                    new, offset = _new_evals(spec.directory.metrics, offset)
                    for point in new:
                        if stopped:
                            break
                        evals.append(point)
                        if on_eval(point):
                            stopped = True
                            _stop(child)
                    if done or stopped:
                        break
                    time.sleep(POLL_S)
                child.wait()
            except BaseException:
                _stop(child)
                raise
        code = child.returncode
        trained = _trained_tokens(spec.directory)
        if stopped:
            return TrialOutcome(state="pruned", evals=tuple(evals), exit_code=code, tokens=trained)
        if code == 0:
            return TrialOutcome(state="complete", evals=tuple(evals), tokens=trained)
        last = _last_line(log).removeprefix("error: ")
        state = "diverged" if "loss became" in last else "failed"
        return TrialOutcome(
            state=state, evals=tuple(evals), reason=last, exit_code=code, tokens=trained
        )


def _trained_tokens(directory: TrainDir) -> int | None:
    from profilers.metrics_record import read_metrics

    try:
        train = read_metrics(directory.metrics).train
    except (OSError, UnicodeDecodeError):
        return None
    return train[-1].tokens if train and train[-1].tokens is not None else None


def _new_evals(metrics: Path, offset: int) -> tuple[list[EvalPoint], int]:
    """Eval lines appended to ``metrics`` since byte ``offset`` (whole lines only)."""
    try:
        with open(metrics, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return [], offset
    end = chunk.rfind(b"\n") + 1
    points = []
    for line in chunk[:end].splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("kind") == "eval" and record.get("eval_loss") is not None:
            points.append(
                EvalPoint(
                    step=int(record["step"]),
                    tokens=int(record.get("tokens") or 0),
                    eval_loss=float(record["eval_loss"]),
                )
            )
    return points, offset + end


def _stop(child: subprocess.Popen[Any]) -> None:
    if child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [line for line in lines if line]
    return lines[-1] if lines else ""


# -- progress -------------------------------------------------------------------------------------


class TuneProgress(Protocol):
    """How a study shows its progress (the CLI draws it; the library never prints)."""

    def message(self, text: str) -> None: ...

    def trial_started(self, number: int, params: Mapping[str, Any], steps: int) -> None: ...

    def trial_evaluated(self, number: int, point: EvalPoint, steps: int) -> None: ...

    def trial_finished(self, record: TrialRecord, steps: int) -> None: ...


class SilentProgress:
    def message(self, text: str) -> None:
        pass

    def trial_started(self, number: int, params: Mapping[str, Any], steps: int) -> None:
        pass

    def trial_evaluated(self, number: int, point: EvalPoint, steps: int) -> None:
        pass

    def trial_finished(self, record: TrialRecord, steps: int) -> None:
        pass


# -- the study ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Setup:
    plan: Plan
    plan_path: Path
    out: Path
    steps: int
    tokens_per_trial: int
    eval_every: int
    first_rung: int  # the pruner's first rung (step): the first eval after the longest warm-up
    warmup: int  # the longest warm-up a trial can have
    ranges: tuple[ParamRange, ...]
    storage: str
    study_name: str
    command: list[str] = field(default_factory=list)
    asked_tokens: int | None = None  # --tokens-per-trial as given
    recorded_notes: tuple[str, ...] = ()  # what was said before the trials (study.json's notes)
    defaults: Mapping[str, ParamRange] = field(default_factory=dict)  # the default ranges

    def params_with(self, name: str, span: str) -> str:
        """``--params`` as asked, with ``name``'s range replaced by (or added as) ``span``: a
        suggestion that keeps every other parameter the user tunes."""
        items = []
        for r in self.ranges:
            default = self.defaults.get(r.name)
            same = default is not None and (default.low, default.high) == (r.low, r.high)
            if r.name == name:
                items.append(f"{name}={span}")
            else:
                items.append(r.name if same else f"{r.name}={r.low:g}:{r.high:g}")
        if not any(r.name == name for r in self.ranges):
            items.append(f"{name}={span}")
        return ",".join(items)

    def notes(self) -> list[str]:
        """What the user should know before the trials: each a line, none when all is well."""
        notes = []
        step_tokens = self.plan.config.tokens_per_step
        if self.asked_tokens is not None and self.asked_tokens != self.tokens_per_trial:
            notes.append(
                f"--tokens-per-trial {self.asked_tokens:,} is {self.steps} whole steps of "
                f"{step_tokens:,} tokens: every trial trains {self.tokens_per_trial:,}"
            )
        if self.warmup > self.first_rung:
            # Successive halving's first rung is the first eval after the longest warm-up;
            # when that warm-up reaches the trial's end, trials are judged while ramping.
            notes.append(
                f"a trial's warm-up can last {self.warmup} steps, past the first pruning at "
                f"step {self.first_rung} of {self.steps}: trials with a long warm-up are judged "
                "while their learning rate ramps up; give --tokens-per-trial "
                f"{5 * self.warmup * step_tokens:,} (5x the warm-up) or a shorter warm-up range "
                f"(--params {self.params_with('warmup', f'0:{max(1, self.steps // 5)}')})"
            )
        if self.plan.estimate:
            notes.append(
                f"the plan is an estimate for another machine ({self.plan.label}): its trials "
                "run here, at its config"
            )
        return notes


def prepare(plan_path: Path, request: TuneRequest, out: Path | None) -> _Setup:
    """Read the plan and check the request against it: every one-line error before a trial."""
    from advisor.exporters.source import load_plan, plan_file
    from strategies.search import default_storage

    file = plan_file(plan_path)
    plan = load_plan(file)
    config = plan.config
    tokens = request.tokens_per_trial or DEFAULT_STEPS * config.tokens_per_step
    steps = trial_steps(config, tokens)
    defaults = default_ranges(config, steps)
    ranges = parse_params(request.params, defaults)
    for r in ranges:
        if r.key == "warmup_steps" and r.high > steps:
            # A warm-up past the trial's end never reaches its lr: the trial would score a
            # schedule that the tuned plan's training does not run (found: warmup=0:1000 in a
            # 10-step trial was accepted and tried 442 steps of warm-up).
            raise UsageProblem(
                f"--params warmup={r.low:g}:{r.high:g}: a trial is {steps} steps, and a longer "
                f"warm-up never reaches its lr; give HIGH <= {steps} or a larger "
                "--tokens-per-trial"
            )
    _check_storage(request.storage)
    from advisor.training import check_data

    source = check_data(config, request.val_data)  # a trial refused it after minutes
    directory = out if out is not None else file.parent
    if directory.exists() and not directory.is_dir():
        raise UsageProblem(f"--out {directory} is a file: name a directory")
    every = eval_every(steps)
    warmup = longest_warmup(config, ranges)
    return _Setup(
        plan=plan,
        plan_path=file,
        out=directory,
        steps=steps,
        tokens_per_trial=steps * config.tokens_per_step,
        eval_every=every,
        first_rung=first_rung(steps, every, warmup),
        warmup=warmup,
        ranges=ranges,
        storage=request.storage or default_storage(directory),
        study_name=_study_name(config, ranges, steps * config.tokens_per_step, source.val),
        command=request.command(file, directory),
        asked_tokens=request.tokens_per_trial,
        defaults=defaults,
    )


def _study_name(
    config: TrainConfig, ranges: tuple[ParamRange, ...], tokens: int, val: TokenSource | None
) -> str:
    """:func:`strategies.tuning.study_name`, and for trials scored on ``--val-data`` a name of
    their own: a study resumed with another validation set mixed scores of two sets. The set
    is its files (resolved: ``val.txt`` and ``./val.txt`` are one) and its description (its
    token count: a file written again with other contents is another set)."""
    name = study_name(config, ranges, tokens)
    if val is None:
        return name
    files = val.shards[1] if val.shards else (val.paths or ("",))[1:]
    key = "|".join([*(str(Path(f).resolve()) for f in files), val.description])
    return f"{name}-val-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def _check_storage(storage: str | None) -> None:
    """What a study cannot live in (strategies.study.storage_problem: nothing, or an in-memory
    database, where Optuna's tables were missing and the study died with a traceback), refused
    before any trial."""
    from strategies.study import storage_problem

    problem = storage_problem(storage) if storage is not None else None
    if problem:
        raise UsageProblem(problem)


def tune(
    plan_path: Path,
    request: TuneRequest,
    *,
    out: Path | None = None,
    progress: TuneProgress | None = None,
    runner: TrialRunner | None = None,
) -> TuneResult:
    """Run (or resume, or join) the study for ``plan_path`` and write the tuned plan."""
    from strategies.study import open_study, quiet_optuna

    setup = prepare(plan_path, request, out)
    show = progress or SilentProgress()
    run_trial = runner or ChildTrainer()
    setup.out.mkdir(parents=True, exist_ok=True)
    files = TuneDir(RunDir(setup.out).tune.root)
    files.root.mkdir(parents=True, exist_ok=True)
    with quiet_optuna(), _no_experimental_warnings():
        study = open_study(
            setup.storage,
            setup.study_name,
            0,
            None,
            direction="minimize",
            sampler=make_sampler(request.seed, request.trials),
            pruner=make_pruner(setup.first_rung),
        )
        reclaimed = reclaim_abandoned(study)
        base = plan_values(setup.plan.config, setup.ranges)
        outside = [r for r in setup.ranges if not r.contains(float(base[r.name]))]
        notes: list[str] = []
        if not outside:
            # The plan's own values first: the study then never ends worse than them.
            study.enqueue_trial(base, user_attrs={BASELINE_ATTR: True}, skip_if_exists=True)
        else:
            shown = ", ".join(
                f"{r.name} {base[r.name]:g} (range {r.low:g} to {r.high:g})" for r in outside
            )
            notes.append(
                f"the plan's own values are outside the ranges tuned: {shown}; the study does "
                "not try them"
            )
            show.message(notes[-1])
        for note in setup.notes():
            notes.append(note)
            show.message(f"note: {note}")
        # study.json and trials.jsonl describe this study from now on (rewritten after each
        # trial): until 2026-12-07 an OUT tuned before kept the earlier study's study.json
        # beside this one's trials.jsonl until this study finished, and the report mixed them.
        stale = RunDir(setup.out).tuned_plan
        if stale.is_file():
            # An earlier study's (or this one's before more trials were asked) tuned plan beside
            # an unfinished study: the report and 'advisor export RUN' took it as this study's
            # result. Kept aside until this study writes its own.
            kept = files.root / PREVIOUS_TUNED_PLAN
            os.replace(stale, kept)
            notes.append(f"{stale} moved to {kept} until this study ends and writes its own")
            show.message(f"note: {notes[-1]}")
        setup = replace(setup, recorded_notes=tuple(notes))
        _save_progress(study, setup, request, files)
        show.message(
            f"study {setup.study_name}: {request.trials} trials of {setup.steps} steps "
            f"({setup.tokens_per_trial:,} tokens), eval every {setup.eval_every}, "
            f"first pruning at step {setup.first_rung}"
            + (f"; re-queued {reclaimed} trial(s) of a killed worker" if reclaimed else "")
        )
        while True:
            while _wants_more(study, request.trials):
                _one_trial(study, setup, request, files, show, run_trial)
            if not _wait_for_others(study, show):
                break
        records = collect(study, setup)
    write_trials(files.trials, records)
    return _finish(setup, request, records, files)


def _save_progress(
    study: optuna.Study, setup: _Setup, request: TuneRequest, files: TuneDir
) -> list[TrialRecord]:
    """trials.jsonl and an unfinished study.json (the best so far, no tuned plan yet)."""
    records = collect(study, setup)
    write_trials(files.trials, records)
    _summary(setup, request, records, tuned_plan=None).save(files.study)
    return records


def _wants_more(study: optuna.Study, target: int) -> bool:
    """Another trial is needed: a re-queued one is waiting, or the study holds fewer than
    ``target`` trials that count (finished, or running in a worker; re-queued failures are
    replaced by their re-run)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    replaced = _replaced(trials)
    counted = waiting = 0
    for t in trials:
        if t.state == TrialState.WAITING:
            waiting += 1
        elif t.state == TrialState.FAIL and not dict(t.params):
            continue  # stopped before its values were drawn: no trial of the study
        elif t.number not in replaced:
            counted += 1
    return waiting > 0 or counted < target


def _replaced(trials: list[optuna.trial.FrozenTrial]) -> dict[int, int]:
    """Trial number -> the number of the trial that re-runs it."""
    out = {}
    for t in trials:
        source = t.user_attrs.get(REQUEUED_ATTR)
        if isinstance(source, int):
            out[source] = t.number
    return out


def _wait_for_others(study: optuna.Study, show: TuneProgress) -> bool:
    """Wait until no other worker's trial is running, so that every worker of a shared study
    ranks the same trials and writes the same tuned plan. True when a worker died meanwhile
    and its trial was re-queued (the caller then runs it)."""
    from optuna.trial import TrialState

    said = False
    while True:
        if reclaim_abandoned(study):
            return True
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not running:
            return False
        if not said:
            show.message(f"waiting for {len(running)} trial(s) running in other workers")
            said = True
        time.sleep(WAIT_S)


def _attr(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    value = trial.user_attrs.get(ATTR)
    return dict(value) if isinstance(value, dict) else {}


def _worker() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "heartbeat": time.time()}


def _one_trial(
    study: optuna.Study,
    setup: _Setup,
    request: TuneRequest,
    files: TuneDir,
    show: TuneProgress,
    run_trial: TrialRunner,
) -> None:
    from optuna.trial import TrialState

    trial = study.ask()
    number = trial.number
    directory = files.trial(setup.study_name, number)
    attr: dict[str, Any] = {
        **_worker(),
        "out": str(setup.out),
        "directory": str(directory.root.relative_to(setup.out)),
    }
    started = time.perf_counter()
    # Everything after ask() is inside the try: a Ctrl-C or SIGTERM between ask() and the run
    # (the progress line printed, the child not started yet) left the trial RUNNING. One in
    # the few statements before it leaves a RUNNING trial without values, which the next run
    # fails (reclaim_abandoned) and does not count (_wants_more).
    try:
        params = suggest(trial, setup.ranges)
        trial.set_user_attr(ATTR, attr)
        config = tuned_config(setup.plan.config, config_values(setup.ranges, params))
        if directory.root.exists():
            shutil.rmtree(directory.root)  # a study started afresh over an old OUT
        directory.root.mkdir(parents=True)
        plan_file = files.trial_plan(setup.study_name, number)
        write_atomically(plan_file, json.dumps({"config": config.to_dict()}, indent=1) + "\n")
        show.trial_started(number, params, setup.steps)

        def on_eval(point: EvalPoint) -> bool:
            trial.report(point.eval_loss, point.step)
            attr["heartbeat"] = time.time()
            trial.set_user_attr(ATTR, attr)
            show.trial_evaluated(number, point, setup.steps)
            return point.step < setup.steps and trial.should_prune()

        spec = TrialSpec(
            number=number,
            config=config,
            steps=setup.steps,
            eval_every=setup.eval_every,
            directory=directory,
            plan=plan_file,
            device=request.device,
            eval_batches=request.eval_batches,
            val_data=request.val_data,
        )
        outcome = run_trial(spec, on_eval)
    except BaseException as exc:  # Ctrl-C, SIGTERM: the next run of the study re-runs this trial
        with contextlib.suppress(Exception):
            trained = _trained_tokens(directory)
            attr.update(
                reason=_interruption(exc),
                tokens=trained if trained is not None else 0,
                wall_s=round(time.perf_counter() - started, 3),
            )
            trial.set_user_attr(ATTR, attr)
        with contextlib.suppress(Exception):
            study.tell(trial, state=TrialState.FAIL)
            frozen = _frozen(study, number)
            if frozen.params:  # stopped before its values were drawn: nothing to re-run
                requeue(study, frozen)
            _save_progress(study, setup, request, files)
        # Its child has exited (the runner stops it before it lets the interrupt go on): the
        # checkpoint it saved on the signal is bulk no one reads (39 MB for gpt-tiny was left).
        with contextlib.suppress(OSError):
            shutil.rmtree(directory.checkpoints)
        raise
    with contextlib.suppress(OSError):
        shutil.rmtree(directory.checkpoints)  # the evidence is the metrics; weights are bulk
    last = outcome.evals[-1] if outcome.evals else None
    reason = outcome.reason
    if outcome.state == "pruned" and last is not None:
        reason = f"pruned at step {last.step} (eval loss {last.eval_loss:.4f})"
    elif outcome.state == "diverged":
        reason = f"diverged: {outcome.reason}"
    if outcome.state == "complete" and not (last is not None and last.step == setup.steps):
        reason = f"ended without its final evaluation at step {setup.steps}"
    attr.update(
        evals=[e.to_list() for e in outcome.evals],
        tokens=outcome.tokens if outcome.tokens is not None else last.tokens if last else 0,
        reason=reason,
        wall_s=round(time.perf_counter() - started, 3),
    )
    trial.set_user_attr(ATTR, attr)
    if outcome.state == "complete" and last is not None and last.step == setup.steps:
        study.tell(trial, last.eval_loss)
    elif outcome.state in ("pruned", "diverged"):
        # A diverged trial is told PRUNED, not FAIL: TPE then learns from its last eval that
        # its region is bad (a failed trial is ignored and its lr would be tried again).
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, state=TrialState.FAIL)
        # The study stops here; its values are queued again, so that the same command, once
        # the cause is fixed, re-runs this trial. Until 2026-12-07 the failed trial counted
        # toward --trials: after '--device cuda' failed on a CPU host, the same study with
        # --device cpu ran nothing and ended "no trial completed".
        requeue(study, _frozen(study, number))
        _save_progress(study, setup, request, files)
        message = f"trial {number} failed (exit {outcome.exit_code}): {reason or 'no message'}"
        again = "; once that is fixed, running the study again re-runs this trial"
        if outcome.exit_code == 2:
            raise UsageProblem(message + again)  # the plan cannot train here: all would fail
        raise AdvisorError(message + f"; its log: {directory.root / 'stderr.log'}" + again)
    records = _save_progress(study, setup, request, files)
    record = next((r for r in records if r.number == number), None)
    if record is not None:
        show.trial_finished(record, setup.steps)


def _frozen(study: optuna.Study, number: int) -> optuna.trial.FrozenTrial:
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def _interruption(exc: BaseException) -> str:
    """Why a trial stopped when its worker did (its record's reason)."""
    if isinstance(exc, KeyboardInterrupt):
        how = "SIGTERM" if getattr(exc, "signum", None) == signal.SIGTERM else "Ctrl-C"
        return f"interrupted ({how})"
    return f"its worker stopped ({type(exc).__name__})"


def reclaim_abandoned(study: optuna.Study) -> int:
    """Fail RUNNING trials whose worker is gone and re-queue their parameters; how many.

    Gone: its process no longer exists on this host, or (another host) it reported nothing for
    :data:`ABANDONED_S`. A trial with no worker attribute yet (killed between ask and the
    first write) counts as gone after a minute."""
    from optuna.trial import TrialState

    host = socket.gethostname()
    now = time.time()
    count = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        attr = _attr(t)
        if not attr:
            start = t.datetime_start or datetime.datetime.now()
            gone = (datetime.datetime.now() - start).total_seconds() > 60
        elif attr.get("host") == host:
            gone = not _alive(int(attr.get("pid", -1)))
        else:
            gone = now - float(attr.get("heartbeat", 0)) > ABANDONED_S
        if not gone:
            continue
        try:
            study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
        except Exception:  # another worker reclaimed it first
            continue
        if not dict(t.params):
            # killed before its values were drawn: nothing to re-run (it was skipped, and a
            # study waiting for its running trials waited for it forever)
            continue
        requeue(study, t)
        count += 1
    return count


def requeue(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Queue ``trial``'s parameters again (it was failed for a lost worker, not for itself)."""
    attrs = {k: v for k, v in trial.user_attrs.items() if k != ATTR}
    attrs[REQUEUED_ATTR] = trial.number
    study.enqueue_trial(dict(trial.params), user_attrs=attrs, skip_if_exists=False)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def collect(study: optuna.Study, setup: _Setup) -> list[TrialRecord]:
    """Every trial of the study as a :class:`TrialRecord` (all workers')."""
    from optuna.trial import TrialState

    states = {
        TrialState.COMPLETE: "complete",
        TrialState.PRUNED: "pruned",
        TrialState.FAIL: "failed",
        TrialState.RUNNING: "running",
        TrialState.WAITING: "waiting",
    }
    per_step = setup.plan.config.tokens_per_step
    trials = study.get_trials(deepcopy=False)
    replaced = _replaced(trials)
    records = []
    for t in trials:
        attr = _attr(t)
        if attr.get("evals"):
            evals = tuple(EvalPoint.from_list(e) for e in attr["evals"])
        else:
            evals = tuple(
                EvalPoint(step=s, tokens=s * per_step, eval_loss=v)
                for s, v in sorted(t.intermediate_values.items())
            )
        params = dict(t.params or t.system_attrs.get("fixed_params") or {})
        complete = t.state == TrialState.COMPLETE
        here = attr.get("out") == str(setup.out)
        records.append(
            TrialRecord(
                number=t.number,
                state=states.get(t.state, "failed"),
                params=params,
                evals=evals,
                score=float(t.value) if complete and t.value is not None else None,
                tokens=int(attr.get("tokens") or (evals[-1].tokens if evals else 0)),
                reason=(
                    f"{attr.get('reason') or 'its worker stopped'}; re-run as trial "
                    f"{replaced[t.number]}"
                    if t.number in replaced
                    else str(attr.get("reason") or "")
                ),
                wall_s=float(attr.get("wall_s") or 0.0),
                worker=f"{attr.get('host', '')}:{attr.get('pid', '')}" if attr else "",
                directory=str(attr.get("directory") or "") if here else "",
                rerun_as=replaced.get(t.number),
            )
        )
    return records


def _finish(
    setup: _Setup, request: TuneRequest, records: list[TrialRecord], files: TuneDir
) -> TuneResult:
    best = best_trial(records)
    if best is None:
        raise AdvisorError(
            f"no trial of study {setup.study_name} completed ({len(records)} in it): raise "
            "--trials or --tokens-per-trial, or narrow --params"
        )
    config = tuned_config(setup.plan.config, config_values(setup.ranges, best.params))
    shown = ", ".join(f"{r.key}={_fmt(best.params[r.name])}" for r in setup.ranges)
    reason = (
        f"hyper-parameters tuned by advisor tune: {shown} (trial {best.number} of "
        f"{len(records)}, held-out loss {best.score:.4f} after {setup.tokens_per_trial:,} tokens)"
    )
    plan = replace(setup.plan, config=config, reasons=(*setup.plan.reasons, reason))
    path = RunDir(setup.out).tuned_plan
    write_atomically(path, json.dumps(plan.to_dict(), indent=1) + "\n")
    summary = _summary(setup, request, records, tuned_plan=path)
    summary.save(files.study)
    return TuneResult(
        plan=plan,
        plan_path=path,
        summary=summary,
        trials=tuple(records),
        best=best,
        out=setup.out,
    )


def _summary(
    setup: _Setup, request: TuneRequest, records: list[TrialRecord], *, tuned_plan: Path | None
) -> TuningSummary:
    """study.json: finished when ``tuned_plan`` (the file written) is given, else the study so
    far (the best complete trial yet, if any)."""
    from strategies.study import redact

    best = best_trial(records)
    base = next(
        (r for r in records if r.state == "complete" and _is_base(r, setup)),
        None,
    )
    return TuningSummary(
        study_name=setup.study_name,
        storage=redact(setup.storage),
        pruner=f"successive halving (reduction factor {REDUCTION_FACTOR}, first rung at step "
        f"{setup.first_rung}, after the longest warm-up: {setup.warmup} steps)",
        sampler="TPE",
        trials_asked=request.trials,
        tokens_per_trial=setup.tokens_per_trial,
        steps_per_trial=setup.steps,
        eval_every=setup.eval_every,
        ranges=setup.ranges,
        plan=str(setup.plan_path),
        tuned_plan=str(tuned_plan) if tuned_plan is not None else "",
        base_values=plan_values(setup.plan.config, setup.ranges),
        best_number=best.number if best else None,
        best_values=dict(best.params) if best else {},
        best_score=best.score if best else None,
        base_score=base.score if base else None,
        counts=trial_counts(records),
        tokens_trained=sum(r.tokens for r in records),
        sensitivity=tuple(sensitivity(records, [r.name for r in setup.ranges])),
        command=tuple(setup.command),
        notes=setup.recorded_notes,
        finished=tuned_plan is not None,
    )


def _is_base(record: TrialRecord, setup: _Setup) -> bool:
    base = plan_values(setup.plan.config, setup.ranges)
    return all(
        abs(float(record.params.get(k, float("nan"))) - float(v)) <= 1e-12 * max(1.0, abs(v))
        for k, v in base.items()
    )


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


@contextlib.contextmanager
def _no_experimental_warnings() -> Any:
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*experimental.*")
        yield


__all__ = [
    "PLAN",
    "ChildTrainer",
    "TrialOutcome",
    "TrialRunner",
    "TrialSpec",
    "TuneProgress",
    "TuneRequest",
    "TuneResult",
    "tune",
]
