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
