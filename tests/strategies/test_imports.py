"""strategies/ stays pure: importing any of it loads no torch (what each module may import:
tests/test_layout.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

STRATEGIES = Path(__file__).resolve().parents[2] / "strategies"


def test_importing_every_strategies_module_loads_no_torch() -> None:
    modules = [f"strategies.{p.stem}" for p in sorted(STRATEGIES.glob("*.py"))]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=STRATEGIES.parent)
