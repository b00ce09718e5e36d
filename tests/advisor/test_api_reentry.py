"""A script that calls the API outside ``if __name__ == "__main__":``: each probe child imports
it (``spawn``), and the call there used to start a profile of its own in every child while the
parent's probes timed out without a word. The child now exits at once, and the parent raises
the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from profilers.isolate import MAIN_REIMPORTED_EXIT

UNGUARDED = """\
import advisor

profile = advisor.profile(
    model="gpt-tiny", model_args={"n_layer": 1}, seq_len=32, precisions=["fp32"],
    checkpointing=["none"], budget_s=30, comm=False, out="p",
)
print("profiled", len(profile.probes))
"""


def test_an_unguarded_script_fails_once_with_the_fix_and_profiles_nothing_nested(
    tmp_path: Path,
) -> None:
    (tmp_path / "unguarded.py").write_text(UNGUARDED)
    done = subprocess.run(
        [sys.executable, "unguarded.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("profilers.isolate.MainScriptReimported: ")
    assert 'if __name__ == "__main__":' in last
    assert "profiled" not in done.stdout
    # One profile directory, the parent's (no runs/ of nested profiles), and nothing saved.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p", "unguarded.py"]
    assert not (tmp_path / "p" / "profile.json").exists()


def test_a_call_while_this_process_imports_the_main_script_exits_with_the_code(
    tmp_path: Path,
) -> None:
    """What the child does (multiprocessing marks a spawned child '_inheriting' while it
    imports the parent's main file): no probe, one line, the exit code the parent reads."""
    script = (
        "import multiprocessing, advisor\n"
        "multiprocessing.current_process()._inheriting = True\n"
        "advisor.profile(model='gpt-tiny', out='never')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == MAIN_REIMPORTED_EXIT
    assert done.stderr.startswith("error: a child process imported your script")
    assert not (tmp_path / "never").exists()
