"""The chunked loss under DDP and FSDP (torchrun, gloo, world size 2 on CPU): the loss and every
gradient equal the plain loss's within 1e-6, the tied embedding included.

The test launches this file as the ranks' program: each rank builds the advisor's own step for
the plain loss and for ``loss_chunks`` chunks from the same weights and batch, runs one
forward/backward, and rank 0 writes the largest differences (after DDP's all-reduce, or of the
full gradients gathered from FSDP's shards).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.advisor.torchrun import end_rank, run_world_2

TOLERANCE = 1e-6


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="world size 2 needs two cores")
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_chunked_loss_equals_the_plain_loss_at_world_size_2(
    tmp_path: Path, parallelism: str
) -> None:
    out = tmp_path / "diff.json"
    diff = run_world_2("tests.advisor.test_chunked_loss_distributed", parallelism, out=out)
    assert diff["num_grads"] > 0 and diff["tied"]
    assert diff["loss"] <= TOLERANCE * diff["plain_loss"]
    assert diff["grad"] <= TOLERANCE, diff


def _rank_main(parallelism: str, out: str) -> None:  # pragma: no cover - runs under torchrun
    import torch
    import torch.distributed as dist

    from advisor.workload import AdvisorWorkload
    from profilers.workload import StepSpec

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    workload = AdvisorWorkload("gpt-tiny", {"vocab_size": 1000, "n_layer": 2, "n_embd": 64})

    def run(chunks: int) -> tuple[float, dict[str, torch.Tensor], bool]:
        torch.manual_seed(0)  # every rank, every chunking: the same initial weights
        spec = StepSpec(
            seq_len=32,
            micro_batch_size=2,
            grad_accum_steps=2,
            parallelism=parallelism,
            world_size=2,
            loss_chunks=chunks,
        )
        step = workload.build_step(spec, "cpu")
        head = step.adapter.output_head()
        tied = head is not None and head.weight is step.adapter.module.get_submodule("wte").weight
        loss = step.forward_backward(step.synthetic_batches(torch.Generator().manual_seed(rank)))
        dist.all_reduce(loss)
        grads = {}
        for name, p in step.model.named_parameters():
            grad = p.grad
            assert grad is not None, name
            full = getattr(grad, "full_tensor", None)
            grads[name] = (full() if callable(full) else grad).detach().clone()
        return float(loss) / 2, grads, tied

    plain_loss, plain, _ = run(1)
    loss, grads, tied = run(3)
    if rank == 0:
        diff = {
            "plain_loss": abs(plain_loss),
            "loss": abs(loss - plain_loss),
            "grad": max(float((grads[k] - plain[k]).abs().max()) for k in plain),
            "num_grads": len(plain),
            "tied": tied,
        }
        Path(out).write_text(json.dumps(diff))
    end_rank()


if __name__ == "__main__":
    _rank_main(sys.argv[1], sys.argv[2])
