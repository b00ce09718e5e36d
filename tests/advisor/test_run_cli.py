"""``advisor run`` and ``advisor report``: the run directory's layout, resume, exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from advisor.cli import main
from tests.reports.runs import REAL_RUN_ARGS, real_run


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out, result = real_run(tmp_path_factory.getbasetemp())
    assert result.exit_code == 0, result.output + result.exception
    return out


def test_run_lays_out_the_run_directory(run_dir: Path) -> None:
    for name in (
        "profile.json",
        "probes.csv",
        "plan.json",
        "trials.csv",
        "study.db",
        "train/metrics.jsonl",
        "train/train_config.json",
        "train/checkpoints/latest",
        "report.html",
        "run.json",
    ):
        assert (run_dir / name).exists(), name
    info = json.loads((run_dir / "run.json").read_text())
    assert {k: v["status"] for k, v in info["stages"].items()} == {
        "profile": "done",
        "recommend": "done",
        "train": "done",
        "report": "done",
    }
    assert info["command"] == [
        *("advisor", "run", "--model", "gpt-tiny", "--model-arg", "n_layer=1", "--seq-len", "128"),
        *("--global-batch-size", "4", "--steps", "6", "--budget-s", "30", "--validate-top", "1"),
        *("--no-comm", "--eval-every", "3", "--out", str(run_dir)),
    ]
    plan = json.loads((run_dir / "plan.json").read_text())
    train = json.loads((run_dir / "train" / "train_config.json").read_text())
    assert train["config"] == plan["config"] and train["total_steps"] == 6
    metrics = (run_dir / "train" / "metrics.jsonl").read_text().splitlines()
    assert sum('"kind": "train"' in line for line in metrics) == 6
    html = (run_dir / "report.html").read_text()
    assert "Use " in html and "No training yet" not in html


def test_run_prints_the_recommendation_and_the_report(
    run_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _, result = real_run(tmp_path_factory.getbasetemp())
    lines = result.stdout.splitlines()
    assert lines[0].startswith("recommended: ")
    assert lines[1].startswith("trained: 6 steps, loss ")
    assert lines[-1] == f"report: {run_dir / 'report.html'}"


def test_resume_skips_what_is_done(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    result = invoke("run", *REAL_RUN_ARGS, "--out", str(copy), "--resume")
    assert result.exit_code == 0, result.output
    info = json.loads((copy / "run.json").read_text())
    stages = {k: (v["status"], v["detail"]) for k, v in info["stages"].items()}
    assert stages["profile"] == ("skipped", f"reusing {copy / 'profile.json'}")
    assert stages["recommend"] == ("skipped", f"reusing {copy / 'plan.json'}")
    assert stages["train"][0] == "done" and stages["train"][1].startswith("6 steps, loss")
    assert stages["report"][0] == "done"
    # the summary names the recommendation it trained, as the first run's did (it said only
    # "trained: ..." when the plan was reused)
    assert result.stdout.splitlines()[0].startswith("recommended: ")


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--memory-budget", "0.5"], "--memory-budget 0.5 (the plan's: 0.9)"),
        (["--lr", "0.01"], "--lr 0.01 (the plan's: not given)"),
        (["--tune-trials", "2"], "--tune-trials 2 (the run trained "),
    ],
)
def test_a_resume_that_would_not_train_the_same_plan_is_refused_before_any_work(
    run_dir: Path, tmp_path: Path, flags: list[str], why: str
) -> None:
    """It searched (or tuned) again for minutes, overwrote plan.json, and then the training
    child refused to continue from a checkpoint of another config."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    plan = (copy / "plan.json").read_bytes()
    result = invoke("run", *REAL_RUN_ARGS, *flags, "--out", str(copy), "--resume")
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(
        f"error: cannot resume {copy}: its training has begun, and this run would not train "
        "the same plan: "
    )
    assert why in result.stderr and "choose another --out" in result.stderr
    assert (copy / "plan.json").read_bytes() == plan
    assert not (copy / "tuned_plan.json").exists()


def test_a_resume_says_which_profile_settings_it_does_not_apply(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--resume --budget-s 60 reused the 30 s profile without a word."""
    import advisor.run
    from advisor.errors import UsageProblem

    def stop(*args: object, **kwargs: object) -> None:
        raise UsageProblem("stop here")

    # The profile stage's detail is all this test reads: the resume stops at the train stage
    # (reached: the other budget neither refused the resume nor planned again). That a resume
    # then trains and reports: test_resume_skips_what_is_done.
    monkeypatch.setattr(advisor.run, "_train_stage", stop)
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    result = invoke("run", *REAL_RUN_ARGS, "--budget-s", "60", "--out", str(copy), "--resume")
    assert result.exit_code == 2 and result.stderr.endswith("error: stop here\n"), result.output
    stages = json.loads((copy / "run.json").read_text())["stages"]
    assert stages["recommend"] == {**stages["recommend"], "status": "skipped"}
    assert stages["train"]["status"] == "failed" and stages["train"]["detail"] == "stop here"
    profile = stages["profile"]
    assert profile["status"] == "skipped"
    assert profile["detail"] == (
        f"reusing {copy / 'profile.json'} (profiled with --budget-s 30, not 60: a resume "
        "reuses the profile of the same workload; profile anew in another --out)"
    )


def test_a_resume_of_an_out_without_a_run_says_it_starts_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mistyped --out with --resume started a whole new run without a word; a damaged
    run.json (all a second Ctrl-C may leave) is no run either."""
    import advisor.run
    from advisor.errors import UsageProblem

    def stop(*args: object, **kwargs: object) -> None:
        raise UsageProblem("stop here")

    monkeypatch.setattr(advisor.run, "_profile_stage", stop)
    for out in (tmp_path / "typo", tmp_path / "damaged"):
        if out.name == "damaged":
            out.mkdir()
            (out / "run.json").write_text("{not json")
        result = invoke("run", "--quiet", "--out", str(out), "--resume")
        assert result.exit_code == 2
        assert result.stderr.startswith(f"note: --resume: no run in {out} yet: starting one\n")
        assert result.stderr.endswith("error: stop here\n")
        info = json.loads((out / "run.json").read_text())
        assert info["stages"]["profile"] == {**info["stages"]["profile"], "status": "failed"}


def test_an_existing_run_is_not_overwritten(run_dir: Path) -> None:
    result = invoke("run", "--out", str(run_dir))
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {run_dir} already holds a run (profile.json, plan.json, trials.csv, "
        "train/metrics.jsonl, train/checkpoints): pass --resume to continue it (finished stages "
        "are skipped), or choose another --out\n"
    )


def test_resume_with_another_model_is_refused(run_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    result = invoke("run", "--model-arg", "n_layer=2", "--out", str(copy), "--resume")
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {copy}/profile.json profiled model_args={{'n_layer': 1}}, not what this run "
        "asks: resume with the same --model/--model-arg/--data/--seq-len, or choose another --out\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "3", "--tokens", "100"], "error: give --steps or --tokens, not both"),
        (["--resume"], "error: --resume needs --out naming the run to continue"),
        (["--lr", "0"], "error: Invalid value for '--lr': 0.0 is not in the range x>0."),
    ],
)
def test_bad_usage(args: list[str], message: str, tmp_path: Path) -> None:
    out = [] if "--resume" in args else ["--out", str(tmp_path / "r")]
    result = invoke("run", *args, *out)
    assert result.exit_code == 2
    assert result.stderr.startswith(message)
    assert not (tmp_path / "r").exists()


def test_bad_model_spec_fails_in_one_line_before_any_probe(tmp_path: Path) -> None:
    out = tmp_path / "r"
    result = invoke("run", "--model", "no-such-model", "--quiet", "--out", str(out))
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "no-such-model" in result.stderr
    assert not (out / "profile.json").exists() and not (out / "report.html").exists()


def test_report_rerenders_a_profile_only_run(run_dir: Path, tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("profile.json", "probes.csv"):
        shutil.copy(run_dir / name, partial / name)
    result = invoke("report", str(partial))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {partial / 'report.html'} (")
    html = (partial / "report.html").read_text()
    assert "no recommendation yet" in html and "No training yet." in html


def test_report_of_a_run_without_training(run_dir: Path, tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    shutil.copytree(run_dir, partial, ignore=shutil.ignore_patterns("train", "report.html"))
    result = invoke("report", str(partial), "--out", str(tmp_path / "page.html"))
    assert result.exit_code == 0, result.output
    assert (
        f"No training yet: run &#39;advisor train --plan {partial}/plan.json"
        in (tmp_path / "page.html").read_text()
    )


def test_report_without_a_run(tmp_path: Path) -> None:
    result = invoke("report", str(tmp_path / "nope"))
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: run directory {tmp_path / 'nope'} does not exist: pass the --out of "
        "'advisor run'\n"
    )
    result = invoke("report", str(tmp_path))
    assert result.exit_code == 2
    assert "holds no run files" in result.stderr


def test_help_does_not_import_torch() -> None:
    code = (
        "import sys; from advisor.cli import main\n"
        "for args in (['run', '--help'], ['report', '--help']):\n"
        "    try: main(args)\n"
        "    except SystemExit: pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("storage", ["sqlite://", ""])
def test_a_storage_no_study_can_live_in_is_refused_before_the_profile(
    tmp_path: Path, storage: str
) -> None:
    """It failed the recommend stage, after the whole profile's budget."""
    from advisor.errors import UsageProblem
    from advisor.run import RunRequest, run

    with pytest.raises(UsageProblem, match=r"in-memory database|--storage is empty"):
        run(RunRequest(storage=storage), tmp_path / "run")
    assert not (tmp_path / "run" / "profile.json").exists()
