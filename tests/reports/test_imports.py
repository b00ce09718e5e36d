"""reports/ is pure: it reads run files and renders; no torch, no advisor, no device code.

DESIGN.md's one-way rule: reports may import the records of strategies and profilers (never
a probe), so it reads plan entries as strategies' Candidate/Prediction instead of copying them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPORTS = Path(__file__).resolve().parents[2] / "reports"
# profilers modules that hold records only (no torch at import time, no probe).
RECORDS = {
    "profilers.defaults",
    "profilers.memory_records",
    "profilers.metrics_record",
    "profilers.rundir",
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


def test_reports_import_neither_torch_nor_advisor_nor_probes() -> None:
    files = sorted(REPORTS.glob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            top = name.split(".")[0]
            assert top not in ("torch", "advisor"), (
                f"{path.name} imports {name}: the report reads run files, not live objects"
            )
            if top == "profilers":
                assert name in RECORDS, f"{path.name} imports probe code {name}"


def test_rendering_a_report_loads_no_torch(hand_run: Path) -> None:
    code = (
        "import sys\n"
        "from reports import write_report\n"
        f"write_report({str(hand_run)!r}, {str(hand_run / 'page.html')!r})\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
