"""DDP and FSDP through torchrun on CPU (gloo, world size 2): equality with one process,
resume after SIGKILL of the launcher, and a failing rank ending the job."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from strategies.config import TrainConfig

pytestmark = [
    pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="world size 2 needs two cores"),
    pytest.mark.usefixtures("one_torch_thread"),  # tests/conftest.py
]

BASE = [
    "--model",
    "gpt-tiny",
    "--model-arg",
    "n_layer=2",
    "--model-arg",
    "n_embd=32",
    "--seq-len",
    "32",
    "--global-batch-size",
    "4",
    "--warmup-steps",
    "2",
    "--eval-batches",
    "1",
    "--quiet",
]
STEPS = 12


def advisor(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "advisor", *args],
        text=True,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def run_ok(*args: str) -> None:
    proc = advisor(*args)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err


def losses(out: Path) -> list[float]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in lines if r["kind"] == "train"]


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """BASE's run in one process, in this one (the trainer ``advisor train`` runs): no launch."""
    from advisor.trainer.loop import RunOptions, train
    from strategies.config import TrainConfig

    out = tmp_path_factory.mktemp("single") / "run"
    config = TrainConfig(
        model="gpt-tiny",
        model_args={"n_layer": 2, "n_embd": 32},
        seq_len=32,
        global_batch_size=4,
        micro_batch_size=2,
        grad_accum_steps=2,
        warmup_steps=2,
    )
    train(config, RunOptions(out=out, steps=STEPS, eval_batches=1, progress=False))
    return losses(out)


def world_2_args(parallelism: str, micro: int, accum: int) -> list[str]:
    """BASE as ``parallelism``×2, ``micro`` × ``accum`` per rank (the out directory not named)."""
    return [
        *BASE,
        *("--parallelism", parallelism, "--world-size", "2"),
        *("--micro-batch-size", str(micro), "--grad-accum-steps", str(accum)),
        *("--steps", str(STEPS)),
    ]


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int, int], Path]:
    """The out directory of ``world_2_args``' run, launched once for the module: the refused
    resume starts from the equality test's DDP run rather than launching one of its own."""
    runs: dict[tuple[str, int, int], Path] = {}

    def run(parallelism: str, micro: int, accum: int) -> Path:
        key = (parallelism, micro, accum)
        if key not in runs:
            out = tmp_path_factory.mktemp(f"{parallelism}-{micro}-{accum}") / "run"
            run_ok("train", *world_2_args(*key), "--out", str(out))
            runs[key] = out
        return runs[key]

    return run


@pytest.mark.parametrize(
    ("parallelism", "micro", "accum"), [("ddp", 2, 1), ("ddp", 1, 2), ("fsdp", 1, 2)]
)
def test_world_size_2_matches_one_process_at_the_same_global_batch(
    launched: Callable[[str, int, int], Path],
    single: list[float],
    parallelism: str,
    micro: int,
    accum: int,
) -> None:
    out = launched(parallelism, micro, accum)
    got = losses(out)
    assert len(got) == len(single) == STEPS
    for a, b in zip(got, single, strict=True):
        assert abs(a - b) / abs(b) <= 1e-4
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(len(r["peak_memory_bytes_per_rank"]) == 2 for r in records if r["kind"] == "train")


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def train_records(out: Path) -> list[dict[str, Any]]:
    """The train records of ``out``'s metrics.jsonl, less a last line a kill left unfinished."""
    text = (out / "metrics.jsonl").read_text()
    lines = [json.loads(x) for x in text[: text.rfind("\n") + 1].splitlines()]
    return [r for r in lines if r["kind"] == "train"]


def _wait_for_step(out: Path, step: int, proc: subprocess.Popen[str]) -> None:
    _wait_for(out / "metrics.jsonl", proc)
    deadline = time.monotonic() + 300
    while not any(r["step"] >= step for r in train_records(out)):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"step {step} never logged"
        time.sleep(0.02)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


@pytest.mark.parametrize(
    # FSDP only: its checkpoint is every rank's DCP shards, restored across ranks. A DDP run's
    # is rank 0's state.pt, the single-device format (tests/advisor/test_train.py kills and
    # resumes that bitwise), and its launcher and data positions are the ones tested here.
    "parallelism",
    ["fsdp"],
)
def test_sigkill_of_the_launcher_then_resume_reproduces_the_losses(
    tmp_path: Path, parallelism: str
) -> None:
    """The launcher SIGKILLed after step 4's checkpoint and a few more steps: its ranks die with
    it, and the resume trains the steps after the checkpoint again to the very losses the run
    had logged for them (its own uninterrupted log up to the kill is the reference: no third
    launch of the same run)."""
    # A tiny GPT that sleeps in forward, so the kill lands mid-run on any host.
    slow = str(Path(__file__).parent.parent / "data" / "slow_model.py") + ":factory"
    args = [
        "train",
        *BASE,
        "--model",
        slow,
        "--keep-checkpoints",
        "100",
        "--parallelism",
        parallelism,
        "--world-size",
        "2",
        "--micro-batch-size",
        "1",
        "--grad-accum-steps",
        "2",
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        "4",
        "--out",
    ]
    out = tmp_path / "run"
    proc = advisor(*args, str(out))
    _wait_for_step(out, 6, proc)  # two steps past the checkpoint at step 4
    ranks = _children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 30  # the ranks die with their launcher
    while any(
        Path(f"/proc/{pid}").exists()
        and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        for pid in ranks
    ):
        assert time.monotonic() < deadline, "a rank outlived its launcher"
        time.sleep(0.1)
    logged = train_records(out)  # steps 1..6 or a few more, as the kill found them
    assert (out / "checkpoints" / "step_00000004" / "extra.pt").is_file()
    # A host that stalled the test past step 8's checkpoint: the resume starts from step 4
    # all the same (its latest then), so it trains logged steps again.
    for later in (out / "checkpoints").glob("step_*"):
        if int(later.name.removeprefix("step_")) > 4:
            shutil.rmtree(later)
    run_ok(*args, str(out), "--resume")
    resumed = train_records(out)
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
    assert len(logged) >= 6
    # Steps 1-4 are the checkpoint's, kept as logged (a resume that trained them again would
    # log other times); the steps after it are trained again to the very numbers logged.
    assert resumed[:4] == logged[:4]

    def numbers(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(r["loss"], r["lr"], r["grad_norm"]) for r in records]

    assert numbers(resumed[4 : len(logged)]) == numbers(logged[4:])


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_a_signal_that_reaches_one_rank_stops_every_rank_after_the_same_step(
    tmp_path: Path, parallelism: str
) -> None:
    """Ranks agree on a stop in the step's loss all-reduce: a SIGTERM sent to rank 1 alone
    stopped rank 1 after its step while rank 0 went on into the next step's collectives (FSDP's
    checkpoint is itself collective), a hang or a peer failure. Now both checkpoint the same
    step and the job stops as a stop (exit 143, one line naming --resume)."""
    slow = str(Path(__file__).parent.parent / "data" / "slow_model.py") + ":factory"
    out = tmp_path / "run"
    proc = advisor(
        "train", *BASE, "--model", slow, "--parallelism", parallelism, "--world-size", "2",
        "--micro-batch-size", "1", "--grad-accum-steps", "2", "--steps", "100000",
        "--checkpoint-every", "100000", "--out", str(out),
    )  # fmt: skip
    _wait_for(out / "metrics.jsonl", proc)
    ranks = _children(proc.pid)
    assert len(ranks) == 2
    os.kill(max(ranks), signal.SIGTERM)  # one rank only, not the launcher
    _, err = proc.communicate(timeout=180)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert last.startswith("error: SIGTERM: stopped after step "), err
    step = int(last.split("stopped after step ")[1].split(",")[0])
    assert (out / "checkpoints" / f"step_{step:08d}").is_dir()
    assert losses(out)[-1] is not None and len(losses(out)) == step


def test_a_rank_that_raises_ends_the_job_with_its_reason(tmp_path: Path) -> None:
    factory = Path(__file__).parent.parent / "data" / "rank_failure_model.py"
    proc = advisor(
        "train",
        "--model",
        f"{factory}:factory",
        "--seq-len",
        "16",
        "--micro-batch-size",
        "2",
        "--parallelism",
        "ddp",
        "--world-size",
        "2",
        "--steps",
        "50",
        "--quiet",
        "--out",
        str(tmp_path / "run"),
    )
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: rank 1 exited with code 1"), err
    assert "injected failure on rank 1" in last


def test_a_rank_killed_from_outside_ends_the_job_in_bounded_time(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = advisor(
        "train",
        *BASE,
        "--parallelism",
        "ddp",
        "--world-size",
        "2",
        "--micro-batch-size",
        "2",
        "--steps",
        "100000",
        "--out",
        str(out),
    )
    _wait_for(out / "metrics.jsonl", proc)
    ranks = _children(proc.pid)
    assert len(ranks) == 2
    os.kill(ranks[-1], signal.SIGKILL)
    started = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert time.monotonic() - started < 120
    assert "was killed by SIGKILL" in err.strip().splitlines()[-1], err


def test_launcher_validator_measures_ddp_and_fsdp_candidates() -> None:
    from types import SimpleNamespace

    from advisor.validation import LauncherValidator, route
    from strategies.config import TrainConfig

    config = TrainConfig(
        model="gpt-tiny",
        model_args={"n_layer": 1, "n_embd": 32},
        seq_len=32,
        global_batch_size=4,
        micro_batch_size=2,
        parallelism="ddp",
        world_size=2,
    )
    validator = LauncherValidator(device="cpu", max_world_size=2)
    assert (
        validator.unsupported_reason(
            config.replace(parallelism="single", world_size=1, micro_batch_size=4)
        )
        is not None
    )
    assert "needs 4 cores" in str(
        validator.unsupported_reason(config.replace(world_size=4, global_batch_size=8))
    )
    prediction = SimpleNamespace(step_time_s=0.5, compile_s=0.0)
    measured = route(
        [config, config.replace(parallelism="fsdp")],
        [prediction] * 2,  # type: ignore[list-item]
        [validator],
    )
    for m in measured:
        assert m.status == "ok", m.reason
        assert m.validator == "torchrun" and len(m.step_samples_s) == 3
        assert m.tokens_per_s == pytest.approx(4 * 32 / m.step_time_s)
        assert m.peak_memory_bytes and m.peak_memory_bytes > 0


def ddp_config() -> TrainConfig:
    """gpt-tiny's default shape as ddp×2 over a global batch of 4 (the launcher's unit tests)."""
    from strategies.config import TrainConfig

    return TrainConfig(
        model="gpt-tiny",
        seq_len=32,
        global_batch_size=4,
        micro_batch_size=2,
        parallelism="ddp",
        world_size=2,
    )


def test_launcher_validator_takes_the_profiled_overheads_off_a_cpu_rank_peak() -> None:
    from advisor.validation import LauncherValidator

    config = ddp_config()
    from profilers.metrics_record import parse_record

    lines = [
        {"kind": "train", "step": s, "step_time_s": t, "peak_memory_bytes": peak}
        for s, t, peak in [(1, 9.0, 900), (2, 0.2, 500), (3, 0.4, 700), (4, 0.3, 600)]
    ] + [{"kind": "eval", "step": 4, "loss": 1.0}]
    records = [r for r in map(parse_record, lines) if r is not None]
    validator = LauncherValidator(
        device="cpu",
        max_world_size=2,
        fixed_overhead_bytes=300,
        parallel_overhead_bytes={"ddp": 10, "fsdp": 100},
        warmup=1,
    )
    ddp = validator.measurement(config.replace(parallelism="ddp"), records, 1.0)
    fsdp = validator.measurement(config.replace(parallelism="fsdp"), records, 1.0)
    # The warm-up step (900 B, 9 s) is left out; the largest later rank peak minus overheads.
    assert ddp.step_samples_s == (0.2, 0.4, 0.3) and ddp.step_time_s == pytest.approx(0.3)
    assert ddp.peak_memory_bytes == 700 - 300 - 10
    assert fsdp.peak_memory_bytes == 700 - 300 - 100
    gpu = LauncherValidator(device="cuda", max_world_size=2, fixed_overhead_bytes=300, warmup=1)
    assert gpu.measurement(config.replace(parallelism="ddp"), records, 1.0).peak_memory_bytes == 700


def test_launcher_validator_judges_what_the_run_held_against_the_budget() -> None:
    """A ddp/fsdp finalist that ran over the budget is "oom" for the plan (so it is replaced),
    judged like the prediction's budgeted bytes: every rank together on a CPU host, the
    largest rank plus the predicted overheads on a GPU."""
    from advisor.validation import LauncherValidator
    from profilers.metrics_record import parse_record
    from strategies.cost import Prediction
    from strategies.prediction import Breakdown, MemoryTerms

    mib = 2**20
    config = ddp_config()
    lines = [
        {
            "kind": "train",
            "step": s,
            "step_time_s": 0.2,
            "peak_memory_bytes": max(ranks) * mib,
            "peak_memory_bytes_per_rank": [r * mib for r in ranks],
        }
        for s, ranks in [(1, (900, 900)), (2, (500, 450)), (3, (520, 480))]
    ]
    records = [r for r in map(parse_record, lines) if r is not None]
    memory = MemoryTerms(
        fitted_peak_bytes=100 * mib,
        phase="forward_backward",
        traced_bytes=100 * mib,
        rounding_allowance_bytes=0,
        fragmentation_bytes=10 * mib,
        fixed_overhead_bytes=390 * mib,
        parallel_overhead_bytes=0,
        per_rank_bytes=500 * mib,
        ranks_sharing_memory=2,
        budgeted_bytes=1000 * mib,
        budget_bytes=1000 * mib,
        model_parameter_bytes=0,
        model_gradient_bytes=0,
        model_optimizer_state_bytes=0,
    )
    predicted = Prediction(
        peak_memory_bytes=500 * mib,
        budgeted_bytes=1000 * mib,
        budget_bytes=1000 * mib,
        step_time_s=0.2,
        tokens_per_s=1.0,
        breakdown=Breakdown(memory=memory),
    )

    def judged(device: str, budget_mib: int | None) -> tuple[str, str]:
        v = LauncherValidator(
            device=device,
            max_world_size=2,
            warmup=1,
            budget_bytes=None if budget_mib is None else budget_mib * mib,
        )
        m = v._within_budget(v.measurement(config, records, 1.0), records, config, predicted)
        return m.status, m.reason

    # CPU: the warm-up step's 1,800 MiB is left out; steps 2-3 held 950 and 1,000 MiB together.
    assert judged("cpu", 1000) == ("ok", "")
    assert judged("cpu", 999) == (
        "oom",
        "the ranks' resident peaks together 1,000 MiB, over the 999 MiB budget",
    )
    assert judged("cpu", None) == ("ok", "")  # no budget: the benchmark's reads
    # CUDA: the largest rank's allocated 520 MiB + 400 MiB predicted beyond the 100 MiB trace.
    assert judged("cuda", 920) == ("ok", "")
    assert judged("cuda", 900) == (
        "oom",
        "largest rank's allocated peak 520 MiB + the overheads predicted beyond the trace "
        "400 MiB = 920 MiB, over the 900 MiB budget",
    )


def test_a_rank_refused_for_bad_usage_is_one_line_and_exit_2(
    tmp_path: Path, launched: Callable[[str, int, int], Path]
) -> None:
    """A DDP run resumed with another model: its ranks refuse it (exit 2). Before, the rank
    printed its error, torchrun's agent logged an ERROR line, the launcher printed the error
    again as 'rank 0 exited with code 2', and the command exited 1. (Both ranks refuse here:
    still the one line.)"""
    out = tmp_path / "run"
    # A copy of the equality test's DDP run (its checkpoint at the last step): no launch of
    # its own to make one, and the launch refused below leaves that run's directory alone.
    shutil.copytree(launched("ddp", 2, 1), out)
    other = [a if a != "n_layer=2" else "n_layer=3" for a in world_2_args("ddp", 2, 1)]
    other += ["--steps", str(STEPS + 1), "--out", str(out), "--resume"]
    proc = subprocess.run(
        [sys.executable, "-m", "advisor", "train", *other],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: cannot resume {out}: its checkpoint was trained with --model-arg n_embd=32 "
        "n_layer=2 (not n_embd=32 n_layer=3); resume with the same settings or choose another "
        "--out"
    ]
