"""advisor.tuning's study loop on a scripted objective: pruning prunes, a killed study resumes,
the tuned plan keeps the speed config. (A real ``advisor train`` per trial: test_tuning_cli.)"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from advisor.errors import AdvisorError
from advisor.tuning import (
    ATTR,
    OnEval,
    TrialOutcome,
    TrialSpec,
    TuneRequest,
    prepare,
    tune,
)
from profilers.rundir import RunDir
from strategies.config import TrainConfig, load_plan_config
from strategies.plan_records import Plan
from strategies.tuning import EvalPoint, read_trials, speed_changes

GOLDEN = Path(__file__).parent.parent / "data" / "golden" / "cpu-validated" / "plan.json"
BEST_LR = 3e-3


def write_plan(directory: Path, **config: object) -> Path:
    """The golden plan record with a small config (a ddp plan unless told otherwise)."""
    plan = Plan.from_dict(json.loads(GOLDEN.read_text()))
    base = dict(
        model="gpt-tiny",
        data="stdlib",
        seq_len=32,
        global_batch_size=4,
        micro_batch_size=2,
        grad_accum_steps=1,
        parallelism="ddp",
        world_size=2,
        warmup_steps=2,
    )
    base.update(config)
    plan = dataclasses.replace(plan, config=TrainConfig(**base))  # type: ignore[arg-type]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "plan.json"
    path.write_text(json.dumps(plan.to_dict(), indent=1))
    return path


def scripted_loss(config: TrainConfig, step: int, steps: int) -> float:
    """Falls with the steps; the further lr is from BEST_LR (in decades), the higher."""
    distance = abs(math.log10(config.lr) - math.log10(BEST_LR))
    return 2.0 + 2.0 * distance + 0.05 * config.weight_decay + 1.0 * (1 - step / steps)


class Scripted:
    """A runner that trains nothing: its eval curve is :func:`scripted_loss`."""

    def __init__(self, delay_s: float = 0.0, interrupt_at: int | None = None) -> None:
        self.delay_s = delay_s
        self.interrupt_at = interrupt_at
        self.runs: list[tuple[int, int]] = []  # (trial number, evals it ran)

    def __call__(self, spec: TrialSpec, on_eval: OnEval) -> TrialOutcome:
        if self.interrupt_at is not None and len(self.runs) == self.interrupt_at:
            # as a child does on the signal: a checkpoint after its step, then it exits
            (spec.directory.checkpoints / "step_00000001").mkdir(parents=True)
            raise KeyboardInterrupt
        per_step = spec.config.tokens_per_step
        evals = []
        for step in range(spec.eval_every, spec.steps + 1, spec.eval_every):
            time.sleep(self.delay_s)
            point = EvalPoint(
                step=step,
                tokens=step * per_step,
                eval_loss=scripted_loss(spec.config, step, spec.steps),
            )
            evals.append(point)
            if on_eval(point):
                self.runs.append((spec.number, len(evals)))
                return TrialOutcome(state="pruned", evals=tuple(evals), tokens=step * per_step)
        self.runs.append((spec.number, len(evals)))
        return TrialOutcome(state="complete", evals=tuple(evals), tokens=spec.steps * per_step)


def _request(trials: int, **kw: object) -> TuneRequest:
    return TuneRequest(trials=trials, tokens_per_trial=40 * 4 * 32, seed=3, **kw)  # type: ignore[arg-type]


def test_pruning_stops_hopeless_trials_and_the_winner_is_the_best_complete(
    tmp_path: Path,
) -> None:
    plan = write_plan(tmp_path)
    runner = Scripted()
    result = tune(plan, _request(16), runner=runner)
    states = [t.state for t in result.trials]
    assert len(result.trials) == 16
    assert states.count("pruned") >= 6, states
    # A pruned trial ran fewer evaluations than a complete one (10 each).
    evals = dict(runner.runs)
    assert all(evals[t.number] < 10 for t in result.trials if t.state == "pruned")
    # None was judged inside a warm-up: the longest (the range's top, 40 // 5 = 8 steps) is
    # over by the first rung, the second eval (every 4 steps).
    assert prepare(plan, _request(16), None).first_rung == 8
    assert all(evals[t.number] >= 2 for t in result.trials if t.state == "pruned")
    assert "first rung at step 8, after the longest warm-up: 8 steps" in result.summary.pruner
    assert all(evals[t.number] == 10 for t in result.trials if t.state == "complete")
    # The study cost less than its trials: tokens trained / one trial's (10 of 16 with this
    # objective and seed: TPE's later trials are good ones, which the pruner lets run).
    assert result.summary.cost_runs < 16 * 0.7
    assert result.summary.tokens_trained == sum(t.tokens for t in result.trials)
    complete = [t for t in result.trials if t.state == "complete"]
    assert result.best.score == min(t.score for t in complete if t.score is not None)
    # Trial 0 is the plan's own values; the study never ends worse than them.
    assert result.trials[0].params == {"lr": 1e-3, "warmup": 2, "wd": 0.1}
    assert result.summary.base_score is not None
    assert result.best.score is not None and result.best.score <= result.summary.base_score
    lr = next(s for s in result.summary.sensitivity if s.name == "lr")
    assert lr.trials >= 3 and lr.rho is not None


def test_the_tuned_plan_keeps_the_speed_config_and_trains_with_advisor_train(
    tmp_path: Path,
) -> None:
    plan_path = write_plan(tmp_path)
    result = tune(plan_path, _request(5), runner=Scripted())
    original = load_plan_config(plan_path)
    tuned = load_plan_config(RunDir(tmp_path).tuned_plan)  # what advisor train --plan reads
    assert speed_changes(original, tuned) == []
    assert tuned.global_batch_size == original.global_batch_size
    assert (tuned.micro_batch_size, tuned.grad_accum_steps, tuned.world_size) == (2, 1, 2)
    best = result.best.params
    assert (tuned.lr, tuned.warmup_steps, tuned.weight_decay) == (
        best["lr"],
        best["warmup"],
        best["wd"],
    )
    saved = json.loads(RunDir(tmp_path).tuned_plan.read_text())
    assert Plan.from_dict(saved).reasons[-1].startswith("hyper-parameters tuned by advisor tune")
    on_disk = read_trials(RunDir(tmp_path).tune.trials)
    assert [t.number for t in on_disk] == [t.number for t in result.trials]
    # Each trial's own plan is the tuned config of its values, the same speed keys.
    for t in on_disk:
        trial_plan = load_plan_config(
            RunDir(tmp_path).tune.trial_plan(result.summary.study_name, t.number)
        )
        assert speed_changes(original, trial_plan) == []
        assert trial_plan.lr == t.params["lr"]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_trial_left_running_by_a_killed_worker_is_failed_and_rerun(tmp_path: Path) -> None:
    plan = write_plan(tmp_path)
    tune(plan, _request(3), runner=Scripted())
    setup = prepare(plan, _request(3), None)
    study = optuna.load_study(study_name=setup.study_name, storage=setup.storage)
    # What a kill -9 in the middle of trial 3 leaves: a RUNNING trial of a dead process.
    killed = study.ask()
    killed.suggest_float("lr", 1e-4, 1e-2, log=True)
    killed.suggest_int("warmup", 0, 8)
    killed.suggest_float("wd", 0.0, 0.3)
    import socket

    killed.set_user_attr(
        ATTR, {"host": socket.gethostname(), "pid": _dead_pid(), "heartbeat": time.time()}
    )
    killed.report(9.0, 4)
    runner = Scripted()
    result = tune(plan, _request(5), runner=runner)
    by_number = {t.number: t for t in result.trials}
    assert by_number[3].state == "failed"
    rerun = by_number[4]
    assert "re-run as trial 4" in by_number[3].reason
    assert rerun.params == by_number[3].params
    assert rerun.state in ("complete", "pruned")
    # 3 before + the re-run + 1 new = 5 counted trials; the failed one is not counted.
    assert [n for n, _ in runner.runs] == [4, 5]
    assert len(result.trials) == 6


def test_a_trial_killed_before_its_values_were_drawn_is_failed_and_not_counted(
    tmp_path: Path,
) -> None:
    """A RUNNING trial without values (killed between ask() and its first write) was skipped
    by the reclaim, and a study waiting for its running trials waited for it forever."""
    plan = write_plan(tmp_path)
    tune(plan, _request(2), runner=Scripted())
    setup = prepare(plan, _request(2), None)
    study = optuna.load_study(study_name=setup.study_name, storage=setup.storage)
    import socket

    bare = study.ask()
    bare.set_user_attr(
        ATTR, {"host": socket.gethostname(), "pid": _dead_pid(), "heartbeat": time.time()}
    )
    runner = Scripted()
    result = tune(plan, _request(3), runner=runner)  # would hang in _wait_for_others
    states = {t.number: t.state for t in result.trials}
    assert states[bare.number] == "failed"
    assert [n for n, _ in runner.runs] == [bare.number + 1]  # 2 + 1 new = 3 counted trials


def test_an_interrupted_study_resumes_where_it_stopped(tmp_path: Path) -> None:
    plan = write_plan(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        tune(plan, _request(4), runner=Scripted(interrupt_at=2))
    trials = read_trials(RunDir(tmp_path).tune.trials)  # written after each trial
    # ... and after the interrupted one: failed, its values waiting for the next run
    assert [t.state for t in trials] == ["complete", trials[1].state, "failed", "waiting"]
    assert trials[2].rerun_as == 3 and trials[3].params == trials[2].params
    name = prepare(plan, _request(4), None).study_name
    interrupted = RunDir(tmp_path).tune.trial(name, 2).root
    assert interrupted.is_dir() and not (interrupted / "checkpoints").exists()  # no bulk left
    runner = Scripted()
    result = tune(plan, _request(4), runner=runner)
    states = {t.number: t.state for t in result.trials}
    assert states[2] == "failed"  # the interrupted one, re-queued as trial 3
    assert result.trials[3].params == dict(
        optuna.load_study(
            study_name=prepare(plan, _request(4), None).study_name,
            storage=prepare(plan, _request(4), None).storage,
        )
        .trials[2]
        .params
    )
    assert [n for n, _ in runner.runs] == [3, 4]  # the re-run, then one new trial
    assert sum(s != "failed" for s in states.values()) == 4


def test_a_failed_trial_stops_the_study_with_its_reason(tmp_path: Path) -> None:
    plan = write_plan(tmp_path)

    def broken(spec: TrialSpec, on_eval: OnEval) -> TrialOutcome:
        return TrialOutcome(state="failed", reason="CUDA out of memory", exit_code=1)

    with pytest.raises(AdvisorError, match=r"trial 0 failed \(exit 1\): CUDA out of memory"):
        tune(plan, _request(3), runner=broken)


def test_a_diverged_trial_counts_as_pruned(tmp_path: Path) -> None:
    plan = write_plan(tmp_path)
    calls = []

    def diverging(spec: TrialSpec, on_eval: OnEval) -> TrialOutcome:
        calls.append(spec.number)
        if spec.number == 1:
            return TrialOutcome(state="diverged", reason="loss became nan at step 3")
        return Scripted()(spec, on_eval)

    result = tune(plan, _request(3), runner=diverging)
    assert result.trials[1].state == "pruned"
    assert result.trials[1].reason.startswith("diverged: loss became nan")
    assert calls == [0, 1, 2]


def test_the_python_api_takes_a_plan_record_or_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import advisor

    monkeypatch.setattr("advisor.tuning.ChildTrainer", Scripted)
    plan = Plan.from_dict(json.loads(write_plan(tmp_path / "src").read_text()))
    with pytest.raises(advisor.UsageProblem, match="needs out="):
        advisor.tune(plan)
    with pytest.raises(advisor.UsageProblem, match="trials"):
        advisor.tune(plan, trials=0, out=tmp_path / "x")
    result = advisor.tune(plan, trials=3, tokens_per_trial=40 * 128, out=tmp_path / "out", seed=1)
    assert isinstance(result, advisor.TuneResult)
    assert result.plan_path == RunDir(tmp_path / "out").tuned_plan
    assert result.plan.config == load_plan_config(result.plan_path)
    assert len(result.trials) == 3
    again = advisor.tune(tmp_path / "src", trials=2, tokens_per_trial=40 * 128, seed=1)
    assert again.out == tmp_path / "src"


def test_before_the_trials_it_notes_what_would_surprise_a_user(tmp_path: Path) -> None:
    """A new user's audit: a 20-step trial with the plan's 20-step warm-up was pruned at step
    18 while ramping, a --tokens-per-trial of 3,000 trained 2,048 without a word, and the
    plan's values outside the ranges were not named."""
    plan = write_plan(tmp_path, warmup_steps=20)  # 128 tokens a step
    ramping = prepare(plan, TuneRequest(trials=2, tokens_per_trial=20 * 128 + 100), None)
    notes = ramping.notes()
    assert notes[0] == (
        "--tokens-per-trial 2,660 is 20 whole steps of 128 tokens: every trial trains 2,560"
    )
    assert notes[1].startswith("a trial's warm-up can last 20 steps, past the first pruning at")
    assert "--tokens-per-trial 12,800 (5x the warm-up)" in notes[1]
    # The suggested --params keeps every other parameter tuned (it named warmup alone, so
    # following it tuned the warm-up only).
    assert notes[1].endswith("(--params lr,warmup=0:4,wd)")
    assert len(notes) == 2  # the golden plan was measured here: not an estimate
    own = prepare(
        plan, TuneRequest(trials=2, tokens_per_trial=20 * 128, params="lr=1e-4:1e-3,wd"), None
    )
    assert own.notes()[0].endswith("(--params lr=0.0001:0.001,wd,warmup=0:4)")
    quiet = prepare(plan, TuneRequest(trials=2, tokens_per_trial=200 * 128), None)
    assert quiet.notes() == []


def test_plan_values_outside_the_ranges_are_named(tmp_path: Path) -> None:
    plan = write_plan(tmp_path, warmup_steps=20, lr=1e-3)
    said: list[str] = []

    class Say:
        def message(self, text: str) -> None:
            said.append(text)

        def __getattr__(self, name: str) -> object:
            return lambda *a, **k: None

    tune(
        plan,
        TuneRequest(trials=1, tokens_per_trial=40 * 128, params="lr=1e-2:1e-1,warmup", seed=3),
        progress=Say(),  # type: ignore[arg-type]
        runner=Scripted(),
    )
    outside = [m for m in said if m.startswith("the plan's own values are outside")]
    # warmup 20 is in its default range (the plan's own, within a 40-step trial): not named
    assert outside == [
        "the plan's own values are outside the ranges tuned: lr 0.001 (range 0.01 to 0.1); "
        "the study does not try them"
    ]


def test_a_failed_trial_is_rerun_when_the_same_command_runs_again(tmp_path: Path) -> None:
    """A user's audit: 'advisor tune --device cuda' on a CPU host failed at trial 0 (exit 2);
    the same study with --device cpu then ran nothing and ended "no trial completed": the
    failed trial counted toward --trials."""
    plan = write_plan(tmp_path)

    def no_device(spec: TrialSpec, on_eval: OnEval) -> TrialOutcome:
        return TrialOutcome(state="failed", reason="no CUDA device is visible", exit_code=2)

    from advisor.errors import UsageProblem

    with pytest.raises(UsageProblem, match="running the study again re-runs this trial"):
        tune(plan, _request(2), runner=no_device)
    runner = Scripted()
    result = tune(plan, _request(2), runner=runner)
    assert [n for n, _ in runner.runs] == [1, 2]  # trial 0's values again, then a new one
    by_number = {t.number: t for t in result.trials}
    assert by_number[1].params == by_number[0].params == {"lr": 1e-3, "warmup": 2, "wd": 0.1}
    assert by_number[0].rerun_as == 1
    assert by_number[0].reason == "no CUDA device is visible; re-run as trial 1"
    assert result.summary.base_score is not None  # the plan's own values were scored
    assert result.summary.counts == {"complete": 2, "pruned": 0, "failed": 0, "re-run": 1}


def test_an_interrupted_trial_is_counted_as_re_run_not_failed(tmp_path: Path) -> None:
    plan = write_plan(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        tune(plan, _request(3), runner=Scripted(interrupt_at=1))
    result = tune(plan, _request(3), runner=Scripted())
    stopped = result.trials[1]
    assert stopped.state == "failed" and stopped.rerun_as == 2
    assert stopped.reason == "interrupted (Ctrl-C); re-run as trial 2"
    # its stderr.log and metrics are there, in the study's own folder
    assert stopped.directory == f"tune/{result.summary.study_name}/trial_0001"
    assert result.summary.counts == {"complete": 3, "pruned": 0, "failed": 0, "re-run": 1}


def test_study_json_always_describes_the_study_of_trials_jsonl(tmp_path: Path) -> None:
    """A user's audit: a second study in the same OUT (other ranges), stopped after a trial,
    left the first study's study.json (5 trials, lr/warmup/wd) beside the second's
    trials.jsonl (warmup only), and the report showed both as one study."""
    plan = write_plan(tmp_path)
    first = tune(plan, _request(3), runner=Scripted())
    other = TuneRequest(trials=3, tokens_per_trial=40 * 4 * 32, params="warmup", seed=3)
    with pytest.raises(KeyboardInterrupt):
        tune(plan, other, runner=Scripted(interrupt_at=1))
    files = RunDir(tmp_path).tune
    from strategies.tuning import TuningSummary

    summary = TuningSummary.load(files.study)
    trials = read_trials(files.trials)
    assert summary.study_name != first.summary.study_name
    assert summary.study_name == prepare(plan, other, None).study_name
    assert not summary.finished and summary.tuned_plan == ""
    assert [r.name for r in summary.ranges] == ["warmup"]
    assert all(set(t.params) == {"warmup"} for t in trials)
    assert summary.best_number == 0
    assert summary.counts == {"complete": 1, "pruned": 0, "failed": 0, "re-run": 1, "waiting": 1}
    # The first study's tuned plan is not beside the unfinished one (the report and the export
    # took it as this study's result): kept aside, and the study's notes say where.
    run = RunDir(tmp_path)
    assert not run.tuned_plan.exists()
    kept = files.root / "previous_tuned_plan.json"
    assert json.loads(kept.read_text()) == first.plan.to_dict()
    assert any(n.startswith(f"{run.tuned_plan} moved to {kept}") for n in summary.notes)
    # Finished, it says so and names its tuned plan.
    done = tune(plan, other, runner=Scripted())
    summary = TuningSummary.load(files.study)
    assert summary.finished and summary.tuned_plan == str(done.plan_path)
    # Each study keeps its own trial folders: numbers restart at 0 in a new study, and the
    # second study's trials overwrote the first's (tune/trial_0000 ...) until 2026-12-07.
    assert first.trials and done.trials
    for t in first.trials:
        first_plan = load_plan_config(files.trial_plan(first.summary.study_name, t.number))
        assert first_plan.lr == t.params["lr"]
    for t in done.trials:
        assert files.trial_plan(done.summary.study_name, t.number).is_file()


def test_what_it_noted_before_the_trials_is_kept_in_study_json(tmp_path: Path) -> None:
    """The notes were printed and lost: study.json's notes (the report's bullets) were empty."""
    plan = write_plan(tmp_path, warmup_steps=20)
    result = tune(
        plan,
        TuneRequest(trials=1, tokens_per_trial=20 * 128, params="lr=1e-2:1e-1,warmup", seed=3),
        runner=Scripted(),
    )
    notes = result.summary.notes
    assert notes[0].startswith("the plan's own values are outside the ranges tuned: lr 0.001")
    assert notes[1].startswith("a trial's warm-up can last 20 steps")
    from strategies.tuning import TuningSummary

    assert TuningSummary.load(RunDir(tmp_path).tune.study).notes == notes
