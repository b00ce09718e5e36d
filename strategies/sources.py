"""Where the cost model's compute and communication times come from.

A :class:`TimeSource` answers a candidate's compute time (:class:`ComputeTime`), a
:class:`CommSource` a collective's time; :class:`strategies.cost.CostModel` combines them with
its formulas. The measured sources here read a profile's fits (:class:`MeasuredTime`,
:class:`MeasuredComm`); estimated ones for hardware the user does not have live in
:mod:`strategies.whatif`. Pure arithmetic over profile records (no device, no torch).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from profilers.checkpointing_fits import interpolated_time
from profilers.comm_records import CommFit, bus_bandwidth_factor, predict_collective_time
from profilers.compile_records import CompileMeasurement, find_compile
from profilers.fit import AffineFit
from profilers.flops import FlopCount
from profilers.profile_record import Fits, Profile
from profilers.throughput import TimeModel
from strategies.errors import Unpredictable
from strategies.space import Candidate

__all__ = [
    "CommSource",
    "ComputeTime",
    "MeasuredComm",
    "MeasuredTime",
    "TimeSource",
    "affine_seconds",
]

# -- records -------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ComputeTime:
    """One rank's compute for one candidate, before sharing and communication are applied.

    ``parallel_measured``: the time was measured with the candidate's own parallel wrapper and
    world size, so it already contains communication and any sharing of the host's cores.
    """

    forward_backward_s: float  # one micro-batch
    optimizer_s: float  # one optimizer step over the whole (unsharded) model
    source: str
    parallel_measured: bool = False
    # CPU: a rank's time on its share of the threads over the measured all-thread time, and
    # where it was measured when not in this candidate's own group ("" = its own).
    rank_slowdown: float | None = None
    rank_slowdown_from: str = ""
    # torch.compile: the measured cold compile the run pays once (0: eager), and the
    # measurement the forward+backward was divided by (its uncertainty: strategies.uncertainty).
    compile_s: float = 0.0
    compiled: CompileMeasurement | None = None
    # What its uncertainty is read from: the time fit used (None for an estimate) and whether
    # the time was derived rather than timed (strategies.uncertainty).
    fit: AffineFit | None = None
    derived: bool = False
    # blocks:K interpolated between two timed settings: their fits (no fit of its own), whose
    # probed sizes say how far outside them the candidate's micro-batch is.
    anchors: tuple[AffineFit, ...] = ()
    # Seconds per micro-batch: the standard error of a same-child delta added to the fit (the
    # recompute timed beside none, the loss chunks' cost; profilers.throughput.delta_time_model),
    # in quadrature when both are; 0 when none is, or its child timed one round only.
    delta_se_s: float = 0.0
    # An estimate's forward_backward_s split by what takes the time (strategies.roofline.PARTS:
    # gemm, attention, memory_bound, launch), seconds summing to it; empty when measured.
    parts: tuple[tuple[str, float], ...] = ()


class TimeSource(Protocol):
    """Compute time of a candidate; raises :class:`Unpredictable` naming what is missing."""

    def compute(self, candidate: Candidate) -> ComputeTime: ...


class CommSource(Protocol):
    """Seconds of one collective of ``num_bytes`` (nccl-tests' byte convention) on ``world``
    ranks; raises :class:`Unpredictable` naming what is missing."""

    def collective_s(self, collective: str, world_size: int, num_bytes: float) -> float: ...

    def describe(self, collective: str, world_size: int) -> str: ...


# -- measured sources ---------------------------------------------------------------------------


def affine_seconds(fit: AffineFit, micro_batch_size: int) -> float:
    """t0 + k·b from a time fit, kept physical outside the fitted range.

    A least-squares line through noisy samples may have a negative intercept or, on a busy
    host, a negative slope. Below the smallest fitted size a negative intercept would predict
    near-zero time; above the largest, a non-positive slope would predict that more work takes
    less time. There the time scales in proportion to b from the nearest fitted point's
    prediction (no fixed cost is invented, and no free work either).
    """
    value = fit.predict(micro_batch_size)
    if fit.xs:
        smallest, largest = min(fit.xs), max(fit.xs)
        if micro_batch_size < smallest and (fit.intercept < 0 or value <= 0):
            value = fit.predict(smallest) * micro_batch_size / smallest
        elif micro_batch_size > largest and fit.slope <= 0:
            value = max(fit.predict(largest), 1e-9) * micro_batch_size / largest
    return max(value, 1e-9)


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredTime:
    """Step times from the profile's fitted TimeModels (t_fb(b) = t0 + k·b, t_opt median).

    A measured multi-rank TimeModel for the candidate's (parallelism, world size) wins; else the
    single-device fit (for a checkpointed group the core had no time for, the no-checkpointing
    fit plus its recompute timed beside it: profilers.phases_recompute). A checkpointing fit
    still missing is derived from the no-checkpointing one times the counted FLOPs ratio
    (recompute adds one forward of each block), and says so.
    """

    fits: Fits
    flops: FlopCount | None = None
    # Why the profile has no step-time fit for a (precision, checkpointing), when it said so:
    # its throughput probe rows' reasons (e.g. the budget ran out, naming the --budget-s).
    gaps: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # The model's repeated blocks: blocks:K is interpolated in K between the timed settings.
    num_layers: int = 0
    # torch.compile per (precision, checkpointing), measured by profilers.phases_compile, and
    # why a group was not (its compile probe row: the budget, naming the --budget-s).
    compiled: tuple[CompileMeasurement, ...] = ()
    compile_gaps: Mapping[tuple[str, str], str] = field(default_factory=dict)

    @classmethod
    def from_profile(cls, profile: Profile) -> MeasuredTime:
        gaps: dict[tuple[str, str], str] = {}
        for row in profile.probes:
            if (
                row.probe in ("throughput", "throughput_fit")
                and row.status != "ok"
                and row.precision
            ):
                key = (row.precision, row.activation_checkpointing or "none")
                gaps.setdefault(key, f"{row.status}: {row.reason}" if row.reason else row.status)
        return cls(
            fits=profile.fits,
            flops=profile.flops,
            gaps=gaps,
            num_layers=profile.model.num_layers,
            compiled=profile.compile,
            compile_gaps={
                (r.precision, r.activation_checkpointing or "none"): r.reason
                for r in profile.probes
                if r.probe == "compile" and r.status != "ok" and r.precision
            },
        )

    def compute(self, candidate: Candidate) -> ComputeTime:
        c = candidate
        if c.compile:
            return self._compiled(c)
        if c.loss_chunks > 1:
            return self._chunked(c)
        if c.parallelism != "single":
            model = self.fits.time_model(
                c.precision,
                c.activation_checkpointing,
                parallelism=c.parallelism,
                world_size=c.world_size,
            )
            if model is not None:
                return ComputeTime(
                    forward_backward_s=affine_seconds(model.forward_backward, c.micro_batch_size),
                    optimizer_s=model.optimizer_s,
                    source=f"measured {c.parallelism}×{c.world_size} fit",
                    parallel_measured=True,
                    fit=model.forward_backward,
                )
        model = self.fits.time_model(c.precision, c.activation_checkpointing)
        if model is not None:
            slowdown, slowdown_from = self._rank_slowdown(model, c.world_size)
            source = "measured single-device fit"
            if model.delta_from:  # profilers.phases_recompute
                source = (
                    f"measured: the {c.precision}/{model.delta_from} fit + the recompute of "
                    f"{c.activation_checkpointing} timed beside it"
                )
            forward_backward = affine_seconds(model.forward_backward, c.micro_batch_size)
            return ComputeTime(
                forward_backward_s=forward_backward,
                optimizer_s=model.optimizer_s,
                source=source,
                rank_slowdown=slowdown,
                rank_slowdown_from=slowdown_from,
                fit=model.forward_backward,
                delta_se_s=(model.delta_sd or 0.0) * forward_backward,
            )
        span = self.fits.blocks_time_span(
            c.precision, c.activation_checkpointing, num_layers=self.num_layers
        )
        if span is not None:  # blocks:K: recompute grows with K (checkpointing_fits)
            low, high, w = span
            between = interpolated_time(low, high, w, c.activation_checkpointing)
            slowdown, slowdown_from = self._rank_slowdown(between, c.world_size)
            # The anchors' predictions, each kept physical outside its timed sizes, on the
            # line in K (the coefficient-wise line has no timed sizes to be kept so).
            seconds = (1 - w) * affine_seconds(low.forward_backward, c.micro_batch_size) + (
                w * affine_seconds(high.forward_backward, c.micro_batch_size)
            )
            return ComputeTime(
                forward_backward_s=seconds,
                optimizer_s=between.optimizer_s,
                source=(
                    f"interpolated: {c.activation_checkpointing} of {self.num_layers} blocks on "
                    f"the line between the timed {c.precision} checkpointing settings"
                ),
                rank_slowdown=slowdown,
                rank_slowdown_from=slowdown_from,
                derived=True,
                anchors=(low.forward_backward, high.forward_backward),
            )
        base = self.fits.time_model(c.precision, "none")
        counted = self.flops.flops_per_token if self.flops else {}
        mode_flops = (
            self.flops.per_token(c.activation_checkpointing, self.num_layers)
            if self.flops
            else None
        )
        # Not ops: it recomputes no matmul, so a FLOPs ratio would call its recompute free.
        selective_ops = c.activation_checkpointing == "ops"
        if base is not None and counted.get("none") and mode_flops and not selective_ops:
            ratio = mode_flops / counted["none"]
            plain = affine_seconds(base.forward_backward, c.micro_batch_size)
            slowdown, slowdown_from = self._rank_slowdown(base, c.world_size)
            return ComputeTime(
                forward_backward_s=ratio * plain,
                optimizer_s=base.optimizer_s,
                rank_slowdown=slowdown,
                rank_slowdown_from=slowdown_from,
                fit=base.forward_backward,
                derived=True,
                source=(
                    f"derived: the {c.precision}/none fit × {ratio:.3f}, the counted FLOPs ratio "
                    f"of {c.activation_checkpointing} checkpointing (recompute)"
                ),
            )
        group = (c.precision, c.activation_checkpointing)
        why = self.gaps.get(group) or self.gaps.get((c.precision, "none"))
        if why:
            raise Unpredictable(
                f"the profile has no step-time fit for {c.precision} with "
                f"{c.activation_checkpointing} checkpointing (its probe: {why})"
            )
        raise Unpredictable(
            f"the profile has no step-time fit for {c.precision} with "
            f"{c.activation_checkpointing} checkpointing: re-run 'advisor profile --precision "
            f"{c.precision}' with a larger --budget-s so it times this group"
        )

    def _compiled(self, c: Candidate) -> ComputeTime:
        """The eager time of the candidate over the measured speed-up of its group's compiled
        forward+backward (profilers.phases_compile: timed side by side in one child), and the
        group's cold compile time; the optimizer step is not compiled. The speed-up is the
        single device's, also for a rank of DDP/FSDP (their collectives run between the
        compiled blocks, in eager code). A group the profile did not reach, or whose compile
        failed, is unpredictable with that reason: never assumed."""
        group = f"{c.precision}/{c.activation_checkpointing}"
        measured = find_compile(self.compiled, c.precision, c.activation_checkpointing)
        if measured is None:
            why = self.compile_gaps.get((c.precision, c.activation_checkpointing))
            raise Unpredictable(
                f"the profile did not measure torch.compile for {group}"
                + (f" ({why})" if why else "")
                + ": re-run 'advisor profile' with a larger --budget-s (see its 'compile' probe "
                "rows), or use --no-compile"
            )
        if not measured.ok:
            raise Unpredictable(
                f"torch.compile of {group} was not measured ({measured.status}: "
                f"{measured.reason}): use --no-compile"
            )
        eager = self.compute(dataclasses.replace(c, compile=False))
        ratio = measured.speedup_at(c.micro_batch_size)
        return dataclasses.replace(
            eager,
            forward_backward_s=eager.forward_backward_s / ratio,
            compile_s=measured.compile_s or 0.0,
            compiled=measured,
            source=f"{eager.source} / {ratio:.2f}, the measured speed-up of the compiled "
            f"forward+backward (cold compile {measured.compile_s:.0f} s once)",
        )

    def _chunked(self, c: Candidate) -> ComputeTime:
        """The candidate's plain-loss time plus the measured cost of its loss chunks.

        The profile times the chunked loss once, without checkpointing, interleaved with the
        plain loss in one child (profilers.phases_chunked): its fit minus the plain one is what
        the chunks add per micro-batch (the head's forward again in backward, the smaller
        kernels), a cost of the head alone, so it carries over to checkpointed blocks and to a
        rank's micro-batch; a precision it was not timed for is unpredictable, not assumed.
        """
        chunked = self.fits.time_model(c.precision, "none", loss_chunks=c.loss_chunks)
        plain_fit = self.fits.time_model(c.precision, "none")
        if chunked is None or plain_fit is None:
            raise Unpredictable(
                f"the profile has no step time for the loss in {c.loss_chunks} chunks at "
                f"{c.precision} (the profiler times it at one precision, the one whose plain "
                f"step was fastest): use "
                f"--loss-chunks 1, or re-run 'advisor profile' with a larger --budget-s"
            )
        b = c.micro_batch_size
        measured = min(chunked.forward_backward.xs, default=0.0)
        if b < measured:
            # Each chunk reads the head's whole weight for its forward, its recompute and both
            # gradient matmuls: that fixed cost per chunk is what a smaller chunk than measured
            # adds, and no line through the timed sizes holds it. The regret grids measured 4
            # chunks at micro-batch 1 (32-token chunks) 1.54-1.93x the plain loss's step in
            # three sessions, where the line through micro-batch 2 and 8 said 1.0x.
            tokens = chunked.seq_len * b // c.loss_chunks
            smallest = int(chunked.seq_len * measured) // c.loss_chunks
            raise Unpredictable(
                f"the loss in {c.loss_chunks} chunks at micro-batch {b} makes chunks of "
                f"{tokens} tokens, smaller than any the profile timed ({smallest} at "
                f"micro-batch {measured:g}), where the head's per-chunk cost dominates: use a "
                f"micro-batch of at least {measured:g}, or --loss-chunks 1"
            )
        measured_delta = chunked.forward_backward.predict(b) - plain_fit.forward_backward.predict(b)
        # The chunks only add work (the head's forward again, smaller kernels): a chunked step
        # timed faster than the plain one is the host's noise, and counts as no cost, as a
        # negative recompute does. Taken as measured, -1.5 s of a 3.4 s step on a busy host
        # made a 65x "expected speed-up" that validation measured at 0.57x.
        delta = max(0.0, measured_delta)
        shown = (
            f"{delta * 1e3:+.1f} ms per micro-batch"
            if measured_delta >= 0
            else f"timed {measured_delta * 1e3:+.1f} ms per micro-batch: noise, counted as 0"
        )
        plain = self.compute(dataclasses.replace(c, loss_chunks=1))
        chunks_se = (chunked.delta_sd or 0.0) * chunked.forward_backward.predict(b)
        return dataclasses.replace(
            plain,
            forward_backward_s=plain.forward_backward_s + delta,
            delta_se_s=math.hypot(plain.delta_se_s, chunks_se),
            source=f"{plain.source} + the measured cost of {c.loss_chunks} loss chunks ({shown})",
        )

    def _rank_slowdown(self, model: TimeModel, world_size: int) -> tuple[float | None, str]:
        """(a CPU rank's slowdown on its share of the threads, where it was measured).

        The group's own measurement, else the same precision's with the other checkpointing:
        how far a step gains from more threads is a property of the precision's kernels (on
        this 2-vCPU host fp32 1.5-1.8, bf16 1.5-1.7 for both checkpointing settings, fp16 1.1),
        and the probe's budget often leaves the slow fp16 groups room for only one of them.
        """
        own = model.rank_slowdown(world_size)
        if own is not None:
            return own, ""
        for other in self.fits.time:
            if (
                other.precision == model.precision
                and other.parallelism == "single"
                and other.activation_checkpointing != model.activation_checkpointing
            ):
                borrowed = other.rank_slowdown(world_size)
                if borrowed is not None:
                    return borrowed, f"{other.precision}/{other.activation_checkpointing}"
        return None, ""


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredComm:
    """Collective times from the profile's alpha-beta fits (Hockney model).

    A world size without its own fit borrows the nearest one's: bus bandwidth, busbw =
    factor(n) · bytes / t, is what a ring sustains per link whatever the rank count (nccl-tests
    doc/PERFORMANCE.md), so beta scales by factor(n) / factor(m); the latency is kept.
    """

    fits: tuple[CommFit, ...]

    def _fit(self, collective: str, world_size: int) -> tuple[CommFit, float]:
        exact = [f for f in self.fits if (f.collective, f.world_size) == (collective, world_size)]
        if exact and exact[0].beta_s_per_byte > 0:
            return exact[0], exact[0].beta_s_per_byte
        if exact:
            # A line with no positive slope knows the latency, not the bandwidth: any message
            # size would come out free. Typical of a probe stopped at small sizes.
            raise Unpredictable(
                f"the {exact[0].backend} {collective} fit on {world_size} ranks has no positive "
                f"bandwidth (measured up to {exact[0].max_bytes} B only): re-run 'advisor "
                "profile' with a larger --budget-s so the communication probe reaches MB sizes"
            )
        others = [f for f in self.fits if f.collective == collective and f.beta_s_per_byte > 0]
        if not others:
            raise Unpredictable(
                f"the profile has no {collective} measurement (its communication probe did "
                "not run: probes.csv says why): re-run 'advisor profile' without --no-comm, "
                "with a larger --budget-s, on a host with at least 2 devices (or CPU cores)"
            )
        nearest = min(others, key=lambda f: (abs(f.world_size - world_size), -f.world_size))
        scale = bus_bandwidth_factor(collective, world_size) / bus_bandwidth_factor(
            collective, nearest.world_size
        )
        return nearest, nearest.beta_s_per_byte * scale

    def collective_s(self, collective: str, world_size: int, num_bytes: float) -> float:
        fit, beta = self._fit(collective, world_size)
        if beta == fit.beta_s_per_byte:
            return predict_collective_time(fit, num_bytes)
        return max(fit.alpha_s + beta * num_bytes, fit.min_time_s)

    def describe(self, collective: str, world_size: int) -> str:
        fit, _ = self._fit(collective, world_size)
        if fit.world_size == world_size:
            return f"measured {fit.backend} {collective} alpha-beta fit on {world_size} ranks"
        return (
            f"{fit.backend} {collective} fit measured on {fit.world_size} ranks, rescaled to "
            f"{world_size} by the bus-bandwidth factor (nccl-tests PERFORMANCE.md)"
        )
