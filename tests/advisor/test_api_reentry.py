"""A script that calls the API outside ``if __name__ == "__main__":``: each probe child imports
it (``spawn``), and the call there used to start a profile of its own in every child while the
parent's probes timed out without a word. The child now exits at once, and the parent raises
the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import advisor
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


# -- repeated calls in one process (a notebook) ----------------------------------------------

NOTEBOOK = """\
import json, logging, os, signal, threading
import torch
import advisor
from strategies.config import TrainConfig
from tests.strategies.profiles import hand_profile

def state():
    return {
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "signals": [str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)],
        "threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
        "root": [logging.getLogger().level, len(logging.getLogger().handlers)],
        "grad": torch.is_grad_enabled(),
        "dtype": str(torch.get_default_dtype()),
        "live_threads": threading.active_count(),
    }

tiny = TrainConfig(model="gpt-tiny", model_args={"n_layer": 1}, data="synthetic", seq_len=32,
                   global_batch_size=2, micro_batch_size=2, warmup_steps=1)
before = state()
for n in range(2):
    plan = advisor.recommend(hand_profile(), global_batch_size=8, validate_top=0)
    advisor.predict(hand_profile(), plan, micro_batch_size=4)
    advisor.export(plan, "lightning")
    advisor.train(tiny, steps=2, out=f"t{n}", eval_every=0)
after = state()
changed = sorted(k for k in before if before[k] != after[k])
env = sorted(set(before["env"].items()) ^ set(after["env"].items()))
with open("state.json", "w") as f:
    json.dump({"changed": changed, "env": env}, f)
"""


def test_repeated_calls_are_silent_and_leave_the_process_as_they_found_it(
    tmp_path: Path,
) -> None:
    """A notebook calls the API again and again: nothing on stdout or stderr without a
    callback, and no environment variable, signal handler, working directory, torch thread
    count or logging handler changed by the calls."""
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "notebook.py").write_text(NOTEBOOK)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "notebook.py")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")
    assert json.loads((tmp_path / "state.json").read_text()) == {"changed": [], "env": []}


def test_a_launched_plan_leaves_the_callers_environment_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher sets OMP_NUM_THREADS=1 (and torchrun TORCHELASTIC_SIGNALS_TO_HANDLE) for
    its ranks in the caller's own os.environ: a later advisor.profile in the same notebook
    then probed on one thread."""
    from strategies.config import TrainConfig
    from tests.reports.runs import write_training

    config = TrainConfig(
        model="gpt-tiny",
        model_args={"n_layer": 1},
        data="synthetic",
        seq_len=32,
        global_batch_size=2,
        micro_batch_size=1,
        parallelism="ddp",
        world_size=2,
    )
    out = tmp_path / "run"

    def fake_launch(spec: object, args: list[str]) -> None:
        os.environ["OMP_NUM_THREADS"] = "1"
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = "SIGTERM"
        write_training(out, config, 2, 2)

    monkeypatch.setattr("advisor.launch.launch", fake_launch)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = dict(os.environ)
    advisor.train(config, steps=2, out=out)
    assert dict(os.environ) == before
