"""A run directory that advisor tune tuned exports its tuned plan (RUN/tuned_plan.json), not the
untuned RUN/plan.json beside it, and says so; RUN/plan.json, named, is the untuned plan; a tuned
plan made at another config than plan.json's is not taken, with the reason in the header."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from click.testing import CliRunner

import advisor
from advisor.cli import main
from advisor.exporters import export_plan
from advisor.exporters.source import plan_file
from profilers.rundir import RunDir
from strategies.plan_records import Plan
from tests.advisor.test_export import PLANS

TUNED = {"lr": 0.00137, "min_lr": 0.000137, "warmup_steps": 19, "weight_decay": 0.021}


def _tuned(plan: Plan, **config: object) -> Plan:
    changes = {**TUNED, **config}
    return dataclasses.replace(
        plan,
        config=plan.config.replace(**changes),
        reasons=(*plan.reasons, "hyper-parameters tuned by advisor tune: lr=0.00137"),
    )


def _run(tmp_path: Path, *, plan: bool = True, **tuned_config: object) -> Path:
    """RUN/plan.json and RUN/tuned_plan.json as advisor tune leaves them."""
    base = PLANS["ddp-bf16-full"]
    run = tmp_path / "run"
    run.mkdir()
    if plan:
        base.save(run)
    tuned = _tuned(base, **tuned_config)
    RunDir(run).tuned_plan.write_text(json.dumps(tuned.to_dict(), indent=1) + "\n")
    return run


def test_a_tuned_run_exports_its_tuned_plan(tmp_path: Path) -> None:
    run = _run(tmp_path)
    result = CliRunner().invoke(main, ["export", str(run), "--to", "deepspeed"])
    assert result.exit_code == 0, result.output
    export = export_plan(run, "deepspeed")
    params = export.settings["optimizer"]["params"]
    assert (params["lr"], params["weight_decay"]) == (TUNED["lr"], TUNED["weight_decay"])
    header = "\n".join(json.loads(export.text)["_advisor"])
    assert f"plan: {run / 'tuned_plan.json'}" in header
    assert export.notes and "tuned_plan.json" in export.notes[0]
    assert f"export {run / 'plan.json'} for the untuned values" in export.notes[0]
    assert "note: tuned_plan.json" in result.output  # the command says it on stderr too
    # the untuned plan, named
    untuned = export_plan(run / "plan.json", "deepspeed")
    assert untuned.settings["optimizer"]["params"]["lr"] == PLANS["ddp-bf16-full"].config.lr
    assert not untuned.notes
    # advisor tune's own reading of RUN is still the untuned plan it tunes
    assert plan_file(run) == run / "plan.json"


def test_the_api_exports_the_tuned_plan_of_a_run(tmp_path: Path) -> None:
    run = _run(tmp_path)
    export = advisor.export(run, "hf")
    assert export.settings["learning_rate"] == TUNED["lr"]
    assert export.settings["warmup_steps"] == TUNED["warmup_steps"]
    assert export.sidecar and f"plan: {run / 'tuned_plan.json'}" in export.sidecar


def test_a_tune_directory_without_plan_json_exports(tmp_path: Path) -> None:
    run = _run(tmp_path, plan=False)  # advisor tune --out OUT writes no plan.json there
    export = export_plan(run, "torchtitan")
    assert export.settings["optimizer"]["lr"] == TUNED["lr"]
    assert f"# plan: {run / 'tuned_plan.json'}" in export.text


def test_a_tuned_plan_of_another_config_is_not_taken(tmp_path: Path) -> None:
    # plan.json re-recommended after tuning: the tuned plan is for another micro-batch
    run = _run(tmp_path, micro_batch_size=2, grad_accum_steps=4)
    export = export_plan(run, "torchtitan")
    assert export.settings["optimizer"]["lr"] == PLANS["ddp-bf16-full"].config.lr
    assert f"# plan: {run / 'plan.json'}" in export.text
    note = export.notes[0]
    assert "not used" in note and "grad_accum_steps, micro_batch_size differ" in note
    assert f"# note: {note}" in export.text


def test_the_schedule_spans_the_training_of_the_tuned_plan(tmp_path: Path) -> None:
    run = _run(tmp_path)
    tuned = Plan.from_dict(json.loads(RunDir(run).tuned_plan.read_text()))
    train = RunDir(run).train
    train.root.mkdir()
    train.train_config.write_text(json.dumps({"config": tuned.config.to_dict(), "total_steps": 77}))
    export = export_plan(run, "hf")
    assert export.settings["max_steps"] == 77


def test_an_unreadable_tuned_plan_is_one_line_naming_the_untuned_one(tmp_path: Path) -> None:
    run = _run(tmp_path)
    RunDir(run).tuned_plan.write_text("{")
    result = CliRunner().invoke(main, ["export", str(run), "--to", "hf"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "tuned_plan.json is not readable JSON" in result.output
    assert "regenerate it with 'advisor tune'" in result.output  # it said 'advisor recommend'
    assert f"export {run / 'plan.json'}, the untuned plan" in result.output
