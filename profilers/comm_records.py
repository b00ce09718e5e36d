"""Records of the communication probe, the nccl-tests bandwidth arithmetic and the alpha-beta fit.

Pure: no torch, no processes. :mod:`profilers.comm` measures; this module describes what was
measured and what it means, so strategies' cost model can read a profile without a device.

What "bytes" means (nccl-tests' "size" column, doc/PERFORMANCE.md in NVIDIA/nccl-tests):

* ``all_reduce``, ``broadcast``: the size of the one buffer every rank holds.
* ``all_gather``: the size of the gathered OUTPUT (world_size x each rank's input).
* ``reduce_scatter``: the size of the full INPUT (world_size x each rank's output).

Times are seconds per collective, each sample the MAX over ranks (a collective is finished when
its slowest rank is; nccl-tests averages over ranks by default, ``-a 1``, which reads the same or
faster). Bandwidths are in GB/s with 1 GB = 1e9 bytes, as nccl-tests reports them.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from profilers.fit import fit_affine

COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
SAMPLE_STATUSES: tuple[str, ...] = ("ok", "unsupported", "error")
RUN_STATUSES: tuple[str, ...] = ("ok", "error", "timeout")
GB = 1e9


def bus_bandwidth_factor(collective: str, world_size: int) -> float:
    """busbw / algbw for ``collective`` on ``world_size`` ranks (nccl-tests PERFORMANCE.md).

    The factor turns the algorithm bandwidth (bytes / time) into the bandwidth each link must
    sustain with an optimal ring algorithm, so that it is comparable with the hardware peak and
    across world sizes:

    * all_reduce: a ring reduce-scatter then all-gather; each rank sends and receives
      2(n-1)/n of the buffer -> 2(n-1)/n.
    * all_gather, reduce_scatter: each rank moves (n-1)/n of the full (output resp. input)
      buffer -> (n-1)/n.
    * broadcast: the root's buffer crosses every link once, pipelined -> 1.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    n = world_size
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if collective == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}: expected one of {', '.join(COLLECTIVES)}")


def algorithm_bandwidth_GBps(num_bytes: float, time_s: float) -> float:
    if time_s <= 0:
        raise ValueError(f"time must be positive, got {time_s}")
    return num_bytes / time_s / GB


@dataclass(frozen=True, kw_only=True, slots=True)
class CommSample:
    """One collective at one message size: the timed samples and what they mean.

    ``time_s`` holds one value per timed sample: the seconds of ``iters_per_sample`` back-to-back
    collectives divided by their number, max over ranks. ``status`` is ``ok``, ``unsupported``
    (the backend refused the collective; ``bytes`` is then 0 and ``time_s`` empty) or ``error``.
    ``implementation`` names a known deviation from the textbook algorithm (e.g. gloo's
    reduce-scatter), empty otherwise.
    """

    backend: str
    device_type: str
    collective: str
    world_size: int
    bytes: int
    time_s: tuple[float, ...] = ()
    iters_per_sample: int = 0
    status: str = "ok"
    reason: str = ""
    implementation: str = ""

    def __post_init__(self) -> None:
        if self.status not in SAMPLE_STATUSES:
            raise ValueError(f"status must be one of {SAMPLE_STATUSES}, got {self.status!r}")
        if self.status == "ok" and not self.time_s:
            raise ValueError("an ok sample needs at least one time")

    @property
    def time_median_s(self) -> float | None:
        return statistics.median(self.time_s) if self.time_s else None

    @property
    def algbw_GBps(self) -> float | None:
        median = self.time_median_s
        return algorithm_bandwidth_GBps(self.bytes, median) if median else None

    @property
    def busbw_GBps(self) -> float | None:
        algbw = self.algbw_GBps
        if algbw is None:
            return None
        return algbw * bus_bandwidth_factor(self.collective, self.world_size)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "device_type": self.device_type,
            "collective": self.collective,
            "world_size": self.world_size,
            "bytes": self.bytes,
            "time_s": list(self.time_s),
            "time_median_s": self.time_median_s,
            "iters_per_sample": self.iters_per_sample,
            "algbw_GBps": self.algbw_GBps,
            "busbw_GBps": self.busbw_GBps,
            "status": self.status,
            "reason": self.reason,
            "implementation": self.implementation,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CommSample:
        # Derived keys (median, bandwidths) are recomputed, never trusted from disk.
        return cls(
            backend=str(data["backend"]),
            device_type=str(data["device_type"]),
            collective=str(data["collective"]),
            world_size=int(data["world_size"]),
            bytes=int(data["bytes"]),
            time_s=tuple(float(t) for t in data.get("time_s", ())),
            iters_per_sample=int(data.get("iters_per_sample", 0)),
            status=str(data.get("status", "ok")),
            reason=str(data.get("reason", "")),
            implementation=str(data.get("implementation", "")),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class CommFit:
    """time = alpha + beta * bytes for one (backend, collective, world size) — the Hockney model.

    Fitted by least squares on the per-size median times. ``alpha_s`` is the latency (time of
    an empty message), ``1 / beta`` the effective algorithm bandwidth at large messages (bytes as
    defined in the module docstring; multiply by :func:`bus_bandwidth_factor` for bus bandwidth).
    An OLS line is dominated by the largest messages, so a small or even negative ``alpha_s`` means
    the latency is below what the large sizes can resolve; :func:`predict_collective_time` floors
    its answers at ``min_time_s``, the fastest median measured.
    """

    backend: str
    device_type: str
    collective: str
    world_size: int
    alpha_s: float
    beta_s_per_byte: float
    min_bytes: int
    max_bytes: int
    min_time_s: float
    num_points: int
    max_relative_residual: float
    implementation: str = ""

    @property
    def bandwidth_GBps(self) -> float | None:
        """1 / beta in GB/s, or None when the fit found no positive slope."""
        return 1.0 / self.beta_s_per_byte / GB if self.beta_s_per_byte > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "device_type": self.device_type,
            "collective": self.collective,
            "world_size": self.world_size,
            "alpha_s": self.alpha_s,
            "beta_s_per_byte": self.beta_s_per_byte,
            "bandwidth_GBps": self.bandwidth_GBps,
            "min_bytes": self.min_bytes,
            "max_bytes": self.max_bytes,
            "min_time_s": self.min_time_s,
            "num_points": self.num_points,
            "max_relative_residual": self.max_relative_residual,
            "implementation": self.implementation,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CommFit:
        return cls(
            backend=str(data["backend"]),
            device_type=str(data["device_type"]),
            collective=str(data["collective"]),
            world_size=int(data["world_size"]),
            alpha_s=float(data["alpha_s"]),
            beta_s_per_byte=float(data["beta_s_per_byte"]),
            min_bytes=int(data["min_bytes"]),
            max_bytes=int(data["max_bytes"]),
            min_time_s=float(data["min_time_s"]),
            num_points=int(data["num_points"]),
            max_relative_residual=float(data["max_relative_residual"]),
            implementation=str(data.get("implementation", "")),
        )


def predict_collective_time(fit: CommFit, num_bytes: float) -> float:
    """Seconds for one collective of ``num_bytes`` (bytes as nccl-tests counts them) under ``fit``.

    alpha + beta * bytes, floored at the fastest time measured: below the smallest message the
    line's intercept is an extrapolation, and a collective is never faster than an empty one.
    Outside [min_bytes, max_bytes] the answer is an extrapolation; callers that care can check.
    """
    if num_bytes < 0:
        raise ValueError(f"bytes must be non-negative, got {num_bytes}")
    return max(fit.alpha_s + fit.beta_s_per_byte * num_bytes, fit.min_time_s)


def fit_alpha_beta(samples: Iterable[CommSample]) -> tuple[CommFit, ...]:
    """One :class:`CommFit` per (backend, device, collective, world size) with >= 2 ok sizes."""
    groups: dict[tuple[str, str, str, int], list[CommSample]] = {}
    for sample in samples:
        if sample.status == "ok":
            key = (sample.backend, sample.device_type, sample.collective, sample.world_size)
            groups.setdefault(key, []).append(sample)
    fits = []
    for (backend, device_type, collective, world_size), group in groups.items():
        medians: dict[int, float] = {}
        for sample in group:
            median = sample.time_median_s
            assert median is not None  # ok samples carry times (checked at construction)
            medians[sample.bytes] = median
        if len(medians) < 2:
            continue
        sizes = sorted(medians)
        line = fit_affine([float(b) for b in sizes], [medians[b] for b in sizes])
        fits.append(
            CommFit(
                backend=backend,
                device_type=device_type,
                collective=collective,
                world_size=world_size,
                alpha_s=line.intercept,
                beta_s_per_byte=line.slope,
                min_bytes=sizes[0],
                max_bytes=sizes[-1],
                min_time_s=min(medians.values()),
                num_points=len(sizes),
                max_relative_residual=line.max_relative_residual,
                implementation=group[0].implementation,
            )
        )
    return tuple(fits)


@dataclass(frozen=True, kw_only=True, slots=True)
class CommRun:
    """One launch: every collective for one (backend, world size), and what the launch cost.

    ``launch_overhead_s``: from calling the launcher until the last rank has its process group
    (process spawn + ``import torch`` + c10d rendezvous + ``init_process_group``);
    ``init_process_group_s`` is the slowest rank's share of it spent in ``init_process_group``.
    ``stopped_by`` says why sizes stopped growing: ``max_bytes``, ``budget`` or ``memory``.
    """

    backend: str
    device_type: str
    world_size: int
    status: str
    reason: str = ""
    wall_s: float = 0.0
    launch_overhead_s: float | None = None
    init_process_group_s: float | None = None
    stopped_by: str = ""
    max_bytes_measured: int = 0
    num_samples: int = 0

    def __post_init__(self) -> None:
        if self.status not in RUN_STATUSES:
            raise ValueError(f"status must be one of {RUN_STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "device_type": self.device_type,
            "world_size": self.world_size,
            "status": self.status,
            "reason": self.reason,
            "wall_s": self.wall_s,
            "launch_overhead_s": self.launch_overhead_s,
            "init_process_group_s": self.init_process_group_s,
            "stopped_by": self.stopped_by,
            "max_bytes_measured": self.max_bytes_measured,
            "num_samples": self.num_samples,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CommRun:
        overhead = data.get("launch_overhead_s")
        init_s = data.get("init_process_group_s")
        return cls(
            backend=str(data["backend"]),
            device_type=str(data["device_type"]),
            world_size=int(data["world_size"]),
            status=str(data["status"]),
            reason=str(data.get("reason", "")),
            wall_s=float(data.get("wall_s", 0.0)),
            launch_overhead_s=None if overhead is None else float(overhead),
            init_process_group_s=None if init_s is None else float(init_s),
            stopped_by=str(data.get("stopped_by", "")),
            max_bytes_measured=int(data.get("max_bytes_measured", 0)),
            num_samples=int(data.get("num_samples", 0)),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class CommProfile:
    """Everything the communication probe learnt: raw samples, fits, and one record per launch."""

    samples: tuple[CommSample, ...] = ()
    fits: tuple[CommFit, ...] = ()
    runs: tuple[CommRun, ...] = ()

    def fit_for(
        self, collective: str, world_size: int, *, backend: str | None = None
    ) -> CommFit | None:
        for fit in self.fits:
            if (fit.collective, fit.world_size) == (collective, world_size) and (
                backend is None or fit.backend == backend
            ):
                return fit
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": [s.to_dict() for s in self.samples],
            "fits": [f.to_dict() for f in self.fits],
            "runs": [r.to_dict() for r in self.runs],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CommProfile:
        return cls(
            samples=tuple(CommSample.from_dict(s) for s in data.get("samples", ())),
            fits=tuple(CommFit.from_dict(f) for f in data.get("fits", ())),
            runs=tuple(CommRun.from_dict(r) for r in data.get("runs", ())),
        )
