"""``advisor run`` across its lifecycle: a resume after a profile that priced nothing, and the
children of the tune and validation stages when the run is SIGKILLed (README, "advisor run")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from advisor.cli import main
from profilers.rundir import RunDir
from tests.reports.runs import make_hand_run

# The hand profile's workload (tests/strategies/profiles.py): --resume reuses it.
HAND_WORKLOAD = ("--model", "gpt-tiny", "--data", "synthetic", "--seq-len", "64")
ROOT = Path(__file__).resolve().parents[2]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def untimed(profile: dict[str, Any], *rows: dict[str, Any]) -> dict[str, Any]:
    """``profile`` with no step-time fit and ``rows`` for its throughput probes (in place of
    its own): what a busy host left (the baseline's timing timed out)."""
    data = json.loads(json.dumps(profile))
    data["fits"]["time"] = []
    timing = ("throughput", "throughput_fit")
    data["probes"] = [*(r for r in data["probes"] if r["probe"] not in timing), *rows]
    return data


TIMED_OUT = {
    "probe": "throughput",
    "name": "fp32/none/b=1",
    "status": "timeout",
    "reason": "no result after 31.2 s",
    "precision": "fp32",
    "activation_checkpointing": "none",
    "micro_batch_size": 1,
}


@pytest.fixture
def hand(tmp_path: Path) -> Path:
    """A hand-made run with a finished profile and no plan."""
    return make_hand_run(tmp_path / "hand", plan=False)


# -- 1. a resume after a profile nothing could be predicted from ---------------------------------


def test_a_resume_profiles_again_when_the_profile_priced_nothing(
    hand: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy host timed the baseline's step out: recommend priced nothing, and every
    'advisor run --resume' reused that profile and failed the same way. The failure now says
    that the resume profiles again, and the resume does, saying so."""
    import advisor.run as run_module

    good = json.loads(RunDir(hand).profile.read_text())
    profiled: list[Path] = []

    def profile_stage(request: Any, out: Path, say: Any) -> str:
        data = good if profiled else untimed(good, TIMED_OUT)  # the second one is quiet
        profiled.append(out)
        out.mkdir(parents=True, exist_ok=True)
        RunDir(out).profile.write_text(json.dumps(data))
        return "profiled"

    monkeypatch.setattr(run_module, "_profile_stage", profile_stage)
    monkeypatch.setattr(run_module, "_train_stage", lambda *a: ("2 steps", None))
    out = tmp_path / "run"
    args = [*HAND_WORKLOAD, "--validate-top", "0", "--only", "precision=fp32", "--quiet"]
    args += ["--only", "activation-checkpointing=none", "--steps", "2", "--out", str(out)]
    failed = invoke("run", *args)
    assert failed.exit_code == 2, failed.output
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in failed.stderr
    assert errors[0].startswith("error: no candidate could be predicted from this profile")
    assert "(its probe: timeout: no result after 31.2 s)" in errors[0]
    assert errors[0].endswith(
        "; the same command plus --resume profiles it again (a larger --budget-s gives its "
        "timing more time)"
    )

    resumed = invoke("run", *args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    notes = [line for line in resumed.stderr.splitlines() if line.startswith("note: ")]
    assert notes == [
        f"note: --resume: profiling again, {RunDir(out).profile}: it has no step-time fit, so "
        "no candidate can be priced from it (its throughput probe fp32/none/b=1: timeout: no "
        "result after 31.2 s)"
    ]
    assert len(profiled) == 2
    stages = json.loads(RunDir(out).run_log.read_text())["stages"]
    assert {k: v["status"] for k, v in stages.items()} == {
        "profile": "done",
        "recommend": "done",
        "train": "done",
        "report": "done",
    }
    assert RunDir(out).plan.is_file()


def _write(out: Path, data: dict[str, Any]) -> Path:
    RunDir(out).profile.write_text(json.dumps(data))
    return out


def test_which_profiles_a_resume_reuses(hand: Path) -> None:
    """Only a profile that priced nothing for a reason another profile can mend is measured
    again: one with a step-time fit is reused whatever else timed out, and so is one that
    timed nothing because the model does not fit this device (recommend's error names
    --target; another profile here would not fit it either)."""
    from advisor.run import RunRequest, profile_again, reusable_profile

    request = RunRequest(model="gpt-tiny", data="synthetic", seq_len=64, resume=True)
    good = json.loads(RunDir(hand).profile.read_text())
    assert profile_again(hand) is None and reusable_profile(hand, request)

    # a timeout beside a step-time fit: the search prices from the fit
    _write(hand, {**good, "probes": [*good["probes"], TIMED_OUT]})
    assert profile_again(hand) is None and reusable_profile(hand, request)

    unfit = {
        **TIMED_OUT,
        "status": "skipped",
        "reason": "predicted not to fit the device: 9.0 GiB at micro-batch 1 against 1.0 GiB "
        "usable; plan it for a larger device with 'advisor recommend --target'",
    }
    _write(hand, untimed(good, unfit))
    assert profile_again(hand) is None and reusable_profile(hand, request)

    # the lead group does not fit, the others were skipped for the budget: they may fit,
    # so it is measured again, naming the skip that another profile can mend
    budget = {
        **TIMED_OUT,
        "name": "fp32/full/b=1",
        "status": "skipped",
        "reason": "time budget spent",
    }
    _write(hand, untimed(good, unfit, budget))
    assert str(profile_again(hand)).endswith("fp32/full/b=1: skipped: time budget spent)")
    assert not reusable_profile(hand, request)

    # the budget ran out before any timing (a busy host spent it): measured again
    spent = {**TIMED_OUT, "status": "skipped", "reason": "time budget spent"}
    _write(hand, untimed(good, spent))
    why = str(profile_again(hand))
    assert why.startswith("it has no step-time fit, so no candidate can be priced from it")
    assert why.endswith(": skipped: time budget spent)")
    assert not reusable_profile(hand, request)

    # the failure, not the skip after it, is named
    _write(hand, untimed(good, spent, {**TIMED_OUT, "name": "fp32/none/b=2"}))
    assert "fp32/none/b=2: timeout: no result after 31.2 s" in str(profile_again(hand))

    # another workload's profile is still refused, not measured over
    other = RunRequest(model="gpt-tiny", data="synthetic", seq_len=128, resume=True)
    from advisor.errors import UsageProblem

    with pytest.raises(UsageProblem, match="seq_len=64"):
        reusable_profile(hand, other)


# -- the children of a SIGKILLed run -------------------------------------------------------------


def _gone(pid: int) -> bool:
    """The process has exited (a zombie no one has reaped yet counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # Linux: a zombie's state is Z (elsewhere, no /proc: it runs)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except (OSError, IndexError):
        return False


def _state(pid: int) -> str:
    """What /proc says of a process that should be gone (a test's failure message)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return f"no /proc/{pid}/status ({exc})"
    return "; ".join(line for line in lines if line.split(":")[0] in ("State", "PPid", "SigCgt"))


def _wait_for(path: Path, process: subprocess.Popen[bytes], seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"the parent exited ({process.returncode}) before {path}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {path} after {seconds:g} s")
        time.sleep(0.05)


def _gone_soon(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return _gone(pid)


@pytest.fixture
def started() -> Iterator[list[int]]:
    """Pids of the children a test started through its parent: killed if a test left them."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def _parent(*args: str, **env: str) -> subprocess.Popen[bytes]:
    """``python ARGS``: the stand-in for 'advisor run' that the test SIGKILLs."""
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stderr=subprocess.DEVNULL,
    )


# -- 2. the tune stage's trial children -----------------------------------------------------------

TRIAL_CHILD = """\
import os, pathlib, signal, sys, time
def stop(signum, frame):
    time.sleep(0.5)  # the step it was in: its progress line comes after the run died
    sys.stderr.write("step 2/300\\n")
    sys.stderr.flush()
    pathlib.Path(sys.argv[1]).write_text("saved")
    sys.stderr.write("error: SIGTERM: stopped after step 2, checkpoint saved\\n")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
sys.stderr.write("step 1/300\\n")
sys.stderr.flush()
pathlib.Path(sys.argv[1] + ".tmp").write_text(str(os.getpid()))  # whole, then named
os.replace(sys.argv[1] + ".tmp", sys.argv[1] + ".ready")
time.sleep(60)
"""

TRIAL_PARENT = """\
import subprocess, sys
from pathlib import Path
from advisor.tuning import ChildTrainer, TrialSpec
from profilers.rundir import TrainDir
from strategies.config import TrainConfig
real = subprocess.Popen
subprocess.Popen = lambda args, **kw: real([args[0], "-c", sys.argv[1], sys.argv[2]], **kw)
root = Path(sys.argv[3])
root.mkdir(parents=True)
spec = TrialSpec(
    number=0, config=TrainConfig(), steps=300, eval_every=30, directory=TrainDir(root),
    plan=root / "plan.json",
)
ChildTrainer()(spec, lambda point: False)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_trial_child_whose_run_is_killed_stops_and_logs_to_its_file(
    tmp_path: Path, started: list[int]
) -> None:
    """SIGKILL of 'advisor run' in its tune stage: the trial child (advisor.tuning.ChildTrainer)
    gets SIGTERM (term_with_parent) and its lines after the run died reach its stderr.log, a
    file, as the training child's train.log does: no pipe to the dead run to break."""
    saved, trial = tmp_path / "checkpoint", tmp_path / "trial"
    parent = _parent("-c", TRIAL_PARENT, TRIAL_CHILD, str(saved), str(trial))
    try:
        _wait_for(tmp_path / "checkpoint.ready", parent)
        pid = int((tmp_path / "checkpoint.ready").read_text())
        started.append(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _gone_soon(pid, 10.0)
    finally:
        parent.kill()
    assert saved.read_text() == "saved"
    log = (trial / "stderr.log").read_text()
    assert log == (
        "step 1/300\nstep 2/300\nerror: SIGTERM: stopped after step 2, checkpoint saved\n"
    )


# -- 3. validation and probe children ----------------------------------------------------------

# Imported again by the spawned validation child (multiprocessing's spawn runs the main script's
# top level in it): the patches hold there, and its memory pass only says it runs, then sleeps.
LOCAL_PARENT = """\
import os, sys, time
import advisor.validation.local as local
import profilers.orphans as orphans
import advisor.workload

class Workload:
    def __init__(self, **kwargs):
        pass

def memory_pass(w, specs, device):
    with open(os.environ["LIFECYCLE_READY"] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.environ["LIFECYCLE_READY"] + ".tmp", os.environ["LIFECYCLE_READY"])
    time.sleep(60)
    return [{"status": "error", "reason": "slept"} for _ in specs]

advisor.workload.AdvisorWorkload = Workload
local._memory_pass = memory_pass
if os.environ["LIFECYCLE_PDEATHSIG"] == "0":  # the portable watch alone (macOS has no prctl)
    orphans._parent_death_signal = lambda *args: False
else:  # the kernel's signal alone: the watch sees the parent go but ends nothing
    watch = orphans.exit_with_parent
    orphans.exit_with_parent = lambda parent=None: watch(parent, end=lambda: None)

if __name__ == "__main__":
    from types import SimpleNamespace
    from strategies.config import TrainConfig

    config = TrainConfig(model="gpt-tiny", seq_len=32, global_batch_size=2, micro_batch_size=2)
    guess = SimpleNamespace(budgeted_bytes=1, step_time_s=0.1, compile_s=0.0, traced_bytes=None)
    validator = local.LocalValidator(device="cpu", budget_bytes=2**30, memory_limit=False)
    validator.validate([config], [guess])
"""


def _isolated_child_dies_with_its_parent(
    script_text: str, tmp_path: Path, started: list[int], pdeathsig: bool
) -> None:
    """Run ``script_text`` (a parent that starts an isolated child, which writes its pid to
    $LIFECYCLE_READY and sleeps), SIGKILL the parent, and expect the child gone within seconds:
    by the kernel's signal alone (``pdeathsig``) or by the child's watch of its parent alone."""
    if pdeathsig and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    script = tmp_path / "parent.py"
    script.write_text(script_text)
    ready = tmp_path / "child.pid"
    parent = _parent(
        str(script), LIFECYCLE_READY=str(ready), LIFECYCLE_PDEATHSIG="1" if pdeathsig else "0"
    )
    try:
        _wait_for(ready, parent, 30.0)
        pid = int(ready.read_text())
        started.append(pid)
        assert not _gone(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _gone_soon(pid), f"the child outlived its killed parent: {_state(pid)}"
    finally:
        parent.kill()


@pytest.mark.parametrize("pdeathsig", [True, False], ids=["prctl", "watch-only"])
def test_a_validation_child_dies_with_its_killed_run(
    tmp_path: Path, started: list[int], pdeathsig: bool
) -> None:
    """SIGKILL of 'advisor run' (or 'advisor recommend') while it validates: its isolated
    validation child, in a process group of its own, measured on for 30-60 s. It now dies
    within seconds: Linux's PR_SET_PDEATHSIG, and a watch of the parent on every platform."""
    _isolated_child_dies_with_its_parent(LOCAL_PARENT, tmp_path, started, pdeathsig)


# The stand-in for 'advisor profile': a probe child (profilers.isolate) that says it runs, then
# sleeps past the test. Patched as LOCAL_PARENT's are (spawn imports this script in the child).
PROBE_PARENT = """\
import os, time
import profilers.orphans as orphans
from profilers.isolate import Isolation, run_isolated

def probe(ready):
    with open(ready + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(ready + ".tmp", ready)
    time.sleep(60)

if os.environ["LIFECYCLE_PDEATHSIG"] == "0":
    orphans._parent_death_signal = lambda *args: False
else:
    watch = orphans.exit_with_parent
    orphans.exit_with_parent = lambda parent=None: watch(parent, end=lambda: None)

if __name__ == "__main__":
    run_isolated(Isolation(timeout_s=120), probe, os.environ["LIFECYCLE_READY"])
"""


@pytest.mark.parametrize("pdeathsig", [True, False], ids=["prctl", "watch-only"])
def test_a_probe_child_dies_with_its_killed_profile(
    tmp_path: Path, started: list[int], pdeathsig: bool
) -> None:
    """SIGKILL of 'advisor profile' (or of 'advisor run' while it profiles): its probe child,
    in a process group of its own, timed on up to the probe's timeout, holding the cores (a
    GPU's memory) the next run was to use. Every isolated child now watches its parent."""
    _isolated_child_dies_with_its_parent(PROBE_PARENT, tmp_path, started, pdeathsig)


LAUNCHER_CHILD = """\
import os, pathlib, sys, time
pathlib.Path(sys.argv[1] + ".tmp").write_text(str(os.getpid()))  # whole, then named
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
"""

LAUNCHER_PARENT = """\
import subprocess, sys
from types import SimpleNamespace
from advisor.validation import LauncherValidator
from strategies.config import TrainConfig
real = subprocess.run
subprocess.run = lambda args, **kw: real([args[0], "-c", sys.argv[1], sys.argv[2]], **kw)
config = TrainConfig(
    model="gpt-tiny", seq_len=32, global_batch_size=4, micro_batch_size=2, parallelism="ddp",
    world_size=2,
)
guess = SimpleNamespace(step_time_s=0.5, compile_s=0.0)
LauncherValidator(device="cpu", max_world_size=2).validate([config], [guess])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_torchrun_validation_child_dies_with_its_killed_run(
    tmp_path: Path, started: list[int]
) -> None:
    """The launcher validator's 'advisor train' (ddp/fsdp through torchrun) ran on after a
    SIGKILLed run, its output in a pipe nobody read; it now dies with the run (its ranks die
    with it: advisor.launch.die_with_parent)."""
    ready = tmp_path / "child.pid"
    parent = _parent("-c", LAUNCHER_PARENT, LAUNCHER_CHILD, str(ready))
    try:
        _wait_for(ready, parent)
        pid = int(ready.read_text())
        started.append(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _gone_soon(pid), (
            f"the torchrun validation child outlived its killed run: {_state(pid)}"
        )
    finally:
        parent.kill()


def test_a_failed_torchrun_validation_still_names_its_last_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its stderr, a file now, still gives a failed run's reason (its last line)."""
    from types import SimpleNamespace

    from advisor.validation import LauncherValidator
    from strategies.config import TrainConfig

    real = subprocess.run
    child = (
        "import sys; sys.stderr.write('step 1\\nerror: CUDA out of memory on rank 1\\n'); "
        "sys.exit(1)"
    )

    def run(args: list[str], **kwargs: Any) -> Any:
        return real([args[0], "-c", child], **kwargs)

    monkeypatch.setattr(subprocess, "run", run)
    config = TrainConfig(
        model="gpt-tiny",
        seq_len=32,
        global_batch_size=4,
        micro_batch_size=2,
        parallelism="ddp",
        world_size=2,
    )
    guess = SimpleNamespace(step_time_s=0.5, compile_s=0.0)
    [measured] = LauncherValidator(device="cpu", max_world_size=2).validate([config], [guess])  # type: ignore[list-item]
    assert measured.status == "oom"
    assert measured.reason == "CUDA out of memory on rank 1"


def test_exit_with_parent_outside_a_multiprocessing_child_starts_no_watch() -> None:
    """Called in-process (a test, a benchmark calling an isolated child's function itself):
    no parent to die with, and nothing of this process is killed."""
    from profilers.orphans import exit_with_parent

    ended: list[bool] = []
    assert exit_with_parent(12345, end=lambda: ended.append(True)) is False
    assert ended == []


def test_the_orphan_watch_imports_and_makes_its_hooks_without_sigkill() -> None:
    """Windows' signal module has no SIGKILL (nor a prctl): importing the module and making a
    launcher's ``preexec_fn`` must not fail there (the default signal is looked up at call
    time). A fresh interpreter with SIGKILL removed before the import."""
    code = (
        "import signal\n"
        "del signal.SIGKILL\n"
        "from profilers.orphans import kill_with_parent\n"
        "hook = kill_with_parent()\n"
        "print(callable(hook))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert (proc.returncode, proc.stdout) == (0, "True\n"), proc.stderr
