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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from advisor.errors import UsageProblem
from advisor.trainer.options import (
    DEFAULT_EVAL_BATCHES,
    DEFAULT_KEEP_CHECKPOINTS,
    RunOptions,
    run_steps,
)
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
from strategies.errors import StrategyError
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
            .option("checkpoint_every", self.checkpoint_every)
            .option("keep_checkpoints", self.keep_checkpoints, default=DEFAULT_KEEP_CHECKPOINTS)
            .option("out", out)
        )
        return command.argv()


@dataclass(frozen=True, kw_only=True)
class StageResult:
    name: str
    status: str  # done | skipped | failed | not run
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


class _Silent:
    train_progress = False

    @contextlib.contextmanager
    def stage(self, index: int, name: str, description: str) -> Iterator[ProgressFn]:
        yield lambda _message, _fraction: None

    def finished(self, name: str, status: str, detail: str, elapsed_s: float) -> None:
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


def reusable_profile(out: Path, request: RunRequest) -> bool:
    """RUN/profile.json exists, finished, and measured this request's workload (else
    UsageProblem)."""
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
    return True


def reusable_plan(out: Path, request: RunRequest) -> bool:
    """RUN/plan.json was made from RUN/profile.json for this request's search settings."""
    plan = _read_json(RunDir(out).plan)
    profile = _read_json(RunDir(out).profile)
    if plan is None or profile is None:
        return False
    info = plan.get("profile") or {}
    asked = info.get("request") or {}
    same = (
        info.get("created") == profile.get("created")
        and asked.get("global_batch_size") == request.global_batch_size
        and asked.get("memory_budget") == request.memory_budget
        and asked.get("world_size") == request.world_size
        and dict(asked.get("config_overrides") or {}) == dict(request.config_overrides)
        and (recorded := read_recorded(asked.get("only"))) is not None
        and same_only(recorded, request.only)
    )
    return bool(same)


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

    def handle(signum: int, frame: Any) -> None:
        for child in _CHILDREN:
            with contextlib.suppress(OSError):
                child.send_signal(signal.SIGTERM)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_advisor(args: list[str]) -> tuple[int, str]:
    """Run ``python -m advisor ARGS``; stream its stderr through; return (exit code, last line)."""
    import subprocess
    import sys

    from advisor.tuning import term_with_parent

    last = ""
    with subprocess.Popen(
        [sys.executable, "-m", "advisor", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        preexec_fn=term_with_parent,  # SIGKILL of this process: the child still checkpoints
    ) as child:
        assert child.stderr is not None
        _CHILDREN.append(child)
        stopped: KeyboardInterrupt | None = None
        try:
            while True:
                try:
                    for line in child.stderr:
                        if line.strip():
                            last = line.strip()
                        if not line.startswith("error: "):  # the stage's error line says it once
                            sys.stderr.write(line)
                    break
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
        if stopped is not None:
            child.wait()
            raise stopped
    return child.returncode, last


class _RunLog:
    """RUN/run.json: the request, the command, and each stage's outcome, rewritten as it goes."""

    def __init__(self, out: Path, request: RunRequest) -> None:
        self.path = RunDir(out).run_log
        self.data: dict[str, Any] = {
            "command": request.command(out),
            "request": {k: v for k, v in asdict(request).items() if k != "resume"},
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
        detail = ""
        try:
            with display.stage(index, name, description) as say:
                detail = body(say)
            status = "done"
        except BaseException as exc:
            from reports.runfiles import INTERRUPTED_STATUS, interruption

            if isinstance(exc, KeyboardInterrupt):
                # Ctrl-C, or SIGTERM (Terminated): the stage was stopped, not failed; until
                # 2026-12-07 both were recorded as failed with "interrupted (Ctrl-C)".
                status = INTERRUPTED_STATUS
                detail = interruption(getattr(exc, "signum", None))
            else:
                detail = " ".join(str(exc).split()) or type(exc).__name__
            raise
        finally:
            result = StageResult(
                name=name, status=status, detail=detail, elapsed_s=time.perf_counter() - started
            )
            stages.append(result)
            log.record(result)
            display.finished(name, status, detail, result.elapsed_s)

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

    failure: BaseException | None = None
    with sigterm_stops_the_run():
        try:
            if reuse_profile:
                skipped("profile", f"reusing {RunDir(out).profile}")
            else:
                stage(
                    1,
                    "profile",
                    f"short probes of {request.model} (budget {request.budget_s:g} s)",
                    lambda say: _profile_stage(request, out, say),
                )
            if request.resume and reusable_plan(out, request):
                skipped("recommend", f"reusing {RunDir(out).plan}")
            else:
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
        report = _report(out, stage, failure, total)
    if failure is not None:
        raise failure
    return RunResult(
        out=out, report=report, stages=tuple(stages), plan=plan, tuned=tuned, train=trained
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
