"""Mixture-of-experts grouped GEMMs trace under fake tensors and count their FLOPs; a failing
fake kernel does not print its traceback."""

from __future__ import annotations

import logging

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from profilers.fake_kernels import (
    FAKE_TENSOR_LOGGER,
    fake_errors_unlogged,
    grouped_mm_any_float,
    grouped_mm_flops,
    register_grouped_mm_formula,
)
from profilers.memory import trace_step_memory
from profilers.workload import StepSpec

pytestmark = pytest.mark.skipif(
    not hasattr(torch, "_grouped_mm"), reason="this torch has no grouped GEMM"
)

EXPERTS, ROWS, K, N = 4, 24, 16, 8


def _operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Routed rows sorted by expert, the stacked expert weights, the per-expert row ends."""
    a = torch.randn(ROWS, K, dtype=dtype, requires_grad=True)
    b = torch.randn(EXPERTS, K, N, dtype=dtype, requires_grad=True)
    offs = torch.tensor([5, 11, 11, ROWS], dtype=torch.int32)  # one expert gets no row
    return a, b, offs


def _fake_step(dtype: torch.dtype) -> tuple[torch.Size, torch.dtype, torch.Size]:
    with FakeTensorMode(allow_non_fake_inputs=True):
        a, b, offs = _operands(dtype)
        out = torch._grouped_mm(a, b, offs=offs)
        out.backward(
            torch.ones_like(out)
        )  # sum()'s gradient is an expanded view the kernel refuses
        assert b.grad is not None
        return out.shape, out.dtype, b.grad.shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_torch_own_fake_kernel_refuses_what_the_real_kernels_run(dtype: torch.dtype) -> None:
    # The premise: the real CPU kernel runs fp32/fp16, the meta function asks for bf16.
    a, b, offs = _operands(dtype)
    assert torch._grouped_mm(a, b, offs=offs).shape == (ROWS, N)
    with fake_errors_unlogged(), pytest.raises(RuntimeError, match="BF16"):
        _fake_step(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_within_the_context_every_float_dtype_traces_with_the_real_shapes(
    dtype: torch.dtype,
) -> None:
    a, b, offs = _operands(dtype)
    real = torch._grouped_mm(a, b, offs=offs)
    real.backward(torch.ones_like(real))
    assert b.grad is not None
    with grouped_mm_any_float():
        shape, out_dtype, grad_shape = _fake_step(dtype)
    assert (shape, out_dtype, grad_shape) == (real.shape, real.dtype, b.grad.shape)


def test_the_context_leaves_torch_as_it_found_it() -> None:
    from torch._subclasses import fake_impls

    before = dict(fake_impls.op_implementations_dict)
    with grouped_mm_any_float():
        assert len(fake_impls.op_implementations_dict) == len(before) + 1
    assert fake_impls.op_implementations_dict == before
    with fake_errors_unlogged(), pytest.raises(RuntimeError, match="BF16"):
        _fake_step(torch.float32)


def test_mismatched_dtypes_still_get_torchs_own_check() -> None:
    with grouped_mm_any_float(), fake_errors_unlogged(), FakeTensorMode():
        a = torch.randn(ROWS, K)
        b = torch.randn(EXPERTS, K, N, dtype=torch.bfloat16)
        with pytest.raises(RuntimeError, match="BF16"):
            torch._grouped_mm(a, b, offs=torch.tensor([6, 12, 18, ROWS], dtype=torch.int32))


def test_a_failing_fake_kernel_logs_its_traceback_only_outside_the_quiet_context(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger=FAKE_TENSOR_LOGGER):
        with pytest.raises(RuntimeError):
            _fake_step(torch.float32)
        assert any("grouped_mm" in r.getMessage() for r in caplog.records)
        caplog.clear()
        with fake_errors_unlogged(), pytest.raises(RuntimeError):
            _fake_step(torch.float32)
        assert caplog.records == []
    assert logging.getLogger(FAKE_TENSOR_LOGGER).level != logging.CRITICAL


def test_the_flop_formula_counts_each_routed_row_against_one_expert() -> None:
    assert grouped_mm_flops((ROWS, K), (EXPERTS, K, N), (EXPERTS,), out_shape=(ROWS, N)) == (
        2 * ROWS * K * N
    )
    # the weight gradient: (K, rows) x (rows, N) split by the offsets into one K x N per expert
    assert grouped_mm_flops((K, ROWS), (ROWS, N), (EXPERTS,), out_shape=(EXPERTS, K, N)) == (
        2 * K * ROWS * N
    )
    assert grouped_mm_flops((EXPERTS, 3, K), (EXPERTS, K, N), out_shape=(EXPERTS, 3, N)) == (
        2 * EXPERTS * 3 * K * N
    )


def test_counted_forward_and_backward_equal_three_dense_gemms_of_the_routed_rows() -> None:
    register_grouped_mm_formula()
    assert register_grouped_mm_formula() == []  # idempotent
    a, b, offs = _operands(torch.float32)
    with FlopCounterMode(display=False) as counter:
        out = torch._grouped_mm(a, b, offs=offs)
        out.backward(torch.ones_like(out))
    counts = counter.get_flop_counts()["Global"]
    grouped = sum(n for op, n in counts.items() if "grouped_mm" in str(op))
    # forward, input gradient, weight gradient: each ROWS x K x N multiply-adds
    assert grouped == 3 * 2 * ROWS * K * N


def test_a_hugging_face_mixtral_is_traced_and_counted() -> None:
    pytest.importorskip("transformers")
    from advisor.workload import AdvisorWorkload
    from profilers.flops import count_step_flops
    from tests.advisor.test_models import TINY_MIXTRAL

    workload = AdvisorWorkload("hf:mixtral", TINY_MIXTRAL)
    for precision in ("fp32", "bf16"):
        spec = StepSpec(seq_len=32, micro_batch_size=2, precision=precision)
        trace = trace_step_memory(workload, spec)
        assert trace.peak_bytes > trace.parameter_bytes > 0
    count = count_step_flops(workload, StepSpec(seq_len=32, micro_batch_size=2))
    per_token = count.flops_by_op["none"]["aten._grouped_mm"]
    # two of four experts per token, each a gated FFN (gate+up: 64 -> 2x96, down: 96 -> 64),
    # forward and two backward GEMMs, in each of the two layers
    assert per_token == pytest.approx(2 * 2 * 3 * 2 * (64 * 2 * 96 + 96 * 64))


def _sdpa_calls(workload: object, spec: StepSpec) -> list[tuple[bool, int, int, bool]]:
    """Each SDPA call of a CUDA target's trace of ``workload``: whether it got a mask, the
    query's and the key's heads, and enable_gqa."""
    functional = torch.nn.functional
    sdpa = functional.scaled_dot_product_attention
    calls: list[tuple[bool, int, int, bool]] = []

    def spy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: object, **kw: object):  # type: ignore[no-untyped-def]
        mask = kw.get("attn_mask", args[0] if args else None)
        calls.append((mask is not None, q.shape[1], k.shape[1], bool(kw.get("enable_gqa"))))
        return sdpa(q, k, v, *args, **kw)

    functional.scaled_dot_product_attention = spy
    try:
        trace_step_memory(workload, spec, target_device_type="cuda")  # type: ignore[arg-type]
    finally:
        functional.scaled_dot_product_attention = sdpa
    return calls


def test_a_hugging_face_trace_finds_no_packed_rows_and_keeps_kv_heads_unrepeated() -> None:
    """transformers cannot read fake position ids and assumed packed rows: a materialised
    causal mask, and with it k and v repeated to every query head. A real step passes token ids
    only (no packing): no mask, SDPA's grouped-query path. So does the trace now."""
    pytest.importorskip("transformers")
    from advisor.workload import AdvisorWorkload
    from tests.advisor.test_models import TINY_DECODER

    workload = AdvisorWorkload("hf:llama", {**TINY_DECODER, "num_attention_heads": 4})
    spec = StepSpec(seq_len=32, micro_batch_size=2, precision="bf16")
    calls = _sdpa_calls(workload, spec)
    assert calls and set(calls) == {(False, 4, 1, True)}  # one per traced step


def test_real_position_ids_still_get_transformers_own_answer() -> None:
    """Outside fake tensors the detection is transformers' own: packed rows are found."""
    masking_utils = pytest.importorskip("transformers.masking_utils")
    from profilers.fake_kernels import unpacked_rows

    packed = torch.tensor([[0, 1, 2, 0, 1, 0]])
    layer = torch.nn.Linear(1, 1)
    with unpacked_rows():
        layer(torch.zeros(1))  # the first forward patches
        found = masking_utils.find_packed_sequence_indices(packed)
        with FakeTensorMode():
            assert masking_utils.find_packed_sequence_indices(torch.arange(6)[None]) is None
    assert found is not None and found.tolist() == [[0, 0, 0, 1, 1, 2]]
    assert masking_utils.find_packed_sequence_indices.__module__ == masking_utils.__name__
