"""What fake-tensor tracing and FLOP counting need beyond torch's own registries.

**Grouped GEMMs of mixture-of-experts layers.** Hugging Face transformers (5.x) runs the
experts of every MoE model it ships (Mixtral, Qwen-MoE, OLMoE, DeepSeek, gpt-oss, ...) as one
``torch._grouped_mm`` per projection: the routed tokens sorted by expert, times the stacked
expert weights, split by per-expert offsets. The real CPU and CUDA (sm80+) kernels take fp32,
bf16 and fp16 operands, but torch 2.13's meta function for the op still implements only the
Hopper kernel's checks (``Expected inputs of BF16 type``), so a fake-tensor trace of an fp32
step, or of a bf16-autocast step over fp32 master weights (transformers casts the tokens to the
weights' dtype: autocast does not cover the op), fails in every MoE layer: every memory probe
of ``hf:mixtral`` was an error row. :func:`grouped_mm_any_float` gives the op, while a trace
runs, a fake kernel with the meta function's shapes for any floating dtype pair that matches.
FLOPs: ``FlopCounterMode`` has no formula for the op, so a MoE model's count lost its expert
GEMMs; :func:`register_grouped_mm_formula` adds one (2 FLOPs per multiply-add, each routed
row multiplied by one expert's matrix).

**Quiet failures.** When a meta function raises, ``FakeTensorMode`` logs the whole traceback
at ERROR before re-raising (``torch._subclasses.fake_tensor``): one probe of a model whose op
cannot be traced printed ~20 lines to stderr, once per op call, hundreds per profile, even with
``--quiet``. The probe records the error itself (a one-line reason in probes.csv);
:func:`fake_errors_unlogged` keeps that logger quiet while a trace runs.

**Unpacked rows.** Hugging Face transformers (5.x) decides from the position ids whether a
batch packs several sequences per row (``masking_utils.find_packed_sequence_indices``); on
fake tensors it cannot read them and assumes packing, so every causal mask was materialised
(batch × T × T) and, with a mask, SDPA's grouped-query path is refused
(``sdpa_attention.use_gqa_in_sdpa``): k and v were repeated to every query head in every
attention layer. A real step of ours passes token ids only (the model counts its positions
from 0 in every row), finds no packing, passes no mask (SDPA's ``is_causal``) and keeps k and
v at their own heads: a Qwen3.5-9B attention layer's trace kept 74.5 h bytes per token where
the real step keeps 71 h. :func:`unpacked_rows` answers, for fake position ids, what a real
step finds: no packing.

**Deadlines.** A trace or count of a model that cannot be extended from shallow copies (no
repeated blocks: Jamba's and Zamba2's stacks mix kinds of layers) runs its whole step, and one
step of a large model can take minutes of fake ops: the FLOP count of Jamba (52B, sequence 4096,
its Mamba scan a loop over positions on a host without its kernels) ran past 10 minutes of a
120 s profile. Inside :func:`fake_deadline`, a trace or count raises :class:`TraceOverBudget`
past the deadline, as a module's forward starts or between two torch calls of the model's code.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from profilers.stopping import stopped

if TYPE_CHECKING:
    import torch

    from profilers.workload import StepSpec, Workload

# torch is imported where it is used: profilers.flops imports this module, and importing the
# advisor package must not load torch.
FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"
# Mixture-of-experts layers' experts, as FlopCounterMode names the op (the formula is
# registered by register_grouped_mm_formula).
GROUPED_GEMM_OP = "aten._grouped_mm"


class TraceOverBudget(TimeoutError):
    """A fake-tensor trace or count ran past the deadline it was given (:func:`fake_deadline`).
    ``more_s``: at least how many more seconds the stopped work needed (the backward it did not
    start, estimated; 0 when stopped in its forward, where what is left is unknown)."""

    def __init__(self, message: str, *, more_s: float = 0.0) -> None:
        super().__init__(message)
        self.more_s = more_s


# Deadlines (time.perf_counter() values) of the fake traces and counts of this process, the
# innermost last (a list: no global rebinding).
_DEADLINES: list[tuple[float, str]] = []


@contextlib.contextmanager
def fake_deadline(at: float | None, what: str = "the time given to it") -> Iterator[None]:
    """Fake traces and counts inside raise :class:`TraceOverBudget` once ``time.perf_counter()``
    passes ``at`` (None: no deadline of its own); ``what`` names the deadline in the error.

    Checked as each module's forward starts (a global forward pre-hook) and between two torch
    calls of the model's own Python code (a torch function mode: a call made directly from a
    file outside torch, at the dispatch depth of a module's forward), never inside an op: an
    exception raised from a dispatch mode inside an op's C++ (``torch.matmul`` in Jamba's
    Mamba scan, a loop over positions) ended the process ("terminate called after throwing an
    instance of 'python_error'"), and torch's own Python may be running under C++ (a saved-
    tensor hook, a mode's handler). A backward is never interrupted (the autograd engine runs
    it in C++): it is not started when it would end past the deadline, at
    :data:`BACKWARD_OVER_FORWARD` times the forward it follows (``Tensor.backward`` goes
    through the mode). Until 2026-12-05 a module's forward was the only check: one Mamba
    layer's scan at sequence 4096 (~20 s of fake ops) overran a 120 s Jamba profile by 26%."""
    if at is None:
        yield
        return
    import torch

    with contextlib.ExitStack() as stack:
        if not _DEADLINES:
            hook = torch.nn.modules.module.register_module_forward_pre_hook(_check_deadline)
            stack.callback(hook.remove)
            stack.enter_context(_deadline_function_mode())
            stack.callback(_TOP_DEPTH.clear)
            stack.callback(_FORWARD_STARTED.clear)
        _DEADLINES.append((at, what))
        stack.callback(_DEADLINES.pop)
        yield


# The dispatch-mode depth at which the last module forward of a fake trace started (a list: no
# global rebinding): a torch call at a smaller depth runs inside some mode's handler.
_TOP_DEPTH: list[int] = []
# (a weak reference to the fake mode, when) the first module forward since the last backward
# started under that fake mode: the forward a backward follows.
_FORWARD_STARTED: list[tuple[Any, float]] = []
# A fake step's backward against its forward: about twice the FLOPs and twice the ops, each
# dispatched alike.
BACKWARD_OVER_FORWARD = 2.0


def _check_deadline(module: Any, args: Any) -> None:
    """Raise :class:`TraceOverBudget` in a fake trace's forward past the earliest deadline."""
    import weakref

    import torch

    fake = _fake_forward_mode()
    if fake is not None:
        _TOP_DEPTH[:] = [torch._C._len_torch_dispatch_stack()]
        if not _FORWARD_STARTED or _FORWARD_STARTED[0][0]() is not fake:
            _FORWARD_STARTED[:] = [(weakref.ref(fake), time.perf_counter())]
        _raise_if_past()


def _fake_forward_mode() -> Any:
    """The fake mode of the fake trace running, outside backward (a recompute inside backward
    is let end); None if none."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    if torch._C._current_graph_task_id() != -1:
        return None
    modes = _get_current_dispatch_mode_stack()
    return next((mode for mode in modes if isinstance(mode, FakeTensorMode)), None)


def _check_backward_start() -> None:
    """Raise :class:`TraceOverBudget` rather than start a fake backward that would end past
    the deadline, at :data:`BACKWARD_OVER_FORWARD` times the forward it follows."""
    import torch

    started = _FORWARD_STARTED[:1]
    _FORWARD_STARTED.clear()  # the next forward is timed afresh
    fake = _fake_forward_mode()
    if not started or fake is None or started[0][0]() is not fake:
        return
    if not _TOP_DEPTH or torch._C._len_torch_dispatch_stack() < _TOP_DEPTH[0]:
        return
    _raise_if_past()  # asked to stop: no backward starts
    now = time.perf_counter()
    at, what = min(_DEADLINES)
    backward = BACKWARD_OVER_FORWARD * (now - started[0][1])
    if now + backward > at:
        raise TraceOverBudget(
            f"the fake-tensor trace's backward would run past {what} (~{backward:.0f} s, "
            f"{BACKWARD_OVER_FORWARD:g}x its forward)",
            more_s=backward,
        )


def deadline_left() -> tuple[float, str] | None:
    """(seconds until the earliest deadline of this process's fake traces, what it is named),
    negative once passed; None outside :func:`fake_deadline`."""
    if not _DEADLINES:
        return None
    if (why := stopped()) is not None:
        return -1.0, why
    at, what = min(_DEADLINES)
    return at - time.perf_counter(), what


def _raise_if_past() -> None:
    if (why := stopped()) is not None:  # the profile was asked to stop (Ctrl-C)
        raise TraceOverBudget(f"the fake-tensor trace stopped: {why}")
    at, what = min(_DEADLINES)
    if time.perf_counter() > at:
        raise TraceOverBudget(f"the fake-tensor trace ran past {what}")


def _check_between_ops(caller: Any) -> None:
    """Past the deadline, raise at a torch call made by the model's own code (``caller``: the
    calling frame) outside any mode's handler, in a fake trace's forward."""
    import torch

    if (time.perf_counter() <= min(_DEADLINES)[0] and stopped() is None) or not _TOP_DEPTH:
        return
    if caller is None or caller.f_code.co_filename.startswith(_torch_dir()):
        return
    if torch._C._len_torch_dispatch_stack() < _TOP_DEPTH[0] or _fake_forward_mode() is None:
        return
    _raise_if_past()


def _torch_dir() -> str:
    import os

    import torch

    return os.path.dirname(torch.__file__) + os.sep


def _deadline_function_mode() -> Any:
    """A torch function mode that checks the deadline before each torch call."""
    import sys

    import torch
    from torch.overrides import TorchFunctionMode

    backward = torch.Tensor.backward

    class _DeadlineMode(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if _DEADLINES:
                if func is backward:
                    _check_backward_start()
                else:
                    _check_between_ops(sys._getframe(1))
            return func(*args, **(kwargs or {}))

    return _DeadlineMode()


# Whether _fake_grouped_mm answered while the context was entered (a set: no global rebinding).
_USED: set[bool] = set()


def _grouped_mm_op() -> Any:
    import torch

    return getattr(torch.ops.aten, "_grouped_mm", None)


def _fake_grouped_mm(
    fake_mode: Any,
    func: Any,
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> Any:
    """The meta function's output for matching floating operands; anything else goes on to
    torch's own meta function (and its message)."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

    if mat_a.dtype != mat_b.dtype or not mat_a.dtype.is_floating_point or mat_a.dtype.itemsize < 2:
        return NotImplemented
    _USED.add(True)
    with in_kernel_invocation_manager(fake_mode):
        out = _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)
    return FakeTensor(fake_mode, out, mat_a.device)


@contextlib.contextmanager
def grouped_mm_any_float() -> Iterator[None]:
    """While inside, fake tensors run ``aten._grouped_mm`` on fp32/bf16/fp16 operands (see the
    module docstring). A no-op where torch lacks the op or already has a fake rule for it."""
    from torch._subclasses import fake_impls
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = _grouped_mm_op()
    overload = getattr(op, "default", None)
    if overload is None or overload in fake_impls.op_implementations_dict:
        yield
        return
    fake_impls.op_implementations_dict[overload] = _fake_grouped_mm
    _USED.clear()
    try:
        yield
    finally:
        fake_impls.op_implementations_dict.pop(overload, None)
        if _USED:
            # FakeTensorMode caches dispatch results class-wide, ours among them: forget them
            # (only when there are any: the cache speeds every other trace).
            FakeTensorMode.cache_clear()
            _USED.clear()


def grouped_mm_flops(
    a_shape: Any, b_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    """FLOPs of one ``_grouped_mm`` from its operands' shapes: 2 per multiply-add.

    2D x 3D (routed rows x stacked experts: each row meets one expert's K x N matrix), 3D x 2D
    and 3D x 3D: every output element is one K-long dot product. 2D x 2D (the weight gradient:
    the contraction over the rows is split by the offsets into one K x N result per group): the
    M x K x N products are made once in all, whatever the split."""
    a, b = tuple(a_shape), tuple(b_shape)
    k = a[-1]
    if len(a) == 2 and len(b) == 2:
        return 2 * a[0] * k * b[-1]
    if out_shape is None:
        raise ValueError("a grouped GEMM with a 3D operand needs its output's shape")
    return 2 * math.prod(out_shape) * k


def register_grouped_mm_formula() -> list[str]:
    """Register :func:`grouped_mm_flops` with FlopCounterMode if torch has the op and no formula
    for it (idempotent). Returns the ops this call registered."""
    from torch.utils import flop_counter

    op = _grouped_mm_op()
    # The registry is looked up anew: torch rebinds the module-level dict after import.
    if op is None or op in flop_counter.flop_registry:
        return []
    flop_counter.register_flop_formula(op)(grouped_mm_flops)
    return [GROUPED_GEMM_OP]


@contextlib.contextmanager
def fake_errors_unlogged() -> Iterator[None]:
    """Keep FakeTensorMode's per-failure traceback off stderr (the caller records the error)."""
    logger = logging.getLogger(FAKE_TENSOR_LOGGER)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def unpacked_rows() -> Iterator[None]:
    """Inside, transformers' packed-sequence detection finds none in fake position ids, as a
    real step of ours finds none (module docstring). Patched at the first module forward after
    ``transformers.masking_utils`` is imported (a model's build imports it inside a trace), and
    restored on exit."""
    import sys

    import torch
    from torch._subclasses.fake_tensor import is_fake

    name, attr = "transformers.masking_utils", "find_packed_sequence_indices"
    patched: list[tuple[Any, Any]] = []

    def patch(module: Any, args: Any) -> None:
        owner = sys.modules.get(name)
        if patched or owner is None or not hasattr(owner, attr):
            return
        original = getattr(owner, attr)

        def find_packed_sequence_indices(position_ids: Any, *rest: Any, **kwargs: Any) -> Any:
            if is_fake(position_ids):
                return None
            return original(position_ids, *rest, **kwargs)

        patched.append((owner, original))
        setattr(owner, attr, find_packed_sequence_indices)

    hook = torch.nn.modules.module.register_module_forward_pre_hook(patch)
    try:
        yield
    finally:
        hook.remove()
        for owner, original in patched:
            setattr(owner, attr, original)


@contextlib.contextmanager
def fake_tracing_extras() -> Iterator[None]:
    """The fake kernel, the quiet failures and unpacked rows, for one trace or count (a FLOP
    count also registers :func:`register_grouped_mm_formula`; a memory trace counts
    nothing)."""
    with grouped_mm_any_float(), fake_errors_unlogged(), unpacked_rows():
        yield


def run_fake_step(
    workload: Workload,
    spec: StepSpec,
    counter: Any,
    *contexts: contextlib.AbstractContextManager[Any],
) -> None:
    """One forward+backward of ``workload``'s step at ``spec`` on fake CPU tensors (built from
    the meta device: nothing is allocated), with the dispatch mode ``counter`` entered around
    the step only (not its build), inside :func:`fake_tracing_extras` and ``contexts``. What a
    counter of the step's ops needs (:mod:`profilers.eager_attention`, :mod:`profilers.
    expert_gemms`). State-space layers run their CUDA kernels' fakes
    (:mod:`profilers.ssm_kernels`): no Python loop over positions, and their work is what a
    GPU step does (a count inside :func:`~profilers.ssm_kernels.counting_kernel_work` gets
    their FLOPs)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from profilers.ssm_kernels import ssm_cuda_kernels

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(fake_tracing_extras())
        stack.enter_context(ssm_cuda_kernels())
        for context in contexts:
            stack.enter_context(context)
        with mode:
            step = workload.build_step(spec, "cpu", from_meta=True)
        with mode:
            batches = step.synthetic_batches(torch.Generator().manual_seed(0))
            with counter:
                step.forward_backward(batches)
