"""strategies.memory_split: a predicted per-rank peak split by category adds up to it."""

from __future__ import annotations

import dataclasses

import pytest

from profilers.memory_records import MemoryBreakdown, MemoryTrace
from profilers.workload import StepSpec
from strategies.config import TrainConfig
from strategies.memory_split import CATEGORIES, split_memory
from strategies.prediction import MemoryTerms
from strategies.space import Candidate

GiB = 2**30


def _terms(traced: int, total: int, **kwargs: object) -> MemoryTerms:
    # A 6.7B Llama's whole-model state (what MemoryTerms names), bf16 with an fp32 master copy.
    return MemoryTerms(
        fitted_peak_bytes=traced,
        phase="forward_backward",
        traced_bytes=traced,
        rounding_allowance_bytes=0,
        fragmentation_bytes=total - traced - GiB,
        fixed_overhead_bytes=GiB,
        parallel_overhead_bytes=0,
        per_rank_bytes=total,
        ranks_sharing_memory=1,
        budgeted_bytes=total,
        budget_bytes=72 * GiB,
        model_parameter_bytes=26_953_662_464,
        model_gradient_bytes=26_953_662_464,
        model_optimizer_state_bytes=53_907_326_092,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("parallelism", ["fsdp", "ddp"])
def test_a_traced_rank_splits_into_parts_that_add_up_to_its_peak(parallelism: str) -> None:
    world = 8
    config = TrainConfig(
        model="llama-1b",
        seq_len=4096,
        precision="bf16",
        parallelism=parallelism,
        world_size=world,
        micro_batch_size=2,
        grad_accum_steps=4,
        global_batch_size=64,
    )
    candidate = Candidate.from_config(config)
    # The FSDP rank of the 6.7B what-if (57.6 GB traced, 66.2 GB budgeted); a DDP rank of the
    # same model holds everything whole (here, a larger made-up peak that can hold it).
    traced, total = (
        (57_619_317_039, 66_183_570_079)
        if parallelism == "fsdp"
        else (
            130 * GiB,
            150 * GiB,
        )
    )
    memory = _terms(traced, total, source=f"traced {parallelism}×{world} per-rank fit")
    split = split_memory(memory, total, candidate, traces=[])
    assert tuple(split.parts) == CATEGORIES
    assert sum(split.parts.values()) == total and min(split.parts.values()) >= 0
    shards = world if parallelism == "fsdp" else 1
    assert split.parts["parameters"] == round(memory.model_parameter_bytes / shards)
    assert split.parts["optimizer state"] == round(memory.model_optimizer_state_bytes / shards)
    assert split.parts["overhead"] == total - traced


def test_a_traced_fsdp_rank_holds_a_shard_of_the_gradients_the_single_device_traces_hold() -> None:
    from profilers.memory_records import MemoryBreakdown, MemoryTrace
    from profilers.workload import StepSpec

    world, total, traced = 8, 66_183_570_079, 57_619_317_039
    config = TrainConfig(
        model="llama-1b",
        seq_len=4096,
        precision="bf16",
        parallelism="fsdp",
        world_size=world,
        micro_batch_size=2,
        grad_accum_steps=4,
        global_batch_size=64,
    )
    memory = _terms(traced, total, source="traced fsdp×2 per-rank fit, resharded to 8 ranks")
    # One device's trace at micro-batch 2: every gradient, 20 GiB of activations, 2 of
    # temporaries at its forward/backward peak.
    single = MemoryTrace(
        spec=StepSpec(seq_len=4096, micro_batch_size=2, precision="bf16"),
        target_device_type="cuda",
        peak_bytes=0,
        forward_backward_peak_bytes=0,
        optimizer_step_peak_bytes=0,
        forward_backward_breakdown=MemoryBreakdown(
            gradients=memory.model_gradient_bytes, activations=20 * GiB, temporaries=2 * GiB
        ),
        optimizer_step_breakdown=MemoryBreakdown(),
        parameter_bytes=memory.model_parameter_bytes,
        gradient_bytes=memory.model_gradient_bytes,
        optimizer_state_bytes=memory.model_optimizer_state_bytes,
        resident_bytes=0,
        trace_seconds=1.0,
    )
    parts = split_memory(memory, total, Candidate.from_config(config), [single]).parts
    assert sum(parts.values()) == total
    rest = traced - (memory.model_parameter_bytes + memory.model_optimizer_state_bytes) / world
    shares = memory.model_gradient_bytes / world + 22 * GiB
    assert parts["gradients"] == pytest.approx(
        memory.model_gradient_bytes / world * rest / shares, 1e-6
    )
    assert parts["activations"] == pytest.approx(20 * GiB * rest / shares, rel=1e-6)
    assert parts["gradients"] < 0.2 * parts["activations"]  # 25 GiB of them before the fix


def test_the_record_names_the_whole_models_state_and_a_ranks_share() -> None:
    # An FSDP rank over 64 GPUs: the whole model's state is 64× what the rank holds; the JSON
    # says which is which (a 70B model's "parameter_bytes" of 282 GB beside a 75 GB peak read
    # as part of that peak until 2026-12-07).
    memory = _terms(60 * GiB, 70 * GiB, state_shards=64)
    data = memory.to_dict()
    assert "parameter_bytes" not in data
    assert data["model_parameter_bytes"] == 26_953_662_464
    assert data["rank_parameter_bytes"] == 26_953_662_464 // 64
    assert data["rank_optimizer_state_bytes"] == 53_907_326_092 // 64
    assert data["state_shards"] == 64
    assert MemoryTerms.from_dict(data) == memory


def test_a_file_written_before_the_rename_still_reads() -> None:
    data = _terms(60 * GiB, 70 * GiB).to_dict()
    for part in ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes"):
        data[part] = data.pop(f"model_{part}")
        del data[f"rank_{part}"]
    del data["state_shards"]
    old = MemoryTerms.from_dict(data)
    assert old.model_parameter_bytes == 26_953_662_464
    assert old.model_optimizer_state_bytes == 53_907_326_092
    assert old.state_shards == 1


def _single_trace(
    b: int, activations: int, *, accum: int = 1, gradients: int = 2048
) -> MemoryTrace:
    return MemoryTrace(
        spec=StepSpec(seq_len=128, micro_batch_size=b, grad_accum_steps=accum, precision="fp32"),
        target_device_type="cpu",
        peak_bytes=0,
        forward_backward_peak_bytes=0,
        optimizer_step_peak_bytes=0,
        forward_backward_breakdown=MemoryBreakdown(
            gradients=gradients, activations=activations, temporaries=activations // 10
        ),
        optimizer_step_breakdown=MemoryBreakdown(),
        parameter_bytes=MiB_13,
        gradient_bytes=MiB_13,
        optimizer_state_bytes=2 * MiB_13,
        resident_bytes=0,
        trace_seconds=1.0,
    )


MiB = 2**20
MiB_13 = 13_424_640  # gpt-tiny's fp32 parameters (and gradients)


@pytest.mark.parametrize("accumulating_trace", [False, True])
def test_an_accumulating_config_shows_its_gradient_copy_as_gradients(
    accumulating_trace: bool,
) -> None:
    """gpt-tiny fp32 1×8 priced from the non-accumulating traces plus every gradient's bytes:
    the page showed 4.79 KiB of gradients and the 12.8 MiB copy as activations (audit 41, D1)."""
    config = TrainConfig(
        model="gpt-tiny", seq_len=128, micro_batch_size=1, grad_accum_steps=8, global_batch_size=8
    )
    acts_b1 = 8 * MiB
    # the non-accumulating fit at micro-batch 1 plus the gradient copy (params + grads + Adam)
    traced = 4 * MiB_13 + acts_b1 + acts_b1 // 10 + 2048
    total = traced + 400 * MiB
    memory = dataclasses.replace(
        _terms(traced, total),
        fragmentation_bytes=0,
        fixed_overhead_bytes=total - traced,
        model_parameter_bytes=MiB_13,
        model_gradient_bytes=MiB_13,
        model_optimizer_state_bytes=2 * MiB_13,
    )
    traces = [_single_trace(4, 4 * acts_b1), _single_trace(8, 8 * acts_b1)]
    if accumulating_trace:  # the profile traced accumulation: its own shares hold the copy
        traces.append(_single_trace(1, acts_b1, accum=8, gradients=MiB_13))
    parts = split_memory(memory, total, Candidate.from_config(config), traces).parts
    assert sum(parts.values()) == total
    assert parts["gradients"] >= MiB_13 * 0.99
    assert parts["activations"] <= acts_b1 * 1.25
