"""Exports of selective checkpointing: torchtitan's selective mode where it can say it, an
unmapped line naming the knob everywhere else (never dropped silently)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from advisor.exporters import FORMATS, export_plan, read_back
from strategies.plan_records import Plan

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"


def plan(setting: str, **config: object) -> Plan:
    base = Plan.from_dict(json.loads((GOLDEN / "cpu-validated" / "plan.json").read_text()))
    return dataclasses.replace(
        base, config=base.config.replace(activation_checkpointing=setting, **config)
    )


def test_torchtitan_writes_ops_as_the_op_option() -> None:
    export = export_plan(plan("ops"), "torchtitan")
    assert export.settings["activation_checkpoint"] == {
        "mode": "selective",
        "selective_ac_option": "op",
    }
    # torchtitan's 'op' recomputes every other matmul: it reads back as ops-half, its own name
    assert (
        read_back("torchtitan", export.text, launch=export.launch)["activation_checkpointing"]
        == "ops-half"
    )
    assert any(u.startswith("activation_checkpointing ops:") for u in export.unmapped)


def test_torchtitan_writes_ops_half_as_op_exactly() -> None:
    export = export_plan(plan("ops-half"), "torchtitan")
    assert export.settings["activation_checkpoint"] == {
        "mode": "selective",
        "selective_ac_option": "op",
    }
    back = read_back("torchtitan", export.text, launch=export.launch)
    assert back["activation_checkpointing"] == "ops-half"
    assert not any("activation_checkpointing" in u for u in export.unmapped)


@pytest.mark.parametrize(("setting", "every"), [("blocks:2", "2"), ("blocks:3", "1")])
def test_torchtitan_writes_blocks_k_as_every_nth_layer(setting: str, every: str) -> None:
    # gpt-tiny has 4 layers: blocks:2 is every 2nd; blocks:3 rounds to every layer (never
    # fewer checkpointed layers than planned, so never more memory).
    p = plan(setting, model="gpt-tiny", model_args={})
    export = export_plan(p, "torchtitan")
    section = export.settings["activation_checkpoint"]
    assert section == {"mode": "selective", "selective_ac_option": every}
    back = read_back("torchtitan", export.text, launch=export.launch)
    assert back["activation_checkpointing"] == f"selective:{every}"
    assert any(u.startswith(f"activation_checkpointing {setting}") for u in export.unmapped)


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "torchtitan"])
@pytest.mark.parametrize("setting", ["ops", "ops-half", "blocks:1"])
def test_other_stacks_name_the_selective_setting_as_unmapped(fmt: str, setting: str) -> None:
    export = export_plan(plan(setting, model="gpt-tiny", model_args={}), fmt)
    back = read_back(fmt, export.text, launch=export.launch)
    assert back["activation_checkpointing"] in ("none", None)
    lines = [u for u in export.unmapped if u.startswith(f"activation_checkpointing {setting}:")]
    assert len(lines) == 1 and "torch.utils.checkpoint" in lines[0]
