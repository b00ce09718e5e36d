"""Run one test module's ``__main__`` under ``torch.distributed.run`` at world size 2 (gloo,
CPU) and read the JSON it writes: the pattern of the distributed equality tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_world_2(module: str, *args: str, out: Path, timeout_s: float = 300) -> Any:
    """``python -m torch.distributed.run --standalone --nproc-per-node 2 -m module *args out``
    from the repository root; the JSON the ranks wrote to ``out`` (the run must exit 0)."""
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"),
            *("2", "-m", module, *args, str(out)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def end_rank() -> None:  # pragma: no cover - runs under torchrun
    """Leave a rank without the interpreter's teardown: every rank reaches the barrier after its
    last collective (and rank 0 after writing its JSON), then the process exits at once.

    A gloo rank torn down by the interpreter, or by ``destroy_process_group`` with FSDP's
    reference cycles still alive, can abort ("terminate called without an active exception",
    PyTorch issue #65231): CI saw it on 2026-12-04, rank 1 of the chunked-loss FSDP test killed by
    SIGABRT after its work was done, the whole run failed. The product's own ranks collect those
    cycles first (``advisor.trainer.dist.shutdown_distributed``); a test's ranks have nothing
    left to do, so they skip the teardown altogether.
    """
    import gc

    import torch.distributed as dist

    gc.collect()
    if dist.is_initialized():
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
