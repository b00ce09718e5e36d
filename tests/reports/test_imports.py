"""reports/ is pure: rendering a report loads no torch (what each module may import:
tests/test_layout.py — the records of strategies and profilers, never advisor or a probe)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_rendering_a_report_loads_no_torch(hand_run: Path) -> None:
    code = (
        "import sys\n"
        "from reports import write_report\n"
        f"write_report({str(hand_run)!r}, {str(hand_run / 'page.html')!r})\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
