"""The memory model: per-phase affine fits of traced peaks over micro-batch size.

Peak memory is affine in micro-batch size within a phase (DESIGN.md, "Measuring well"), but the
step's peak is the max of two phases that peak for different reasons, so each is fitted alone
and :meth:`MemoryModel.predict` takes the max: a single line through both would miss the kink
where, with checkpointing, the optimizer step stops dominating.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from profilers.fit import AffineFit, fit_hinged
from profilers.memory_records import MemoryTrace

ACCUMULATION_SOURCES: tuple[str, ...] = ("fit", "offset", "gradient_bytes")


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryModel:
    """Peak memory of a step as a function of micro-batch size b and accumulation steps n.

    One model per (precision, activation_checkpointing) at one sequence length, target,
    parallelism and world size:

        peak(b, 1) = max(forward_backward(b), optimizer_step(b))
        peak(b, n) = max(forward_backward_accumulating(b), optimizer_step(b))    for n > 1

    For ``ddp``/``fsdp`` every byte is per rank (rank 0's trace, see
    :mod:`profilers.memory_distributed`) and ``gradient_bytes`` is the rank's gradient storage
    (DDP: its buckets; FSDP: its shards). Records written before parallelism was traced read
    back as ``single`` at world size 1.

    With accumulation, every micro-batch after the first runs forward and backward with the
    previous gradients live. How much that adds depends on where the peak falls: nothing of the
    gradients exists yet at a peak at the start of backward (the full gradient copy is added),
    some already do at a later one (checkpointing; less is added). So it is measured:
    ``accumulation_source`` says how ``forward_backward_accumulating`` was obtained:
    ``"fit"`` (traces with accumulation at two or more sizes), ``"offset"`` (one size: the
    fit without accumulation shifted by what was measured there) or ``"gradient_bytes"`` (no
    trace with accumulation: shifted by the gradient bytes, an upper bound). Accumulating more
    than two steps adds nothing but the inputs of the extra micro-batches.
    """

    precision: str
    activation_checkpointing: str
    seq_len: int
    target_device_type: str
    forward_backward: AffineFit
    forward_backward_accumulating: AffineFit
    optimizer_step: AffineFit
    accumulation_source: str
    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int
    resident_bytes: int
    parallelism: str = "single"
    world_size: int = 1
    # Traced with the loss over this many chunks; 1 (and records before the knob): plain.
    loss_chunks: int = 1
    # FSDP: traced with every block resharded after forward (True; records before the knob) or
    # kept gathered until backward (False: the whole model's compute-dtype parameters held).
    fsdp_reshard_after_forward: bool = True
    # FSDP: per traced micro-batch size (without accumulation), the trace's reshard_windows
    # (per window, the most unsharded and the most sharded bytes live): what resharded() scales.
    # Empty: not FSDP, or traced before windows were kept (resharded() bounds it instead).
    reshard_points: tuple[tuple[int, tuple[tuple[int, int], ...]], ...] = ()
    # One device: the forward+backward peak per window of the step (MemoryTrace.window_peaks:
    # "F", "A" before the last block's backward ends, "B" after), each fitted over b as the
    # whole peak is; ``windows_accumulating`` the same with accumulation (fitted, or each
    # window shifted by what one traced size measured, as accumulation_source says). What
    # prices a blocks:K nobody traced (profilers.checkpointing_fits). Empty: not traced so.
    windows: tuple[tuple[str, AffineFit], ...] = ()
    windows_accumulating: tuple[tuple[str, AffineFit], ...] = ()

    def predict(self, micro_batch_size: int, grad_accum_steps: int = 1) -> int:
        """Predicted peak bytes of one optimizer step."""
        if micro_batch_size < 1 or grad_accum_steps < 1:
            raise ValueError(
                "micro_batch_size and grad_accum_steps must be positive, got "
                f"{micro_batch_size} and {grad_accum_steps}"
            )
        fb = self.forward_backward if grad_accum_steps == 1 else self.forward_backward_accumulating
        return math.ceil(
            max(fb.predict(micro_batch_size), self.optimizer_step.predict(micro_batch_size))
        )

    def resharded(self, world_size: int) -> MemoryModel:
        """This FSDP per-rank fit at another world size, from what is sharded and what is not.

        Under FSDP2 each rank holds 1/N of the parameters, gradients and optimizer state (all
        fp32 here: the parameter policy's compute-dtype copies are gathered units); what it
        gathers (a unit's compute-dtype parameters, the all-gather and reduce-scatter buffers),
        its activations and temporaries do not depend on N. So, from world W to N:

        * forward/backward peak: per window of the trace (``reshard_points``: the forward, the
          last block's backward, then each block's), the most unsharded bytes as traced plus
          the most sharded bytes (parameter shards, sharded gradients, optimizer state) x W/N;
          the largest window is the peak at N. The peak may move: a world-2 rank of a deep
          model with full checkpointing peaks at the end of backward, where its sharded
          gradients are live, and at 64 ranks earlier. FSDP pads every shard to equal size,
          which is not scaled (gpt-tiny, 2 -> 8 ranks: -0.3%). Without windows (older
          records): minus (sharded parameters + optimizer state) x (1 - W/N), the sharded
          gradients live at the peak left as traced: an upper bound at N > W;
        * with accumulation every sharded gradient is live (the earlier micro-batches'): minus
          (parameters + optimizer state + gradients) x (1 - W/N);
        * optimizer step: everything live is per parameter, hence sharded: x W/N.

        Kept gathered (``fsdp_reshard_after_forward`` False) the same holds: the unsharded
        parameters every block keeps from forward to backward are the whole model in the
        compute dtype at any N, so they stay as traced (they are not in ``parameter_bytes``,
        which counts the rank's shards); only the sharded state moves.

        Checked against fake-process-group traces at N (tests/profilers/
        test_memory_distributed.py: gpt-tiny, W=2 -> N=4, 8): optimizer step and accumulation
        within 0.01%, forward/backward within 0.5% and below the bound; the same kept gathered
        (tests/profilers/test_memory_reshard.py; gpt-tiny at 64 tokens, W=2 -> N=4: the
        forward/backward peak within 110 bytes, no sharded gradient being live there).
        """
        if self.parallelism != "fsdp":
            raise ValueError(f"only FSDP per-rank fits reshard, not {self.parallelism}")
        if world_size < 2:
            raise ValueError(f"an FSDP world size is at least 2, got {world_size}")
        keep = self.world_size / world_size
        state = self.parameter_bytes + self.optimizer_state_bytes
        forward_backward = self.forward_backward.mapped(1.0, -state * (1 - keep))
        points = tuple(
            (b, tuple((rest, round(sharded * keep)) for rest, sharded in windows))
            for b, windows in self.reshard_points
        )
        accumulating = self.forward_backward_accumulating.mapped(
            1.0, -(state + self.gradient_bytes) * (1 - keep)
        )
        if len(points) >= 2:
            # Per window, what is not sharded as traced and what is, at 1/N: the largest window
            # at each traced size, fitted as the traced peaks were. A window's two maxima may
            # sit at different moments, so this bounds the window from above; at the traced
            # world size it equals the traced peak when one moment holds both.
            sizes = [float(b) for b, _ in points]
            forward_backward = fit_hinged(
                sizes, [float(max(rest + sharded for rest, sharded in w)) for _, w in points]
            )
            if self.accumulation_source == "gradient_bytes":
                # No trace with accumulation: every micro-batch after the first runs with all
                # the rank's gradient shards live (FSDP reduce-scatters each micro-batch), so
                # at most the whole sharded state beside each window's unsharded bytes. (The
                # shift by the gradient bytes would count the gradients live at the traced
                # peak twice.)
                everything = (state + self.gradient_bytes) * keep
                accumulating = fit_hinged(
                    sizes, [float(max(rest for rest, _ in w) + everything) for _, w in points]
                )
        return dataclasses.replace(
            self,
            reshard_points=points,
            forward_backward=forward_backward,
            forward_backward_accumulating=accumulating,
            optimizer_step=self.optimizer_step.mapped(keep, 0.0),
            parameter_bytes=round(self.parameter_bytes * keep),
            gradient_bytes=round(self.gradient_bytes * keep),
            optimizer_state_bytes=round(self.optimizer_state_bytes * keep),
            resident_bytes=round(self.resident_bytes * keep),
            world_size=world_size,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "activation_checkpointing": self.activation_checkpointing,
            "seq_len": self.seq_len,
            "target_device_type": self.target_device_type,
            "forward_backward": self.forward_backward.to_dict(),
            "forward_backward_accumulating": self.forward_backward_accumulating.to_dict(),
            "optimizer_step": self.optimizer_step.to_dict(),
            "accumulation_source": self.accumulation_source,
            "parameter_bytes": self.parameter_bytes,
            "gradient_bytes": self.gradient_bytes,
            "optimizer_state_bytes": self.optimizer_state_bytes,
            "resident_bytes": self.resident_bytes,
            "parallelism": self.parallelism,
            "world_size": self.world_size,
            "loss_chunks": self.loss_chunks,
            "fsdp_reshard_after_forward": self.fsdp_reshard_after_forward,
            **(
                {"reshard_points": [[b, [list(w) for w in ws]] for b, ws in self.reshard_points]}
                if self.reshard_points
                else {}
            ),
            **({"windows": _windows_dict(self.windows)} if self.windows else {}),
            **(
                {"windows_accumulating": _windows_dict(self.windows_accumulating)}
                if self.windows_accumulating
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryModel:
        return cls(
            precision=str(data["precision"]),
            activation_checkpointing=str(data["activation_checkpointing"]),
            seq_len=int(data["seq_len"]),
            target_device_type=str(data["target_device_type"]),
            forward_backward=AffineFit.from_dict(data["forward_backward"]),
            forward_backward_accumulating=AffineFit.from_dict(
                data["forward_backward_accumulating"]
            ),
            optimizer_step=AffineFit.from_dict(data["optimizer_step"]),
            accumulation_source=str(data["accumulation_source"]),
            parameter_bytes=int(data["parameter_bytes"]),
            gradient_bytes=int(data["gradient_bytes"]),
            optimizer_state_bytes=int(data["optimizer_state_bytes"]),
            resident_bytes=int(data["resident_bytes"]),
            parallelism=str(data.get("parallelism", "single")),
            world_size=int(data.get("world_size", 1)),
            loss_chunks=int(data.get("loss_chunks", 1)),
            fsdp_reshard_after_forward=bool(data.get("fsdp_reshard_after_forward", True)),
            reshard_points=tuple(
                (int(b), tuple((int(r), int(s)) for r, s in ws))
                for b, ws in data.get("reshard_points") or ()
            ),
            windows=_windows_from(data.get("windows")),
            windows_accumulating=_windows_from(data.get("windows_accumulating")),
        )


def _windows_dict(windows: Sequence[tuple[str, AffineFit]]) -> dict[str, Any]:
    return {name: fit.to_dict() for name, fit in windows}


def _windows_from(data: Mapping[str, Any] | None) -> tuple[tuple[str, AffineFit], ...]:
    return tuple((str(name), AffineFit.from_dict(fit)) for name, fit in (data or {}).items())


def fit_memory(traces: Sequence[MemoryTrace]) -> MemoryModel:
    """Fit a :class:`MemoryModel` on traces of one (precision, checkpointing, seq_len, target,
    parallelism, world_size).

    Needs traces without accumulation at two or more micro-batch sizes. Traces with
    accumulation (any number of steps above one) measure what the live gradients add; trace
    them at the same two sizes for a fit, since with checkpointing that extra grows with the
    micro-batch.
    """
    if not traces:
        raise ValueError("fit_memory needs traces: trace two or more micro-batch sizes")
    keys = {_group_key(t) for t in traces}
    if len(keys) > 1:
        raise ValueError(
            "fit_memory fits one (precision, activation_checkpointing, seq_len, target, "
            "parallelism, world_size) at a "
            f"time, got {sorted(keys)}: group them first, e.g. with fit_memory_models"
        )
    single = [t for t in traces if t.spec.grad_accum_steps == 1]
    accumulating = [t for t in traces if t.spec.grad_accum_steps > 1]
    sizes = sorted({t.spec.micro_batch_size for t in single})
    if len(sizes) < 2:
        raise ValueError(
            "fit_memory needs traces with grad_accum_steps=1 at two or more distinct "
            f"micro-batch sizes, got {sizes}"
        )
    windows = _window_fits(single)
    forward_backward = floored_by_windows(_fit(single, "forward_backward_peak_bytes"), windows)
    optimizer_step = _fit(single, "optimizer_step_peak_bytes")
    reference = max(single, key=lambda t: t.spec.micro_batch_size)
    source = (
        "fit"
        if len({t.spec.micro_batch_size for t in accumulating}) >= 2
        else ("offset" if accumulating else "gradient_bytes")
    )
    accumulating_fit = _accumulating(
        forward_backward, accumulating, source, reference.gradient_bytes, _total_peak
    )
    windows_accumulating: tuple[tuple[str, AffineFit], ...] = ()
    if windows and accumulating and _window_names(accumulating) == tuple(n for n, _ in windows):
        windows_accumulating = tuple(
            (name, _accumulating(fit, accumulating, source, 0, partial(_window_peak, name=name)))
            for name, fit in windows
        )
        accumulating_fit = floored_by_windows(accumulating_fit, windows_accumulating)
    first = traces[0]
    return MemoryModel(
        precision=first.spec.precision,
        activation_checkpointing=first.spec.activation_checkpointing,
        seq_len=first.spec.seq_len,
        target_device_type=first.target_device_type,
        forward_backward=forward_backward,
        forward_backward_accumulating=accumulating_fit,
        optimizer_step=optimizer_step,
        accumulation_source=source,
        parameter_bytes=reference.parameter_bytes,
        gradient_bytes=reference.gradient_bytes,
        optimizer_state_bytes=reference.optimizer_state_bytes,
        resident_bytes=reference.resident_bytes,
        parallelism=first.spec.parallelism,
        world_size=first.spec.world_size,
        loss_chunks=first.spec.loss_chunks,
        fsdp_reshard_after_forward=first.spec.fsdp_reshard_after_forward,
        reshard_points=_reshard_points(single),
        windows=windows,
        windows_accumulating=windows_accumulating,
    )


def floored_by_windows(fit: AffineFit, windows: Sequence[tuple[str, AffineFit]]) -> AffineFit:
    """``fit`` floored at what its windows give micro-batch 1, when no trace there floors it.

    The core traces two sizes (4 and 8); without the smallest, the hinged fit is the line
    through them, which lies below the peak at smaller sizes: there the peak moves to the end
    of backward (every gradient live, activations nearly gone), a window whose own line is
    nearly flat in b. The largest of the windows' lines at micro-batch 1 estimates that peak,
    and a step's peak never falls as the micro-batch grows, so it floors every size. Measured
    (fits from 4 and 8 against traces at 1, 2 and 3, as a profile traces; the test
    tests/profilers/test_memory_windows_floor.py holds gpt-small's and gpt-tiny's):
    gpt-small at 128 tokens from -20.0% to 0.0% at micro-batch 1 (fp32/none) and from -13.4% to
    -0.02% at 2; llama-tiny fp32/none -12.5% to -9.0% at 1 (its window B bends within, left to
    the traced hinge). A fit with a floor (the smallest size traced), a window-less record, or
    windows whose estimate lies below the line are left as they are."""
    if fit.floor is not None or fit.pieces or not windows or not fit.xs or min(fit.xs) <= 1:
        return fit
    floor = max(window.predict(1) for _, window in windows)
    if floor <= fit.predict(1):
        return fit
    return dataclasses.replace(fit, floor=floor)


def _total_peak(trace: MemoryTrace) -> int:
    return trace.forward_backward_peak_bytes


def _window_peak(trace: MemoryTrace, name: str) -> int:
    return dict(trace.window_peaks)[name]


def _accumulating(
    fit: AffineFit,
    accumulating: Sequence[MemoryTrace],
    source: str,
    gradient_bytes: int,
    peak: Callable[[MemoryTrace], int],
) -> AffineFit:
    """The fit with accumulation of what ``peak`` reads from a trace, ``fit`` being the same
    without: fitted on its own traces, or ``fit`` shifted by the most any one measured above
    it (``offset``), or by the gradient bytes (``gradient_bytes``: none traced)."""
    if source == "fit":
        return _fit_by(accumulating, peak)
    if source == "offset":
        extra = max(peak(t) - fit.predict(t.spec.micro_batch_size) for t in accumulating)
        xs = tuple(float(t.spec.micro_batch_size) for t in accumulating)
        ys = tuple(float(peak(t)) for t in accumulating)
    else:
        extra, xs, ys = gradient_bytes, (), ()
    moved = fit.shifted(extra)
    return AffineFit(intercept=moved.intercept, slope=moved.slope, xs=xs, ys=ys, floor=moved.floor)


def _window_names(traces: Sequence[MemoryTrace]) -> tuple[str, ...]:
    """The windows every one of ``traces`` has, in order (empty when they differ)."""
    names = {tuple(n for n, _ in t.window_peaks) for t in traces}
    return names.pop() if len(names) == 1 else ()


def _window_fits(single: Sequence[MemoryTrace]) -> tuple[tuple[str, AffineFit], ...]:
    """Each window's peak fitted over b, when every trace has the same windows."""
    return tuple(
        (name, _fit_by(single, partial(_window_peak, name=name))) for name in _window_names(single)
    )


def _reshard_points(
    single: Sequence[MemoryTrace],
) -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
    """Each size's reshard_windows, when every trace without accumulation has them."""
    if not single or not all(t.reshard_windows for t in single):
        return ()
    by_size = {t.spec.micro_batch_size: t.reshard_windows for t in single}
    return tuple(sorted(by_size.items()))


def _fit(traces: Sequence[MemoryTrace], attribute: str) -> AffineFit:
    return _fit_by(traces, lambda t: int(getattr(t, attribute)))


def _fit_by(traces: Sequence[MemoryTrace], peak: Callable[[MemoryTrace], int]) -> AffineFit:
    return fit_hinged(
        [float(t.spec.micro_batch_size) for t in traces], [float(peak(t)) for t in traces]
    )


def fit_memory_models(traces: Iterable[MemoryTrace]) -> list[MemoryModel]:
    """One :class:`MemoryModel` per (precision, checkpointing, seq_len, target, parallelism,
    world_size) in ``traces``."""
    groups: dict[tuple[str, str, int, str, str, int, int, bool], list[MemoryTrace]] = {}
    for t in traces:
        groups.setdefault(_group_key(t), []).append(t)
    # Single-device fits first: callers that look a fit up by (precision, checkpointing) alone
    # keep finding the single-device one.
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][4] != "single", kv[0]))
    return [fit_memory(group) for _, group in ordered]


def _group_key(trace: MemoryTrace) -> tuple[str, str, int, str, str, int, int, bool]:
    s = trace.spec
    return (
        s.precision,
        s.activation_checkpointing,
        s.seq_len,
        trace.target_device_type,
        s.parallelism,
        s.world_size,
        s.loss_chunks,
        s.fsdp_reshard_after_forward,
    )
