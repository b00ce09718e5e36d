"""``--only KNOB=V1,V2`` through ``advisor recommend``, ``advisor run`` and RunRequest: the
plan, every alternative and every priced trial keep to it; bad usage is a one-line exit 2; a
run writes it back into its command and does not reuse a plan searched under another."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from advisor.cli import main
from advisor.errors import UsageProblem
from advisor.run import RunRequest, RunResult, _recommend_stage, reusable_plan
from strategies.restrict import normalize_only, parse_only
from strategies.space import Candidate
from tests.strategies.profiles import hand_profile
from tests.strategies.test_loss_chunks import CHUNKS, chunked_profile

# A real profile, committed with the 9th regret session.
REAL_PROFILE = (
    Path(__file__).resolve().parents[2]
    / "benchmarks/results/regret_sessions/20261203T193630Z/profiles/hf-gpt2-32k-gbs8.json"
)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def chunked_path(tmp_path: Path) -> Path:
    """A hand-made profile with blocks:1..3 checkpointing and a measured 16-chunk loss."""
    chunked_profile().save(tmp_path)
    return tmp_path / "profile.json"


def recommend(profile: Path, out: Path, *extra: str) -> Result:
    return invoke(
        "recommend", "--profile", str(profile), "--global-batch-size", "8",
        "--validate-top", "0", "--out", str(out), "--quiet", *extra,
    )  # fmt: skip


def keeps_to(candidate: Candidate | dict[str, Any], only: dict[str, tuple[Any, ...]]) -> bool:
    data = candidate.to_dict() if isinstance(candidate, Candidate) else candidate
    return all(data[knob] in values for knob, values in only.items())


def priced_rows(out: Path) -> list[dict[str, str]]:
    with (out / "trials.csv").open() as f:
        return [row for row in csv.DictReader(f) if row["predicted_tokens_per_s"]]


def row_candidate(row: dict[str, str]) -> dict[str, Any]:
    return {
        "activation_checkpointing": row["activation_checkpointing"],
        "precision": row["precision"],
        "loss_chunks": int(row["loss_chunks"]),
        "micro_batch_size": int(row["micro_batch_size"]),
    }


def check_plan_keeps_to(out: Path, only: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    plan = json.loads((out / "plan.json").read_text())
    assert keeps_to(plan["config"], only), plan["config"]
    assert plan["alternatives"]
    for alternative in plan["alternatives"]:
        assert keeps_to(alternative["candidate"], only), alternative["key"]
    rows = priced_rows(out)
    assert rows
    for row in rows:
        assert keeps_to(row_candidate(row), only), row["key"]
    return plan


# -- advisor recommend ----------------------------------------------------------------------------


def test_recommend_searches_only_what_was_asked(chunked_path: Path) -> None:
    out = chunked_path.parent / "only"
    result = recommend(
        chunked_path, out, "--only", "checkpointing=none,full", "--only", "loss-chunks=1"
    )
    assert result.exit_code == 0, result.output
    only = {"activation_checkpointing": ("none", "full"), "loss_chunks": (1,)}
    plan = check_plan_keeps_to(out, only)
    assert plan["profile"]["request"]["only"] == {
        "activation_checkpointing": ["none", "full"],
        "loss_chunks": [1],
    }
    assert plan["space"]["checkpointing"] == ["none", "full"]
    assert plan["space"]["loss_chunks"] == [1]
    reasons = "\n".join(plan["reasons"])
    assert "checkpointing blocks:1, blocks:2, blocks:3: left out by --only checkpointing=none," in (
        reasons
    )
    assert f"loss-chunks {CHUNKS}: left out by --only loss-chunks=1" in reasons

    # The same profile without --only prices what was left out (so the check above bites).
    everything = chunked_path.parent / "everything"
    assert recommend(chunked_path, everything).exit_code == 0
    rows = priced_rows(everything)
    assert any(r["activation_checkpointing"].startswith("blocks:") for r in rows)
    assert any(int(r["loss_chunks"]) == CHUNKS for r in rows)
    unrestricted = json.loads((everything / "plan.json").read_text())
    assert "only" not in unrestricted["profile"]["request"]
    # A restricted search is its own study, not a resumed unrestricted one.
    assert plan["search"]["study_name"] != unrestricted["search"]["study_name"]


def test_recommend_only_asked_precision_and_micro_batch(chunked_path: Path) -> None:
    out = chunked_path.parent / "bf16"
    result = recommend(
        chunked_path, out, "--only", "precision=bf16", "--only", "micro-batch-size=2,4"
    )
    assert result.exit_code == 0, result.output
    plan = check_plan_keeps_to(out, {"precision": ("bf16",), "micro_batch_size": (2, 4)})
    assert plan["profile"]["request"]["only"] == {
        "precision": ["bf16"],
        "micro_batch_size": [2, 4],
    }


def test_recommend_on_a_real_profile_keeps_to_only(tmp_path: Path) -> None:
    out = tmp_path / "real"
    result = recommend(
        REAL_PROFILE, out, "--only", "checkpointing=none,full", "--only", "loss-chunks=1"
    )
    assert result.exit_code == 0, result.output
    plan = check_plan_keeps_to(
        out, {"activation_checkpointing": ("none", "full"), "loss_chunks": (1,)}
    )
    assert plan["space"]["checkpointing"] == ["none", "full"]
    assert plan["space"]["loss_chunks"] == [1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--only", "foo=1"],
            "error: Invalid value for '--only': foo: not a knob the search turns",
        ),
        (
            ["--only", "precision"],
            "error: Invalid value for '--only': precision: write KNOB=VALUES",
        ),
        (["--only", "precision="], "error: Invalid value for '--only': precision=: give at least"),
        (
            ["--only", "precision=int8"],
            "error: Invalid value for '--only': precision=int8: unknown",
        ),
        (["--only", "compile=maybe"], "error: Invalid value for '--only': compile=maybe: use true"),
        (
            ["--only", "checkpointing=blocks:0"],
            "error: Invalid value for '--only': ",  # then the knob, as below
        ),
        (
            ["--only", "parallelism=ddp"],
            "error: --only parallelism=ddp: nothing asked for can be searched (needs 2 or more "
            "ranks",
        ),
        (
            ["--only", "checkpointing=blocks:4"],
            "error: --only checkpointing=blocks:4: nothing asked for can be searched (activation "
            "checkpointing 'blocks:4' checkpoints all 4 repeated blocks: use 'full')",
        ),
        (
            ["--only", "compile=true"],
            "error: --only compile=true: nothing asked for can be searched (the profile measured "
            "no compiled step",
        ),
    ],
)
def test_bad_only_is_a_one_line_usage_error(
    chunked_path: Path, args: list[str], message: str
) -> None:
    out = chunked_path.parent / "bad"
    result = recommend(chunked_path, out, *args)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert result.stderr.startswith(message), result.stderr
    assert args[1].split("=")[0] in result.stderr  # the knob is named
    if args[1] == "checkpointing=blocks:0":
        assert "'blocks:0' checkpoints no block: use 'none'" in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n")
    assert "Traceback" not in result.output
    assert not (out / "plan.json").exists()


def test_only_compile_on_a_target_says_a_what_if_never_prices_it(chunked_path: Path) -> None:
    """Not "re-run 'advisor profile'", which cannot help: a what-if assumes no speed-up; and
    the target plan says so among what it did not consider (README: --target plans say why)."""
    out = chunked_path.parent / "target"
    target = ("--target", "h100-80gb", "--world-size", "8")
    result = recommend(chunked_path, out, "--only", "compile=true", *target)
    assert result.exit_code == 2, result.output
    assert "no measured speed-up on a what-if target" in result.stderr
    assert "re-run 'advisor profile' (it measures torch.compile" not in result.stderr
    result = recommend(chunked_path, out, *target)
    assert result.exit_code == 0, result.output
    reasons = json.loads((out / "plan.json").read_text())["reasons"]
    assert any("compile: torch.compile has no measured speed-up" in r for r in reasons)


def test_run_refuses_a_bad_only_before_profiling(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = invoke("run", "--only", "foo=1", "--out", str(out), "--quiet")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: Invalid value for '--only': foo: not a knob")
    assert result.stderr.count("\n") == 1
    assert not (out / "profile.json").exists()


# -- advisor run / RunRequest ---------------------------------------------------------------------


def test_only_decides_what_the_profile_measures_unless_told() -> None:
    request = RunRequest(only={"precision": "fp32", "checkpointing": "none,full"})
    assert request.only == {"precision": ("fp32",), "activation_checkpointing": ("none", "full")}
    assert request.profiled_precisions == ("fp32",)
    assert request.profiled_checkpointing == ("none", "full")
    told = RunRequest(
        precisions=("bf16", "fp32"),
        checkpointing=("full",),
        only={"precision": "fp32", "checkpointing": "none,full"},
    )
    assert told.profiled_precisions == ("bf16", "fp32")
    assert told.profiled_checkpointing == ("full",)
    # Restricting other knobs leaves the profile's defaults.
    other = RunRequest(only={"compile": False, "loss_chunks": 1})
    assert other.profiled_precisions is None and other.profiled_checkpointing is None
    assert RunRequest().profiled_precisions is None and RunRequest().only == {}


def test_the_profile_stage_measures_what_only_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import advisor.profiling
    from advisor.run import _profile_stage

    asked: list[Any] = []

    class Stop(Exception):
        pass

    def fake_profile(request: Any, out: Path, say: Any) -> None:
        asked.append(request)
        raise Stop

    monkeypatch.setattr(advisor.profiling, "profile", fake_profile)
    request = RunRequest(only={"precision": "bf16,fp32", "checkpointing": "none,blocks:2"})
    with pytest.raises(Stop):
        _profile_stage(request, tmp_path, lambda _m, _f: None)
    assert asked[0].precisions == ("bf16", "fp32")
    assert asked[0].checkpointing == ("none", "blocks:2")


def only_words(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv) if word == "--only"]


@pytest.mark.parametrize(
    "only",
    [
        {"precision": "fp32", "checkpointing": "none,full"},
        {"compile": False, "fsdp-reshard-after-forward": [True, False], "micro_batch_size": 4},
        {"activation_checkpointing": ["blocks:2"], "parallelism": "ddp,fsdp", "num_workers": 0},
    ],
)
def test_the_run_command_writes_only_back(tmp_path: Path, only: dict[str, Any]) -> None:
    request = RunRequest(only=only)
    argv = request.command(tmp_path / "run")
    words = only_words(argv)
    assert len(words) == len(request.only)
    assert parse_only(words) == request.only == normalize_only(only)
    assert all(not w.startswith("activation") for w in words)  # written as checkpointing=
    assert "--only" not in RunRequest().command(tmp_path / "run")


def test_the_run_command_parses_back_to_the_same_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``advisor run`` with the recorded command line builds the same RunRequest.only."""
    import advisor.run

    seen: list[RunRequest] = []

    def fake_run(request: RunRequest, out: Path, progress: Any) -> RunResult:
        seen.append(request)
        return RunResult(out=out, report=None, stages=())

    monkeypatch.setattr(advisor.run, "run", fake_run)
    request = RunRequest(
        only={"precision": "fp32", "checkpointing": "none,full", "compile": "off"},
        global_batch_size=8,
    )
    argv = request.command(tmp_path / "run")
    assert argv[:2] == ["advisor", "run"]
    result = invoke(*argv[1:], "--quiet")
    assert result.exit_code == 0, result.output
    assert seen[0].only == request.only
    assert seen[0].command(tmp_path / "run") == argv


@pytest.mark.parametrize(
    ("only", "message"),
    [
        ({"foo": "1"}, "--only foo: not a knob"),
        ({"precision": "int8"}, "--only precision=int8: unknown value"),
        ({"micro_batch_size": 0}, "must be at least 1"),
        ({"checkpointing": "blocks:0"}, "checkpoints no block"),
    ],
)
def test_a_bad_only_is_a_usage_problem(only: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageProblem, match=message):
        RunRequest(only=only)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory with profile.json and a plan searched under --only checkpointing=none,
    full (the recommend stage of 'advisor run')."""
    out = tmp_path / "run"
    hand_profile().save(out)
    request = RunRequest(global_batch_size=8, validate_top=0, only={"checkpointing": "none,full"})
    _, plan = _recommend_stage(request, out, lambda _m, _f: None)
    assert plan.candidate.activation_checkpointing in ("none", "full")
    assert all(e.candidate.activation_checkpointing in ("none", "full") for e in plan.alternatives)
    return out


def test_the_plan_is_reused_only_under_the_same_only(run_dir: Path) -> None:
    recorded = json.loads((run_dir / "plan.json").read_text())["profile"]["request"]
    assert recorded["only"] == {"activation_checkpointing": ["none", "full"]}

    def same(**changes: Any) -> bool:
        return reusable_plan(run_dir, RunRequest(global_batch_size=8, **changes))

    # The same restriction, however spelled.
    assert same(only={"checkpointing": "none,full"})
    assert same(only={"activation_checkpointing": ["none", "full"]})
    assert same(only={"checkpointing": "none", "activation-checkpointing": "full,none"})
    # A different one, none at all, or one more knob: search again.
    assert not same(only={"checkpointing": "none"})
    assert not same()
    assert not same(only={"checkpointing": "none,full", "compile": False})
    assert not same(only={"precision": "fp32"})
    # The same values in another order: the same space and study, nothing to search again.
    assert same(only={"checkpointing": "full,none"})


def test_a_plan_without_only_is_not_reused_by_a_restricted_run(run_dir: Path) -> None:
    plan_path = run_dir / "plan.json"
    plan = json.loads(plan_path.read_text())
    del plan["profile"]["request"]["only"]
    plan_path.write_text(json.dumps(plan))
    assert reusable_plan(run_dir, RunRequest(global_batch_size=8))
    assert not reusable_plan(
        run_dir, RunRequest(global_batch_size=8, only={"checkpointing": "none,full"})
    )
    # A plan whose recorded only this code cannot read is not this request's.
    plan["profile"]["request"]["only"] = {"foo": ["1"]}
    plan_path.write_text(json.dumps(plan))
    assert not reusable_plan(run_dir, RunRequest(global_batch_size=8))
    assert not reusable_plan(
        run_dir, RunRequest(global_batch_size=8, only={"checkpointing": "none,full"})
    )


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        (
            {"global_batch_size": 7, "only": {"micro_batch_size": 2}},
            "--only micro-batch-size=2: none divides the global batch 7",
        ),
        (
            {"precisions": ("bf16",), "only": {"precision": "fp32"}},
            "--only precision=fp32: the profile measures --precision bf16 only",
        ),
    ],
)
def test_run_refuses_only_values_its_own_flags_rule_out_before_profiling(
    kwargs: dict[str, Any], said: str
) -> None:
    """The search refused them after the whole profile had run."""
    from advisor.run import RunRequest

    with pytest.raises(UsageProblem, match="^" + re.escape(said)):
        RunRequest(**kwargs)
    RunRequest(global_batch_size=8, only={"micro_batch_size": "2,3"})  # one of them divides
