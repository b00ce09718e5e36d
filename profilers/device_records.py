"""The device probe's records: what the device is and what it measured (no torch).

:class:`DeviceInfo` (profile.json's ``device``) with the host's :class:`CpuInfo`, a GPU's
:class:`GpuInfo` and its peers (:class:`PeerLink`), and the measurements: :class:`Benchmark` (a
GEMM or the copy) and :class:`PrecisionCheck` (an autocast precision). :mod:`profilers.device`
gathers them; strategies and reports read them.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from profilers.hardware import HardwareSpec


def _fields(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True, kw_only=True, slots=True)
class Benchmark:
    """One timed micro-benchmark: raw samples plus the median-based rate."""

    name: str  # "matmul_bf16", "copy"
    size: int  # n of the n×n GEMM, or bytes of the copied tensor
    work: float  # FLOPs (GEMM) or bytes moved, read + write (copy), per call
    samples_s: tuple[float, ...] = ()
    warmup_only: bool = False
    error: str | None = None  # why there is no measurement

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.samples_s) if self.samples_s else None

    @property
    def rate(self) -> float | None:
        """FLOP/s or B/s at the median time."""
        median = self.median_s
        return self.work / median if median else None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(samples_s=list(self.samples_s), median_s=self.median_s, rate=self.rate)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Benchmark:
        kwargs = _fields(cls, data)
        kwargs["samples_s"] = tuple(kwargs.get("samples_s", ()))
        return cls(**kwargs)


@dataclass(frozen=True, kw_only=True, slots=True)
class PrecisionCheck:
    """Can the device train in this autocast precision, and how fast against fp32."""

    precision: str
    reason: str | None = None  # None: supported; else why not, naming the fix
    tokens: int = 0  # tokens per timed step of the probe block
    samples_s: tuple[float, ...] = ()
    warmup_only: bool = False
    speedup_vs_fp32: float | None = None  # fp32 median / this median: 2.0 = twice as fast
    error: str | None = None  # why a supported precision has no timing

    @property
    def supported(self) -> bool:
        return self.reason is None

    @property
    def step_time_s(self) -> float | None:
        return statistics.median(self.samples_s) if self.samples_s else None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(
            samples_s=list(self.samples_s), supported=self.supported, step_time_s=self.step_time_s
        )
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrecisionCheck:
        kwargs = _fields(cls, data)
        kwargs["samples_s"] = tuple(kwargs.get("samples_s", ()))
        return cls(**kwargs)


@dataclass(frozen=True, kw_only=True, slots=True)
class CpuInfo:
    model_name: str
    num_logical_cores: int
    num_usable_cores: int  # this process's affinity mask
    torch_num_threads: int
    torch_cpu_capability: str  # the kernels torch dispatches to: "AVX2", "AVX512", ...
    isa_flags: tuple[str, ...] = ()  # avx2, fma, avx512*, amx*, ... from /proc/cpuinfo

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "isa_flags": list(self.isa_flags)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CpuInfo:
        kwargs = _fields(cls, data)
        kwargs["isa_flags"] = tuple(kwargs.get("isa_flags", ()))
        return cls(**kwargs)


@dataclass(frozen=True, kw_only=True, slots=True)
class PeerLink:
    """How this GPU reaches another GPU of the node (nvidia-smi topo -m vocabulary)."""

    index: int  # NVML index of the peer
    path: str  # PIX | PXB | PHB | NODE | SYS (PCIe path through the common ancestor)
    nvlink: bool  # peer-to-peer over NVLink (direct or through NVSwitch)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PeerLink:
        return cls(**_fields(cls, data))


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuInfo:
    """CUDA facts from torch, and from NVML where it answers (every NVML field may be None)."""

    compute_capability: str  # "9.0"
    num_sms: int
    num_visible_gpus: int  # torch.cuda.device_count()
    cuda_version: str | None = None  # torch's CUDA runtime
    uuid: str | None = None
    driver_version: str | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    max_memory_clock_mhz: int | None = None
    pcie_gen: int | None = None  # current: idle GPUs train their links down
    pcie_width: int | None = None
    max_pcie_gen: int | None = None
    max_pcie_width: int | None = None
    nvlink_version: int | None = None  # as nvmlDeviceGetNvLinkVersion reports it
    num_nvlinks: int | None = None  # active links
    num_node_gpus: int | None = None  # all GPUs NVML sees on the node
    peers: tuple[PeerLink, ...] = ()
    nvml_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["peers"] = [p.to_dict() for p in self.peers]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuInfo:
        kwargs = _fields(cls, data)
        kwargs["peers"] = tuple(PeerLink.from_dict(p) for p in kwargs.get("peers", ()))
        return cls(**kwargs)


_NESTED = ("cpu", "gpu", "datasheet", "matmul", "memory_bandwidth", "precisions")


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceInfo:
    kind: str  # "cpu" | "cuda"
    name: str
    index: int | None
    total_memory_bytes: int  # CUDA: mem_get_info; CPU: RAM (or the cgroup limit if lower)
    free_memory_bytes: int
    torch_version: str
    cpu: CpuInfo  # the host, also for a CUDA device (data loading runs there)
    gpu: GpuInfo | None = None
    datasheet: HardwareSpec | None = None
    fp32_matmul_precision: str = "highest"  # torch.get_float32_matmul_precision() at probe time
    matmul: dict[str, Benchmark] = field(default_factory=dict)  # dtype -> GEMM benchmark
    memory_bandwidth: Benchmark | None = None
    precisions: dict[str, PrecisionCheck] = field(default_factory=dict)
    host_load_1m: float | None = None  # load average when probed: above the cores = contended
    budget_s: float = 0.0
    elapsed_s: float = 0.0

    def measured_flops(self, dtype: str) -> float | None:
        """Measured GEMM FLOP/s for ``dtype``, or None if not measured."""
        bench = self.matmul.get(dtype)
        return bench.rate if bench else None

    def peak_flops(self, dtype: str) -> float | None:
        """Datasheet FLOP/s, None when the device is not in the table (CPUs never are)."""
        return self.datasheet.peak_flops(dtype) if self.datasheet else None

    def to_dict(self) -> dict[str, Any]:
        return {
            **{
                f.name: getattr(self, f.name)
                for f in dataclasses.fields(self)
                if f.name not in _NESTED
            },
            "cpu": self.cpu.to_dict(),
            "gpu": self.gpu.to_dict() if self.gpu else None,
            "datasheet": self.datasheet.to_dict() if self.datasheet else None,
            "matmul": {k: v.to_dict() for k, v in self.matmul.items()},
            "memory_bandwidth": self.memory_bandwidth.to_dict() if self.memory_bandwidth else None,
            "precisions": {k: v.to_dict() for k, v in self.precisions.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceInfo:
        kwargs = _fields(cls, data)
        kwargs["cpu"] = CpuInfo.from_dict(data["cpu"])
        kwargs["gpu"] = GpuInfo.from_dict(data["gpu"]) if data.get("gpu") else None
        sheet = data.get("datasheet")
        kwargs["datasheet"] = HardwareSpec.from_dict(sheet) if sheet else None
        kwargs["matmul"] = {k: Benchmark.from_dict(v) for k, v in data.get("matmul", {}).items()}
        bandwidth = data.get("memory_bandwidth")
        kwargs["memory_bandwidth"] = Benchmark.from_dict(bandwidth) if bandwidth else None
        kwargs["precisions"] = {
            k: PrecisionCheck.from_dict(v) for k, v in data.get("precisions", {}).items()
        }
        return cls(**kwargs)
