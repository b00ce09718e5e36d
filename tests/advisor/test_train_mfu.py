"""The MFU a training run logs counts the model FLOPs published utilisations do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from advisor.trainer import loop
from advisor.trainer.loop import RunOptions, train
from profilers.flops import formula_flops_per_token
from profilers.metrics_record import TrainRecord, read_metrics
from profilers.rundir import TrainDir
from strategies.config import TrainConfig

PEAK = 1e12  # a datasheet peak for the CPU, so the trainer computes an MFU at all


def _tiny(model: str, model_args: dict[str, Any]) -> TrainConfig:
    """Two steps of two sequences of 32 tokens."""
    return TrainConfig(
        model=model,
        model_args=model_args,
        seq_len=32,
        global_batch_size=2,
        micro_batch_size=2,
        grad_accum_steps=1,
        warmup_steps=1,
    )


def _logged_mfu(
    config: TrainConfig, out: Path, monkeypatch: pytest.MonkeyPatch
) -> list[TrainRecord]:
    monkeypatch.setattr(loop.Trainer, "_peak_flops_per_device", lambda self: PEAK)
    train(config, RunOptions(out=out, steps=2, progress=False, eval_every=0))
    records = read_metrics(TrainDir(out).metrics).train
    assert len(records) == 2 and all(r.mfu is not None for r in records)
    return records


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no grouped GEMM")
def test_a_mixture_of_experts_counts_the_experts_each_token_is_routed_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("transformers")
    from advisor.workload import AdvisorWorkload
    from tests.advisor.test_models import TINY_MIXTRAL

    records = _logged_mfu(_tiny("hf:mixtral", TINY_MIXTRAL), tmp_path, monkeypatch)
    facts = AdvisorWorkload("hf:mixtral", dict(TINY_MIXTRAL)).facts()
    every = formula_flops_per_token(facts, 32)
    # two of four experts per token: per layer, two experts' gate-up (64 x 192) and down
    # (96 x 64) weights sit out of the model FLOPs
    unrouted = 2 * (4 - 2) * (64 * 192 + 96 * 64)
    routed = every - 6 * unrouted
    for r in records:
        assert r.mfu == pytest.approx(r.tokens_per_s * routed / PEAK)


def test_a_dense_model_counts_every_parameter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from advisor.workload import AdvisorWorkload

    records = _logged_mfu(_tiny("gpt-tiny", {"n_layer": 1, "n_embd": 32}), tmp_path, monkeypatch)
    facts = AdvisorWorkload("gpt-tiny", {"n_layer": 1, "n_embd": 32}).facts()
    for r in records:
        assert r.mfu == pytest.approx(r.tokens_per_s * formula_flops_per_token(facts, 32) / PEAK)
