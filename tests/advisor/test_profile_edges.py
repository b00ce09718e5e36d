"""``advisor profile`` given what a new user gets wrong: a budget no profile keeps to, an
``--out`` it cannot write, a precision named twice. Each is refused (or handled) before any
probe, in one line with exit 2; none of these tests runs a probe."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from advisor.cli import main
from advisor.errors import UsageProblem


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the model's facts is the first real work of a profile: it must not start."""

    def refuse(self: Any) -> None:
        raise AssertionError("the profile started its work")

    monkeypatch.setattr("advisor.workload.AdvisorWorkload.facts", refuse)


@pytest.mark.parametrize(
    ("command", "budget"), [("profile", "1"), ("profile", "5"), ("profile", "9.5"), ("run", "1")]
)
def test_a_budget_no_profile_keeps_to_is_refused_at_once(
    tmp_path: Path, no_work: None, command: str, budget: str
) -> None:
    """--budget-s 1 took 45 s on two cores (the device benchmarks and the baseline's timing
    child run whatever the budget) and timed no step."""
    result = invoke(command, "--budget-s", budget, "--quiet", "--out", str(tmp_path / "p"))
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"error: Invalid value for '--budget-s': {float(budget):g} is too short for a profile: "
        "the device benchmarks and its first real steps take longer whatever the budget; give "
        f"--budget-s 10 or more (default 120) (see 'main {command} --help')\n"
    )
    assert not (tmp_path / "p").exists()


def test_the_library_refuses_a_budget_too_short(tmp_path: Path) -> None:
    from advisor.profiling import ProfileRequest, profile

    with pytest.raises(UsageProblem, match=r"^--budget-s 5 is too short .* 10 or more"):
        profile(ProfileRequest(budget_s=5), tmp_path / "p")
    assert not (tmp_path / "p").exists()


def test_an_out_with_a_file_in_its_way_fails_before_any_work(tmp_path: Path, no_work: None) -> None:
    """It failed in one line, but only after torch, the model's facts and the data (37 s on
    a busy host): the README promises one line before any work."""
    (tmp_path / "afile").write_text("x")
    result = invoke("profile", "--quiet", "--out", str(tmp_path / "afile"))
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"error: cannot use {tmp_path / 'afile'}: File exists: a file is in the way of a "
        "directory it needs: choose another --out\n"
    )
    result = invoke("profile", "--quiet", "--out", str(tmp_path / "afile" / "sub" / "p"))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: cannot use {tmp_path / 'afile'}: Not a directory: ")
    assert (tmp_path / "afile").read_text() == "x"


def test_an_out_it_cannot_write_fails_before_any_work(
    tmp_path: Path, no_work: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # chmod does not stop root (this host's tests run as root): the check asks os.access
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != locked and real_access(p, mode))
    result = invoke("profile", "--quiet", "--out", str(locked / "new" / "p"))
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        f"error: cannot use {locked}: Permission denied: choose a path you can write, or fix "
        "its permissions\n"
    )
    assert list(locked.iterdir()) == []


def test_an_out_whose_parents_do_not_exist_yet_is_fine(tmp_path: Path) -> None:
    from advisor.profiling import check_out

    check_out(tmp_path / "a" / "b" / "c")  # created with its parents when the probes end
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    check_out(tmp_path / "full")  # a directory with other files: they stay
    assert not (tmp_path / "a").exists()


def test_the_budget_counts_from_the_command_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parsing --model-arg imports torch before the profile started its clock: --budget-s 10
    ended 7 s past the profile's own count on a busy host."""
    import advisor.models

    parsed: list[float] = []
    asked: dict[str, Any] = {}
    real_parse = advisor.models.parse_model_args

    def parse(args: Any) -> Any:
        parsed.append(time.perf_counter())
        return real_parse(args)

    def fake_profile(request: Any, out: Path, progress: Any = None) -> None:
        asked["started_at"] = request.started_at
        raise UsageProblem("stopped by the test")

    monkeypatch.setattr(advisor.models, "parse_model_args", parse)
    monkeypatch.setattr("advisor.profiling.profile", fake_profile)
    result = invoke("profile", "--quiet", "--model-arg", "n_layer=1", "--out", str(tmp_path))
    assert result.stderr == "error: stopped by the test\n"
    assert parsed and asked.get("started_at") is not None
    assert asked["started_at"] <= parsed[0]


def test_a_profile_past_its_budget_says_by_how_much_and_what_covers_it() -> None:
    from advisor.profiling import over_budget

    assert over_budget(10.9, 10) is None  # within the 10% the README allows
    assert over_budget(119.0, 120) is None
    warning = over_budget(44.2, 10)
    assert warning is not None
    assert warning.startswith("warning: this profile took 44 s, past its --budget-s 10 ")
    assert warning.endswith("give --budget-s 45 or more to leave them room")


def test_advisor_runs_profile_stage_says_when_it_ran_past_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """'advisor profile' warned; the same profile inside 'advisor run' said nothing."""
    from types import SimpleNamespace

    import advisor.profiling
    from advisor.run import RunRequest, _profile_stage

    done = SimpleNamespace(
        probes=(), model=SimpleNamespace(name="gpt-tiny"), device=SimpleNamespace(name="cpu")
    )
    monkeypatch.setattr(advisor.profiling, "profile", lambda *a, **k: done)
    monkeypatch.setattr(advisor.profiling, "over_budget", lambda took, budget: f"late {budget:g}")
    said: list[str] = []
    detail = _profile_stage(RunRequest(budget_s=30), tmp_path, lambda m, _f: said.append(m))
    assert detail == "gpt-tiny on cpu: 0 probes (); late 30" and said == []
    monkeypatch.setattr(advisor.profiling, "over_budget", lambda took, budget: None)
    detail = _profile_stage(RunRequest(budget_s=30), tmp_path, lambda m, _f: said.append(m))
    assert detail == "gpt-tiny on cpu: 0 probes ()"


def test_a_precision_named_twice_is_profiled_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--precision fp32 --precision fp32 traced every fp32 group twice (two rows each in
    probes.csv, twice the budget) and wrote precisions [fp32, fp32] into profile.json."""
    from advisor.profiling import ProfileRequest, profile

    options: list[Any] = []

    def fake_run_profile(workload: Any, opts: Any, progress: Any = None) -> None:
        options.append(opts)
        raise UsageProblem("stopped by the test")

    monkeypatch.setattr("profilers.profiler.run_profile", fake_run_profile)
    request = ProfileRequest(
        model_args={"n_layer": 1}, seq_len=16, precisions=("fp32", "bf16", "fp32"), comm=False
    )
    with pytest.raises(UsageProblem, match="stopped by the test"):
        profile(request, tmp_path / "p")
    assert options[0].precisions == ("fp32", "bf16")
