"""What the profile measured of torch.compile, per (precision, checkpointing) group.

profile.json's ``compile`` list (absent in profiles written before the knob: not measured).
One record per group the compile probe (:mod:`profilers.phases_compile`) reached: the measured
speed-up of a compiled step's forward+backward and the seconds the compilation cost, or why
there is none (the model failed to compile, the probe failed, compile is unavailable here).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# ok: measured; error/timeout/oom: the compile probe's child failed (a model dynamo or inductor
# cannot compile is an error with its one-line reason); unavailable: no C++ compiler (CPU) or
# no triton (CUDA), so nothing was tried.
COMPILE_STATUSES = ("ok", "error", "timeout", "oom", "unavailable")


@dataclass(frozen=True, kw_only=True, slots=True)
class CompileMeasurement:
    """torch.compile on one (precision, checkpointing) group, single device.

    ``speedup``: eager over compiled forward+backward time, the median of the ratios of steps
    timed side by side in one child (the optimizer step is not compiled). ``speedup_by_size``:
    the same per micro-batch size of ``micro_batch_sizes``. ``compile_s``: the first compiled
    step's time minus an eager step's, with an empty inductor cache (``cache`` "cold": what a
    user's first run pays; a second run on the same machine reads inductor's on-disk cache).
    ``extra_bytes_by_size``: per size of ``micro_batch_sizes``, the compiled forward+backward's
    allocator peak above its start minus the eager step's, measured in the same child after the
    timing (negative where inductor's partitioner saves activations; empty in profiles written
    before it was measured, or where the allocator could not say).
    """

    precision: str
    activation_checkpointing: str
    status: str
    reason: str = ""
    speedup: float | None = None
    compile_s: float | None = None
    micro_batch_sizes: tuple[int, ...] = ()
    speedup_by_size: tuple[float, ...] = ()
    cache: str = "cold"
    extra_bytes_by_size: tuple[int, ...] = ()
    # The scatter of the paired ratios about their size's median (sd of the log ratios, pooled
    # over the sizes) and how many pairs there were per size; None in older profiles.
    speedup_log_sd: float | None = None
    pairs_per_size: int = 0

    def __post_init__(self) -> None:
        if self.status not in COMPILE_STATUSES:
            raise ValueError(f"unknown compile status {self.status!r}")
        if self.status == "ok" and (self.speedup is None or self.compile_s is None):
            raise ValueError("a measured compile record needs its speedup and compile_s")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def group(self) -> tuple[str, str]:
        return self.precision, self.activation_checkpointing

    def speedup_at(self, micro_batch_size: int) -> float:
        """The speed-up at ``micro_batch_size``: linear in b between the measured sizes, the
        nearest size's outside them (a compiled step's gain shrinks as b grows: its fixed
        per-op overhead is what fusion saves most of), the group's median without sizes."""
        if self.speedup is None:
            raise ValueError(
                f"torch.compile of {self.precision}/{self.activation_checkpointing} "
                "was not measured"
            )
        pairs = sorted(zip(self.micro_batch_sizes, self.speedup_by_size, strict=False))
        if len(pairs) < 2:
            return pairs[0][1] if pairs else self.speedup
        (b0, s0), (b1, s1) = pairs[0], pairs[-1]
        b = min(max(float(micro_batch_size), b0), b1)
        return s0 + (s1 - s0) * (b - b0) / (b1 - b0)

    def extra_bytes_at(self, micro_batch_size: int) -> int | None:
        """What a compiled forward+backward holds beyond the eager one at ``micro_batch_size``:
        the line through the measured sizes (activations grow linearly in b, and so does a
        difference of them; extended beyond the sizes, not held flat), never below zero (a
        saving that was measured, not traced, is not counted on). None when not measured."""
        pairs = sorted(zip(self.micro_batch_sizes, self.extra_bytes_by_size, strict=False))
        if not pairs:
            return None
        if len(pairs) < 2:
            return max(pairs[0][1], 0)
        (b0, e0), (b1, e1) = pairs[0], pairs[-1]
        slope = (e1 - e0) / (b1 - b0)
        return max(math.ceil(e0 + slope * (micro_batch_size - b0)), 0)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["micro_batch_sizes"] = list(self.micro_batch_sizes)
        out["speedup_by_size"] = list(self.speedup_by_size)
        out["extra_bytes_by_size"] = list(self.extra_bytes_by_size)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CompileMeasurement:
        names = {f.name for f in dataclasses.fields(cls)}
        kept = {k: v for k, v in data.items() if k in names}
        kept["micro_batch_sizes"] = tuple(int(b) for b in data.get("micro_batch_sizes", ()))
        kept["speedup_by_size"] = tuple(float(s) for s in data.get("speedup_by_size", ()))
        kept["extra_bytes_by_size"] = tuple(int(e) for e in data.get("extra_bytes_by_size", ()))
        return cls(**kept)


# The C++ compilers inductor's CPU backend looks for (torch._inductor.config.cpp.cxx searches
# $CXX, then g++; clang++ and c++ are the other names it accepts on Linux and macOS).
CPP_COMPILERS = ("g++", "clang++", "c++")


def compile_unavailable(device_type: str) -> str:
    """Why torch.compile cannot run on ``device_type`` here (one line); empty when it can.

    CPU: inductor generates C++ and needs a compiler on PATH. CUDA: it generates Triton
    kernels and needs the ``triton`` package. Imports no torch.
    """
    if device_type == "cpu":
        wanted = os.environ.get("CXX")
        names = (wanted, *CPP_COMPILERS) if wanted else CPP_COMPILERS
        if any(shutil.which(n) for n in names):
            return ""
        return (
            "torch.compile on CPU needs a C++ compiler (inductor's C++ backend) and none of "
            f"{', '.join(names)} is on PATH: install g++ or set CXX"
        )
    if device_type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "torch.compile on CUDA needs the triton package: pip install triton"
        return ""
    return f"torch.compile is not supported by advisor on device type {device_type!r}"


def find_compile(
    measured: Sequence[CompileMeasurement], precision: str, checkpointing: str
) -> CompileMeasurement | None:
    """The record of this group, if the probe reached it."""
    return next((m for m in measured if m.group == (precision, checkpointing)), None)


def amortised_step_s(step_s: float, compile_s: float, steps: int) -> float:
    """Seconds per step over a run of ``steps`` steps that pays ``compile_s`` once."""
    return step_s + compile_s / max(steps, 1)
