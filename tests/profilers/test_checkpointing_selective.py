"""The checkpointing settings' vocabulary, the profile's group order, the line-error rows."""

from __future__ import annotations

import dataclasses

import pytest

from profilers.checkpointing import (
    check_for_layers,
    checkpointed_blocks,
    every_nth_block,
    parse_checkpointing,
    profiled,
    selectable,
)
from profilers.fit import AffineFit
from profilers.flops import FlopCount
from profilers.phases_core import ordered_groups
from profilers.phases_selective import line_rows
from profilers.workload import ModelFacts, StepSpec
from tests.strategies.profiles import facts, memory_model, time_model


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("blocks:0", "use 'none'"),
        ("blocks:x", "whole number"),
        ("blocks:", "whole number"),
        ("selective", "none, full, ops, ops-half or blocks:K"),
        ("FULL", "none, full, ops, ops-half or blocks:K"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_forms(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_checkpointing(value)
    assert "\n" not in str(info.value)


def test_blocks_k_must_leave_a_block_unchecked() -> None:
    assert check_for_layers("blocks:3", 4).blocks == 3
    with pytest.raises(ValueError, match="use 'full'"):
        check_for_layers("blocks:4", 4)
    with pytest.raises(ValueError, match="1 to 3"):
        check_for_layers("blocks:9", 4)
    assert StepSpec(seq_len=8, activation_checkpointing="blocks:9").activation_checkpointing


def test_checkpointed_blocks_spread_from_the_first_and_never_the_last() -> None:
    assert checkpointed_blocks("blocks:1", 12) == (0,)
    assert checkpointed_blocks("blocks:3", 12) == (0, 4, 8)
    assert checkpointed_blocks("blocks:5", 12) == (0, 2, 4, 7, 9)
    for k in range(1, 12):
        chosen = checkpointed_blocks(f"blocks:{k}", 12)
        assert len(set(chosen)) == k and 11 not in chosen
    assert checkpointed_blocks("ops", 3) == checkpointed_blocks("full", 3) == (0, 1, 2)
    assert every_nth_block("blocks:3", 12) == 4 and every_nth_block("blocks:5", 12) is None


def test_a_profile_measures_one_middle_k_and_the_search_may_pick_any() -> None:
    assert profiled(12) == ("none", "full", "ops", "blocks:6")
    assert selectable(3) == ("none", "full", "ops", "ops-half", "blocks:1", "blocks:2")
    plain = dataclasses.replace(facts(), repeated_blocks=False, num_layers=0)
    modes, why = plain.checkpointing_modes()
    assert modes == ("none",) and len(why) == 1
    assert isinstance(plain, ModelFacts)
    assert "no repeated blocks" in (plain.checkpointing_problem("ops") or "")
    assert facts().checkpointing_problem("blocks:2") is None


def test_selective_groups_come_after_every_whole_model_group() -> None:
    groups = ordered_groups(("bf16", "fp32"), ("none", "full", "ops", "blocks:2"))
    assert groups == [
        ("fp32", "none"),
        ("fp32", "full"),
        ("bf16", "none"),
        ("bf16", "full"),
        ("fp32", "ops"),
        ("fp32", "blocks:2"),
        ("bf16", "ops"),
        ("bf16", "blocks:2"),
    ]


def test_per_op_settings_come_before_blocks_k_which_none_and_full_price() -> None:
    """Without its own traces a blocks:K is still priced on the line in K through none and
    full; an ops-half asked for after it is not priced at all, so it is measured first."""
    groups = ordered_groups(("fp32",), ("none", "full", "ops", "blocks:2", "ops-half"))
    assert groups == [
        ("fp32", "none"),
        ("fp32", "full"),
        ("fp32", "ops"),
        ("fp32", "ops-half"),
        ("fp32", "blocks:2"),
    ]


def test_flops_of_blocks_k_add_k_of_l_blocks_of_recompute() -> None:
    count = FlopCount(
        seq_len=8,
        micro_batch_size=1,
        tokens=8,
        flops_per_token={"none": 300.0, "full": 400.0},
        flops_by_op={},
        formula_flops_per_token=None,
        method="fake",
    )
    assert count.per_token("blocks:1", 4) == pytest.approx(325.0)
    assert count.per_token("ops", 4) == 300.0
    assert count.per_token("blocks:1") is None  # the depth is needed


def test_line_rows_state_how_far_the_none_full_line_is_from_the_middle_k() -> None:
    none, full = memory_model("fp32", "none"), memory_model("fp32", "full")
    middle = dataclasses.replace(
        none,
        activation_checkpointing="blocks:2",
        forward_backward=AffineFit(
            intercept=none.forward_backward.intercept,
            slope=(none.forward_backward.slope + full.forward_backward.slope) / 2 * 0.9,
            xs=(),
            ys=(),
        ),
    )
    times = [time_model("fp32", c) for c in ("none", "full")]
    times.append(dataclasses.replace(times[0], activation_checkpointing="blocks:2"))
    rows = line_rows([none, full, middle], times, 4, 8)
    assert [r.name for r in rows] == ["fp32/blocks:2 memory", "fp32/blocks:2 time"]
    line = (none.predict(8) + full.predict(8)) / 2
    assert rows[0].value == pytest.approx((line - middle.predict(8)) / middle.predict(8))
    assert rows[0].value > 0 and "+" in rows[0].reason
    assert line_rows([none, full], times[:2], 4, 8) == []
