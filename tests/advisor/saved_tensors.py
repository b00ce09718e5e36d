"""What autograd keeps for backward: the model-block memory tests read it off saved tensors."""

from __future__ import annotations

import torch


def saved_activations(module: torch.nn.Module, *inputs: torch.Tensor) -> list[torch.Tensor]:
    """Every distinct tensor storage autograd keeps for backward, except the parameters (under
    bf16 autocast on the inputs' device)."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    kept: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if (ptr := t.untyped_storage().data_ptr()) not in params:
            kept.setdefault(ptr, t)
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with hooks, torch.autocast(inputs[0].device.type, dtype=torch.bfloat16):
        module(*inputs)
    return list(kept.values())
