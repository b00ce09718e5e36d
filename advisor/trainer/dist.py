"""Process-group setup for ranks started by torchrun (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

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
        raise UsageProblem(
            f"the plan asks for world_size {world_size} but torchrun started {env_world} "
            f"processes: launch {world_size} in total or set --world-size {env_world}"
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
