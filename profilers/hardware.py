"""Datasheet facts about accelerators and networks: ordered data tables, no logic hidden in them.

Peaks are *dense* (no 2:4 structured sparsity: vendors print the sparse figure first and flag
it with an asterisk; every value below is that figure halved where only the sparse one is
printed) tensor-core FLOP/s with FP32 accumulation, which is what PyTorch's GEMMs use. ``None``
means the datasheet gives no such figure (V100 has no BF16/TF32 units) or, for the AWS-only A10G,
that NVIDIA publishes no datasheet at all: an unknown stays unknown, never a guess (nanochat's
rule). The device probe measures the real numbers next to these.

Units: TFLOP/s = 1e12 FLOP/s; memory in GiB as printed on the datasheet ("80GB" of HBM is 80 GiB
of chips; the usable total that ``mem_get_info`` reports is a little less); bandwidths in GB/s =
1e9 B/s, per direction. NVLink bandwidth is per GPU summed over its links; vendors print the
bidirectional total, halved here. ``nvlink_kind``: "switch" = every GPU of the board reaches every
other through NVSwitch at full rate (HGX/DGX); "bridge" = an optional bridge joins pairs (or
quads) of PCIe cards, everything else goes over PCIe.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DTYPES: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")

# Usable PCIe bandwidth of an x16 link per direction, GB/s, after 128b/130b encoding
# (PCI-SIG: 8, 16, 32 GT/s per lane for gen 3, 4, 5; 64 GT/s PAM4 + FLIT for gen 6).
PCIE_X16_GBS: Mapping[int, float] = {3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}


@dataclass(frozen=True, kw_only=True, slots=True)
class HardwareSpec:
    """One accelerator model as its datasheet describes it."""

    key: str  # what-if planning key, e.g. "h100-sxm"
    name: str  # marketing name
    aliases: tuple[str, ...] = ()  # more what-if keys, e.g. "h100-80gb"
    fp32_tflops: float | None
    tf32_tflops: float | None
    bf16_tflops: float | None
    fp16_tflops: float | None
    memory_gib: float
    memory_bandwidth_gbs: float | None
    pcie_gen: int
    nvlink_gen: int | None = None
    nvlink_gbs: float | None = None  # per GPU, per direction, all links together
    nvlink_kind: str | None = None  # "switch" | "bridge" | None
    source: str = ""
    # Streaming multiprocessors (the unit a GEMM's tiles are scheduled over in waves) and the
    # architecture generation; from :data:`_CHIP_FACTS`, None/"" when not known.
    num_sms: int | None = None
    architecture: str = ""

    def peak_flops(self, dtype: str) -> float | None:
        """Dense peak FLOP/s for ``dtype`` (fp32|tf32|bf16|fp16), or None if not on the sheet."""
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        tflops = getattr(self, f"{dtype}_tflops")
        return None if tflops is None else tflops * 1e12

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)

    @property
    def pcie_gbs(self) -> float:
        """Usable x16 PCIe bandwidth per direction, GB/s."""
        return PCIE_X16_GBS[self.pcie_gen]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["aliases"] = list(self.aliases)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HardwareSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["aliases"] = tuple(kwargs.get("aliases", ()))
        return cls(**kwargs)


_A100_SHEET = "NVIDIA A100 Tensor Core GPU datasheet (2021), dense column"
_H100_SHEET = "NVIDIA H100 Tensor Core GPU datasheet (2023), sparse figures halved"
_H200_SHEET = "NVIDIA H200 Tensor Core GPU datasheet (2024), sparse figures halved"
_V100_SHEET = "NVIDIA Tesla V100 datasheet (2020); no BF16/TF32 units"
_GA102_WP = "NVIDIA Ampere GA102 architecture whitepaper v2.1, Table 9 (FP32-accumulate column)"

# fmt: off
# Ordered as the matcher tries them: the most specific pattern of a family first (H200 NVL
# before H200, L40S before L40 before L4). Patterns are full matches against the normalised
# torch.cuda.get_device_name() (upper case, "NVIDIA "/"TESLA " and spaces/dashes collapsed).
_TABLE: tuple[tuple[str, HardwareSpec], ...] = (
    # Blackwell
    (r"B200", HardwareSpec(
        key="b200", name="NVIDIA B200 (HGX)", fp32_tflops=75.0, tf32_tflops=1125.0,
        bf16_tflops=2250.0, fp16_tflops=2250.0, memory_gib=180, memory_bandwidth_gbs=8000,
        pcie_gen=5, nvlink_gen=5, nvlink_gbs=900.0, nvlink_kind="switch",
        # HGX B200 table gives 8-GPU totals: 18 PF TF32*, 36 PF FP16/BF16*, 600 TF FP32.
        source="NVIDIA HGX B200 datasheet (2024): 8-GPU totals / 8, sparse figures halved")),
    # Hopper
    (r"H200 ?NVL", HardwareSpec(
        key="h200-nvl", name="NVIDIA H200 NVL", fp32_tflops=60.0, tf32_tflops=417.5,
        bf16_tflops=835.5, fp16_tflops=835.5, memory_gib=141, memory_bandwidth_gbs=4800,
        pcie_gen=5, nvlink_gen=4, nvlink_gbs=450.0, nvlink_kind="bridge", source=_H200_SHEET)),
    (r"H200( ?SXM)?( ?141GB)?( ?HBM3E)?", HardwareSpec(
        key="h200", name="NVIDIA H200 SXM", aliases=("h200-sxm",), fp32_tflops=67.0,
        tf32_tflops=494.5, bf16_tflops=989.5, fp16_tflops=989.5, memory_gib=141,
        memory_bandwidth_gbs=4800, pcie_gen=5, nvlink_gen=4, nvlink_gbs=450.0,
        nvlink_kind="switch", source=_H200_SHEET)),
    (r"H100 ?NVL", HardwareSpec(
        key="h100-nvl", name="NVIDIA H100 NVL", fp32_tflops=60.0, tf32_tflops=417.5,
        bf16_tflops=835.5, fp16_tflops=835.5, memory_gib=94, memory_bandwidth_gbs=3900,
        pcie_gen=5, nvlink_gen=4, nvlink_gbs=300.0, nvlink_kind="bridge", source=_H100_SHEET)),
    (r"H100 ?PCIE( ?80GB)?", HardwareSpec(
        key="h100-pcie", name="NVIDIA H100 PCIe 80GB", fp32_tflops=51.0, tf32_tflops=378.0,
        bf16_tflops=756.5, fp16_tflops=756.5, memory_gib=80, memory_bandwidth_gbs=2000,
        pcie_gen=5, nvlink_gen=4, nvlink_gbs=300.0, nvlink_kind="bridge", source=_H100_SHEET)),
    (r"H100 ?(SXM5? ?)?80GB( ?HBM3)?|H100 ?SXM5?", HardwareSpec(
        key="h100-sxm", name="NVIDIA H100 SXM5 80GB", aliases=("h100-80gb",),
        fp32_tflops=67.0, tf32_tflops=494.5, bf16_tflops=989.5, fp16_tflops=989.5,
        memory_gib=80, memory_bandwidth_gbs=3350, pcie_gen=5, nvlink_gen=4, nvlink_gbs=450.0,
        nvlink_kind="switch", source=_H100_SHEET)),
    # Ampere data centre. A bare "A100" (or "H100") names no variant: unmatched, not guessed.
    (r"A100 ?SXM4? ?80GB", HardwareSpec(
        key="a100-sxm-80gb", name="NVIDIA A100 SXM4 80GB", aliases=("a100-80gb",),
        fp32_tflops=19.5, tf32_tflops=156.0, bf16_tflops=312.0, fp16_tflops=312.0,
        memory_gib=80, memory_bandwidth_gbs=2039, pcie_gen=4, nvlink_gen=3, nvlink_gbs=300.0,
        nvlink_kind="switch", source=_A100_SHEET)),
    (r"A100 ?SXM4? ?40GB", HardwareSpec(
        key="a100-sxm-40gb", name="NVIDIA A100 SXM4 40GB", aliases=("a100-40gb",),
        fp32_tflops=19.5, tf32_tflops=156.0, bf16_tflops=312.0, fp16_tflops=312.0,
        memory_gib=40, memory_bandwidth_gbs=1555, pcie_gen=4, nvlink_gen=3, nvlink_gbs=300.0,
        nvlink_kind="switch", source=_A100_SHEET)),
    (r"A100 ?80GB ?PCIE|A100 ?PCIE ?80GB", HardwareSpec(
        key="a100-pcie-80gb", name="NVIDIA A100 PCIe 80GB", fp32_tflops=19.5,
        tf32_tflops=156.0, bf16_tflops=312.0, fp16_tflops=312.0, memory_gib=80,
        memory_bandwidth_gbs=1935, pcie_gen=4, nvlink_gen=3, nvlink_gbs=300.0,
        nvlink_kind="bridge", source=_A100_SHEET)),
    (r"A100 ?PCIE( ?40GB)?|A100 ?40GB ?PCIE", HardwareSpec(
        key="a100-pcie-40gb", name="NVIDIA A100 PCIe 40GB", fp32_tflops=19.5,
        tf32_tflops=156.0, bf16_tflops=312.0, fp16_tflops=312.0, memory_gib=40,
        memory_bandwidth_gbs=1555, pcie_gen=4, nvlink_gen=3, nvlink_gbs=300.0,
        nvlink_kind="bridge", source=_A100_SHEET)),
    (r"A40", HardwareSpec(
        key="a40", name="NVIDIA A40", fp32_tflops=37.4, tf32_tflops=74.8, bf16_tflops=149.7,
        fp16_tflops=149.7, memory_gib=48, memory_bandwidth_gbs=696, pcie_gen=4, nvlink_gen=3,
        nvlink_gbs=56.25, nvlink_kind="bridge", source="NVIDIA A40 datasheet (2021)")),
    (r"A30", HardwareSpec(
        key="a30", name="NVIDIA A30", fp32_tflops=10.3, tf32_tflops=82.0, bf16_tflops=165.0,
        fp16_tflops=165.0, memory_gib=24, memory_bandwidth_gbs=933, pcie_gen=4, nvlink_gen=3,
        nvlink_gbs=100.0, nvlink_kind="bridge", source="NVIDIA A30 datasheet (2021)")),
    (r"A10", HardwareSpec(
        key="a10", name="NVIDIA A10", fp32_tflops=31.2, tf32_tflops=62.5, bf16_tflops=125.0,
        fp16_tflops=125.0, memory_gib=24, memory_bandwidth_gbs=600, pcie_gen=4,
        source="NVIDIA A10 Tensor Core GPU datasheet (2021)")),
    # AWS-only part (g5 instances): no NVIDIA datasheet exists, so no peaks are claimed.
    (r"A10G", HardwareSpec(
        key="a10g", name="NVIDIA A10G", fp32_tflops=None, tf32_tflops=None, bf16_tflops=None,
        fp16_tflops=None, memory_gib=24, memory_bandwidth_gbs=None, pcie_gen=4,
        source="AWS EC2 G5 instance page (memory only; NVIDIA publishes no A10G datasheet)")),
    # Ada
    (r"L40S", HardwareSpec(
        key="l40s", name="NVIDIA L40S", fp32_tflops=91.6, tf32_tflops=183.0,
        bf16_tflops=362.05, fp16_tflops=362.05, memory_gib=48, memory_bandwidth_gbs=864,
        pcie_gen=4, source="NVIDIA L40S datasheet (2023), sparse figures halved")),
    (r"L40", HardwareSpec(
        key="l40", name="NVIDIA L40", fp32_tflops=90.5, tf32_tflops=90.5, bf16_tflops=181.05,
        fp16_tflops=181.05, memory_gib=48, memory_bandwidth_gbs=864, pcie_gen=4,
        source="NVIDIA L40 datasheet (2022), sparse figures halved")),
    (r"L4", HardwareSpec(
        key="l4", name="NVIDIA L4", fp32_tflops=30.3, tf32_tflops=60.0, bf16_tflops=121.0,
        fp16_tflops=121.0, memory_gib=24, memory_bandwidth_gbs=300, pcie_gen=4,
        source="NVIDIA L4 datasheet (2023), sparse figures halved")),
    # Volta / Turing: FP16 is the tensor-core figure (FP16 multiply, FP32 accumulate).
    (r"V100 ?SXM2 ?32GB", HardwareSpec(
        key="v100-sxm2-32gb", name="NVIDIA V100 SXM2 32GB", aliases=("v100-32gb",),
        fp32_tflops=15.7, tf32_tflops=None, bf16_tflops=None, fp16_tflops=125.0,
        memory_gib=32, memory_bandwidth_gbs=900, pcie_gen=3, nvlink_gen=2, nvlink_gbs=150.0,
        nvlink_kind="switch", source=_V100_SHEET)),
    (r"V100 ?SXM2 ?16GB", HardwareSpec(
        key="v100-sxm2-16gb", name="NVIDIA V100 SXM2 16GB", aliases=("v100-16gb",),
        fp32_tflops=15.7, tf32_tflops=None, bf16_tflops=None, fp16_tflops=125.0,
        memory_gib=16, memory_bandwidth_gbs=900, pcie_gen=3, nvlink_gen=2, nvlink_gbs=150.0,
        nvlink_kind="switch", source=_V100_SHEET)),
    (r"V100S ?PCIE ?32GB", HardwareSpec(
        key="v100s-pcie-32gb", name="NVIDIA V100S PCIe 32GB", fp32_tflops=16.4,
        tf32_tflops=None, bf16_tflops=None, fp16_tflops=130.0, memory_gib=32,
        memory_bandwidth_gbs=1134, pcie_gen=3, source=_V100_SHEET)),
    (r"V100 ?PCIE ?32GB", HardwareSpec(
        key="v100-pcie-32gb", name="NVIDIA V100 PCIe 32GB", fp32_tflops=14.0,
        tf32_tflops=None, bf16_tflops=None, fp16_tflops=112.0, memory_gib=32,
        memory_bandwidth_gbs=900, pcie_gen=3, source=_V100_SHEET)),
    (r"V100 ?PCIE ?16GB", HardwareSpec(
        key="v100-pcie-16gb", name="NVIDIA V100 PCIe 16GB", fp32_tflops=14.0,
        tf32_tflops=None, bf16_tflops=None, fp16_tflops=112.0, memory_gib=16,
        memory_bandwidth_gbs=900, pcie_gen=3, source=_V100_SHEET)),
    (r"T4", HardwareSpec(
        key="t4", name="NVIDIA T4", fp32_tflops=8.1, tf32_tflops=None, bf16_tflops=None,
        fp16_tflops=65.0, memory_gib=16, memory_bandwidth_gbs=320, pcie_gen=3,
        source="NVIDIA T4 Tensor Core GPU datasheet (2019)")),
    # Workstation / consumer. GeForce runs FP32-accumulate tensor math at half the FP16-
    # accumulate rate; RTX A6000 (professional) at full rate.
    (r"RTX A6000", HardwareSpec(
        key="rtx-a6000", name="NVIDIA RTX A6000", fp32_tflops=38.7, tf32_tflops=77.4,
        bf16_tflops=154.8, fp16_tflops=154.8, memory_gib=48, memory_bandwidth_gbs=768,
        pcie_gen=4, nvlink_gen=3, nvlink_gbs=56.25, nvlink_kind="bridge",
        source="NVIDIA RTX A6000 datasheet (309.7 TF sparse tensor) and " + _GA102_WP)),
    (r"(GEFORCE )?RTX 4090", HardwareSpec(
        key="rtx-4090", name="NVIDIA GeForce RTX 4090", fp32_tflops=82.6, tf32_tflops=82.6,
        bf16_tflops=165.2, fp16_tflops=165.2, memory_gib=24, memory_bandwidth_gbs=1008,
        pcie_gen=4, source="NVIDIA Ada Lovelace architecture whitepaper v1.1, Appendix A, "
        "Table 2 (FP32-accumulate column)")),
    (r"(GEFORCE )?RTX 3090", HardwareSpec(
        key="rtx-3090", name="NVIDIA GeForce RTX 3090", fp32_tflops=35.6, tf32_tflops=35.6,
        bf16_tflops=71.0, fp16_tflops=71.0, memory_gib=24, memory_bandwidth_gbs=936,
        pcie_gen=4, nvlink_gen=3, nvlink_gbs=56.25, nvlink_kind="bridge", source=_GA102_WP)),
)
# fmt: on

# SM count and architecture per row, from the architecture whitepapers: GA100 (A100: 108 SMs
# enabled, "NVIDIA A100 Tensor Core GPU Architecture" whitepaper, 2020, p. 20), GH100 (H100 SXM5
# 132, PCIe 114, "NVIDIA H100 Tensor Core GPU Architecture" whitepaper, 2022, Table 2; H200 and
# H100 NVL use the SXM5 configuration), GB200/B200 (148, NVIDIA Blackwell architecture technical
# brief, 2024), GA102 (A40 84, A10 72, A10G 80, RTX A6000 84, RTX 3090 82; GA102 whitepaper
# v2.1, Table 9 and the product briefs), GA100 in A30 (56, A30 datasheet), AD102/AD104 (L40/L40S
# 142, RTX 4090 128, L4 58; Ada Lovelace whitepaper v1.1, Appendix A), GV100 (V100 80, Volta
# whitepaper, 2017), TU104 (T4 40, Turing whitepaper, 2018).
_CHIP_FACTS: Mapping[str, tuple[int, str]] = {
    "b200": (148, "blackwell"),
    "h200-nvl": (132, "hopper"),
    "h200": (132, "hopper"),
    "h100-nvl": (132, "hopper"),
    "h100-pcie": (114, "hopper"),
    "h100-sxm": (132, "hopper"),
    "a100-sxm-80gb": (108, "ampere"),
    "a100-sxm-40gb": (108, "ampere"),
    "a100-pcie-80gb": (108, "ampere"),
    "a100-pcie-40gb": (108, "ampere"),
    "a40": (84, "ampere"),
    "a30": (56, "ampere"),
    "a10": (72, "ampere"),
    "a10g": (80, "ampere"),
    "l40s": (142, "ada"),
    "l40": (142, "ada"),
    "l4": (58, "ada"),
    "v100-sxm2-32gb": (80, "volta"),
    "v100-sxm2-16gb": (80, "volta"),
    "v100s-pcie-32gb": (80, "volta"),
    "v100-pcie-32gb": (80, "volta"),
    "v100-pcie-16gb": (80, "volta"),
    "t4": (40, "turing"),
    "rtx-a6000": (84, "ampere"),
    "rtx-4090": (128, "ada"),
    "rtx-3090": (82, "ampere"),
}


def _with_chip_facts(spec: HardwareSpec) -> HardwareSpec:
    facts = _CHIP_FACTS.get(spec.key)
    if facts is None:
        return spec
    return dataclasses.replace(spec, num_sms=facts[0], architecture=facts[1])


_TABLE = tuple((pattern, _with_chip_facts(spec)) for pattern, spec in _TABLE)
HARDWARE: tuple[HardwareSpec, ...] = tuple(spec for _, spec in _TABLE)
_PATTERNS: tuple[tuple[re.Pattern[str], HardwareSpec], ...] = tuple(
    (re.compile(pattern), spec) for pattern, spec in _TABLE
)


def _normalise(device_name: str) -> str:
    name = device_name.upper().replace("-", " ").replace("_", " ")
    return re.sub(r"^(NVIDIA |TESLA )+", "", " ".join(name.split()))


def match_device(device_name: str) -> HardwareSpec | None:
    """The datasheet row of a ``torch.cuda.get_device_name()`` string, or None if unknown.

    "NVIDIA H100 80GB HBM3" → h100-sxm, "NVIDIA A100-SXM4-80GB" → a100-sxm-80gb. A name that
    does not pin one row (a bare "NVIDIA A100": 40 or 80 GB?) is unknown, never a guess.
    """
    name = _normalise(device_name)
    for pattern, spec in _PATTERNS:
        if pattern.fullmatch(name):
            return spec
    return None


def target_keys() -> list[str]:
    """Every key :func:`lookup_target` accepts, table order, aliases after their row's key."""
    return [k for spec in HARDWARE for k in (spec.key, *spec.aliases)]


def lookup_target(key: str) -> HardwareSpec:
    """The row for a what-if planning key such as ``h100-80gb``, ``a100-80gb``, ``h200``."""
    wanted = key.strip().lower()
    for spec in HARDWARE:
        if wanted == spec.key or wanted in spec.aliases:
            return spec
    raise ValueError(f"unknown target device {key!r}: choose one of {', '.join(target_keys())}")


# ---------------------------------------------------------------------------------------------
# Inter-node networks, for multi-node what-if. Bandwidth is the signalling rate of one port per
# direction (Gb/s, as vendors quote it); a node usually has one compute NIC per GPU on
# HGX-class machines (DGX H100: 8x ConnectX-7 NDR 400 Gb/s), one or two elsewhere. Latency is
# left to measurement (the communication probe's alpha): port-to-port figures on spec sheets
# are far below what NCCL sees end to end.


@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkPreset:
    key: str
    name: str
    gbit_per_s: float  # per port, per direction
    num_ports: int = 1  # per node
    source: str = ""

    @property
    def bytes_per_s(self) -> float:
        """Per node, per direction."""
        return self.gbit_per_s * self.num_ports * 1e9 / 8

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "bytes_per_s": self.bytes_per_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NetworkPreset:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


_IBTA = "InfiniBand Trade Association roadmap (EDR 100, HDR 200, NDR 400 Gb/s per 4x port)"
# fmt: off
NETWORKS: tuple[NetworkPreset, ...] = (
    NetworkPreset(key="ib-ndr-400-x8", name="8x InfiniBand NDR 400 Gb/s (DGX H100/H200)",
                  gbit_per_s=400, num_ports=8,
                  source="NVIDIA DGX H100 datasheet: 8x ConnectX-7 400 Gb/s compute ports"),
    NetworkPreset(key="ib-ndr-400", name="InfiniBand NDR 400 Gb/s", gbit_per_s=400,
                  source=_IBTA),
    NetworkPreset(key="ib-hdr-200-x8", name="8x InfiniBand HDR 200 Gb/s (DGX A100)",
                  gbit_per_s=200, num_ports=8,
                  source="NVIDIA DGX A100 datasheet: 8x ConnectX-6 200 Gb/s compute ports"),
    NetworkPreset(key="ib-hdr-200", name="InfiniBand HDR 200 Gb/s", gbit_per_s=200,
                  source=_IBTA),
    NetworkPreset(key="ib-edr-100", name="InfiniBand EDR 100 Gb/s", gbit_per_s=100,
                  source=_IBTA),
    NetworkPreset(key="roce-400", name="RoCE v2 over 400 GbE", gbit_per_s=400,
                  source="IEEE 802.3bs (400GbE)"),
    NetworkPreset(key="roce-400-x2", name="2x RoCE v2 over 400 GbE (800 Gb/s a node)",
                  gbit_per_s=400, num_ports=2, source="IEEE 802.3bs (400GbE), two ports"),
    NetworkPreset(key="eth-100", name="100 Gigabit Ethernet", gbit_per_s=100,
                  source="IEEE 802.3ba/802.3bj (100GbE)"),
    NetworkPreset(key="eth-25", name="25 Gigabit Ethernet", gbit_per_s=25,
                  source="IEEE 802.3by (25GbE)"),
    NetworkPreset(key="eth-10", name="10 Gigabit Ethernet", gbit_per_s=10,
                  source="IEEE 802.3ae (10GbE)"),
)
# fmt: on


def lookup_network(key: str) -> NetworkPreset:
    wanted = key.strip().lower()
    for preset in NETWORKS:
        if preset.key == wanted:
            return preset
    known = ", ".join(p.key for p in NETWORKS)
    raise ValueError(f"unknown network {key!r}: choose one of {known}")
