"""``fsdp_reshard_after_forward`` in the cost model and the search, on hand-made profiles.

Kept gathered (False), a micro-batch's backward all-gathers nothing: the predicted
communication drops by one all-gather of every block and nothing else; its memory comes from
its own traced per-rank fit (resharded to other world sizes), or analytically with every block
gathered; the search turns it for FSDP layouts only, and only when the profile traced it.
"""

from __future__ import annotations

import dataclasses

import pytest

from profilers.profile_record import Profile
from strategies.cost import COMPUTE_BYTES_PER_PARAM, CostModel, cost_model_from_profile, fsdp_units
from strategies.space import NO_BLOCKS_TO_KEEP_GATHERED, Candidate, SearchRequest, build_space
from strategies.study import candidate_from_params, trial_params
from tests.strategies.profiles import MB, facts, hand_profile, line, memory_model


def cand(
    *, kept: bool = False, world: int = 2, precision: str = "fp32", micro: int = 4
) -> Candidate:
    return Candidate(
        precision=precision,
        activation_checkpointing="none",
        parallelism="fsdp",
        world_size=world,
        micro_batch_size=micro,
        grad_accum_steps=1,
        fsdp_reshard_after_forward=not kept,
    )


def with_ranks(profile: Profile, *, kept: bool) -> Profile:
    """The hand profile plus a traced fsdp×2 rank fit (and, when ``kept``, a kept-gathered one
    20 MB higher)."""
    plain = dataclasses.replace(
        memory_model("fp32", "none"),
        parallelism="fsdp",
        world_size=2,
        forward_backward=line(5 * MB, 1 * MB),
    )
    ranks = [plain]
    if kept:
        ranks.append(
            dataclasses.replace(
                plain, fsdp_reshard_after_forward=False, forward_backward=line(25 * MB, 1 * MB)
            )
        )
    fits = dataclasses.replace(profile.fits, memory=(*profile.fits.memory, *ranks))
    return dataclasses.replace(profile, fits=fits)


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_kept_gathered_drops_one_all_gather_of_the_blocks_and_nothing_else(
    kind: str, precision: str
) -> None:
    model = cost_model_from_profile(hand_profile(kind=kind), 0.9)
    resharded, kept = (
        model.predict(cand(kept=k, precision=precision)).breakdown.to_dict()["time"]
        for k in (False, True)
    )
    _root, block = fsdp_units(facts())
    layers = model.facts.num_layers
    one_gather = layers * model.comm.collective_s(
        "all_gather", 2, block * COMPUTE_BYTES_PER_PARAM[precision]
    )
    assert one_gather > 0
    assert resharded["communication_s"] - kept["communication_s"] == pytest.approx(one_gather)
    assert (
        resharded["communication"]["all_gather_bytes"] - kept["communication"]["all_gather_bytes"]
        == layers * block * COMPUTE_BYTES_PER_PARAM[precision]
    )
    same = ("reduce_scatter_bytes", "exposed_forward_s")
    assert {k: kept["communication"][k] for k in same} == {
        k: resharded["communication"][k] for k in same
    }
    for key in ("forward_backward_s", "optimizer_s", "input_s", "micro_batches"):
        assert kept[key] == resharded[key], key
    assert kept["exposed_communication_s"] < resharded["exposed_communication_s"]
    assert "forward only" in kept["communication"]["collectives"]


def test_without_a_kept_trace_memory_holds_every_block_gathered(model: CostModel) -> None:
    resharded, kept = (
        model.predict(cand(kept=k, world=4)).breakdown.to_dict()["memory"] for k in (False, True)
    )
    _root, block = fsdp_units(facts())
    extra = (model.facts.num_layers - 2) * block * 4  # fp32: every block instead of two
    assert kept["fsdp"]["gathered_units_bytes"] - resharded["fsdp"]["gathered_units_bytes"] == extra
    assert kept["traced_bytes"] - resharded["traced_bytes"] == extra
    # The sharded state is the same whether the blocks are kept or not.
    assert kept["fsdp"]["sharded_state_bytes"] == resharded["fsdp"]["sharded_state_bytes"]


def test_a_kept_trace_is_used_at_its_world_size_and_resharded_to_others() -> None:
    profile = with_ranks(hand_profile(), kept=True)
    model = cost_model_from_profile(profile, 0.9)
    kept_fit = next(m for m in profile.fits.memory if not m.fsdp_reshard_after_forward)
    own = model.predict(cand(kept=True)).breakdown.to_dict()["memory"]
    assert own["source"] == "traced fsdp×2 per-rank fit (blocks kept gathered)"
    assert own["traced_bytes"] == kept_fit.predict(4, 1)
    plain = model.predict(cand()).breakdown.to_dict()["memory"]
    assert plain["source"] == "traced fsdp×2 per-rank fit"  # the resharded fit, not the kept one
    wider = model.predict(cand(kept=True, world=4)).breakdown.to_dict()["memory"]
    assert wider["source"] == (
        "traced fsdp×2 per-rank fit (blocks kept gathered), its sharded state resharded to 4 ranks"
    )
    assert wider["traced_bytes"] == kept_fit.resharded(4).predict(4, 1)


def test_the_search_turns_it_for_fsdp_only_and_only_when_traced() -> None:
    request = SearchRequest(global_batch_size=8, world_size=2)
    without = build_space(with_ranks(hand_profile(), kept=False), request)
    assert without.fsdp_reshard_after_forward == (True,)
    assert any("fsdp_reshard_after_forward false" in e for e in without.excluded)
    assert all(c.fsdp_reshard_after_forward for c in without.candidates())

    space = build_space(with_ranks(hand_profile(), kept=True), request)
    assert space.fsdp_reshard_after_forward == (True, False)
    candidates = space.candidates()
    kept = [c for c in candidates if not c.fsdp_reshard_after_forward]
    assert kept and {c.parallelism for c in kept} == {"fsdp"}
    fsdp = [c for c in candidates if c.parallelism == "fsdp"]
    assert len(kept) * 2 == len(fsdp) and len(candidates) == space.size
    assert all(space.contains(c) for c in candidates)
    assert not space.contains(dataclasses.replace(kept[0], parallelism="ddp"))
    assert not without.contains(kept[0])
    # The Optuna parameters round-trip; DDP trials carry no such parameter.
    assert candidate_from_params(trial_params(kept[0]), space) == kept[0]
    ddp = next(c for c in candidates if c.parallelism == "ddp")
    assert "fsdp_reshard_after_forward" not in trial_params(ddp)


def test_a_model_without_repeated_blocks_is_never_searched_kept_gathered() -> None:
    # Its one FSDP unit, the root, stays gathered from forward to backward either way: a kept
    # trace of it equals the resharded one (Zamba2's profile listed both, the same speed).
    profile = with_ranks(hand_profile(), kept=True)
    profile = dataclasses.replace(
        profile, model=dataclasses.replace(profile.model, repeated_blocks=False)
    )
    space = build_space(profile, SearchRequest(global_batch_size=8, world_size=2))
    assert space.fsdp_reshard_after_forward == (True,)
    assert f"fsdp_reshard_after_forward false: {NO_BLOCKS_TO_KEEP_GATHERED}" in space.excluded
    assert all(c.fsdp_reshard_after_forward for c in space.candidates())


def test_candidate_key_labels_and_config_name_it_only_when_kept() -> None:
    plain, kept = cand(), cand(kept=True)
    assert plain.key + "/kg" == kept.key
    assert "kept gathered" in kept.label() and "kept" not in plain.label()
    assert "kept" in kept.short_label()
    assert Candidate.from_dict({**plain.to_dict(), "fsdp_reshard_after_forward": False}) == kept
    d = plain.to_dict()
    del d["fsdp_reshard_after_forward"]  # a trial or plan written before the knob
    assert Candidate.from_dict(d) == plain
    from strategies.config import TrainConfig

    config = kept.apply(TrainConfig(global_batch_size=8, micro_batch_size=8))
    assert config.fsdp_reshard_after_forward is False
    assert Candidate.from_config(config) == kept


def test_what_if_roofline_copies_each_block_out_of_one_gather_less() -> None:
    from strategies import roofline

    shape = roofline.BlockShape.from_facts(dataclasses.replace(facts(), vocab_size=32000))
    assert shape is not None
    kw: dict = dict(tokens=1024, seq_len=128, precision="bf16", checkpointing="none")
    twice, once = (
        {
            op.name: op
            for op in roofline.step_ops(shape, casts_weights=False, sharded=True, gathers=g, **kw)
        }
        for g in (roofline.FSDP_GATHERS, 1)
    )
    name = "fsdp.gather_and_reduce_copies"
    per_block = shape.num_params / shape.num_layers
    assert twice[name].bytes - once[name].bytes == pytest.approx(per_block * 2 * 2)  # r+w, bf16
    assert {k: v for k, v in twice.items() if k != name} == {
        k: v for k, v in once.items() if k != name
    }


def test_an_untraced_blocks_k_at_another_world_is_the_line_between_resharded_anchors() -> None:
    """blocks:K with no rank trace of its own, at a world size other than the traced one: the
    traced none and full ranks are each resharded window by window, then the line in K runs
    between them. Derived at the traced world first, the line had no windows and resharded by
    the bound that keeps the traced world's sharded gradients: above none itself."""
    from tests.strategies.profiles import ADAM_BYTES, GRAD_BYTES, PARAM_BYTES

    sharded = (PARAM_BYTES + GRAD_BYTES + ADAM_BYTES) // 2  # a world-2 rank's shards

    def rank(setting: str, rest: dict[int, int]) -> object:
        model = dataclasses.replace(
            memory_model("fp32", setting),
            parallelism="fsdp",
            world_size=2,
            forward_backward=line(rest[1] + sharded, (rest[4] - rest[1]) / 3),
            parameter_bytes=PARAM_BYTES // 2,
            gradient_bytes=GRAD_BYTES // 2,
            optimizer_state_bytes=ADAM_BYTES // 2,
            reshard_points=tuple((b, ((r, sharded),)) for b, r in sorted(rest.items())),
        )
        return model

    none = rank("none", {1: 10 * MB, 4: 40 * MB})
    full = rank("full", {1: 5 * MB, 4: 8 * MB})
    base = hand_profile()
    profile = dataclasses.replace(
        base, fits=dataclasses.replace(base.fits, memory=(*base.fits.memory, none, full))
    )
    model = cost_model_from_profile(profile, 0.9)

    def traced(setting: str, world: int) -> float:
        c = dataclasses.replace(cand(world=world, micro=4), activation_checkpointing=setting)
        p = model.predict(c)
        assert p.breakdown.memory is not None
        return p.breakdown.memory.traced_bytes

    assert model.facts.num_layers == 4
    at8 = {s: traced(s, 8) for s in ("none", "blocks:2", "full")}
    assert at8["none"] == pytest.approx(40 * MB + sharded / 4, rel=1e-6)
    assert at8["full"] == pytest.approx(8 * MB + sharded / 4, rel=1e-6)
    assert at8["blocks:2"] == pytest.approx((at8["none"] + at8["full"]) / 2, rel=1e-6)
    # at the traced world the derived setting is priced there, as before
    at2 = {s: traced(s, 2) for s in ("none", "blocks:2", "full")}
    assert at2["full"] < at2["blocks:2"] < at2["none"]
