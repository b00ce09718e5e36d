"""Model and optimizer state in a checkpoint directory, for each kind of parallelism.

Replicated models (single device, DDP) are saved once, by rank 0, as ``state.pt``. FSDP's
sharded parameters and optimizer state go through ``torch.distributed.checkpoint`` (every rank
writes its shards; a run resumes at the same world size).
"""

from __future__ import annotations

from pathlib import Path

import torch

from advisor.trainer.checkpoint import DCP_METADATA, MODEL_STATE, atomic_save
from advisor.trainer.dist import DistContext
from advisor.trainer.step import AdvisorStep


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        import torch.distributed as dist

        dist.barrier()


def save_model_state(step: AdvisorStep, staging: Path, ctx: DistContext) -> None:
    if step.spec.parallelism == "fsdp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(step.model, step.optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(staging))
    elif ctx.is_main:
        atomic_save(
            {"model": step.adapter.module.state_dict(), "optimizer": step.optimizer.state_dict()},
            staging / MODEL_STATE,
        )


def load_model_state(step: AdvisorStep, directory: Path, device: torch.device) -> None:
    if step.spec.parallelism == "fsdp":
        if not (directory / DCP_METADATA).is_file():
            raise ValueError(f"{directory} holds no FSDP (distributed) checkpoint")
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optim_state = get_state_dict(step.model, step.optimizer)
        # dcp.load fills these dicts in place.
        dcp.load({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(directory))
        set_state_dict(
            step.model,
            step.optimizer,
            model_state_dict=model_state,
            optim_state_dict=optim_state,
        )
        return
    path = directory / MODEL_STATE
    if not path.is_file():
        raise ValueError(f"{directory} holds no {MODEL_STATE} (was it written by an FSDP run?)")
    state = torch.load(path, map_location=device, weights_only=True)
    step.adapter.module.load_state_dict(state["model"])
    step.optimizer.load_state_dict(state["optimizer"])
