"""``advisor train`` on bad input: exit 2 and one line that names the problem and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from advisor.cli import main


def train(*args: str, tmp_path: Path | None = None) -> Result:
    extra = ["--out", str(tmp_path / "run")] if tmp_path is not None else []
    return CliRunner().invoke(
        main, ["train", "--steps", "1", "--quiet", *extra, *args], prog_name="advisor"
    )


def one_line_error(result: Result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_unknown_model_spec(tmp_path: Path) -> None:
    line = one_line_error(train("--model", "gpt-nano", tmp_path=tmp_path))
    assert line.startswith("error: unknown model spec 'gpt-nano': use a preset (gpt-tiny, ")
    assert line.endswith("hf:NAME_OR_PATH, FILE.py:factory or package.module:factory")


def test_missing_model_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.py"
    line = one_line_error(train("--model", f"{missing}:factory", tmp_path=tmp_path))
    assert line == f"error: model file {missing} does not exist: check the path in --model"


def test_missing_data_file(tmp_path: Path) -> None:
    line = one_line_error(train("--data", str(tmp_path / "corpus.txt"), tmp_path=tmp_path))
    assert line.startswith(f"error: data '{tmp_path / 'corpus.txt'}' does not exist: pass ")


def test_factory_that_does_not_return_a_module(tmp_path: Path) -> None:
    factory = tmp_path / "bad.py"
    factory.write_text("def factory():\n    return 42\n")
    line = one_line_error(train("--model", f"{factory}:factory", tmp_path=tmp_path))
    assert line == (
        f"error: {factory}:factory returned int, not a torch.nn.Module: return the model"
    )


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--micro-batch-size", "0"),
        ("--grad-accum-steps", "-1"),
        ("--seq-len", "0"),
        ("--steps", "0"),
        ("--world-size", "0"),
    ],
)
def test_zero_or_negative_sizes(tmp_path: Path, flag: str, value: str) -> None:
    line = one_line_error(train(flag, value, tmp_path=tmp_path))
    assert line == (
        f"error: Invalid value for '{flag}': {value} is not in the range x>=1. "
        "(see 'advisor train --help')"
    )


@pytest.mark.parametrize(
    ("flag", "value", "range_"),
    [
        ("--lr", "nan", "x>0"),
        ("--lr", "inf", "x>0"),
        ("--min-lr", "nan", "x>=0"),
        ("--weight-decay", "inf", "x>=0"),
        ("--grad-clip", "nan", "x>=0"),
    ],
)
def test_nan_or_infinite_hyperparameters(
    tmp_path: Path, flag: str, value: str, range_: str
) -> None:
    """nan passes every comparison a range makes, and inf is no bound: both are refused."""
    line = one_line_error(train(flag, value, tmp_path=tmp_path))
    assert line == (
        f"error: Invalid value for '{flag}': {value} is not a finite number: give one in the "
        f"range {range_}. (see 'advisor train --help')"
    )


@pytest.mark.parametrize(
    ("model", "arg"),
    [("gpt-tiny", "n_layer=0"), ("bert-tiny", "n_head=0"), ("llama-tiny", "n_kv_head=-2")],
)
def test_zero_or_negative_model_sizes(tmp_path: Path, model: str, arg: str) -> None:
    """n_layer=0 was a ZeroDivisionError traceback from the weight init."""
    line = one_line_error(train("--model", model, "--model-arg", arg, tmp_path=tmp_path))
    field = arg.partition("=")[0]
    assert line == f"error: --model-arg {arg}: {field} must be at least 1"
    assert not (tmp_path / "run").exists()


def test_unknown_precision(tmp_path: Path) -> None:
    line = one_line_error(train("--precision", "fp8", tmp_path=tmp_path))
    assert line == (
        "error: Invalid value for '--precision': 'fp8' is not one of 'fp32', 'bf16', 'fp16'. "
        "(see 'advisor train --help')"
    )


def test_broken_plan_json(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text('{"config": {"model": "gpt-tiny",')
    line = one_line_error(train("--plan", str(plan), tmp_path=tmp_path))
    assert line.startswith(f"error: plan file {plan} is not valid JSON (")
    assert line.endswith("): regenerate it with 'advisor recommend'")


def test_plan_with_an_unknown_key(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text('{"config": {"model": "gpt-tiny", "microbatch": 4}}')
    line = one_line_error(train("--plan", str(plan), tmp_path=tmp_path))
    assert line.startswith("error: unknown TrainConfig key(s) microbatch; known keys: ")


def test_precision_the_device_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import profilers.device

    reason = "bf16 needs an NVIDIA GPU of compute capability 8.0 or newer: use --precision fp16"
    asked: list[str] = []

    def problem(device: object, precision: str) -> str | None:
        asked.append(precision)
        return reason if precision == "bf16" else None

    monkeypatch.setattr(profilers.device, "precision_problem", problem)
    line = one_line_error(train("--precision", "bf16", "--device", "cpu", tmp_path=tmp_path))
    assert line == f"error: bf16 cannot run on cpu: {reason}"
    # Only its own precision is tried: each try loads kernels the run would carry for nothing.
    assert asked == ["bf16"]


def test_global_batch_that_the_split_cannot_make(tmp_path: Path) -> None:
    line = one_line_error(
        train("--global-batch-size", "7", "--micro-batch-size", "2", tmp_path=tmp_path)
    )
    assert line == (
        "error: --global-batch-size 7 is not a multiple of --micro-batch-size 2 x --world-size "
        "1 (not given): pick a micro-batch size that divides it"
    )


def test_a_world_size_that_does_not_divide_the_global_batch_names_that_fix() -> None:
    """No micro-batch size fixes it (the auditor's --world-size 8 --global-batch-size 4 at
    micro-batch 1 was told to pick a micro-batch size)."""
    from strategies.config import ConfigError, TrainConfig, compose_config

    with pytest.raises(ConfigError) as caught:
        compose_config(
            TrainConfig(),
            {"global_batch_size": 4, "micro_batch_size": 1, "world_size": 8, "parallelism": "ddp"},
        )
    assert str(caught.value) == (
        "--global-batch-size 4 is not a multiple of --micro-batch-size 1 x --world-size 8: "
        "pick a multiple of 8 for --global-batch-size or a world size that divides it"
    )


def test_sequence_longer_than_the_model_allows(tmp_path: Path) -> None:
    line = one_line_error(train("--seq-len", "4096", tmp_path=tmp_path))
    assert line == (
        "error: --seq-len 4096 exceeds gpt-tiny's maximum sequence length 512: lower --seq-len "
        "or raise the model's maximum with --model-arg"
    )


def test_data_vocabulary_larger_than_the_model(tmp_path: Path) -> None:
    ids = tmp_path / "ids.bin"
    np.tile(np.arange(1000, dtype=np.uint16), 10).tofile(ids)  # 10k ids: a val split fits
    line = one_line_error(train("--data", str(ids), tmp_path=tmp_path))
    assert line == (
        f"error: data '{ids}' has token ids up to 999 but gpt-tiny has a vocabulary of 256: use "
        "--model-arg vocab_size=1000 (or a matching tokenizer)"
    )


def test_resume_needs_out() -> None:
    line = one_line_error(train("--resume"))
    assert (
        line
        == "error: --resume needs --out naming the run to continue (see 'advisor train --help')"
    )


def test_parallel_layout_without_ranks(tmp_path: Path) -> None:
    line = one_line_error(train("--world-size", "2", tmp_path=tmp_path))
    assert line == (
        "error: parallelism 'single' runs on one device but world_size is 2: use --parallelism "
        "ddp or fsdp, or --world-size 1"
    )


def test_a_profile_passed_as_the_plan_is_named_as_such(tmp_path: Path) -> None:
    """Its keys were listed as 17 unknown TrainConfig keys."""
    import json

    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"device": {"kind": "cpu"}, "model": {"name": "gpt-tiny"}}))
    line = one_line_error(train("--plan", str(profile), tmp_path=tmp_path))
    assert line.startswith(f"error: {profile} is a profile, not a plan: make a plan from it")
    bare = tmp_path / "plan.json"
    bare.write_text(json.dumps({"schema_version": 1}))
    line = one_line_error(train("--plan", str(bare), tmp_path=tmp_path))
    assert line == (
        f"error: {bare} is not a plan (it has no 'config'): pass the plan.json that 'advisor "
        "recommend' wrote"
    )


def test_a_new_micro_batch_on_a_plan_keeps_its_global_batch(tmp_path: Path) -> None:
    """The plan was searched at the global batch the user chose: --micro-batch-size 4 on a
    plan of 8 x 1 trained a global batch of 4 (the accumulation stayed 1)."""
    import json

    from advisor.training import resolve_train_config
    from strategies.config import ConfigError, TrainConfig

    plan = tmp_path / "plan.json"
    chosen = TrainConfig(global_batch_size=8, micro_batch_size=8, grad_accum_steps=1)
    plan.write_text(json.dumps({"config": chosen.to_dict()}))

    smaller = resolve_train_config(plan, None, False, {"micro_batch_size": 4})
    assert (smaller.global_batch_size, smaller.micro_batch_size, smaller.grad_accum_steps) == (
        8,
        4,
        2,
    )
    said = resolve_train_config(plan, None, False, {"micro_batch_size": 4, "grad_accum_steps": 1})
    assert said.global_batch_size == 4  # the accumulation named: the product is the batch
    with pytest.raises(ConfigError, match="--global-batch-size 8 is not a multiple of --micro"):
        resolve_train_config(plan, None, False, {"micro_batch_size": 3})
    unplanned = resolve_train_config(None, None, False, {"micro_batch_size": 4})
    assert unplanned.global_batch_size == 4  # no plan: micro x accum x world, as before


def test_a_model_whose_training_state_exceeds_the_host_is_refused_before_it_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An 8B model on a 23 GiB host allocated until the allocator gave up ("can't allocate
    memory", no fix named); now one line before anything is built, naming the GPU plan."""
    import profilers.device

    monkeypatch.setattr(profilers.device, "read_host_memory", lambda: (2**33, 2**30))
    line = one_line_error(train("--model", "gpt-medium", "--out", str(tmp_path / "r")))
    assert line.startswith("error: gpt-medium has 0.35B parameters: training it here needs ")
    assert "this host has 1.0 GiB available: plan it for GPUs with 'advisor profile' then " in line
    assert not (tmp_path / "r").exists()
    ddp = ["--parallelism", "ddp", "--world-size", "2", "--model-arg", "n_layer=2"]
    line = one_line_error(train("--model", "gpt-small", *ddp, "--out", str(tmp_path / "d")))
    # Each DDP rank holds the whole state: said, with what the ranks need in all.
    assert "and its 2 ddp ranks each build the whole state on this host: " in line
    # A what-if plan for GPUs trained here: the refusal says so (it asked to plan with
    # --target, which the user had done).
    plan = tmp_path / "plan.json"
    config = {"model": "gpt-small", "model_args": {"n_layer": 2}, "parallelism": "fsdp"}
    config |= {"world_size": 8, "global_batch_size": 8, "micro_batch_size": 1}
    plan.write_text(
        json.dumps(
            {
                "estimate": True,
                "label": "ESTIMATE for 8× NVIDIA H100 SXM5 80GB: memory from …",
                "config": config,
            }
        )
    )
    result = train("--plan", str(plan), "--out", str(tmp_path / "w"))
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    note, line = result.stderr.splitlines()
    assert note.startswith("note: ") and "is a what-if plan for 8× NVIDIA H100 SXM5 80GB" in note
    assert "its 8 fsdp ranks each build the whole fp32 model on this host" in line
    assert line.endswith(
        "this plan is a what-if for 8× NVIDIA H100 SXM5 80GB: run it there, or plan for this "
        "host with 'advisor recommend' without --target"
    )
    monkeypatch.setattr(profilers.device, "read_host_memory", lambda: (2**35, 2**34))
    ok = train(
        "--model", "gpt-tiny", "--model-arg", "n_layer=1", "--seq-len", "16", tmp_path=tmp_path
    )
    assert ok.exit_code == 0, ok.output


@pytest.mark.parametrize("written", ["100000", "100_000", "1e5", "1.0e5"])
def test_a_token_count_is_taken_as_written_for_large_counts(written: str) -> None:
    """--tokens-per-trial 1e5 was refused as 'not a valid integer'."""
    from advisor.cli.train import train as train_command
    from advisor.cli.tune import tune as tune_command

    assert train_command.make_context("train", ["--tokens", written]).params["tokens"] == 100_000
    context = tune_command.make_context("tune", ["--plan", ".", "--tokens-per-trial", written])
    assert context.params["tokens_per_trial"] == 100_000


@pytest.mark.parametrize("written", ["1.5e0", "0", "-1e3", "nan", "inf", "many"])
def test_a_token_count_that_is_not_a_whole_positive_number_is_refused(written: str) -> None:
    import click

    from advisor.cli.train import train as train_command

    with pytest.raises(click.BadParameter):
        train_command.make_context("train", ["--tokens", written])


def test_an_eof_error_is_a_failure_not_a_ctrl_c(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """click turns any EOFError into its Abort, which the CLI printed as "interrupted
    (Ctrl-C)" with exit 130 (an empty checkpoint file read by torch.load)."""
    import advisor.cli.train

    def ended(*args: object, **kwargs: object) -> None:
        raise EOFError("Ran out of input")

    monkeypatch.setattr(advisor.cli.train, "run_training", ended)
    result = train(tmp_path=tmp_path)
    assert result.exit_code == 1, result.output
    # (click writes a newline before its Abort, to end a ^C line)
    assert [line for line in result.stderr.splitlines() if line] == [
        "error: a file ended before its data did (EOFError: Ran out of input): a damaged or "
        "partly written file among those the command read; write it again or name another"
    ]


def test_a_run_directory_with_a_tuned_plan_asks_which_to_train(tmp_path: Path) -> None:
    """A run directory as --plan was read as its plan.json, though advisor tune had left a
    tuned_plan.json beside it ('advisor export RUN' takes the tuned one): the untuned values
    trained without a word."""
    from profilers.rundir import RunDir
    from strategies.config import TrainConfig

    run = RunDir(tmp_path / "r")
    run.root.mkdir()
    config = {"config": TrainConfig(model_args={"n_layer": 1}).to_dict()}
    run.plan.write_text(json.dumps(config))
    run.tuned_plan.write_text(json.dumps(config))
    line = one_line_error(train("--plan", str(run.root), tmp_path=tmp_path))
    assert line == (
        f"error: {run.root} holds tuned_plan.json (advisor tune's hyper-parameters) beside its "
        f"plan.json: pass the plan to train, --plan {run.tuned_plan} or --plan {run.plan}"
    )
    run.tuned_plan.unlink()  # the directory alone: its plan.json
    result = train("--plan", str(run.root), tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
