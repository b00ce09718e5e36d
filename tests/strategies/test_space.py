"""The search space: the global batch is held fixed over the whole space, exhaustively."""

from __future__ import annotations

import itertools

import pytest

from profilers.profile_record import InputSample
from strategies.config import TrainConfig
from strategies.errors import StrategyError
from strategies.space import Candidate, SearchRequest, build_space, divisors
from tests.strategies.profiles import SEQ_LEN, hand_profile


@pytest.mark.parametrize("max_world", [1, 2, 3, 4])
def test_every_candidate_keeps_the_global_batch_and_every_split_is_a_candidate(
    max_world: int,
) -> None:
    """Exhaustive over global batches 1..48: micro × accum × world == global for every
    candidate, each is a valid TrainConfig, and no split of the batch is missing."""
    profile = hand_profile()
    base = TrainConfig(seq_len=SEQ_LEN)
    for global_batch in range(1, 49):
        space = build_space(
            profile, SearchRequest(global_batch_size=global_batch, world_size=max_world)
        )
        candidates = space.candidates()
        assert len(candidates) == space.size
        assert len({c.key for c in candidates}) == len(candidates)
        splits = set()
        for c in candidates:
            assert c.micro_batch_size * c.grad_accum_steps * c.world_size == global_batch
            config = c.apply(base)
            assert config.global_batch_size == global_batch
            assert Candidate.from_config(config) == c
            splits.add((c.parallelism, c.world_size, c.micro_batch_size, c.grad_accum_steps))
        expected = set()
        for world, micro in itertools.product(range(1, max_world + 1), range(1, global_batch + 1)):
            accum = global_batch // (world * micro)
            if world * micro * accum == global_batch:
                for parallelism in ("single",) if world == 1 else ("ddp", "fsdp"):
                    expected.add((parallelism, world, micro, accum))
        assert splits == expected


def test_precisions_are_those_the_device_runs() -> None:
    space = build_space(hand_profile(precisions=("fp32",)), SearchRequest(global_batch_size=8))
    assert space.precisions == ("fp32",)
    assert any(e.startswith("bf16:") for e in space.excluded)


def test_a_profile_limited_to_some_precisions_plans_only_those() -> None:
    """``advisor profile --precision bf16`` profiles and plans bf16: the others the device
    runs are left out with the flag named, not listed as candidates the profile cannot price."""
    import dataclasses

    from profilers.hardware import lookup_target

    profile = dataclasses.replace(hand_profile(), precisions=("bf16",))
    space = build_space(profile, SearchRequest(global_batch_size=8))
    assert space.precisions == ("bf16",)
    assert "fp32: not profiled (the profile was limited to --precision bf16)" in space.excluded
    whatif = build_space(
        profile,
        SearchRequest(global_batch_size=8, world_size=8, target="h100-80gb"),
        target=lookup_target("h100-80gb"),
    )
    assert whatif.precisions == ("bf16",)
    # an old profile (no record of the flag) keeps every precision the device runs
    old = build_space(hand_profile(), SearchRequest(global_batch_size=8))
    assert old.precisions == ("fp32", "bf16")
    assert dataclasses.replace(profile, precisions=None).to_dict()["precisions"] is None
    assert type(profile).from_dict(profile.to_dict()).precisions == ("bf16",)


def test_a_whatif_prices_ops_from_its_traces_alone() -> None:
    """A profile of a model that fits no device here times nothing; the what-if times ops by
    the roofline, so a traced ops is searched there, and only there."""
    import dataclasses

    from profilers.hardware import lookup_target
    from tests.strategies.profiles import memory_model

    base = hand_profile(timed_checkpointing=("none",))
    ops = [
        dataclasses.replace(memory_model(p, "full"), activation_checkpointing="ops")
        for p in ("fp32", "bf16")
    ]
    fits = dataclasses.replace(base.fits, memory=(*base.fits.memory, *ops))
    profile = dataclasses.replace(base, fits=fits)
    here = build_space(profile, SearchRequest(global_batch_size=8))
    assert "ops" not in here.checkpointing
    whatif = build_space(
        profile,
        SearchRequest(global_batch_size=8, world_size=8, target="h100-80gb"),
        target=lookup_target("h100-80gb"),
    )
    assert "ops" in whatif.checkpointing


def test_cpu_hosts_search_one_rank_unless_asked_and_no_loader_workers() -> None:
    inputs = [
        InputSample(num_workers=w, micro_batch_size=8, seq_len=SEQ_LEN, batches_per_s=9.0)
        for w in (0, 2)
    ]
    cpu = build_space(hand_profile(inputs=inputs), SearchRequest(global_batch_size=8))
    assert cpu.layouts == (("single", 1),)
    assert cpu.num_workers == (0,)
    gpu = build_space(hand_profile(kind="cuda", inputs=inputs), SearchRequest(global_batch_size=8))
    assert gpu.num_workers == (0, 2)
    assert ("fsdp", 8) in gpu.layouts  # the profile saw 8 GPUs
    assert ("ddp", 3) not in gpu.layouts  # 3 does not divide 8


def test_a_whatif_world_size_must_divide_the_global_batch() -> None:
    from profilers.hardware import lookup_target

    request = SearchRequest(global_batch_size=4, world_size=8, target="h100-80gb")
    with pytest.raises(StrategyError, match="cannot be split over 8 ranks"):
        build_space(hand_profile(), request, target=lookup_target("h100-80gb"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"global_batch_size": 0}, "global batch size must be at least 1"),
        ({"global_batch_size": 8, "memory_budget": 0.0}, "memory budget must be a fraction"),
        ({"global_batch_size": 8, "memory_budget": 1.5}, "memory budget must be a fraction"),
        ({"global_batch_size": 8, "nodes": 2}, "need --target"),
        (
            {"global_batch_size": 8, "target": "h100-80gb", "world_size": 3, "nodes": 2},
            "does not split evenly over 2 nodes",
        ),
        (
            {"global_batch_size": 16, "target": "h100-80gb", "nodes": 2},
            r"--nodes 2 needs --world-size, the GPUs in all \(e.g. --world-size 16 for 8 a node\)",
        ),
        (
            {"global_batch_size": 8, "config_overrides": {"precision": "bf16"}},
            "chosen by the search",
        ),
    ],
)
def test_bad_requests_name_the_fix(kwargs: dict, message: str) -> None:
    with pytest.raises(StrategyError, match=message):
        SearchRequest(**kwargs)


@pytest.mark.parametrize("n", [0, 1, 2, 12, 36, 49, 97, 360, 1024, 5040])
def test_divisors_are_the_brute_force_ones_in_the_same_order(n: int) -> None:
    """The sqrt(n) pairing returns exactly what trial division by every 1..n returned."""
    assert divisors(n) == tuple(d for d in range(1, n + 1) if n % d == 0)


def test_a_prime_global_batch_near_a_billion_splits_only_into_one_or_all() -> None:
    """A prime global batch of ~1e9 used to hang the search looping over every integer."""
    prime = 1_000_000_007
    space = build_space(hand_profile(), SearchRequest(global_batch_size=prime))
    assert space.micro_batch_sizes(1) == (1, prime)
    assert {c.micro_batch_size for c in space.candidates()} == {1, prime}
