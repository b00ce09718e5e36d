"""Real, timed training steps, and the step-time model fitted to them.

DESIGN.md, "Measuring well / Time": warm-up discarded, synchronise before reading timers, several
timed steps, keep every sample; fit t_fb(b) = t0 + k*b per (precision, checkpointing) and time
the optimizer step separately. On a noisy host (this 2-vCPU machine varies up to 35% run to run)
one config measured after another confounds the config with drift in the machine, so
:func:`measure_interleaved` builds every config once and takes their samples round-robin.

Timing discipline (nanoGPT's): on CUDA, three events bracket forward+backward and the optimizer
step on the current stream and ONE host-device sync per step reads them, so the optimizer's
kernels queue behind backward exactly as in training. On CPU every op returns when done, so
``time.perf_counter`` needs no sync. Other accelerators synchronise around each phase.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from profilers.fit import AffineFit, fit_affine
from profilers.host_activity import HostMeter
from profilers.workload import Batch, StepSpec, TrainStep, Workload

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True, slots=True)
class StepTiming:
    """Every timed (post-warm-up) step of one config, in seconds; samples are paired by index."""

    spec: StepSpec
    device: str
    num_warmup: int
    forward_backward_s: tuple[float, ...]
    optimizer_s: tuple[float, ...]
    clock: str = "perf_counter"  # or "cuda_events"
    # Intra-op threads the steps ran with (0: not recorded). A group's fit is made of its
    # timings at the most threads; fewer (CPU: a rank's share of the cores) give its split ratio.
    threads: int = 0
    # The share of the host's CPU time other processes (and a hypervisor's steal) took while
    # the child that timed it ran its steps (profilers.host_activity); None: not measured.
    host_others_share: float | None = None

    def __post_init__(self) -> None:
        if len(self.forward_backward_s) != len(self.optimizer_s):
            raise ValueError("forward_backward_s and optimizer_s must pair up (same length)")
        if not self.forward_backward_s:
            raise ValueError("a StepTiming needs at least one timed step")

    @property
    def step_s(self) -> tuple[float, ...]:
        return tuple(a + b for a, b in zip(self.forward_backward_s, self.optimizer_s, strict=True))

    @property
    def median_forward_backward_s(self) -> float:
        return statistics.median(self.forward_backward_s)

    @property
    def median_optimizer_s(self) -> float:
        return statistics.median(self.optimizer_s)

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_s)

    @property
    def tokens_per_step(self) -> int:
        """Tokens one device processes per optimizer step."""
        return self.spec.micro_batch_size * self.spec.grad_accum_steps * self.spec.seq_len

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.median_step_s

    def to_dict(self) -> dict[str, Any]:
        share = self.host_others_share
        return {
            "spec": self.spec.to_dict(),
            "device": self.device,
            "num_warmup": self.num_warmup,
            "clock": self.clock,
            "threads": self.threads,
            "forward_backward_s": list(self.forward_backward_s),
            "optimizer_s": list(self.optimizer_s),
            # Derived, for readers of profile.json; from_dict ignores them.
            "median_forward_backward_s": self.median_forward_backward_s,
            "median_optimizer_s": self.median_optimizer_s,
            "median_step_s": self.median_step_s,
            "tokens_per_step": self.tokens_per_step,
            "tokens_per_s": self.tokens_per_s,
        } | ({"host_others_share": share} if share is not None else {})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepTiming:
        return cls(
            spec=StepSpec.from_dict(data["spec"]),
            device=str(data["device"]),
            num_warmup=int(data["num_warmup"]),
            forward_backward_s=tuple(float(x) for x in data["forward_backward_s"]),
            optimizer_s=tuple(float(x) for x in data["optimizer_s"]),
            clock=str(data.get("clock", "perf_counter")),
            threads=int(data.get("threads", 0)),
            host_others_share=(
                float(data["host_others_share"])
                if data.get("host_others_share") is not None
                else None
            ),
        )


class StepTimer:
    """A context manager around one built step: ``warm_up()``, then ``sample()`` as often as
    wanted, then ``timing()``. Builds the model on enter and drops it on exit.

    The same synthetic batches (seeded) are fed to every step: data loading is the input
    probe's business, not this one's.
    """

    def __init__(
        self, workload: Workload, spec: StepSpec, device: str | torch.device, *, seed: int = 0
    ) -> None:
        self.workload, self.spec, self.seed = workload, spec, seed
        self.device_name = str(device)
        self._device_type = self.device_name.split(":")[0]
        self._step: TrainStep | None = None
        self._batches: list[Batch] = []
        self._num_warmup = 0
        self._fb: list[float] = []
        self._opt: list[float] = []

    def __enter__(self) -> StepTimer:
        import torch

        step = self.workload.build_step(self.spec, self.device_name)
        generator = torch.Generator().manual_seed(self.seed)
        self._step, self._batches = step, list(step.synthetic_batches(generator))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._step, self._batches = None, []
        if self._device_type == "cuda":
            import torch

            torch.cuda.empty_cache()  # give the next config the memory this one cached

    @property
    def clock(self) -> str:
        return "cuda_events" if self._device_type == "cuda" else "perf_counter"

    def warm_up(self, num_steps: int) -> None:
        """Untimed steps: allocator caches, autotuning, lazy init, first-touch page faults."""
        for _ in range(num_steps):
            self._run_step()
            self._num_warmup += 1

    def sample(self) -> tuple[float, float]:
        """Time one step: (forward+backward seconds, optimizer-step seconds)."""
        fb_s, opt_s = self._run_step()
        self._fb.append(fb_s)
        self._opt.append(opt_s)
        return fb_s, opt_s

    def transient_bytes(self) -> int:
        """One untimed step whose forward+backward's allocator peak above its start is measured
        (:func:`profilers.memory_truth.forward_backward_transient_bytes`); call after warm-up."""
        from profilers.memory_truth import forward_backward_transient_bytes

        step = self._step
        if step is None:
            raise RuntimeError("StepTimer is used outside its `with` block")
        peak = forward_backward_transient_bytes(step, self._batches, self._device_type)
        step.optimizer_step()
        return peak

    def timing(self) -> StepTiming:
        import torch

        return StepTiming(
            spec=self.spec,
            device=self.device_name,
            num_warmup=self._num_warmup,
            forward_backward_s=tuple(self._fb),
            optimizer_s=tuple(self._opt),
            clock=self.clock,
            threads=torch.get_num_threads() if self._device_type == "cpu" else 0,
        )

    def _run_step(self) -> tuple[float, float]:
        step = self._step
        if step is None:
            raise RuntimeError("StepTimer is used outside its `with` block")
        if self._device_type == "cuda":
            return self._run_cuda(step)
        if self._device_type == "cpu":
            # CPU kernels (intra-op threads included) have finished when the call returns.
            t0 = time.perf_counter()
            step.forward_backward(self._batches)
            t1 = time.perf_counter()
            step.optimizer_step()
            t2 = time.perf_counter()
            return t1 - t0, t2 - t1
        self._synchronize()  # start from an idle device
        t0 = time.perf_counter()
        step.forward_backward(self._batches)
        self._synchronize()  # host-device sync: backward's kernels must be done to stop its clock
        t1 = time.perf_counter()
        step.optimizer_step()
        self._synchronize()  # host-device sync: the optimizer's kernels are done
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1

    def _run_cuda(self, step: TrainStep) -> tuple[float, float]:
        import torch

        start, middle, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        # Events are recorded on the current stream, in order with the step's kernels: no sync.
        start.record()
        step.forward_backward(self._batches)
        middle.record()
        step.optimizer_step()  # fp16: GradScaler.step syncs once inside (its inf check)
        end.record()
        end.synchronize()  # host-device sync: the one per step, so elapsed_time can be read
        return start.elapsed_time(middle) / 1e3, middle.elapsed_time(end) / 1e3

    def _synchronize(self) -> None:
        import torch

        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None and hasattr(accelerator, "synchronize"):
            accelerator.synchronize()
        else:
            getattr(torch, self._device_type).synchronize()


def time_steps(
    workload: Workload,
    spec: StepSpec,
    device: str | torch.device,
    *,
    warmup: int = 2,
    repeats: int = 5,
    seed: int = 0,
) -> StepTiming:
    """Time ``repeats`` steps of one config after ``warmup`` untimed ones."""
    _check_counts(warmup=warmup, repeats=repeats)
    with StepTimer(workload, spec, device, seed=seed) as timer:
        timer.warm_up(warmup)
        for _ in range(repeats):
            timer.sample()
        return timer.timing()


def measure_interleaved(
    workload: Workload,
    specs: Sequence[StepSpec],
    device: str | torch.device,
    *,
    rounds: int = 5,
    warmup: int = 2,
    steps_per_round: int = 1,
    seed: int = 0,
    deadline: float | None = None,
) -> list[StepTiming]:
    """Time several configs round-robin: each round takes ``steps_per_round`` samples of every
    config in order, so slow drift of the host spreads over all of them instead of biasing one.

    Every config is built (and warmed up) before the first round and stays resident until the
    last: memory for all their models and optimizer states at once. One StepTiming per spec, in
    the order given, each with ``rounds * steps_per_round`` samples — fewer when ``deadline``
    (a ``time.perf_counter()`` reading) passes: no round starts after it, but the first always
    runs, so a caller's plan that underestimated its steps overruns by one round at most.
    """
    _check_counts(warmup=warmup, repeats=rounds)
    if steps_per_round < 1:
        raise ValueError(f"steps_per_round must be at least 1, got {steps_per_round}")
    if not specs:
        raise ValueError("measure_interleaved needs at least one StepSpec")
    with ExitStack() as stack:
        timers = [stack.enter_context(StepTimer(workload, s, device, seed=seed)) for s in specs]
        for timer in timers:
            timer.warm_up(warmup)
        for position, index in enumerate(round_robin(len(timers), rounds)):
            first_round = position < len(timers)
            if index == 0 and not first_round and deadline and time.perf_counter() > deadline:
                break
            for _ in range(steps_per_round):
                timers[index].sample()
        return [timer.timing() for timer in timers]


def interleaved_child(
    workload: Workload, specs: Sequence[StepSpec], device: str, budget_s: float, rounds: int
) -> list[dict[str, Any]]:
    """A profiler child's body (top level: pickled by reference): ``specs`` timed round-robin
    after one warm-up step each, as many rounds (up to ``rounds``) as ``budget_s`` allows.
    On a CPU, glibc malloc's thresholds are pinned first (:mod:`profilers.host_allocator`):
    configs that alternate would otherwise churn the heap as no one-config training run does."""
    from profilers.host_allocator import steady_malloc

    deadline = time.perf_counter() + budget_s
    if not str(device).startswith("cuda"):
        steady_malloc()
    with HostMeter() as meter:
        timings = measure_interleaved(
            workload, specs, device, rounds=rounds, warmup=1, deadline=deadline
        )
    return [with_host_share(t, meter).to_dict() for t in timings]


def with_host_share(timing: StepTiming, meter: HostMeter) -> StepTiming:
    """``timing`` with the share of the host others took while ``meter`` ran (None: unread)."""
    return dataclasses.replace(timing, host_others_share=meter.others_share)


def largest_host_share(timings: Iterable[StepTiming]) -> float | None:
    """The largest share of the host others took while ``timings`` were measured; None when
    none of them measured it (profiles before the host meter)."""
    return max((s for t in timings if (s := t.host_others_share) is not None), default=None)


def round_robin(num_configs: int, rounds: int) -> list[int]:
    """The order :func:`measure_interleaved` visits configs: 0, 1, ..., n-1, 0, 1, ..."""
    return [index for _ in range(rounds) for index in range(num_configs)]


def _check_counts(*, warmup: int, repeats: int) -> None:
    if warmup < 0:
        raise ValueError(f"warmup must be 0 or more steps, got {warmup}")
    if repeats < 1:
        raise ValueError(f"at least one timed step (repeats/rounds) is needed, got {repeats}")


# --- the step-time model ---------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class TimeModel:
    """Step time of one (precision, checkpointing) group as a function of micro-batch size.

    t_step(b, accum) = accum * t_fb(b) + t_opt, where t_fb(b) = t0 + k*b is one micro-batch's
    forward+backward (affine in b, least squares over every sample) and t_opt is the median
    optimizer step, which does not depend on b. On CPU throughput goes flat or falls past
    b ~ 8 (DESIGN.md), so predictions outside the fitted range are extrapolations.
    """

    precision: str
    activation_checkpointing: str
    seq_len: int
    parallelism: str
    world_size: int
    device: str
    forward_backward: AffineFit  # seconds per micro-batch vs micro-batch size
    optimizer_s: float
    # CPU: a step with ``split_threads`` intra-op threads (a rank's share when the cores are
    # split between ranks) over the same step with the default ``threads``; None = not measured.
    threads: int = 0
    split_threads: int = 0
    split_ratio: float | None = None
    # The loss over this many chunks (profilers.phases_chunked: the plain fit plus a measured
    # delta); 1 (and records written before the knob): the plain loss.
    loss_chunks: int = 1
    # Not fitted through this group's own timings but the fit of this checkpointing setting
    # (of the same precision) plus a same-child delta measured beside it at two sizes
    # (profilers.phases_recompute); empty: fitted through its own timings.
    delta_from: str = ""
    # A delta model's (delta_time_model) own uncertainty: the standard error of the measured
    # delta over this model's forward+backward, the larger of its two sizes, from the paired
    # same-round differences; None: not a delta model, or the child timed one round only.
    delta_sd: float | None = None

    def rank_slowdown(self, world_size: int) -> float | None:
        """A rank's step time over this (all-thread) one when ``world_size`` ranks split the
        threads (the launcher gives each ``threads // world_size``), if that share was timed."""
        if self.split_ratio is None or not self.split_threads or not self.threads:
            return None
        return self.split_ratio if self.threads // world_size == self.split_threads else None

    def forward_backward_s(self, micro_batch_size: int) -> float:
        return self.forward_backward.predict(micro_batch_size)

    def predict(self, micro_batch_size: int, grad_accum_steps: int = 1) -> float:
        """Seconds per optimizer step (may be meaningless if the fit's intercept is negative
        and b is below the fitted range: check ``forward_backward.xs``)."""
        return grad_accum_steps * self.forward_backward_s(micro_batch_size) + self.optimizer_s

    def tokens_per_s(self, micro_batch_size: int, grad_accum_steps: int = 1) -> float:
        """Tokens per second on one device (multiply by the world size for the job's)."""
        tokens = micro_batch_size * grad_accum_steps * self.seq_len
        return tokens / self.predict(micro_batch_size, grad_accum_steps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "activation_checkpointing": self.activation_checkpointing,
            "seq_len": self.seq_len,
            "parallelism": self.parallelism,
            "world_size": self.world_size,
            "device": self.device,
            "forward_backward": self.forward_backward.to_dict(),
            "optimizer_s": self.optimizer_s,
            "threads": self.threads,
            "split_threads": self.split_threads,
            "split_ratio": self.split_ratio,
            "loss_chunks": self.loss_chunks,
            # Only when set: profiles and the records that embed them read as before.
            **({"delta_from": self.delta_from} if self.delta_from else {}),
            **({"delta_sd": self.delta_sd} if self.delta_sd is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimeModel:
        return cls(
            precision=str(data["precision"]),
            activation_checkpointing=str(data["activation_checkpointing"]),
            seq_len=int(data["seq_len"]),
            parallelism=str(data["parallelism"]),
            world_size=int(data["world_size"]),
            device=str(data["device"]),
            forward_backward=AffineFit.from_dict(data["forward_backward"]),
            optimizer_s=float(data["optimizer_s"]),
            threads=int(data.get("threads", 0)),
            split_threads=int(data.get("split_threads", 0)),
            split_ratio=(None if data.get("split_ratio") is None else float(data["split_ratio"])),
            loss_chunks=int(data.get("loss_chunks", 1)),
            delta_from=str(data.get("delta_from", "")),
            delta_sd=None if data.get("delta_sd") is None else float(data["delta_sd"]),
        )


def delta_time_model(
    plain: TimeModel,
    base: Sequence[StepTiming],
    other: Sequence[StepTiming],
    *,
    non_negative: bool = False,
) -> TimeModel:
    """``plain`` (a fit through a group's own timings) plus the forward+backward excess of
    ``other`` over ``base``, timed beside each other in one child at the same two sizes
    (medians per size), affine in the micro-batch size. The caller names what ``other`` is
    (its checkpointing, its loss chunks). On a shared host a step's time drifts up to 35%
    between children (DESIGN.md), so a group timed in another child than ``plain``'s would
    compare the host's moods; the same-child difference does not. The split-thread ratio is
    ``plain``'s own measurement, not this one's: cleared. ``non_negative``: ``other`` does
    ``base``'s work and more (a recompute), so a difference measured below zero at a size is
    the host's noise and counts as zero there.

    ``delta_sd``: how far the delta itself may be off, from its own samples. The children
    time round-robin, so the i-th sample of each group at a size is from the same round; the
    standard error of the mean of those paired differences, over the model's forward+backward
    at that size, the larger of the two sizes (None with a single round: no spread to read).
    The 7th regret session's recompute child timed blocks:2 36 ms under none at micro-batch 8
    (noise: a recompute only adds work) on a 0.7 s step; the delta's error was nowhere in the
    interval."""

    def samples(timings: Sequence[StepTiming], b: int) -> list[float]:
        return [s for t in timings if t.spec.micro_batch_size == b for s in t.forward_backward_s]

    def median_fb(timings: Sequence[StepTiming], b: int) -> float:
        return statistics.median(samples(timings, b))

    def standard_error(b: int) -> float | None:
        pairs = list(zip(samples(other, b), samples(base, b), strict=False))
        if len(pairs) < 2:
            return None
        return statistics.stdev(o - p for o, p in pairs) / math.sqrt(len(pairs))

    sizes = sorted(
        {t.spec.micro_batch_size for t in base} & {t.spec.micro_batch_size for t in other}
    )
    if len(sizes) < 2:
        raise ValueError("a same-child delta needs both groups timed at two sizes")
    small, large = sizes[0], sizes[-1]
    d_small = median_fb(other, small) - median_fb(base, small)
    d_large = median_fb(other, large) - median_fb(base, large)
    if non_negative:
        d_small, d_large = max(d_small, 0.0), max(d_large, 0.0)
    slope = (d_large - d_small) / (large - small)
    delta = AffineFit(
        intercept=d_small - slope * small,
        slope=slope,
        xs=(float(small), float(large)),
        ys=(d_small, d_large),
    )
    fb = plain.forward_backward
    errors = [(standard_error(b), fb.predict(b) + delta.predict(b)) for b in (small, large)]
    known = [se / total for se, total in errors if se is not None and total > 0]
    return dataclasses.replace(
        plain,
        forward_backward=AffineFit(
            intercept=fb.intercept + delta.intercept,
            slope=fb.slope + delta.slope,
            xs=fb.xs,
            ys=tuple(y + delta.predict(x) for x, y in zip(fb.xs, fb.ys, strict=True)),
        ),
        split_threads=0,
        split_ratio=None,
        delta_sd=max(known) if len(known) == 2 else None,
    )


def _group_key(timing: StepTiming) -> tuple[str, str, int, str, int, str, int]:
    s = timing.spec
    return (
        s.precision,
        s.activation_checkpointing,
        s.seq_len,
        s.parallelism,
        s.world_size,
        timing.device,
        s.loss_chunks,
    )


def fit_step_time(timings: Sequence[StepTiming]) -> TimeModel:
    """Fit one group: timings that differ only in micro-batch size (and accumulation).

    Each forward+backward sample is divided by its grad_accum_steps to get one micro-batch's
    time (probe with grad_accum_steps=1 to keep that exact). Needs two distinct micro-batch
    sizes.
    """
    if not timings:
        raise ValueError("fit_step_time needs timings of at least two micro-batch sizes")
    keys = {_group_key(t) for t in timings}
    if len(keys) > 1:
        raise ValueError(
            "fit_step_time fits one (precision, checkpointing, seq_len, parallelism, device) "
            f"group at a time, got {len(keys)}: use fit_step_times to fit them all"
        )
    most = max(t.threads for t in timings)
    split = [t for t in timings if t.threads < most]
    timings = [t for t in timings if t.threads == most]
    xs: list[float] = []
    ys: list[float] = []
    optimizer: list[float] = []
    for t in timings:
        xs += [float(t.spec.micro_batch_size)] * len(t.forward_backward_s)
        ys += [fb / t.spec.grad_accum_steps for fb in t.forward_backward_s]
        optimizer.extend(t.optimizer_s)
    precision, checkpointing, seq_len, parallelism, world_size, device, chunks = keys.pop()
    return TimeModel(
        precision=precision,
        activation_checkpointing=checkpointing,
        seq_len=seq_len,
        parallelism=parallelism,
        world_size=world_size,
        device=device,
        forward_backward=fit_affine(xs, ys),
        optimizer_s=statistics.median(optimizer),
        threads=most,
        loss_chunks=chunks,
        **_split(split, timings),
    )


def _split(split: Sequence[StepTiming], full: Sequence[StepTiming]) -> dict[str, Any]:
    """Median step time with fewer threads over the median at full threads, same micro-batch
    (the fewest-thread timing that has a full-thread partner)."""
    for t in sorted(split, key=lambda t: t.threads):
        same = [u for u in full if u.spec.micro_batch_size == t.spec.micro_batch_size]
        if same:
            full_s = statistics.median(x for u in same for x in u.step_s)
            return {"split_threads": t.threads, "split_ratio": t.median_step_s / full_s}
    return {}


def fit_step_times(timings: Sequence[StepTiming]) -> list[TimeModel]:
    """One TimeModel per group, in order of first appearance."""
    groups: dict[tuple[str, str, int, str, int, str, int], list[StepTiming]] = {}
    for t in timings:
        groups.setdefault(_group_key(t), []).append(t)
    return [fit_step_time(group) for group in groups.values()]


def profile_step_time(
    workload: Workload,
    spec: StepSpec,
    device: str | torch.device,
    *,
    micro_batch_sizes: Sequence[int] = (2, 8),
    rounds: int = 5,
    warmup: int = 2,
    seed: int = 0,
) -> tuple[list[StepTiming], TimeModel]:
    """Measure ``spec``'s group at each micro-batch size (accumulation 1), interleaved, and fit."""
    if len(set(micro_batch_sizes)) < 2:
        raise ValueError("profile_step_time needs two or more distinct micro_batch_sizes")
    specs = [
        dataclasses.replace(spec, micro_batch_size=b, grad_accum_steps=1) for b in micro_batch_sizes
    ]
    timings = measure_interleaved(workload, specs, device, rounds=rounds, warmup=warmup, seed=seed)
    return timings, fit_step_time(timings)
