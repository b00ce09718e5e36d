"""README promises of ``advisor train``: Ctrl-C saves and exits 130 (a second one stops at once;
a second SIGTERM does not),
``--keep-checkpoints N`` keeps the newest N, and a multi-node job prints each node's command."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from advisor.cli import main
from advisor.launch import LaunchSpec
from advisor.trainer.checkpoint import CheckpointDir
from tests.advisor.test_train import TINY, advisor, losses

STEPS = 16


def train_lines(out: Path) -> int:
    metrics = out / "metrics.jsonl"
    text = metrics.read_text() if metrics.exists() else ""
    return sum('"kind": "train"' in line for line in text.splitlines())


def wait_for_a_step(out: Path, proc: subprocess.Popen[str], timeout: float = 240) -> int:
    """Poll metrics.jsonl until the first training step is logged; the steps logged by then."""
    deadline = time.monotonic() + timeout
    while (logged := train_lines(out)) == 0:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no training step was ever logged"
        time.sleep(0.05)
    return logged


def slow(delay_s: float) -> list[str]:
    """The tiny slow model of test_train (it sleeps in forward) with this delay per forward."""
    return [*TINY, "--model-arg", f"delay_s={delay_s}", "--eval-every", "0"]


def test_ctrl_c_saves_a_checkpoint_exits_130_and_resumes(tmp_path: Path) -> None:
    """(That a resumed run reproduces the uninterrupted losses bit for bit is checked after
    SIGTERM in test_train: the same stop path.)"""
    out = tmp_path / "run"
    args = ["train", *slow(0.05), "--steps", str(STEPS), "--checkpoint-every", "100"]
    args += ["--out", str(out)]
    proc = advisor(*args)
    wait_for_a_step(out, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the run finished before Ctrl-C arrived")
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(
        r"error: SIGINT: stopped after step (\d+), checkpoint saved in (.+); continue with the "
        r"same command plus --resume",
        last,
    )
    assert match, last
    step = int(match.group(1))
    assert 1 <= step < STEPS and Path(match.group(2)) == out / "checkpoints"
    # The checkpoint of the step it stopped after: complete, named by 'latest', loadable.
    checkpoints = CheckpointDir(out / "checkpoints", keep_last=100)
    assert checkpoints.steps() == [step]  # --checkpoint-every 100: only the one Ctrl-C saved
    saved = checkpoints.latest()
    assert saved == out / "checkpoints" / f"step_{step:08d}"
    assert CheckpointDir.load_extra(saved)["step"] == step
    state = torch.load(saved / "state.pt", map_location="cpu", weights_only=True)
    assert isinstance(state, dict) and state
    before = losses(out)
    assert [s for s, _ in before] == list(range(1, step + 1))  # metrics end where it stopped
    result = CliRunner().invoke(main, [*args, "--resume"])  # in this process: no restart cost
    assert result.exit_code == 0, result.output
    assert [s for s, _ in losses(out)] == list(range(1, STEPS + 1))  # each step once
    assert losses(out)[:step] == before


def test_a_second_ctrl_c_stops_at_once(tmp_path: Path) -> None:
    """Two Ctrl-C 0.4 s apart, early in a step of 1.2 s (two forwards sleeping 0.6 s each):
    the first asks for a checkpoint after the step, the second stops in the middle of it —
    the step is never logged and no checkpoint is written."""
    out = tmp_path / "run"
    args = ["train", *slow(0.6), "--steps", str(STEPS), "--checkpoint-every", "100"]
    proc = advisor(*args, "--out", str(out))
    logged = wait_for_a_step(out, proc)  # a step just ended: the next one has begun
    proc.send_signal(signal.SIGINT)
    time.sleep(0.4)  # apart, so that the two are not merged into one pending signal
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "error: interrupted (Ctrl-C): the same command plus --resume continues from the last "
        "checkpoint saved (from step 0 if none was)"
    )
    assert "stopped after step" not in err and "Traceback" not in err
    assert train_lines(out) == logged  # the step under way was not finished
    assert CheckpointDir(out / "checkpoints", keep_last=100).steps() == []  # nor checkpointed


def test_a_second_sigterm_still_saves(tmp_path: Path) -> None:
    """A scheduler signals the whole process group while `advisor run` passes its own SIGTERM
    on to its training child: the child gets SIGTERM twice. The second is the same request,
    not a second Ctrl-C: the step ends and its checkpoint is saved (it stopped at once, saving
    nothing, until 2026-12-07)."""
    out = tmp_path / "run"
    args = ["train", *slow(0.6), "--steps", str(STEPS), "--checkpoint-every", "100"]
    proc = advisor(*args, "--out", str(out))
    wait_for_a_step(out, proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.4)  # apart, so that the two are not merged into one pending signal
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the run finished before SIGTERM arrived")
    assert proc.returncode == 143, err
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(r"error: SIGTERM: stopped after step (\d+), checkpoint saved in .+", last)
    assert len(CheckpointDir(out / "checkpoints", keep_last=100).steps()) == 1


def test_keep_checkpoints_keeps_the_newest(tmp_path: Path) -> None:
    out = tmp_path / "run"
    tiny = ["--model", "gpt-tiny", "--model-arg", "n_layer=1", "--model-arg", "n_embd=32"]
    common = [*tiny, "--data", "synthetic", "--seq-len", "32", "--micro-batch-size", "2"]
    common += ["--checkpoint-every", "1", "--keep-checkpoints", "2", "--eval-every", "0"]
    common += ["--eval-batches", "1", "--quiet", "--out", str(out)]
    result = CliRunner().invoke(main, ["train", *common, "--steps", "5"])
    assert result.exit_code == 0, result.output
    checkpoints = out / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        "latest",
        "step_00000004",
        "step_00000005",
    ]
    assert (checkpoints / "latest").read_text().strip() == "step_00000005"
    # Resumed further, still the newest two: the older ones are pruned as new ones land.
    result = CliRunner().invoke(main, ["train", *common, "--steps", "8", "--resume"])
    assert result.exit_code == 0, result.output
    assert CheckpointDir(checkpoints, keep_last=2).steps() == [7, 8]


def test_a_multi_node_job_prints_each_nodes_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--nnodes 2``: the command every node runs (node 0's rendezvous, the ranks per node,
    no torchrun --node-rank: c10d numbers the nodes and torchrun warns that it ignores one), a
    valid torchrun command line running this job; nothing launched here but this node's
    share."""
    from torch.distributed.run import get_args_parser

    from advisor.cli.train import train

    launched: list[tuple[LaunchSpec, list[str]]] = []
    monkeypatch.setattr("advisor.launch.launch", lambda spec, args: launched.append((spec, args)))
    out = tmp_path / "run"
    result = CliRunner().invoke(
        main,
        [
            "train", "--parallelism", "fsdp", "--world-size", "4", "--micro-batch-size", "2",
            "--steps", "7", "--nnodes", "2", "--node-rank", "1",
            "--rdzv-endpoint", "node0.example:29500", "--out", str(out),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0] == (
        "this node runs (every node the same, with its own --node-rank; --out shared):"
    )
    commands = [shlex.split(line) for line in lines[1:] if line.startswith("  torchrun ")]
    assert len(commands) == 1
    for argv in commands:
        assert argv[0] == "torchrun"
        assert not any(a.startswith("--node-rank") or a.startswith("--node_rank") for a in argv)
        parsed = get_args_parser().parse_args(argv[1:])  # torchrun accepts it as printed
        assert (parsed.nnodes, parsed.nproc_per_node, parsed.node_rank) == ("2", "2", 0)
        assert (parsed.rdzv_backend, parsed.rdzv_endpoint) == ("c10d", "node0.example:29500")
        assert parsed.rdzv_id == "advisor"  # one job: the same id on every node
        assert parsed.module and parsed.training_script == "advisor"
        # What each rank runs: advisor train with the job's config, into the shared --out.
        command, *rest = parsed.training_script_args
        params = train.make_context("train", rest).params
        assert command == "train"
        assert Path(params["out"]) == out and params["steps"] == 7
        plan = json.loads(Path(params["plan"]).read_text())["config"]
        assert (plan["parallelism"], plan["world_size"], plan["micro_batch_size"]) == (
            "fsdp",
            4,
            2,
        )
        assert argv[argv.index("advisor") :] == commands[0][commands[0].index("advisor") :]
    [(spec, args)] = launched  # this node only, with its own rank
    assert spec.node_rank == 1 and spec.nnodes == 2
    assert args == commands[0][commands[0].index("advisor") + 1 :]
    assert "--node-rank" not in " ".join(spec.torchrun_args())  # what it launches, too


def test_a_multi_node_job_needs_the_rendezvous(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        [
            "train",
            "--parallelism",
            "ddp",
            "--world-size",
            "4",
            "--nnodes",
            "2",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 2
    assert result.stderr == (
        "error: a multi-node job needs --rdzv-endpoint HOST:PORT (node 0's address, reachable "
        "from every node)\n"
    )
