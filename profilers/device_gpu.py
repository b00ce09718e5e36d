"""GPU facts: torch, then NVML (best effort: every call may fail on a given driver/board)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from profilers.device_records import GpuInfo, PeerLink

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
