from __future__ import annotations

import pytest

from profilers.hardware import (
    DTYPES,
    HARDWARE,
    NETWORKS,
    HardwareSpec,
    lookup_network,
    lookup_target,
    match_device,
    target_keys,
)


@pytest.mark.parametrize(
    ("device_name", "key"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H200 NVL", "h200-nvl"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm-40gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA A10G", "a10g"),
        ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
        ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
        ("Tesla V100-PCIE-32GB", "v100-pcie-32gb"),
        ("Tesla T4", "t4"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
    ],
)
def test_known_device_names_match_their_row(device_name: str, key: str) -> None:
    spec = match_device(device_name)
    assert spec is not None and spec.key == key


@pytest.mark.parametrize(
    "device_name",
    [
        "NVIDIA A100",  # 40 or 80 GB? not pinned down: unknown, not a guess
        "NVIDIA H100",
        "NVIDIA GeForce RTX 3090 Ti",
        "NVIDIA GeForce RTX 4080",
        "NVIDIA A100X",
        "AMD Instinct MI300X",
        "AMD EPYC 7763 64-Core Processor",
        "",
    ],
)
def test_unknown_or_ambiguous_names_are_none(device_name: str) -> None:
    assert match_device(device_name) is None


def test_table_rows_are_consistent() -> None:
    keys = target_keys()
    assert len(keys) == len(set(keys)), "a what-if key names two rows"
    for spec in HARDWARE:
        assert spec.source, f"{spec.key} cites no source"
        assert spec.memory_gib > 0 and spec.pcie_gbs > 0
        peaks = {d: spec.peak_flops(d) for d in DTYPES}
        if peaks["fp32"] is not None:  # tensor-core dtypes are never slower than plain fp32
            assert all(p is None or p >= peaks["fp32"] for p in peaks.values()), spec.key
        assert (spec.nvlink_gbs is None) == (spec.nvlink_kind is None) == (spec.nvlink_gen is None)


def test_peak_flops_are_dense_datasheet_values() -> None:
    h100 = lookup_target("h100-80gb")
    assert h100.peak_flops("bf16") == pytest.approx(989.5e12)  # 1979 sparse / 2
    assert lookup_target("a100-80gb").peak_flops("tf32") == pytest.approx(156e12)
    v100 = lookup_target("v100-32gb")
    assert v100.peak_flops("bf16") is None and v100.peak_flops("fp16") == pytest.approx(125e12)
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        h100.peak_flops("int8")


def test_lookup_target_is_case_insensitive_and_lists_keys_when_unknown() -> None:
    assert lookup_target(" H200 ").key == "h200"
    assert lookup_target("A100-80GB").key == "a100-sxm-80gb"
    with pytest.raises(ValueError, match="unknown target device 'h300'") as err:
        lookup_target("h300")
    assert "h100-80gb" in str(err.value) and "a100-80gb" in str(err.value)


def test_spec_round_trips_through_dict() -> None:
    for spec in HARDWARE:
        assert HardwareSpec.from_dict(spec.to_dict()) == spec


def test_network_presets() -> None:
    ndr = lookup_network("ib-ndr-400")
    assert ndr.bytes_per_s == 50e9
    assert lookup_network("ib-ndr-400-x8").bytes_per_s == 400e9
    assert len({n.key for n in NETWORKS}) == len(NETWORKS)
    with pytest.raises(ValueError, match=r"choose one of .*eth-100"):
        lookup_network("carrier-pigeon")
