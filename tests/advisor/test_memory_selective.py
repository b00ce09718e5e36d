"""Memory of the selective checkpointing settings: traced exactly, scaled where blocks are alike,
and blocks:K priced for any K from the measured settings (from their windows:
tests/profilers/test_checkpointing_windows.py, which also holds the line in K on the safe side)."""

from __future__ import annotations

import itertools

import pytest

from advisor.workload import AdvisorWorkload
from profilers.memory import measure_cpu_step_peak, trace_step_memory
from profilers.memory_blocks import SCALE_FROM_BLOCKS, trace_scaled
from profilers.memory_model import fit_memory_models
from profilers.memory_records import BYTE_COUNT_FIELDS, MemoryTrace
from profilers.memory_tracing import trace
from profilers.profile_record import Fits
from profilers.workload import StepSpec

FIELDS = BYTE_COUNT_FIELDS


@pytest.mark.parametrize(
    ("model", "precision", "micro", "accum", "cuda"),
    [
        ("gpt-tiny", "fp32", 4, 2, False),
        pytest.param("llama-tiny", "bf16", 2, 1, True, marks=pytest.mark.slow),
    ],
)
def test_the_scaled_ops_trace_equals_the_whole_one(
    model: str, precision: str, micro: int, accum: int, cuda: bool
) -> None:
    workload = AdvisorWorkload(model=model, model_args={"n_layer": 6})
    spec = StepSpec(
        seq_len=32,
        micro_batch_size=micro,
        grad_accum_steps=accum,
        precision=precision,
        activation_checkpointing="ops",
    )
    whole = trace(workload, spec, cuda_rounding=cuda)
    scaled = trace_scaled(workload, spec, cuda_rounding=cuda, num_layers=6)
    assert scaled.scaled_from_blocks == SCALE_FROM_BLOCKS
    for field in FIELDS:
        assert getattr(scaled, field) == getattr(whole, field), field
    assert scaled.breakdown == whole.breakdown


def test_blocks_k_is_traced_whole_not_scaled() -> None:
    workload = AdvisorWorkload(model="gpt-tiny", model_args={"n_layer": 6})
    spec = StepSpec(seq_len=32, micro_batch_size=2, activation_checkpointing="blocks:3")
    with pytest.raises(ValueError, match="trace the whole model"):
        trace_scaled(workload, spec, cuda_rounding=False, num_layers=6)
    traced = trace_step_memory(workload, spec)
    assert traced.scaled_from_blocks is None
    assert traced.peak_bytes == trace(workload, spec, cuda_rounding=False).peak_bytes


def test_traces_of_selective_settings_match_the_allocator() -> None:
    workload = AdvisorWorkload(model="gpt-tiny", model_args={"n_layer": 4})
    for setting in ("ops", "blocks:2"):
        spec = StepSpec(seq_len=64, micro_batch_size=4, activation_checkpointing=setting)
        traced = trace_step_memory(workload, spec).peak_bytes
        truth = measure_cpu_step_peak(workload, spec)
        assert abs(traced - truth) / truth <= 0.01, setting


SMALL = {"n_layer": 3, "n_embd": 32, "n_head": 2, "block_size": 128}


def _traces(
    workload: AdvisorWorkload, settings: tuple[str, ...], sizes: tuple[int, ...] = (4, 8)
) -> dict[str, list[MemoryTrace]]:
    return {
        s: [
            trace_step_memory(
                workload, StepSpec(seq_len=128, micro_batch_size=b, activation_checkpointing=s)
            )
            for b in sizes
        ]
        for s in settings
    }


def _errors(
    traced: dict[str, list[MemoryTrace]], anchors: tuple[str, ...], layers: int
) -> dict[str, float]:
    """(line - traced) / traced of every traced blocks:K not among ``anchors``, worst size."""
    fits = Fits(memory=tuple(fit_memory_models(t for s in anchors for t in traced[s])))
    out = {}
    for setting in (f"blocks:{k}" for k in range(1, layers)):
        if setting in anchors:
            continue
        assert fits.memory_model("fp32", setting) is None  # not without the model's depth
        model_k = fits.memory_model("fp32", setting, num_layers=layers)
        assert model_k is not None and model_k.activation_checkpointing == setting
        errors = [
            (model_k.predict(t.spec.micro_batch_size) - t.peak_bytes) / t.peak_bytes
            for t in traced[setting]
        ]
        out[setting] = max(errors, key=abs)
    return out


def test_blocks_k_memory_is_exact_where_one_moment_holds_the_peak() -> None:
    # Small hidden size: the loss's moment holds the peak for every K, so the line is exact,
    # and so is the model from the windows (with the middle: blocks:2 of 3).
    workload = AdvisorWorkload(model="gpt-tiny", model_args=SMALL)
    settings = ("none", "blocks:1", "blocks:2", "full")
    traced = _traces(workload, settings)
    for i in range(2):
        peaks = [traced[s][i].forward_backward_peak_bytes for s in settings]
        steps = {a - b for a, b in itertools.pairwise(peaks)}
        assert len(steps) == 1 and steps.pop() > 0  # one block's activations per block
    ops = _traces(workload, ("ops",), (8,))["ops"][0].forward_backward_peak_bytes
    assert peaks[0] > ops > peaks[-1]
    for anchors in (("none", "blocks:1", "full"), ("none", "full")):
        for error in _errors(traced, anchors, 3).values():
            assert abs(error) < 1e-6
