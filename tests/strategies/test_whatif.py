"""What-if planning: estimates for hardware that is not here, labelled as such."""

from __future__ import annotations

import dataclasses

import pytest

from profilers.hardware import lookup_network, lookup_target
from strategies import roofline
from strategies.errors import StrategyError
from strategies.space import NETWORK_NEEDS_NODES, Candidate, SearchRequest, build_space
from strategies.whatif import (
    CUDA_FIXED_OVERHEAD_BYTES,
    LINK_EFFICIENCY,
    LinkComm,
    RooflineTime,
    rounding_allowance,
    whatif_cost_model,
)
from tests.strategies.profiles import NUM_PARAMS, facts, hand_profile, memory_model


def _cand(precision: str = "bf16", parallelism: str = "single", world: int = 1) -> Candidate:
    return Candidate(
        precision=precision,
        activation_checkpointing="none",
        parallelism=parallelism,
        world_size=world,
        micro_batch_size=8,
        grad_accum_steps=1,
    )


def test_whatif_predictions_are_labelled_estimates_from_a_roofline_and_datasheets() -> None:
    request = SearchRequest(global_batch_size=64, world_size=8, target="h100-80gb")
    model, label = whatif_cost_model(hand_profile(), request)
    assert label.startswith("ESTIMATE for 8× NVIDIA H100 SXM5 80GB")
    assert "per-op roofline" in label
    assert model.machine.estimate
    p = model.predict(_cand())
    assert p.estimate
    assert any("estimate" in a for a in p.breakdown.to_dict()["assumptions"])
    # Its steps load in no time: the target's hosts were not measured, and it says so.
    assert p.breakdown.to_dict()["time"]["input_s"] == 0.0
    assert any(a.startswith("data loading priced at 0 s") for a in p.breakdown.assumptions)
    h100 = lookup_target("h100-80gb")
    assert isinstance(model.time, RooflineTime)
    time = p.breakdown.to_dict()["time"]
    # The breakdown names what takes the time, and the parts add up to the micro-batch's time.
    parts = time["forward_backward_parts"]
    assert set(parts) == set(roofline.PARTS)
    assert sum(parts.values()) == pytest.approx(time["forward_backward_s"])
    assert "roofline" in time["compute_source"]
    sustained, tuned = roofline.sustained_fraction(h100)
    assert tuned
    expected_opt = roofline.optimizer_seconds(NUM_PARAMS, h100) / sustained
    assert time["optimizer_s"] == pytest.approx(expected_opt)
    assert model.predict(_cand("fp32")).step_time_s > p.step_time_s
    # Memory: CPU-traced fits + 512-B rounding bound + CUDA context.
    memory = p.breakdown.to_dict()["memory"]
    assert memory["rounding_allowance_bytes"] == rounding_allowance(facts())
    assert memory["fixed_overhead_bytes"] == CUDA_FIXED_OVERHEAD_BYTES
    assert model.budget_bytes == int(0.9 * h100.memory_bytes)


def test_cuda_target_traces_replace_the_rounding_bound() -> None:
    profile = hand_profile()
    cuda_fits = tuple(
        memory_model(p, c, target="cuda") for p in ("fp32", "bf16") for c in ("none", "full")
    )
    fits = dataclasses.replace(profile.fits, memory=profile.fits.memory + cuda_fits)
    profile = dataclasses.replace(profile, fits=fits)
    model, _ = whatif_cost_model(profile, SearchRequest(global_batch_size=8, target="a100-80gb"))
    assert model.rounding_allowance_bytes == 0
    assert all(m.target_device_type == "cuda" for m in model.memory_models)


def test_a_state_space_models_what_if_says_how_its_layers_were_traced() -> None:
    """The kernels a Mamba layer runs on a GPU hold several times less than transformers'
    PyTorch scan; the assumptions say which one the fits hold and what to install."""
    kernels = ("causal_conv1d.causal_conv1d_fn", "mamba_ssm.selective_scan_fn")
    profile = hand_profile()
    profile = dataclasses.replace(
        profile, model=dataclasses.replace(profile.model, state_space_kernels=kernels)
    )
    request = SearchRequest(global_batch_size=8, target="a100-80gb")
    cpu_traced, _ = whatif_cost_model(profile, request)
    (note,) = [a for a in cpu_traced.assumptions if "state-space" in a]
    assert "PyTorch scan (a CPU trace)" in note and "--trace-for cuda" in note
    cuda_fits = tuple(memory_model("bf16", c, target="cuda") for c in ("none", "full"))
    fits = dataclasses.replace(profile.fits, memory=profile.fits.memory + cuda_fits)
    cuda_traced, _ = whatif_cost_model(dataclasses.replace(profile, fits=fits), request)
    (note,) = [a for a in cuda_traced.assumptions if "state-space" in a]
    assert note.startswith(
        f"state-space layers traced as their CUDA kernels ({', '.join(kernels)})"
    )
    assert "install mamba-ssm and causal-conv1d" in note
    # a model without such layers says nothing of them
    plain, _ = whatif_cost_model(hand_profile(), request)
    assert not any("state-space" in a for a in plain.assumptions)


def test_links_nvlink_in_a_node_and_the_network_across_nodes() -> None:
    h100 = lookup_target("h100-80gb")
    network = lookup_network("ib-ndr-400")
    comm = LinkComm(target=h100, gpus_per_node=8, network=network)
    intra = comm.collective_s("all_reduce", 8, 1e9)
    nvlink = h100.nvlink_gbs * 1e9 * LINK_EFFICIENCY  # type: ignore[operator]
    assert intra == pytest.approx(10e-6 + 1e9 * 2 * 7 / 8 / nvlink)
    inter = comm.collective_s("all_reduce", 16, 1e9)
    # One NDR port per node (50 GB/s): every ring crosses it; the node's bandwidth, not 1/8.
    node = network.bytes_per_s * LINK_EFFICIENCY
    assert inter == pytest.approx(20e-6 + 1e9 * 2 * 15 / 16 / node)
    assert "InfiniBand" in comm.describe("all_reduce", 16)
    # Eight ports (DGX H100: 400 GB/s a node) are close to NVLink's 450 GB/s: the slower wins.
    dgx = LinkComm(target=h100, gpus_per_node=8, network=lookup_network("ib-ndr-400-x8"))
    eight = 8 * network.bytes_per_s * LINK_EFFICIENCY
    assert dgx.collective_s("all_reduce", 16, 1e9) == pytest.approx(
        20e-6 + 1e9 * 2 * 15 / 16 / min(eight, nvlink)
    )


def test_whatif_space_uses_the_targets_precisions_and_exact_world_size() -> None:
    request = SearchRequest(global_batch_size=32, world_size=4, target="v100-32gb")
    space = build_space(hand_profile(), request, target=lookup_target("v100-32gb"))
    assert "bf16" not in space.precisions
    assert {w for _, w in space.layouts} == {4}


def test_an_unknown_target_lists_the_known_ones() -> None:
    with pytest.raises(StrategyError, match=r"unknown target device 'h900'.*h100-80gb"):
        whatif_cost_model(hand_profile(), SearchRequest(global_batch_size=8, target="h900"))


def test_an_unknown_network_is_refused() -> None:
    request = SearchRequest(global_batch_size=16, world_size=16, target="h100-80gb", nodes=2)
    with pytest.raises(StrategyError, match=r"unknown network 'ib-hdr-2000'.*ib-ndr-400"):
        whatif_cost_model(hand_profile(), dataclasses.replace(request, network="ib-hdr-2000"))
    whatif_cost_model(hand_profile(), dataclasses.replace(request, network="ib-hdr-200"))


def test_a_network_on_one_node_is_refused_not_ignored() -> None:
    """On one node no collective crosses the network: --network was accepted there and
    changed nothing (47,215 tok/s with eth-10 as with none), silently."""
    with pytest.raises(StrategyError) as caught:
        SearchRequest(global_batch_size=16, world_size=8, target="h100-80gb", network="eth-10")
    assert str(caught.value) == NETWORK_NEEDS_NODES
    assert NETWORK_NEEDS_NODES.startswith("--network prices the links between nodes")


def test_more_gpus_than_a_node_holds_without_nodes_says_what_it_assumes() -> None:
    """--world-size 64 without --nodes prices every collective on one node's NVLink: the
    label and the assumptions say so and name the --nodes that spreads them; with --nodes,
    or within a node, nothing is said."""
    one = SearchRequest(global_batch_size=64, world_size=64, target="h100-80gb")
    model, label = whatif_cost_model(hand_profile(), one)
    hint = "all 64 GPUs assumed in one node (--nodes 1)"
    assert hint in label and "pass --nodes 8 (and --network) for 8 nodes" in label
    assert any(hint in a for a in model.assumptions)
    spread = dataclasses.replace(one, nodes=8)
    model, label = whatif_cost_model(hand_profile(), spread)
    assert "assumed in one node" not in label
    assert not any("assumed in one node" in a for a in model.assumptions)
    node = SearchRequest(global_batch_size=64, world_size=8, target="h100-80gb")
    assert "assumed in one node" not in whatif_cost_model(hand_profile(), node)[1]


def test_more_gpus_a_node_than_a_node_holds_with_nodes_says_so() -> None:
    """64 GPUs over 2 nodes priced 32 a node on one NVLink switch without a word."""
    crowded = SearchRequest(global_batch_size=64, world_size=64, target="h100-80gb", nodes=2)
    model, label = whatif_cost_model(hand_profile(), crowded)
    hint = "32 GPUs assumed in each of the 2 nodes"
    assert hint in label and "pass --nodes 8 for 8 nodes" in label
    assert any(hint in a for a in model.assumptions)
    usual = dataclasses.replace(crowded, nodes=8)
    assert "GPUs assumed" not in whatif_cost_model(hand_profile(), usual)[1]


def test_a_world_beyond_the_validated_runs_says_its_latency_is_not_modelled() -> None:
    big = SearchRequest(global_batch_size=1024, world_size=1024, target="h100-80gb", nodes=128)
    model, _ = whatif_cost_model(hand_profile(), big)
    assert any("beyond the published runs" in a and "1023 steps" in a for a in model.assumptions)
    small = dataclasses.replace(big, world_size=64, nodes=8, global_batch_size=64)
    assert not any(
        "beyond the published runs" in a
        for a in whatif_cost_model(hand_profile(), small)[0].assumptions
    )


def test_the_default_network_across_nodes_is_named_with_the_servers_own() -> None:
    """Two H100 nodes without --network were priced on one NDR port a node, 8x less than a
    DGX/HGX H100 has, without a word: the assumptions name the default and the server's."""
    request = SearchRequest(global_batch_size=16, world_size=16, target="h100-80gb", nodes=2)
    model, _ = whatif_cost_model(hand_profile(), request)
    said = [a for a in model.assumptions if a.startswith("no --network")]
    assert said == [
        "no --network: one InfiniBand NDR 400 Gb/s port a node assumed between nodes; a "
        "DGX/HGX node of NVIDIA H100 SXM5 80GB has 8x InfiniBand NDR 400 Gb/s (DGX H100/H200): "
        "pass --network ib-ndr-400-x8"
    ]
    a100 = dataclasses.replace(request, target="a100-40gb")
    assert any(
        "pass --network ib-hdr-200-x8" in a
        for a in whatif_cost_model(hand_profile(), a100)[0].assumptions
    )
    l40s = dataclasses.replace(request, target="l40s")
    said = [a for a in whatif_cost_model(hand_profile(), l40s)[0].assumptions if "--network" in a]
    assert said == ["no --network: one InfiniBand NDR 400 Gb/s port a node assumed between nodes"]
    for quiet in (
        dataclasses.replace(request, network="ib-ndr-400-x8"),
        dataclasses.replace(request, world_size=8, nodes=1, global_batch_size=8),
    ):
        assert not any(
            "no --network" in a for a in whatif_cost_model(hand_profile(), quiet)[0].assumptions
        )
