"""A deep model's memory traced from two shallow copies equals its whole trace, byte for byte.

profilers.memory_blocks extends traces of 2- and 3-block copies to the model's depth, window by
window (memory_tracing._StepMemTracker.split_after); here the presets, whose blocks are
identical, are traced both ways under the settings where the peak moves between windows:
accumulation, checkpointing, bf16 autocast (its cache of weight copies lives until the
forward's autocast exits), and the CUDA allocator's rounding.
"""

from __future__ import annotations

import pytest

from advisor.workload import AdvisorWorkload
from profilers.memory import trace_step_memory
from profilers.memory_blocks import MIN_LAYERS_TO_SCALE, SCALE_FROM_BLOCKS, trace_scaled
from profilers.memory_records import BYTE_COUNT_FIELDS
from profilers.memory_tracing import trace
from profilers.workload import BlockScalableWorkload, StepSpec

CASES = [
    # model, precision, checkpointing, micro-batch, accumulation, CUDA rounding
    ("gpt-tiny", "bf16", "full", 4, 2, False),  # the autocast window decides the peak
    ("gpt-tiny", "fp32", "none", 1, 1, True),
    ("llama-tiny", "fp32", "full", 4, 2, True),
    ("bert-tiny", "bf16", "none", 4, 1, False),
]


@pytest.mark.parametrize(("model", "precision", "ckpt", "micro", "accum", "cuda"), CASES)
def test_the_scaled_trace_equals_the_whole_one(
    model: str, precision: str, ckpt: str, micro: int, accum: int, cuda: bool
) -> None:
    workload = AdvisorWorkload(model=model, model_args={"n_layer": 6})
    spec = StepSpec(
        seq_len=32,
        micro_batch_size=micro,
        grad_accum_steps=accum,
        precision=precision,
        activation_checkpointing=ckpt,
    )
    whole = trace(workload, spec, cuda_rounding=cuda)
    scaled = trace_scaled(workload, spec, cuda_rounding=cuda, num_layers=6)
    assert scaled.scaled_from_blocks == SCALE_FROM_BLOCKS and whole.scaled_from_blocks is None
    for field in BYTE_COUNT_FIELDS:
        assert getattr(scaled, field) == getattr(whole, field), field
    assert scaled.breakdown == whole.breakdown


def test_the_probe_scales_deep_models_only() -> None:
    spec = StepSpec(seq_len=16, micro_batch_size=1)
    deep = AdvisorWorkload(model="gpt-tiny", model_args={"n_layer": MIN_LAYERS_TO_SCALE})
    shallow = AdvisorWorkload(model="gpt-tiny", model_args={"n_layer": MIN_LAYERS_TO_SCALE - 1})
    assert isinstance(deep, BlockScalableWorkload)
    assert trace_step_memory(deep, spec).scaled_from_blocks == SCALE_FROM_BLOCKS
    assert trace_step_memory(shallow, spec).scaled_from_blocks is None


def test_a_shallow_copy_keeps_everything_but_the_later_blocks() -> None:
    workload = AdvisorWorkload(model="llama-tiny", model_args={"n_layer": 6})
    full, cut = workload.build_adapter(meta=True), workload.with_blocks(2).build_adapter(meta=True)
    assert len(full.blocks()) == 6 and len(cut.blocks()) == 2
    names = {n for n, _ in cut.module.named_parameters()}
    assert names == {
        n
        for n, _ in full.module.named_parameters()
        if not n.startswith(("blocks.2", "blocks.3", "blocks.4", "blocks.5"))
    }
    assert workload.with_blocks(2).facts().num_layers == 2 and workload.facts().num_layers == 6


@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny", "bert-tiny"])
def test_flops_of_a_deep_model_are_counted_from_shallow_copies_op_by_op(model: str) -> None:
    import dataclasses

    from profilers.flops import _count, count_step_flops

    workload = AdvisorWorkload(model=model, model_args={"n_layer": MIN_LAYERS_TO_SCALE})
    spec = StepSpec(seq_len=16, micro_batch_size=1)
    counted = count_step_flops(workload, spec)
    assert counted.scaled_from_blocks == SCALE_FROM_BLOCKS
    for mode, by_op in counted.flops_by_op.items():
        whole = _count(workload, dataclasses.replace(spec), mode, fake=True)
        assert {op: round(n * counted.tokens) for op, n in by_op.items()} == whole, mode
    shallow = AdvisorWorkload(model=model, model_args={"n_layer": MIN_LAYERS_TO_SCALE - 1})
    assert count_step_flops(shallow, spec).scaled_from_blocks is None
