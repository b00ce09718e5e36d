"""plan.json's reasons say once per kind of missing measurement which groups it concerns."""

from __future__ import annotations

from strategies.config import TrainConfig
from strategies.plan_reasons import unpredictable_lines
from strategies.search import Evaluation
from strategies.space import Candidate


def _unpredictable(precision: str, checkpointing: str, micro: int, chunks: int = 1) -> Evaluation:
    config = TrainConfig(
        model="gpt-tiny",
        seq_len=64,
        precision=precision,
        activation_checkpointing=checkpointing,
        micro_batch_size=micro,
        global_batch_size=8,
        grad_accum_steps=8 // micro,
        loss_chunks=chunks,
    )
    group = f"for {precision} with {checkpointing} checkpointing"
    reason = (
        f"the profile has no memory fit {group}: re-run 'advisor profile' with a larger "
        f"--budget-s, or with --precision {precision} to give that precision the whole budget"
        if chunks == 1
        else f"the profile has no memory fit {group} and the loss in {chunks} chunks: use "
        "--loss-chunks 1"
    )
    return Evaluation(candidate=Candidate.from_config(config), prediction=None, reason=reason)


def test_one_line_per_kind_naming_every_group_most_candidates_first() -> None:
    evaluations = [
        _unpredictable(p, c, micro)
        for p in ("bf16", "fp16")
        for c in ("none", "full", "blocks:2")
        for micro in (1, 2, 4, 8)
    ]
    evaluations += [_unpredictable("bf16", "none", micro, chunks=4) for micro in (1, 2)]
    evaluations.append(
        Evaluation(
            candidate=evaluations[0].candidate, prediction=None, reason="something else entirely"
        )
    )
    lines = unpredictable_lines(evaluations)
    assert lines == [
        "24 candidates could not be predicted: the profile has no memory fit for bf16 with none, "
        "full or blocks:2 checkpointing, or fp16 with none, full or blocks:2 checkpointing: "
        "re-run 'advisor profile' with a larger --budget-s, or with --precision bf16 or "
        "--precision fp16 to give that precision the whole budget",
        "2 candidates could not be predicted: the profile has no memory fit for bf16 with none "
        "checkpointing and the loss in 4 chunks: use --loss-chunks 1",
        "1 candidates could not be predicted: something else entirely",
    ]
