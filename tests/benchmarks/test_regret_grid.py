"""benchmarks/regret.py's grid: the knobs of issue 14 (selective checkpointing, FSDP kept
gathered, chunked loss) as grid dimensions, keys read back, and sessions written before them."""

from __future__ import annotations

import pytest

from benchmarks import regret
from strategies.space import Candidate


def settings(*args: str) -> regret.Settings:
    return regret.settings_from(regret.parse_args(["--models", "bert-tiny", "hf-gpt2", *args]))


def test_blocks_mid_is_half_of_each_models_blocks_and_the_knobs_multiply_the_grid() -> None:
    chosen = settings(
        *("--precisions", "fp32", "--global-batch-sizes", "8"),
        *("--checkpointing", "none", "full", "ops", "blocks:mid", "--fsdp-reshard", "both"),
    )
    bert, gpt2 = regret.build_cases(chosen)
    # bert-tiny has 2 blocks, the widened hf-gpt2 4: the middle K a profile measures.
    assert {c.activation_checkpointing for c in bert.candidates} == {
        "none",
        "full",
        "ops",
        "blocks:1",
    }
    assert "blocks:2" in {c.activation_checkpointing for c in gpt2.candidates}
    # gbs 8, world <= 2: 4 single + 3 ddp + 3 fsdp splits; FSDP twice (resharded, kept).
    assert len(bert.candidates) == 4 * (4 + 3 + 3 * 2)
    kept = [c for c in bert.candidates if not c.fsdp_reshard_after_forward]
    assert kept and all(c.parallelism == "fsdp" for c in kept)
    assert len(set(bert.keys)) == len(bert.keys)
    assert "fsdp resharded+kept gathered" in bert.group and "blocks:mid" in bert.group


def test_a_grid_without_the_new_knobs_keeps_its_old_group() -> None:
    # Sessions are compared by group: the default grid's must read as before the knobs.
    (case, _) = regret.build_cases(settings("--precisions", "fp32", "--global-batch-sizes", "8"))
    assert case.group == (
        "bert-tiny[] seq 128, world size 2, fp32, checkpointing none+full, 2+3 steps a visit"
    )
    assert all(c.fsdp_reshard_after_forward and c.loss_chunks == 1 for c in case.candidates)


@pytest.mark.parametrize(
    "candidate",
    [
        Candidate(
            precision="fp32",
            activation_checkpointing="blocks:2",
            parallelism="fsdp",
            world_size=2,
            micro_batch_size=2,
            grad_accum_steps=2,
            fsdp_reshard_after_forward=False,
            loss_chunks=4,
        ),
        Candidate(
            precision="bf16",
            activation_checkpointing="ops",
            parallelism="single",
            world_size=1,
            micro_batch_size=8,
            grad_accum_steps=1,
            compile=True,
        ),
    ],
    ids=["fsdp-kept-chunked", "compiled"],
)
def test_an_advised_key_outside_the_grid_reads_back_as_its_candidate(candidate: Candidate) -> None:
    assert regret._candidate_from_key(candidate.key, Candidate) == candidate


def test_an_unknown_key_part_is_refused_not_dropped() -> None:
    with pytest.raises(ValueError, match="unknown part"):
        regret._candidate_from_key("fp32/none/single1/mb8xga1/nw0/zz", Candidate)


def test_a_session_written_before_the_knobs_resumes_with_their_defaults() -> None:
    old = {k: v for k, v in regret.Settings().to_dict().items()}
    del old["fsdp_reshard"], old["loss_chunks"]
    restored = regret.Settings.from_dict(old)
    assert restored.fsdp_reshard == (True,) and restored.loss_chunks == (1,)
    assert restored == regret.Settings()


def test_bad_loss_chunks_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        settings("--loss-chunks", "0")
    assert exit_info.value.code == 2
    assert "--loss-chunks must be >= 1" in capsys.readouterr().err


def test_a_grid_with_ops_half_asks_the_profile_for_it_beside_the_defaults() -> None:
    # ops-half is measured only when asked: the advisor must be able to advise what the grid
    # holds, and still search the product's default settings.
    chosen = settings(
        *("--precisions", "fp32", "--global-batch-sizes", "8"),
        *("--checkpointing", "none", "ops-half", "--loss-chunks", "1", "4"),
    )
    bert, gpt2 = regret.build_cases(chosen)
    assert {c.activation_checkpointing for c in bert.candidates} == {"none", "ops-half"}
    assert {c.loss_chunks for c in bert.candidates} == {1, 4}
    assert regret.profiled_checkpointing(chosen, bert.model) == (
        "none",
        "full",
        "ops",
        "blocks:1",
        "ops-half",
    )
    assert regret.profiled_checkpointing(chosen, gpt2.model)[-2:] == ("blocks:2", "ops-half")
    # Without ops-half in the grid the profile keeps its own defaults (no flag at all).
    plain = settings("--precisions", "fp32", "--global-batch-sizes", "8")
    assert regret.profiled_checkpointing(plain, bert.model) == ()


def test_the_large_vocabulary_model_is_held_out_but_not_a_default() -> None:
    entry = regret.model_entry("hf-gpt2-32k")
    assert entry.role == "held-out" and entry.args["vocab_size"] == 32000
    assert "hf-gpt2-32k" not in regret.HELD_OUT
    assert all(regret.MODELS[name].role == "held-out" for name in regret.HELD_OUT)


def test_the_advisor_searches_the_grids_knobs_only() -> None:
    # An advised config outside the grid has no regret (three sessions before --only advised
    # blocks:K the grid did not hold): the restriction makes every candidate a grid config.
    from strategies.restrict import only_args, parse_only
    from strategies.space import SearchRequest, build_space
    from tests.strategies.test_loss_chunks import CHUNKS, chunked_profile

    chosen = settings(
        *("--precisions", "fp32", "--global-batch-sizes", "8"),
        *("--checkpointing", "none", "full", "--loss-chunks", "1", str(CHUNKS)),
    )
    bert, _ = regret.build_cases(chosen)
    only = regret.grid_only(chosen, bert.model)
    assert parse_only(only_args(only)) == only  # as the recommend command line carries it
    profile = chunked_profile()
    free = build_space(profile, SearchRequest(global_batch_size=8, world_size=2))
    assert {c.key for c in free.candidates()} - set(bert.keys)  # blocks:K, bf16 ...
    bound = build_space(profile, SearchRequest(global_batch_size=8, world_size=2, only=only))
    keys = {c.key for c in bound.candidates()}
    assert keys <= set(bert.keys)
    assert {c.loss_chunks for c in bound.candidates()} == {1, CHUNKS}
    assert {c.activation_checkpointing for c in bound.candidates()} == {"none", "full"}
