"""What the command line says when a path the user named cannot be used, or when Ctrl-C stops
a command: one line that says how to go on, never a traceback, and a run keeps its report."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from advisor.cli import main


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), prog_name="advisor")


def one_line(result: Result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_profile_refuses_an_out_that_is_a_file_before_any_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the whole budget of probes ran and the save failed with a FileExistsError
    traceback: the profile was lost."""
    import profilers.profiler

    def no_probe(*args: object, **kwargs: object) -> None:
        raise AssertionError("probed before checking --out")

    monkeypatch.setattr(profilers.profiler, "run_profile", no_probe)
    in_the_way = tmp_path / "afile"
    in_the_way.write_text("")
    line = one_line(invoke("profile", "--out", str(in_the_way), "--quiet"), 2)
    assert line == (
        f"error: cannot use {in_the_way}: File exists: a file is in the way of a directory it "
        "needs: choose another --out"
    )


def test_train_and_report_name_the_path_they_cannot_write(tmp_path: Path) -> None:
    in_the_way = tmp_path / "afile"
    in_the_way.write_text("")
    line = one_line(invoke("train", "--steps", "1", "--quiet", "--out", f"{in_the_way}/x"), 2)
    assert line.startswith(f"error: cannot use {in_the_way}") and "choose another --out" in line

    run = tmp_path / "run"
    assert (
        invoke("train", "--steps", "1", "--seq-len", "16", "--quiet", "--out", str(run)).exit_code
        == 0
    )
    folder = tmp_path / "folder"
    folder.mkdir()
    line = one_line(invoke("report", str(run), "--out", str(folder)), 2)
    assert line == (
        f"error: cannot use {folder}: Is a directory: it is a directory: name a file, or "
        "choose another --out"
    )


@pytest.mark.parametrize(
    ("command", "hint"),
    [
        ("profile", "nothing was saved (Ctrl-C came before the probes, or a second one"),
        ("recommend", "the same command continues it"),
    ],
)
def test_ctrl_c_says_what_was_kept_and_how_to_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, hint: str
) -> None:
    """click turns Ctrl-C into Abort: it printed 'error: aborted' and nothing else."""
    import advisor.profiling
    import advisor.recommending

    def ctrl_c(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(advisor.profiling, "profile", ctrl_c)
    monkeypatch.setattr(advisor.recommending, "recommend", ctrl_c)
    args = (
        ["--profile", str(tmp_path), "--global-batch-size", "8"] if command == "recommend" else []
    )
    line = one_line(invoke(command, *args, "--out", str(tmp_path / "out"), "--quiet"), 130)
    assert line.startswith("error: interrupted (Ctrl-C): ") and hint in line


def test_a_run_stopped_by_ctrl_c_keeps_a_report_that_says_how_to_continue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, run.json recorded 'KeyboardInterrupt' as the stage's error and the page told
    the user to fix what it names; a run stopped in its first stage had no report at all."""
    import advisor.run

    def ctrl_c(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(advisor.run, "_profile_stage", ctrl_c)
    out = tmp_path / "run"
    line = one_line(invoke("run", "--quiet", "--out", str(out)), 130)
    assert "the same command plus --resume continues it" in line
    stages = json.loads((out / "run.json").read_text())["stages"]
    assert stages["profile"] == {**stages["profile"], "status": "interrupted"}
    assert stages["profile"]["detail"] == "interrupted (Ctrl-C)"
    text = html.unescape((out / "report.html").read_text())
    assert "Profiling was interrupted (Ctrl-C). Continue this run" in text
    assert "Fix what the message names" not in text
    again = invoke("report", str(out))  # the page renders again from run.json alone
    assert again.exit_code == 0, again.output


@pytest.mark.parametrize("budget", [0.0, -1.0, float("nan"), float("inf")])
def test_the_library_refuses_a_budget_that_is_no_number_of_seconds(
    tmp_path: Path, budget: float
) -> None:
    """The CLI's option type refuses these; the Python API reaches profile() directly (nan
    passed its `<= 0` check and failed deep in the profiler, inf profiled forever)."""
    from advisor.errors import UsageProblem
    from advisor.profiling import ProfileRequest, profile

    with pytest.raises(UsageProblem, match="--budget-s must be a positive number of seconds"):
        profile(ProfileRequest(budget_s=budget), tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_a_run_stage_line_says_how_it_ended_once(capsys: pytest.CaptureFixture[str]) -> None:
    """'interrupted in 26 s: interrupted (SIGTERM)' said it twice and not where training
    stopped; a skipped stage's line did not name the stage (it has no header line)."""
    from advisor.cli.run import CliRunProgress

    display = CliRunProgress(quiet=False)
    display.finished(
        "train", "interrupted", "interrupted (SIGTERM): stopped after step 9, checkpoint saved", 26
    )
    display.finished("recommend", "interrupted", "interrupted (Ctrl-C)", 4.2)
    display.finished("profile", "skipped", "reusing RUN/profile.json", 0.0)
    display.finished("train", "failed", "training failed (exit 1): loss became nan", 3)
    assert capsys.readouterr().err.splitlines() == [
        "  interrupted (SIGTERM) after 26 s: stopped after step 9, checkpoint saved",
        "  interrupted (Ctrl-C) after 4 s",
        "  profile: skipped: reusing RUN/profile.json",
        "  failed in 3 s: training failed (exit 1): loss became nan",
    ]
