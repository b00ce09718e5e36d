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
    (line,) = [u for u in export.unmapped if u.startswith(f"activation_checkpointing {setting}")]
    # every layer checkpointed (N = 1) cannot hold more than planned: the line said its peak
    # could sit above the prediction all the same
    if every == "1":
        assert line.endswith("more recompute than planned, never more memory")
    else:
        assert line.endswith("torchtitan's peak can sit above advisor's prediction")


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "torchtitan"])
@pytest.mark.parametrize("setting", ["ops", "ops-half", "blocks:1"])
def test_other_stacks_name_the_selective_setting_as_unmapped(fmt: str, setting: str) -> None:
    export = export_plan(plan(setting, model="gpt-tiny", model_args={}), fmt)
    back = read_back(fmt, export.text, launch=export.launch)
    assert back["activation_checkpointing"] in ("none", None)
    lines = [u for u in export.unmapped if u.startswith(f"activation_checkpointing {setting}:")]
    assert len(lines) == 1 and "torch.utils.checkpoint" in lines[0]


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "torchtitan"])
def test_blocks_k_names_exactly_which_blocks_to_checkpoint(fmt: str) -> None:
    # gpt-tiny has 4 blocks; blocks:2 is advisor's blocks 0 and 2 (checkpointed_blocks)
    export = export_plan(plan("blocks:2", model="gpt-tiny", model_args={}), fmt)
    (line,) = [u for u in export.unmapped if u.startswith("activation_checkpointing blocks:2:")]
    assert "exactly blocks 0 and 2 of the model's 4 repeated blocks" in line
    assert "counted from 0 in forward order" in line
    assert " L " not in line and "i·L" not in line  # no undefined L when the depth is known


def test_blocks_k_of_a_deeper_model_lists_every_block() -> None:
    # 6 blocks, blocks:4: floor(i·6/4) = 0, 1, 3, 4 (not evenly spaced: listed one by one)
    export = export_plan(plan("blocks:4", model="gpt-tiny", model_args={"n_layer": 6}), "hf")
    (line,) = [u for u in export.unmapped if u.startswith("activation_checkpointing blocks:4:")]
    assert "exactly blocks 0, 1, 3 and 4 of the model's 6 repeated blocks" in line


def test_torchtitan_names_its_layers_and_advisors_blocks() -> None:
    export = export_plan(plan("blocks:2", model="gpt-tiny", model_args={}), "torchtitan")
    (line,) = [u for u in export.unmapped if u.startswith("activation_checkpointing blocks:2:")]
    assert "every 2nd of its 4 layers: layers 1 and 3 (counted from 0" in line
    assert "advisor checkpoints blocks 0 and 2 of the model's 4 repeated blocks" in line
    one = export_plan(plan("blocks:1", model="gpt-tiny", model_args={}), "torchtitan")
    (line,) = [u for u in one.unmapped if u.startswith("activation_checkpointing blocks:1:")]
    assert "every 4th of its 4 layers: layer 3 (" in line and "advisor checkpoints block 0 " in line


def test_an_unknown_depth_states_the_rule_with_l_defined() -> None:
    from advisor.exporters.text import index_list

    export = export_plan(plan("blocks:2", model="no-such-model", model_args={}), "accelerate")
    (line,) = [u for u in export.unmapped if u.startswith("activation_checkpointing blocks:2:")]
    assert "blocks floor(i·L/2) for i = 0..1 of the model's L repeated blocks" in line
    assert index_list(list(range(0, 80, 2))) == "0, 2, 4, ..., 78 (every 2nd)"
    assert index_list([0, 1, 3, 4]) == "0, 1, 3 and 4"
