"""State-space (Mamba) and linear-attention layers traced as their CUDA kernels hold memory,
for a CUDA target.

Hugging Face transformers (5.x) runs the scan of every Mamba-style layer it ships through a
function that takes ``mamba_ssm``'s CUDA kernel when that package is installed and the inputs
are on a GPU, and its own PyTorch implementation otherwise (``use_kernel_func_from_hub_with_
fallback``). A fake-tensor trace runs on (fake) CPU tensors, so it always took the PyTorch path,
and for a GPU that path is not what trains:

* **Mamba-1** (Jamba, Zamba, Falcon-Mamba, Mamba): ``mamba_selective_scan`` ->
  ``mamba_ssm.selective_scan_fn``. The PyTorch path materialises the discretised ``A`` and
  ``B·u`` over (batch, channels, sequence, state) in fp32 and loops over positions, keeping one
  state per position for backward: for Jamba (8,192 channels, state 16) ~6 GiB per layer per
  4,096-token sequence. The kernel (``SelectiveScanFn``, mamba_ssm/ops/selective_scan_interface
  .py) keeps its inputs (``u``, ``delta``, ``B``, ``C``, ``z``, contiguous copies where they
  were not), its output before the gate and its chunk states ``x``: (batch, channels,
  ceil(L/2048), 2·state) fp32; it returns the gated output.
* **Mamba-2** (Bamba, Falcon-H1, Nemotron-H, Zamba2, Mamba2, Granite 4 hybrids): in training
  the mixer calls ``mamba2_split_conv1d_scan_combined`` -> ``mamba_ssm.
  mamba_split_conv1d_scan_combined``, which fuses the convolution, the chunked scan, the gated
  RMSNorm and the output projection; without the package it returns None and the PyTorch
  chunked scan runs, which keeps (chunk × chunk × heads) fp32 score blocks per chunk. The kernel
  (``MambaSplitConv1dScanCombinedFn``, mamba_ssm/ops/triton/ssd_combined.py) keeps for backward
  its input ``zxbcdt``, the scan's output ``out_x`` (before the norm), the norm's ``rstd`` and,
  under autocast, the 16-bit copy of the output projection's weight; the convolution, the chunk
  states and the gate are recomputed in backward.
* **Gated delta rule** (linear attention: Qwen3-Next, Qwen3.5 and Qwen3.5-MoE, OLMo hybrid):
  ``torch_chunk_gated_delta_rule`` -> ``fla.chunk_gated_delta_rule`` (flash-linear-attention).
  The PyTorch path casts q, k, v, the gate and beta to fp32, repeats q and k to every value
  head and loops over 64-position chunks, keeping each chunk's fp32 state. The kernel
  (``ChunkGatedDeltaRuleFunction``, fla/ops/gated_delta_rule/chunk.py) keeps its inputs (q and
  k l2-normalised, with their fp32 inverse norms), the chunk-local cumulative gate and the
  solved WY matrix A (positions × heads × 64), and recomputes the chunk states in backward. It
  keeps the dtypes it is given (some releases refused fp32 inputs; the current source accepts
  them).

:func:`ssm_cuda_kernels` gives those functions, while a CUDA target's trace runs, fake
kernels (``torch.autograd.Function``) that allocate what the kernels allocate and keep what they
keep: the saved tensors exactly as the sources above list them; the forward's and the backward's
internal buffers (the convolution's output, the chunk states, the gradients) at the sizes those
sources allocate, freed as they free them. Their values are never read (a fake tensor has
none). Patched per modeling module, at the first forward of one of its modules (transformers
imports a model's module when it builds it, inside the trace).

**Their work** (:func:`counting_kernel_work`): inside a FLOP count the fakes add the FLOPs of
what the kernels compute, under the op names a count holds (their convolutions as
``aten.convolution`` and ``aten.convolution_backward``, the fused Mamba-2 kernel's output
projection's gradients as ``aten.mm``, the scans as the kernel's name and ``<name>_backward``),
and record per call the elements they read and write, for a what-if to price the scans at the
GPU's memory bandwidth (they are memory-bound). Only matmul-class work is counted, as
``FlopCounterMode`` counts it everywhere else: the selective scan's contraction of its states
with ``C`` (2·N per channel and position; the discretisation and the recurrence are element-
wise), the SSD's chunked matmuls (C·Bᵀ per group, its product with x, the chunk states B·x and
their readout C·h, per head; the chunk's full Q×Q block), each kernel's backward the gradients
of those (2× forward) plus what it recomputes (Mamba-1's scan from its chunk states, Mamba-2's
convolution, chunk states and C·Bᵀ). So a count of a hybrid runs no Python loop over positions:
transformers' PyTorch scan made Jamba's count (sequence 4096) take minutes.

Whether a GPU run takes the kernels depends on the machine: with ``mamba-ssm`` (and
``causal-conv1d``) installed, transformers uses them; without, it warns ("falling back to its
reference PyTorch implementation ... much slower") and runs the PyTorch path. On a host with a
GPU the trace follows what is installed there; on one without (a CPU host profiling for a GPU,
a what-if) the kernels are assumed: it is how these models are trained, and the PyTorch path's
memory would plan a GPU for a step nobody runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

# The transformers functions replaced, by their name in a modeling module, and the mamba_ssm
# kernel each stands for.
KERNEL_FUNCTIONS: dict[str, str] = {
    "mamba_selective_scan": "mamba_ssm.selective_scan_fn",
    "mamba2_split_conv1d_scan_combined": "mamba_ssm.mamba_split_conv1d_scan_combined",
    "causal_conv1d_fn": "causal_conv1d.causal_conv1d_fn",
    "torch_chunk_gated_delta_rule": "fla.chunk_gated_delta_rule",
}
SCAN = KERNEL_FUNCTIONS["mamba_selective_scan"]
SSD = KERNEL_FUNCTIONS["mamba2_split_conv1d_scan_combined"]
CONV = KERNEL_FUNCTIONS["causal_conv1d_fn"]
GATED_DELTA = KERNEL_FUNCTIONS["torch_chunk_gated_delta_rule"]
# fla's chunked gated delta rule works in chunks of 64 positions whatever it is given.
GATED_DELTA_CHUNK = 64
# The op names the convolutions and the output projection's gradients are counted under, as
# FlopCounterMode counts the PyTorch path's.
CONVOLUTION, MATMUL = "aten.convolution", "aten.mm"
# selective_scan_fn keeps one state (2·d_state fp32) per 2,048 positions: its chunk length.
SELECTIVE_SCAN_CHUNK = 2048
MODELING_PREFIX = "transformers.models."


# What a record of a kernel's work holds (per call, summed over a step's calls): its calls, and
# per direction the FLOPs (also in the count, under the op names above) and the elements it
# reads and writes in the activations' dtype and in fp32 (its chunk states and some gradients
# are fp32 whatever the activations' dtype).
WORK_FIELDS: tuple[str, ...] = (
    "calls",
    "forward_flops",
    "backward_flops",
    "forward_elements",
    "forward_fp32_elements",
    "backward_elements",
    "backward_fp32_elements",
)


@dataclasses.dataclass
class KernelWork:
    """What the fake kernels did in one step: FLOPs per counted op name, and per kernel (its
    :data:`KERNEL_FUNCTIONS` value) the fields of :data:`WORK_FIELDS`."""

    flops: Counter[str] = dataclasses.field(default_factory=Counter)
    kernels: dict[str, Counter[str]] = dataclasses.field(default_factory=dict)

    def add(
        self,
        kernel: str,
        backward: bool,
        flops: dict[str, float],
        elements: float,
        fp32_elements: float = 0.0,
    ) -> None:
        record = self.kernels.setdefault(kernel, Counter())
        side = "backward" if backward else "forward"
        if not backward:
            record["calls"] += 1
        record[f"{side}_flops"] += int(sum(flops.values()))
        record[f"{side}_elements"] += int(elements)
        record[f"{side}_fp32_elements"] += int(fp32_elements)
        for op, n in flops.items():
            self.flops[op] += int(n)


_WORK: list[KernelWork] = []


@contextlib.contextmanager
def counting_kernel_work() -> Iterator[KernelWork]:
    """Inside, the fake kernels record their work (module docstring) in the yielded record."""
    work = KernelWork()
    _WORK.append(work)
    try:
        yield work
    finally:
        _WORK.remove(work)


def _record(
    kernel: str,
    backward: bool,
    flops: dict[str, float],
    elements: float,
    fp32_elements: float = 0.0,
) -> None:
    for work in _WORK:
        work.add(kernel, backward, flops, elements, fp32_elements)


def _replaceable(name: str) -> dict[str, Any]:
    """The functions of :data:`KERNEL_FUNCTIONS` that the transformers modeling module ``name``
    defines (empty for any other module)."""
    owner = sys.modules.get(name) if name.startswith(MODELING_PREFIX) else None
    found = {attr: getattr(owner, attr, None) for attr in KERNEL_FUNCTIONS}
    return {attr: f for attr, f in found.items() if callable(f)}


def kernels_of(model: Any) -> tuple[str, ...]:
    """The mamba_ssm/causal_conv1d kernels ``model``'s layers can call: those the transformers
    modeling modules of its submodules define a replaceable function for (sorted)."""
    names = {type(m).__module__ for m in model.modules()}
    return tuple(sorted({KERNEL_FUNCTIONS[a] for name in names for a in _replaceable(name)}))


def kernel_package(kernel: str) -> str:
    """The package a kernel of :data:`KERNEL_FUNCTIONS` comes from (``mamba_ssm``)."""
    return kernel.split(".")[0]


def kernels_expected() -> frozenset[str]:
    """The kernel packages (``mamba_ssm``, ``causal_conv1d``) whose kernels a CUDA run of a
    transformers state-space layer takes, as far as this host can tell: on a host with a GPU,
    those importable there (transformers falls back per function: a host with mamba-ssm but
    without causal-conv1d runs the scan's kernel and the PyTorch convolution); on one without
    (planning a GPU it does not have), all of them (see the module docstring)."""
    import torch

    packages = {kernel_package(k) for k in KERNEL_FUNCTIONS.values()}
    if not torch.cuda.is_available():
        return frozenset(packages)
    return frozenset(p for p in packages if importlib.util.find_spec(p) is not None)


@contextlib.contextmanager
def ssm_cuda_kernels(
    used: list[str] | None = None, packages: frozenset[str] | None = None
) -> Iterator[None]:
    """Inside, each transformers modeling module whose module runs a forward has its state-space
    scan functions (:data:`KERNEL_FUNCTIONS`) replaced by fake CUDA kernels, those of
    ``packages`` only (None: all); ``used`` (if given) collects the kernels a trace ran as
    ``"<kernel> (<model module>)"``."""
    import torch

    fakes: dict[str, Callable[..., Any]] = {
        "mamba_selective_scan": _selective_scan_fn(used),
        "mamba2_split_conv1d_scan_combined": _split_conv1d_scan_combined(used),
        "causal_conv1d_fn": _causal_conv1d_fn(used),
        "torch_chunk_gated_delta_rule": _chunk_gated_delta_rule(used),
    }
    patched: dict[str, dict[str, Any]] = {}

    def patch_module_of(module: Any, args: Any) -> None:
        name = type(module).__module__
        if name in patched:
            return
        patched[name] = {
            attr: f
            for attr, f in _replaceable(name).items()
            if packages is None or kernel_package(KERNEL_FUNCTIONS[attr]) in packages
        }
        for attr in patched[name]:
            setattr(sys.modules[name], attr, _named(fakes[attr], name))

    hook = torch.nn.modules.module.register_module_forward_pre_hook(patch_module_of)
    try:
        yield
    finally:
        hook.remove()
        for name, originals in patched.items():
            owner = sys.modules.get(name)
            for attr, original in originals.items():
                setattr(owner, attr, original)


def _named(fake: Callable[..., Any], module: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return fake(*args, _module=module, **kwargs)

    return call


def _contiguous(t: Any) -> Any:
    """What the kernels do to an input whose last dimension is not contiguous: copy it."""
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def _selective_scan_fn(used: list[str] | None) -> Callable[..., Any]:
    """``mamba_ssm.selective_scan_fn``'s signature and memory (module docstring)."""
    import torch

    class SelectiveScan(torch.autograd.Function):
        @staticmethod
        def forward(
            ctx: Any,
            u: Any,
            delta: Any,
            A: Any,
            B: Any,
            C: Any,
            D: Any,
            z: Any,
            delta_bias: Any,
            return_last_state: bool,
        ) -> Any:
            u, delta, B, C, z = (_contiguous(t) for t in (u, delta, B, C, z))
            D = D.contiguous() if D is not None else None
            batch, channels, length = u.shape
            chunks = math.ceil(length / SELECTIVE_SCAN_CHUNK)
            state = A.shape[1]
            # B and C vary with the position (batch, [groups,] state, length) in every
            # transformers model; a fixed (channels, state) one is read once.
            bc = sum(t.numel() for t in (B, C) if t.dim() >= 3)
            contraction = 2.0 * batch * channels * length * state
            ctx.work = (contraction, bc, batch * channels * chunks * 2 * state)
            gated = z is not None
            _record(  # reads u, delta, (z), B, C; writes the output (and the gated one)
                SCAN,
                False,
                {SCAN: contraction},
                elements=(3 + 2 * gated) * u.numel() + bc,
                fp32_elements=ctx.work[2],  # the chunk states written
            )
            x = u.new_zeros((batch, channels, chunks, 2 * A.shape[1]), dtype=torch.float32)
            out = torch.empty_like(u)
            ctx.has_z = z is not None
            if z is None:
                ctx.save_for_backward(u, delta, A, B, C, D, delta_bias, x)
                result = out
            else:
                ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, x, out)
                result = torch.empty_like(u)  # the gated output, returned
            if not return_last_state:
                return result
            last = x[:, :, -1, 1::2]
            ctx.mark_non_differentiable(last)
            return result, last

        @staticmethod
        def backward(ctx: Any, dout: Any, *unused: Any) -> Any:
            if ctx.has_z:
                u, delta, A, B, C, D, z, delta_bias, _x, _out = ctx.saved_tensors
            else:
                u, delta, A, B, C, D, delta_bias, _x = ctx.saved_tensors
                z = None
            dout = _contiguous(dout)
            contraction, bc, chunk_states = ctx.work
            gated = z is not None
            _record(  # the states recomputed from the chunk states, and the two gradients
                SCAN,
                True,
                {SCAN + "_backward": 3 * contraction},
                # reads u, delta, (z, out), B, C, dout; writes du, ddelta, (dz)
                elements=(5 + 3 * gated) * u.numel() + bc,
                fp32_elements=chunk_states + bc,  # the chunk states read; dB, dC written
            )
            # selective_scan_cuda.bwd: du and ddelta like their inputs, dA and the variable
            # dB/dC in fp32, dD and ddelta_bias like theirs, dz like z.
            grads = (
                torch.empty_like(u),
                torch.empty_like(delta),
                torch.zeros_like(A, dtype=torch.float32),
                torch.zeros_like(B, dtype=torch.float32),
                torch.zeros_like(C, dtype=torch.float32),
                torch.zeros_like(D) if D is not None else None,
                torch.empty_like(z) if z is not None else None,
                torch.zeros_like(delta_bias) if delta_bias is not None else None,
            )
            return (*grads, None)

    def selective_scan_fn(
        u: Any,
        delta: Any,
        A: Any,
        B: Any,
        C: Any,
        D: Any = None,
        z: Any = None,
        delta_bias: Any = None,
        delta_softplus: bool = False,
        return_last_state: bool = False,
        *,
        _module: str = "",
        **unused: Any,
    ) -> Any:
        if used is not None:
            used.append(f"{KERNEL_FUNCTIONS['mamba_selective_scan']} ({_module})")
        return SelectiveScan.apply(u, delta, A, B, C, D, z, delta_bias, return_last_state)

    return selective_scan_fn


def _split_conv1d_scan_combined(used: list[str] | None) -> Callable[..., Any]:
    """``mamba_ssm.mamba_split_conv1d_scan_combined``'s signature and memory (module
    docstring)."""
    import torch
    import torch.nn.functional as F

    class SplitConv1dScanCombined(torch.autograd.Function):
        @staticmethod
        def forward(
            ctx: Any,
            zxbcdt: Any,
            conv1d_weight: Any,
            conv1d_bias: Any,
            dt_bias: Any,
            A: Any,
            D: Any,
            chunk_size: int,
            initial_states: Any,
            rmsnorm_weight: Any,
            outproj_weight: Any,
            outproj_bias: Any,
            dims: tuple[int, int, int, int],
        ) -> Any:
            heads, head_dim, state, ngroups = dims
            batch, length, _ = zxbcdt.shape
            dim = heads * head_dim
            nonssm = (zxbcdt.shape[-1] - 2 * dim - 2 * ngroups * state - heads) // 2
            chunks = math.ceil(length / chunk_size)
            # The forward's buffers: the convolved x, B, C; the chunked scan's fp32 dt, its
            # cumulative decay and the chunk states; freed when it returns.
            conv = zxbcdt.new_empty((batch, length, dim + 2 * ngroups * state))
            f32 = {"dtype": torch.float32}
            dt = zxbcdt.new_empty((batch, heads, chunks, chunk_size), **f32)
            decay = zxbcdt.new_empty((batch, heads, chunks, chunk_size), **f32)
            states = zxbcdt.new_empty((batch, chunks, heads, head_dim, state), **f32)
            out_x = zxbcdt.new_empty((batch, length, heads, head_dim))
            if rmsnorm_weight is None:
                rstd = None  # the gate is applied inside the scan
            else:
                rstd = zxbcdt.new_empty((ngroups * batch * length,), **f32)
            out = zxbcdt.new_empty((batch, length, nonssm + dim))
            del conv, dt, decay, states
            tokens, width = batch * length, zxbcdt.shape[-1]
            conv_dim = dim + 2 * ngroups * state
            conv_flops = 2.0 * tokens * conv_dim * conv1d_weight.shape[-1]
            q = chunk_size
            ssd = tokens * (2.0 * q * state * ngroups + dim * (2.0 * q + 4.0 * state))
            recomputed = tokens * (2.0 * q * state * ngroups + 2.0 * dim * state)
            chunk_states = batch * chunks * dim * state
            ctx.work = (tokens, width, conv_dim, conv_flops, ssd, recomputed, chunk_states)
            _record(
                SSD,
                False,
                {CONVOLUTION: conv_flops, SSD: ssd},
                # reads zxbcdt; the convolution's output written and read; the scan's output
                # written and read by the norm, which writes the projection's input
                elements=tokens * (width + 2 * conv_dim + 2 * dim + nonssm + dim),
                # the chunk states written and read; dt and its cumulative decay
                fp32_elements=2 * chunk_states + 4 * tokens * heads,
            )
            if outproj_weight is not None:
                if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled():
                    dtype = (
                        torch.get_autocast_dtype("cpu")
                        if torch.is_autocast_enabled("cpu")
                        else torch.get_autocast_gpu_dtype()
                    )
                    out, outproj_weight = out.to(dtype), outproj_weight.to(dtype)
                    outproj_bias = outproj_bias.to(dtype) if outproj_bias is not None else None
                with torch.autocast("cpu", enabled=False):
                    out = F.linear(out, outproj_weight, outproj_bias)
            ctx.save_for_backward(
                zxbcdt,
                conv1d_weight,
                conv1d_bias,
                out_x,
                A,
                D,
                dt_bias,
                initial_states,
                rmsnorm_weight,
                rstd,
                outproj_weight,
                outproj_bias,
            )
            ctx.shape = (batch, length, heads, head_dim, state, ngroups, chunks, chunk_size, nonssm)
            return out

        @staticmethod
        def backward(ctx: Any, dout: Any) -> Any:
            (zxbcdt, conv_w, conv_b, _out_x, A, D, dt_bias, initial, norm_w, _rstd, proj_w,
             proj_b) = ctx.saved_tensors  # fmt: skip
            batch, length, heads, head_dim, state, groups, chunks, chunk_size, nonssm = ctx.shape
            dim = heads * head_dim
            tokens, width, conv_dim, conv_flops, ssd, recomputed, chunk_states = ctx.work
            flops = {
                CONVOLUTION + "_backward": 2 * conv_flops,
                # the scan's gradients, and what it recomputes: the convolution too
                SSD + "_backward": 2 * ssd + recomputed + conv_flops,
            }
            if proj_w is not None:  # the output projection's two gradients
                flops[MATMUL] = 4.0 * tokens * proj_w.shape[0] * proj_w.shape[1]
            _record(
                SSD,
                True,
                flops,
                # reads zxbcdt, out_x and the gradient of the projection's input; the
                # recomputed convolution written and read; writes dzxbcdt
                elements=tokens * (2 * width + 2 * conv_dim + dim + nonssm + dim),
                # the chunk states recomputed and their gradients, written and read; dt's
                fp32_elements=4 * chunk_states + 4 * tokens * heads,
            )
            f32 = {"dtype": torch.float32}
            dzxbcdt = torch.empty_like(zxbcdt)
            # the recomputed convolution and the scan's backward buffers
            conv = zxbcdt.new_empty((batch, length, dim + 2 * groups * state))
            states = zxbcdt.new_empty((batch, chunks, heads, head_dim, state), **f32)
            dstates = zxbcdt.new_empty((batch, chunks, heads, head_dim, state), **f32)
            ddt = zxbcdt.new_empty((batch, heads, chunks, chunk_size), **f32)
            dproj_w = dproj_b = None
            if proj_w is not None:
                # the gradient through the output projection, and its weight's gradient
                dnorm = zxbcdt.new_empty((batch, length, nonssm + dim))
                dproj_w = torch.empty_like(proj_w)
                dproj_b = torch.empty_like(proj_b) if proj_b is not None else None
                del dnorm
            del conv, states, dstates, ddt
            return (
                dzxbcdt,
                torch.empty_like(conv_w),
                torch.empty_like(conv_b) if conv_b is not None else None,
                torch.empty_like(dt_bias),
                torch.empty_like(A),
                torch.empty_like(D),
                None,
                torch.empty_like(initial) if initial is not None else None,
                torch.empty_like(norm_w) if norm_w is not None else None,
                dproj_w,
                dproj_b,
                None,
            )

    def mamba_split_conv1d_scan_combined(
        zxbcdt: Any,
        conv1d_weight: Any,
        conv1d_bias: Any,
        dt_bias: Any,
        A: Any,
        D: Any,
        chunk_size: int,
        initial_states: Any = None,
        seq_idx: Any = None,
        dt_limit: Any = (0.0, float("inf")),
        return_final_states: bool = False,
        activation: str = "silu",
        rmsnorm_weight: Any = None,
        rmsnorm_eps: float = 1e-6,
        outproj_weight: Any = None,
        outproj_bias: Any = None,
        headdim: int | None = None,
        ngroups: int = 1,
        norm_before_gate: bool = True,
        *,
        _module: str = "",
        **unused: Any,
    ) -> Any:
        if used is not None:
            used.append(f"{KERNEL_FUNCTIONS['mamba2_split_conv1d_scan_combined']} ({_module})")
        heads, head_dim = (D.shape[0], headdim) if D.dim() == 1 else D.shape
        state = (conv1d_weight.shape[0] - heads * head_dim) // ngroups // 2
        out = SplitConv1dScanCombined.apply(
            zxbcdt,
            conv1d_weight,
            conv1d_bias,
            dt_bias,
            A,
            D,
            chunk_size,
            initial_states,
            rmsnorm_weight,
            outproj_weight,
            outproj_bias,
            (heads, head_dim, state, ngroups),
        )
        if not return_final_states:
            return out
        final = zxbcdt.new_empty((zxbcdt.shape[0], heads, head_dim, state), dtype=torch.float32)
        return out, final

    return mamba_split_conv1d_scan_combined


def _causal_conv1d_fn(used: list[str] | None) -> Callable[..., Any]:
    """``causal_conv1d.causal_conv1d_fn``'s signature and memory: it keeps its input (copied
    only when neither its channel nor its position dimension is contiguous), the weight and the
    bias, and returns the activated output in the input's dtype (``CausalConv1dFn``,
    Dao-AILab/causal-conv1d causal_conv1d/causal_conv1d_interface.py). The PyTorch fallback
    casts the input to the weight's dtype (fp32 under autocast) and keeps the convolution's and
    the activation's inputs besides."""
    import torch

    class CausalConv1d(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, weight: Any, bias: Any) -> Any:
            if x.stride(2) != 1 and x.stride(1) != 1:
                x = x.contiguous()
            ctx.save_for_backward(x, weight, bias)
            ctx.conv_flops = 2.0 * x.numel() * weight.shape[-1]
            # reads x, writes the output
            _record(CONV, False, {CONVOLUTION: ctx.conv_flops}, elements=2 * x.numel())
            return torch.empty_like(x, memory_format=torch.contiguous_format)

        @staticmethod
        def backward(ctx: Any, dout: Any) -> Any:
            x, weight, bias = ctx.saved_tensors
            # the input's and the weight's gradients; reads x and dout, writes dx
            flops = {CONVOLUTION + "_backward": 2 * ctx.conv_flops}
            _record(CONV, True, flops, elements=3 * x.numel())
            return (
                torch.empty_like(x),
                torch.empty_like(weight),
                torch.empty_like(bias) if bias is not None else None,
            )

    def causal_conv1d_fn(
        x: Any,
        weight: Any,
        bias: Any = None,
        *unused_args: Any,
        _module: str = "",
        **unused: Any,
    ) -> Any:
        if used is not None:
            used.append(f"{KERNEL_FUNCTIONS['causal_conv1d_fn']} ({_module})")
        return CausalConv1d.apply(x, weight, bias)

    return causal_conv1d_fn


def _chunk_gated_delta_rule(used: list[str] | None) -> Callable[..., Any]:
    """``fla.ops.gated_delta_rule.chunk_gated_delta_rule``'s signature (as transformers calls
    its fallback ``torch_chunk_gated_delta_rule``) and memory: ``ChunkGatedDeltaRuleFunction``
    (fla-org/flash-linear-attention, fla/ops/gated_delta_rule/chunk.py; its ``input_guard``
    makes every input contiguous first) keeps the l2-normalised
    q and k with their fp32 inverse norms, v, the chunk-local cumulative gate (fp32), beta, the
    solved WY matrix A (positions × heads × 64, in k's dtype) and the initial state; its
    forward builds and frees w, u (keys and values per value head), the chunk states h
    (chunks × heads × K × V, k's dtype) and the corrected values; its backward recomputes
    those, then the state gradients dh (q's dtype) and the inputs' gradients. The PyTorch path
    casts everything to fp32, keeps per-chunk states and repeats q and k to every value head."""
    import torch

    class ChunkGatedDeltaRule(torch.autograd.Function):
        @staticmethod
        def forward(
            ctx: Any,
            q: Any,
            k: Any,
            v: Any,
            g: Any,
            beta: Any,
            initial_state: Any,
            output_final_state: bool,
            l2norm: bool,
        ) -> Any:
            # fla's input_guard: every tensor input made contiguous first (transformers passes
            # q, k and v as views of the convolution's transposed output: v is saved as a
            # copy, not as a view keeping the whole output alive)
            q, k, v, g, beta = (t.contiguous() for t in (q, k, v, g, beta))
            batch, length, key_heads, key_dim = q.shape
            heads, value_dim = v.shape[-2:]
            chunks = math.ceil(length / GATED_DELTA_CHUNK)
            f32 = {"dtype": torch.float32}
            q_rstd = k_rstd = None
            if l2norm:
                q, k = torch.empty_like(q), torch.empty_like(k)
                q_rstd = q.new_empty((batch, length, key_heads), **f32)
                k_rstd = k.new_empty((batch, length, key_heads), **f32)
            g = g.new_empty((batch, length, heads), **f32)  # the chunk-local cumulative sum
            a32 = k.new_empty((batch, length, heads, GATED_DELTA_CHUNK), **f32)
            a = k.new_empty((batch, length, heads, GATED_DELTA_CHUNK))
            del a32
            w = k.new_empty((batch, length, heads, key_dim))
            u = torch.empty_like(v)
            h = k.new_empty((batch, chunks, heads, key_dim, value_dim))
            v_new = torch.empty_like(u)
            out = torch.empty_like(v)
            del w, u, h, v_new
            final = (
                q.new_empty((batch, heads, key_dim, value_dim), **f32)
                if output_final_state
                else None
            )
            ctx.save_for_backward(q, q_rstd, k, k_rstd, v, g, beta, a, initial_state)
            tokens = batch * length
            c, kd, vd = GATED_DELTA_CHUNK, key_dim, value_dim
            # per token and value head: A = β·K·Kᵀ, its triangular solve, w = A·K, u = A·V,
            # the state's readout and update, the output's inter- and intra-chunk parts
            forward = tokens * heads * (6.0 * c * kd + 4.0 * c * vd + 6.0 * kd * vd + 2 * c * c / 3)
            recomputed = tokens * heads * (2.0 * c * kd + 2.0 * c * vd + 4.0 * kd * vd)
            qk, per_head = tokens * key_heads * key_dim, tokens * heads
            states = batch * chunks * heads * key_dim * value_dim
            ctx.work = (forward, recomputed, qk, per_head, states, v.numel())
            _record(
                GATED_DELTA,
                False,
                {GATED_DELTA: forward},
                # reads q, k, v, beta; writes the normalised q, k; A written and read twice; w,
                # u, v_new and the chunk states written and read; writes the output
                elements=4 * qk
                + 6 * v.numel()
                + per_head * (1 + 3 * c)
                + 2 * states
                + 2 * tokens * heads * key_dim,
                fp32_elements=per_head * (2 + 2 * c) + 2 * tokens * key_heads,
            )
            return out, final

        @staticmethod
        def backward(ctx: Any, dout: Any, *unused: Any) -> Any:
            q, _q_rstd, k, _k_rstd, v, g, beta, _a, initial = ctx.saved_tensors
            forward, recomputed, qk, per_head, states, values = ctx.work
            batch, length, heads, value_dim = v.shape
            key_dim = k.shape[-1]
            chunks = math.ceil(length / GATED_DELTA_CHUNK)
            _record(
                GATED_DELTA,
                True,
                {GATED_DELTA + "_backward": 2 * forward + recomputed},
                # reads what it saved and dout; recomputes w, u, h, v_new; dh written and read;
                # writes dq, dk, dv, dbeta and the intermediate gradients
                elements=6 * qk
                + 10 * values
                + per_head * (2 + 2 * GATED_DELTA_CHUNK)
                + 4 * states
                + 4 * batch * length * heads * key_dim,
                fp32_elements=4 * per_head,
            )
            w = k.new_empty((batch, length, heads, key_dim))
            u = torch.empty_like(v)
            h = k.new_empty((batch, chunks, heads, key_dim, value_dim))
            v_new = torch.empty_like(u)
            dv_local = torch.empty_like(dout)
            dh = q.new_empty((batch, chunks, heads, key_dim, value_dim))
            dh0 = torch.empty_like(initial, dtype=torch.float32) if initial is not None else None
            dq, dk, dw = torch.empty_like(q), torch.empty_like(k), torch.empty_like(w)
            dg = g.new_empty(g.shape, dtype=torch.float32)
            del h, dh, dv_local
            dv, db = torch.empty_like(v), torch.empty_like(beta)
            del w, u, v_new, dw
            return dq, dk, dv, dg, db, dh0, None, None

    def chunk_gated_delta_rule(
        query: Any,
        key: Any,
        value: Any,
        g: Any,
        beta: Any,
        chunk_size: int = GATED_DELTA_CHUNK,
        initial_state: Any = None,
        output_final_state: bool = False,
        use_qk_l2norm_in_kernel: bool = False,
        *,
        _module: str = "",
        **unused: Any,
    ) -> Any:
        if used is not None:
            used.append(f"{GATED_DELTA} ({_module})")
        out, final = ChunkGatedDeltaRule.apply(
            query,
            key,
            value,
            g,
            beta,
            initial_state,
            output_final_state,
            use_qk_l2norm_in_kernel,
        )
        return out, final

    return chunk_gated_delta_rule
