"""Per-rank memory of a DDP or FSDP training step, traced on one CPU without allocating.

The step is the one the trainer runs (the workload builds it, wrappers included), traced under
``FakeTensorMode`` as :mod:`profilers.memory_tracing` traces a single-device step, inside a
*fake* process group (``torch.testing._internal.distributed.fake_pg``): one process plays rank
0 of ``world_size`` ranks and every collective returns at once without moving data. The fake
group is process-global (it is the default group), so the trace runs in a child process
(:func:`profilers.isolate.run_isolated`); :func:`trace_in_this_process` is the child's body.

* **FSDP2**: ``FSDPMemTracker`` (torch's MemTracker for ``fully_shard``) counts the sharded and
  unsharded parameters, the all-gather and reduce-scatter buffers, the sharded gradients and
  the optimizer state over the local shards. Its peak restarts whenever it is entered (its
  ``__enter__`` snapshots what is live), and ``reset_mod_stats()`` does *not* reset it; so, as
  for one device, each phase of the second iteration runs in its own ``with tracker:`` block.
  A single block over both iterations reports iteration 1's optimizer-state creation (5x the
  state on gpt-tiny at micro-batch 1) as the peak. With ``fsdp_reshard_after_forward`` False
  the same trace sees every block's unsharded parameters live from its forward to its
  backward (on gpt-tiny, the whole model in fp32 beside the shards at the peak).
* **DDP** is traced too, reducer included, not added by hand: its C++ reducer allocates the
  gradient buckets and copies each gradient into them through the dispatcher, so the fake
  mode and the tracker see them. Three things of DDP need real data or real peers, and are
  replaced for the trace (each is memory-neutral in the steady state measured here):

  - the construction-time checks (``_verify_param_shape_across_processes``: shapes agree
    across ranks; ``_sync_module_states``: rank 0's values broadcast in place) run before the
    step and leave nothing allocated; ranks of one job are identical by construction;
  - the all-reduce runs as a comm hook that divides the bucket in place and returns it (the
    default hook also divides in place and all-reduces in place; the fake group returns no
    tensor, which the reducer rejects);
  - the bucket rebuild after the first iteration (buckets re-cut in backward order) is
    skipped: it broadcasts the new layout from rank 0 by reading a tensor's data, and it frees
    the old buckets before allocating the new ones, which hold the same gradients with no
    padding, so the bytes live at every instant of the second step do not change.

  With ``gradient_as_bucket_view=True`` (the trainer's setting) the buckets are the
  gradients' storage and outlive ``zero_grad(set_to_none=True)``: one gradient copy is live at
  the forward peak, where single-device training has none. Under ``no_sync()`` (every
  micro-batch of an accumulation but the last) the reducer does not run, so the gradients
  accumulate in fresh tensors beside the buckets: two copies at the accumulating peak.

The trace is of rank 0. FSDP2 pads every shard to the same size, so all ranks hold the same
bytes; DDP ranks are identical.

Not seen, as for one device: memory allocated below the dispatcher (the communication
library's own staging buffers: gloo's, NCCL's), CUDA context and workspaces, fragmentation.

Checked against real 2-rank gloo steps of gpt-tiny on CPU (each rank's glibc in-use bytes,
sampled after every op, less the non-tensor offset measured the same way on one device): DDP
within 0.2 % (micro-batch 1 and 4, with and without accumulation), FSDP 1-3 % low (gloo's
copy of each reduce-scatter input and its transfer buffers). The profiler's CPU allocator
count is not usable as truth here: it drifts upward by whole gradient-sized blocks, differently
on each run and rank (frees on gloo's worker threads, where the profiler is off, appear not to
be subtracted), while the malloc count stays put.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from profilers import memory_blocks
from profilers.fake_kernels import TraceOverBudget
from profilers.isolate import Isolation, run_isolated
from profilers.memory_blocks import extend_raw, require_identical_blocks
from profilers.memory_records import TARGET_DEVICE_TYPES, MemoryBreakdown, MemoryTrace
from profilers.workload import BlockScalableWorkload, StepSpec, Workload, optimizer_primer

if TYPE_CHECKING:
    import torch

    from profilers.memory_tracing import RawTrace
    from profilers.workload import TrainStep

DISTRIBUTED_PARALLELISMS: tuple[str, ...] = ("ddp", "fsdp")
# gpt-tiny: ~1.5 s per spec once torch is imported (~5 s); bigger models trace longer.
DEFAULT_ISOLATION = Isolation(timeout_s=900.0, num_threads=1)
# A deep model's rank is traced from copies with this many blocks (trace_scaled), one more than
# one device's (2, 3): the shallower copy must have a block between its last and its first
# (block 1 of trace_scaled), whose moments differ from both under FSDP's prefetch. With (2, 3)
# and the rest of backward as one window, gpt-tiny's 8-block FSDP rank read 2-15% high; with
# (3, 4) exact, in one window or per block.
SCALE_FROM_BLOCKS: tuple[int, int] = (3, 4)


class DistributedTraceError(RuntimeError):
    """The isolated trace failed; the message names the spec and the child's reason."""


def trace_distributed_step_memory(
    workload: Workload,
    spec: StepSpec,
    *,
    target_device_type: str = "cpu",
    isolation: Isolation = DEFAULT_ISOLATION,
    whole: bool = False,
) -> MemoryTrace:
    """Per-rank memory of one DDP or FSDP step (``spec.parallelism``, ``spec.world_size``).

    Runs in a child process (the fake process group is process-global); raises
    :class:`DistributedTraceError` if the child fails, times out or runs out of memory.
    ``target_device_type="cuda"`` rounds every storage to the CUDA allocator's 512-byte blocks.
    ``whole``: trace the whole model even when it could be traced from shallow copies (a check
    of that extension).
    """
    (trace,) = trace_distributed_step_memories(
        workload, [spec], target_device_type=target_device_type, isolation=isolation, whole=whole
    )
    return trace


def trace_distributed_step_memories(
    workload: Workload,
    specs: Sequence[StepSpec],
    *,
    target_device_type: str = "cpu",
    isolation: Isolation = DEFAULT_ISOLATION,
    whole: bool = False,
) -> list[MemoryTrace]:
    """:func:`trace_distributed_step_memory` for several specs in ONE child (torch is imported
    once: a few seconds saved per spec); ``isolation.timeout_s`` bounds them all together."""
    _check(specs, target_device_type)
    outcome = run_isolated(
        isolation, trace_in_this_process, workload, list(specs), target_device_type, whole=whole
    )
    if not outcome.ok:
        names = ", ".join(_describe(s) for s in specs)
        raise DistributedTraceError(
            f"tracing {names} failed ({outcome.status}): {outcome.reason}"
            + (f"\n{outcome.traceback}" if outcome.traceback else "")
        )
    traces: list[MemoryTrace] = outcome.value
    return traces


def trace_in_this_process(
    workload: Workload,
    specs: Sequence[StepSpec],
    target_device_type: str = "cpu",
    *,
    whole: bool = False,
) -> list[MemoryTrace]:
    """The child's body: one fake process group per world size, one trace per spec.

    Call it only in a process that has no default process group and will not use one after
    (normally through :func:`trace_distributed_step_memories`).
    """
    import torch.distributed as dist

    _check(specs, target_device_type)
    if dist.is_initialized():
        raise RuntimeError(
            "a process group is already initialised in this process: trace distributed memory "
            "in a fresh process (trace_distributed_step_memory isolates it for you)"
        )
    traces = []
    for spec in specs:
        with _fake_process_group(spec.world_size):
            cuda = target_device_type == "cuda"
            traces.append(_trace(workload, spec, cuda_rounding=cuda, whole=whole))
    return traces


def _check(specs: Sequence[StepSpec], target_device_type: str) -> None:
    if target_device_type not in TARGET_DEVICE_TYPES:
        raise ValueError(
            f"unknown target_device_type {target_device_type!r}: choose one of "
            f"{', '.join(TARGET_DEVICE_TYPES)}"
        )
    for spec in specs:
        if spec.parallelism not in DISTRIBUTED_PARALLELISMS:
            raise ValueError(
                f"{_describe(spec)} is not distributed: trace parallelism 'single' with "
                "profilers.memory.trace_step_memory"
            )


def _describe(spec: StepSpec) -> str:
    return (
        f"{spec.parallelism} x{spec.world_size} {spec.precision}/"
        f"{spec.activation_checkpointing}/b={spec.micro_batch_size}x{spec.grad_accum_steps}"
        + ("" if spec.fsdp_reshard_after_forward else " kept gathered")
    )


@contextlib.contextmanager
def _fake_process_group(world_size: int) -> Iterator[None]:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


# -- the trace ------------------------------------------------------------------------------------


def _trace(
    workload: Workload, spec: StepSpec, *, cuda_rounding: bool, whole: bool = False
) -> MemoryTrace:
    """The rank's trace: from two shallow copies for a deep model whose blocks are identical
    (:func:`trace_scaled`), whole otherwise or if that fails."""
    started = time.perf_counter()
    scaling = None if whole else rank_depth_scaling(workload)
    if scaling is not None:
        assert isinstance(workload, BlockScalableWorkload)
        try:
            return trace_scaled(workload, spec, cuda_rounding=cuda_rounding, scaling=scaling)
        except TraceOverBudget:  # the profile's time is spent: not whole either
            raise
        except Exception:  # a model whose forward needs all its blocks: trace it whole
            pass
    # An FSDP rank of repeated blocks is cut per block even when traced whole: its windows'
    # sharded and unsharded bytes reshard it to other world sizes (MemoryModel.resharded).
    split = (
        workload.step_blocks
        if spec.parallelism == "fsdp" and isinstance(workload, BlockScalableWorkload)
        else None
    )
    raw = trace_raw(workload, spec, cuda_rounding=cuda_rounding, split_blocks=split)
    return raw.assemble(spec, cuda_rounding=cuda_rounding, started=started)


def trace_scaled(
    workload: BlockScalableWorkload,
    spec: StepSpec,
    *,
    cuda_rounding: bool,
    scaling: memory_blocks.DepthScaling,
) -> MemoryTrace:
    """A rank of the ``scaling.layers``-block model from copies with ``scaling.depths`` blocks
    (:func:`rank_depth_scaling`: :data:`SCALE_FROM_BLOCKS` periods), window by window
    (:mod:`profilers.memory_blocks` says why a line holds per window).

    Backward after the last block is cut per block. The blocks' windows of the deep model
    differ only by position: block 0 has no block below it to prefetch, the others all do,
    and within blocks 1 … L-2 the live bytes are affine in the block's index, so their largest
    is at block 1 or at block L-2. Each of those, block 0 and "E" (after block 0) is one moment
    whose place does not move with L, extended along its own line: block L-2 from block
    k1-2 and k2-2 of the copies, block 1 and block 0 from the same block of both. The largest
    window at L is the forward+backward peak.

    ``scaling.prefix``, ``scaling.period``: the first blocks are built unlike the rest and the
    others repeat with this period (``ModelFacts.uniform_blocks_from``, ``block_period``): the
    copies keep the prefix and 3 and 4 periods, and the bytes are affine in the index within
    each phase of the period, so every block up to the second period's end is a window of its
    own (block 1's part above) and so is each of the last period's (block L-2's part)."""
    require_identical_blocks(spec)
    started = time.perf_counter()
    (k1, k2), prefix, period = scaling.depths, scaling.prefix, scaling.period
    low, high = (
        trace_raw(
            workload.with_blocks(k),
            spec,
            cuda_rounding=cuda_rounding,
            split_blocks=workload.step_blocks,
        )
        for k in (k1, k2)
    )
    pairs = {
        **{w: (w, w) for w in ("F", "A", "E")},
        **{f"last block - {j}": (f"bw{k1 - 2 - j}", f"bw{k2 - 2 - j}") for j in range(period)},
        **{f"block {i}": (f"bw{i}", f"bw{i}") for i in range(prefix + 2 * period)},
    }
    windows = {k: ab for k, ab in pairs.items() if ab[0] in low.windows and ab[1] in high.windows}
    seen = {w for pair in windows.values() for w in pair}
    interior = {f"bw{i}" for i in range(prefix + 2 * period, k2)}
    left_out = (set(low.windows) | set(high.windows)) - seen - interior
    if left_out or not {"F", "A"} & set(windows) or "E" not in windows:
        raise ValueError(
            f"the {k1}- and {k2}-block traces have unexpected windows ({sorted(low.windows)} "
            f"vs {sorted(high.windows)})"
        )
    scaled = extend_raw(low, high, windows=windows, blocks=(k1, k2), num_layers=scaling.layers)
    trace = scaled.assemble(spec, cuda_rounding=cuda_rounding, started=started)
    return dataclasses.replace(trace, scaled_from_blocks=(k1, k2))


def rank_depth_scaling(workload: Workload) -> memory_blocks.DepthScaling | None:
    """How a rank of ``workload`` is traced from shallow copies (:data:`SCALE_FROM_BLOCKS`
    periods each), when it is a :class:`BlockScalableWorkload` deeper than the two copies
    together past any blocks built unlike the rest (:func:`profilers.memory_blocks.
    depth_scaling`); else None: traced whole."""
    return memory_blocks.depth_scaling(
        workload, SCALE_FROM_BLOCKS, min_layers=sum(SCALE_FROM_BLOCKS) + 1
    )


def trace_raw(
    workload: Workload,
    spec: StepSpec,
    *,
    cuda_rounding: bool,
    split_blocks: Callable[[Any], Sequence[torch.nn.Module]] | None = None,
) -> RawTrace:
    """One rank's step, per window when ``split_blocks(step)`` names the repeated blocks
    (``memory_tracing.PeakWindows``: "A" up to the last block's backward, then one per
    block); one window, "all", otherwise."""
    from profilers import memory_tracing as single

    round_bytes = single.cuda_block_bytes if cuda_rounding else single._identity
    with contextlib.ExitStack() as stack:
        single.enter_step_tracing(stack, cuda_rounding=cuda_rounding)
        stack.enter_context(_sharded_scaler_updates_untraced())
        if spec.parallelism == "ddp":
            with _ddp_without_init_collectives():
                step = workload.build_step(spec, "cpu", from_meta=True)
            _make_ddp_traceable(step.model)
            tracker: Any = single._StepMemTracker()
            tracker.track_external(step.model, step.optimizer)
            breakdown: Callable[[Any], MemoryBreakdown] = single._breakdown
        else:
            step = workload.build_step(spec, "cpu", from_meta=True)
            tracker = _fsdp_tracker(step)
            breakdown = _fsdp_breakdown
        with tracker:
            tracker.calibrate_grad_sums()
        gradient_bytes = 0
        windows: dict[str, MemoryBreakdown] = {}
        bounds: dict[str, tuple[int, int]] = {}
        prime = optimizer_primer(step) if _primable(spec) else None
        if prime is not None:  # the first iteration without its forward/backward
            with tracker:
                prime()
        # A model with no repeated blocks (Zamba2's layers share one) is one window.
        blocks = tuple(split_blocks(step)) if split_blocks is not None else ()
        for iteration in range(0 if prime is None else 1, 2):  # the second is measured
            tracker.reset_mod_stats()
            if blocks:
                tracker.start_windows(blocks[-1], blocks)
            with tracker, single._on_autocast_cache_clear(tracker.autocast_cache_cleared):
                batches = step.synthetic_batches()
                loss = step.forward_backward(batches)
                if blocks:
                    windows = {k: breakdown(v) for k, v in tracker.finish_windows().items()}
                    bounds = dict(getattr(tracker, "bounds", {}))
                else:
                    windows = {"all": breakdown(tracker.get_tracker_snapshot("peak"))}
                if iteration == 0 and spec.parallelism == "ddp":
                    _label_buckets_as_gradients(tracker, step)
                grads = [p.grad for p in step.model.parameters() if p.grad is not None]
                gradient_bytes = _storage_bytes(grads, round_bytes)
                del grads
            with tracker:
                step.optimizer_step()
                optimizer_step = breakdown(tracker.get_tracker_snapshot("peak"))
            del batches, loss
        resident = single._total(tracker.get_tracker_snapshot("current"))
        parameter_bytes = _storage_bytes(step.model.parameters(), round_bytes)
        optimizer_state_bytes = _storage_bytes(
            (v for state in step.optimizer.state.values() for v in state.values()), round_bytes
        )
    return single.RawTrace(
        windows=windows,
        optimizer_step=optimizer_step,
        parameter_bytes=parameter_bytes,
        gradient_bytes=gradient_bytes,
        optimizer_state_bytes=optimizer_state_bytes,
        resident_bytes=resident,
        reshard_windows=bounds,
    )


def _primable(spec: StepSpec) -> bool:
    """Whether the iteration before the measured one may be primed (``PrimableStep``: the
    optimizer's state made without a forward and backward) instead of run.

    Not DDP: its reducer's buckets are first seen in the first backward and labelled there.
    Not FSDP in fp32: with no parameter dtype, a unit's first forward allocates the all-gather
    outputs that become its unsharded parameters (FSDP2's ``init_all_gather_outputs``), as
    activations; later steps reuse them. Measuring that first forward moves bytes between
    categories (gpt-tiny kept gathered: one block's parameters counted as activations at the
    peak; the totals equal). bf16 and fp16 ranks trace field for field as with a real first
    iteration (tests/profilers/test_memory_primed.py and benchmarks/trace_speed.py: bf16; fp16
    checked on gpt-tiny and a 2-layer hf: Llama when this was written)."""
    return spec.parallelism == "fsdp" and spec.precision != "fp32"


def _storage_bytes(tensors: Iterable[Any], round_bytes: Callable[[int], int]) -> int:
    """Distinct local storages behind ``tensors`` (a DTensor counts its local shard)."""
    from torch.distributed.tensor import DTensor

    from profilers.memory_tracing import _storage_bytes as single_storage_bytes

    local = (t.to_local() if isinstance(t, DTensor) else t for t in tensors)
    return single_storage_bytes(local, round_bytes)


# -- FSDP2 ----------------------------------------------------------------------------------------

# What a rank holds 1/N of at N ranks: its parameter shards, sharded gradients, optimizer state.
_SHARDED_CATEGORIES = frozenset({"Sharded Param", "Sharded Grad", "OptState"})

# FSDPMemTracker's categories (``_FSDPRefType`` values) -> MemoryBreakdown fields.
_FSDP_CATEGORY_FIELDS = {
    "Sharded Param": "parameters",
    "Unsharded Param": "parameters",
    "Buffer": "buffers",
    "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients",
    "OptState": "optimizer_state",
    "Activation": "activations",
    "Inputs": "activations",
    "Temp": "temporaries",
    "All Gather": "communication",
    "Reduce Scatter": "communication",
}


def _fsdp_tracker(step: TrainStep) -> Any:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from profilers.memory_grad_sums import GradSumsInPlace
    from profilers.memory_tracing import GlobalPeakOnly, PeakWindows

    class _FSDPStepMemTracker(GradSumsInPlace, PeakWindows, GlobalPeakOnly, FSDPMemTracker):
        """FSDPMemTracker that accepts gradient accumulation (as ``_StepMemTracker`` does)
        and sums gradients in place where the engine would.

        A second forward of the root in one tracked region raises ("multiple iterative
        calls"): it guards the per-module stats, which are not read here, so a new root
        forward restarts them. Peak windows as one device's (``PeakWindows``): "F" opens at
        the root's forward; a block's backward ends when its FSDP unit has run its
        post-backward (its gradients reduce-scattered, its parameters resharded).
        """

        # Per window: the most unsharded and the most sharded bytes live at any moment
        # (MemoryTrace.reshard_windows), noted at every update of the live bytes.
        bounds: dict[str, tuple[int, int]]

        def start_windows(self, split_after: Any, blocks: tuple[Any, ...] = ()) -> None:
            super().start_windows(split_after, blocks)
            self.bounds = {}
            self._note_bounds()

        def close_window(self, following: str) -> None:
            super().close_window(following)
            self._note_bounds()

        def _update_peak_stats(self, peak_state: Any) -> None:
            super()._update_peak_stats(peak_state)
            self._note_bounds()

        def _note_bounds(self) -> None:
            if self.split_after is None:
                return
            unsharded = sharded = 0
            for snapshot in self._curr_mem_snap.values():
                for key, num_bytes in snapshot.items():
                    if key == "Total":
                        continue
                    if getattr(key, "value", key) in _SHARDED_CATEGORIES:
                        sharded += num_bytes
                    else:
                        unsharded += num_bytes
            held = self.bounds.get(self.window, (0, 0))
            self.bounds[self.window] = (max(held[0], unsharded), max(held[1], sharded))

        def _fsdp_param_group_post_backward(self, fsdp_mod: Any, orig: Any) -> Any:
            inner = super()._fsdp_param_group_post_backward(fsdp_mod, orig)

            @functools.wraps(orig)
            def then_split(*args: Any, **kwargs: Any) -> None:
                inner(*args, **kwargs)
                self.block_backward_ended(fsdp_mod)

            return then_split

        def _fsdp_state_pre_forward(self, fsdp_mod: Any, orig: Any) -> Any:
            inner = super()._fsdp_state_pre_forward(fsdp_mod, orig)

            @functools.wraps(orig)
            def restart_per_micro_batch(*args: Any, **kwargs: Any) -> Any:
                name = self._mod_tracker.get_known_fqn(fsdp_mod)
                outer = set(self._mod_tracker.parents) - {name}
                root = not self._mod_tracker.is_bw and outer == {"Global"}
                if root and self.split_after is not None:
                    self.close_window("F")
                if root and fsdp_mod in self.memory_tracking:
                    self.reset_mod_stats()
                return inner(*args, **kwargs)

            return restart_per_micro_batch

    return _FSDPStepMemTracker(step.model, step.optimizer)


def _fsdp_breakdown(snapshot: dict[torch.device, dict[Any, int]]) -> MemoryBreakdown:
    counts = dict.fromkeys((f.name for f in dataclasses.fields(MemoryBreakdown)), 0)
    for device_snapshot in snapshot.values():
        for key, num_bytes in device_snapshot.items():
            if key != "Total":
                counts[_FSDP_CATEGORY_FIELDS[key.value]] += num_bytes
    return MemoryBreakdown(**counts)


@contextlib.contextmanager
def _sharded_scaler_updates_untraced() -> Iterator[None]:
    """Trace an fp16 FSDP step's scale update as taken without overflow.

    The trainer's FSDP fp16 scaler (``ShardedGradScaler``) updates a scale that lives on the
    CPU in Python, reading ``found_inf.item()``; a fake tensor has no value (on CUDA the
    update is one kernel and reads nothing back). It changes two scalars in place and
    allocates nothing worth counting, so the trace skips it (every fp16 FSDP rank trace
    failed with ``DataDependentOutputException`` before).
    """
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from profilers.memory_tracing import _patched

    def unchanged(self: Any, found_inf: Any) -> None:
        return None

    with _patched(ShardedGradScaler, "_amp_update_scale_cpu_", unchanged):
        yield


# -- DDP ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _ddp_without_init_collectives() -> Iterator[None]:
    """DDP's construction-time collectives read real data; across identical ranks they are
    no-ops (shapes agree; rank 0's values are broadcast in place) and leave nothing allocated."""
    import torch.nn.parallel.distributed as ddp_module

    from profilers.memory_tracing import _patched

    def skip(*args: Any, **kwargs: Any) -> None:
        return None

    with (
        _patched(ddp_module, "_verify_param_shape_across_processes", skip),
        _patched(ddp_module, "_sync_module_states", skip),
    ):
        yield


class _ReducerWithoutRebuild:
    """The reducer, with its first-iteration bucket rebuild skipped (see the module docstring):
    the rebuild broadcasts the new layout by reading a tensor's data."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def _rebuild_buckets(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)


def _make_ddp_traceable(model: torch.nn.Module) -> None:
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        raise TypeError(
            f"parallelism 'ddp' but the workload's step model is {type(model).__name__}, not "
            "DistributedDataParallel: the workload must wrap it as its trainer does"
        )
    world_size = model.process_group.size()
    # A lambda: DDP checks a hook's annotations against dist.GradBucket, and this module's
    # annotations are strings (``from __future__ import annotations``).
    model.register_comm_hook(None, lambda state, bucket: _all_reduce_in_place(bucket, world_size))
    model.reducer = _ReducerWithoutRebuild(model.reducer)


def _all_reduce_in_place(bucket: Any, world_size: int) -> torch.futures.Future[torch.Tensor]:
    """The default hook divides the bucket in place and all-reduces it in place: no new
    storage. The fake group's all-reduce returns no tensor, so the bucket itself is returned."""
    import torch

    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(bucket.buffer().div_(world_size))
    return future


def _label_buckets_as_gradients(tracker: Any, step: TrainStep) -> None:
    """The buckets were first seen as the output of the reducer's copy in backward (labelled
    temporaries); with gradient_as_bucket_view they are the gradients' storage."""
    from torch.distributed._tools.mem_tracker import _MemRefType

    for p in step.model.parameters():
        if p.grad is not None:
            tracker._update_and_maybe_create_winfos(p.grad, _MemRefType.GRAD)
