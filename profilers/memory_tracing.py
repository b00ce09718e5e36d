"""Fake-tensor tracing of one training step with MemTracker (the body of trace_step_memory).

Recipe (DESIGN.md, verified on CPU against the allocator): build the step on ``meta`` and
materialise it with ``to_empty`` inside ``FakeTensorMode(allow_non_fake_inputs=True)``, then run
two iterations and measure the second, so the optimizer state exists as it does in training.
A step that can (``PrimableStep``: the trainer's) makes the first iteration's optimizer state
with one optimizer step on zero gradients instead of a forward and backward: about half the
trace, every field the same in benchmarks/trace_speed.py's cases. One model read lower: Bamba on
transformers' PyTorch scan with full checkpointing, whose real first iteration left its module
inputs alive in torch's MemTracker into the measured step (a training step keeps none of them:
the same ops on real tensors, or fake ones untracked, leave nothing alive).
Each phase runs in its own ``with tracker:`` block because entering a MemTracker resets its peak
to what is live at that moment: the two peaks come out separately, with no bookkeeping of ours.

Autograd sums a gradient that arrives by two paths in place; a fake tensor it would sum out of
place, so the tracker replays the engine's choice (``memory_grad_sums``).

What it does not see: memory a kernel allocates below the dispatcher (the fake kernels have
none to allocate), CUDA context and library workspaces, allocator fragmentation. Those are
measured on the device (``memory_truth.measure_cuda``).

Several torch internals are relied on here; each is named where it is used, and the tests on the
toy workload fail loudly if a torch release changes them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed._tools.mem_tracker as mem_tracker_module
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

from profilers.fake_kernels import fake_tracing_extras
from profilers.memory_grad_sums import GradSumsInPlace
from profilers.memory_records import MemoryBreakdown, MemoryTrace
from profilers.ssm_kernels import kernels_expected, ssm_cuda_kernels
from profilers.workload import BlockScalableWorkload, StepSpec, Workload, optimizer_primer

# MemTracker's categories (``_MemRefType`` values) -> MemoryBreakdown fields.
_CATEGORY_FIELDS = {
    "Parameter": "parameters",
    "Buffer": "buffers",
    "Gradient": "gradients",
    "Optstate": "optimizer_state",
    "Activation": "activations",
    "Temp": "temporaries",
    "Other": "other",
}
_TOTAL_KEY = "Total"

# CUDA's caching allocator rounds every request up to a multiple of 512 bytes (kMinBlockSize
# in c10/cuda/CUDACachingAllocator.cpp, round_size(); 0 bytes stays 0), and
# torch.cuda.memory_allocated counts those rounded blocks. MemTracker applies the same rounding,
# but only to storages whose device is cuda; we trace on fake *CPU* (fake CUDA aborts in autograd
# on a CPU-only build), so the rounding is applied here to every storage. MemTracker's constant
# already honours PYTORCH_NO_CUDA_MEMORY_CACHING=1 (no rounding). Not modelled:
# PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions (rounds larger requests to power-of-two
# fractions), and the 2 MiB / 20 MiB segment sizes, which affect reserved, not allocated, memory.
CUDA_BLOCK_BYTES: int = mem_tracker_module._PYTORCH_MIN_ALLOCATE


def cuda_block_bytes(num_bytes: int) -> int:
    """Bytes the CUDA caching allocator hands out for a request of ``num_bytes``."""
    return math.ceil(num_bytes / CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES


class _CudaRoundedWeakRefInfo(mem_tracker_module._WeakRefInfo):
    def _calculate_mem_consumed(self) -> int:
        return cuda_block_bytes(self.size * self.element_size)


class PeakWindows:
    """Peak windows (for traces scaled by block count, memory_blocks), mixed into a MemTracker
    (one device's, or FSDP's): with ``split_after`` set, the forward+backward peak is kept per
    window, each from one boundary to the next: "F" from a micro-batch's forward until autocast
    drops its cache of low-precision weight copies (one per block: every block's is live until
    then; no such moment in fp32), "A" until the last block's backward ends (every block's
    activations live), "B" the rest of backward (gradients accumulate as activations are
    freed). Within each window the peak sits at a moment whose place does not depend on the
    number of blocks. The tracker calls ``close_window("F")`` at each root forward and
    :meth:`block_backward_ended` when a module's backward ends.

    With ``split_blocks`` (a DDP/FSDP rank's trace, ``memory_distributed``) the rest of
    backward is cut at every block instead: window "bw{i}" is block i's backward (from the
    end of block i+1's to the end of its own), "E" what follows block 0's (the embedding, the
    root's gradients). A rank's block windows differ by more than their depth (FSDP
    prefetches block i-1 during block i's backward, except at block 0), so which end of
    backward holds its peak can change with the depth; per-block windows keep each end's own
    line."""

    split_after: torch.nn.Module | None = None
    split_blocks: tuple[torch.nn.Module, ...] = ()
    windows: dict[str, dict[torch.device, dict[Any, int]]]
    window: str = "B"
    _peak_mem_snap: dict[torch.device, dict[Any, int]]
    _peak_mem: dict[torch.device, int]

    if TYPE_CHECKING:  # MemTracker's (a stub here would shadow it: the mixin comes first)

        def get_tracker_snapshot(
            self, type: str = "current"
        ) -> dict[torch.device, dict[Any, int]]: ...

    def start_windows(
        self, split_after: torch.nn.Module, blocks: tuple[torch.nn.Module, ...] = ()
    ) -> None:
        """Split from now on at ``split_after`` (the last block), or at each of ``blocks``."""
        self.split_after, self.split_blocks, self.windows = split_after, blocks, {}
        # Until the first forward: what the previous step left, the end of a backward.
        self.window = "E" if blocks else "B"

    def block_backward_ended(self, module: torch.nn.Module) -> None:
        if self.split_after is None:
            return
        if not self.split_blocks:
            if module is self.split_after:
                self.close_window("B")
            return
        for i, block in enumerate(self.split_blocks):
            if block is module:
                self.close_window(f"bw{i - 1}" if i else "E")
                return

    def finish_windows(self) -> dict[str, dict[torch.device, dict[Any, int]]]:
        """Close the last window and stop splitting; returns every window's peak snapshot."""
        self.close_window("B")
        windows, self.split_after, self.split_blocks = self.windows, None, ()
        return windows

    def autocast_cache_cleared(self) -> None:
        """The outermost autocast exited: the forward's low-precision weight copies are gone
        (only the first time after a forward; checkpoint recomputes clear theirs too)."""
        if self.split_after is not None and self.window == "F":
            self.close_window("A")

    def close_window(self, following: str) -> None:
        """Keep the peak since the last boundary as the current window's (if higher than what
        it holds) and start window ``following`` at what is live now."""
        held = self.windows.get(self.window)
        if held is None or _total(self._peak_mem_snap) > _total(held):
            self.windows[self.window] = copy.deepcopy(self._peak_mem_snap)
        self.window = following
        current = self.get_tracker_snapshot()
        self._peak_mem_snap = current
        self._peak_mem = {dev: snap[_TOTAL_KEY] for dev, snap in current.items()}


class GlobalPeakOnly:
    """Mixed into a MemTracker: each op updates the whole step's peak, not every module's.

    MemTracker's ``_update_peak_stats`` also walks every module it has met, at every op, to
    keep each active one's own peak for its per-module report, which nothing here reads: a
    cost in ops x modules, most of a small model's trace. benchmarks/trace_speed.py
    (2026-12-06): every trace field the same, one-device traces 1.4-2.0x faster on tiny
    models and 3.8x on Qwen3.5-9B's copies (a first run: 1.6-2.2x, 3.2x), and a whole trace
    linear in depth (it grew with its square). The peak's snapshot (bytes by category, flat)
    is copied, not deep-copied."""

    _curr_mem_snap: dict[torch.device, dict[Any, int]]
    _peak_mem_snap: dict[torch.device, dict[Any, int]]
    _peak_mem: dict[torch.device, int]

    def _update_peak_stats(self, peak_state: Any) -> None:
        for dev, snapshot in self._curr_mem_snap.items():
            total = snapshot[_TOTAL_KEY]
            if self._peak_mem.get(dev, 0) < total:
                self._peak_mem[dev] = total
                self._peak_mem_snap[dev] = dict(snapshot)


class FrozenParamsUnhooked:
    """Mixed into a MemTracker: gradient hooks only on parameters that train.

    MemTracker hooks every parameter of a module it meets (``param.register_hook``), and torch
    refuses a hook on a tensor that does not require a gradient: a model with one frozen
    parameter (ERNIE-4.5-MoE's expert-score correction bias, a fixed positional table, a
    frozen embedding) failed every memory trace ("cannot register a hook on a tensor that
    doesn't require gradient"). A frozen parameter never has a gradient to count."""

    _param_to_grad_hook_handles: Any

    def _track_module_params_and_buffers(
        self, module: torch.nn.Module, install_grad_hooks: bool = True
    ) -> tuple[int, int]:
        sizes: tuple[int, int] = super()._track_module_params_and_buffers(  # type: ignore[misc]
            module, install_grad_hooks=False
        )
        if install_grad_hooks:
            for param in module.parameters():
                if param.requires_grad and self._param_to_grad_hook_handles.get(param) is None:
                    self._param_to_grad_hook_handles[param] = (
                        param.register_hook(self._count_grad),
                        param.register_post_accumulate_grad_hook(
                            lambda p: self._count_grad(p.grad)
                        ),
                    )
        return sizes

    def _count_grad(self, grad: torch.Tensor) -> None:
        self._update_and_maybe_create_winfos(  # type: ignore[attr-defined]
            grad, mem_tracker_module._MemRefType.GRAD
        )


class _StepMemTracker(
    GradSumsInPlace, PeakWindows, FrozenParamsUnhooked, GlobalPeakOnly, MemTracker
):
    """MemTracker that accepts gradient accumulation and sums gradients as the engine does.

    MemTracker refuses a second forward of the root module in one tracked region ("multiple
    iterative calls"), which is what every micro-batch after the first is. Its per-module stats
    are the only thing that check protects and we do not read them, so a new root forward simply
    starts them afresh (nor are they kept up at each op: :class:`GlobalPeakOnly`). Parameter
    gradient hooks stay installed (they are keyed by parameter). Peak windows:
    :class:`PeakWindows`.
    """

    def _pre_fw_hook(self, module: torch.nn.Module, inputs: Any) -> None:
        name = self._mod_tracker.get_known_fqn(module)
        root = not self._mod_tracker.is_bw and set(self._mod_tracker.parents) - {name} == {"Global"}
        if root and self.split_after is not None:
            self.close_window("F")
        if module in self.memory_tracking and root:
            self.reset_mod_stats()
        super()._pre_fw_hook(module, inputs)

    def _post_bw_hook(self, module: torch.nn.Module, args: Any) -> None:
        super()._post_bw_hook(module, args)
        self.block_backward_ended(module)


def trace(workload: Workload, spec: StepSpec, *, cuda_rounding: bool) -> MemoryTrace:
    """Trace one step of the whole model; a model with repeated blocks is split at the last
    one's backward, so the trace keeps its window peaks (``MemoryTrace.window_peaks``)."""
    started = time.perf_counter()
    raw = trace_raw(workload, spec, cuda_rounding=cuda_rounding, split_after=last_block(workload))
    return raw.assemble(spec, cuda_rounding=cuda_rounding, started=started)


def last_block(workload: Workload) -> Callable[[Any], torch.nn.Module | None] | None:
    """``split_after`` for :func:`trace_raw`: the step's last repeated block (None for a
    workload that cannot name its blocks, or a step without any)."""
    if not isinstance(workload, BlockScalableWorkload):
        return None

    def last(step: Any) -> torch.nn.Module | None:
        blocks = workload.step_blocks(step)
        return blocks[-1] if blocks else None

    return last


# The windows of a one-device trace split at the last block's backward, in the step's order.
STEP_WINDOWS: tuple[str, ...] = ("F", "A", "B")


@dataclasses.dataclass(frozen=True)
class RawTrace:
    """What one traced step measured, before it becomes a MemoryTrace: the forward+backward
    peak per window (one window, "all", unless split), the optimizer step's peak, and what
    stays live."""

    windows: dict[str, MemoryBreakdown]
    optimizer_step: MemoryBreakdown
    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    resident_bytes: int
    # An FSDP rank's (most unsharded, most sharded) bytes per window (MemoryTrace's
    # reshard_windows), by window name; empty elsewhere.
    reshard_windows: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def assemble(self, spec: StepSpec, *, cuda_rounding: bool, started: float) -> MemoryTrace:
        forward_backward = max(self.windows.values(), key=lambda b: b.total)
        trace = assemble_trace(
            spec,
            cuda_rounding=cuda_rounding,
            forward_backward=forward_backward,
            optimizer_step=self.optimizer_step,
            parameter_bytes=self.parameter_bytes,
            gradient_bytes=self.gradient_bytes,
            optimizer_state_bytes=self.optimizer_state_bytes,
            resident_bytes=self.resident_bytes,
            started=started,
        )
        windows = tuple(self.reshard_windows[k] for k in sorted(self.reshard_windows))
        peaks = (
            tuple((k, self.windows[k].total) for k in STEP_WINDOWS if k in self.windows)
            if "B" in self.windows and set(self.windows) <= set(STEP_WINDOWS)
            else ()
        )
        return dataclasses.replace(trace, reshard_windows=windows, window_peaks=peaks)


def trace_raw(
    workload: Workload,
    spec: StepSpec,
    *,
    cuda_rounding: bool,
    split_after: Any = None,
) -> RawTrace:
    """Trace one step; ``split_after(step)`` (optional) names the module whose backward ends
    window "A" (see ``_StepMemTracker.split_after``; None: not split)."""
    round_bytes = cuda_block_bytes if cuda_rounding else _identity
    with contextlib.ExitStack() as stack:
        enter_step_tracing(stack, cuda_rounding=cuda_rounding)
        step = workload.build_step(spec, "cpu", from_meta=True)
        tracker = _StepMemTracker()
        tracker.track_external(step.model, step.optimizer)
        with tracker:
            tracker.calibrate_grad_sums()
        windows: dict[str, MemoryBreakdown] = {}
        split = None if split_after is None else split_after(step)
        prime = optimizer_primer(step)
        if prime is not None:  # the first iteration without its forward/backward
            with tracker:
                prime()
        for _ in range(2 if prime is None else 1):  # the second iteration is measured
            tracker.reset_mod_stats()
            if split is not None:
                tracker.start_windows(split)
            with tracker, _on_autocast_cache_clear(tracker.autocast_cache_cleared):
                batches = step.synthetic_batches()
                loss = step.forward_backward(batches)
            if split is not None:
                windows = {k: _breakdown(v) for k, v in tracker.finish_windows().items()}
            else:
                windows = {"all": _peak(tracker)}
            with tracker:
                step.optimizer_step()
                optimizer_step = _peak(tracker)
            del batches, loss
        resident = _total(tracker.get_tracker_snapshot("current"))
        parameter_bytes = _storage_bytes(step.model.parameters(), round_bytes)
        gradient_bytes = _storage_bytes(
            (p for p in step.model.parameters() if p.requires_grad), round_bytes
        )
        optimizer_state_bytes = _storage_bytes(
            (v for state in step.optimizer.state.values() for v in state.values()), round_bytes
        )
    return RawTrace(
        windows=windows,
        optimizer_step=optimizer_step,
        parameter_bytes=parameter_bytes,
        gradient_bytes=gradient_bytes,
        optimizer_state_bytes=optimizer_state_bytes,
        resident_bytes=resident,
    )


def assemble_trace(
    spec: StepSpec,
    *,
    cuda_rounding: bool,
    forward_backward: MemoryBreakdown,
    optimizer_step: MemoryBreakdown,
    parameter_bytes: int,
    gradient_bytes: int,
    optimizer_state_bytes: int,
    resident_bytes: int,
    started: float,
) -> MemoryTrace:
    """The MemoryTrace of two measured phases (shared with the per-rank distributed tracer)."""
    optimizer_step = _split_optimizer_temporaries(optimizer_step, optimizer_state_bytes)
    fb_total, opt_total = forward_backward.total, optimizer_step.total
    return MemoryTrace(
        spec=spec,
        target_device_type="cuda" if cuda_rounding else "cpu",
        peak_bytes=max(fb_total, opt_total),
        forward_backward_peak_bytes=fb_total,
        optimizer_step_peak_bytes=opt_total,
        forward_backward_breakdown=forward_backward,
        optimizer_step_breakdown=optimizer_step,
        parameter_bytes=parameter_bytes,
        gradient_bytes=gradient_bytes,
        optimizer_state_bytes=optimizer_state_bytes,
        resident_bytes=resident_bytes,
        trace_seconds=time.perf_counter() - started,
    )


@contextlib.contextmanager
def cuda_target() -> Iterator[None]:
    """What a CPU-traced step needs to read as a CUDA target's: the allocator's 512-byte
    rounding (every tracker inherits MemTracker's bookkeeping: one patch rounds them all),
    CUDA autocast's fp32 norms and softmax (:func:`cuda_autocast_fp32_ops`), CUDA's attention
    kernel for grouped-query SDPA calls that flash attention cannot take
    (:func:`cuda_grouped_query_sdpa`) and, where a GPU run would take them, mamba_ssm's kernels
    for state-space layers (:mod:`profilers.ssm_kernels`)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(mem_tracker_module, "_WeakRefInfo", _CudaRoundedWeakRefInfo))
        stack.enter_context(cuda_autocast_fp32_ops())
        stack.enter_context(cuda_grouped_query_sdpa())
        if packages := kernels_expected():
            stack.enter_context(ssm_cuda_kernels(packages=packages))
        yield


# The head dimensions CUDA's flash attention takes (PyTorch's sdp_utils.cpp,
# check_head_dim_size_flash).
FLASH_MAX_HEAD_DIM = 256


@contextlib.contextmanager
def cuda_grouped_query_sdpa() -> Iterator[None]:
    """CUDA's choice of kernel for an SDPA call with grouped-query heads, on a CPU-traced step.

    ``enable_gqa=True`` with fewer key/value heads than query heads runs on CUDA in flash
    attention (16-bit, no mask, head dimension up to 256) or in the math kernel: the
    memory-efficient kernel, fp32's, does not take grouped heads (PyTorch's sdp_utils.cpp:
    its dense constraints are ``check_batch_size_and_num_heads_dense<false>``). The math
    kernel repeats k and v to every head and keeps the (batch × heads × T × T) probabilities for
    backward. CPU's flash kernel takes grouped heads in fp32 too, so a CPU trace kept only q,
    k, v, the output and its log-sum-exp where a CUDA step of a Hugging Face model with
    grouped-query attention trained in fp32 (transformers passes ``enable_gqa`` whatever the
    dtype) keeps its probabilities, T × T per head per layer. Here such a call runs
    ``aten._scaled_dot_product_attention_math``, whose saved tensors are the math kernel's;
    every other call is left to the CPU kernel (flash's and memory-efficient attention's
    saved tensors are the same size)."""
    functional = torch.nn.functional
    sdpa = functional.scaled_dot_product_attention
    math_sdpa = torch.ops.aten._scaled_dot_product_attention_math

    def cuda_sdpa(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        grouped = enable_gqa and query.shape[-3] != key.shape[-3]
        # CUDA's autocast runs SDPA in its 16-bit dtype (the trace's CPU autocast stands
        # for it): q, k and v are cast first, whatever dtype RoPE left them in
        autocast = torch.is_autocast_enabled("cpu")
        dtype = torch.get_autocast_dtype("cpu") if autocast else query.dtype
        flash = (
            dtype in (torch.float16, torch.bfloat16)
            and attn_mask is None
            and query.shape[-1] <= FLASH_MAX_HEAD_DIM
        )
        if grouped and not flash:
            if autocast:
                query, key, value = (t.to(dtype) for t in (query, key, value))
            out, _ = math_sdpa(
                query,
                key,
                value,
                attn_mask,
                dropout_p,
                is_causal,
                scale=scale,
                enable_gqa=True,
            )
            return out
        return sdpa(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )

    with _patched(functional, "scaled_dot_product_attention", cuda_sdpa):
        yield


@contextlib.contextmanager
def cuda_autocast_fp32_ops() -> Iterator[None]:
    """CUDA's autocast policy for the norms and the softmax, on a CPU-traced step.

    The trace runs on (fake) CPU tensors under CPU autocast, whose op lists differ from CUDA's:
    CUDA runs ``layer_norm``, ``group_norm``, ``softmax`` and ``log_softmax`` in fp32 (PyTorch's
    autocast op reference, "CUDA ops that can autocast to float32"), casting a 16-bit input up
    and keeping the fp32 tensors for backward; CPU autocast leaves them in the input's dtype. On
    a step whose residual stream is 16-bit (an FSDP rank with bf16 parameters) a CUDA target's
    trace missed 2 bytes per element per norm; a hand-written attention's ``softmax(scores)``
    keeps fp32 probabilities on CUDA (4 bytes per score element, not 2) and moves the upcast.
    Here, while CPU autocast is on, ``torch.nn.functional.layer_norm`` and ``group_norm`` (what
    ``nn.LayerNorm``/``nn.GroupNorm`` call) and every softmax entry point
    (``F.softmax``/``F.log_softmax``, ``torch.softmax``/``torch.log_softmax``, the
    ``Tensor`` methods) get fp32 inputs, as they would on CUDA; a softmax given an explicit
    ``dtype`` is left alone (CUDA's autocast leaves it alone too: Hugging Face's eager
    attention passes one). Norms that call the kernels below them directly (the built-in GPT's
    and Llama's) are not touched, as CUDA's autocast does not touch them either.
    """
    functional = torch.nn.functional
    with contextlib.ExitStack() as stack:
        for name in ("layer_norm", "group_norm"):
            stack.enter_context(
                _patched(functional, name, _in_fp32_under_autocast(getattr(functional, name)))
            )
        # where each entry point takes ``dtype`` positionally (input first)
        softmaxes = (
            (functional, "softmax", 3),
            (functional, "log_softmax", 3),
            (torch, "softmax", 2),
            (torch, "log_softmax", 2),
            (torch.Tensor, "softmax", 2),
            (torch.Tensor, "log_softmax", 2),
        )
        for owner, name, position in softmaxes:
            original = getattr(owner, name)
            stack.enter_context(_patched(owner, name, _softmax_in_fp32(original, position)))
        yield


def _in_fp32_under_autocast(fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if torch.is_autocast_enabled("cpu"):
            args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, _to_fp32, (args, kwargs))
        return fn(*args, **kwargs)

    return wrapper


def _softmax_in_fp32(fn: Any, dtype_position: int) -> Any:
    """``fn`` (a softmax taking its input first and ``dtype`` at ``dtype_position``) on an
    fp32 upcast of a 16-bit input while CPU autocast is on and no dtype was given."""

    def wrapper(x: Any, *args: Any, **kwargs: Any) -> Any:
        no_dtype = kwargs.get("dtype") is None and (
            len(args) < dtype_position or args[dtype_position - 1] is None
        )
        if (
            no_dtype
            and torch.is_autocast_enabled("cpu")
            and isinstance(x, torch.Tensor)
            and x.dtype in (torch.bfloat16, torch.float16)
        ):
            x = x.float()
        return fn(x, *args, **kwargs)

    return wrapper


def _to_fp32(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.is_floating_point() and t.dtype != torch.float64 else t


@contextlib.contextmanager
def _on_autocast_cache_clear(callback: Any) -> Iterator[None]:
    """Call ``callback`` after each ``torch.clear_autocast_cache()`` (which ``torch.autocast``
    calls, looked up on the module, when its outermost instance exits)."""
    original = torch.clear_autocast_cache

    def clear() -> None:
        original()
        callback()

    with _patched(torch, "clear_autocast_cache", clear):
        yield


def enter_step_tracing(stack: contextlib.ExitStack, *, cuda_rounding: bool) -> None:
    """Enter on ``stack`` what tracing one training step needs, on one device or as a rank
    (profilers.memory_distributed adds its own): fake tensors, the CUDA target's rounding and
    kernels when asked, a loss scaler whose step is taken, no module-reentry warnings, and the
    fake kernels and quiet failures of :mod:`profilers.fake_kernels`."""
    stack.enter_context(fake_tracing_extras())
    stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
    if cuda_rounding:
        stack.enter_context(cuda_target())
    stack.enter_context(_grad_scaler_never_skips())
    stack.enter_context(module_tracking_quiet())


@contextlib.contextmanager
def _grad_scaler_never_skips() -> Iterator[None]:
    """Trace GradScaler's step as taken.

    ``GradScaler._maybe_opt_step`` reads ``found_inf.item()`` to decide whether to skip the
    optimizer step; a fake tensor has no value. A taken step is the one whose memory matters
    (it creates and updates optimizer state), so the trace always takes it.
    """

    def always_step(
        self: torch.amp.GradScaler,
        optimizer: torch.optim.Optimizer,
        optimizer_state: dict[str, Any],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        return optimizer.step(*args, **kwargs)

    with _patched(torch.amp.GradScaler, "_maybe_opt_step", always_step):
        yield


# torch's ModTracker (under MemTracker) warns this when a module is entered again before its
# forward ended, and MemTracker this when a module's backward hook fires after the module is
# gone.
_MODULE_REENTRY = "The module hierarchy tracking maybe be messed up"
_MODULE_GONE = "Module is None. Skipping"
# and this when a step's forward raised (the probe records that error, on one line).
_HOOK_SILENCED = "global module forward hook with ``always_call=True`` raised an exception"


@contextlib.contextmanager
def module_tracking_quiet() -> Iterator[None]:
    """Silence ModTracker's and MemTracker's warnings about module attribution.

    Hugging Face transformers wraps functions such as ``apply_rotary_pos_emb`` in small hub
    kernel modules (the ``kernels`` package's ``Func``) that are entered again before their
    forward ends, in every attention layer: a profile of an ``hf:`` Llama or Qwen2 printed
    "module hierarchy tracking maybe be messed up" once per layer per traced step (tens of lines
    on stderr). Its Mamba layers build a module in every forward (``ACT2FN["silu"]`` makes a new
    ``SiLUActivation`` each time), gone before backward: a profile of a Bamba, Falcon-H1 or
    Granite-4 hybrid printed "Module is None. Skipping PRE_BW/POST_BW hook" twice per trace.
    ModTracker counts re-entries, and nothing here reads its per-module attribution (peaks are
    the whole step's; windows close on a block's own backward hook; the traces of those hybrids
    equal the CPU allocator's peak), so the warnings say nothing about these traces.
    When a step's forward raises, torch warns that the trackers' hooks were silenced: the
    probe records the error itself. ModTracker also replaces ``warnings.formatwarning`` before
    it warns; that is restored."""
    formatwarning = warnings.formatwarning
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_MODULE_REENTRY)
            warnings.filterwarnings("ignore", message=_MODULE_GONE)
            warnings.filterwarnings("ignore", message=_HOOK_SILENCED)
            yield
    finally:
        warnings.formatwarning = formatwarning


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _peak(tracker: MemTracker) -> MemoryBreakdown:
    return _breakdown(tracker.get_tracker_snapshot("peak"))


def _breakdown(snapshot: dict[torch.device, dict[Any, int]]) -> MemoryBreakdown:
    # One device is traced (fake CPU); summing over devices only guards against a stray one.
    fields = dict.fromkeys(_CATEGORY_FIELDS.values(), 0)
    for device_snapshot in snapshot.values():
        for key, num_bytes in device_snapshot.items():
            if key != _TOTAL_KEY:
                fields[_CATEGORY_FIELDS[key.value]] += num_bytes
    return MemoryBreakdown(**fields)


def _split_optimizer_temporaries(
    breakdown: MemoryBreakdown, optimizer_state_bytes: int
) -> MemoryBreakdown:
    """Inside ``optimizer.step()`` MemTracker labels every new storage optimizer state, the
    foreach kernels' temporaries (e.g. AdamW's ``sqrt(v)`` over all parameters) included; what
    exceeds the state that outlives the step is moved to ``temporaries``."""
    excess = breakdown.optimizer_state - optimizer_state_bytes
    if excess <= 0:
        return breakdown
    return dataclasses.replace(
        breakdown,
        optimizer_state=optimizer_state_bytes,
        temporaries=breakdown.temporaries + excess,
    )


def _total(snapshot: dict[torch.device, dict[Any, int]]) -> int:
    return sum(device_snapshot[_TOTAL_KEY] for device_snapshot in snapshot.values())


def _storage_bytes(tensors: Any, round_bytes: Any) -> int:
    """Bytes of the distinct storages behind ``tensors`` (tied weights count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            seen[id(storage)] = round_bytes(storage.nbytes())
    return sum(seen.values())


def _identity(num_bytes: int) -> int:
    return num_bytes
