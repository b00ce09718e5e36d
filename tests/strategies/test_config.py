"""TrainConfig's checks and plan reading: one line naming the problem and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from strategies.config import ConfigError, TrainConfig, load_plan_config


@pytest.mark.parametrize("key", ["lr", "min_lr", "weight_decay", "grad_clip"])
def test_a_hyper_parameter_that_is_not_a_number_is_named(key: str) -> None:
    """lr="a" failed as "'>' not supported between instances of 'str' and 'int'"."""
    with pytest.raises(ConfigError) as info:
        TrainConfig(**{key: "a"})  # type: ignore[arg-type]
    assert str(info.value) == f"{key} must be a number, got 'a'"


def test_min_lr_above_lr_names_the_flags() -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig(lr=0.001, min_lr=1.0)
    assert str(info.value) == (
        "min_lr must be between 0 and lr (0.001), got 1: the cosine decays from lr to min_lr "
        "(--min-lr below --lr)"
    )


def test_a_run_directory_is_read_as_its_plan(tmp_path: Path) -> None:
    """It was "plan file RUN does not exist", of a directory that exists."""
    config = TrainConfig(micro_batch_size=4, global_batch_size=8, grad_accum_steps=2)
    (tmp_path / "plan.json").write_text(json.dumps({"config": config.to_dict()}))
    assert load_plan_config(tmp_path) == config
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError) as info:
        load_plan_config(empty)
    assert str(info.value) == (
        f"{empty} is a directory without a plan.json: pass the plan.json that 'advisor "
        "recommend' wrote, or the run directory holding it"
    )
