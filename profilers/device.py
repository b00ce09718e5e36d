"""What the device is, what its datasheet says, and what it actually does: one short probe.

:func:`probe_device` reads the facts (name, memory, CPU ISA, driver, clocks, links, topology),
finds the datasheet row (:mod:`profilers.hardware`, None when unknown) and measures, within
``budget_s``: GEMM throughput per dtype, memory bandwidth (a large copy), and, for every
training precision, whether an autocast forward+backward runs and how fast it is against fp32.
Nothing is assumed: on a CPU without native fp16 an fp16 step is tens of times slower than fp32,
and on one with AVX512-BF16 bf16 can be faster: it is measured.

This module holds the entry points and the host's facts. The records are in
:mod:`profilers.device_records`, the GPU facts (torch, NVML) in :mod:`profilers.device_gpu`, the
GEMM and copy benchmarks with their timing discipline in :mod:`profilers.device_bench`, the
precision checks in :mod:`profilers.device_precision`. Every name is importable from here, and
no torch is imported until a probe runs.
"""

from __future__ import annotations

import os
import re
import time
from typing import TYPE_CHECKING

from profilers.device_bench import copy_benchmark, matmul_benchmark
from profilers.device_gpu import read_gpu_info
from profilers.device_precision import precision_benchmarks, try_autocast_step
from profilers.device_records import (
    Benchmark,
    CpuInfo,
    DeviceInfo,
    GpuInfo,
    PeerLink,
    PrecisionCheck,
)
from profilers.hardware import match_device
from profilers.workload import PRECISIONS

if TYPE_CHECKING:
    import torch

__all__ = [
    "MATMUL_DTYPES",
    "Benchmark",
    "CpuInfo",
    "DeviceInfo",
    "GpuInfo",
    "PeerLink",
    "PrecisionCheck",
    "probe_device",
    "read_cpu_info",
    "read_gpu_info",
    "read_host_memory",
    "supported_precisions",
]

MATMUL_DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")


# -- public entry points ----------------------------------------------------------------------


def probe_device(device: str | torch.device = "cpu", *, budget_s: float = 5.0) -> DeviceInfo:
    """Facts and short measurements of ``device``, all within about ``budget_s`` seconds.

    Each phase (a GEMM per dtype, the copy, the precision steps) gets a fixed share of the
    budget and plans its calls to fit; a call that started in time may end after it, so a
    contended host can overrun by a few calls. A phase that cannot run is recorded with its
    ``error``, never silently missing. Creating the CUDA context is not counted.
    """
    import torch

    dev = _resolve(device)
    if budget_s <= 0:
        raise ValueError(f"budget_s must be positive, got {budget_s}")
    if dev.type == "cuda":
        torch.zeros(1, device=dev)  # create the CUDA context before the clock starts
    started = time.perf_counter()
    cpu = read_cpu_info()
    gpu: GpuInfo | None = None
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        free, total = torch.cuda.mem_get_info(dev)
        gpu = read_gpu_info(dev.index or 0)
    else:
        name = cpu.model_name
        total, free = read_host_memory()
    reasons = supported_precisions(dev)
    # Fixed shares of the budget, so a phase that overruns (a slow first call) cannot starve
    # the next ones: each GEMM dtype 1, the copy 0.5, the three precision steps together 3.
    dtypes = [d for d in MATMUL_DTYPES if dev.type == "cuda" or d != "tf32"]
    unit = budget_s / (len(dtypes) + 0.5 + 3.0)
    matmul = {dtype: matmul_benchmark(dev, dtype, unit, free) for dtype in dtypes}
    bandwidth = copy_benchmark(dev, 0.5 * unit, free)
    precisions = precision_benchmarks(dev, 3.0 * unit, reasons)
    return DeviceInfo(
        kind=dev.type,
        name=name,
        index=dev.index if dev.type == "cuda" else None,
        total_memory_bytes=int(total),
        free_memory_bytes=int(free),
        torch_version=str(torch.__version__),
        cpu=cpu,
        gpu=gpu,
        datasheet=match_device(name) if dev.type == "cuda" else None,
        fp32_matmul_precision=_fp32_matmul_precision(),
        matmul=matmul,
        memory_bandwidth=bandwidth,
        precisions=precisions,
        host_load_1m=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        budget_s=budget_s,
        elapsed_s=time.perf_counter() - started,
    )


def _fp32_matmul_precision() -> str:
    import torch

    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError as exc:  # settings that mix torch's legacy and new TF32 switches
        return f"unknown ({exc})"


def supported_precisions(device: str | torch.device) -> dict[str, str | None]:
    """For each training precision, None if the device runs it, else the reason and the fix.

    Checks the hardware first (bf16 needs compute capability 8.0 on CUDA), then runs a tiny
    autocast forward+backward, so a build or driver that cannot is caught too. Milliseconds once
    the device is initialised.
    """
    return {precision: precision_problem(device, precision) for precision in PRECISIONS}


def precision_problem(device: str | torch.device, precision: str) -> str | None:
    """None if ``device`` runs ``precision``, else the reason and the fix (one precision of
    :func:`supported_precisions`). A training process checks only its own: each check runs a
    tiny autocast step of a probe block, which loads kernels a run may never use: on a 2-vCPU
    Intel Xeon, the three steps took an fp32 ``advisor train`` process 67 MiB more resident memory
    (the fp32 one alone 46 MiB) than the profile's memory check measured for it, and its
    predicted peak fell 8-9% below the measured one. fp32 runs everywhere: not tried."""
    import torch

    dev = _resolve(device)
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if precision == "fp32":  # every device runs it; its try step would only load kernels
        return None
    reason: str | None = None
    if dev.type == "cuda" and precision == "bf16" and torch.version.hip is None:
        # torch.cuda.is_bf16_supported(including_emulation=False), for *this* device (that
        # one asks the current device); emulated bf16 on older GPUs is far too slow to train.
        major, minor = torch.cuda.get_device_capability(dev)
        if major < 8:
            reason = (
                "bf16 needs an NVIDIA GPU of compute capability 8.0 or newer (Ampere+); "
                f"{torch.cuda.get_device_name(dev)} is {major}.{minor}: use --precision fp16 "
                "(with loss scaling) or --precision fp32"
            )
    return reason or try_autocast_step(dev, precision)


def _resolve(device: str | torch.device) -> torch.device:
    import torch

    dev = torch.device(device)
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ValueError(f"unsupported device {str(dev)!r}: use 'cpu' or 'cuda[:N]'")
    if not torch.cuda.is_available():
        raise ValueError(f"{str(dev)!r} requested but CUDA is not available here: use 'cpu'")
    return torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)


# -- host facts -------------------------------------------------------------------------------

_ISA = re.compile(r"^(sse4_2|avx|avx2|fma|f16c|avx_vnni|avx512.*|amx.*)$")


def read_cpu_info(cpuinfo_path: str = "/proc/cpuinfo") -> CpuInfo:
    import platform

    import torch

    model, flags = "", ""
    try:
        with open(cpuinfo_path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = value
                if model and flags:
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    return CpuInfo(
        model_name=model or platform.processor() or platform.machine() or "unknown CPU",
        num_logical_cores=os.cpu_count() or 1,
        num_usable_cores=usable,
        torch_num_threads=torch.get_num_threads(),
        torch_cpu_capability=str(torch.backends.cpu.get_cpu_capability()),
        isa_flags=tuple(sorted(f for f in flags.split() if _ISA.match(f))),
    )


def read_host_memory(meminfo_path: str = "/proc/meminfo") -> tuple[int, int]:
    """(total, available) bytes of RAM, capped by the cgroup memory limit when one is set."""
    info: dict[str, int] = {}
    try:
        with open(meminfo_path) as f:
            for line in f:
                key, _, value = line.partition(":")
                parts = value.split()
                if parts and parts[0].isdigit():
                    info[key] = int(parts[0]) * 1024  # /proc/meminfo's "kB" are KiB
    except OSError:
        pass
    total = info.get("MemTotal", 0)
    available = info.get("MemAvailable", info.get("MemFree", 0))
    limit, used = _cgroup_memory()
    if limit is not None and (total == 0 or limit < total):
        total = limit
        available = min(available or limit, max(limit - (used or 0), 0))
    return total, available


def _cgroup_memory() -> tuple[int | None, int | None]:
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # v2
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),  # v1
    ):
        try:
            with open(limit_path) as f:
                raw = f.read().strip()
        except OSError:
            continue
        if not raw.isdigit() or int(raw) >= 2**60:  # "max", or v1's "unlimited" sentinel
            return None, None
        try:
            with open(usage_path) as f:
                used: int | None = int(f.read().strip())
        except (OSError, ValueError):
            used = None
        return int(raw), used
    return None, None
