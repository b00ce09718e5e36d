"""strategies/ stays pure: no torch, no advisor, no probe code (parsed imports, every file)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

STRATEGIES = Path(__file__).resolve().parents[2] / "strategies"
# profilers modules that only hold records and arithmetic (no torch at import time).
ALLOWED_PROFILERS = {
    "profilers.comm_records",
    "profilers.defaults",
    "profilers.device",
    "profilers.device_records",
    "profilers.fit",
    "profilers.flops",
    "profilers.hardware",
    "profilers.memory_model",
    "profilers.memory_records",
    "profilers.profile_record",
    "profilers.rundir",
    "profilers.throughput",
    "profilers.workload",
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_file_in_strategies_imports_torch_advisor_or_probe_code() -> None:
    files = sorted(STRATEGIES.glob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            top = name.split(".")[0]
            assert top not in ("torch", "advisor", "reports"), f"{path.name} imports {name}"
            if top == "profilers":
                assert name in ALLOWED_PROFILERS, f"{path.name} imports probe code {name}"


def test_importing_every_strategies_module_loads_no_torch() -> None:
    modules = [f"strategies.{p.stem}" for p in sorted(STRATEGIES.glob("*.py"))]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=STRATEGIES.parent)
