"""Autocast for the ops torch's autocast lists leave out: the grouped GEMMs of MoE experts.

``torch._grouped_mm`` (what Hugging Face transformers 5.x runs every mixture-of-experts
layer's experts through: one call per projection, the routed tokens sorted by expert times the
stacked expert weights) is not on autocast's op lists (pytorch/pytorch#174763, open), and
transformers casts the tokens to the *weights'* dtype before calling it so that the dtypes
match. Under ``torch.autocast(dtype=bfloat16)`` over fp32 master weights — this trainer's
single-device and DDP steps, and the usual mixed-precision recipe — every expert GEMM therefore
ran in **fp32**, forward and backward, while every other matmul ran in bf16: on a GPU the
experts missed the tensor cores (torch's CUDA kernel for the op is a CUTLASS grouped GEMM for
bf16 only; other dtypes loop over the experts with one ``mm`` each), and the activations saved
for their backward were fp32. FSDP's bf16 parameter policy hid it (the weights are already
bf16 when the op runs).

:func:`enable_grouped_mm_autocast` registers, once per process, an autocast kernel for the op
on the CPU and CUDA autocast keys with the policy autocast applies to ``mm``: floating inputs
other than fp64 are cast to the autocast dtype and the op runs below autocast, the casts
recorded by autograd (so gradients flow back to the fp32 weights in fp32). Nothing changes
outside an autocast region. The trainer's step registers it (:class:`advisor.trainer.step.
AdvisorStep`), and so does every probe, which runs the same step.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

# The dispatch keys and the libraries holding their kernels (a registration lives as long as its
# Library object: kept for the process).
_LIBRARIES: dict[str, Any] = {}
_LOCK = threading.Lock()
GROUPED_MM_DEVICES: tuple[str, ...] = ("cpu", "cuda")


def _grouped_mm() -> Any:
    return getattr(torch.ops.aten, "_grouped_mm", None)


def _castable(value: Any, dtype: torch.dtype) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.dtype not in (dtype, torch.float64)
    )


def _kernel_for(device_type: str, key: Any) -> Any:
    excluded = torch._C.DispatchKeySet(key)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.get_autocast_dtype(device_type)
        cast = [a.to(dtype) if _castable(a, dtype) else a for a in args]
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            return _grouped_mm().default(*cast, **kwargs)

    return kernel


def enable_grouped_mm_autocast() -> list[str]:
    """Register the autocast kernel of ``aten::_grouped_mm`` (see the module docstring) on
    the devices of :data:`GROUPED_MM_DEVICES` that have no autocast kernel for it yet;
    idempotent. Returns the dispatch keys registered by this process so far (none where torch
    lacks the op, or already casts it itself)."""
    op = _grouped_mm()
    if op is None:
        return []
    with _LOCK:
        for device_type in GROUPED_MM_DEVICES:
            name = "Autocast" + torch._C._dispatch_key_for_device(device_type)
            key = getattr(torch._C.DispatchKey, name, None)
            if name in _LIBRARIES or key is None:
                continue
            if torch._C._dispatch_has_kernel_for_dispatch_key(op.default.name(), name):
                continue  # torch casts it itself (a later release)
            library = torch.library.Library("aten", "IMPL")
            library.impl("_grouped_mm", _kernel_for(device_type, key), name)
            _LIBRARIES[name] = library
        return sorted(_LIBRARIES)
