"""What the device is, what its datasheet says, and what it actually does: one short probe.

:func:`probe_device` reads the facts (name, memory, CPU ISA, driver, clocks, links, topology),
finds the datasheet row (:mod:`profilers.hardware`, None when unknown) and measures, within
``budget_s``: GEMM throughput per dtype, memory bandwidth (a large copy), and, for every
training precision, whether an autocast forward+backward runs and how fast it is against fp32.
Nothing is assumed: on a CPU without native fp16 an fp16 step is tens of times slower than fp32,
and on one with AVX512-BF16 bf16 can be faster: it is measured.

Timing discipline (nanoGPT's): one warm-up call discarded (allocation, kernel selection, lazy
init), then timed calls, each between two device synchronisations, median of the samples. When
even one timed call cannot fit in the remaining budget the warm-up itself is the only sample
(``warmup_only``), an upper bound on the time.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from profilers.hardware import HardwareSpec, match_device
from profilers.workload import PRECISIONS

if TYPE_CHECKING:
    import torch

MATMUL_DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")


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
    matmul = {dtype: _matmul_benchmark(dev, dtype, unit, free) for dtype in dtypes}
    bandwidth = _copy_benchmark(dev, 0.5 * unit, free)
    precisions = _precision_benchmarks(dev, 3.0 * unit, reasons)
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
    import torch

    dev = _resolve(device)
    out: dict[str, str | None] = {}
    for precision in PRECISIONS:
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
        out[precision] = reason or _try_autocast_step(dev, precision)
    return out


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


# -- GPU facts: torch, then NVML (best effort: every call may fail on a given driver/board) ----

# nvmlDeviceGetTopologyCommonAncestor levels, in nvidia-smi topo -m words.
_TOPOLOGY = {0: "SELF", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def read_gpu_info(index: int) -> GpuInfo:
    import torch

    props = torch.cuda.get_device_properties(index)
    raw_uuid = getattr(props, "uuid", None)
    uuid = None if raw_uuid is None else str(raw_uuid)
    if uuid and not uuid.startswith(("GPU-", "MIG-")):
        uuid = f"GPU-{uuid}"
    base = GpuInfo(
        compute_capability=f"{props.major}.{props.minor}",
        num_sms=int(props.multi_processor_count),
        num_visible_gpus=torch.cuda.device_count(),
        cuda_version=torch.version.cuda,
        uuid=uuid,
    )
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no driver library, no permission, ...
        return dataclasses.replace(base, nvml_error=f"NVML unavailable: {exc}")
    try:
        return _read_nvml(pynvml, base, index)
    except Exception as exc:
        return dataclasses.replace(base, nvml_error=f"NVML query failed: {exc}")
    finally:
        _nv(pynvml.nvmlShutdown)


def _nv(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        value = fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: the field stays None
        return None
    return value.decode() if isinstance(value, bytes) else value


def _read_nvml(nv: Any, base: GpuInfo, index: int) -> GpuInfo:
    handle = _nv(nv.nvmlDeviceGetHandleByUUID, base.uuid) if base.uuid else None
    if handle is None and "CUDA_VISIBLE_DEVICES" not in os.environ:
        handle = _nv(nv.nvmlDeviceGetHandleByIndex, index)  # CUDA order = NVML order only then
    if handle is None:
        return dataclasses.replace(base, nvml_error="no NVML handle matches this CUDA device")
    links = [
        link
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
        if _nv(nv.nvmlDeviceGetNvLinkState, handle, link) == getattr(nv, "NVML_FEATURE_ENABLED", 1)
    ]
    num_node_gpus = _nv(nv.nvmlDeviceGetCount)
    peers = []
    for other in range(num_node_gpus or 0):
        peer = _nv(nv.nvmlDeviceGetHandleByIndex, other)
        if peer is None or _nv(nv.nvmlDeviceGetUUID, peer) == base.uuid:
            continue
        level = _nv(nv.nvmlDeviceGetTopologyCommonAncestor, handle, peer)
        if level == 0:  # NVML_TOPOLOGY_INTERNAL: this very GPU
            continue
        p2p = _nv(nv.nvmlDeviceGetP2PStatus, handle, peer, nv.NVML_P2P_CAPS_INDEX_NVLINK)
        nvlink = p2p == nv.NVML_P2P_STATUS_OK
        peers.append(PeerLink(index=other, path=_TOPOLOGY.get(level, "?"), nvlink=nvlink))
    power_mw = _nv(nv.nvmlDeviceGetEnforcedPowerLimit, handle) or _nv(
        nv.nvmlDeviceGetPowerManagementLimit, handle
    )
    return dataclasses.replace(
        base,
        driver_version=_nv(nv.nvmlSystemGetDriverVersion),
        power_limit_w=power_mw / 1000 if power_mw else None,
        sm_clock_mhz=_nv(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM),
        max_sm_clock_mhz=_nv(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_SM),
        memory_clock_mhz=_nv(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_MEM),
        max_memory_clock_mhz=_nv(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_MEM),
        pcie_gen=_nv(nv.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        pcie_width=_nv(nv.nvmlDeviceGetCurrPcieLinkWidth, handle),
        max_pcie_gen=_nv(nv.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        max_pcie_width=_nv(nv.nvmlDeviceGetMaxPcieLinkWidth, handle),
        nvlink_version=_nv(nv.nvmlDeviceGetNvLinkVersion, handle, links[0]) if links else None,
        num_nvlinks=len(links),
        num_node_gpus=num_node_gpus,
        peers=tuple(peers),
    )


# -- measurements -----------------------------------------------------------------------------


def _sync(dev: torch.device) -> Callable[[], None]:
    import torch

    if dev.type == "cuda":
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None


def _time_call(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    """Seconds of one call, between two synchronisations (kernels are async on CUDA)."""
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def _timed(
    fn: Callable[[], object], sync: Callable[[], None], budget_s: float, *, max_reps: int = 10
) -> tuple[tuple[float, ...], bool]:
    """(samples, warmup_only): one discarded warm-up, then calls while the budget holds."""
    deadline = time.perf_counter() + budget_s
    warmup = _time_call(fn, sync)
    samples: list[float] = []
    while len(samples) < max_reps:
        expected = statistics.median(samples) if samples else warmup
        if time.perf_counter() + expected > deadline:
            break
        samples.append(_time_call(fn, sync))
    return (tuple(samples), False) if samples else ((warmup,), True)


_SKIPPED = "skipped: its share of budget_s was too small"


def _matmul_benchmark(dev: torch.device, dtype: str, budget_s: float, free: int) -> Benchmark:
    """n×n GEMM; n doubles from a small start until one call takes ``target`` seconds."""
    import torch

    name = f"matmul_{dtype}"
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
    cuda = dev.type == "cuda"
    n, target, n_max = (1024, 0.005, 16384) if cuda else (512, 0.01, 2048)
    element = torch.finfo(torch_dtype).bits // 8
    while n_max > n and 3 * n_max * n_max * element > free // 4:  # a, b, out in a quarter
        n_max //= 2
    if budget_s < 0.01:
        return Benchmark(name=name, size=0, work=0.0, error=_SKIPPED)
    start, sync = time.perf_counter(), _sync(dev)
    try:
        with _tf32(dev, dtype == "tf32"):
            while True:
                gemm = _gemm(n, dev, torch_dtype)
                _time_call(gemm, sync)  # the first call at a size pays for setup
                # The faster of two: one call delayed by a neighbour must not stop the ramp.
                seconds = min(_time_call(gemm, sync), _time_call(gemm, sync))
                # A call at 2n costs ~8x; it needs three ramp calls and a few timed ones.
                left = budget_s - (time.perf_counter() - start)
                if seconds >= target or 2 * n > n_max or 8 * seconds * 7 > left:
                    break
                n *= 2
            samples, warmup_only = _timed(gemm, sync, budget_s - (time.perf_counter() - start))
    except Exception as exc:  # an unsupported dtype on this device, OOM, ...
        error = f"{type(exc).__name__}: {exc}"
        return Benchmark(name=name, size=n, work=2.0 * n**3, error=error)
    return Benchmark(name=name, size=n, work=2.0 * n**3, samples_s=samples, warmup_only=warmup_only)


def _gemm(n: int, dev: torch.device, dtype: torch.dtype) -> Callable[[], object]:
    import torch

    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    return lambda: torch.mm(a, b)


class _tf32:
    """Scope TF32 for CUDA GEMMs on (``tf32``) or off (every other dtype), then restore.

    Through the legacy switch ``torch.backends.cuda.matmul.allow_tf32``, which sets the legacy
    precision and the new ``fp32_precision`` together: setting only the new one while the legacy
    one says "highest" makes every cuBLAS GEMM raise "you have used mix of the legacy and new
    APIs" (ATen Context::allowTF32CuBLAS checks they agree). Both are restored on exit.
    """

    def __init__(self, dev: torch.device, enabled: bool) -> None:
        self.active, self.enabled = dev.type == "cuda", enabled
        self.old_legacy: str | None = None
        self.old_new: str | None = None

    def __enter__(self) -> None:
        import torch

        if not self.active:
            return
        matmul = torch.backends.cuda.matmul
        with warnings.catch_warnings():  # torch >= 2.9 warns that the legacy switch is legacy
            warnings.simplefilter("ignore")
            try:
                self.old_legacy = torch.get_float32_matmul_precision()
            except RuntimeError:  # the caller's settings already mix the two APIs
                self.old_legacy = None
            self.old_new = getattr(matmul, "fp32_precision", None)
            matmul.allow_tf32 = self.enabled

    def __exit__(self, *exc: object) -> None:
        import torch

        if not self.active:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self.old_legacy is not None:
                torch.set_float32_matmul_precision(self.old_legacy)
            matmul = torch.backends.cuda.matmul
            # Only if the legacy call did not already bring it back: setting the new switch
            # needlessly would itself make a mix.
            if self.old_new is not None and matmul.fp32_precision != self.old_new:
                matmul.fp32_precision = self.old_new


def _copy_benchmark(dev: torch.device, budget_s: float, free: int) -> Benchmark:
    """Device-memory bandwidth: copy a large tensor, counting read + write (STREAM's 'copy')."""
    import torch

    cap = 2 * 2**30 if dev.type == "cuda" else 256 * 2**20
    size = max(min(cap, free // (8 if dev.type == "cuda" else 16)), 16 * 2**20) // 4 * 4
    if budget_s < 0.01:
        return Benchmark(name="copy", size=size, work=2.0 * size, error=_SKIPPED)
    try:
        src = torch.ones(size // 4, device=dev)  # written once: every page is touched
        dst = torch.zeros_like(src)
        samples, warmup_only = _timed(lambda: dst.copy_(src), _sync(dev), budget_s)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        return Benchmark(name="copy", size=size, work=2.0 * size, error=error)
    return Benchmark(
        name="copy", size=size, work=2.0 * size, samples_s=samples, warmup_only=warmup_only
    )


def _probe_block(d: int, heads: int) -> torch.nn.Module:
    """One pre-LN Transformer block (attention via SDPA, 4x GELU MLP): the work a step does."""
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = (
                z.view(b, t, heads, d // heads).transpose(1, 2)
                for z in self.qkv(self.ln1(x)).split(d, dim=2)
            )
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    return Block()


_AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}


def _autocast_step(block: torch.nn.Module, x: torch.Tensor, precision: str) -> None:
    import torch

    dtype = getattr(torch, _AUTOCAST.get(precision, "bfloat16"))
    block.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=dtype, enabled=precision in _AUTOCAST):
        loss = block(x).float().square().mean()
    loss.backward()


def _try_autocast_step(dev: torch.device, precision: str) -> str | None:
    import torch

    try:
        block = _probe_block(16, 2).to(dev)
        _autocast_step(block, torch.randn(1, 8, 16, device=dev), precision)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    except Exception as exc:
        return (
            f"an autocast {precision} forward+backward failed on {dev}: "
            f"{type(exc).__name__}: {exc}; use --precision fp32"
        )
    return None


def _precision_benchmarks(
    dev: torch.device, budget_s: float, reasons: Mapping[str, str | None]
) -> dict[str, PrecisionCheck]:
    """Time one block's forward+backward per supported precision, interleaved round-robin
    (a neighbour's load then hits every precision alike) until the budget is spent."""
    import torch

    batch, seq, d, heads = (8, 1024, 1024, 16) if dev.type == "cuda" else (2, 128, 256, 4)
    ok = [p for p in PRECISIONS if reasons.get(p) is None]
    out = {p: PrecisionCheck(precision=p, reason=r) for p, r in reasons.items() if r is not None}
    deadline, sync = time.perf_counter() + budget_s, _sync(dev)
    samples: dict[str, list[float]] = {p: [] for p in ok}
    warmups: dict[str, float] = {}
    try:
        block = _probe_block(d, heads).to(dev)
        x = torch.randn(batch, seq, d, device=dev)
        steps = {p: functools.partial(_autocast_step, block, x, p) for p in ok}
        for p in ok:
            if time.perf_counter() >= deadline:
                break
            warmups[p] = _time_call(steps[p], sync)
        progressed = True
        while progressed:
            progressed = False
            for p in warmups:
                expected = statistics.median(samples[p]) if samples[p] else warmups[p]
                if len(samples[p]) < 7 and time.perf_counter() + expected <= deadline:
                    samples[p].append(_time_call(steps[p], sync))
                    progressed = True
    except Exception as exc:  # e.g. OOM at the probe size: support is known, speed is not
        error = f"{type(exc).__name__}: {exc}"
        out.update({p: PrecisionCheck(precision=p, tokens=batch * seq, error=error) for p in ok})
        return {p: out[p] for p in PRECISIONS if p in out}
    medians = {p: statistics.median(s or [warmups[p]]) for p, s in samples.items() if p in warmups}
    for p in ok:
        median = medians.get(p)
        fp32 = medians.get("fp32")
        out[p] = PrecisionCheck(
            precision=p,
            tokens=batch * seq,
            samples_s=tuple(samples[p]) or ((warmups[p],) if p in warmups else ()),
            warmup_only=p in warmups and not samples[p],
            speedup_vs_fp32=fp32 / median if fp32 and median else None,
            error=None if p in warmups else _SKIPPED,
        )
    return {p: out[p] for p in PRECISIONS if p in out}
