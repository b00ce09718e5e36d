"""trainer_overhead.py's configs, layouts, command lines and hooks (nothing is trained here)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import trainer_overhead as to


def test_layouts_parse_in_order_without_repeats() -> None:
    assert to.parse_layouts("fsdp, single,fsdp") == ("fsdp", "single")
    for bad in ("", "single,tp", "ddp;fsdp"):
        with pytest.raises(argparse.ArgumentTypeError):
            to.parse_layouts(bad)


def test_the_default_run_compares_every_layout() -> None:
    args = to.parse_args([])
    assert args.layouts == ("single", "ddp", "fsdp") and args.world_size == 2
    assert args.pairs == 5 and args.warmup_steps == 3
    with pytest.raises(SystemExit):
        to.parse_args(["--layouts", "ddp", "--world-size", "1"])


@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
def test_a_distributed_layout_keeps_the_global_batch(layout: str) -> None:
    mb8, accum4 = to.CONFIGS
    wide = mb8.for_layout(layout, 2)
    assert (wide.micro_batch_size, wide.grad_accum_steps, wide.world_size) == (4, 1, 2)
    assert wide.name == f"gpt-tiny-fp32-{layout}2-mb4" and wide.base == mb8.name
    deep = accum4.for_layout(layout, 2)
    assert (deep.micro_batch_size, deep.grad_accum_steps) == (2, 2)
    assert deep.name == f"gpt-tiny-fp32-{layout}2-mb2-accum2-ac"
    for bench, base in ((wide, mb8), (deep, accum4)):
        config = bench.train_config()  # valid for strategies.config
        assert config.global_batch_size == base.train_config().global_batch_size == 8
        assert (config.parallelism, config.world_size) == (layout, 2)
        assert config.activation_checkpointing == base.activation_checkpointing


def test_single_layout_is_the_config_itself_and_bad_splits_are_refused() -> None:
    mb8 = to.CONFIGS[0]
    assert mb8.for_layout("single", 2) is mb8
    with pytest.raises(ValueError, match="divides"):
        mb8.for_layout("ddp", 3)
    with pytest.raises(ValueError):
        mb8.for_layout("tp", 2)


def test_configs_are_grouped_by_base_config() -> None:
    names = [c.name for c in to.bench_configs(None, ("single", "ddp"), 2, quick=True)]
    assert names == [
        "gpt-tiny-fp32-mb8",
        "gpt-tiny-fp32-ddp2-mb4",
        "gpt-tiny-fp32-mb2-accum4-ac",
        "gpt-tiny-fp32-ddp2-mb2-accum2-ac",
    ]
    quick = to.bench_configs(["gpt-tiny-fp32-mb8"], ("fsdp",), 2, quick=True)
    assert [c.model_args for c in quick] == [to.QUICK_MODEL_ARGS]


def test_hand_written_distributed_runs_go_through_torchrun_advisor_through_its_cli() -> None:
    path, out = Path("/x/config.json"), Path("/x/run")
    hand = to.child_command("hand", path, 10, out, 1, False, 2)
    assert hand[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in hand and "--nproc-per-node=2" in hand and "--max-restarts=0" in hand
    assert hand[hand.index(str(to.SCRIPT)) + 1 : hand.index(str(to.SCRIPT)) + 3] == [
        "--child",
        "hand",
    ]
    advisor = to.child_command("advisor", path, 10, out, 1, True, 2)
    assert advisor[:2] == [sys.executable, str(to.SCRIPT)]
    assert "--advisor-quiet" in advisor and "torch.distributed.run" not in advisor
    assert to.child_command("hand", path, 10, out, 1, False, 1)[:2] == [
        sys.executable,
        str(to.SCRIPT),
    ]


def test_advisor_train_arguments_end_eval_and_checkpoint_after_the_last_step() -> None:
    args = to.advisor_train_args(Path("p.json"), 12, Path("out"), quiet=False)
    assert args[0] == "train"
    pairs = dict(zip(args[1::2], args[2::2], strict=False))
    assert pairs["--eval-every"] == "0" and pairs["--checkpoint-every"] == "12"
    assert pairs["--steps"] == "12" and pairs["--device"] == "cpu"


def test_rank_arguments_after_the_separator_reach_the_rank_untouched() -> None:
    argv = ["--child", "advisor-rank", "--run-dir", "/r", "--", "train", "--steps", "3"]
    args = to.parse_args(argv)
    assert args.child == "advisor-rank" and args.run_dir == Path("/r")
    assert args.rank_args == ["train", "--steps", "3"]
    assert to.split_rank_args(["--quick"]) == (["--quick"], [])


def test_the_products_launch_starts_ranks_through_this_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.distributed.run as torchrun

    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(torchrun, "run", seen.append)
    to.route_ranks_through_this_file(Path("/out"), threads=1)
    # What advisor.launch.launch builds: torchrun's arguments, then `-m advisor ARGS`.
    parsed = torchrun.get_args_parser().parse_args(
        ["--standalone", "--nproc-per-node=2", "-m", "advisor", "train", "--plan", "p.json"]
    )
    torchrun.run(parsed)
    (args,) = seen
    assert args.module is False and args.training_script == str(to.SCRIPT)
    assert args.training_script_args == [
        "--child",
        "advisor-rank",
        "--threads",
        "1",
        "--run-dir",
        "/out",
        "--",
        "train",
        "--plan",
        "p.json",
    ]
    other = torchrun.get_args_parser().parse_args(["--nproc-per-node=2", "other.py"])
    with pytest.raises(RuntimeError, match="unexpected"):
        torchrun.run(other)


def test_cpu_times_are_read_when_the_trainer_step_returns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from advisor.trainer.loop import Trainer

    calls: list[Any] = []

    def fake_step(self: Any, *args: Any, **kwargs: Any) -> str:
        calls.append(args)
        return "record"

    monkeypatch.setattr(Trainer, "_train_step", fake_step)
    monkeypatch.setenv("RANK", "1")
    save = to.record_step_cpu_times(tmp_path)
    step: Any = Trainer._train_step  # the wrapper around fake_step
    assert step(None, 1, 2) == "record" and step(None, 3, 4) == "record"
    save()
    cpu = json.loads(to.cpu_file(tmp_path, 1).read_text())
    assert calls == [(1, 2), (3, 4)] and len(cpu) == 2 and cpu[0] <= cpu[1]


def test_runs_log_sits_beside_the_results() -> None:
    prefix = Path("benchmarks/results/trainer_overhead")
    assert to.runs_path(prefix) == Path("benchmarks/results/trainer_overhead_runs.jsonl")
