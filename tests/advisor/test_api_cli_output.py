"""Where output goes. A ddp/fsdp ``advisor.train`` reports as a run in the caller's process does
(the return value, notes through ``progress`` or AdvisorNote warnings) and prints nothing: its
ranks' stdout goes to the run directory's stdout.log. A command stopped by Ctrl-C or an EOFError
says so in exactly one line on stderr, with no blank line before it."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

import advisor
from advisor.cli import main
from advisor.cli.train import API_REPORT_ENV
from advisor.errors import AdvisorNote
from profilers.rundir import RANKS_STDOUT
from strategies.config import TrainConfig
from tests.advisor.test_api import TINY  # one gpt-tiny block: the smallest real training run
from tests.reports.runs import write_training

ROOT = Path(__file__).resolve().parents[2]
DDP = TINY.replace(parallelism="ddp", world_size=2, micro_batch_size=1)
# A warm-up longer than the run: the trainer's note says the lr never decays.
WARMUP_NOTE = "warmup_steps=20 is not below the run's length (2)"


def _notes(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, AdvisorNote)]


# -- advisor.train of a launched plan ------------------------------------------------------------


def test_a_launched_run_prints_nothing_and_reports_as_a_single_process_run_does(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Rank 0 printed its 'trained 2 steps ...' line on the caller's stdout and its note on
    stderr (CLI flags, not keywords), where a single-process run prints nothing and gives the
    note as an AdvisorNote warning. Two gloo ranks on the CPU, two steps."""
    single = tmp_path / "single"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        alone = advisor.train(TINY, steps=2, out=single, eval_every=0, warmup_steps=20)
    expected = _notes(caught)
    assert len(expected) == 1 and expected[0].startswith(WARMUP_NOTE), expected
    assert capfd.readouterr() == ("", "")

    out = tmp_path / "ddp"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = advisor.train(DDP, steps=2, out=out, eval_every=0, warmup_steps=20)
    assert _notes(caught) == expected
    stdout, stderr = capfd.readouterr()
    assert stdout == ""
    assert "note:" not in stderr and "trained 2 steps" not in stderr, stderr
    assert (result.steps, result.tokens, result.already_complete) == (2, alone.tokens, False)
    assert result.checkpoint is not None and result.checkpoint.parent == out / "checkpoints"
    log = (out / RANKS_STDOUT).read_text()
    assert log.startswith("trained 2 steps"), log  # what the CLI's rank 0 reports, kept

    assert API_REPORT_ENV not in os.environ


def _launch_reporting(out: Path, config: TrainConfig, records: list[dict[str, Any]]) -> Any:
    """A stand-in launcher whose rank 0 writes ``records`` where advisor.cli.train's would."""

    def fake_launch(spec: Any, args: list[str]) -> None:
        path = Path(os.environ[API_REPORT_ENV])
        with open(path, "a", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
        if not (out / "metrics.jsonl").exists():  # (a resumed run has its files)
            write_training(out, config, 3, 3)
        seen.append(path)

    seen: list[Path] = []
    fake_launch.seen = seen  # type: ignore[attr-defined]
    return fake_launch


NOTE = {"note": "--warmup-steps 20 is not below the run's length (3): lower --warmup-steps"}


def test_a_callback_gets_the_ranks_notes_in_api_terms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    config = DDP
    out = tmp_path / "run"
    fake = _launch_reporting(out, config, [NOTE, {"result": {"already_complete": False}}])
    monkeypatch.setattr("advisor.launch.launch", fake)
    lines: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a callback's notes are not warnings too
        result = advisor.train(config, steps=3, out=out, progress=lines.append)
    assert (
        lines.count("note: warmup_steps=20 is not below the run's length (3): lower warmup_steps")
        == 1
    ), lines
    assert result.steps == 3 and not result.already_complete
    assert capfd.readouterr() == ("", "")
    # The channel is gone with the call: its variable and its file.
    assert API_REPORT_ENV not in os.environ
    assert not any(path.exists() for path in fake.seen)


def test_a_launched_resume_of_a_finished_run_says_it_was_already_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TrainSummary.already_complete was False for every launched run (read from the run
    directory, which does not say): rank 0's result says it, as a run in this process does."""
    out = tmp_path / "run"
    write_training(out, DDP, 3, 3)
    monkeypatch.setattr(
        "advisor.launch.launch",
        _launch_reporting(out, DDP, [{"result": {"already_complete": True}}]),
    )
    result = advisor.train(out=out, resume=True)
    assert (result.steps, result.already_complete) == (3, True)


def test_progress_true_prints_the_ranks_notes_on_stderr_as_the_cli_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    config = DDP
    out = tmp_path / "run"
    monkeypatch.setattr("advisor.launch.launch", _launch_reporting(out, config, [NOTE]))
    advisor.train(config, steps=3, out=out, progress=True)
    stdout, stderr = capfd.readouterr()
    assert stdout == ""
    assert stderr.splitlines().count(f"note: {NOTE['note']}") == 1, stderr


def test_the_ranks_notes_come_even_when_the_job_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from advisor.launch import RanksFailed

    config = DDP
    out = tmp_path / "run"
    reporting = _launch_reporting(out, config, [NOTE])

    def failing(spec: Any, args: list[str]) -> None:
        reporting(spec, args)
        raise RanksFailed("rank 1 exited with code 1 after 3s")

    monkeypatch.setattr("advisor.launch.launch", failing)
    with pytest.warns(AdvisorNote, match="warmup_steps=20"), pytest.raises(RanksFailed):
        advisor.train(config, steps=3, out=out)


# -- Ctrl-C and EOFError in the CLI: one line -----------------------------------------------------


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), prog_name="advisor")


def _raising(exc: BaseException) -> Any:
    def raise_it(*args: object, **kwargs: object) -> None:
        raise exc

    return raise_it


@pytest.mark.parametrize(
    ("exc", "code", "start"),
    [
        (KeyboardInterrupt(), 130, "error: interrupted (Ctrl-C): "),
        (EOFError("Ran out of input"), 1, "error: a file ended before its data did (EOFError: "),
    ],
    ids=["ctrl-c", "eof"],
)
def test_an_interrupt_or_eof_is_one_line_with_no_blank_line_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: BaseException, code: int, start: str
) -> None:
    """click's Command.main echoed an empty line on stderr before the error."""
    import advisor.profiling

    monkeypatch.setattr(advisor.profiling, "profile", _raising(exc))
    result = invoke("profile", "--out", str(tmp_path / "p"), "--quiet")
    assert result.exit_code == code, (result.output, result.exception)
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(start), result.stderr
    assert result.stderr == line + "\n"


def test_ctrl_c_while_the_arguments_are_read_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(click.Command, "parse_args", _raising(KeyboardInterrupt()))
    result = invoke("train", "--steps", "2")
    assert result.exit_code == 130
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: interrupted (Ctrl-C): the same command plus --resume")
    assert result.stderr == line + "\n"


# A command that waits for Ctrl-C (its library call faked), saying when it has started.
_WAITING = """
import sys, time
from pathlib import Path
import reports
from advisor.cli import main

def wait(*args, **kwargs):
    Path(sys.argv[1]).write_text("started")
    time.sleep(60)

reports.write_report = wait
main(["report", sys.argv[2]], prog_name="advisor")
"""


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)


def _default_sigint() -> None:
    """In the child before exec: SIGINT as a terminal's process gets it. A process that starts
    with SIGINT ignored keeps ignoring it (Python installs its handler only over SIG_DFL), and
    a test worker's SIGINT may be ignored (CI, 2026-12-07: the child slept through its Ctrl-C)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_real_ctrl_c_is_one_line_on_a_pipe(tmp_path: Path) -> None:
    started = tmp_path / "started"
    child = subprocess.Popen(
        [sys.executable, "-c", _WAITING, str(started), str(tmp_path / "p")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    try:
        _wait_for(started)
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130, stderr
    assert stdout == ""
    assert stderr.startswith("error: interrupted (Ctrl-C)") and stderr.count("\n") == 1, stderr


def test_a_ctrl_c_typed_at_a_terminal_gets_its_line_after_the_echoed_caret_c(
    tmp_path: Path,
) -> None:
    """The terminal echoes ^C where the cursor is: the error starts the next line (not glued
    to ^C, and not after an empty line)."""
    started = tmp_path / "started"
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command, on the terminal
        _default_sigint()
        os.chdir(ROOT)
        os.execv(sys.executable, [sys.executable, "-c", _WAITING, str(started), str(tmp_path)])
    try:
        _wait_for(started)
        os.write(fd, b"\x03")
        seen = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child is gone (EIO)
                break
            if not chunk:
                break
            seen += chunk
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 130, seen
    lines = seen.decode().replace("\r\n", "\n").split("\n")
    assert lines[0] == "^C", seen
    assert lines[1].startswith("error: interrupted (Ctrl-C)") and lines[2:] == [""], seen
