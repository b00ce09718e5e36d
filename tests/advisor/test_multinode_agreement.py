"""Nodes started with different flags: each wrote OUT/launch_config.json on the shared --out,
the last write set every node's settings, and the job trained silently on one node's flags.
Now each node hands its ranks its own file and the ranks refuse to differ."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from advisor.errors import UsageProblem
from advisor.launch import LaunchSpec
from advisor.trainer.dist import DistContext, check_ranks_agree
from advisor.trainer.options import RunOptions
from strategies.config import TrainConfig


def gathering(monkeypatch: pytest.MonkeyPatch, per_rank: list[dict[str, Any]]) -> None:
    import torch.distributed as dist

    def all_gather_object(out: list[Any], mine: Any) -> None:
        out[:] = per_rank

    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)


def test_ranks_with_other_settings_are_refused_with_the_difference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours = {**TrainConfig().to_dict(), "steps": 4}
    theirs = {**ours, "lr": 0.005, "micro_batch_size": 4}
    gathering(monkeypatch, [ours, theirs])
    with pytest.raises(UsageProblem) as info:
        check_ranks_agree(DistContext(rank=0, world_size=2), ours)
    assert str(info.value) == (
        f"rank 1 was started with other settings than rank 0: lr 0.005 (rank 0: {ours['lr']!r}), "
        f"micro_batch_size 4 (rank 0: {ours['micro_batch_size']!r}): start every node with the "
        "same command (only --node-rank differs)"
    )
    gathering(monkeypatch, [ours, dict(ours)])
    check_ranks_agree(DistContext(rank=1, world_size=2), ours)  # the same: nothing said


def test_a_single_process_gathers_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    gathering(monkeypatch, [])  # would fail the comparison if it were asked
    check_ranks_agree(DistContext(), {"lr": 1.0})


@pytest.mark.parametrize(("nnodes", "node_rank", "name"), [
    (1, 0, "launch_config.json"),
    (2, 1, "launch_config.node1.json"),
])  # fmt: skip
def test_each_node_hands_its_ranks_its_own_settings_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nnodes: int, node_rank: int, name: str
) -> None:
    import advisor.launch
    from advisor.training import launch_ranks

    started: list[list[str]] = []
    monkeypatch.setattr(advisor.launch, "launch", lambda spec, args: started.append(args))
    config = TrainConfig(world_size=2, parallelism="ddp", global_batch_size=16)
    spec = LaunchSpec(world_size=2, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint="host:29500")
    launch_ranks(config, RunOptions(out=tmp_path, steps=4), spec, lambda _m: None)
    plan = Path(started[0][started[0].index("--plan") + 1])
    assert plan == tmp_path / name
    assert json.loads(plan.read_text())["config"] == config.to_dict()


@pytest.mark.parametrize("endpoint", ["foo", ":29500", "host:", "host:port", "host:70000"])
def test_an_endpoint_that_is_not_host_port_is_refused(endpoint: str) -> None:
    """'foo' was taken (torchrun's default port) and retried an unresolvable rendezvous
    until killed."""
    with pytest.raises(UsageProblem, match="is not HOST:PORT"):
        LaunchSpec(world_size=2, nnodes=2, rdzv_endpoint=endpoint)
    assert LaunchSpec(world_size=2, nnodes=2, rdzv_endpoint="[::1]:29500").nproc_per_node == 1
