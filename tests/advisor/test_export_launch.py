"""Multi-node launch lines read by each launcher's own argument parser: torchrun
(torch.distributed.run), ``accelerate launch`` (its parser and launch validation) and DeepSpeed's
runner. The plan: FSDP on 4 GPUs over 2 nodes (a what-if plan of ``advisor recommend --target
... --nodes 2``), as each node would run the line, with NODE_RANK set to 1."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from advisor.exporters import export_plan
from advisor.exporters.source import NODE_RANK
from tests.advisor.test_export import PLANS

PLAN = PLANS["fsdp-fp16-2nodes"]  # 4 ranks, 2 per node
# torchtitan refuses fp16: the same plan in bf16
PLAN_BF16 = dataclasses.replace(PLAN, config=PLAN.config.replace(precision="bf16"))
TORCHRUN = {"hf": "train.py", "lightning": "train.py", "torchtitan": "torchtitan.train"}


def _words(launch: str | None, node_rank: str = "1") -> list[str]:
    """The line as a shell on node ``node_rank`` splits it (environment prefixes dropped)."""
    assert launch is not None
    words = shlex.split(launch.replace(NODE_RANK, node_rank))
    while "=" in words[0] and not words[0].startswith("-"):
        words = words[1:]
    return words


@pytest.mark.parametrize("fmt", sorted(TORCHRUN))
def test_torchrun_lines_use_only_flags_their_rendezvous_reads(fmt: str) -> None:
    run = pytest.importorskip("torch.distributed.run")
    export = export_plan(PLAN_BF16 if fmt == "torchtitan" else PLAN, fmt)
    words = _words(export.launch)
    assert words[0] == "torchrun"
    args = run.get_args_parser().parse_args(words[1:])
    assert (args.nnodes, args.nproc_per_node) == ("2", "2")
    assert args.rdzv_backend == "c10d" and args.rdzv_endpoint == "MASTER_HOST:29500"
    assert args.training_script == TORCHRUN[fmt]
    # torchrun warns and ignores --node-rank unless the rendezvous is static (run.py's check)
    assert args.node_rank == 0 or args.rdzv_backend == "static"
    lines = [u for u in export.unmapped if u.startswith("world_size 4 over 2 nodes")]
    assert len(lines) == 1 and "on each node" in lines[0] and "MASTER_HOST" in lines[0]


def test_accelerate_launch_takes_each_machines_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = pytest.importorskip("accelerate.commands.launch")
    export = export_plan(PLAN, "accelerate")
    (tmp_path / export.filename).write_text(export.text.replace("YourBlock", "Linear"))
    words = _words(export.launch)
    assert words[:2] == ["accelerate", "launch"]
    args = launch.launch_command_parser().parse_args(words[2:])
    assert args.config_file == export.filename
    monkeypatch.chdir(tmp_path)
    args, _, _ = launch._validate_launch_command(args)
    # the file's machine_rank is 0 on every machine: the line's --machine_rank is this node's
    assert (args.machine_rank, args.num_machines, args.num_processes) == (1, 2, 4)
    assert args.main_process_ip == "MASTER_HOST" and args.rdzv_backend == "static"
    (line,) = [u for u in export.unmapped if u.startswith("world_size 4 over 2 nodes")]
    assert "NODE_RANK" in line


def test_deepspeed_lines_and_the_hostfile_they_need() -> None:
    runner = pytest.importorskip("deepspeed.launcher.runner")
    export = export_plan(PLAN, "deepspeed")
    words = _words(export.launch)
    assert words[0] == "deepspeed"
    args = runner.parse_args(words[1:])
    assert (args.hostfile, args.num_nodes, args.num_gpus) == ("hostfile", 2, 2)
    assert args.user_script == "train.py"
    assert args.user_args == ["--deepspeed", "--deepspeed_config", "ds_config.json"]
    (line,) = [u for u in export.unmapped if u.startswith("world_size 4 over 2 nodes")]
    assert "'HOSTNAME slots=2'" in line and "once, on node 0" in line
    # the ssh-less line the header gives, as each node runs it
    ssh_less = line.split("without ssh run '")[1].split("'")[0]
    args = runner.parse_args(_words(ssh_less)[1:])
    assert args.no_ssh and args.node_rank == 1
    assert (args.master_addr, args.master_port) == ("MASTER_HOST", 29500)
    assert (args.num_nodes, args.num_gpus) == (2, 2)
    # the hostfile line the header describes is one DeepSpeed's parser reads
    assert runner._parse_hostfile(["node0 slots=2", "node1 slots=2"]) == {
        "node0": 2,
        "node1": 2,
    }


def test_one_node_lines_are_unchanged() -> None:
    plan = PLANS["ddp-bf16-full"]  # 2 CPU ranks on one node
    assert export_plan(plan, "accelerate").launch == (
        "ACCELERATE_USE_CPU=true accelerate launch --config_file accelerate_config.yaml train.py"
    )
    assert export_plan(plan, "deepspeed").launch == (
        "deepspeed --num_gpus 2 train.py --deepspeed --deepspeed_config ds_config.json"
    )
    for fmt in ("hf", "accelerate", "lightning", "deepspeed", "torchtitan"):
        assert not any(" over 1 nodes" in u for u in export_plan(plan, fmt).unmapped)
