"""Selective checkpointing under DDP and FSDP2 at world size 2 (gloo, torchrun): same losses.

One launch runs every case: each rank builds the advisor's own step (``build_step``, the
trainer's path: checkpointing wrapped inside DDP or FSDP's per-block ``fully_shard``) for the
plain run and each selective setting from the same weights and batches, and trains it six
optimizer steps of two micro-batches. Each case was a separate ``advisor train`` launch of
~15-25 s (five in all); a dropped ``--activation-checkpointing`` flag is not what they could see
(the losses are the plain ones either way), the maths under the wrappers is.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.advisor.torchrun import end_rank, run_world_2

CASES = (("ddp", "blocks:1"), ("fsdp", "ops"), ("fsdp", "ops-half"))
STEPS = 6


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="world size 2 needs two cores")
def test_selective_checkpointing_keeps_the_losses_at_world_size_2(tmp_path: Path) -> None:
    out = tmp_path / "losses.json"
    found = run_world_2("tests.advisor.test_distributed_selective", out=out, timeout_s=400)
    assert set(found) == {f"{p} {s}" for p, s in CASES} | {"ddp none", "fsdp none"}
    for parallelism, setting in CASES:
        plain = found[f"{parallelism} none"]
        got = found[f"{parallelism} {setting}"]
        assert len(set(plain)) > 1, parallelism  # the updates changed the later losses
        assert len(got) == len(plain) == STEPS
        assert got == pytest.approx(plain, rel=1e-6, abs=0), (parallelism, setting)


def _rank_main(out: str) -> None:  # pragma: no cover - runs under torchrun
    import torch
    import torch.distributed as dist

    from advisor.workload import AdvisorWorkload
    from profilers.workload import StepSpec

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    workload = AdvisorWorkload("gpt-tiny", {"n_layer": 2, "n_embd": 32})

    def losses(parallelism: str, setting: str) -> list[float]:
        torch.manual_seed(0)  # every rank, every setting: the same initial weights
        spec = StepSpec(
            seq_len=32,
            micro_batch_size=1,
            grad_accum_steps=2,
            parallelism=parallelism,
            world_size=2,
            activation_checkpointing=setting,
        )
        step = workload.build_step(spec, "cpu")
        generator = torch.Generator().manual_seed(rank)  # each rank its own batches
        found = []
        for _ in range(STEPS):
            loss, _ = step.step(step.synthetic_batches(generator))
            dist.all_reduce(loss)
            found.append(float(loss) / 2)
        return found

    result = {}
    for parallelism, setting in (("ddp", "none"), ("fsdp", "none"), *CASES):
        result[f"{parallelism} {setting}"] = losses(parallelism, setting)
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    end_rank()


if __name__ == "__main__":
    _rank_main(sys.argv[1])
