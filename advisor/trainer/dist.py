"""Process-group setup for ranks started by torchrun (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from advisor.errors import UsageProblem

# A rank that stops answering fails the collective (and the job) after this long, never hangs.
DEFAULT_PG_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ


def init_distributed(
    world_size: int, device_type: str, timeout_s: float = DEFAULT_PG_TIMEOUT_S
) -> DistContext:
    """Join the process group torchrun set up; a single process needs none."""
    if world_size == 1 and not launched_by_torchrun():
        return DistContext()
    if not launched_by_torchrun():
        raise UsageProblem(
            f"world_size {world_size} needs one process per rank: run it through "
            "'advisor train' (which launches torchrun) or torchrun --nproc-per-node"
        )
    env_world = int(os.environ["WORLD_SIZE"])
    if env_world != world_size:
        nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1)
        raise UsageProblem(
            f"the plan asks for world_size {world_size} but torchrun started {env_world} "
            "processes: "
            + (
                f"the {nodes} nodes were started with different --world-size or --nnodes; "
                "start every node with the same command (only --node-rank differs)"
                if nodes > 1
                else f"launch {world_size} in total or set --world-size {env_world}"
            )
        )
    ctx = DistContext(
        rank=int(os.environ["RANK"]), world_size=env_world, local_rank=int(os.environ["LOCAL_RANK"])
    )
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        device_id = None
        if device_type == "cuda":
            torch.cuda.set_device(ctx.local_rank)
            device_id = torch.device("cuda", ctx.local_rank)  # eager NCCL init on our GPU
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), device_id=device_id)
    return ctx


def check_ranks_agree(ctx: DistContext, settings: dict[str, Any]) -> None:
    """Every rank trains one run: a rank started with other ``settings`` than rank 0's (a node
    launched with other flags) is refused on every rank, with the difference, before a step."""
    if not ctx.enabled:
        return
    import torch.distributed as dist

    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, settings)
    first = gathered[0]
    for rank, other in enumerate(gathered):
        if other == first:
            continue
        keys = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
        shown = ", ".join(f"{k} {other.get(k)!r} (rank 0: {first.get(k)!r})" for k in keys[:4])
        raise UsageProblem(
            f"rank {rank} was started with other settings than rank 0: {shown}: start every "
            "node with the same command (only --node-rank differs)"
        )


def shutdown_distributed() -> None:
    """Free what the run's model held, then leave the process group.

    A sharded or wrapped model outlives the trainer in reference cycles (FSDP's states and hooks
    point back at their modules: ~40 objects per rank for a two-block gpt-tiny, with the DTensors
    that hold the group's mesh). Left to the interpreter's teardown they are destroyed while it
    clears modules, and a gloo rank can abort there ("terminate called without an active
    exception", PyTorch issue #65231; seen once in CI, rank 1 of an FSDP run killed by SIGABRT
    after its last step). Collected here, they go while the interpreter and the group are alive.
    """
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
