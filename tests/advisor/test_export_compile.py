"""``compile`` in every export: the stack's own setting where it has one, else a line that says
what to write in the script; eager plans set nothing."""

from __future__ import annotations

import dataclasses

import pytest

from advisor.exporters import FORMATS, export_plan, read_back
from strategies.plan_records import Plan
from tests.advisor.test_export import PLANS


def compiled(name: str = "single-fp32") -> Plan:
    plan = PLANS[name]
    return dataclasses.replace(plan, config=plan.config.replace(compile=True))


def test_the_stacks_settings_are_written() -> None:
    plan = compiled()
    # components ["model"]: each block, as advisor; torchtitan's default also compiles the loss
    assert export_plan(plan, "torchtitan").settings["compile"] == {
        "enable": True,
        "components": ["model"],
    }
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


def test_hf_compiles_each_block_as_advisor_does() -> None:
    # torch_compile alone compiles the whole model; Accelerate's regional compilation, asked
    # for by the launch line's variable, compiles each repeated block (checked against the real
    # Trainer in test_export_stacks.py). tf32 false: torch_compile would turn TF32 on.
    export = export_plan(compiled("ddp-bf16-full"), "hf")
    assert export.settings["torch_compile"] is True and export.settings["tf32"] is False
    assert export.launch is not None
    assert export.launch.startswith("ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=true torchrun ")
    (line,) = [u for u in export.unmapped if u.startswith("compile true:")]
    assert "leave torch_compile false" not in line  # the file sets it true: no contradiction
    assert "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=true" in line
    assert read_back("hf", export.text, launch=export.launch)["world_size"] == 2
    eager = export_plan(PLANS["ddp-bf16-full"], "hf")
    assert "tf32" not in eager.settings and eager.launch and eager.launch.startswith("torchrun ")


def test_torchtitan_keeps_the_loss_eager() -> None:
    export = export_plan(compiled(), "torchtitan")
    assert 'components = ["model"]' in export.text
    (line,) = [u for u in export.unmapped if u.startswith("compile true:")]
    assert "loss" in line
