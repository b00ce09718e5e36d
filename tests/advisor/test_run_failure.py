"""``advisor run`` when a stage fails: the report is still written, and it says which stage
failed, why, and how to continue (README, "advisor run")."""

from __future__ import annotations

import html
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner, Result

from advisor.cli import main
from reports.view import build_view, notes
from tests.reports.runs import make_hand_run

# The workload of the hand-made profile (tests/strategies/profiles.py): resuming with these
# flags reuses it, so the search runs for real on it without probing anything.
HAND_WORKLOAD = ("--model", "gpt-tiny", "--data", "synthetic", "--seq-len", "64")
MISLEADING = "no recommendation yet: run 'advisor recommend"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def page(root: Path) -> str:
    """The report's text as a reader sees it (entities decoded)."""
    return html.unescape((root / "report.html").read_text())


@pytest.fixture
def failed_recommend(tmp_path: Path) -> tuple[Path, Result]:
    """A run whose recommend stage fails: the hand profile fits no candidate in 0.1% of RAM."""
    out = make_hand_run(tmp_path / "run", plan=False)
    result = invoke(
        "run", *HAND_WORKLOAD, "--memory-budget", "0.001", "--quiet", "--out", str(out), "--resume"
    )
    return out, result


def test_a_failed_recommend_still_writes_the_report(failed_recommend: tuple[Path, Result]) -> None:
    out, result = failed_recommend
    assert result.exit_code == 2  # the search's own "nothing fits": bad input, exit 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert errors[0].startswith("error: nothing fits the memory budget")
    assert f"the report of the partial run: {out / 'report.html'}" in result.stderr
    stages = json.loads((out / "run.json").read_text())["stages"]
    assert {k: v["status"] for k, v in stages.items()} == {
        "profile": "skipped",
        "recommend": "failed",
        "report": "done",
    }
    assert stages["recommend"]["detail"] == errors[0].removeprefix("error: ")
    assert (out / "report.html").is_file()


def test_the_report_says_the_stage_failed_why_and_the_fix(
    failed_recommend: tuple[Path, Result],
) -> None:
    out, _ = failed_recommend
    reason = json.loads((out / "run.json").read_text())["stages"]["recommend"]["detail"]
    text = page(out)
    assert "recommend: failed" in text and "recommend: missing" not in text
    assert f"Recommendation failed: {reason}" in text
    assert "try a larger --memory-budget" in text  # the error's own fix
    command = json.loads((out / "run.json").read_text())["command"]
    assert shlex.join([*command, "--resume"]) in text  # how to continue once it is fixed
    assert MISLEADING not in text
    view = build_view(out)
    assert not [n for n in notes(view).values() if "'advisor recommend" in n]  # no dead end
    assert [(s.name, s.failed) for s in view.stages] == [
        ("profile", False),
        ("recommend", True),
        ("train", False),
    ]
    assert [f.stage for f in view.failures] == ["recommend"]
    for section in ("memory", "validation", "training"):
        assert notes(view)[section] == (
            "Nothing to show: the recommend stage of this run failed (see Summary)."
        )
    # The failed search still wrote trials.csv: every candidate and why it was dropped
    assert (out / "trials.csv").is_file()
    candidates = view.section("candidates")
    assert "candidates" not in notes(view) and candidates.tables and candidates.tables[0].rows
    assert "candidates at global batch 8:" in candidates.lead[0]  # the trials' own (no plan)


def test_a_later_recommend_supersedes_the_recorded_failure(
    failed_recommend: tuple[Path, Result], tmp_path: Path
) -> None:
    """The user followed the fix with 'advisor recommend': its plan is newer than run.json,
    so the page shows the plan, not the old failure."""
    out, _ = failed_recommend
    log = out / "run.json"
    stamp = log.stat().st_mtime - 60
    os.utime(log, (stamp, stamp))  # run.json written a minute before the plan below
    done = make_hand_run(tmp_path / "fixed", steps=None)
    (out / "plan.json").write_bytes((done / "plan.json").read_bytes())
    view = build_view(out)
    assert not view.failures and not any(s.failed for s in view.stages)
    assert view.summary is not None and "summary" not in notes(view)
    # run.json newer than the plan (an older plan than the failure): the failure stands.
    os.utime(log, None)
    stamp = log.stat().st_mtime - 60
    os.utime(out / "plan.json", (stamp, stamp))
    view = build_view(out)
    assert [f.stage for f in view.failures] == ["recommend"]
    assert notes(view)["summary"].startswith("Recommendation failed: nothing fits")


def test_a_failed_training_is_reported_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The train stage's child fails: the report marks it failed, with the child's last line;
    the run's training flags reach the child (--keep-checkpoints among them)."""
    out = make_hand_run(tmp_path / "run", steps=None)  # a profile and a plan the run reuses
    children: list[list[str]] = []

    def failing_child(args: list[str]) -> tuple[int, str]:
        children.append(args)
        return 1, "error: loss became nan at step 3; no checkpoint was saved yet. Lower --lr"

    monkeypatch.setattr("advisor.run._run_advisor", failing_child)
    result = invoke(
        "run", *HAND_WORKLOAD, "--steps", "5", "--keep-checkpoints", "1", "--quiet",
        "--out", str(out), "--resume",
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.stderr.endswith(
        "error: training failed (exit 1): loss became nan at step 3; no checkpoint was saved "
        "yet. Lower --lr\n"
    )
    [args] = children
    assert args[:5] == ["train", "--plan", str(out / "plan.json"), "--out", str(out / "train")]
    assert args[args.index("--keep-checkpoints") + 1] == "1"
    assert args[args.index("--steps") + 1] == "5"
    text = page(out)
    assert "train: failed" in text
    assert (
        "Training failed (exit 1): loss became nan at step 3; no checkpoint was saved yet. "
        "Lower --lr. Fix what the message names"
    ) in text
    assert "No training yet: run 'advisor train" not in text


def test_a_training_child_refused_for_bad_usage_fails_the_run_with_exit_2_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--init-from weights of another model are refused by the training child (exit 2): the
    child's error line was passed through and then said again, and the run exited 1."""
    import subprocess

    out = make_hand_run(tmp_path / "run", steps=None)
    refusal = "error: weights.pt does not fit gpt-tiny: 2 tensor(s) differ in shape"

    class Child:
        """A training child that prints progress and its one-line refusal, exit 2."""

        def __init__(self, *args: object, stderr: Any, **kwargs: object) -> None:
            stderr.write(f"train: step 0\n{refusal}\n")
            stderr.flush()
            self.returncode = 2

        def poll(self) -> int:
            return self.returncode

        def __enter__(self) -> Child:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(subprocess, "Popen", Child)
    result = invoke("run", *HAND_WORKLOAD, "--steps", "2", "--quiet", "--out", str(out), "--resume")
    assert result.exit_code == 2
    assert result.stderr.count(refusal.removeprefix("error: ")) == 1
    assert "train: step 0" in result.stderr  # the child's other lines still pass through
    assert result.stderr.endswith(f"error: training failed (exit 2): {refusal[7:]}\n")


CHILD = """\
import pathlib, signal, sys, time
def stop(signum, frame):
    time.sleep(1.0)  # the step it was in, then the checkpoint
    pathlib.Path(sys.argv[1]).write_text("saved")
    sys.stderr.write("error: SIGINT: stopped after step 1, checkpoint saved\\n")
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
pathlib.Path(sys.argv[1] + ".ready").write_text("")
sys.stderr.write("step 1/300\\n")
sys.stderr.flush()
time.sleep(60)
"""


def test_ctrl_c_waits_for_the_training_child_to_save_before_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run wrote its report while the child (which got the same Ctrl-C) was still
    finishing its step and checkpoint: the page said 35 steps, the run had 36."""
    import os
    import signal
    import subprocess
    import threading
    import time

    from advisor.run import _run_advisor

    saved = tmp_path / "checkpoint"
    started: list[subprocess.Popen[str]] = []
    real = subprocess.Popen

    def child(args: list[str], **kwargs: object) -> subprocess.Popen[str]:
        process = real([args[0], "-c", CHILD, str(saved)], **kwargs)  # type: ignore[call-overload]
        started.append(process)
        return process

    def ctrl_c() -> None:  # the terminal's Ctrl-C reaches both, once the child runs
        ready = tmp_path / "checkpoint.ready"
        for _ in range(600):
            if ready.exists():
                break
            time.sleep(0.05)
        os.kill(started[0].pid, signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(subprocess, "Popen", child)
    # Python's own Ctrl-C handler, as in a terminal (a pytest-xdist worker ignores SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, ctrl_c)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt) as stopped:
            _run_advisor(["train"])
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert saved.read_text() == "saved"  # written before _run_advisor let the Ctrl-C go on
    assert started[0].returncode == 130
    # where it stopped, for the stage's closing line (the signal and the child's own "same
    # command plus --resume" left out: the run's error line says how to go on)
    assert stopped.value.child_said == "stopped after step 1, checkpoint saved"  # type: ignore[attr-defined]


ORPHAN_CHILD = """\
import pathlib, signal, sys, time
def stop(signum, frame):
    time.sleep(1.0)  # the step it was in: its progress line comes after the run died
    sys.stderr.write("step 2/300\\n")
    sys.stderr.flush()
    pathlib.Path(sys.argv[1]).write_text("saved")
    sys.stderr.write("error: SIGTERM: stopped after step 2, checkpoint saved in C; continue\\n")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
pathlib.Path(sys.argv[1] + ".ready").write_text("")
sys.stderr.write("step 1/300\\n")
sys.stderr.flush()
time.sleep(60)
"""

ORPHAN_PARENT = """\
import subprocess, sys
from advisor.run import _run_advisor
real = subprocess.Popen
subprocess.Popen = lambda args, **kwargs: real([args[0], "-c", sys.argv[1], sys.argv[2]], **kwargs)
_run_advisor(["train", "--out", sys.argv[3]])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_training_child_whose_run_is_killed_saves_its_step(tmp_path: Path) -> None:
    """SIGKILL of 'advisor run': its child got SIGTERM (term_with_parent), but its stderr was
    a pipe to the dead run, and the progress line of the step it finished raised
    BrokenPipeError before the checkpoint: the steps since the last periodic one were lost.
    Its stderr is now a file, RUN/train/train.log, that the run follows."""
    import signal
    import subprocess
    import time

    saved, out = tmp_path / "checkpoint", tmp_path / "train"
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_PARENT, ORPHAN_CHILD, str(saved), str(out)],
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(600):
            if (tmp_path / "checkpoint.ready").exists():
                break
            time.sleep(0.05)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        for _ in range(200):
            if saved.exists():
                break
            time.sleep(0.05)
        time.sleep(0.5)  # its last line
    finally:
        parent.kill()
    assert saved.read_text() == "saved"
    log = (out / "train.log").read_text()
    assert log.startswith("step 1/300\nstep 2/300\n")
    assert "error: SIGTERM: stopped after step 2" in log


TERM_CHILD = """\
import pathlib, signal, sys, time
seen = []
def stop(signum, frame):
    seen.append(signum)
    if len(seen) > 1:
        return  # a repeated SIGTERM is the same request (advisor.trainer.loop._StopFlag)
    time.sleep(1.0)  # the step it was in, then the checkpoint
    pathlib.Path(sys.argv[1]).write_text("saved")
    sys.stderr.write("error: SIGTERM: stopped after step 1, checkpoint saved\\n")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
pathlib.Path(sys.argv[1] + ".ready").write_text("")
sys.stderr.write("step 1/300\\n")
sys.stderr.flush()
time.sleep(60)
"""


def test_sigterm_to_the_run_alone_reaches_the_training_child_which_saves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kill PID` of `advisor run` killed it alone: its training child trained on as an orphan
    (nobody reading its output, no report). SIGTERM now goes on to the child, which saves, and
    the run stops as on Ctrl-C (advisor.run.Terminated: exit 143)."""
    import signal
    import subprocess
    import threading
    import time

    from advisor.run import Terminated, _run_advisor, sigterm_stops_the_run

    saved = tmp_path / "checkpoint"
    started: list[subprocess.Popen[str]] = []
    real = subprocess.Popen

    def child(args: list[str], **kwargs: object) -> subprocess.Popen[str]:
        process = real([args[0], "-c", TERM_CHILD, str(saved)], **kwargs)  # type: ignore[call-overload]
        started.append(process)
        return process

    def kill_the_run_only() -> None:
        ready = tmp_path / "checkpoint.ready"
        for _ in range(600):
            if ready.exists():
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(subprocess, "Popen", child)
    timer = threading.Timer(0.5, kill_the_run_only)
    timer.start()
    try:
        with pytest.raises(Terminated), sigterm_stops_the_run():
            _run_advisor(["train"])
    finally:
        timer.cancel()
    assert saved.read_text() == "saved"  # the child saved before the run let SIGTERM go on
    assert started[0].returncode == 143
    assert signal.getsignal(signal.SIGTERM) is not None  # the previous handler is back
    assert not getattr(signal.getsignal(signal.SIGTERM), "__qualname__", "").startswith(
        "sigterm_stops_the_run"
    )


def test_a_run_stopped_by_sigterm_exits_143_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import advisor.run
    from advisor.run import Terminated

    def stopped(*args: object, **kwargs: object) -> None:
        raise Terminated

    monkeypatch.setattr(advisor.run, "run", stopped)
    result = invoke("run", *HAND_WORKLOAD, "--quiet", "--out", str(tmp_path / "r"))
    assert result.exit_code == 143
    assert result.stderr.strip().startswith("error: interrupted (SIGTERM): the run directory keeps")


def test_sigterm_during_the_profile_keeps_what_it_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM to 'advisor run' raised at once inside the profile, which kept nothing; a first
    Ctrl-C ends it with what it measured (profilers.stopping). SIGTERM now asks the same, and
    run.json, the line and the exit code still name SIGTERM."""
    import signal
    import time

    import advisor.run
    from profilers.stopping import stop_on_interrupt, stopped

    asked: list[str | None] = []

    def profile(request: object, out: Path, say: object) -> str:
        with stop_on_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs here, and must not raise
            asked.append(stopped())
        (out / "profile.json").write_text("{}")  # what it measured, saved
        raise KeyboardInterrupt  # as profilers.profiler.ProfileInterrupted, after the save

    monkeypatch.setattr(advisor.run, "_profile_stage", profile)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        result = invoke("run", "--quiet", "--out", str(tmp_path / "r"))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert asked == ["interrupted (Ctrl-C)"]  # the profile's own stop, as a first Ctrl-C's
    assert result.exit_code == 143, result.output
    assert result.stderr.splitlines()[-1].startswith("error: interrupted (SIGTERM): ")
    stages = json.loads((tmp_path / "r" / "run.json").read_text())["stages"]
    assert stages["profile"]["status"] == "interrupted"
    assert stages["profile"]["detail"] == "interrupted (SIGTERM)"


def test_a_resume_that_plans_again_says_why(tmp_path: Path) -> None:
    """A plan of other search settings was searched again without a word (nothing trained
    yet: allowed)."""
    out = make_hand_run(tmp_path / "run", steps=None)
    result = invoke(
        "run", *HAND_WORKLOAD, "--memory-budget", "0.001", "--quiet", "--out", str(out), "--resume"
    )
    assert result.exit_code == 2
    assert result.stderr.startswith(
        f"note: --resume: planning again, {out / 'plan.json'}: --memory-budget 0.001 (the "
        "plan's: 0.9)\n"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_run_whose_input_is_refused_has_no_report_to_fail(tmp_path: Path) -> None:
    """An input the profile refuses at once (--device cuda without one; a missing --data was,
    until the run checked its data before the profile, 2026-12-07): the report stage was then
    recorded as failed, telling the user to "run 'advisor run --out ...' first"."""
    out = tmp_path / "r"
    result = invoke("run", "--device", "cuda", "--out", str(out))
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: --device cuda but no CUDA device is visible: use --device cpu"]
    assert "report: skipped: nothing to report: no stage saved anything" in result.stderr
    assert "the report of the partial run" not in result.stderr
    stages = json.loads((out / "run.json").read_text())["stages"]
    assert {k: v["status"] for k, v in stages.items()} == {
        "profile": "failed",
        "report": "skipped",
    }


def test_a_run_whose_data_is_refused_stops_before_its_first_stage(tmp_path: Path) -> None:
    """The data (and --val-data) are checked before the profile, which reads the train split
    only: nothing is written, the error is the one line."""
    out = tmp_path / "r"
    result = invoke("run", "--data", str(tmp_path / "nope"), "--out", str(out))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: data '{tmp_path / 'nope'}' does not exist: ")
    assert len(result.stderr.splitlines()) == 1
    assert not out.exists()


def test_run_json_names_the_stage_that_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed in a stage (SIGKILL, the out-of-memory killer) left run.json without it,
    as if the run had never got that far."""
    import advisor.run
    from advisor.errors import UsageProblem

    seen: list[dict[str, Any]] = []

    def profile(request: object, out: Path, say: object) -> str:
        seen.append(json.loads((out / "run.json").read_text())["stages"])
        raise UsageProblem("stop here")

    monkeypatch.setattr(advisor.run, "_profile_stage", profile)
    assert invoke("run", "--quiet", "--out", str(tmp_path / "r")).exit_code == 2
    assert seen == [{"profile": {"status": "running", "detail": "", "elapsed_s": 0.0}}]
