"""What the built-in model families share: weight initialisation, shape checks, a LayerNorm."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from advisor.errors import UsageProblem


@torch.no_grad()
def init_parameters(module: nn.Module, matrix: Callable[[str, nn.Parameter], object]) -> None:
    """Initialise every parameter in registration order (so the same seed gives the same
    weights): matrices by ``matrix(name, p)``, biases to 0, norm scales to 1."""
    for name, p in module.named_parameters():
        if p.dim() >= 2:
            matrix(name, p)
        elif name.endswith("bias"):
            nn.init.zeros_(p)
        else:
            nn.init.ones_(p)


def check_length(length: int, limit: int, field: str) -> None:
    """A ValueError naming the fix when a batch's sequences are longer than the model allows
    (``field``: the config field that sets the limit)."""
    if length > limit:
        raise ValueError(
            f"sequence length {length} exceeds the model's {field} {limit}: use a shorter "
            f"--seq-len or --model-arg {field}={length}"
        )


def check_sizes(config: object, *fields: str) -> None:
    """A UsageProblem naming the field and the fix unless each of ``fields`` is a whole number
    of at least 1. A config's sizes come from ``--model-arg`` as any JSON value; below 1, a
    depth divides by zero in init, a head count by zero in the width check, and a width, vocab
    or length builds a model that fails at its first step, or a profile whose probes all fail."""
    for name in fields:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageProblem(
                f"--model-arg {name}={value}: {name} must be a whole number of at least 1"
            )
        if value < 1:
            raise UsageProblem(f"--model-arg {name}={value}: {name} must be at least 1")


def check_heads(n_embd: int, n_head: int) -> None:
    """A ValueError naming the fix when the attention heads do not split the width."""
    if n_embd % n_head:
        raise ValueError(
            f"n_embd ({n_embd}) must be divisible by n_head ({n_head}): fix the --model-arg values"
        )


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """What a norm computes in: fp32, or fp64 for an fp64 input."""
    return torch.promote_types(x.dtype, torch.float32)


def norm_output_dtype(x: torch.Tensor) -> torch.dtype:
    """A norm's output dtype: autocast's when it is on for ``x``'s device (what the projections
    reading it would cast to), else ``x``'s own."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


class _LayerNormFunction(torch.autograd.Function):
    """``native_layer_norm`` in fp32 (fp64 for fp64) that keeps its input in the input's own
    dtype, and returns its output in ``out_dtype``; backward is ``native_layer_norm_backward``.

    CUDA's autocast runs ``layer_norm`` in fp32 (its fp32 op list) and keeps the upcast input
    for backward: on an FSDP rank with bf16 parameters (a bf16 residual stream) 4 bytes per
    element where the input itself holds 2, and each projection casts the fp32 output back.
    CPU's autocast does not upcast ``layer_norm``, so the CPU-traced memory (what the profiler
    predicts from) never counted that copy; with this Function CUDA keeps what the trace
    counts. Forward and backward values are those of ``F.layer_norm`` in fp32 (the same kernels
    on the same fp32 values).
    """

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        compute = compute_dtype(x)
        w = None if weight is None else weight.to(compute)
        b = None if bias is None else bias.to(compute)
        out, mean, rstd = torch.native_layer_norm(x.to(compute), (x.shape[-1],), w, b, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return out.to(out_dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, bias, mean, rstd = ctx.saved_tensors
        compute = mean.dtype
        w = None if weight is None else weight.to(compute)
        b = None if bias is None else bias.to(compute)
        needs = ctx.needs_input_grad
        mask = [needs[0], weight is not None and needs[1], bias is not None and needs[2]]
        grad_x, grad_w, grad_b = torch.ops.aten.native_layer_norm_backward(
            grad.to(compute), x.to(compute), [x.shape[-1]], mean, rstd, w, b, mask
        )
        return (
            None if grad_x is None else grad_x.to(x.dtype),
            None if grad_w is None or weight is None else grad_w.to(weight.dtype),
            None if grad_b is None or bias is None else grad_b.to(bias.dtype),
            None,
            None,
        )


class InputLayerNorm(nn.LayerNorm):
    """An ``nn.LayerNorm`` (same parameters, same values) for a norm whose output only feeds
    projections (pre-LN blocks, the final norm before the head): it keeps its input in the
    input's own dtype and, under autocast, returns its output in the autocast dtype (what each
    projection would cast it to anyway). Over the last dimension only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.normalized_shape) != 1:
            return super().forward(x)
        out_dtype = norm_output_dtype(x)
        out: torch.Tensor = _LayerNormFunction.apply(x, self.weight, self.bias, self.eps, out_dtype)
        return out
