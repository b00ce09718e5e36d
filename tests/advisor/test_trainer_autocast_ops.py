"""MoE experts' grouped GEMMs run in the autocast dtype, as every other matmul of the step."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from advisor.trainer.autocast_ops import enable_grouped_mm_autocast

pytestmark = pytest.mark.skipif(
    not hasattr(torch, "_grouped_mm"), reason="this torch has no grouped GEMM"
)

EXPERTS, ROWS, K, N = 4, 24, 16, 8


class GroupedDtypes(TorchDispatchMode):
    """Records the operand dtypes of every grouped GEMM that runs inside."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.dtype, torch.dtype]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._grouped_mm.default:
            self.calls.append((args[0].dtype, args[1].dtype))
        return func(*args, **(kwargs or {}))


def _operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(ROWS, K, generator=gen)
    b = torch.randn(EXPERTS, K, N, generator=gen, requires_grad=True)
    offs = torch.tensor([6, 12, 18, ROWS], dtype=torch.int32)
    return a, b, offs


def test_registration_is_idempotent_and_names_its_keys() -> None:
    keys = enable_grouped_mm_autocast()
    assert keys == enable_grouped_mm_autocast()
    assert "AutocastCPU" in keys and "AutocastCUDA" in keys


def test_under_autocast_the_op_runs_in_its_dtype_and_grads_reach_fp32_weights() -> None:
    enable_grouped_mm_autocast()
    a, b, offs = _operands()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch._grouped_mm(a, b, offs=offs)
    assert out.dtype == torch.bfloat16
    out.float().square().sum().backward()
    assert b.grad is not None and b.grad.dtype == torch.float32
    # the same as casting by hand: the casts are on the autograd graph
    ref_b = b.detach().clone().requires_grad_(True)
    ref = torch._grouped_mm(a.bfloat16(), ref_b.bfloat16(), offs=offs)
    assert torch.equal(out, ref)
    ref.float().square().sum().backward()
    assert ref_b.grad is not None
    assert torch.allclose(b.grad, ref_b.grad)


def test_outside_autocast_and_in_fp32_nothing_changes() -> None:
    enable_grouped_mm_autocast()
    a, b, offs = _operands()
    assert torch._grouped_mm(a, b, offs=offs).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert torch._grouped_mm(a, b, offs=offs).dtype == torch.float32
    # operands already in the autocast dtype pass through as they are
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch._grouped_mm(a.bfloat16(), b.detach().bfloat16(), offs=offs)
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16", torch.bfloat16), ("fp32", torch.float32)]
)
def test_the_training_step_runs_a_mixtrals_experts_in_its_precision(
    precision: str, dtype: torch.dtype
) -> None:
    """Hugging Face casts the routed tokens to the experts' weights' dtype: under bf16 autocast
    over fp32 weights every expert GEMM ran in fp32, forward and backward."""
    pytest.importorskip("transformers")
    from advisor.workload import AdvisorWorkload
    from profilers.workload import StepSpec
    from tests.advisor.test_models import TINY_MIXTRAL

    workload = AdvisorWorkload("hf:mixtral", dict(TINY_MIXTRAL))
    spec = StepSpec(seq_len=16, micro_batch_size=2, precision=precision)
    step = workload.build_step(spec, "cpu")
    batches = step.synthetic_batches()
    with GroupedDtypes() as seen:
        loss, _ = step.step(batches)
    # two layers x two projections, forward, input and weight gradients
    assert len(seen.calls) == 2 * 2 * 3
    assert set(seen.calls) == {(dtype, dtype)}
    assert torch.isfinite(loss)
    experts = [p for n, p in step.model.named_parameters() if "experts" in n]
    assert experts and all(p.dtype == torch.float32 for p in experts)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_bf16_autocast_runs_the_grouped_gemm_in_bf16() -> None:
    """CUDA's fast grouped GEMM is bf16-only: fp32 operands went through torch's per-expert
    fallback loop off the tensor cores."""
    enable_grouped_mm_autocast()
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(256, 128, device="cuda", generator=gen)
    b = torch.randn(4, 128, 64, device="cuda", generator=gen, requires_grad=True)
    offs = torch.tensor([64, 128, 192, 256], dtype=torch.int32, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = torch._grouped_mm(a, b, offs=offs)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert b.grad is not None and b.grad.dtype == torch.float32
    ref = torch._grouped_mm(a.bfloat16(), b.detach().bfloat16(), offs=offs)
    torch.testing.assert_close(out, ref)
