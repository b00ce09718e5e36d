"""Candidate labels on the page: two configs that differ are never labelled alike (audit 42,
D15: full, blocks:2, ops and ops-half checkpointing all read "ckpt")."""

from __future__ import annotations

from strategies.space import Candidate


def _candidate(checkpointing: str) -> Candidate:
    return Candidate(
        precision="bf16",
        activation_checkpointing=checkpointing,
        parallelism="single",
        world_size=1,
        micro_batch_size=8,
        grad_accum_steps=1,
    )


def test_each_checkpointing_setting_has_its_own_short_label() -> None:
    settings = ("none", "full", "blocks:1", "blocks:2", "ops", "ops-half")
    labels = [_candidate(s).short_label() for s in settings]
    assert len(set(labels)) == len(settings), labels
    assert labels[0] == "bf16 · 8×1"
    assert labels[1] == "bf16 · full ckpt · 8×1"
    assert labels[3] == "bf16 · blocks:2 ckpt · 8×1"
