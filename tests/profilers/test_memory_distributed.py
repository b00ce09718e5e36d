"""Per-rank memory of DDP and FSDP steps, traced with a fake process group in a child process.

Runs on advisor's real step (``AdvisorWorkload``): the wrappers (DDP's reducer, FSDP2's
``fully_shard``) are what is measured, and the toy workload has none. All distributed traces of
gpt-tiny, for both targets, come from ONE child process (cached): importing torch there costs
as much as a few traces.
"""

from __future__ import annotations

import dataclasses
import functools
import json

import pytest

from advisor.workload import AdvisorWorkload
from profilers.isolate import Isolation, run_isolated
from profilers.memory import MemoryModel, MemoryTrace, fit_memory, fit_memory_models
from profilers.memory import trace_step_memory as trace_single
from profilers.memory_distributed import (
    DEFAULT_ISOLATION,
    DistributedTraceError,
    trace_distributed_step_memory,
)
from profilers.memory_records import MemoryBreakdown
from profilers.profile_record import Fits
from profilers.workload import StepSpec

# gpt-tiny with 3 blocks, not its 4: every rank trace costs ~25% less, and a rank still has a
# block between its first and its last (FSDP prefetches differ at the ends).
WORKLOAD = AdvisorWorkload("gpt-tiny", {"n_layer": 3})
SEQ_LEN = 64
PROBED = (1, 4)
UNPROBED = 2
CUDA_BLOCK = 512


def _spec(parallelism: str, world_size: int, micro_batch_size: int, accum: int = 1) -> StepSpec:
    return StepSpec(
        seq_len=SEQ_LEN,
        micro_batch_size=micro_batch_size,
        grad_accum_steps=accum,
        parallelism=parallelism,
        world_size=world_size,
    )


_CPU_SPECS = (
    *(_spec("fsdp", 2, b) for b in (*PROBED, UNPROBED)),
    _spec("fsdp", 4, 4),
    _spec("fsdp", 2, 4, accum=2),
    # Resharding a world-2 fit to 4 and 8 ranks is checked against these.
    _spec("fsdp", 4, 1),
    _spec("fsdp", 4, 4, accum=2),
    _spec("fsdp", 8, 1),
    _spec("fsdp", 8, 4),
    _spec("fsdp", 8, 4, accum=2),
    *(_spec("ddp", 2, b) for b in (*PROBED, UNPROBED)),
    _spec("ddp", 2, 4, accum=2),
)


def _cpu_traces() -> dict[StepSpec, MemoryTrace]:
    return _traces()["cpu"]


def _trace(parallelism: str, world_size: int, b: int, accum: int = 1) -> MemoryTrace:
    return _cpu_traces()[_spec(parallelism, world_size, b, accum)]


# The CUDA target's traces, from the same child: fp16 beside bf16, and fp32 against the CPU's.
_CUDA_SPECS = (
    *(dataclasses.replace(_spec("fsdp", 2, 2, accum=2), precision=p) for p in ("bf16", "fp16")),
    _spec("fsdp", 2, 4),
)


def _cuda_traces() -> dict[StepSpec, MemoryTrace]:
    return _traces()["cuda"]


def _trace_both_targets(
    workload: AdvisorWorkload, specs: dict[str, tuple[StepSpec, ...]]
) -> dict[str, list[MemoryTrace]]:
    """In the child: what trace_distributed_step_memories traces there, per target."""
    from profilers import memory_distributed as md

    return {target: md.trace_in_this_process(workload, s, target) for target, s in specs.items()}


@functools.cache
def _traces() -> dict[str, dict[StepSpec, MemoryTrace]]:
    """Both targets' traces from one child (trace_distributed_step_memories starts one per
    target: it runs below, under trace_distributed_step_memory, and in test_memory_reshard)."""
    specs = {"cpu": _CPU_SPECS, "cuda": _CUDA_SPECS}
    outcome = run_isolated(DEFAULT_ISOLATION, _trace_both_targets, WORKLOAD, specs)
    assert outcome.ok, f"{outcome.reason}\n{outcome.traceback}"
    traced: dict[str, list[MemoryTrace]] = outcome.value
    return {target: {t.spec: t for t in traces} for target, traces in traced.items()}


@functools.cache
def _single(b: int) -> MemoryTrace:
    return trace_single(WORKLOAD, _spec("single", 1, b))


def test_fsdp_per_rank_peak_is_below_single_device_and_shrinks_with_world_size() -> None:
    single, two, four = _single(4), _trace("fsdp", 2, 4), _trace("fsdp", 4, 4)
    assert two.peak_bytes < single.peak_bytes
    assert four.peak_bytes < two.peak_bytes
    # What is gathered for compute, and the buffers that move it, show up at the peak.
    assert two.forward_backward_breakdown.communication > 0


@pytest.mark.parametrize("world_size", [2, 4])
def test_fsdp_shards_parameters_gradients_and_optimizer_state(world_size: int) -> None:
    single, sharded = _single(4), _trace("fsdp", world_size, 4)
    for name in ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes"):
        # Shards are padded to equal sizes: a little over 1/W, never under.
        ratio = getattr(sharded, name) * world_size / getattr(single, name)
        assert 1.0 <= ratio < 1.01, (name, ratio)
    # Between steps a rank holds its shards and their optimizer state, no gradients.
    assert sharded.resident_bytes == pytest.approx(
        sharded.parameter_bytes + sharded.optimizer_state_bytes, rel=1e-3
    )


@pytest.mark.parametrize("parallelism", ["fsdp", "ddp"])
def test_per_rank_peak_is_affine_in_micro_batch(parallelism: str) -> None:
    model = fit_memory([_trace(parallelism, 2, b) for b in PROBED])
    unprobed = _trace(parallelism, 2, UNPROBED)
    assert model.parallelism == parallelism and model.world_size == 2
    assert model.predict(UNPROBED) == pytest.approx(unprobed.peak_bytes, rel=0.05)


@pytest.mark.parametrize("world_size", [4, 8])
def test_a_world_2_fsdp_fit_resharded_matches_the_trace_at_more_ranks(world_size: int) -> None:
    traces = _cpu_traces()
    two = fit_memory(
        [traces[_spec("fsdp", 2, b)] for b in PROBED] + [traces[_spec("fsdp", 2, 4, accum=2)]]
    )
    resharded = two.resharded(world_size)
    assert (resharded.parallelism, resharded.world_size) == ("fsdp", world_size)
    keep = 2 / world_size
    assert two.reshard_points and [b for b, _ in two.reshard_points] == sorted(PROBED)
    state = two.parameter_bytes + two.optimizer_state_bytes
    for b in PROBED:
        truth = traces[_spec("fsdp", world_size, b)].forward_backward_peak_bytes
        # Per window, the sharded bytes at 1/N and the rest as traced: the truth but for
        # FSDP's padding of every shard to equal size (more rows padded at more ranks).
        predicted = resharded.forward_backward.predict(b)
        assert predicted == pytest.approx(truth, rel=0.005)
        # Never above the bound that keeps the sharded gradients live at the peak as traced.
        kept = two.forward_backward.mapped(1.0, -state * (1 - keep)).predict(b)
        assert predicted <= kept + 1024
        assert resharded.optimizer_step.predict(b) == pytest.approx(
            traces[_spec("fsdp", world_size, b)].optimizer_step_peak_bytes, rel=1e-4
        )
    accumulating = traces[_spec("fsdp", world_size, 4, accum=2)]
    assert resharded.predict(4, 2) == pytest.approx(accumulating.peak_bytes, rel=1e-4)
    assert resharded.optimizer_state_bytes == pytest.approx(
        accumulating.optimizer_state_bytes, rel=1e-4
    )
    with pytest.raises(ValueError, match="only FSDP"):
        fit_memory([traces[_spec("ddp", 2, b)] for b in PROBED]).resharded(4)


def test_ddp_keeps_one_gradient_copy_in_its_buckets() -> None:
    single, ddp = _single(4), _trace("ddp", 2, 4)
    gradients = single.gradient_bytes
    # gradient_as_bucket_view: the buckets are the gradients and outlive zero_grad(set_to_none),
    # so they are live at the start of backward, where one device has (almost) no gradient.
    assert ddp.gradient_bytes == gradients
    assert ddp.forward_backward_breakdown.gradients == gradients
    assert single.forward_backward_breakdown.gradients < 0.01 * gradients
    extra = ddp.forward_backward_peak_bytes - single.forward_backward_peak_bytes
    assert extra == pytest.approx(gradients, rel=0.01)
    assert ddp.resident_bytes == single.resident_bytes + gradients
    # No second copy in the optimizer step: the gradients it reads are the buckets.
    assert ddp.optimizer_step_peak_bytes == pytest.approx(
        single.optimizer_step_peak_bytes, rel=1e-3
    )
    assert ddp.parameter_bytes == single.parameter_bytes


def test_accumulation_is_traced_for_both_strategies() -> None:
    # DDP under no_sync(): the reducer is idle, so gradients accumulate in fresh tensors beside
    # the buckets; two copies are live while the last micro-batch runs.
    ddp, ddp_accum = _trace("ddp", 2, 4), _trace("ddp", 2, 4, accum=2)
    gradients = ddp.gradient_bytes
    assert ddp_accum.forward_backward_breakdown.gradients == pytest.approx(2 * gradients, rel=0.01)
    assert ddp_accum.forward_backward_peak_bytes - ddp.forward_backward_peak_bytes == (
        pytest.approx(gradients, rel=0.01)
    )
    # FSDP: the sharded gradients of the first micro-batch are live during the second.
    fsdp, fsdp_accum = _trace("fsdp", 2, 4), _trace("fsdp", 2, 4, accum=2)
    assert fsdp_accum.forward_backward_peak_bytes > fsdp.forward_backward_peak_bytes
    assert fsdp_accum.forward_backward_breakdown.gradients == fsdp.gradient_bytes


def test_an_fp16_fsdp_rank_is_traced_like_a_bf16_one_with_a_loss_scaler_beside_it() -> None:
    # FSDP's fp16 scaler (ShardedGradScaler) updates its scale in Python on a CPU tensor,
    # reading found_inf.item(), which a fake tensor cannot answer: every fp16 FSDP rank trace
    # failed, and no fp16 FSDP candidate could be priced. Same step in bf16 and fp16: the
    # same bytes but the scaler's few scalars (a CUDA block each).
    bf16, fp16 = (_cuda_traces()[spec] for spec in _CUDA_SPECS[:2])
    assert bf16.parameter_bytes == fp16.parameter_bytes
    assert bf16.gradient_bytes == fp16.gradient_bytes
    for name in ("forward_backward_peak_bytes", "optimizer_step_peak_bytes"):
        extra = getattr(fp16, name) - getattr(bf16, name)
        assert 0 < extra <= 8 * CUDA_BLOCK, name


def test_cuda_target_rounds_every_storage_to_512_byte_blocks() -> None:
    cpu = _trace("fsdp", 2, 4)
    cuda = _cuda_traces()[cpu.spec]
    assert cuda.target_device_type == "cuda"
    for name in ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "peak_bytes"):
        assert getattr(cuda, name) % CUDA_BLOCK == 0, name
        assert getattr(cpu, name) <= getattr(cuda, name), name
    # AdamW's step counters are one float each: a whole block apiece on CUDA.
    assert cuda.optimizer_state_bytes > cpu.optimizer_state_bytes
    assert cuda.peak_bytes < 1.01 * cpu.peak_bytes


def test_fits_are_grouped_and_looked_up_by_parallelism_and_world_size() -> None:
    traces = [_single(b) for b in PROBED] + [
        _trace(p, 2, b) for p in ("ddp", "fsdp") for b in PROBED
    ]
    models = fit_memory_models(traces)
    assert [(m.parallelism, m.world_size) for m in models] == [
        ("single", 1),  # first, for callers that look a fit up without the parallelism
        ("ddp", 2),
        ("fsdp", 2),
    ]
    fits = Fits(memory=tuple(models))
    single = fits.memory_model("fp32", "none")
    fsdp = fits.memory_model("fp32", "none", parallelism="fsdp", world_size=2)
    assert single is not None and single.parallelism == "single"
    assert fsdp is not None and fsdp.predict(4) < single.predict(4)
    assert fits.memory_model("fp32", "none", parallelism="fsdp", world_size=8) is None
    with pytest.raises(ValueError, match="parallelism, world_size"):
        fit_memory(traces)


def test_records_round_trip_and_old_records_read_as_single() -> None:
    trace = _trace("fsdp", 2, 4)
    text = json.dumps(trace.to_dict())
    assert MemoryTrace.from_dict(json.loads(text)) == trace
    model = fit_memory([_trace("ddp", 2, b) for b in PROBED])
    assert MemoryModel.from_dict(json.loads(json.dumps(model.to_dict()))) == model
    old = model.to_dict()
    del old["parallelism"], old["world_size"]
    assert MemoryModel.from_dict(old) == dataclasses.replace(
        model, parallelism="single", world_size=1
    )
    breakdown = trace.forward_backward_breakdown.to_dict()
    del breakdown["communication"]
    assert MemoryBreakdown.from_dict(breakdown).communication == 0


def test_bad_requests_fail_before_a_child_starts() -> None:
    with pytest.raises(ValueError, match="trace_step_memory"):
        trace_distributed_step_memory(WORKLOAD, _spec("single", 1, 1))
    with pytest.raises(ValueError, match="target_device_type"):
        trace_distributed_step_memory(WORKLOAD, _spec("fsdp", 2, 1), target_device_type="tpu")


def test_a_failing_trace_raises_with_the_child_reason() -> None:
    hurried = Isolation(timeout_s=0.5, grace_s=0.1)
    with pytest.raises(DistributedTraceError, match=r"fsdp x2 fp32/none/b=1x1 failed \(timeout\)"):
        trace_distributed_step_memory(WORKLOAD, _spec("fsdp", 2, 1), isolation=hurried)


def test_an_fsdp_rank_of_a_model_without_repeated_blocks_is_one_window() -> None:
    # Zamba2's default profile failed every FSDP rank trace with "IndexError: tuple index out
    # of range": the rank was split per block, and a model whose layers are not a ModuleList
    # (Zamba2's share one block) has none. Its root is the one FSDP unit, traced whole.
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "data"
    workload = AdvisorWorkload(f"{data / 'sequential_model.py'}:factory")
    spec = StepSpec(seq_len=32, micro_batch_size=2, parallelism="fsdp", world_size=2)
    rank = trace_distributed_step_memory(workload, spec)
    single = trace_single(workload, dataclasses.replace(spec, parallelism="single", world_size=1))
    assert rank.window_peaks == () and rank.reshard_windows == ()
    assert 0 < rank.peak_bytes < single.peak_bytes
    ratio = rank.parameter_bytes * 2 / single.parameter_bytes
    assert 1.0 <= ratio < 1.01
