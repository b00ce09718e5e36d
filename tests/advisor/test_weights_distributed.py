"""Initial weights under DDP and FSDP (torchrun, gloo, world size 2 on CPU), and a model without
repeated blocks under FSDP (the root is the only unit).

Every rank loads the weights before wrapping; with FSDP a rank that did not would keep its own
random shard, so the first step's loss proves that both ranks started from the file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.advisor.test_weights import (
    BATCH,
    SEQ_LEN,
    first_batch,
    first_step_loss,
    loss_of,
    perturbed_gpt2,
)

transformers = pytest.importorskip("transformers")
pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),  # tests/conftest.py
    pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="world size 2 needs two cores"),
    pytest.mark.slow,  # 20-40 s each on two shared cores: a torchrun job per test
]

DATA = Path(__file__).resolve().parents[1] / "data"
COMMON = ["--data", "synthetic", "--seq-len", str(SEQ_LEN), "--global-batch-size", str(BATCH)]
COMMON += ["--eval-batches", "1", "--eval-every", "0", "--quiet"]


def advisor_train(*args: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "advisor", "train", *COMMON, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def train_here(out: Path, model: str, micro: int, steps: int, init_from: str | None = None) -> None:
    """One process's run of COMMON's settings in this process (``advisor.train``'s trainer, as
    the command runs it): the references need no launch of their own (~7-15 s each)."""
    from advisor.trainer.loop import RunOptions, train
    from strategies.config import TrainConfig

    config = TrainConfig(
        model=model,
        data="synthetic",
        seq_len=SEQ_LEN,
        global_batch_size=BATCH,
        micro_batch_size=micro,
        init_from=init_from,
    )
    train(config, RunOptions(out=out, steps=steps, eval_batches=1, eval_every=0, progress=False))


def losses(out: Path) -> list[float]:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in lines if r["kind"] == "train"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("hf") / "tiny-gpt2"
    perturbed_gpt2().save_pretrained(directory)
    return directory


@pytest.mark.parametrize(("parallelism", "micro", "accum"), [("ddp", 2, 1), ("fsdp", 1, 2)])
def test_every_rank_starts_from_the_weights(
    hf_dir: Path, tmp_path: Path, parallelism: str, micro: int, accum: int
) -> None:
    out = tmp_path / parallelism
    advisor_train(
        *("--model", f"hf:{hf_dir}", "--parallelism", parallelism, "--world-size", "2"),
        *("--micro-batch-size", str(micro), "--grad-accum-steps", str(accum)),
        *("--steps", "2", "--out", str(out)),
    )
    saved = transformers.GPT2LMHeadModel.from_pretrained(hf_dir, local_files_only=True)
    expected = loss_of(saved, first_batch(saved.config.vocab_size))
    assert first_step_loss(out) == pytest.approx(expected, abs=1e-5)
    if parallelism != "fsdp":
        return
    # The FSDP checkpoint (torch.distributed.checkpoint shards) starts a single-device run.
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    checkpoint = out / "checkpoints" / "step_00000002"
    dcp_to_torch_save(checkpoint, tmp_path / "converted.pt")  # torch's own reader, for reference
    trained = torch.load(tmp_path / "converted.pt", weights_only=True)["model"]
    saved.load_state_dict(trained, strict=False)
    expected = loss_of(saved, first_batch(saved.config.vocab_size))
    single = tmp_path / "single"
    train_here(single, f"hf:{hf_dir}", micro=4, steps=1, init_from=str(out))
    assert first_step_loss(single) == pytest.approx(expected, abs=1e-5)


def test_fsdp_trains_a_sequential_model_like_one_process(tmp_path: Path) -> None:
    factory = f"{DATA / 'sequential_model.py'}:factory"
    model = ["--model", factory, "--steps", "3"]
    train_here(tmp_path / "single", factory, micro=4, steps=3)
    advisor_train(
        *model,
        *("--parallelism", "fsdp", "--world-size", "2", "--micro-batch-size", "2"),
        *("--out", str(tmp_path / "fsdp")),
    )
    assert losses(tmp_path / "fsdp") == pytest.approx(losses(tmp_path / "single"), abs=1e-4)
