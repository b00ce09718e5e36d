"""``advisor run``: profile → recommend → train → report into one run directory (the main job).

    RUN/profile.json, probes.csv     advisor.profiling.profile
    RUN/plan.json, trials.csv, study.db   advisor.recommending.recommend
    RUN/tuned_plan.json, tune/       advisor.tuning.tune (with --tune-trials N; train runs it)
    RUN/train/metrics.jsonl, checkpoints/ advisor.trainer.loop.train (torchrun for ddp/fsdp)
    RUN/report.html                  reports.write_report
    RUN/run.json                     this job: the request, the command, each stage's status

Resumable where it is cheap: with ``resume`` a stage whose output is already there and matches
the request is skipped (the profile, the plan), training continues from its last checkpoint,
and the report is always rendered again. The report is also written when a stage fails, so a
partial run still explains what it has.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from advisor.errors import UsageProblem
from advisor.trainer.options import (
    DEFAULT_EVAL_BATCHES,
    DEFAULT_KEEP_CHECKPOINTS,
    RunOptions,
    run_steps,
)
from profilers import rundir
from profilers.defaults import DEFAULT_MEMORY_BUDGET, DEFAULT_PROFILE_BUDGET_S
from profilers.rundir import RunDir, write_atomically
from strategies.budgets import DEFAULT_VALIDATE_ROUNDS, DEFAULT_VALIDATE_TOP_K
from strategies.commands import Command
from strategies.config import (
    DEFAULT_DATA,
    DEFAULT_GLOBAL_BATCH_SIZE,
    DEFAULT_MODEL,
    DEFAULT_SEQ_LEN,
    HYPERPARAMETER_KEYS,
    WORKLOAD_KEYS,
)
from strategies.errors import UNPRICED, StrategyError
from strategies.restrict import normalize_only, only_args, read_recorded, same_only


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """Everything ``advisor run`` was asked; each field mirrors a flag of one of the steps."""

    model: str = DEFAULT_MODEL
    model_args: Mapping[str, Any] = field(default_factory=dict)
    data: str = DEFAULT_DATA
    tokenizer: str | None = None
    seq_len: int = DEFAULT_SEQ_LEN
    global_batch_size: int = DEFAULT_GLOBAL_BATCH_SIZE
    steps: int | None = None  # None with tokens None: DEFAULT_STEPS
    tokens: int | None = None
    device: str = "auto"
    # profile
    budget_s: float = DEFAULT_PROFILE_BUDGET_S
    precisions: tuple[str, ...] | None = None
    checkpointing: tuple[str, ...] | None = None  # settings the profile measures
    comm: bool = True
    # recommend
    memory_budget: float = DEFAULT_MEMORY_BUDGET
    world_size: int | None = None
    trials: int | None = None
    validate_top: int = DEFAULT_VALIDATE_TOP_K
    validate_rounds: int = DEFAULT_VALIDATE_ROUNDS
    storage: str | None = None
    config_overrides: Mapping[str, Any] = field(default_factory=dict)  # HYPERPARAMETER_KEYS
    # --only: the values the search may turn per knob (strategies.restrict); the profile then
    # measures only the precisions and checkpointing settings named, unless told otherwise.
    only: Mapping[str, Any] = field(default_factory=dict)
    # tune (0: no study; train runs the plan's own hyper-parameters)
    tune_trials: int = 0
    # train
    eval_every: int | None = None
    eval_batches: int = DEFAULT_EVAL_BATCHES
    # --val-data: the file the evaluations (and the tune stage's scores) read; None: the
    # validation split of --data (a resume without it keeps the run's own: run())
    val_data: str | None = None
    checkpoint_every: int | None = None
    keep_checkpoints: int = DEFAULT_KEEP_CHECKPOINTS
    resume: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "only", normalize_only(self.only))
        except StrategyError as exc:
            raise UsageProblem(str(exc)) from None
        if self.steps is not None and self.tokens is not None:
            raise UsageProblem("give --steps or --tokens, not both")
        if self.tune_trials < 0:
            raise UsageProblem(f"--tune-trials must be 0 (off) or more, got {self.tune_trials}")
        self._check_only_against_the_request()
        unknown = sorted(set(self.config_overrides) - set(HYPERPARAMETER_KEYS))
        if unknown:
            raise UsageProblem(
                f"advisor run chooses {', '.join(unknown)} itself: pass only "
                + ", ".join(f"--{k.replace('_', '-')}" for k in HYPERPARAMETER_KEYS)
            )

    def _check_only_against_the_request(self) -> None:
        """--only values the run's own flags already rule out, refused before the profile (the
        search refused them after it, minutes in): precisions the profile will not measure,
        micro-batch sizes that divide no rank's share of the global batch."""
        precisions = self.only.get("precision")
        if precisions and self.precisions and not set(precisions) & set(self.precisions):
            raise UsageProblem(
                f"--only precision={','.join(precisions)}: the profile measures --precision "
                f"{' '.join(self.precisions)} only; ask for one of those, or profile more"
            )
        sizes = self.only.get("micro_batch_size")
        if sizes and not any(self.global_batch_size % size == 0 for size in sizes):
            raise UsageProblem(
                f"--only micro-batch-size={','.join(map(str, sizes))}: none divides the global "
                f"batch {self.global_batch_size} (micro-batch x accumulation x ranks = global "
                "batch); pick sizes that divide it, or another --global-batch-size"
            )

    @property
    def train_steps(self) -> int | None:
        return run_steps(self.steps, self.tokens)

    @property
    def profiled_precisions(self) -> tuple[str, ...] | None:
        """What the profile measures: --precision, else the precisions --only allows."""
        return self.precisions or self.only.get("precision")

    @property
    def profiled_checkpointing(self) -> tuple[str, ...] | None:
        """--checkpointing, else the settings --only allows (none is always measured)."""
        return self.checkpointing or self.only.get("activation_checkpointing")

    def workload(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "model_args": dict(self.model_args),
            "data": self.data,
            "tokenizer": self.tokenizer,
            "seq_len": self.seq_len,
        }

    def command(self, out: Path) -> list[str]:
        """The exact ``advisor run`` command line of this request (for run.json, the report):
        what was asked, defaults left out. --storage is left out: a database URL may hold a
        password."""
        command = (
            Command("run")
            .model(self.model, self.model_args)
            .option("data", self.data, default=DEFAULT_DATA)
            .option("tokenizer", self.tokenizer or None)
            .option("seq_len", self.seq_len)
            .option("global_batch_size", self.global_batch_size)
        )
        if self.tokens:
            command.option("tokens", self.tokens)
        else:
            command.option("steps", self.train_steps)
        (
            command.option("budget_s", self.budget_s)
            .option("memory_budget", self.memory_budget, default=DEFAULT_MEMORY_BUDGET)
            .option("world_size", self.world_size)
            .option("validate_top", self.validate_top, default=DEFAULT_VALIDATE_TOP_K)
            .option("validate_rounds", self.validate_rounds, default=DEFAULT_VALIDATE_ROUNDS)
            .option("trials", self.trials)
            .option("tune_trials", self.tune_trials, default=0)
            .option("device", self.device, default="auto")
            .repeated("precision", self.precisions or ())
            .repeated("checkpointing", self.checkpointing or ())
            .repeated("only", only_args(self.only))
            .switch("no_comm", not self.comm)
            .options(self.config_overrides)
            .option("eval_every", self.eval_every)
            .option("eval_batches", self.eval_batches, default=DEFAULT_EVAL_BATCHES)
            .option("val_data", self.val_data)
            .option("checkpoint_every", self.checkpoint_every)
            .option("keep_checkpoints", self.keep_checkpoints, default=DEFAULT_KEEP_CHECKPOINTS)
            .option("out", out)
        )
        return command.argv()


@dataclass(frozen=True, kw_only=True)
class StageResult:
    name: str
    status: str  # done | skipped | failed | interrupted; running in run.json while it runs
    detail: str = ""
    elapsed_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class RunResult:
    out: Path
    report: Path | None
    stages: tuple[StageResult, ...]
    plan: Any = None  # strategies.plan.Plan when recommend ran in this call
    tuned: Any = None  # advisor.tuning.TuneResult when the tune stage ran
    train: Any = None  # profilers.metrics_record.Metrics when training ran


ProgressFn = Callable[[str, float], None]


class RunProgress(Protocol):
    """How a run shows its progress (the CLI draws it; the library never prints).

    ``stage`` opens one stage and yields a ``(message, fraction)`` callback (``fraction`` in
    [0, 1] where the stage knows it, e.g. the profile's time budget; -1 when it does not).
    ``finished`` closes it with a one-line summary. ``train_progress``: whether the trainer
    draws its own per-step progress.
    """

    train_progress: bool

    def stage(
        self, index: int, name: str, description: str
    ) -> contextlib.AbstractContextManager[ProgressFn]: ...

    def finished(self, name: str, status: str, detail: str, elapsed_s: float) -> None: ...

    def note(self, text: str) -> None:
        """A line about what the run does that its flags do not say (a resume that plans
        again, or finds no run); optional for other implementations."""


class _Silent:
    train_progress = False

    @contextlib.contextmanager
    def stage(self, index: int, name: str, description: str) -> Iterator[ProgressFn]:
        yield lambda _message, _fraction: None

    def finished(self, name: str, status: str, detail: str, elapsed_s: float) -> None:
        pass

    def note(self, text: str) -> None:
        pass


def _run_files(out: Path) -> list[str]:
    """The files of a run already in ``out``, as paths relative to it."""
    run = RunDir(out)
    paths = (
        run.profile,
        run.plan,
        run.trials,
        run.tuned_plan,
        run.train.metrics,
        run.train.checkpoints,
    )
    return [str(p.relative_to(out)) for p in paths if p.exists()]


def _check_out(out: Path, request: RunRequest) -> None:
    if out.exists() and not out.is_dir():
        raise UsageProblem(f"--out {out} is a file: name a directory for the run")
    existing = _run_files(out)
    if existing and not request.resume:
        raise UsageProblem(
            f"{out} already holds a run ({', '.join(existing)}): pass --resume to continue it "
            "(finished stages are skipped), or choose another --out"
        )


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def profile_again(out: Path) -> str | None:
    """Why ``--resume`` profiles RUN/profile.json again although it may have measured this
    workload (None: nothing against reusing it): Ctrl-C cut it short, or it priced no step.

    Priced no step: it holds no step-time fit at all, because its throughput probes (the
    baseline's timing first) timed out, failed or were not run (a busy host spends the budget
    before them). The search then prices no candidate ("no candidate could be predicted from
    this profile"), and until 2026-12-08 every resume reused that profile and failed the same
    way. A profile that timed nothing because the model does not fit this device is reused:
    another profile here would not fit it either (recommend's error names --target)."""
    from profilers.memory_records import PREDICTED_NOT_TO_FIT
    from profilers.profile_record import INTERRUPTED

    data = _read_json(RunDir(out).profile)
    if data is None:
        return None
    rows = [row for row in data.get("probes") or () if isinstance(row, dict)]
    cut = sum(1 for row in rows if row.get("reason") == INTERRUPTED)
    if cut:
        # Ctrl-C cut it short (profilers.stopping): the stage runs again
        return f"Ctrl-C cut it short ({cut} probes)"
    fits = data.get("fits")
    if not isinstance(fits, dict) or fits.get("time"):
        return None
    timing = [r for r in rows if r.get("probe") in ("throughput", "throughput_fit")]
    failed = [r for r in timing if r.get("status") != "ok"]
    # a timeout or a failure before a skip: what a busy host did to the baseline's timing
    failed.sort(key=lambda r: r.get("status") == "skipped")
    if failed and all(str(r.get("reason", "")).startswith(PREDICTED_NOT_TO_FIT) for r in failed):
        return None  # every group it could not time does not fit: another profile cannot
    # (a group skipped as unfit beside others skipped for the budget: those may fit, again)
    failed = [r for r in failed if not str(r.get("reason", "")).startswith(PREDICTED_NOT_TO_FIT)]
    if not failed:
        return "it has no step-time fit: no candidate can be priced from it"
    row = failed[0]
    why = f"{row.get('status')}: {row['reason']}" if row.get("reason") else row.get("status")
    return (
        f"it has no step-time fit, so no candidate can be priced from it (its {row.get('probe')} "
        f"probe {row.get('name')}: {why})"
    )


def reusable_profile(out: Path, request: RunRequest) -> bool:
    """RUN/profile.json exists, finished, priced a step (:func:`profile_again`), and measured
    this request's workload (else UsageProblem)."""
    from profilers.profile_record import INTERRUPTED

    data = _read_json(RunDir(out).profile)
    if data is None:
        return False
    if any(row.get("reason") == INTERRUPTED for row in data.get("probes") or ()):
        return False  # Ctrl-C cut it short (profilers.stopping): the stage runs again
    profiled = {k: data.get("workload", {}).get(k) for k in WORKLOAD_KEYS}
    profiled["model_args"] = dict(profiled["model_args"] or {})
    wanted = request.workload()
    differ = [k for k in WORKLOAD_KEYS if profiled.get(k) != wanted.get(k)]
    if differ:
        shown = ", ".join(f"{k}={profiled.get(k)!r}" for k in differ)
        raise UsageProblem(
            f"{RunDir(out).profile} profiled {shown}, not what this run asks: resume with the same "
            "--model/--model-arg/--data/--seq-len, or choose another --out"
        )
    return profile_again(out) is None  # priced no step: the stage runs again (run() says why)


def reusable_plan(out: Path, request: RunRequest) -> bool:
    """RUN/plan.json was made from RUN/profile.json for this request's search settings."""
    return not plan_differences(out, request)


def plan_differences(out: Path, request: RunRequest) -> list[str]:
    """Why RUN/plan.json is not this request's plan (empty: it is, and --resume reuses it):
    each reason names the flag, what this run asks and what the plan was made for."""
    run = RunDir(out)
    plan = _read_json(run.plan)
    if plan is None:
        return [f"{run.plan} is missing or unreadable"]
    try:
        from strategies.plan_records import Plan

        Plan.from_dict(plan)
    except Exception as exc:  # another schema, a damaged field: plan again
        return [f"{run.plan} cannot be read ({' '.join(str(exc).split())[:120]})"]
    profile = _read_json(run.profile)
    info = plan.get("profile") or {}
    asked = info.get("request") or {}
    differ: list[str] = []
    if profile is None or info.get("created") != profile.get("created"):
        differ.append(f"it was made from another profile than {run.profile}")
    for key in ("global_batch_size", "memory_budget", "world_size"):
        if asked.get(key) != getattr(request, key):
            differ.append(
                f"--{key.replace('_', '-')} {_shown(getattr(request, key))} "
                f"(the plan's: {_shown(asked.get(key))})"
            )
    overrides = dict(asked.get("config_overrides") or {})
    for key in sorted(set(overrides) | set(request.config_overrides)):
        if overrides.get(key) != request.config_overrides.get(key):
            differ.append(
                f"--{key.replace('_', '-')} {_shown(request.config_overrides.get(key))} "
                f"(the plan's: {_shown(overrides.get(key))})"
            )
    recorded = read_recorded(asked.get("only"))
    if recorded is None or not same_only(recorded, request.only):
        ours = " ".join(only_args(request.only)) or "none"
        theirs = " ".join(only_args(recorded)) if recorded is not None else "unreadable"
        differ.append(f"--only {ours} (the plan's: {theirs or 'none'})")
    return differ


def _shown(value: Any) -> str:
    return (
        "not given" if value is None else f"{value:g}" if isinstance(value, float) else str(value)
    )


def _check_resume(out: Path, request: RunRequest, reuse_profile: bool) -> None:
    """A resume that would plan anew (another search setting, a profile to redo) or tune a
    run that trained untuned, where training already started: refused before any work. The
    search ran for minutes, overwrote plan.json, and then the training child refused to
    continue from a checkpoint of another config (or, for an identical config, went on
    training under a plan.json that no longer described it)."""
    run = RunDir(out)
    if not (run.train.latest_checkpoint.exists() or run.train.metrics.exists()):
        return
    if not reuse_profile:
        why = [f"{run.profile} would be profiled again"]
    else:
        why = plan_differences(out, request)
    if not why and request.tune_trials and not run.tuned_plan.exists():
        why = [f"--tune-trials {request.tune_trials} (the run trained {run.plan} untuned)"]
    if not why and not request.tune_trials and run.tuned_plan.exists():
        why = [f"no --tune-trials (the run trained {run.tuned_plan}: give its --tune-trials)"]
    if why:
        raise UsageProblem(
            f"cannot resume {out}: its training has begun, and this run would not train the "
            f"same plan: {'; '.join(why)}; resume with the run's own flags (the command in "
            f"{run.run_log}), or choose another --out for the new settings"
        )


def _profile_stage(request: RunRequest, out: Path, say: ProgressFn) -> str:
    from advisor.profiling import ProfileRequest, over_budget, profile

    started = time.perf_counter()
    result = profile(
        ProfileRequest(
            model=request.model,
            model_args=dict(request.model_args),
            data=request.data,
            tokenizer=request.tokenizer,
            seq_len=request.seq_len,
            device=request.device,
            budget_s=request.budget_s,
            precisions=request.profiled_precisions,
            checkpointing=request.profiled_checkpointing,
            comm=request.comm,
        ),
        out,
        say,
    )
    counts: dict[str, int] = {}
    for row in result.probes:
        counts[row.status] = counts.get(row.status, 0) + 1
    shown = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    detail = f"{result.model.name} on {result.device.name}: {len(result.probes)} probes ({shown})"
    overrun = over_budget(time.perf_counter() - started, request.budget_s)
    # the README's +10%, missed: in the stage's closing line and run.json, as 'advisor
    # profile' says it on stderr
    return detail + (f"; {overrun}" if overrun is not None else "")


def _recommend_stage(request: RunRequest, out: Path, say: ProgressFn) -> tuple[str, Any]:
    from advisor.recommending import recommend
    from strategies.space import SearchRequest

    search = SearchRequest(
        global_batch_size=request.global_batch_size,
        memory_budget=request.memory_budget,
        world_size=request.world_size,
        trials=request.trials,
        config_overrides=dict(request.config_overrides),
        only=request.only,
        # The run's length, for amortising a compiled candidate's compile time; --tokens:
        # the steps its global batches take (at least one).
        run_steps=request.train_steps
        or max(1, (request.tokens or 0) // (request.global_batch_size * request.seq_len)),
    )
    try:
        plan = recommend(
            RunDir(out).profile,
            search,
            validate_top_k=request.validate_top,
            validation_rounds=request.validate_rounds,
            storage=request.storage,
            out=out,
            device=request.device,
            progress=lambda message: say(message, -1.0),
        )
    except StrategyError as exc:
        message = str(exc.args[0]) if len(exc.args) == 1 else ""
        if message.startswith(UNPRICED) and profile_again(out) is not None:
            # it priced nothing (a busy host timed its baseline out): say the way on, which
            # the resume takes (it profiles again), in the stage's one line
            exc.args = (
                f"{message}; the same command plus --resume profiles it again (a larger "
                "--budget-s gives its timing more time)",
            )
        raise
    detail = f"{plan.candidate.label()}"
    if plan.baseline and plan.baseline.measured_speedup is not None:
        detail += f"; measured {plan.baseline.measured_speedup:.2f}× the naive fp32 loop"
    elif plan.baseline and plan.baseline.expected_speedup:
        detail += f"; expected {plan.baseline.expected_speedup:.2f}× the naive fp32 loop"
    return detail, plan


def _tune_stage(request: RunRequest, out: Path, say: ProgressFn) -> tuple[str, Any]:
    """``advisor tune --plan RUN/plan.json --out RUN``: each trial trains as many tokens as the
    run's training will, so the tuned values are tuned for this run's length (the cosine
    schedule spans it). A resumed run resumes the study (same name, same storage)."""
    from advisor.tuning import SilentProgress, TuneRequest, tune
    from strategies.config import load_plan_config

    run = RunDir(out)
    config = load_plan_config(run.plan)
    tokens = request.tokens or (request.train_steps or 0) * config.tokens_per_step

    class Say(SilentProgress):
        def message(self, text: str) -> None:
            say(text, -1.0)

        def trial_finished(self, record: Any, steps: int) -> None:
            shown = ", ".join(
                f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                for k, v in record.params.items()
            )
            how = f"eval loss {record.score:.4f}" if record.score is not None else record.reason
            say(f"trial {record.number} ({shown}): {record.state}; {how}", -1.0)

    result = tune(
        run.plan,
        TuneRequest(
            trials=request.tune_trials,
            tokens_per_trial=tokens,
            storage=request.storage,
            device=request.device,
            eval_batches=request.eval_batches,
            val_data=request.val_data,
        ),
        out=out,
        progress=Say(),
    )
    best, summary = result.best, result.summary
    shown = ", ".join(
        f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in best.params.items()
    )
    detail = (
        f"trial {best.number} of {len(result.trials)}: {shown}, eval loss {best.score:.4f}; "
        f"cost {summary.cost_runs:.2f}x one run"
    )
    return detail, result


def _train_stage(request: RunRequest, out: Path, show_progress: bool) -> tuple[str, Any]:
    """``advisor train --plan RUN/plan.json`` in a child process, as a user would run it.

    A child, not a call: the trainer's memory is then what the plan predicted (this process
    holds optuna, pandas and the search), and ddp/fsdp plans go through torchrun the same way.
    Its stderr (progress, errors) is passed through; its last line names a failure.
    """
    from advisor.errors import AdvisorError
    from profilers.metrics_record import read_metrics

    run = RunDir(out)
    resume = request.resume and run.train.latest_checkpoint.exists()
    options = RunOptions(
        out=run.train.root,
        steps=request.train_steps,
        tokens=request.tokens,
        resume=resume,
        checkpoint_every=request.checkpoint_every,
        eval_every=request.eval_every,
        eval_batches=request.eval_batches,
        val_data=request.val_data,
        keep_checkpoints=request.keep_checkpoints,
        device=request.device,
        progress=show_progress,
    )
    plan = run.tuned_plan if request.tune_trials else run.plan
    code, last = _run_advisor(options.train_args(plan))
    if code != 0:
        failed = AdvisorError if code != UsageProblem.exit_code else UsageProblem
        raise failed(f"training failed (exit {code}): {last.removeprefix('error: ')}")
    metrics = read_metrics(run.train.metrics)
    train, evals = metrics.train, metrics.evals
    if not train:
        return "no training step logged", None
    loss = train[-1].loss
    text = f"{train[-1].step} steps, loss {loss if loss is not None else math.nan:.3f}"
    if evals and evals[-1].eval_loss is not None:
        text += f", eval {evals[-1].eval_loss:.3f}"
    return text, metrics


class Terminated(KeyboardInterrupt):
    """SIGTERM stopped ``advisor run``: handled as Ctrl-C is (the partial run gets its report),
    exit 128 + 15."""

    signum = signal.SIGTERM


# The stage's ``python -m advisor`` child while one runs: SIGTERM to this process goes on to it.
_CHILDREN: list[Any] = []
# The SIGTERMs sigterm_stops_the_run took (none: every interrupt so far was Ctrl-C).
_TERMINATED: list[int] = []


@contextlib.contextmanager
def sigterm_stops_the_run() -> Iterator[None]:
    """SIGTERM (``kill PID``, a scheduler's preemption) stops the run as Ctrl-C does, and goes
    on to the training child, which checkpoints after its step. Until 2026-12-07 it killed
    this process alone: the child trained on as an orphan with nobody reading its output and
    no report was written. Main thread only (signal handlers can be set nowhere else).
    'advisor tune' stops its study with it too (its trial's child stops on its own)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    from profilers.stopping import interrupted_here

    def handle(signum: int, frame: Any) -> None:
        for child in _CHILDREN:
            with contextlib.suppress(OSError):
                child.send_signal(signal.SIGTERM)
        _TERMINATED.append(signum)
        try:
            # A profile running (profilers.stopping) takes it as its first Ctrl-C: it ends
            # within seconds with what it measured (ProfileInterrupted, saved), where
            # SIGTERM dropped everything; a second one, or no profile, stops here.
            interrupted_here()
        except KeyboardInterrupt:
            raise Terminated from None

    _TERMINATED.clear()
    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _TERMINATED.clear()


def _as_terminated(exc: KeyboardInterrupt) -> None:
    """Mark an interrupt that SIGTERM caused (a profile's own ProfileInterrupted after
    :func:`sigterm_stops_the_run` asked it to stop) as SIGTERM's: run.json, the CLI's line
    and exit code 143 then name it."""
    if _TERMINATED and getattr(exc, "signum", None) is None:
        with contextlib.suppress(AttributeError):
            exc.signum = signal.SIGTERM  # type: ignore[attr-defined]


def _run_advisor(args: list[str]) -> tuple[int, str]:
    """Run ``python -m advisor ARGS``; stream its stderr through; return (exit code, last line).

    The child writes its stderr to a file (``OUT/train.log`` of its ``--out``, else a temporary
    one) that this process follows, not to a pipe: a pipe broke when ``advisor run`` died
    (SIGKILL, a closed terminal), and the child's next progress line raised BrokenPipeError
    before the checkpoint its SIGTERM (term_with_parent) asked for: the steps since the last
    periodic checkpoint were lost.
    """
    import tempfile

    with contextlib.ExitStack() as stack:
        if "--out" in args:
            log = Path(args[args.index("--out") + 1]) / rundir.TRAIN_LOG
            log.parent.mkdir(parents=True, exist_ok=True)
        else:
            log = Path(stack.enter_context(tempfile.TemporaryDirectory())) / rundir.TRAIN_LOG
        sink = stack.enter_context(open(log, "a", encoding="utf-8"))
        source = stack.enter_context(open(log, encoding="utf-8", errors="replace"))
        source.seek(0, 2)  # this child's lines only
        return _follow_child(args, sink, source)


def _follow_child(args: list[str], sink: Any, source: Any) -> tuple[int, str]:
    import subprocess
    import sys

    from advisor.tuning import term_with_parent

    last = ""
    pending = ""

    def lines(text: str) -> None:
        nonlocal last, pending
        *whole, pending = (pending + text).split("\n")
        for line in whole:
            if line.strip():
                last = line.strip()
            if not line.startswith("error: "):  # the stage's error line says it once
                sys.stderr.write(line + "\n")
        sys.stderr.flush()

    with subprocess.Popen(
        [sys.executable, "-m", "advisor", *args],
        stdout=subprocess.DEVNULL,
        stderr=sink,
        preexec_fn=term_with_parent(),  # SIGKILL of this process: the child still checkpoints
    ) as child:
        _CHILDREN.append(child)
        stopped: KeyboardInterrupt | None = None
        try:
            while True:
                try:
                    exited = child.poll() is not None
                    text = source.read()
                    if text:
                        lines(text)
                    elif exited:  # read after it exited: nothing more comes
                        break
                    else:
                        time.sleep(0.05)
                except KeyboardInterrupt as exc:
                    # The child got the same Ctrl-C (or SIGTERM, sent on by
                    # sigterm_stops_the_run) and checkpoints after its step: read on until it
                    # exits, so the report that follows reads whole files (it was rendered
                    # before the child's last step and checkpoint). A second one goes at once.
                    if stopped is not None:
                        raise
                    stopped = exc
        finally:
            _CHILDREN.remove(child)
        if pending:
            lines("\n")
        if stopped is not None:
            child.wait()
            with contextlib.suppress(AttributeError):
                stopped.child_said = _where_it_stopped(last)  # type: ignore[attr-defined]
            raise stopped
    return child.returncode, last


def _where_it_stopped(line: str) -> str:
    """The training child's last line after a signal ("error: SIGTERM: stopped after step 9,
    checkpoint saved in DIR; continue with the same command plus --resume"), as where it
    stopped: the signal and the child's own way on left out (the run's error line says how
    the run continues). Empty for any other line."""
    text = line.removeprefix("error: ")
    _, _, text = text.partition(": ")
    text = text.split("; continue with", 1)[0]
    return text if text.startswith("stopped ") else ""


class _RunLog:
    """RUN/run.json: the request, the command, and each stage's outcome, rewritten as it goes."""

    def __init__(self, out: Path, request: RunRequest) -> None:
        self.path = RunDir(out).run_log
        self.data: dict[str, Any] = {
            "command": request.command(out),
            # (val_data only when given: run.json of a run without it is as it was)
            "request": {
                k: v
                for k, v in asdict(request).items()
                if k != "resume" and not (k == "val_data" and v is None)
            },
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "steps": request.train_steps,
            "stages": {},
        }

    def record(self, stage: StageResult) -> None:
        self.data["stages"][stage.name] = {
            "status": stage.status,
            "detail": stage.detail,
            "elapsed_s": round(stage.elapsed_s, 3),
        }
        write_atomically(self.path, json.dumps(self.data, indent=1, default=str) + "\n")


def run(request: RunRequest, out: Path, progress: RunProgress | None = None) -> RunResult:
    """Run every stage into ``out``; returns what each stage did. Raises the failing stage's
    error after writing the (partial) report."""
    display = progress or _Silent()
    _check_out(out, request)
    request = _with_recorded_val_data(out, request)
    # The data and --val-data refused now, not by the training child after the profile (which
    # reads the train split only) and the search: minutes.
    from advisor.training import check_data
    from strategies.config import TrainConfig

    check_data(TrainConfig(**request.workload()), request.val_data)
    # Weights of another model fail at the first training step: refuse them before the profile.
    from advisor.trainer.checkpoint import check_initial_weights

    check_initial_weights(
        request.model, dict(request.model_args), request.config_overrides.get("init_from")
    )
    # A --storage no study can live in failed the recommend stage after the whole profile.
    from strategies.study import storage_problem

    if request.storage is not None and (problem := storage_problem(request.storage)):
        raise UsageProblem(problem)
    reuse_profile = request.resume and reusable_profile(out, request)
    if request.resume:
        _check_resume(out, request, reuse_profile)
    out.mkdir(parents=True, exist_ok=True)
    log = _RunLog(out, request)
    stages: list[StageResult] = []
    plan: Any = None
    tuned: Any = None
    trained: Any = None
    total = 5 if request.tune_trials else 4

    def stage(index: int, name: str, description: str, body: Callable[[ProgressFn], str]) -> None:
        started = time.perf_counter()
        status = "failed"
        detail = shown = ""
        # run.json says which stage runs: one killed (SIGKILL, the out-of-memory killer) left
        # no trace of it, as if the run had never got that far
        log.record(StageResult(name=name, status="running"))
        try:
            with display.stage(index, name, description) as say:
                detail = body(say)
            status = "done"
        except BaseException as exc:
            from reports.runfiles import INTERRUPTED_STATUS, interruption

            if isinstance(exc, KeyboardInterrupt):
                _as_terminated(exc)
                # Ctrl-C, or SIGTERM (Terminated): the stage was stopped, not failed; until
                # 2026-12-07 both were recorded as failed with "interrupted (Ctrl-C)".
                status = INTERRUPTED_STATUS
                detail = interruption(getattr(exc, "signum", None))
                # where the training child stopped, on the console (run.json keeps the
                # detail the report reads as an interruption)
                said = getattr(exc, "child_said", "")
                shown = f"{detail}: {said}" if said else detail
            else:
                detail = shown = " ".join(str(exc).split()) or type(exc).__name__
            raise
        finally:
            result = StageResult(
                name=name, status=status, detail=detail, elapsed_s=time.perf_counter() - started
            )
            stages.append(result)
            log.record(result)
            display.finished(name, status, shown if status != "done" else detail, result.elapsed_s)

    def skipped(name: str, detail: str) -> None:
        result = StageResult(name=name, status="skipped", detail=detail)
        stages.append(result)
        log.record(result)
        display.finished(name, "skipped", detail, 0.0)

    def do_recommend(say: ProgressFn) -> str:
        nonlocal plan
        detail, plan = _recommend_stage(request, out, say)
        return detail

    def do_tune(say: ProgressFn) -> str:
        nonlocal tuned
        detail, tuned = _tune_stage(request, out, say)
        return detail

    def do_train(say: ProgressFn) -> str:
        nonlocal trained
        detail, trained = _train_stage(request, out, display.train_progress)
        return detail

    if request.resume and not _run_files(out):
        _note(display, f"--resume: no run in {out} yet: starting one")
    elif request.resume and not reuse_profile and (again := profile_again(out)) is not None:
        _note(display, f"--resume: profiling again, {RunDir(out).profile}: {again}")
    failure: BaseException | None = None
    with sigterm_stops_the_run():
        try:
            if reuse_profile:
                skipped("profile", f"reusing {RunDir(out).profile}{_profile_unlike(out, request)}")
            else:
                stage(
                    1,
                    "profile",
                    f"short probes of {request.model} (budget {request.budget_s:g} s)",
                    lambda say: _profile_stage(request, out, say),
                )
            differ = plan_differences(out, request) if request.resume else []
            if request.resume and not differ:
                skipped("recommend", f"reusing {RunDir(out).plan}")
                plan = _saved_plan(out)
            else:
                if request.resume and RunDir(out).plan.exists():
                    _note(
                        display,
                        f"--resume: planning again, {RunDir(out).plan}: {'; '.join(differ)}",
                    )
                stage(
                    2,
                    "recommend",
                    f"search at global batch {request.global_batch_size}, validate the top "
                    f"{request.validate_top}",
                    do_recommend,
                )
            steps = (
                f"{request.tokens:,} tokens" if request.tokens else f"{request.train_steps} steps"
            )
            if request.tune_trials:
                stage(
                    3,
                    "tune",
                    f"{request.tune_trials} trials of lr / warm-up / weight decay, {steps} each",
                    do_tune,
                )
            which = "the tuned plan's" if request.tune_trials else "the plan's"
            stage(total - 1, "train", f"{which} config for {steps}", do_train)
        except BaseException as exc:  # Ctrl-C included: the partial run still gets its report
            failure = exc
        report: Path | None = None
        if (
            failure is not None
            and not isinstance(failure, KeyboardInterrupt)
            and not _run_files(out)
        ):
            # Input refused in the first stage: nothing to show (the error line says it all).
            # The report stage was recorded as failed, telling the user to run 'advisor run'.
            skipped("report", "nothing to report: no stage saved anything")
        else:
            report = _report(out, stage, failure, total)
    if failure is not None:
        raise failure
    return RunResult(
        out=out, report=report, stages=tuple(stages), plan=plan, tuned=tuned, train=trained
    )


def _with_recorded_val_data(out: Path, request: RunRequest) -> RunRequest:
    """A ``--resume`` that names no --val-data keeps the one the run was started with
    (run.json's request): its tune stage then resumes the same study, and its training
    evaluates on the same file (the trainer keeps it too, from train_config.json)."""
    if not request.resume or request.val_data is not None:
        return request
    recorded = (_read_json(RunDir(out).run_log) or {}).get("request")
    val_data = recorded.get("val_data") if isinstance(recorded, dict) else None
    return replace(request, val_data=val_data) if isinstance(val_data, str) else request


def _note(display: RunProgress, text: str) -> None:
    """A line about what the run does that its flags do not say (RunProgress.note, optional)."""
    note = getattr(display, "note", None)
    if note is not None:
        note(text)


def _saved_plan(out: Path) -> Any:
    """RUN/plan.json as a Plan (None if it cannot be read): a resumed run's summary names the
    recommendation it trains, as a run that searched does."""
    from strategies.plan_records import Plan

    data = _read_json(RunDir(out).plan)
    try:
        return Plan.from_dict(data) if data is not None else None
    except Exception:
        return None


def _profile_unlike(out: Path, request: RunRequest) -> str:
    """What the reused RUN/profile.json was measured with that this run asks otherwise
    (--budget-s, --precision): said with the stage, not silently ignored."""
    data = _read_json(RunDir(out).profile) or {}
    differ = []
    budget = data.get("budget_s")
    if isinstance(budget, (int, float)) and budget != request.budget_s:
        differ.append(f"--budget-s {budget:g}, not {request.budget_s:g}")
    recorded = data.get("precisions")
    asked = request.profiled_precisions
    if (tuple(recorded) if recorded else None) != (tuple(asked) if asked else None):
        shown = " ".join(recorded) if recorded else "all"
        differ.append(f"--precision {shown}, not {' '.join(asked) if asked else 'all'}")
    if not differ:
        return ""
    return (
        f" (profiled with {'; '.join(differ)}: a resume reuses the profile of the same workload;"
        " profile anew in another --out)"
    )


def _report(
    out: Path, stage: Callable[..., None], failure: BaseException | None, index: int = 4
) -> Path | None:
    """Render RUN/report.html from whatever the run has; after a failure, never mask it."""
    from reports import ReportError, write_report

    path: list[Path] = []

    def body(say: ProgressFn) -> str:
        path.append(write_report(out))
        return str(path[0])

    try:
        stage(index, "report", "one self-contained HTML page", body)
    except ReportError:
        if failure is None:
            raise
        return None
    except Exception:
        if failure is None:
            raise
        return None  # the stage's own failure is the one to report
    return path[0] if path else None
