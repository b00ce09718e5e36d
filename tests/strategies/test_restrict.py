"""``--only KNOB=V1,V2``: parsing, writing back, narrowing one knob, and the restricted search
space (strategies.restrict, strategies.space.build_space)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import pytest

from profilers.profile_record import InputSample, ProbeRow, Profile
from strategies.cost import cost_model_from_profile
from strategies.errors import StrategyError
from strategies.restrict import KNOB_NAMES, narrow, normalize_only, only_args, parse_only
from strategies.search import study_name_for
from strategies.space import (
    MAX_BLOCK_SETTINGS,
    Candidate,
    SearchRequest,
    SearchSpace,
    build_space,
)
from strategies.whatif import resolve_target
from tests.strategies.profiles import SEQ_LEN, facts, hand_profile
from tests.strategies.test_compile_cost import compiled_profile
from tests.strategies.test_fsdp_reshard_cost import with_ranks
from tests.strategies.test_loss_chunks import CHUNKS, chunked_profile

# -- parse_only / normalize_only ------------------------------------------------------------------


def test_knob_names_are_the_candidate_fields_the_search_turns() -> None:
    fields = {f.name for f in dataclasses.fields(Candidate)}
    assert set(KNOB_NAMES) <= fields
    # world_size and grad_accum_steps follow from layout and micro-batch: not restricted.
    assert "world_size" not in KNOB_NAMES and "grad_accum_steps" not in KNOB_NAMES
    assert len(KNOB_NAMES) == len(set(KNOB_NAMES)) == 8


@pytest.mark.parametrize(
    "name",
    ["checkpointing", "activation_checkpointing", "activation-checkpointing", " checkpointing "],
)
def test_checkpointing_aliases_are_read_as_the_candidate_field(name: str) -> None:
    assert normalize_only({name: "none,full"}) == {"activation_checkpointing": ("none", "full")}


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("micro-batch-size", "micro_batch_size"),
        ("micro_batch_size", "micro_batch_size"),
        ("num-workers", "num_workers"),
        ("loss-chunks", "loss_chunks"),
        ("fsdp-reshard-after-forward", "fsdp_reshard_after_forward"),
    ],
)
def test_hyphens_read_as_underscores(name: str, canonical: str) -> None:
    value = "true" if canonical == "fsdp_reshard_after_forward" else "2"
    parsed = normalize_only({name: value})
    assert list(parsed) == [canonical]


def test_integer_knobs_are_typed() -> None:
    parsed = parse_only(["micro-batch-size=4, 8", "num-workers=0,2", "loss-chunks=1,16"])
    assert parsed == {
        "micro_batch_size": (4, 8),
        "num_workers": (0, 2),
        "loss_chunks": (1, 16),
    }
    assert all(type(v) is int for values in parsed.values() for v in values)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("true", True), ("True", True), ("on", True), ("1", True), ("yes", True),
        ("false", False), ("FALSE", False), ("off", False), ("0", False), ("no", False),
    ],
)  # fmt: skip
def test_boolean_knobs_read_the_usual_spellings(text: str, value: bool) -> None:
    for knob in ("compile", "fsdp_reshard_after_forward"):
        parsed = parse_only([f"{knob}={text}"])
        assert parsed == {knob: (value,)}
        assert type(parsed[knob][0]) is bool


def test_python_values_lists_and_comma_strings() -> None:
    assert normalize_only({"compile": False}) == {"compile": (False,)}
    assert normalize_only({"compile": [True, False]}) == {"compile": (True, False)}
    assert normalize_only({"micro_batch_size": 4}) == {"micro_batch_size": (4,)}
    assert normalize_only({"micro_batch_size": [8, "2"]}) == {"micro_batch_size": (8, 2)}
    assert normalize_only({"precision": ("bf16", "fp32")}) == {"precision": ("bf16", "fp32")}
    # A comma string, blanks and empty items ignored; the order given is kept.
    assert normalize_only({"checkpointing": " full, ,none,"}) == {
        "activation_checkpointing": ("full", "none")
    }
    assert normalize_only(None) == {} and normalize_only({}) == {}


def test_a_knob_given_twice_merges_without_duplicates() -> None:
    assert parse_only(["checkpointing=none", "checkpointing=full,none"]) == {
        "activation_checkpointing": ("none", "full")
    }
    # Under two names of the same knob too.
    assert normalize_only({"checkpointing": "blocks:2", "activation-checkpointing": ["none"]}) == {
        "activation_checkpointing": ("blocks:2", "none")
    }
    # Spellings of the same boolean count once.
    assert normalize_only({"compile": [True, "on", "1", "off", False]}) == {
        "compile": (True, False)
    }
    assert parse_only(["precision=bf16,bf16", "precision=bf16"]) == {"precision": ("bf16",)}


def test_several_knobs_keep_their_values() -> None:
    parsed = parse_only(
        ["precision=bf16", "compile=false", "parallelism=fsdp,ddp", "checkpointing=blocks:3"]
    )
    assert parsed == {
        "precision": ("bf16",),
        "compile": (False,),
        "parallelism": ("fsdp", "ddp"),
        "activation_checkpointing": ("blocks:3",),
    }


@pytest.mark.parametrize(
    ("only", "message"),
    [
        ({"foo": "1"}, r"--only foo: not a knob the search turns; choose from precision"),
        ({"world_size": "2"}, r"--only world_size: not a knob"),
        ({"precision": "bf17"}, r"--only precision=bf17: unknown value; choose from fp32, bf16"),
        ({"parallelism": "tp"}, r"--only parallelism=tp: unknown value"),
        ({"checkpointing": "blocks:0"}, r"--only checkpointing=blocks:0: .*'blocks:0'.*'none'"),
        ({"checkpointing": "blocks:x"}, r"--only checkpointing=blocks:x: .*whole number"),
        ({"checkpointing": "sometimes"}, r"--only checkpointing=sometimes: unknown"),
        ({"micro_batch_size": "0"}, r"--only micro_batch_size=0: must be at least 1"),
        ({"micro_batch_size": "-4"}, r"--only micro_batch_size=-4: must be at least 1"),
        ({"loss_chunks": 0}, r"--only loss_chunks=0: must be at least 1"),
        ({"num_workers": "-1"}, r"--only num_workers=-1: must be at least 0"),
        ({"micro_batch_size": "2.5"}, r"--only micro_batch_size=2.5: a whole number is needed"),
        ({"num_workers": "two"}, r"--only num_workers=two: a whole number is needed"),
        ({"micro_batch_size": True}, r"--only micro_batch_size=True: a whole number"),
        ({"compile": "maybe"}, r"--only compile=maybe: use true or false"),
        ({"precision": ""}, r"--only precision=: give at least one value, e.g. bf16"),
        ({"checkpointing": []}, r"--only checkpointing=: give at least one value"),
        ({"loss-chunks": " , "}, r"--only loss-chunks=: give at least one value"),
    ],
)
def test_bad_knobs_and_values_name_the_knob(only: dict[str, Any], message: str) -> None:
    with pytest.raises(StrategyError, match=message):
        normalize_only(only)


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["precision"], r"--only precision: write KNOB=VALUES"),
        (["=bf16"], r"--only =bf16: write KNOB=VALUES"),
        (["precision="], r"--only precision=: give at least one value after '='"),
        (["precision=  "], r"--only precision=  : give at least one value"),
        (["foo=1"], r"--only foo: not a knob"),
        # parse_only names the knob by its Candidate field (as typed by normalize_only's caller).
        (
            ["compile=false", "checkpointing=none,blocks:0"],
            r"--only (activation_)?checkpointing=blocks:0: .*'blocks:0' checkpoints no block",
        ),
        (["micro-batch-size=4,-1"], r"--only micro[-_]batch[-_]size=-1: must be at least 1"),
        (["num-workers=x"], r"--only num[-_]workers=x: a whole number is needed"),
        (["compile=maybe"], r"--only compile=maybe: use true or false"),
    ],
)
def test_parse_only_errors(items: list[str], message: str) -> None:
    with pytest.raises(StrategyError, match=message):
        parse_only(items)


@pytest.mark.parametrize(
    "only",
    [
        {"checkpointing": "none,full,blocks:2,ops,ops-half"},
        {"compile": False, "fsdp_reshard_after_forward": [True, False]},
        {"compile": True},
        {"precision": "bf16,fp32", "parallelism": "fsdp"},
        {"micro_batch_size": [2, 3], "num_workers": [0, 4], "loss_chunks": [1, 16]},
        {
            "precision": "fp16",
            "activation_checkpointing": ["full"],
            "parallelism": "single,ddp,fsdp",
            "micro_batch_size": 8,
            "num_workers": 0,
            "loss_chunks": 4,
            "fsdp_reshard_after_forward": "off",
            "compile": "on",
        },
    ],
)
def test_only_args_round_trip_through_parse_only(only: Mapping[str, Any]) -> None:
    normal = normalize_only(only)
    args = only_args(normal)
    assert len(args) == len(normal)
    assert parse_only(args) == normal


def test_only_args_writes_what_a_user_types() -> None:
    args = only_args(
        normalize_only(
            {
                "activation_checkpointing": "none,full",
                "compile": False,
                "fsdp_reshard_after_forward": [True, False],
                "micro_batch_size": [2, 3],
            }
        )
    )
    assert args == [
        "checkpointing=none,full",
        "compile=false",
        "fsdp-reshard-after-forward=true,false",
        "micro-batch-size=2,3",
    ]
    assert only_args({}) == []


# -- narrow ---------------------------------------------------------------------------------------


def test_narrow_without_the_knob_keeps_everything_and_says_nothing() -> None:
    available = ("fp32", "bf16")
    assert narrow("precision", available, {}) == (available, ())
    assert narrow("precision", available, {"compile": (False,)}) == (available, ())


def test_narrow_keeps_the_asked_values_in_the_available_order() -> None:
    available = ("none", "full", "blocks:1", "blocks:2", "blocks:3")
    only = normalize_only({"checkpointing": "blocks:2,none"})
    kept, lines = narrow("activation_checkpointing", available, only)
    assert kept == ("none", "blocks:2")
    assert lines == (
        "checkpointing full, blocks:1, blocks:3: left out by --only checkpointing=blocks:2,none",
    )


def test_narrow_asking_for_everything_says_nothing() -> None:
    kept, lines = narrow("compile", (False, True), normalize_only({"compile": "true,false"}))
    assert kept == (False, True)
    assert lines == ()


def test_narrow_names_an_asked_value_that_is_not_available_with_its_reason() -> None:
    only = normalize_only({"precision": "fp16,bf16"})
    kept, lines = narrow(
        "precision", ("fp32", "bf16"), only, reasons={"fp16": "fp16: the device cannot run it"}
    )
    assert kept == ("bf16",)
    assert lines == (
        "precision fp32: left out by --only precision=fp16,bf16",
        "precision fp16: asked for by --only precision=fp16,bf16 but fp16: the device cannot "
        "run it",
    )
    # Without a known reason: the profile did not measure it.
    _, lines = narrow("precision", ("fp32", "bf16"), only)
    assert lines[-1].startswith("precision fp16: asked for by --only precision=fp16,bf16 but ")
    assert "the profile did not measure it" in lines[-1]


def test_narrow_writes_booleans_as_typed() -> None:
    only = normalize_only({"fsdp_reshard_after_forward": "false"})
    kept, lines = narrow("fsdp_reshard_after_forward", (True, False), only)
    assert kept == (False,)
    assert lines == (
        "fsdp-reshard-after-forward true: left out by --only fsdp-reshard-after-forward=false",
    )


def test_narrow_with_nothing_available_names_the_reason_and_what_is() -> None:
    only = normalize_only({"compile": "true"})
    with pytest.raises(StrategyError) as info:
        narrow("compile", (False,), only, reasons={True: "no compiler on this host"})
    message = str(info.value)
    assert message.startswith("--only compile=true: nothing asked for can be searched")
    assert "no compiler on this host" in message
    assert message.endswith("this search can price compile false")

    only = normalize_only({"micro_batch_size": "3,5"})
    with pytest.raises(StrategyError) as info:
        narrow("micro_batch_size", (1, 2, 4, 8), only, reasons={3: "three", 5: "five"})
    message = str(info.value)
    assert "three" in message and "five" in message
    assert message.endswith("this search can price micro-batch-size 1, 2, 4, 8")


# -- build_space ----------------------------------------------------------------------------------


def satisfies(candidate: Candidate, only: Mapping[str, tuple[Any, ...]]) -> bool:
    """Whether ``candidate`` keeps to ``only`` (keeping blocks gathered is an FSDP knob only)."""
    for knob, values in only.items():
        if knob == "fsdp_reshard_after_forward" and candidate.parallelism != "fsdp":
            continue
        if getattr(candidate, knob) not in values:
            return False
    return True


def keys(space: SearchSpace) -> set[str]:
    return {c.key for c in space.candidates()}


def gpu_with_workers() -> Profile:
    inputs = [
        InputSample(num_workers=w, micro_batch_size=8, seq_len=SEQ_LEN, batches_per_s=9.0)
        for w in (0, 2, 4)
    ]
    return hand_profile(kind="cuda", inputs=inputs)


CASES: list[tuple[str, Any, dict[str, Any], dict[str, Any]]] = [
    ("checkpointing", hand_profile, {}, {"checkpointing": "none,blocks:2"}),
    ("checkpointing-full", hand_profile, {"world_size": 2}, {"checkpointing": "full"}),
    ("precision", hand_profile, {"world_size": 2}, {"precision": "bf16"}),
    ("ddp", hand_profile, {"world_size": 2}, {"parallelism": "ddp"}),
    ("fsdp-single", hand_profile, {"world_size": 2}, {"parallelism": "fsdp,single"}),
    ("micro-2-3", hand_profile, {"world_size": 2}, {"micro_batch_size": "2,3"}),
    ("micro-8", hand_profile, {"world_size": 2}, {"micro_batch_size": "8"}),
    ("loss-chunks-on", chunked_profile, {}, {"loss_chunks": CHUNKS}),
    ("loss-chunks-off", chunked_profile, {}, {"loss_chunks": 1}),
    ("workers", gpu_with_workers, {"world_size": 2}, {"num_workers": "0,4"}),
    ("compile-on", compiled_profile, {}, {"compile": True}),
    ("compile-off", compiled_profile, {}, {"compile": "false"}),
    (
        "kept-gathered",
        lambda: with_ranks(hand_profile(), kept=True),
        {"world_size": 2},
        {"fsdp_reshard_after_forward": False},
    ),
    (
        "several",
        chunked_profile,
        {"world_size": 1},
        {"precision": "fp32", "checkpointing": "none,full", "micro_batch_size": [4, 8]},
    ),
]


@pytest.mark.parametrize(
    ("make", "request_args", "only"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_restricted_space_is_exactly_the_candidates_that_keep_to_it(
    make: Any, request_args: dict[str, Any], only: dict[str, Any]
) -> None:
    profile = make()
    everything = build_space(profile, SearchRequest(global_batch_size=8, **request_args))
    request = SearchRequest(global_batch_size=8, only=only, **request_args)
    space = build_space(profile, request)
    candidates = space.candidates()
    assert candidates and len(candidates) == space.size
    assert all(satisfies(c, request.only) for c in candidates)
    expected = {c.key for c in everything.candidates() if satisfies(c, request.only)}
    assert keys(space) == expected
    # Strictly smaller: each case leaves something out, and the plan's reasons say so.
    assert len(expected) < everything.size
    assert any("left out by --only" in line for line in space.excluded)
    # contains() agrees with the enumeration, both ways.
    for c in everything.candidates():
        assert space.contains(c) == (c.key in expected), c.key
    assert all(space.contains(c) for c in candidates)


def test_the_plan_reasons_name_what_only_left_out() -> None:
    request = SearchRequest(
        global_batch_size=8,
        world_size=2,
        only={"precision": "bf16", "checkpointing": "full", "parallelism": "fsdp"},
    )
    space = build_space(hand_profile(), request)
    assert space.precisions == ("bf16",)
    assert space.checkpointing == ("full",)
    assert space.layouts == (("fsdp", 2),)
    assert "precision fp32: left out by --only precision=bf16" in space.excluded
    assert (
        "checkpointing none, blocks:1, blocks:2, blocks:3: left out by --only checkpointing=full"
        in space.excluded
    )
    assert "parallelism single, ddp: left out by --only parallelism=fsdp" in space.excluded
    # What the profile could not price stays named too.
    assert any(line.startswith("fp16:") for line in space.excluded)


def test_an_asked_value_the_profile_cannot_price_is_named_beside_the_kept_ones() -> None:
    request = SearchRequest(global_batch_size=8, only={"precision": "fp16,bf16"})
    space = build_space(hand_profile(), request)
    assert space.precisions == ("bf16",)
    asked = [line for line in space.excluded if line.startswith("precision fp16: asked for")]
    assert asked == [
        "precision fp16: asked for by --only precision=fp16,bf16 but fp16: fp16 is not run here"
    ]


def test_micro_batch_restriction_drops_a_layout_none_of_whose_splits_is_allowed() -> None:
    request = SearchRequest(global_batch_size=8, world_size=2, only={"micro_batch_size": "3,8"})
    space = build_space(hand_profile(), request)
    # Per rank: 8 on one rank (1, 2, 4, 8), 4 on two (1, 2, 4): only one rank can take 8.
    assert space.layouts == (("single", 1),)
    assert space.micro_batch_only == (8,)
    assert {(c.micro_batch_size, c.grad_accum_steps) for c in space.candidates()} == {(8, 1)}
    assert any(
        line.startswith("micro-batch-size 3: asked for by --only micro-batch-size=3,8 but ")
        and "global batch 8" in line
        for line in space.excluded
    )


@pytest.mark.parametrize(
    ("profile", "request_args", "only", "message"),
    [
        (
            hand_profile(),
            {},
            {"parallelism": "ddp"},
            r"--only parallelism=ddp: nothing asked for can be searched \(needs 2 or more ranks: "
            r"pass --world-size 2 or more\); this search can price parallelism single$",
        ),
        (
            hand_profile(),
            {},
            {"checkpointing": "blocks:4"},
            r"--only checkpointing=blocks:4: nothing asked for can be searched \(activation "
            r"checkpointing 'blocks:4' checkpoints all 4 repeated blocks: use 'full'\); this "
            r"search can price checkpointing none, full, blocks:1, blocks:2, blocks:3$",
        ),
        (
            hand_profile(),
            {},
            {"checkpointing": "blocks:9"},
            r"\(activation checkpointing 'blocks:9': the model has 4 repeated blocks, so K in "
            r"blocks:K must be 1 to 3 \(or use 'full'\)\)",
        ),
        (
            hand_profile(),
            {},
            {"compile": "true"},
            r"--only compile=true: nothing asked for can be searched \(the profile measured no "
            r"compiled step: .*\); this search can price compile false$",
        ),
        (
            hand_profile(),
            {},
            {"checkpointing": "ops"},
            r"--only checkpointing=ops: nothing asked for can be searched \(ops checkpointing: "
            r"the profile did not trace and time it",
        ),
        (
            hand_profile(precisions=("fp32",)),
            {},
            {"precision": "bf16"},
            r"--only precision=bf16: nothing asked for can be searched \(bf16: bf16 is not run "
            r"here\); this search can price precision fp32$",
        ),
        (
            hand_profile(),
            {},
            {"num_workers": "2"},
            r"--only num-workers=2: .*a CPU host runs the loader on the step's cores: 0 only",
        ),
        (
            hand_profile(),
            {},
            {"loss_chunks": "4"},
            r"--only loss-chunks=4: nothing asked for can be searched \(the profile measured no "
            r"loss in that many chunks\); this search can price loss-chunks 1$",
        ),
        (
            chunked_profile(),
            {},
            {"loss_chunks": "4"},
            r"--only loss-chunks=4: .*the profile measured no loss in that many chunks\); this "
            r"search can price loss-chunks 1, 16$",
        ),
        (
            dataclasses.replace(
                hand_profile(),
                probes=(
                    ProbeRow(
                        probe="memory",
                        name="loss_chunks",
                        status="skipped",
                        reason="the logits (vocabulary 256) are no larger than one block's "
                        "activations (width 256) ...: nothing measured",
                    ),
                ),
            ),
            {},
            {"loss_chunks": "4"},
            r"--only loss-chunks=4: nothing asked for can be searched \(the profile measured no "
            r"chunked loss: the logits \(vocabulary 256\) are no larger than one block's "
            r"activations \(width 256\) \.\.\.: nothing measured\); this search can price "
            r"loss-chunks 1$",
        ),
        (
            hand_profile(),
            {},
            {"micro_batch_size": "3"},
            r"--only micro-batch-size=3: .*global batch 8 splits into it\); this search can price "
            r"micro-batch-size 1, 2, 4, 8$",
        ),
        (
            hand_profile(),
            {"world_size": 2},
            {"fsdp_reshard_after_forward": "false"},
            r"--only fsdp-reshard-after-forward=false: .*traced no FSDP rank with the blocks kept "
            r"gathered",
        ),
    ],
    ids=[
        "ddp-one-rank",
        "blocks-all",
        "blocks-too-many",
        "compile-unmeasured",
        "ops-unmeasured",
        "precision-unsupported",
        "workers-cpu",
        "chunks-no-head",
        "chunks-unmeasured",
        "chunks-probe-said-why",
        "micro-no-split",
        "kept-untraced",
    ],
)
def test_nothing_asked_for_available_is_an_error_naming_why(
    profile: Profile, request_args: dict[str, Any], only: dict[str, Any], message: str
) -> None:
    request = SearchRequest(global_batch_size=8, only=only, **request_args)
    with pytest.raises(StrategyError, match=message):
        build_space(profile, request)


def deep_profile(num_layers: int = 40) -> Profile:
    return dataclasses.replace(hand_profile(), model=facts(num_layers=num_layers))


def test_a_deep_model_keeps_an_asked_blocks_setting_that_thinning_drops() -> None:
    profile = deep_profile(40)
    everything = build_space(profile, SearchRequest(global_batch_size=8))
    searched = {c for c in everything.checkpointing if c.startswith("blocks:")}
    assert len(searched) == MAX_BLOCK_SETTINGS  # thinned from 39
    dropped = sorted(
        (k for k in range(1, 40) if f"blocks:{k}" not in searched),
    )
    assert 3 in dropped and 20 in dropped
    space = build_space(
        profile, SearchRequest(global_batch_size=8, only={"checkpointing": "blocks:3,blocks:20"})
    )
    assert space.checkpointing == ("blocks:3", "blocks:20")
    assert {c.activation_checkpointing for c in space.candidates()} == {"blocks:3", "blocks:20"}
    # Beside a searched one, and with the unrestricted settings it keeps.
    mixed = build_space(
        profile, SearchRequest(global_batch_size=8, only={"checkpointing": "none,blocks:3,full"})
    )
    assert set(mixed.checkpointing) == {"none", "full", "blocks:3"}
    # The kept K is priced, not rejected: the cost model interpolates it.
    model = cost_model_from_profile(profile, 0.9)
    for candidate in space.candidates():
        assert model.predict(candidate).tokens_per_s > 0


def test_a_deep_model_refuses_an_asked_k_beyond_its_blocks() -> None:
    request = SearchRequest(global_batch_size=8, only={"checkpointing": "blocks:40"})
    with pytest.raises(StrategyError, match=r"checkpoints all 40 repeated blocks: use 'full'"):
        build_space(deep_profile(40), request)


# -- SearchRequest and the study name -------------------------------------------------------------


def test_an_unrestricted_request_records_no_only() -> None:
    data = SearchRequest(global_batch_size=8).to_dict()
    assert "only" not in data
    assert SearchRequest.from_dict(data) == SearchRequest(global_batch_size=8)


@pytest.mark.parametrize(
    "only",
    [
        {"checkpointing": "none,full", "loss-chunks": 1},
        {"compile": False, "fsdp_reshard_after_forward": "true,false", "precision": ["bf16"]},
        {"micro_batch_size": [8, 2], "num_workers": 0, "parallelism": "fsdp"},
    ],
)
def test_a_restricted_request_round_trips(only: dict[str, Any]) -> None:
    request = SearchRequest(global_batch_size=8, world_size=2, only=only)
    data = request.to_dict()
    assert data["only"] == {k: list(v) for k, v in normalize_only(only).items()}
    assert SearchRequest.from_dict(data) == request
    assert SearchRequest.from_dict(data).only == request.only
    again = SearchRequest.from_dict(json.loads(json.dumps(data)))
    assert again == request
    assert again.only == normalize_only(only)


def test_a_request_with_a_bad_only_is_refused() -> None:
    with pytest.raises(StrategyError, match="--only foo"):
        SearchRequest(global_batch_size=8, only={"foo": 1})
    with pytest.raises(StrategyError, match="--only precision=int8"):
        SearchRequest.from_dict({"global_batch_size": 8, "only": {"precision": ["int8"]}})


@pytest.mark.parametrize(
    ("profile", "only"),
    [
        (hand_profile(), {"checkpointing": "none,full"}),
        (hand_profile(), {"precision": "bf16"}),
        (hand_profile(), {"micro_batch_size": "2,4"}),
        (chunked_profile(), {"loss_chunks": "1"}),
    ],
)
def test_a_restricted_space_has_its_own_study(profile: Profile, only: dict[str, Any]) -> None:
    everything = build_space(profile, SearchRequest(global_batch_size=8))
    space = build_space(profile, SearchRequest(global_batch_size=8, only=only))
    assert space.to_dict() != everything.to_dict()
    model = cost_model_from_profile(profile, 0.9)
    assert study_name_for("digest", space, model) != study_name_for("digest", everything, model)
    # The same restriction, spelled another way, is the same study.
    respelled = build_space(
        profile,
        SearchRequest(global_batch_size=8, only=parse_only(only_args(normalize_only(only)))),
    )
    assert study_name_for("digest", respelled, model) == study_name_for("digest", space, model)


def test_errors_quote_the_knob_as_the_user_typed_it() -> None:
    with pytest.raises(StrategyError, match=r"^--only checkpointing=blocks:0: "):
        parse_only(["checkpointing=blocks:0"])
    with pytest.raises(StrategyError, match=r"^--only micro-batch-size=-1: must be at least 1"):
        parse_only(["micro-batch-size=-1"])


def test_a_blocks_setting_is_read_in_its_usual_spelling() -> None:
    assert normalize_only({"checkpointing": "none,blocks:02"}) == {
        "activation_checkpointing": ("none", "blocks:2")
    }
    space = build_space(
        hand_profile(), SearchRequest(global_batch_size=8, only={"checkpointing": "blocks:02"})
    )
    assert space.checkpointing == ("blocks:2",)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        # Two ranks are asked for, but 3 sequences do not split over them.
        (
            SearchRequest(global_batch_size=3, world_size=2, only={"parallelism": "ddp"}),
            r"global batch 3 splits over none of the world sizes 2 to 2",
        ),
        # A what-if plans exactly the ranks asked for.
        (
            SearchRequest(
                global_batch_size=8,
                world_size=4,
                target="h100-80gb",
                only={"parallelism": "single"},
            ),
            r"a what-if plans exactly 4 ranks \(--world-size\)",
        ),
        # No FSDP layout at all: nothing to keep gathered.
        (
            SearchRequest(global_batch_size=8, only={"fsdp_reshard_after_forward": "false"}),
            r"no FSDP layout is searched here",
        ),
    ],
    ids=["batch-does-not-split", "what-if-ranks", "no-fsdp"],
)
def test_the_reason_names_the_real_cause(request_: SearchRequest, message: str) -> None:
    target = resolve_target(request_)[0] if request_.target else None
    with pytest.raises(StrategyError, match=message):
        build_space(hand_profile(), request_, target=target)


def test_no_reason_is_left_for_a_layout_the_micro_batch_restriction_dropped() -> None:
    request = SearchRequest(global_batch_size=8, world_size=2, only={"micro_batch_size": "8"})
    space = build_space(hand_profile(), request)
    assert space.layouts == (("single", 1),)
    assert not any("fsdp" in line for line in space.excluded)
