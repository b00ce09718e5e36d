"""``compile`` in every export: the stack's own setting where it has one, else a line that says
what to write in the script; eager plans set nothing."""

from __future__ import annotations

import dataclasses

import pytest

from advisor.exporters import FORMATS, export_plan
from strategies.plan_records import Plan
from tests.advisor.test_export import PLANS


def compiled(name: str = "single-fp32") -> Plan:
    plan = PLANS[name]
    return dataclasses.replace(plan, config=plan.config.replace(compile=True))


def test_the_stacks_settings_are_written() -> None:
    plan = compiled()
    assert export_plan(plan, "torchtitan").settings["compile"] == {"enable": True}
    assert export_plan(plan, "hf").settings["torch_compile"] is True
    dynamo = export_plan(plan, "accelerate").settings["dynamo_config"]
    assert dynamo == {"dynamo_backend": "INDUCTOR", "dynamo_use_regional_compilation": True}
    eager = PLANS["single-fp32"]
    assert export_plan(eager, "torchtitan").settings["compile"] == {"enable": False}
    assert export_plan(eager, "hf").settings["torch_compile"] is False
    assert "dynamo_config" not in export_plan(eager, "accelerate").settings


@pytest.mark.parametrize("fmt", ["lightning", "deepspeed", "hf"])
def test_stacks_without_a_per_block_setting_say_what_to_do(fmt: str) -> None:
    lines = [u for u in export_plan(compiled(), fmt).unmapped if u.startswith("compile true:")]
    assert len(lines) == 1 and "block.compile()" in lines[0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_eager_plan_has_no_compile_instructions(fmt: str) -> None:
    unmapped = export_plan(PLANS["single-fp32"], fmt).unmapped
    assert not any(u.startswith("compile true") for u in unmapped)
