"""What-if planning: predict configs on hardware the user does not have, clearly as ESTIMATES.

``advisor recommend --target h100-80gb --world-size 16 --nodes 2`` plans from a profile taken
anywhere (this CPU, say) for a device from :mod:`profilers.hardware`'s datasheet table:

* memory: the profile's fake-traced fits, which are device independent (DESIGN.md, "Measuring
  well"), with the CUDA caching allocator's 512-byte rounding (the profile's CUDA-target fits
  when it has them, else an upper bound, below) + a known fixed overhead per process (CUDA
  context and library workspaces) + a fragmentation margin;
* time: a per-op roofline of the step (:mod:`strategies.roofline`: GEMMs at a shape-dependent
  fraction of the peak, flash attention at its published efficiency, memory-bound ops over the
  HBM bandwidth, a launch floor per kernel, one fitted sustained fraction per architecture),
  its GEMM FLOPs matched to the profile's counted ones; the optimizer step (fused AdamW and
  clipping) as memory traffic. A model whose facts describe no standard Transformer block falls
  back to counted FLOPs at one documented efficiency (:data:`MFU`), and says so;
* communication: the ring bus-bandwidth model over the table's link bandwidths.

Every prediction carries ``estimate=True`` and a label; no measurement is ever mixed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from profilers.checkpointing import OPS_HALF, block_fraction
from profilers.comm_records import bus_bandwidth_factor
from profilers.flops import (
    ATTENTION_MATMUL_OPS,
    GROUPED_GEMM_OP,
    SDPA_OP_MARK,
    FlopCount,
    ScoreTraffic,
    formula_flops_per_token,
    traffic_precision,
)
from profilers.hardware import HardwareSpec, NetworkPreset, lookup_network, lookup_target
from profilers.profile_record import Profile, interrupted_probes
from profilers.workload import ModelFacts
from strategies import roofline
from strategies.cost import (
    ComputeTime,
    CostModel,
    Machine,
    failed_memory_traces,
    single_device_traces,
    unfitted_rank_traces,
)
from strategies.errors import StrategyError, Unpredictable
from strategies.space import COMPILE_UNAVAILABLE, Candidate, SearchRequest

GiB = 2**30

# Achievable model-FLOPs utilisation of a training step against the datasheet's dense peak of
# its dtype. bf16/fp16: 0.4-0.5 is what well-tuned GEMM-heavy Transformer training reaches
# (PaLM reports 46% MFU, Chowdhery et al. 2022, Table 3; Megatron-LM 2021 reports ~52% of peak
# on A100 for its largest models); we take the low-middle 0.45. fp32 without TF32 (PyTorch's
# default "highest" matmul precision) runs on CUDA cores, where element-wise ops and
# attention's softmax weigh relatively more: 0.35. Small models sit below these (kernel launch
# overhead); a CPU profile cannot tell how far.
MFU: Mapping[str, float] = {"bf16": 0.45, "fp16": 0.45, "fp32": 0.35}

# Fused AdamW traffic per parameter (fp32 master weights): read parameter, gradient, exp_avg,
# exp_avg_sq (4 × 4 B), write parameter, exp_avg, exp_avg_sq (3 × 4 B) = 28 B; a streaming
# kernel reaches ~80% of the HBM datasheet bandwidth (STREAM-like copy on H100/A100).
ADAMW_BYTES_PER_PARAM = 28
MEMORY_BANDWIDTH_EFFICIENCY = 0.8

# NCCL ring collectives reach ~80% of the link's per-direction peak as bus bandwidth at large
# messages (nccl-tests all_reduce on DGX H100: ~360 of 450 GB/s NVLink). Latency per
# collective: ~10 us within a node, ~20 us across nodes (NCCL small-message all_reduce).
LINK_EFFICIENCY = 0.8
ALPHA_INTRA_NODE_S = 10e-6
ALPHA_INTER_NODE_S = 20e-6
# The largest world size among the published runs the what-if is checked against
# (benchmarks/whatif_published.py: FSDP over 8-128 A100/H100s).
VALIDATED_MAX_GPUS = 128

# Per process outside the allocator: CUDA context (~0.3-0.6 GiB on Hopper with CUDA 12 lazy
# module loading), cuBLAS workspaces and NCCL buffers; the upper end of 0.5-1 GiB is taken.
CUDA_FIXED_OVERHEAD_BYTES = 1 * GiB
# Caching-allocator fragmentation (reserved / allocated - 1), when the profile did not measure
# it on a CUDA device. Source: GMLake (Guo et al., "GMLake: Efficient and Transparent GPU
# Memory Defragmentation for Large-scale DNN Training with Virtual Memory Stitching", ASPLOS
# 2024, abstract and §6): over eight LLM trainings on A100-80GB with recomputation, ZeRO/FSDP
# and LoRA, defragmenting saved 9.2 GB on average (up to 25 GB), i.e. PyTorch's caching
# allocator reserved ~9.2 GB of ~80 GB beyond what was allocated: 9.2 / (80 - 9.2) = 13% of
# the allocated peak. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True removes most of it.
DEFAULT_FRAGMENTATION = 0.13
# 512-B rounding without CUDA-target traces: at most 511 B per live storage. A block has at
# most ~16 parameter tensors (BERT; GPT 12, Llama 9), each with a gradient and two Adam states,
# and saves at most ~32 activations per micro-batch: 512 × (4·16 + 32) per layer, + 8 root
# tensors × 4. Negligible (0.6 MiB for 12 layers) but kept, and labelled an upper bound.
CUDA_BLOCK_BYTES = 512
STORAGES_PER_LAYER = 4 * 16 + 32
ROOT_STORAGES = 4 * 8

DEFAULT_NETWORK = "ib-ndr-400"


NO_OPS_HALF_COUNT = (
    "ops-half checkpointing: the profile has no FLOP count of its recompute: re-run 'advisor "
    "profile --checkpointing ops-half' (with the other settings wanted)"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class FlopsTime:
    """Compute time from counted FLOPs over the datasheet peak at :data:`MFU`."""

    target: HardwareSpec
    facts: ModelFacts
    seq_len: int
    flops: FlopCount | None = None

    def flops_per_token(self, checkpointing: str) -> float:
        counted = self.flops.per_token(checkpointing, self.facts.num_layers) if self.flops else None
        if counted is not None:
            return counted
        if checkpointing == OPS_HALF:  # which matmuls it recomputes depends on the block
            raise Unpredictable(NO_OPS_HALF_COUNT)
        # PaLM App. B formula; full checkpointing recomputes the forward: + 2N of 6N -> ×4/3;
        # blocks:K that of K/L of the blocks; ops recomputes no matmul: no FLOPs.
        plain = formula_flops_per_token(self.facts, self.seq_len)
        fraction = block_fraction(checkpointing, self.facts.num_layers) or 0.0
        return plain * (1 + fraction / 3)

    def compute(self, candidate: Candidate) -> ComputeTime:
        if candidate.compile:
            raise Unpredictable(COMPILE_UNAVAILABLE)
        peak = self.target.peak_flops(candidate.precision)
        if peak is None:
            raise Unpredictable(
                f"{self.target.name} has no {candidate.precision} peak on its datasheet: plan "
                "another precision"
            )
        if self.target.memory_bandwidth_gbs is None:
            raise Unpredictable(f"{self.target.name} has no memory bandwidth on its datasheet")
        efficiency = MFU[candidate.precision]
        tokens = candidate.micro_batch_size * self.seq_len
        per_token = self.flops_per_token(candidate.activation_checkpointing)
        if candidate.loss_chunks > 1:  # the head's forward again in backward: 2·h·V per token
            per_token += 2.0 * self.facts.hidden_size * self.facts.vocab_size
        fb = per_token * tokens / (peak * efficiency)
        kernels = self.launch_floor_kernels(candidate)
        fb = max(fb, kernels * roofline.LAUNCH_S)  # no step beats its kernels' launches
        bandwidth = self.target.memory_bandwidth_gbs * 1e9 * MEMORY_BANDWIDTH_EFFICIENCY
        optimizer = ADAMW_BYTES_PER_PARAM * self.facts.num_params / bandwidth
        counted = "counted" if self.flops else "PaLM-formula"
        return ComputeTime(
            forward_backward_s=fb,
            optimizer_s=optimizer,
            source=(
                "estimate (fallback: the model's facts describe no standard Transformer block, "
                f"so no per-op roofline): {counted} FLOPs at {efficiency:.0%} of "
                f"{self.target.name}'s "
                f"{candidate.precision} datasheet peak, and no less than the launch floor of "
                f"a standard block's {kernels} kernels at this depth "
                f"({roofline.LAUNCH_S * 1e6:.0f} us each); AdamW as {ADAMW_BYTES_PER_PARAM} "
                f"B/param at {MEMORY_BANDWIDTH_EFFICIENCY:.0%} of its memory bandwidth. "
                "Give the module an n_head (or num_heads) attribute for the per-op roofline"
            ),
        )

    def launch_floor_kernels(self, candidate: Candidate) -> int:
        """Kernels of one forward+backward of a standard Transformer block stack as deep as
        this model (one head, the model's width): a floor on what a step launches, which the
        FLOPs alone do not give (a small model's fallback read 2 us a step, 241M tokens/s on
        one H100, where the roofline of a same-size Llama reads 0.38 ms)."""
        h, layers = max(self.facts.hidden_size, 1), max(self.facts.num_layers, 1)
        stand_in = roofline.BlockShape(
            num_layers=layers,
            hidden=h,
            num_heads=1,
            num_kv_heads=1,
            ffn_hidden=4 * h,
            ffn_matrices=2,
            vocab=max(self.facts.vocab_size, 1),
            causal=self.facts.objective != "mlm",
            matmul_params=self.facts.num_params,
            num_params=self.facts.num_params,
        )
        ops = roofline.step_ops(
            stand_in,
            tokens=candidate.micro_batch_size * self.seq_len,
            seq_len=self.seq_len,
            precision=candidate.precision,
            checkpointing="none",
            casts_weights=False,
        )
        return sum(op.count for op in ops)


# Counted GEMM FLOPs that differ from the analytic op list's by more than this scale the op
# list's GEMM time to the count (a model that is not the standard block); within it, the op list
# stands (the count includes a few tiny matmuls, e.g. of biases' gradients).
GEMM_COUNT_TOLERANCE = 0.02
# aten._grouped_mm: a mixture-of-experts layer's experts (profilers.fake_kernels counts them);
# without it a Mixtral's count held only its attention, router and head, and the op list's one
# dense FFN was scaled down (x0.46) instead of up to the routed experts.
COUNTED_GEMM_OPS: tuple[str, ...] = (
    "aten.mm",
    "aten.addmm",
    "aten.bmm",
    "aten.matmul",
    GROUPED_GEMM_OP,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class RooflineTime:
    """Compute time from the per-op roofline of :mod:`strategies.roofline`."""

    target: HardwareSpec
    shape: roofline.BlockShape
    seq_len: int
    flops: FlopCount | None = None
    # The model has state-space (Mamba) layers (ModelFacts.state_space_kernels): batched
    # matmuls in its count may be its scan's, not an eager attention's.
    state_space: bool = False

    def attention_as_matmuls(self) -> bool:
        """Whether the counted step ran attention as plain matmuls (no SDPA kernel in the
        count: an architecture transformers builds with eager attention, Gemma 2 or gpt-oss).
        A state-space model's batched matmuls are its chunked scan's unless the count found
        score traffic (an eager attention's T×T scores) too."""
        if self.flops is None or not self.flops.attention_as_matmuls():
            return False
        traffic = self.flops.score_traffic or {}
        return not self.state_space or any(v for t in traffic.values() for v in t.values())

    def _sdpa_ops(self) -> dict[str, float]:
        """The counted attention-kernel ops (forward and backward), per token."""
        counted = self.flops.flops_by_op.get("none", {}) if self.flops else {}
        return {op: v for op, v in counted.items() if SDPA_OP_MARK in op}

    def no_attention(self) -> bool:
        """A state-space model whose count holds no attention at all (a pure Mamba stack)."""
        if not self.state_space or self.flops is None or self.attention_as_matmuls():
            return False
        return not self._sdpa_ops()

    def eager_traffic(self, precision: str) -> ScoreTraffic | None:
        """The counted score traffic of an eager attention at ``precision``, per token at this
        sequence (scaled from the counted one: scores per token grow with T); None for an SDPA
        model or a profile without the count (priced as flash attention then, said so)."""
        if not self.attention_as_matmuls() or self.flops is None:
            return None
        counted = (self.flops.score_traffic or {}).get(traffic_precision(precision))
        if counted is None:
            return None
        ratio = self.seq_len / self.flops.seq_len if self.flops.seq_len else 1.0
        return ScoreTraffic.from_dict({k: v * ratio for k, v in counted.items()})

    def gemm_scale(self) -> float:
        """Counted over analytic GEMM FLOPs per token (no recompute), 1 within tolerance.

        When attention ran as matmuls, its batched matmuls (the scores and the weighted sum)
        are left out of the count: the op list prices them as its attention op, and counting
        them as GEMMs too priced them twice (an eager Gemma 2's GEMMs scaled up by its
        attention's FLOPs). So are a mixture of experts' grouped GEMMs when the shape holds
        their record (the op list prices them itself)."""
        if not self.flops or "none" not in self.flops.flops_by_op:
            return 1.0
        gemms = COUNTED_GEMM_OPS
        if self.attention_as_matmuls():
            gemms = tuple(op for op in gemms if op not in ATTENTION_MATMUL_OPS)
        if self.shape.experts:  # priced at their own shapes (roofline.expert_forward_ops)
            gemms = tuple(op for op in gemms if op != GROUPED_GEMM_OP)
        counted = sum(v for op, v in self.flops.flops_by_op["none"].items() if op in gemms)
        return _counted_scale(counted, 6.0 * self.shape.matmul_params)

    def attention_scale(self) -> float:
        """Counted over analytic fused-attention FLOPs per token (forward, no recompute), 1
        within tolerance: the op list prices attention in every layer, at the model's head
        width (``hidden / heads`` unless its facts record one); a hybrid attends in some layers
        only (Jamba in 1 of 8: the others run a Mamba scan), and a profile written before the
        facts recorded head widths reads Gemma 3's 256 as ``hidden / heads``. Torch
        counts each layer's 4·T·(heads × head dim) per token, the whole T×T. 1 when nothing was
        counted or attention ran as plain matmuls (priced from its own count); 0 for a
        state-space model that attends nowhere (no attention kernel in its count)."""
        if self.no_attention():
            return 0.0
        if not self.flops or not self.flops.seq_len or self.attention_as_matmuls():
            return 1.0
        counted = sum(v for op, v in self._sdpa_ops().items() if "backward" not in op)
        shape = self.shape
        analytic = 4.0 * self.flops.seq_len * shape.attention_width * shape.num_layers
        return _counted_scale(counted, analytic)

    def matmul_fraction(self, checkpointing: str) -> float | None:
        """For ops-half, the part of the blocks' forward matmuls it recomputes, from the
        profile's FLOP count of its policy; None for any other setting."""
        if checkpointing != OPS_HALF:
            return None
        counted = self.flops.flops_per_token if self.flops else {}
        if OPS_HALF not in counted or "none" not in counted:
            raise Unpredictable(NO_OPS_HALF_COUNT)
        return roofline.recomputed_matmul_fraction(self.shape, counted[OPS_HALF], counted["none"])

    def compute(self, candidate: Candidate) -> ComputeTime:
        if candidate.compile:
            raise Unpredictable(COMPILE_UNAVAILABLE)
        t = self.target
        if t.peak_flops(candidate.precision) is None:
            raise Unpredictable(
                f"{t.name} has no {candidate.precision} peak on its datasheet: plan "
                "another precision"
            )
        if t.memory_bandwidth_gbs is None:
            raise Unpredictable(f"{t.name} has no memory bandwidth on its datasheet")
        ops = roofline.step_ops(
            self.shape,
            matmul_fraction=self.matmul_fraction(candidate.activation_checkpointing),
            tokens=candidate.micro_batch_size * self.seq_len,
            seq_len=self.seq_len,
            precision=candidate.precision,
            checkpointing=candidate.activation_checkpointing,
            # FSDP2 holds the compute-dtype copy of the parameters it gathers: no autocast casts
            casts_weights=candidate.parallelism != "fsdp",
            sharded=candidate.parallelism == "fsdp",
            loss_chunks=candidate.loss_chunks,
            gathers=roofline.FSDP_GATHERS if candidate.fsdp_reshard_after_forward else 1,
            eager=(eager := self.eager_traffic(candidate.precision)),
            state_space=(scans := self.flops.state_space_kernels if self.flops else None),
        )
        scale, attention_scale = self.gemm_scale(), self.attention_scale()
        times = roofline.time_ops(
            ops,
            t,
            candidate.precision,
            seq_len=self.seq_len,
            head_dim=self.shape.head_dim,
            gemm_scale=scale,
            attention_scale=attention_scale,
        )
        sustained, tuned = roofline.sustained_fraction(t)
        gemm_fraction, measured = roofline.mamf_fraction(t)
        parts = tuple((name, seconds / sustained) for name, seconds in times.parts().items())
        optimizer = roofline.optimizer_seconds(self.shape.num_params, t) / sustained
        notes = [
            f"GEMMs at {gemm_fraction:.1%} of the {candidate.precision} peak"
            + (" (measured MAMF)" if measured else " (median MAMF: not measured for this GPU)")
            + " × wave quantisation",
            (
                "eager attention (no SDPA kernel): its batched matmuls as GEMMs, its "
                "element-wise ops over the T×T scores at their counted "
                f"{(eager.forward_bytes + eager.backward_bytes) / 1e6:.3g} MB per token "
                f"({traffic_precision(candidate.precision)}) as memory-bound ops"
                if eager is not None
                else (
                    "fp32 attention (no flash kernel, no tensor cores) at the GEMM fraction"
                    if candidate.precision == "fp32"
                    else f"flash attention at FA-2's {t.architecture or 'default'} efficiency"
                )
            ),
            *(
                [
                    "mixture-of-experts GEMMs at their recorded shapes ("
                    + ", ".join(
                        f"{g.experts} experts × {g.k}→{g.n}, {g.rows_per_token:g} rows/token"
                        for g in self.shape.experts
                    )
                    + "; balanced routing: each expert ~rows/experts rows, every expert's "
                    "weights read per call) and their routing's gathers as memory-bound ops"
                ]
                if self.shape.experts
                else []
            ),
            f"memory-bound ops at {roofline.MEMORY_BANDWIDTH_EFFICIENCY:.0%} of HBM bandwidth",
            f"{times.kernels} kernels with a {roofline.LAUNCH_S * 1e6:.0f} us launch floor",
            f"all over a sustained fraction of {sustained:.2f}"
            + (f" fitted for {t.architecture}" if tuned else " (mean of the fitted; untuned)"),
        ]
        if scale != 1.0:
            notes.append(f"GEMM FLOPs scaled ×{scale:.3f} to the profile's counted ones")
        if scans:
            scan_note = "its scan kernels at their recorded bytes, as memory-bound ops"
        else:
            scan_note = "its scan kernels are not priced (a profile without their record)"
        if attention_scale == 0.0:
            notes.append(
                "no attention: the profile's count holds no attention kernel (a state-space "
                f"stack; {scan_note}, its GEMMs as GEMMs)"
            )
        elif attention_scale != 1.0:
            why = (
                f"a hybrid's attention layers only; {scan_note}"
                if self.state_space
                else "heads not as wide as the facts say"
            )
            notes.append(
                f"attention scaled ×{attention_scale:.3f} to the profile's counted attention "
                f"FLOPs ({why})"
            )
        elif self.state_space:
            notes.append(f"state-space layers: {scan_note}")
        if eager is None and self.attention_as_matmuls():
            notes.append(
                "attention ran as matmuls (no SDPA kernel: eager attention) and is priced as "
                "flash attention: optimistic (the profile has no count of its score traffic)"
            )
        return ComputeTime(
            forward_backward_s=times.total_s / sustained,
            optimizer_s=optimizer,
            source="estimate: per-op roofline on " + t.name + ": " + "; ".join(notes),
            parts=parts,
        )


def _counted_scale(counted: float, analytic: float) -> float:
    """``counted / analytic`` when they differ by more than :data:`GEMM_COUNT_TOLERANCE`, else
    1 (also when either is missing)."""
    if counted <= 0 or analytic <= 0:
        return 1.0
    ratio = counted / analytic
    return ratio if abs(ratio - 1.0) > GEMM_COUNT_TOLERANCE else 1.0


def time_source(
    target: HardwareSpec, facts: ModelFacts, seq_len: int, flops: FlopCount | None
) -> RooflineTime | FlopsTime:
    """The roofline when the facts describe a Transformer block, else counted FLOPs at MFU."""
    shape = roofline.BlockShape.from_facts(facts)
    if shape is None:
        return FlopsTime(target=target, facts=facts, seq_len=seq_len, flops=flops)
    if flops is not None and flops.expert_gemms:
        shape = shape.with_experts(flops.expert_gemms)
    return RooflineTime(
        target=target,
        shape=shape,
        seq_len=seq_len,
        flops=flops,
        state_space=bool(facts.state_space_kernels),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkComm:
    """Ring collectives over datasheet links: t = alpha + bytes × factor(n) / busbw.

    busbw is the slowest link a ring crosses, at :data:`LINK_EFFICIENCY`: within a node NVLink
    through NVSwitch (any pair) or a bridge (pairs only), else PCIe; across nodes the node's
    network bandwidth, all its ports together.

    Why the whole node's: a ring over N GPUs on several nodes enters and leaves each node once,
    and NCCL splits a collective over several rings (channels), one per NIC on an HGX-class
    node. Each ring carries 1/R of the data and each NIC carries one ring's node crossing, so a
    node's ports together move what one GPU sends (bytes x factor(N)), in the time NVLink takes
    to move it between neighbours: the inter-node bus bandwidth is the node's network
    bandwidth, not 1/gpus_per_node of it (one port: every ring crosses it, the same total).
    Until 2026-12-02 each GPU was charged 1/gpus_per_node of the node's network, 8x too slow on
    an 8-GPU node: the 14 held-out torchtitan and fms-fsdp runs at micro-batch 1-2 on 64-128
    GPUs (benchmarks/whatif_published.py) were predicted to spend more on exposed
    communication than their published steps took in all (fms-fsdp 13B: 16.6 s of a 20.5 s
    predicted step, against 4.6 s published).
    """

    target: HardwareSpec
    gpus_per_node: int
    network: NetworkPreset | None = None

    def _link(self, world_size: int) -> tuple[float, float, str]:
        t = self.target
        if t.nvlink_gbs and (
            t.nvlink_kind == "switch" or (t.nvlink_kind == "bridge" and world_size <= 2)
        ):
            intra, name = t.nvlink_gbs * 1e9, f"NVLink ({t.nvlink_kind})"
        else:
            intra, name = t.pcie_gbs * 1e9, f"PCIe gen{t.pcie_gen} x16"
        if world_size <= self.gpus_per_node or self.network is None:
            return intra, ALPHA_INTRA_NODE_S, name
        network = self.network.bytes_per_s  # the node's ports together (one ring per port)
        if network < intra:
            return network, ALPHA_INTER_NODE_S, f"{self.network.name} between nodes"
        return intra, ALPHA_INTER_NODE_S, name

    def collective_s(self, collective: str, world_size: int, num_bytes: float) -> float:
        bandwidth, alpha, _ = self._link(world_size)
        factor = bus_bandwidth_factor(collective, world_size)
        return alpha + num_bytes * factor / (bandwidth * LINK_EFFICIENCY)

    def describe(self, collective: str, world_size: int) -> str:
        bandwidth, alpha, name = self._link(world_size)
        return (
            f"estimate: ring {collective} over {name}, {bandwidth / 1e9:.0f} GB/s at "
            f"{LINK_EFFICIENCY:.0%}, {alpha * 1e6:.0f} us latency"
        )


def rounding_allowance(facts: ModelFacts) -> int:
    """Upper bound of CUDA's 512-B rounding over CPU-traced storages (see the constants)."""
    return CUDA_BLOCK_BYTES * (STORAGES_PER_LAYER * facts.num_layers + ROOT_STORAGES)


def resolve_target(request: SearchRequest) -> tuple[HardwareSpec, NetworkPreset | None]:
    if request.target is None:
        raise StrategyError("what-if planning needs --target (e.g. --target h100-80gb)")
    try:
        target = lookup_target(request.target)
        # A named network is checked even on one node (where no collective crosses it): a
        # misspelt key is an error, never silently unused.
        named = lookup_network(request.network) if request.network else None
        network = (named or lookup_network(DEFAULT_NETWORK)) if request.nodes > 1 else None
    except ValueError as exc:
        raise StrategyError(str(exc)) from None
    return target, network


# The network a DGX/HGX server of these parts ships with, named in the plan when --network was
# not given (the default, one NDR port a node, is 8x slower between nodes than their 8 ports).
SERVER_NETWORKS = {
    "b200": "ib-ndr-400-x8",
    "h200": "ib-ndr-400-x8",
    "h100-sxm": "ib-ndr-400-x8",
    "a100-sxm-80gb": "ib-hdr-200-x8",
    "a100-sxm-40gb": "ib-hdr-200-x8",
}


def default_network_caveat(target: HardwareSpec, request: SearchRequest) -> str:
    """What a multi-node what-if assumes of the network when ``--network`` was not given: one
    NDR 400 Gb/s port a node, and (for a part that ships in DGX/HGX servers) the ``--network``
    of those servers' eight ports; "" on one node or with ``--network``."""
    if request.nodes <= 1 or request.network:
        return ""
    default = lookup_network(DEFAULT_NETWORK)
    text = f"no --network: one {default.name} port a node assumed between nodes"
    server = SERVER_NETWORKS.get(target.key)
    if server:
        text += (
            f"; a DGX/HGX node of {target.name} has {lookup_network(server).name}: pass "
            f"--network {server}"
        )
    return text


# GPUs one node of the table's parts holds in the servers they ship in: an HGX/DGX board's 8
# (A100, H100, H200, B200 SXM), and a common PCIe server's 8.
USUAL_GPUS_PER_NODE = 8


def one_node_caveat(target: HardwareSpec, world_size: int, nodes: int) -> str:
    """What a what-if assumes when more GPUs than a node usually holds are asked for without
    ``--nodes``: all of them in one node, every collective on its NVLink/PCIe (the 70B and
    Mixtral examples asked for 64 H100s so, and their collectives were priced at NVLink's
    450 GB/s), or more per node than that with ``--nodes`` (64 over 2 nodes priced 32 GPUs a
    node on one NVLink switch without a word until 2026-12-07); "" otherwise."""
    per_node = world_size // max(nodes, 1)
    if nodes > 1:
        if per_node <= USUAL_GPUS_PER_NODE:
            return ""
        spread = math.ceil(world_size / USUAL_GPUS_PER_NODE)
        return (
            f"{per_node} GPUs assumed in each of the {nodes} nodes, every collective within a "
            f"node on its links; a node of {target.name} usually holds {USUAL_GPUS_PER_NODE}: "
            f"pass --nodes {spread} for {spread} nodes"
        )
    if world_size <= USUAL_GPUS_PER_NODE:
        return ""
    spread = math.ceil(world_size / USUAL_GPUS_PER_NODE)
    return (
        f"all {world_size} GPUs assumed in one node (--nodes 1), every collective on its "
        f"links; a node of {target.name} usually holds {USUAL_GPUS_PER_NODE}: pass --nodes "
        f"{spread} (and --network) for {spread} nodes"
    )


def whatif_label(
    target: HardwareSpec, world_size: int, nodes: int, network: NetworkPreset | None
) -> str:
    where = f"{world_size}× {target.name}" + (f" on {nodes} nodes" if nodes > 1 else "")
    link = f" linked by {network.name}" if network else ""
    return (
        f"ESTIMATE for {where}{link}: memory from the profile's fake traces + CUDA overheads, "
        "time from a per-op roofline over datasheet peaks at cited efficiencies; nothing here "
        "was measured on that hardware"
    )


def whatif_cost_model(profile: Profile, request: SearchRequest) -> tuple[CostModel, str]:
    """(the estimated cost model for ``request.target``, its label)."""
    target, network = resolve_target(request)
    world = request.world_size or 1
    nodes = request.nodes
    gpus_per_node = math.ceil(world / nodes)
    cuda_models = tuple(m for m in profile.fits.memory if m.target_device_type == "cuda")
    models = cuda_models or tuple(profile.fits.memory)
    measured_on_cuda = profile.device.kind == "cuda"
    overhead = profile.memory_overhead
    assumptions = [
        "what-if: every number is an estimate for hardware that was not measured",
        f"datasheet: {target.source}",
    ]
    if cuda_models:
        allowance = 0
        assumptions.append(
            "memory fits traced for a CUDA target (512-B rounding and CUDA autocast's fp32 "
            "norms and softmax included)"
        )
    else:
        allowance = rounding_allowance(profile.model)
        assumptions.append(
            f"CUDA 512-B rounding: an upper bound of {allowance} B over the CPU-traced fits; "
            "they follow CPU autocast, which keeps layer_norm, group_norm and a softmax "
            "without dtype in 16 bits where CUDA's runs them in fp32 (a hand-written "
            "attention's probabilities: 4 B per score element, not 2): 'advisor profile "
            "--trace-for cuda' traces for a GPU"
        )
    kernels = profile.model.state_space_kernels
    if kernels:
        assumptions.append(
            f"state-space layers traced as their CUDA kernels ({', '.join(kernels)}): install "
            "mamba-ssm and causal-conv1d where you train (without them transformers runs its "
            "PyTorch scan, which holds several times more)"
            if cuda_models
            else "state-space layers traced on transformers' PyTorch scan (a CPU trace), which "
            f"holds several times what its CUDA kernels ({', '.join(kernels)}) do: 'advisor "
            "profile --trace-for cuda' traces them as the kernels"
        )
    fixed = overhead.fixed_bytes if measured_on_cuda else CUDA_FIXED_OVERHEAD_BYTES
    fragmentation = overhead.fragmentation_fraction if measured_on_cuda else DEFAULT_FRAGMENTATION
    assumptions.append(
        f"fixed overhead {fixed / GiB:.2f} GiB per process and {fragmentation:.0%} fragmentation"
        + (" (measured on the profiled GPU)" if measured_on_cuda else " (assumed, documented)")
    )
    assumptions.append(
        "data loading priced at 0 s a step: the target's hosts were not measured (loading in "
        "worker processes overlaps a GPU's step; 'advisor profile' on such a host times it)"
    )
    label = whatif_label(target, world, nodes, network)
    network_default = default_network_caveat(target, request)
    if network_default:
        assumptions.append(network_default)
    crowded = one_node_caveat(target, world, nodes)
    if crowded:
        assumptions.append(crowded)
        label = f"{label}; {crowded}"
    if world > VALIDATED_MAX_GPUS:
        assumptions.append(
            f"{world} GPUs: beyond the published runs this what-if was checked against (8-"
            f"{VALIDATED_MAX_GPUS} GPUs); each collective is charged one latency, not a ring's "
            f"{world - 1} steps of it, so small collectives at this scale are priced optimistic"
        )
    model = CostModel(
        machine=Machine(
            kind="cuda",
            name=target.name,
            memory_bytes=target.memory_bytes,
            fixed_overhead_bytes=fixed,
            fragmentation_fraction=fragmentation,
            shared_host=False,
            estimate=True,
        ),
        facts=profile.model,
        workload=profile.workload,
        memory_models=models,
        time=time_source(target, profile.model, profile.seq_len, profile.flops),
        comm=LinkComm(target=target, gpus_per_node=gpus_per_node, network=network),
        memory_budget=request.memory_budget,
        flops=profile.flops,
        rounding_allowance_bytes=allowance,
        assumptions=tuple(assumptions),
        failed_traces=failed_memory_traces(profile),
        profiled_precisions=profile.precisions,
        interrupted_probes=interrupted_probes(profile.probes),
        rank_traces=unfitted_rank_traces(profile),
        single_traces=single_device_traces(profile),
    )
    return model, label
