"""Selective checkpointing under DDP and FSDP2 at world size 2 (gloo, torchrun): same losses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

BASE = [
    "train",
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
    "--world-size",
    "2",
    "--micro-batch-size",
    "1",
    "--grad-accum-steps",
    "2",
    "--steps",
    "6",
]


def train_losses(out: Path, *args: str) -> list[float]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "advisor", *BASE, *args, "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in lines if r["kind"] == "train"]


@pytest.fixture(scope="module")
def plain_losses(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[float]]:
    """The run without checkpointing, once per parallelism: both FSDP cases compare with the
    same one (each ran its own, a torchrun launch of ~15 s on 2 cores)."""
    runs: dict[str, list[float]] = {}

    def plain(parallelism: str) -> list[float]:
        if parallelism not in runs:
            out = tmp_path_factory.mktemp(f"plain-{parallelism}") / "run"
            runs[parallelism] = train_losses(out, "--parallelism", parallelism)
        return runs[parallelism]

    return plain


@pytest.mark.slow
@pytest.mark.parametrize(
    ("parallelism", "setting"), [("ddp", "blocks:1"), ("fsdp", "ops"), ("fsdp", "ops-half")]
)
def test_selective_checkpointing_keeps_the_losses_at_world_size_2(
    tmp_path: Path, parallelism: str, setting: str, plain_losses: Callable[[str], list[float]]
) -> None:
    plain = plain_losses(parallelism)
    got = train_losses(
        tmp_path / "sel", "--parallelism", parallelism, "--activation-checkpointing", setting
    )
    assert len(got) == len(plain) == 6
    assert got == pytest.approx(plain, rel=1e-6, abs=0)
