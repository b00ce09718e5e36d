"""strategies.commands: argument lists that the CLI parses back to the same values."""

from __future__ import annotations

import pytest

from advisor.models import parse_model_args
from strategies.commands import Command, cli_value


@pytest.mark.parametrize(
    "value", ["hf:gpt2", "12", "true", "None", " spaced ", 12, 0.5, True, None, [1, 2], {"a": 1}]
)
def test_a_model_arg_reads_back_as_the_value_it_was(value: object) -> None:
    args = Command("train").model("gpt-tiny", {"k": value}).args()
    assert args[:3] == ["train", "--model", "gpt-tiny"]
    assert parse_model_args([args[4]]) == {"k": value}


@pytest.mark.parametrize(
    ("value", "text"), [(120.0, "120"), (0.001, "0.001"), (1e-5, "1e-05"), (1 / 3, repr(1 / 3))]
)
def test_floats_are_written_exactly(value: float, text: str) -> None:
    assert cli_value(value) == text
    assert float(cli_value(value)) == value


def test_defaults_and_none_are_left_out_and_switches_are_bare() -> None:
    command = (
        Command("run")
        .option("memory_budget", 0.9, default=0.9)
        .option("world_size", None)
        .option("seq_len", 128)
        .repeated("precision", ["bf16", "fp32"])
        .switch("no_comm", True)
        .switch("resume", False)
    )
    assert command.argv() == [
        "advisor",
        "run",
        "--seq-len",
        "128",
        "--precision",
        "bf16",
        "--precision",
        "fp32",
        "--no-comm",
    ]
    assert Command("train").option("out", "a b").shell() == "advisor train --out 'a b'"
