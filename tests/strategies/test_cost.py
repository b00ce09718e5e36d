"""The cost model's formulas, on hand-made profiles whose numbers can be checked by hand."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from profilers.profile_record import InputSample, ProbeRow
from strategies.cost import (
    CostModel,
    MeasuredComm,
    affine_seconds,
    backward_share,
    cost_model_from_profile,
    ddp_buckets,
    exposed_bucketed_allreduce_s,
    fsdp_units,
    overlapped_exposure_s,
)
from strategies.errors import Unpredictable
from strategies.space import Candidate
from tests.strategies.profiles import (
    ACTIVATIONS,
    ADAM_BYTES,
    FB_TIME,
    GRAD_BYTES,
    MB,
    NUM_PARAMS,
    OPTIMIZER_S,
    PARAM_BYTES,
    SEQ_LEN,
    comm_fit,
    facts,
    flop_count,
    hand_profile,
    line,
    memory_model,
    time_model,
)

MiB = 2**20


def cand(
    micro: int = 4,
    accum: int = 1,
    *,
    precision: str = "fp32",
    ckpt: str = "none",
    parallelism: str = "single",
    world: int = 1,
    workers: int = 0,
) -> Candidate:
    return Candidate(
        precision=precision,
        activation_checkpointing=ckpt,
        parallelism=parallelism,
        world_size=world,
        micro_batch_size=micro,
        grad_accum_steps=accum,
        num_workers=workers,
    )


def test_single_device_memory_is_the_fitted_peak_plus_overheads() -> None:
    profile = hand_profile(fixed_bytes=100 * MB, fragmentation=0.1)
    model = cost_model_from_profile(profile, 0.9)
    p = model.predict(cand(micro=4))
    traced = PARAM_BYTES + ADAM_BYTES + 4 * ACTIVATIONS[("fp32", "none")]  # 12 + 40 MB
    assert p.breakdown.to_dict()["memory"]["traced_bytes"] == traced
    assert p.peak_memory_bytes == round(traced * 1.1) + 100 * MB
    # Accumulation: the fitted accumulating peak holds one gradient copy more.
    p2 = model.predict(cand(micro=4, accum=2))
    assert p2.breakdown.to_dict()["memory"]["traced_bytes"] == traced + GRAD_BYTES


def test_memory_grows_and_step_time_falls_with_the_micro_batch_at_a_fixed_global_batch(
    model: CostModel,
) -> None:
    global_batch = 32
    micros = [1, 2, 4, 8, 16, 32]
    predictions = [model.predict(cand(micro=b, accum=global_batch // b)) for b in micros]
    peaks = [p.peak_memory_bytes for p in predictions]
    times = [p.step_time_s for p in predictions]
    assert peaks == sorted(peaks) and len(set(peaks)) > 1
    assert times == sorted(times, reverse=True)
    # accum * (t0 + k*b) + t_opt with b*accum = 32.
    t0, k = FB_TIME[("fp32", "none")]
    assert times[2] == pytest.approx(8 * (t0 + 4 * k) + OPTIMIZER_S)
    tokens = global_batch * SEQ_LEN
    assert predictions[2].tokens_per_s == pytest.approx(tokens / times[2])


def test_checkpointing_trades_time_for_memory(model: CostModel) -> None:
    plain = model.predict(cand(micro=8))
    ckpt = model.predict(cand(micro=8, ckpt="full"))
    assert ckpt.peak_memory_bytes < plain.peak_memory_bytes
    assert ckpt.step_time_s > plain.step_time_s


def test_ddp_keeps_a_gradient_copy_in_its_buckets_unless_accumulation_already_does(
    model: CostModel,
) -> None:
    for accum, extra in ((1, GRAD_BYTES), (2, 0)):
        single = model.predict(cand(micro=8, accum=accum))
        ddp = model.predict(cand(micro=8, accum=accum, parallelism="ddp", world=2))
        m = ddp.breakdown.to_dict()["memory"]
        assert m["ddp_gradient_buckets_bytes"] == extra
        assert m["traced_bytes"] - single.breakdown.to_dict()["memory"]["traced_bytes"] == extra


def test_fsdp_memory_per_rank_follows_the_sharding_formula(model: CostModel) -> None:
    b, world = 4, 4
    p = model.predict(cand(micro=b, parallelism="fsdp", world=world))
    root, block = fsdp_units(facts())
    state = PARAM_BYTES + GRAD_BYTES + ADAM_BYTES
    activations = b * ACTIVATIONS[("fp32", "none")]  # fb(b) minus params and Adam state
    expected = state / world + (root + 2 * block) * 4 + block * 4 + activations
    assert p.breakdown.to_dict()["memory"]["traced_bytes"] == int(expected)
    # More ranks: less state per rank, same activations.
    wider = model.predict(cand(micro=b, parallelism="fsdp", world=8))
    assert wider.peak_memory_bytes < p.peak_memory_bytes
    # bf16 gathers half-size parameters.
    bf16 = model.predict(cand(micro=b, precision="bf16", parallelism="fsdp", world=world))
    assert (
        bf16.breakdown.to_dict()["memory"]["fsdp"]["gathered_units_bytes"] == (root + 2 * block) * 2
    )


def test_the_fsdp_fallback_reads_a_ranks_activations_from_the_fits_windows() -> None:
    """Without a per-rank fit, FSDP's activations come from the single-device fit's windows:
    the larger of window A's (until the last block's backward ends) and window B's less every
    gradient (a rank holds 1/N of them: DeepSeek-V3 with full checkpointing read 2.5 TB of
    gradients as activations), and window F's less autocast's weight copies; window A less
    the copies the blocks not checkpointed saved for backward. Never below the windows' own
    activations (each window's bound holds), and the whole peak without windows."""
    b, world, MiB = 4, 4, 2**20
    state = PARAM_BYTES + ADAM_BYTES
    copies = (NUM_PARAMS - 200_000 + 256 * 128) * 2  # bf16 copies: all but embeddings + head

    def windowed(precision: str, ckpt: str) -> Any:
        windows = (
            ("F", line(state + 3 * MiB, 0.5 * MiB)),  # 5 MiB at b=4
            ("A", line(state + 2 * MiB, 1 * MiB)),  # 6 MiB
            ("B", line(state + GRAD_BYTES + 3 * MiB, 0.1 * MiB)),  # every gradient + 3.4 MiB
        )
        whole = line(state + GRAD_BYTES + 3 * MiB, 0.1 * MiB)
        return dataclasses.replace(
            memory_model(precision, ckpt), windows=windows, forward_backward=whole
        )

    profile = hand_profile(kind="cuda")
    fits = tuple(windowed(m.precision, m.activation_checkpointing) for m in profile.fits.memory)
    model = cost_model_from_profile(
        dataclasses.replace(profile, fits=dataclasses.replace(profile.fits, memory=fits)), 0.9
    )

    def activations(precision: str, ckpt: str) -> int:
        c = cand(micro=b, precision=precision, ckpt=ckpt, parallelism="fsdp", world=world)
        prediction = model.predict(c)
        assert any("before the last block" in a for a in prediction.breakdown.assumptions)
        return int(prediction.breakdown.to_dict()["memory"]["fsdp"]["activation_bytes"])

    assert activations("fp32", "full") == 6 * MiB  # window A; the whole peak read 7.4 MiB
    assert activations("fp32", "none") == 6 * MiB
    assert activations("bf16", "full") == 6 * MiB  # a recomputed block casts again: none saved
    assert activations("bf16", "none") == 6 * MiB - copies  # every block saved its copies
    # Without windows: the whole peak less the parameters and optimizer state, as before.
    plain = cost_model_from_profile(profile, 0.9)
    c = cand(micro=b, ckpt="full", parallelism="fsdp", world=world)
    memory = plain.predict(c).breakdown.to_dict()["memory"]["fsdp"]
    assert memory["activation_bytes"] == b * ACTIVATIONS[("fp32", "full")]
    # Windows that disagree with the whole peak (a shallow copy's, carried over unextended)
    # are not the step's: the whole peak is used.
    shallow = tuple(
        dataclasses.replace(
            m, windows=(("A", line(1 * MiB, 0.1 * MiB)), ("B", line(2 * MiB, 0.1 * MiB)))
        )
        for m in profile.fits.memory
    )
    odd = cost_model_from_profile(
        dataclasses.replace(profile, fits=dataclasses.replace(profile.fits, memory=shallow)), 0.9
    )
    memory = odd.predict(c).breakdown.to_dict()["memory"]["fsdp"]
    assert memory["activation_bytes"] == b * ACTIVATIONS[("fp32", "full")]


def test_a_rank_fit_above_its_traced_sizes_grows_as_one_device_does_at_most() -> None:
    """A per-rank fit traced at micro-batches 1 and 4 whose peak is flat there (its sharded
    state dominates at 2 ranks) read 18% under its own trace at 8 (a 70.55B Llama's fp16/full):
    above its largest traced size it is its peak there plus the most any window of the
    single-device fit grows by (here window A, 2 MiB a sequence; the whole single-device peak,
    at the end of backward, grows 0.1 MiB)."""
    MiB = 2**20
    state = PARAM_BYTES + ADAM_BYTES
    profile = hand_profile()
    windows = (
        ("A", line(state + 2 * MiB, 2 * MiB)),
        ("B", line(state + GRAD_BYTES + 9 * MiB, 0.1 * MiB)),
    )
    single = dataclasses.replace(
        memory_model("fp32", "full"),
        windows=windows,
        forward_backward=line(state + GRAD_BYTES + 9 * MiB, 0.1 * MiB),
    )
    rank = dataclasses.replace(
        memory_model("fp32", "full"),
        parallelism="fsdp",
        world_size=2,
        forward_backward=line(20 * MiB, 3 * MiB, xs=(1.0, 4.0)),  # 32 MiB at 4, 44 at 8
        optimizer_step=line(4 * MiB, 0.0),
    )
    others = tuple(
        m
        for m in profile.fits.memory
        if (m.precision, m.activation_checkpointing) != ("fp32", "full")
    )
    fits = dataclasses.replace(profile.fits, memory=(*others, single, rank))
    model = cost_model_from_profile(dataclasses.replace(profile, fits=fits), 0.9)

    def traced(micro: int) -> tuple[int, tuple[str, ...]]:
        p = model.predict(cand(micro=micro, ckpt="full", parallelism="fsdp", world=2))
        return p.breakdown.to_dict()["memory"]["traced_bytes"], p.breakdown.assumptions

    assert traced(4)[0] == 32 * MiB  # within the traced sizes: the fit
    at_8, notes = traced(8)
    assert at_8 == 32 * MiB + 4 * 2 * MiB  # the peak at 4 plus window A's growth to 8
    assert any("above the per-rank traces' largest size (4)" in n for n in notes)
    # Without the step's windows the whole peak's growth (0.1 MiB a sequence, at the end of
    # backward) bounds nothing: the rank's own line where it is larger.
    bare = dataclasses.replace(single, windows=())
    fits = dataclasses.replace(profile.fits, memory=(*others, bare, rank))
    model = cost_model_from_profile(dataclasses.replace(profile, fits=fits), 0.9)
    assert traced(8)[0] == 44 * MiB


def test_fsdp_gathers_the_largest_block_where_blocks_differ(model: CostModel) -> None:
    """Jamba's MoE layers hold several times its dense ones: the running and the prefetched
    unit are priced at the largest block, not at the mean (which the kept-gathered whole body
    and the collectives still use)."""
    b, world = 4, 4
    _, block = fsdp_units(facts())
    largest = 3 * block
    uneven = dataclasses.replace(
        model, facts=dataclasses.replace(facts(), largest_block_params=largest)
    )
    even_p = model.predict(cand(micro=b, parallelism="fsdp", world=world))
    uneven_p = uneven.predict(cand(micro=b, parallelism="fsdp", world=world))
    even_m, uneven_m = (p.breakdown.to_dict()["memory"] for p in (even_p, uneven_p))
    assert (
        uneven_m["fsdp"]["gathered_units_bytes"] - even_m["fsdp"]["gathered_units_bytes"]
        == 2 * (largest - block) * 4
    )
    assert uneven_m["traced_bytes"] - even_m["traced_bytes"] == 3 * (largest - block) * 4
    kept = dataclasses.replace(
        cand(micro=b, parallelism="fsdp", world=world), fsdp_reshard_after_forward=False
    )
    assert (
        uneven.predict(kept).breakdown.to_dict()["memory"]["fsdp"]["gathered_units_bytes"]
        == model.predict(kept).breakdown.to_dict()["memory"]["fsdp"]["gathered_units_bytes"]
    )


def test_fsdp_units_split_embeddings_into_the_root() -> None:
    f = facts(num_layers=4)
    root, block = fsdp_units(f)
    assert block == (NUM_PARAMS - f.num_embedding_params) // 4
    assert root + 4 * block == NUM_PARAMS
    untied = dataclasses.replace(f, tied_embeddings=False)
    assert fsdp_units(untied)[0] == root + f.vocab_size * f.hidden_size


def test_cpu_ranks_share_the_cores_and_the_ram(model: CostModel) -> None:
    single = model.predict(cand(micro=8, accum=2))
    ddp = model.predict(cand(micro=8, accum=1, parallelism="ddp", world=2))
    time = ddp.breakdown.to_dict()["time"]
    assert time["forward_backward_s"] == pytest.approx(
        2 * single.breakdown.to_dict()["time"]["forward_backward_s"]
    )
    assert any("share the host's cores" in a for a in ddp.breakdown.to_dict()["assumptions"])
    assert ddp.budgeted_bytes == 2 * ddp.peak_memory_bytes


def test_a_measured_multi_rank_time_replaces_the_sharing_assumption() -> None:
    measured = time_model("fp32", "none", parallelism="ddp", world_size=2, scale=1.5)
    model = cost_model_from_profile(hand_profile(extra_time=[measured]), 0.9)
    p = model.predict(cand(micro=8, parallelism="ddp", world=2))
    t0, k = FB_TIME[("fp32", "none")]
    assert p.breakdown.to_dict()["time"]["forward_backward_s"] == pytest.approx(1.5 * (t0 + 8 * k))
    assert p.breakdown.to_dict()["time"]["exposed_communication_s"] == 0.0  # inside the measurement
    assert "measured ddp×2" in p.breakdown.to_dict()["time"]["compute_source"]
    assert not any("share the host's cores" in a for a in p.breakdown.to_dict()["assumptions"])


def test_gpu_ranks_do_not_share_compute() -> None:
    model = cost_model_from_profile(hand_profile(kind="cuda"), 0.9)
    single = model.predict(cand(micro=8))
    ddp = model.predict(cand(micro=8, parallelism="ddp", world=2))
    assert (
        ddp.breakdown.to_dict()["time"]["forward_backward_s"]
        == single.breakdown.to_dict()["time"]["forward_backward_s"]
    )
    assert ddp.budgeted_bytes == ddp.peak_memory_bytes
    assert ddp.step_time_s >= single.step_time_s  # the same work plus exposed communication


def test_ddp_buckets_follow_torch_sizes() -> None:
    assert ddp_buckets(60 * MiB) == [1 * MiB, 25 * MiB, 25 * MiB, 9 * MiB]
    assert ddp_buckets(512) == [512]
    assert ddp_buckets(0) == []


def test_bucketed_allreduce_exposes_only_what_outlasts_backward() -> None:
    # Two equal buckets: ready at 5 s and 10 s of a 10 s backward.
    assert exposed_bucketed_allreduce_s([1, 1], [1.0, 1.0], 10.0) == pytest.approx(1.0)
    # Communication slower than backward: 5 -> 15, then 15 -> 25: 15 s past the end.
    assert exposed_bucketed_allreduce_s([1, 1], [10.0, 10.0], 10.0) == pytest.approx(15.0)
    assert overlapped_exposure_s(1.0, 3.0, 5.0, last_s=0.5) == pytest.approx(1.5)
    assert overlapped_exposure_s(1.0, 8.0, 5.0) == pytest.approx(4.0)


def test_ddp_exposed_communication_uses_the_alpha_beta_fit() -> None:
    model = cost_model_from_profile(hand_profile(kind="cuda"), 0.9)
    p = model.predict(cand(micro=8, parallelism="ddp", world=2))
    time = p.breakdown.to_dict()["time"]
    # 4 MB of gradients: one 1 MiB bucket and one of the rest, 1 GB/s, alpha 0.1 ms.
    sizes = ddp_buckets(GRAD_BYTES)
    times = [1e-4 + s / 1e9 for s in sizes]
    backward = 2 / 3 * time["forward_backward_s"]  # counted FLOPs: backward = 2 x forward
    assert time["communication_s"] == pytest.approx(sum(times))
    assert time["exposed_communication_s"] == pytest.approx(
        exposed_bucketed_allreduce_s(sizes, times, backward)
    )
    assert p.step_time_s == pytest.approx(
        time["forward_backward_s"] + time["optimizer_s"] + time["exposed_communication_s"]
    )


def test_backward_share_from_counted_flops() -> None:
    counted = flop_count()
    assert backward_share("none", counted) == pytest.approx(2 / 3)
    assert backward_share("full", counted) == pytest.approx(3 / 4)
    assert backward_share("full", None) == pytest.approx(3 / 4)


def test_a_comm_fit_for_another_world_size_is_rescaled_by_bus_bandwidth() -> None:
    comm = MeasuredComm(fits=(comm_fit("all_reduce", 2, gbps=1.0, alpha_s=0.0),))
    # all_reduce factor 2(n-1)/n: 1 at n=2, 1.5 at n=4.
    assert comm.collective_s("all_reduce", 4, 1e9) == pytest.approx(1.5)
    assert "rescaled" in comm.describe("all_reduce", 4)
    with pytest.raises(Unpredictable, match=r"no all_gather measurement .* without --no-comm"):
        comm.collective_s("all_gather", 4, 1e9)


def test_missing_communication_makes_distributed_candidates_unpredictable() -> None:
    model = cost_model_from_profile(hand_profile(comm_world_sizes=()), 0.9)
    with pytest.raises(Unpredictable, match="no all_reduce measurement"):
        model.predict(cand(micro=8, parallelism="ddp", world=2))


def test_a_missing_checkpointing_time_is_derived_from_counted_flops() -> None:
    model = cost_model_from_profile(hand_profile(timed_checkpointing=("none",)), 0.9)
    plain = model.predict(cand(micro=8))
    ckpt = model.predict(cand(micro=8, ckpt="full"))
    ratio = (
        ckpt.breakdown.to_dict()["time"]["forward_backward_s"]
        / plain.breakdown.to_dict()["time"]["forward_backward_s"]
    )
    assert ratio == pytest.approx(4 / 3)
    assert "derived" in ckpt.breakdown.to_dict()["time"]["compute_source"]
    without_flops = cost_model_from_profile(
        hand_profile(timed_checkpointing=("none",), with_flops=False), 0.9
    )
    with pytest.raises(Unpredictable, match="no step-time fit for fp32 with full"):
        without_flops.predict(cand(micro=8, ckpt="full"))


def test_a_recompute_timed_beside_the_plain_step_wins_over_the_flops_ratio() -> None:
    """profilers.phases_recompute: the plain fit plus a same-child delta, priced as measured
    (no 'derived' term in its interval), the source naming what it adds to."""
    import dataclasses

    from tests.strategies.profiles import line, time_model

    base = hand_profile(timed_checkpointing=("none",))
    plain_fit = time_model("fp32", "none")
    recompute = dataclasses.replace(
        plain_fit,
        activation_checkpointing="full",
        delta_from="none",
        forward_backward=line(
            plain_fit.forward_backward.intercept + 0.01,
            plain_fit.forward_backward.slope * 1.5,
            xs=(2.0, 8.0),
        ),
    )
    profile = dataclasses.replace(
        base, fits=dataclasses.replace(base.fits, time=(*base.fits.time, recompute))
    )
    model = cost_model_from_profile(profile, 0.9)
    plain = model.predict(cand(micro=8)).breakdown.to_dict()["time"]
    ckpt = model.predict(cand(micro=8, ckpt="full"))
    timed = ckpt.breakdown.to_dict()["time"]
    assert timed["forward_backward_s"] - plain["forward_backward_s"] == pytest.approx(
        0.01 + 0.5 * plain_fit.forward_backward.slope * 8
    )
    assert timed["compute_source"] == (
        "measured: the fp32/none fit + the recompute of full timed beside it"
    )
    from strategies.uncertainty import source_term

    assert source_term("derived_checkpointing") not in ckpt.uncertainty.terms


def test_a_missing_time_fit_says_why_the_probe_did_not_time_it_and_the_flag_that_would() -> None:
    base = hand_profile(timed_checkpointing=("none",), with_flops=False)
    without_rows = cost_model_from_profile(base, 0.9)
    with pytest.raises(Unpredictable, match=r"--precision fp32' with a larger --budget-s"):
        without_rows.predict(cand(micro=8, ckpt="full"))
    skipped = ProbeRow(
        probe="throughput",
        name="fp32/full",
        status="skipped",
        reason="time budget spent before this group was timed; --budget-s 300 would cover them",
        precision="fp32",
        activation_checkpointing="full",
    )
    with_rows = cost_model_from_profile(
        dataclasses.replace(base, probes=(*base.probes, skipped)), 0.9
    )
    with pytest.raises(Unpredictable, match=r"its probe: skipped: .*--budget-s 300"):
        with_rows.predict(cand(micro=8, ckpt="full"))


def test_a_missing_memory_fit_names_the_fix() -> None:
    model = cost_model_from_profile(hand_profile(checkpointing=("none",)), 0.9)
    with pytest.raises(Unpredictable, match=r"no memory fit for fp32 with full.*advisor profile"):
        model.predict(cand(ckpt="full"))


def test_input_loading_adds_in_process_and_overlaps_with_gpu_workers() -> None:
    inputs = [
        InputSample(num_workers=w, micro_batch_size=8, seq_len=SEQ_LEN, batches_per_s=rate)
        for w, rate in ((0, 100.0), (2, 400.0))
    ]
    gpu = cost_model_from_profile(hand_profile(kind="cuda", inputs=inputs), 0.9)
    no_input = cost_model_from_profile(hand_profile(kind="cuda"), 0.9)
    base = no_input.predict(cand(micro=8)).step_time_s
    in_process = gpu.predict(cand(micro=8, workers=0))
    assert in_process.breakdown.to_dict()["time"]["input_s"] == pytest.approx(
        1 / 100
    )  # 8 seqs, 100 b/s
    assert in_process.step_time_s == pytest.approx(base + 1 / 100)
    assert gpu.predict(cand(micro=8, workers=2)).step_time_s == pytest.approx(max(base, 1 / 400))
    cpu = cost_model_from_profile(hand_profile(inputs=inputs), 0.9)
    assert cpu.predict(cand(micro=8, workers=2)).step_time_s == pytest.approx(base + 1 / 400)


def test_a_profile_without_a_loader_speed_says_its_steps_load_in_no_time() -> None:
    """A short profile skips the input probe; its predictions priced loading at 0 s without
    a word."""
    from profilers.profile_record import ProbeRow

    skipped = ProbeRow(probe="input", name="input", status="skipped", reason="time budget spent")
    profile = dataclasses.replace(hand_profile(), probes=(skipped,))
    prediction = cost_model_from_profile(profile, 0.9).predict(cand(micro=8))
    assert prediction.breakdown.to_dict()["time"]["input_s"] == 0.0
    assert (
        "data loading not measured (time budget spent): priced at 0 s a step; a longer "
        "'advisor profile' (--budget-s) times the loader"
    ) in prediction.breakdown.assumptions
    inputs = [InputSample(num_workers=0, micro_batch_size=8, seq_len=SEQ_LEN, batches_per_s=9.0)]
    from profilers.probe_rows import TIME_SPENT
    from strategies.cost import BUDGET_SPENT

    assert BUDGET_SPENT == TIME_SPENT  # the profiler's words, read by the cost model
    # a longer budget does not add a loader the workload lacks: no --budget-s advice then
    none = ProbeRow(probe="input", name="input", status="skipped", reason="no data loader")
    said = (
        cost_model_from_profile(dataclasses.replace(profile, probes=(none,)), 0.9)
        .predict(cand(micro=8))
        .breakdown.assumptions
    )
    assert "data loading not measured (no data loader): priced at 0 s a step" in said
    measured = dataclasses.replace(profile, input=tuple(inputs))
    said = cost_model_from_profile(measured, 0.9).predict(cand(micro=8)).breakdown.assumptions
    assert not any("data loading" in a for a in said)


def test_a_time_fit_with_negative_intercept_stays_positive_below_its_range() -> None:
    fit = line(-0.05, 0.1, xs=(2.0, 8.0))
    assert affine_seconds(fit, 4) == pytest.approx(0.35)
    assert affine_seconds(fit, 1) == pytest.approx(fit.predict(2) / 2)


def test_config_for_another_model_or_sequence_length_is_refused(model: CostModel) -> None:
    from strategies.config import TrainConfig

    ok = TrainConfig(model="gpt-tiny", seq_len=SEQ_LEN, global_batch_size=4, micro_batch_size=4)
    assert model.predict_config(ok).tokens_per_s > 0
    with pytest.raises(Unpredictable, match=r"seq_len=64, not 128.*--seq-len 128"):
        model.predict_config(ok.replace(seq_len=128))
    with pytest.raises(Unpredictable, match="model='gpt-tiny'"):
        model.predict_config(ok.replace(model="gpt-small"))


def test_a_traced_per_rank_memory_fit_replaces_the_analytic_sharding() -> None:
    from profilers.memory_model import MemoryModel

    if "parallelism" not in {f.name for f in dataclasses.fields(MemoryModel)}:
        pytest.skip("profilers.memory_model.MemoryModel has no parallelism field yet")

    profile = hand_profile()
    per_rank = dataclasses.replace(
        memory_model("fp32", "none"),
        parallelism="fsdp",
        world_size=2,
    )
    per_rank = dataclasses.replace(per_rank, forward_backward=line(5 * MB, 1 * MB))
    fits = dataclasses.replace(profile.fits, memory=(*profile.fits.memory, per_rank))
    model = cost_model_from_profile(dataclasses.replace(profile, fits=fits), 0.9)
    traced = model.predict(cand(micro=4, parallelism="fsdp", world=2))
    assert traced.breakdown.to_dict()["memory"]["source"] == "traced fsdp×2 per-rank fit"
    assert traced.breakdown.to_dict()["memory"]["traced_bytes"] == per_rank.predict(4, 1)
    # Another FSDP world size reshards the traced fit's state; DDP has no trace: analytic.
    other = model.predict(cand(micro=4, parallelism="fsdp", world=4)).breakdown.to_dict()
    assert other["memory"]["source"] == (
        "traced fsdp×2 per-rank fit, its sharded state resharded to 4 ranks"
    )
    assert other["memory"]["traced_bytes"] == per_rank.resharded(4).predict(4, 1)
    ddp = model.predict(cand(micro=4, parallelism="ddp", world=2)).breakdown.to_dict()
    assert "source" not in ddp["memory"]
    assert model.memory_model("fp32", "none").parallelism == "single"


def test_blocks_k_at_an_untraced_fsdp_world_size_reshards_the_traced_line() -> None:
    """blocks:K under FSDP at a world size with no trace: the traced world's none/full rank
    fits give K's line there, which is then resharded (not the analytic sharding)."""
    from profilers.checkpointing_fits import blocks_memory_model

    profile = hand_profile()
    ranks = {
        ckpt: dataclasses.replace(memory_model("fp32", ckpt), parallelism="fsdp", world_size=2)
        for ckpt in ("none", "full")
    }
    fits = dataclasses.replace(profile.fits, memory=(*profile.fits.memory, *ranks.values()))
    model = cost_model_from_profile(dataclasses.replace(profile, fits=fits), 0.9)
    layers = model.facts.num_layers
    assert layers >= 2
    setting = "blocks:1"
    line = blocks_memory_model(lambda s: ranks.get(s), setting, layers)
    assert line is not None
    memory = model.predict(cand(micro=4, ckpt=setting, parallelism="fsdp", world=4))
    terms = memory.breakdown.to_dict()["memory"]
    assert terms["source"] == "traced fsdp×2 per-rank fit, its sharded state resharded to 4 ranks"
    assert terms["traced_bytes"] == line.resharded(4).predict(4, 1)
    # Between the resharded none and full ranks: K of L blocks recomputed.
    low, high = (ranks[c].resharded(4).predict(4, 1) for c in ("full", "none"))
    assert low <= terms["traced_bytes"] <= high


def test_a_rank_fit_prices_its_layout_when_one_device_has_no_fit_of_that_setting() -> None:
    """A budget that traced FSDP ranks of a setting but not that setting on one device (a 9B
    model's 420 s profile: fsdp×2 bf16/full, no single-device bf16/full): the rank's fit
    prices FSDP candidates at its world size and, resharded, at others; the whole model's
    state is the rank's shard × its world; one device and DDP stay unpredictable."""
    profile = hand_profile()
    shard = dataclasses.replace(
        memory_model("fp32", "full"),
        parallelism="fsdp",
        world_size=2,
        parameter_bytes=PARAM_BYTES // 2,
        gradient_bytes=GRAD_BYTES // 2,
        optimizer_state_bytes=ADAM_BYTES // 2,
        forward_backward=line(3 * MB, 1 * MB),
        optimizer_step=line(4 * MB, 0.0),
    )
    single = tuple(
        m
        for m in profile.fits.memory
        if (m.precision, m.activation_checkpointing) != ("fp32", "full")
    )
    fits = dataclasses.replace(profile.fits, memory=(*single, shard))
    model = cost_model_from_profile(dataclasses.replace(profile, fits=fits), 0.9)
    for world, fit in ((2, shard), (4, shard.resharded(4))):
        terms = model.predict(cand(micro=4, ckpt="full", parallelism="fsdp", world=world))
        memory = terms.breakdown.to_dict()["memory"]
        assert memory["traced_bytes"] == fit.predict(4, 1)
        assert memory["model_parameter_bytes"] == fit.parameter_bytes * world
        assert memory["model_optimizer_state_bytes"] == fit.optimizer_state_bytes * world
        # What each rank holds of it: its 1/N share.
        assert memory["state_shards"] == world
        assert memory["rank_parameter_bytes"] == fit.parameter_bytes * world // world
        assert memory["rank_optimizer_state_bytes"] == fit.optimizer_state_bytes
        assert memory["phase"] == "forward_backward"  # 3 MiB + 4 × 1 MiB > the 4 MiB step
    assert "resharded to 4 ranks" in str(
        model.predict(cand(micro=4, ckpt="full", parallelism="fsdp", world=4)).breakdown.to_dict()[
            "memory"
        ]["source"]
    )
    for parallelism, world in (("single", 1), ("ddp", 2)):
        with pytest.raises(Unpredictable, match="no memory fit for fp32 with full checkpointing"):
            model.predict(cand(micro=4, ckpt="full", parallelism=parallelism, world=world))
    # The setting with a single-device fit still reads its state from that fit.
    none = model.predict(cand(micro=4, parallelism="fsdp", world=2)).breakdown.to_dict()
    assert none["memory"]["model_parameter_bytes"] == PARAM_BYTES
    assert none["memory"]["rank_parameter_bytes"] == PARAM_BYTES // 2


def test_a_negative_slope_never_makes_larger_batches_free() -> None:
    from profilers.fit import fit_affine
    from strategies.cost import affine_seconds

    noisy = fit_affine([2.0, 4.0], [0.0545, 0.0232])  # a busy host timed b=2 slower than b=4
    at_4 = affine_seconds(noisy, 4)
    assert affine_seconds(noisy, 8) == pytest.approx(at_4 * 2)
    assert affine_seconds(noisy, 16) > affine_seconds(noisy, 8) > at_4


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_cpu_ranks_expose_all_their_communication(parallelism: str) -> None:
    """On a CPU host the collectives run on the compute cores: nothing overlaps, while the
    same profile on a GPU hides part of it behind backward."""
    cpu = cost_model_from_profile(hand_profile(kind="cpu"), 0.9)
    gpu = cost_model_from_profile(hand_profile(kind="cuda"), 0.9)
    c = cand(micro=8, parallelism=parallelism, world=2)
    on_cpu, on_gpu = (
        cpu.predict(c).breakdown.to_dict()["time"],
        gpu.predict(c).breakdown.to_dict()["time"],
    )
    assert on_cpu["communication_s"] == pytest.approx(on_gpu["communication_s"])
    # FSDP2's own CPU work (strategies.cost.FSDP_CPU_STEP_S) is exposed on top, on CPU only.
    extra = on_cpu["communication"].get("cpu_overhead_s") or 0.0
    assert (extra > 0) == (parallelism == "fsdp")
    assert "cpu_overhead_s" not in on_gpu["communication"]
    assert on_cpu["exposed_communication_s"] == pytest.approx(on_cpu["communication_s"] + extra)
    assert on_gpu["exposed_communication_s"] < on_gpu["communication_s"]
    assert "overlap" in on_cpu["communication"]
    assert cpu.predict(c).step_time_s == pytest.approx(
        on_cpu["micro_batches"] * on_cpu["forward_backward_s"]
        + on_cpu["optimizer_s"]
        + on_cpu["communication_s"]
        + extra
        + on_cpu["input_s"]
    )


@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp_on_cpu_charges_its_own_work_per_step_and_per_collective(reshard: bool) -> None:
    """Fitted on the tuning models' fsdp×2 runs: 32 ms a step + 1.5 ms per collective. A
    micro-batch issues an all-gather per unit (blocks again in backward when resharded) and
    a reduce-scatter per unit, so accumulation multiplies the per-collective part."""
    from strategies.cost import (
        FSDP_CPU_COLLECTIVE_S,
        FSDP_CPU_STEP_S,
        fsdp_collectives_per_micro_batch,
    )

    assert fsdp_collectives_per_micro_batch(4, True) == 14  # 9 all-gathers + 5 reduce-scatters
    assert fsdp_collectives_per_micro_batch(4, False) == 10  # no backward all-gather
    model = cost_model_from_profile(hand_profile(kind="cpu"), 0.9)
    layers = model.facts.num_layers
    per_micro = fsdp_collectives_per_micro_batch(layers, reshard)
    overheads = {}
    for accum in (1, 4):
        c = dataclasses.replace(
            cand(micro=2, parallelism="fsdp", world=2),
            grad_accum_steps=accum,
            fsdp_reshard_after_forward=reshard,
        )
        prediction = model.predict(c)
        terms = prediction.breakdown.to_dict()["time"]["communication"]
        overheads[accum] = terms["cpu_overhead_s"]
        assert overheads[accum] == pytest.approx(
            FSDP_CPU_STEP_S + accum * per_micro * FSDP_CPU_COLLECTIVE_S
        )
        assert any("FSDP2's own work" in a for a in prediction.breakdown.assumptions)
    assert overheads[4] - overheads[1] == pytest.approx(3 * per_micro * FSDP_CPU_COLLECTIVE_S)


def test_a_cpu_rank_carries_its_parallel_overhead_on_top_of_the_process_overhead() -> None:
    profile = hand_profile(fixed_bytes=100 * MB, parallel_bytes={"ddp": 1 * MB, "fsdp": 40 * MB})
    model = cost_model_from_profile(profile, 0.9)
    single = model.predict(cand(micro=4)).breakdown.to_dict()["memory"]
    assert single["parallel_overhead_bytes"] == 0
    assert single["per_rank_bytes"] == single["traced_bytes"] + 100 * MB
    for parallelism, extra in (("ddp", 1 * MB), ("fsdp", 40 * MB)):
        p = model.predict(cand(micro=2, parallelism=parallelism, world=2))
        memory = p.breakdown.to_dict()["memory"]
        assert memory["parallel_overhead_bytes"] == extra
        assert memory["per_rank_bytes"] == memory["traced_bytes"] + 100 * MB + extra
        assert p.budgeted_bytes == 2 * memory["per_rank_bytes"]  # both ranks share the RAM
    # A profile from before this field (or a GPU one) adds nothing.
    plain = cost_model_from_profile(hand_profile(fixed_bytes=100 * MB), 0.9)
    memory = plain.predict(cand(micro=2, parallelism="fsdp", world=2)).breakdown.to_dict()["memory"]
    assert memory["per_rank_bytes"] == memory["traced_bytes"] + 100 * MB


def test_cpu_ranks_use_the_measured_split_thread_ratio_where_it_applies() -> None:
    """2 threads profiled, 1 thread measured at 1.6x: a rank of a 2-rank job computes for 1.6x
    the single-process time (not 2x); a 4-rank job (0 threads each by that count) keeps x4."""
    split = time_model("fp32", "none", split=(2, 1, 1.6))
    profile = hand_profile(precisions=("fp32",), checkpointing=("none",), timed_checkpointing=())
    profile = dataclasses.replace(profile, fits=dataclasses.replace(profile.fits, time=(split,)))
    model = cost_model_from_profile(profile, 0.9)
    single = model.predict(cand(micro=4)).breakdown.to_dict()["time"]
    ddp = model.predict(cand(micro=4, parallelism="ddp", world=2)).breakdown.to_dict()
    assert ddp["time"]["forward_backward_s"] == pytest.approx(1.6 * single["forward_backward_s"])
    assert ddp["time"]["optimizer_s"] == pytest.approx(1.6 * single["optimizer_s"])
    assert any("measured at that thread count" in a for a in ddp["assumptions"])
    four = model.predict(cand(micro=2, parallelism="ddp", world=4)).breakdown.to_dict()
    two = model.predict(cand(micro=2)).breakdown.to_dict()["time"]
    assert four["time"]["forward_backward_s"] == pytest.approx(4 * two["forward_backward_s"])
    assert any("share the host's cores" in a for a in four["assumptions"])


def test_a_group_without_its_own_split_borrows_its_precisions_other_checkpointing() -> None:
    """fp32/none timed on half the threads (1.6x), fp32/full not: fp32/full ranks use 1.6x and
    say where it came from; a precision with no split at all keeps x world size."""
    timed = time_model("fp32", "none", split=(2, 1, 1.6))
    untimed = time_model("fp32", "full", split=(2, 0, None))
    other = time_model("bf16", "full", split=(2, 0, None))
    profile = hand_profile(precisions=("fp32", "bf16"), checkpointing=("none", "full"))
    fits = dataclasses.replace(profile.fits, time=(timed, untimed, other))
    model = cost_model_from_profile(dataclasses.replace(profile, fits=fits), 0.9)
    single = model.predict(cand(micro=4, ckpt="full")).breakdown.to_dict()["time"]
    ddp = model.predict(cand(micro=4, ckpt="full", parallelism="ddp", world=2)).breakdown.to_dict()
    assert ddp["time"]["forward_backward_s"] == pytest.approx(1.6 * single["forward_backward_s"])
    assert any("(for fp32/none: this group's was not timed)" in a for a in ddp["assumptions"])
    bf16 = model.predict(cand(micro=4, precision="bf16", ckpt="full")).breakdown.to_dict()["time"]
    bf16_ddp = model.predict(
        cand(micro=4, precision="bf16", ckpt="full", parallelism="ddp", world=2)
    ).breakdown.to_dict()
    assert bf16_ddp["time"]["forward_backward_s"] == pytest.approx(2 * bf16["forward_backward_s"])
    assert any("share the host's cores" in a for a in bf16_ddp["assumptions"])


def test_a_group_whose_memory_traces_failed_says_so_instead_of_asking_for_budget() -> None:
    """A group whose every trace failed (an op the fake tensors cannot run) gets no fit from a
    larger budget: the reason names the error, not --budget-s. A group with one successful
    trace beside a failed one, or with no row at all, keeps the budget reason."""

    def row(precision: str, ckpt: str, status: str, reason: str = "") -> ProbeRow:
        return ProbeRow(
            probe="memory",
            name=f"{precision}/{ckpt}/b=4",
            status=status,
            reason=reason,
            precision=precision,
            activation_checkpointing=ckpt,
            micro_batch_size=4,
        )

    error = "RuntimeError: Expected inputs of BF16 type\nmore detail."
    profile = dataclasses.replace(
        hand_profile(precisions=("fp32",), checkpointing=("none",)),
        probes=(
            row("bf16", "none", "error", error),
            row("bf16", "none", "error", "RuntimeError: another"),
            row("bf16", "full", "error", error),
            row("bf16", "full", "ok"),
        ),
    )
    model = cost_model_from_profile(profile, 0.9)
    assert model.failed_traces == {("bf16", "none"): "RuntimeError: Expected inputs of BF16 type"}
    with pytest.raises(Unpredictable) as failed:
        model.predict(cand(precision="bf16"))
    assert "its memory traces failed with 'RuntimeError: Expected inputs of BF16 type'" in str(
        failed.value
    )
    assert "would not change" in str(failed.value)
    for other in (cand(precision="bf16", ckpt="full"), cand(precision="fp16")):
        with pytest.raises(Unpredictable, match="with a larger --budget-s"):
            model.predict(other)


def test_a_group_whose_real_steps_could_not_run_says_why_not_the_budget() -> None:
    """A model no fake trace can run has its memory measured on real steps: one that could
    not run (too large for the device, killed) is no matter of budget either."""
    why = "real step: no fake trace can run this model (DynamicOutputShapeException: x)"
    rows = tuple(
        ProbeRow(
            probe="memory",
            name=f"fp32/{ckpt}/b={b}",
            status=status,
            reason=reason,
            precision="fp32",
            activation_checkpointing=ckpt,
            micro_batch_size=b,
        )
        for ckpt, b, status, reason in (
            ("full", 4, "skipped", f"{why}, and a real step cannot fit: its parameters …"),
            ("full", 8, "oom", f"{why}: the child ran out of memory"),
            ("none", 4, "ok", why),
            ("none", 8, "skipped", "time budget spent"),
        )
    )
    profile = dataclasses.replace(
        hand_profile(precisions=("fp32",), checkpointing=("none",)), probes=rows
    )
    model = cost_model_from_profile(profile, 0.9)
    assert set(model.failed_traces) == {("fp32", "full")}
    with pytest.raises(Unpredictable) as failed:
        model.predict(cand(precision="fp32", ckpt="full"))
    assert f"{why}, and a real step cannot fit" in str(failed.value)
    assert "measured on real steps" in str(failed.value) and "--budget-s" not in str(failed.value)


def test_a_missing_fit_of_the_only_profiled_precision_names_the_flag_that_is_left() -> None:
    """A profile taken with --precision bf16 gave bf16 the whole budget already: its missing
    fit's reason names --checkpointing (fewer settings), not --precision bf16 again."""
    both = hand_profile(precisions=("bf16",), checkpointing=("none",))
    narrowed = dataclasses.replace(both, precisions=("bf16",))
    with pytest.raises(Unpredictable) as unrestricted:
        cost_model_from_profile(both, 0.9).predict(cand(precision="bf16", ckpt="full"))
    assert str(unrestricted.value).endswith(
        "or with --precision bf16 to give that precision the whole budget"
    )
    with pytest.raises(Unpredictable) as restricted:
        cost_model_from_profile(narrowed, 0.9).predict(cand(precision="bf16", ckpt="full"))
    assert str(restricted.value).endswith(
        "or with --checkpointing naming only the settings you need, to give them the whole budget"
    )


def test_fsdp_memory_from_the_single_device_fit_says_it_keeps_autocasts_weight_copies(
    model: CostModel,
) -> None:
    """Without a per-rank fit the FSDP rank's activations are the single device's, which in
    16 bits hold autocast's copies of every weight a matmul reads (the blocks' and the tied
    head's: here (1,000,000 - 200,000 + 256 x 128) x 2 B = 2 MiB); an FSDP rank with a bf16
    parameter policy holds no such copies, so the prediction says it is on the high side."""
    bf16 = model.predict(cand(micro=4, precision="bf16", parallelism="fsdp", world=4))
    said = [a for a in bf16.breakdown.assumptions if "autocast's 16-bit copies" in a]
    assert len(said) == 1 and "~2 MiB" in said[0] and "--budget-s" in said[0]
    fp32 = model.predict(cand(micro=4, parallelism="fsdp", world=4))
    assert not [a for a in fp32.breakdown.assumptions if "autocast's 16-bit copies" in a]


def _rank_trace(micro: int, windows: tuple[tuple[int, int], ...] = ()) -> Any:
    """An FSDP×2 rank's trace of bf16/none at one micro-batch size (its group has no fit)."""
    from profilers.memory_records import MemoryBreakdown, MemoryTrace
    from profilers.workload import StepSpec

    spec = StepSpec(
        seq_len=SEQ_LEN,
        micro_batch_size=micro,
        precision="bf16",
        parallelism="fsdp",
        world_size=2,
    )
    return MemoryTrace(
        spec=spec,
        target_device_type="cpu",
        peak_bytes=9 * MB,
        forward_backward_peak_bytes=9 * MB,
        optimizer_step_peak_bytes=8 * MB,
        forward_backward_breakdown=MemoryBreakdown(),
        optimizer_step_breakdown=MemoryBreakdown(),
        parameter_bytes=PARAM_BYTES // 2,
        gradient_bytes=GRAD_BYTES // 2,
        optimizer_state_bytes=ADAM_BYTES // 2,
        resident_bytes=(PARAM_BYTES + ADAM_BYTES) // 2,
        trace_seconds=1.0,
        reshard_windows=windows,
    )


def test_an_fsdp_rank_traced_at_one_size_anchors_the_ranks_memory() -> None:
    """A profile whose budget traced one FSDP rank at one micro-batch size (no per-rank fit):
    the rank's peak is that trace's, its sharded bytes resharded to N ranks window by window,
    plus the single device's growth from that size to the candidate's; not the single
    device's activations (which, in 16 bits, hold autocast's copies of every weight)."""
    windows = ((6 * MB, 2 * MB), (3 * MB, 4 * MB))  # (not sharded, sharded) per window
    profile = dataclasses.replace(hand_profile(), memory=(_rank_trace(2, windows),))
    model = cost_model_from_profile(profile, 0.9)
    assert len(model.rank_traces) == 1
    p = model.predict(cand(micro=4, precision="bf16", parallelism="fsdp", world=4))
    at_four_ranks = max(6 * MB + 2 * MB // 2, 3 * MB + 4 * MB // 2)
    growth = 2 * ACTIVATIONS[("bf16", "none")]  # micro-batch 2 -> 4 on one device
    assert p.breakdown.to_dict()["memory"]["traced_bytes"] == int(at_four_ranks + growth)
    said = [a for a in p.breakdown.assumptions if a.startswith("FSDP memory from one traced")]
    assert len(said) == 1 and "fsdp×2 at micro-batch 2" in said[0] and "to 4 ranks" in said[0]
    assert not [a for a in p.breakdown.assumptions if "autocast's 16-bit copies" in a]
    # Below the traced size the single device's drop bounds nothing: the smaller of the traced
    # size's peak and the formula from one device.
    small = cand(micro=1, precision="bf16", parallelism="fsdp", world=4)
    formula = cost_model_from_profile(hand_profile(), 0.9).predict(small)
    expected = min(at_four_ranks, formula.breakdown.to_dict()["memory"]["traced_bytes"])
    assert model.predict(small).breakdown.to_dict()["memory"]["traced_bytes"] == expected
    # Without windows (an older record): its parameter and optimizer shards rescaled.
    bare = dataclasses.replace(hand_profile(), memory=(_rank_trace(2),))
    q = cost_model_from_profile(bare, 0.9).predict(
        cand(micro=4, precision="bf16", parallelism="fsdp", world=4)
    )
    shards = (PARAM_BYTES + ADAM_BYTES) // 2
    assert q.breakdown.to_dict()["memory"]["traced_bytes"] == int(9 * MB - shards / 2 + growth)
    # Accumulation, another setting, or a group with a fit: the trace is not used.
    for other in (
        cand(micro=4, accum=2, precision="bf16", parallelism="fsdp", world=4),
        cand(micro=4, precision="bf16", ckpt="full", parallelism="fsdp", world=4),
    ):
        assert model.one_rank_trace(other) is None
    # A rank traced for another device type than the fits in use (a GPU profile's CPU trace).
    bf16_rank = cand(micro=4, precision="bf16", parallelism="fsdp", world=4)
    assert model.one_rank_trace(bf16_rank, "cpu") is not None
    assert model.one_rank_trace(bf16_rank, "cuda") is None
    two = dataclasses.replace(profile, memory=(_rank_trace(2, windows), _rank_trace(4, windows)))
    fitted = dataclasses.replace(
        two,
        fits=dataclasses.replace(
            two.fits,
            memory=(
                *two.fits.memory,
                dataclasses.replace(memory_model("bf16", "none"), parallelism="fsdp", world_size=2),
            ),
        ),
    )
    assert cost_model_from_profile(fitted, 0.9).rank_traces == ()


def _checks(*rows: tuple[str, str]) -> Any:
    """The hand profile with these real-step memory check rows (status, reason)."""
    probes = tuple(
        ProbeRow(probe="memory_check", name="fp32/none/b=4", status=status, reason=reason)
        for status, reason in rows
    )
    return dataclasses.replace(hand_profile(), probes=probes)


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        ((), None),
        ((("ok", "traced fit 1 B"),), None),
        (
            (("timeout", "no result after 30 s"), ("skipped", "time budget spent")),
            "(the profile's real-step memory checks: skipped: time budget spent; timeout: no "
            "result after 30 s): each peak counts the step's tensors only, without the "
            "interpreter, torch and what building a step loads: a few hundred MiB; re-run "
            "'advisor profile' on a quiet host or with a larger --budget-s to measure it",
        ),
        (
            (("skipped", "predicted not to fit the device"),),
            "(the profile's real-step memory checks: skipped: predicted not to fit the device): "
            "each peak counts the step's tensors only, without the interpreter, torch and what "
            "building a step loads: a few hundred MiB; no real step of this model fits here to "
            "measure it",
        ),
    ],
    ids=["hand-made", "measured", "timed-out", "unfit"],
)
def test_a_process_overhead_the_checks_did_not_measure_is_an_assumption(
    rows: tuple[tuple[str, str], ...], said: str | None
) -> None:
    """fixed_bytes 0 after memory checks that all failed read as 'no overhead': a CPU peak of
    tensors only, silently (gpt-tiny, sequence 64, a busy host: 0.06 GiB shown, ~0.5 held)."""
    from strategies.cost import OVERHEAD_UNMEASURED, overhead_unmeasured

    profile = _checks(*rows)
    text = overhead_unmeasured(profile)
    model = cost_model_from_profile(profile, 0.9)
    assumptions = model.predict(cand()).breakdown.assumptions
    if said is None:
        assert text == ""
        assert not any(a.startswith(OVERHEAD_UNMEASURED) for a in assumptions)
    else:
        assert text == f"{OVERHEAD_UNMEASURED} {said}"
        assert text in assumptions
