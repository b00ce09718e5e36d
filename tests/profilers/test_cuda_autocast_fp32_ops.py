"""A CUDA target's trace applies CUDA's autocast policy to the norms (fp32 layer_norm/group_norm)
and to a softmax given no dtype.

CPU autocast leaves ``layer_norm`` in its input's dtype; CUDA's casts it to fp32 and keeps the
fp32 input for backward. The trace runs on CPU, so for a CUDA target it casts as CUDA does.
"""

from __future__ import annotations

import torch
from torch import nn

from profilers.memory_tracing import cuda_autocast_fp32_ops


def saved(module: nn.Module, x: torch.Tensor) -> tuple[torch.dtype, set[tuple[torch.dtype, tuple]]]:
    """(output dtype, (dtype, shape) of every tensor autograd keeps) under CPU autocast."""
    kept: set[tuple[torch.dtype, tuple]] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.add((t.dtype, tuple(t.shape)))
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with hooks, torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(x)
    return out.dtype, kept


def test_a_16_bit_layer_norm_keeps_an_fp32_input_as_on_cuda() -> None:
    norm = nn.LayerNorm(64).to(torch.bfloat16)
    x = torch.randn(8, 64, dtype=torch.bfloat16, requires_grad=True)
    cpu_dtype, cpu_kept = saved(norm, x)
    with cuda_autocast_fp32_ops():
        cuda_dtype, cuda_kept = saved(norm, x)
    assert (cpu_dtype, cuda_dtype) == (torch.bfloat16, torch.float32)
    # The input is kept as an fp32 upcast (4 bytes an element) instead of itself (2 bytes).
    assert (torch.bfloat16, (8, 64)) in cpu_kept and (torch.float32, (8, 64)) not in cpu_kept
    assert (torch.float32, (8, 64)) in cuda_kept and (torch.bfloat16, (8, 64)) not in cuda_kept
    group = nn.GroupNorm(4, 64).to(torch.bfloat16)
    with cuda_autocast_fp32_ops():
        assert saved(group, x.view(8, 64, 1))[0] == torch.float32


def test_nothing_changes_without_autocast_or_after_the_trace() -> None:
    norm = nn.LayerNorm(16).to(torch.bfloat16)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    with cuda_autocast_fp32_ops():
        assert norm(x).dtype == torch.bfloat16  # autocast off: nothing cast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert norm(x).dtype == torch.bfloat16  # the patch is gone
    assert torch.nn.functional.layer_norm.__module__ == "torch.nn.functional"


def test_a_softmax_without_dtype_runs_in_fp32_as_on_cuda_and_one_with_dtype_is_left_alone() -> None:
    """A hand-written attention's ``softmax(scores)`` under autocast: fp32 on CUDA (its
    autocast lists softmax among the ops that run in fp32), the input's dtype under CPU's."""
    import torch.nn.functional as F

    x = torch.randn(4, 8, dtype=torch.bfloat16)
    calls = (
        lambda: F.softmax(x, dim=-1),
        lambda: F.log_softmax(x, -1),
        lambda: torch.softmax(x, -1),
        lambda: torch.log_softmax(x, dim=-1),
        lambda: x.softmax(-1),
        lambda: x.log_softmax(dim=-1),
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert {call().dtype for call in calls} == {torch.bfloat16}
        with cuda_autocast_fp32_ops():
            assert {call().dtype for call in calls} == {torch.float32}
            # an explicit dtype is what it asks for, by keyword or by position
            assert F.softmax(x, dim=-1, dtype=torch.bfloat16).dtype == torch.bfloat16
            assert torch.softmax(x, -1, torch.bfloat16).dtype == torch.bfloat16
            assert x.softmax(-1, torch.bfloat16).dtype == torch.bfloat16
            assert F.softmax(x.float(), dim=-1).dtype == torch.float32
    with cuda_autocast_fp32_ops():
        assert x.softmax(-1).dtype == torch.bfloat16  # autocast off: nothing cast
    assert x.softmax(-1).dtype == torch.bfloat16 and torch.Tensor.softmax.__name__ == "softmax"
