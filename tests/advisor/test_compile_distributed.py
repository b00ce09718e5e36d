"""torch.compile under DDP and FSDP2 (torchrun, gloo, world size 2 on CPU): the compiled blocks
inside each wrapper compute the eager losses within fp tolerance, over optimizer steps with
accumulation (DDP's no_sync, FSDP's per-block all-gather and reduce-scatter around the compiled
blocks). One launch runs both wrappers: every rank start-up and compile is paid once.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.advisor.torchrun import end_rank, run_world_2

RELATIVE_TOLERANCE = 1e-5  # as tests/advisor/test_compile.py: inductor reorders fp32 reductions
PARALLELISMS = ("ddp", "fsdp")


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="world size 2 needs two cores")
def test_compiled_losses_equal_eager_under_ddp_and_fsdp(tmp_path: Path) -> None:
    out = tmp_path / "losses.json"
    found = run_world_2("tests.advisor.test_compile_distributed", out=out, timeout_s=400)
    assert set(found) == set(PARALLELISMS)
    for parallelism, (eager, compiled) in found.items():
        assert len(set(eager)) > 1, parallelism  # the updates changed the later losses
        for e, c in zip(eager, compiled, strict=True):
            assert abs(c - e) <= RELATIVE_TOLERANCE * abs(e), (parallelism, eager, compiled)


def _rank_main(out: str) -> None:  # pragma: no cover - runs under torchrun
    import torch
    import torch.distributed as dist

    from advisor.workload import AdvisorWorkload
    from profilers.workload import StepSpec

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    workload = AdvisorWorkload("gpt-tiny", {"n_layer": 1})

    def losses(parallelism: str, compile: bool) -> list[float]:
        torch.manual_seed(0)  # every rank, both modes: the same initial weights
        spec = StepSpec(
            seq_len=32,
            micro_batch_size=2,
            grad_accum_steps=2,
            parallelism=parallelism,
            world_size=2,
            compile=compile,
        )
        step = workload.build_step(spec, "cpu")
        generator = torch.Generator().manual_seed(rank)
        found = []
        for _ in range(2):
            loss, _ = step.step(step.synthetic_batches(generator))
            dist.all_reduce(loss)
            found.append(float(loss) / 2)
        return found

    result = {p: (losses(p, False), losses(p, True)) for p in PARALLELISMS}
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    end_rank()


if __name__ == "__main__":
    _rank_main(sys.argv[1])
