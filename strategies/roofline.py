"""A per-op roofline of one training step on a GPU the user does not have: why efficiency varies.

A step is a list of :class:`Op` built from the model's shape facts (an *analytic* op list of the
standard pre-norm Transformer block: the profile does not keep per-op shapes, and a traced shape
cannot tell its token dimension from its hidden one, e.g. 2048 tokens × hidden 2048). Each op
takes the longest of:

* **GEMM** (every ``nn.Linear`` forward, its input gradient and its weight gradient): FLOPs over
  the datasheet peak × the GPU's *maximum achievable matmul* fraction (:data:`MAMF_FRACTION`,
  measured) × the tile/wave quantisation of its (M, N) output (NVIDIA, "Matrix Multiplication
  Background User's Guide", §"Dimension quantization effects"); or its bytes over the memory
  bandwidth (a skinny GEMM is memory-bound);
* **attention** (flash/SDPA): the causal FLOPs actually computed over the peak × the published
  FlashAttention-2 efficiency for the architecture, lower at short sequences and small heads
  (in fp32, which has neither a flash kernel nor tensor cores, at the GEMM fraction);
  an *eager* attention (plain matmuls and element-wise ops over the T×T scores, as the profile
  counted them: :func:`eager_attention_ops`) as its batched GEMMs and its memory-bound bytes;
* a **mixture of experts'** grouped GEMMs (:func:`expert_forward_ops`, from the profile's record
  of their shapes) as GEMMs batched over the experts, ~rows/E rows each, whose bytes read every
  expert's weights; the routed activation and the routing's gathers as memory-bound ops;
* **memory-bound** ops (norms, activations, residual adds, copies, the loss over the logits,
  autocast's weight casts, the embedding's gradient, FSDP's gather and reduce copies): bytes
  over HBM bandwidth ×
  :data:`MEMORY_BANDWIDTH_EFFICIENCY`;
* a per-kernel **launch** floor (:data:`LAUNCH_S`): no kernel finishes faster.

The optimizer step (fused AdamW + gradient clipping) is memory-bound over the parameters. Two
constants per architecture are fitted, on a declared tuning subset of published runs
(``benchmarks/whatif_published.py``) and never on the rows held out: :data:`ATTENTION_SCALE`
(what the runs' attention reached of FA-2's paper figures) and :data:`SUSTAINED_FRACTION`, which
divides the sum (what real training loses beyond the ops: clocks under sustained load, allocator
and framework gaps, stragglers).

Pure arithmetic (no torch): a search prices thousands of candidates in milliseconds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from profilers.checkpointing import block_fraction, parse_checkpointing
from profilers.flops import ScoreTraffic
from profilers.hardware import HardwareSpec
from profilers.workload import ModelFacts

PARTS: tuple[str, ...] = ("gemm", "attention", "memory_bound", "launch")
# Op kinds priced as GEMMs (FLOPs at the matmul peak x wave quantisation, or their bytes).
GEMM_KINDS: tuple[str, ...] = ("gemm", "attention_gemm", "expert_gemm")

# Maximum achievable matmul FLOP/s over the datasheet's dense bf16 peak: a brute-force search of
# GEMM shapes with torch.matmul, mean of 100 iterations (Stas Bekman, "Machine Learning
# Engineering", compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison
# table", https://github.com/stas00/ml-engineering): A100 SXM 271.2/312, A100 PCIe 252.9/312,
# H100 SXM 794.5/989 ("H200 is the same"), B200 SXM 1745/2250.
MAMF_FRACTION: Mapping[str, float] = {
    "a100-sxm-80gb": 0.869,
    "a100-sxm-40gb": 0.869,
    "a100-pcie-80gb": 0.811,
    "a100-pcie-40gb": 0.811,
    "h100-sxm": 0.803,
    "h200": 0.803,
    "b200": 0.776,
}
# A GPU the table has not measured: the median of the measured fractions above (0.811), said so.
DEFAULT_MAMF_FRACTION = 0.811

# cuBLAS's large output tiles on Ampere/Hopper (NVIDIA, "Matrix Multiplication Background
# User's Guide", §"Tile quantization": 256×128, 128×256 and 128×128 are the most efficient
# tiles; the library picks the tile per shape). Each tile is one thread block; one wave runs one
# block per SM (§"Wave quantization"). The fraction of the computed area that is useful is
# M·N / (tiles_M·t_M · tiles_N·t_N) × tiles / (waves · SMs); the best tile is taken.
GEMM_TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128))

# FlashAttention-2 (Dao, arXiv 2307.08691, §4.1 and abstract): on A100 the forward pass reaches
# up to 73% and the backward pass up to 63% of the peak; on H100, running the same kernels
# (no Hopper-specific instructions), up to 335 TFLOP/s forward+backward, 34% of 989.
# PyTorch's SDPA flash backend is FlashAttention-2. Ada runs the Ampere kernels (taken at the
# Ampere fractions); Blackwell without its own kernels at the Hopper ones; Volta/Turing have no
# flash kernel (memory-efficient SDPA), taken at the Hopper fraction, labelled assumed.
ATTENTION_FRACTION: Mapping[str, tuple[float, float]] = {  # (forward, backward)
    "ampere": (0.73, 0.63),
    "ada": (0.73, 0.63),
    "hopper": (0.34, 0.34),
    "blackwell": (0.34, 0.34),
}
DEFAULT_ATTENTION_FRACTION = (0.34, 0.34)
# Throughput rises with sequence length (more tiles per head to fill the SMs, the causal mask's
# ragged diagonal amortised): FA-2's Fig. 4-6 (causal, head dim 128) rise from under half of
# their 16k value at 512 tokens to ~3/4 at 2k; modelled as T / (T + T_half) with T_half = 640
# tokens, and head dim 64 at ~13% below 128, both read approximately from those figures (not
# re-measured here; ATTENTION_SCALE below absorbs the level, not this shape).
ATTENTION_HALF_SATURATION_TOKENS = 640
ATTENTION_HEAD_DIM_64_FACTOR = 0.87
# fp32 attention has no flash kernel (FlashAttention takes 16-bit inputs only; SDPA runs the
# memory-efficient kernel) and no tensor cores: its matmuls and its softmax run on the same
# fp32 units. FA-2's fractions above are low *because* of tensor cores: "each non-matmul FLOP is
# 16× more expensive than a matmul FLOP" on A100 (FA-2 §3.1: 312 TFLOP/s of FP16/BF16 matmul,
# 19.5 of non-matmul FP32), so the softmax bounds the kernel. In fp32 that ratio is 1 and the
# softmax's few FLOPs per score (max, subtract, exp, sum, scale: ~5) are ~2% of the matmuls' 4·d
# (d = 64); so fp32 attention is priced at the GEMM fraction (MAMF) × the sequence's saturation
# (the tiles filling the SMs and the causal diagonal, as for any tiled kernel), neither FA-2's
# fractions nor their fitted scale. Found on our H200 run (gpt-small fp32: attention priced at
# 8 TFLOP/s, 0.26 s of a 0.59 s step): see benchmarks/README.md, whatif_measured.py.
# FLOPs FlashAttention's backward does per forward FLOP: 5 matmuls (recomputing S = QKᵀ, dV, dP,
# dQ, dK) against the forward's 2 (FA-2 §3.1-3.2): 2.5×.
ATTENTION_BACKWARD_FLOPS_RATIO = 2.5

# A streaming kernel reaches ~80% of the HBM datasheet bandwidth (STREAM-like copy/triad kernels
# on A100 and H100 reach 80-90%, e.g. BabelStream's published results; the constant the previous
# what-if model used for AdamW, kept).
MEMORY_BANDWIDTH_EFFICIENCY = 0.8

# No kernel takes less than a launch: ~4 us per small kernel issued back to back (NVIDIA
# Developer Blog, "Getting Started with CUDA Graphs", 2019: ~3.8 us per kernel including launch
# overhead for a ~2.9 us kernel; eager PyTorch's per-op CPU overhead is of the same order or
# more). One kernel per op below; it matters only for small models and micro-batches.
LAUNCH_S = 4e-6

# The fitted constants, per architecture (see the module docstring), fitted by
# ``benchmarks/whatif_published.py --fit`` on its tuning rows only (``tune=1`` in
# benchmarks/data/published_runs.csv: A100-80GB and H100-80GB rows of llm-foundry's tables):
# SUSTAINED_FRACTION divides the whole step; ATTENTION_SCALE multiplies FA-2's published
# efficiency (what the published runs' attention reached of the paper's kernel figures).
# An architecture without tuning rows takes the mean of the fitted ones, labelled untuned.
# Fitted on 5 A100-80GB and 5 H100-80GB rows (grid search, least squared log error; results in
# benchmarks/results/whatif_published.md). Read as: published A100 runs sustained 93% of the
# op roofline and H100 runs 78% (clocks under sustained load, framework gaps), and their
# attention ran at 54% / 68% of FA-2's paper figures (2023 kernels, causal masking).
SUSTAINED_FRACTION: Mapping[str, float] = {"ampere": 0.93, "hopper": 0.78}
ATTENTION_SCALE: Mapping[str, float] = {"ampere": 0.54, "hopper": 0.68}

# Fused AdamW (fp32 master weights and states): read param, grad, exp_avg, exp_avg_sq (16 B),
# write param, exp_avg, exp_avg_sq (12 B); gradient clipping reads the gradients once for the
# norm and reads/writes them to scale (12 B).
OPTIMIZER_BYTES_PER_PARAM = 28 + 12
OPTIMIZER_KERNELS = 4  # norm, clip coefficient, scale, fused AdamW (multi-tensor launches)

# FSDP all-gathers per micro-batch with reshard-after-forward (the trainer's FSDP2 wrapping;
# Zhao et al., "PyTorch FSDP", VLDB 2023, §3.2): forward and backward.
FSDP_GATHERS = 2

# Bytes per element of activations and weights in the compute dtype.
ELEMENT_BYTES: Mapping[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}
# The loss over the logits, per token per vocabulary entry: the head writes bf16 logits (2 B);
# autocast runs cross-entropy in fp32: upcast (read 2, write 4), log-softmax (read 4, write 4),
# its backward (read 4 + 4, write 4) and the cast of the gradient back (read 4, write 2): 34 B.
# In fp32: write 4, log-softmax 8, backward 12: 24 B.
LOSS_BYTES_PER_VOCAB: Mapping[str, int] = {"bf16": 34, "fp16": 34, "fp32": 24}


# A mixture-of-experts layer's token routing around its expert GEMMs, per routed row of hidden
# size h (transformers' grouped_mm_experts_forward, integrations/moe.py): gather the rows in
# expert order (read + write), multiply by the routing weights (read + write), gather them
# back (read + write), and the sum over the top-k (read): 7 elements per routed row, plus the
# sum's output, one per token. The router's sort, histogram and top-k are over S indices, not
# S x h elements: left out.
ROUTING_ELEMENTS_PER_ROW = 7


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpertGemm:
    """One forward grouped GEMM of a mixture-of-experts layer (:mod:`profilers.expert_gemms`):
    ``rows_per_token`` routed rows per training token (the router's top-k) times the stacked
    weights of ``experts`` experts, K -> N, ``calls`` times per step (once per MoE layer)."""

    experts: int
    k: int
    n: int
    rows_per_token: float
    calls: int

    @classmethod
    def from_dict(cls, data: Mapping[str, float]) -> ExpertGemm:
        return cls(
            experts=int(data["experts"]),
            k=int(data["k"]),
            n=int(data["n"]),
            rows_per_token=float(data["rows_per_token"]),
            calls=int(data["calls"]),
        )

    @property
    def weight_params(self) -> int:
        """All experts' weights of this projection, over the step's calls."""
        return self.experts * self.k * self.n * self.calls


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockShape:
    """What the op list needs of a model, derived from :class:`ModelFacts`.

    ``experts``: a mixture of experts' grouped GEMMs as the profile recorded them
    (:meth:`with_experts`); empty for a dense model. With them the op list has no dense FFN:
    the experts are priced at their own shapes, and ``matmul_params`` holds the dense weights
    only (attention and the head; a shared expert's or a dense layer's matmuls are scaled in
    with them by the counted FLOPs)."""

    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden: int
    ffn_matrices: int  # 2 (GELU MLP) or 3 (gated: SwiGLU)
    vocab: int
    causal: bool
    matmul_params: int  # weights that multiply activations (blocks + head)
    num_params: int
    experts: tuple[ExpertGemm, ...] = ()
    head_width: int = 0  # a head's width where it is not hidden / heads (Qwen3, Gemma 3); 0: not

    @property
    def head_dim(self) -> int:
        return self.head_width or self.hidden // self.num_heads

    @property
    def attention_width(self) -> int:
        """The queries' (and the attention output's) width: heads × head dim."""
        return self.num_heads * self.head_dim

    @property
    def expert_forward_flops_per_token(self) -> float:
        """Forward FLOPs per training token of the expert GEMMs (2 per multiply-add)."""
        return sum(2.0 * g.rows_per_token * g.k * g.n * g.calls for g in self.experts)

    @property
    def cast_params(self) -> int:
        """Weights autocast casts to the compute dtype at each forward: the dense matmuls'
        and every expert's (a grouped GEMM casts its whole stack of experts)."""
        return self.matmul_params + sum(g.weight_params for g in self.experts)

    def with_experts(self, records: Sequence[Mapping[str, float]]) -> BlockShape:
        """This shape with the profile's expert GEMMs in place of its dense FFN (unchanged
        when there are none, or when the dense weights would not stay positive)."""
        experts = tuple(ExpertGemm.from_dict(r) for r in records)
        dense = self.matmul_params - self.num_layers * self.ffn_matrices * self.hidden * (
            self.ffn_hidden
        )
        if not experts or dense <= 0:
            return self
        return dataclasses.replace(self, experts=experts, matmul_params=dense)

    @classmethod
    def from_facts(cls, facts: ModelFacts) -> BlockShape | None:
        """None when the facts cannot describe a standard Transformer block (no layers, no
        heads, or parameters that do not add up)."""
        h, heads, layers = facts.hidden_size, facts.num_heads, facts.num_layers
        if h <= 0 or heads <= 0 or layers <= 0 or (h % heads and not facts.head_dim):
            return None
        kv = facts.num_kv_heads or heads
        d = facts.attention_head_dim
        head = 0 if facts.tied_embeddings else facts.vocab_size * h
        block = (facts.num_params - facts.num_embedding_params - head) / layers
        attention = h * (heads * d + 2 * kv * d) + heads * d * h
        mlp = block - attention - 4 * h  # norms' weights (and biases) are a few h
        if mlp <= 0:
            return None
        if facts.ffn_hidden_size:
            ffn = facts.ffn_hidden_size
            matrices = 3 if mlp / (h * ffn) > 2.5 else 2
        else:
            matrices, ffn = 2, int(mlp / (2 * h))
        matmul = layers * (attention + matrices * h * ffn) + facts.vocab_size * h
        return cls(
            num_layers=layers,
            hidden=h,
            num_heads=heads,
            num_kv_heads=kv,
            ffn_hidden=ffn,
            ffn_matrices=matrices,
            vocab=facts.vocab_size,
            causal=facts.objective != "mlm",
            matmul_params=matmul,
            num_params=facts.num_params,
            head_width=facts.head_dim,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class Op:
    """One kernel of the step, repeated ``count`` times (once per layer, say)."""

    name: str
    # "gemm" | "attention" | "memory_bound"; "attention_gemm": a batched matmul of eager
    # attention (priced as a GEMM, counted FLOPs: never rescaled; in the attention part);
    # "expert_gemm": a mixture of experts' grouped GEMM (priced as a GEMM batched over the
    # experts at its recorded shape: never rescaled; in the gemm part); "scan": a state-space
    # layer's kernel at its recorded FLOPs and bytes (state_space_ops; in the memory-bound part)
    kind: str
    flops: float = 0.0
    bytes: float = 0.0
    mnk: tuple[int, int, int] | None = None  # GEMM output M×N, reduction K
    batch: int = 1  # independent GEMMs of that shape in one kernel (batched matmul)
    backward: bool = False  # attention: which FlashAttention efficiency applies
    count: int = 1


def _linear(name: str, tokens: int, n_in: int, n_out: int, e: int, count: int) -> list[Op]:
    """A linear layer's three GEMMs: y = xW (M=tokens, N=out, K=in), dx = dy·Wᵀ (M=tokens,
    N=in, K=out), dW = xᵀ·dy (M=in, N=out, K=tokens); 2·M·N·K FLOPs each."""
    flops = 2.0 * tokens * n_in * n_out
    shapes: tuple[tuple[str, tuple[int, int, int]], ...] = (
        ("", (tokens, n_out, n_in)),
        (".dgrad", (tokens, n_in, n_out)),
        (".wgrad", (n_in, n_out, tokens)),
    )
    return [
        Op(
            name=name + suffix,
            kind="gemm",
            flops=flops,
            bytes=float(e * (m * k + k * n + m * n)),
            mnk=(m, n, k),
            count=count,
        )
        for suffix, (m, n, k) in shapes
    ]


def _memory(name: str, elements: float, e: int, count: int) -> Op:
    return Op(name=name, kind="memory_bound", bytes=elements * e, count=count)


def state_space_ops(
    kernels: Mapping[str, Mapping[str, float]], tokens: int, precision: str
) -> tuple[list[Op], list[Op]]:
    """A state-space model's scan kernels (the profile's record, ``profile.json``'s
    ``flops.state_space_kernels``: calls per step, FLOPs and elements per token), forward and
    backward, each call at its share of the work: its bytes are its elements in the
    activations' dtype at ``precision`` plus its fp32 elements at 4 B."""
    e = ELEMENT_BYTES[precision]
    forward: list[Op] = []
    backward: list[Op] = []
    for kernel, work in sorted(kernels.items()):
        calls = max(1, round(work.get("calls", 0)))
        for side, ops in (("forward", forward), ("backward", backward)):
            elements = work.get(f"{side}_elements", 0.0) * e
            fp32 = work.get(f"{side}_fp32_elements", 0.0) * 4
            ops.append(
                Op(
                    name=kernel + (".backward" if side == "backward" else ""),
                    kind="scan",
                    flops=work.get(f"{side}_flops", 0.0) * tokens / calls,
                    bytes=(elements + fp32) * tokens / calls,
                    backward=side == "backward",
                    count=calls,
                )
            )
    return forward, backward


# Op kinds a per-op policy (ops, ops-half) recomputes: it saves the matmuls' and attention's
# outputs only; a state-space kernel (not an aten op) runs again with the rest of the block.
RECOMPUTED_BY_OPS: tuple[str, ...] = ("memory_bound", "scan")

# Eager attention's ops that step_ops does not derive a backward for (eager_attention_ops
# lists their backward, measured).
EAGER_FORWARD_OPS = ("attention.scores", "attention.weighted_sum", "attention.score_ops")


def eager_attention_ops(
    shape: BlockShape,
    traffic: ScoreTraffic,
    tokens: int,
    seq_len: int,
    precision: str,
    *,
    backward: bool,
) -> list[Op]:
    """Attention run as plain matmuls (no fused kernel), per layer, from the profile's count of
    its score traffic (:mod:`profilers.eager_attention`, per token at this sequence): forward
    Q·Kᵀ (M=N=T, K=d) and P·V (M=T, N=d, K=T), batched over B·H, and the element-wise ops over
    the T×T scores at their counted bytes; backward the four gradients' matmuls (dP = dO·Vᵀ at
    T×T, dV, dQ, dK at T×d) and the element-wise ops' backward at their counted bytes. No
    causal discount: the whole score matrix is computed. The scores' writes and reads by the
    matmuls are in the GEMMs' bytes (a head of 64-256 is memory-bound there), not counted twice.
    """
    e = ELEMENT_BYTES[precision]
    L, T = shape.num_layers, seq_len
    batch = max(tokens // seq_len, 1) * shape.num_heads
    gemm = (traffic.backward_gemm_flops if backward else traffic.forward_gemm_flops) * tokens / L
    bytes_ = (traffic.backward_bytes if backward else traffic.forward_bytes) * tokens / L
    per_matmul = gemm / (4 if backward else 2)
    # head dim from the counted FLOPs (2·B·H·T²·d per matmul): Gemma 2's is not hidden / heads
    d = max(1, round(traffic.forward_gemm_flops * tokens / L / 2 / (2.0 * batch * T * T)))

    def matmul(name: str, m: int, n: int, k: int) -> Op:
        return Op(
            name=name,
            kind="attention_gemm",
            flops=per_matmul,
            bytes=float(e * batch * (m * k + k * n + m * n)),
            mnk=(m, n, k),
            batch=batch,
            backward=backward,
            count=L,
        )

    if not backward:
        return [
            matmul("attention.scores", T, T, d),
            matmul("attention.weighted_sum", T, d, T),
            Op(name="attention.score_ops", kind="memory_bound", bytes=bytes_, count=L),
        ]
    return [
        matmul("attention.scores.grad", T, T, d),  # dP = dO·Vᵀ
        matmul("attention.values.grad", T, d, T),  # dV = Pᵀ·dO
        matmul("attention.query.grad", T, d, T),  # dQ = dS·K
        matmul("attention.key.grad", T, d, T),  # dK = dSᵀ·Q
        Op(name="attention.score_ops.backward", kind="memory_bound", bytes=bytes_, count=L),
    ]


def _grouped(name: str, experts: int, rows: int, k: int, n: int, e: int, count: int) -> Op:
    """``rows`` routed rows times ``experts`` stacked K x N matrices, as one batched GEMM of
    ``experts`` (M = rows / experts, N, K) problems (balanced routing); its bytes read every
    expert's matrix: an expert GEMM with few rows per expert is bound by its weights."""
    return Op(
        name=name,
        kind="expert_gemm",
        flops=2.0 * rows * k * n,
        bytes=float(e * (rows * k + experts * k * n + rows * n)),
        mnk=(max(1, math.ceil(rows / experts)), n, k),
        batch=experts,
        count=count,
    )


def expert_forward_ops(shape: BlockShape, tokens: int, precision: str) -> list[Op]:
    """A mixture of experts' forward, per recorded grouped GEMM (:class:`ExpertGemm`): the GEMM
    at its own shape, the element-wise ops between the projections (the activation reads an
    input projection's output, N wide, and writes an output projection's input, K wide: an
    output projection is one whose N is the hidden size) and, once per MoE layer with the
    first output projection, the routing (:data:`ROUTING_ELEMENTS_PER_ROW`)."""
    e, h = ELEMENT_BYTES[precision], shape.hidden
    ops: list[Op] = []
    routed = False
    for i, g in enumerate(shape.experts):
        rows = max(1, round(g.rows_per_token * tokens))
        ops.append(_grouped(f"experts.{i}", g.experts, rows, g.k, g.n, e, g.calls))
        output = g.n == h
        ops.append(_memory(f"experts.{i}.activation", rows * (g.k if output else g.n), e, g.calls))
        if output and not routed:
            routing = ROUTING_ELEMENTS_PER_ROW * rows * h + tokens * h
            ops.append(_memory(f"experts.{i}.routing", routing, e, g.calls))
            routed = True
    return ops


def expert_backward_ops(op: Op, e: int) -> list[Op]:
    """A forward expert GEMM's two gradients: the routed rows' (dX = dY · Wᵀ per expert:
    M = rows / experts, N = K, K = N) and the experts' weights' (dW = Xᵀ · dY per expert:
    K x N outputs, each reduced over its rows), at ``e`` bytes per element."""
    _, n, k = op.mnk  # type: ignore[misc]
    rows = max(1, round(op.flops / (2.0 * k * n)))
    dgrad = _grouped(op.name + ".dgrad", op.batch, rows, n, k, e, op.count)
    wgrad = dataclasses.replace(
        dgrad,
        name=op.name + ".wgrad",
        mnk=(k, n, max(1, math.ceil(rows / op.batch))),
    )
    return [dgrad, wgrad]


def block_forward_ops(
    shape: BlockShape,
    tokens: int,
    seq_len: int,
    precision: str,
    eager: ScoreTraffic | None = None,
) -> list[Op]:
    """One layer's forward, ``count``ed over the layers: the GEMMs without their backward.
    ``eager``: the attention ran as plain matmuls, with this score traffic
    (:func:`eager_attention_ops`), instead of a flash kernel."""
    e = ELEMENT_BYTES[precision]
    L, h, f = shape.num_layers, shape.hidden, shape.ffn_hidden
    q = shape.attention_width
    kv = shape.num_kv_heads * shape.head_dim
    batch = tokens // seq_len
    attn_flops = 4.0 * batch * seq_len * seq_len * shape.attention_width
    attn_flops *= 0.5 if shape.causal else 1.0  # flash skips the masked half
    gated = shape.ffn_matrices == 3
    if eager is not None:
        attention = eager_attention_ops(shape, eager, tokens, seq_len, precision, backward=False)
    else:
        attention = [
            Op(
                name="attention",
                kind="attention",
                flops=attn_flops,
                bytes=4.0 * tokens * q * e,
                count=L,
            )
        ]
    if shape.experts:
        ffn = expert_forward_ops(shape, tokens, precision)
    else:
        ffn = [
            *[o for o in _linear("up", tokens, h, (2 if gated else 1) * f, e, L) if o.name == "up"],
            _memory("activation", (3 if gated else 2) * tokens * f, e, L),
            *[o for o in _linear("down", tokens, f, h, e, L) if o.name == "down"],
        ]
    ops = [
        _memory("norm1", 2 * tokens * h, e, L),
        *[o for o in _linear("qkv", tokens, h, q + 2 * kv, e, L) if o.name == "qkv"],
        *attention,
        _memory("attention.out_copy", 2 * tokens * q, e, L),
        *[o for o in _linear("proj", tokens, q, h, e, L) if o.name == "proj"],
        _memory("residual1", 3 * tokens * h, e, L),
        _memory("norm2", 2 * tokens * h, e, L),
        *ffn,
        _memory("residual2", 3 * tokens * h, e, L),
    ]
    if gated:  # rotary embeddings on q and k: a few element-wise kernels in eager mode
        ops.append(_memory("rope", 3 * 2 * tokens * (q + kv), e, L))
    return ops


def _recomputed_fraction(checkpointing: str, num_layers: int) -> float:
    """Fraction of the blocks whose forward runs again: 1 for full and the per-op policies,
    K/L for blocks:K."""
    parsed = parse_checkpointing(checkpointing)
    if parsed.kind in ("full", "ops", "ops-half"):
        return 1.0
    return block_fraction(checkpointing, num_layers) or 0.0


def recomputed_ops(
    forward: Sequence[Op],
    checkpointing: str,
    num_layers: int,
    matmul_fraction: float | None = None,
) -> list[Op]:
    """The block-forward kernels a checkpointing setting runs again inside backward: all of
    them for full, those of K blocks for blocks:K (each op's per-layer count scaled by K/L),
    for ops every kernel but the GEMMs and attention, whose outputs it saves, and for ops-half
    those plus ``matmul_fraction`` of the block's forward GEMM FLOPs (the matmuls its policy
    does not save: :func:`recomputed_matmul_fraction`), each GEMM at its own shape."""
    parsed = parse_checkpointing(checkpointing)
    if parsed.kind == "none":
        return []
    if parsed.kind == "ops":
        return [op for op in forward if op.kind in RECOMPUTED_BY_OPS]
    if parsed.kind == "ops-half":
        if matmul_fraction is None:
            raise ValueError("ops-half: the fraction of the matmuls it recomputes is needed")
        gemms = [
            dataclasses.replace(
                op, flops=op.flops * matmul_fraction, bytes=op.bytes * matmul_fraction
            )
            for op in forward
            if op.kind == "gemm" and matmul_fraction > 0
        ]
        # its save list has no grouped GEMM (torchtitan's neither): the experts run again
        experts = [op for op in forward if op.kind == "expert_gemm"]
        return [*(op for op in forward if op.kind in RECOMPUTED_BY_OPS), *gemms, *experts]
    fraction = _recomputed_fraction(checkpointing, num_layers)
    if fraction >= 1.0:
        return list(forward)
    # count is per layer (a multiple of L): scale it to the K checkpointed layers.
    return [
        dataclasses.replace(op, count=max(1, round(op.count * fraction)))
        for op in forward
        if round(op.count * fraction) > 0
    ]


def recomputed_matmul_fraction(
    shape: BlockShape, counted_per_token: float, plain_per_token: float
) -> float:
    """The part of the blocks' forward GEMM FLOPs a per-op policy runs again, from the FLOPs
    counted per token with it and without recompute (their difference is the recomputed
    matmuls: the policy saves attention, and no other op is counted), over the analytic
    forward GEMM FLOPs of the blocks (2 per weight that multiplies activations, the head's
    left out). Clamped to [0, 1]. A mixture of experts' grouped GEMMs are all recomputed
    (:func:`recomputed_ops`): their forward FLOPs come off the difference first."""
    blocks = 2.0 * (shape.matmul_params - shape.vocab * shape.hidden)
    if blocks <= 0:
        return 0.0
    dense = counted_per_token - plain_per_token - shape.expert_forward_flops_per_token
    return min(1.0, max(0.0, dense / blocks))


def step_ops(
    shape: BlockShape,
    *,
    tokens: int,
    seq_len: int,
    precision: str,
    checkpointing: str,
    casts_weights: bool,
    sharded: bool = False,
    loss_chunks: int = 1,
    gathers: int = FSDP_GATHERS,
    matmul_fraction: float | None = None,
    eager: ScoreTraffic | None = None,
    state_space: Mapping[str, Mapping[str, float]] | None = None,
) -> list[Op]:
    """Every kernel of one micro-batch's forward and backward (``tokens`` = micro-batch × seq).

    Backward: each GEMM's dgrad and wgrad; attention's backward; each memory-bound op's backward
    moves 1.5× its forward bytes (it reads the saved input and the incoming gradient, writes
    one gradient), plus the add of the two residual branches' gradients. Full checkpointing runs
    every block's forward again inside backward. A loss in ``loss_chunks`` > 1 chunks runs the
    head's forward GEMM again in backward, one chunk of the tokens at a time (its share of the
    loss's memory traffic is left out: one read of the logits, small beside the GEMM).
    ``gathers``: FSDP all-gathers of each block per micro-batch (1 with the blocks kept
    gathered from forward to backward, ``fsdp_reshard_after_forward`` False). ``eager``: the
    attention ran as plain matmuls with this score traffic (:func:`eager_attention_ops`; its
    backward is the counted one, and ``ops``/``ops-half`` save its matmuls' outputs as the
    trainer's policies do: they recompute only its element-wise ops). ``state_space``: the
    profile's record of a state-space model's scan kernels (:func:`state_space_ops`: forward
    and backward at their recorded work, recomputed with their block).
    """
    e = ELEMENT_BYTES[precision]
    L, h = shape.num_layers, shape.hidden
    forward = block_forward_ops(shape, tokens, seq_len, precision, eager)
    backward: list[Op] = []
    if state_space:
        scans, scans_backward = state_space_ops(state_space, tokens, precision)
        forward += scans
        backward += scans_backward
    if eager is not None:
        backward += eager_attention_ops(shape, eager, tokens, seq_len, precision, backward=True)
    for op in forward:
        if op.name in EAGER_FORWARD_OPS or op.kind == "scan":  # their backward: counted ones
            continue
        if op.kind == "gemm":
            base = op.name
            n_in, n_out = op.mnk[2], op.mnk[1]  # type: ignore[index]
            backward += [
                o for o in _linear(base, tokens, n_in, n_out, e, op.count) if o.name != base
            ]
        elif op.kind == "expert_gemm":
            backward += expert_backward_ops(op, e)
        elif op.kind == "attention":
            backward.append(
                Op(
                    name="attention.backward",
                    kind="attention",
                    flops=op.flops * ATTENTION_BACKWARD_FLOPS_RATIO,
                    bytes=op.bytes * 2,
                    backward=True,
                    count=op.count,
                )
            )
        else:
            backward.append(
                Op(name=op.name + ".backward", kind=op.kind, bytes=1.5 * op.bytes, count=op.count)
            )
    backward.append(_memory("residual.grad_add", 3 * tokens * h, e, 2 * L))
    recompute = recomputed_ops(forward, checkpointing, L, matmul_fraction)
    head = _linear("head", tokens, h, shape.vocab, e, 1)
    root = [
        _memory("embedding", 3 * tokens * h, e, 1),
        _memory("final_norm", 2 * tokens * h, e, 1),
        _memory("final_norm.backward", 3 * tokens * h, e, 1),
        Op(
            name="loss",
            kind="memory_bound",
            bytes=float(LOSS_BYTES_PER_VOCAB[precision] * tokens * shape.vocab),
        ),
        # embedding_dense_backward: read the gradient, scatter-add into an fp32 table it zeroes
        _memory("embedding.backward", tokens * h * (e + 4) / e, e, 1),
        Op(name="embedding.grad_zero", kind="memory_bound", bytes=4.0 * shape.vocab * h),
        *head,
    ]
    if loss_chunks > 1:
        chunk = -(-tokens // loss_chunks)
        root.append(_linear("head.recompute", chunk, h, shape.vocab, e, loss_chunks)[0])
    if casts_weights and e < 4:
        # autocast casts every fp32 weight to the compute dtype at each forward use (read 4 B,
        # write e), and backward casts the weight gradient back (read e, write 4, accumulate 4 + 4)
        # A checkpointed block casts its weights again when it recomputes (ops too: the casts
        # are not among the outputs it saves).
        passes = 1 + _recomputed_fraction(checkpointing, L)
        root.append(
            Op(
                name="autocast.weight_casts",
                kind="memory_bound",
                bytes=float(shape.cast_params * ((4 + e) * passes + e + 12)),
            )
        )
    if sharded:
        # FSDP (resharded after forward) gathers every block twice per micro-batch, forward and
        # backward; each gather is copied out of NCCL's flat buffer into the parameters (read +
        # write, compute dtype), and each reduce-scatter copies the fp32 gradients into its
        # buffer (read + write 4 B). HBM traffic proportional to the parameters, not the tokens:
        # it is what makes small micro-batches of large models slower per token.
        root.append(
            Op(
                name="fsdp.gather_and_reduce_copies",
                kind="memory_bound",
                bytes=shape.num_params * (gathers * 2 * e + 2 * 4) / shape.num_layers,
                count=shape.num_layers,  # one unit (block) at a time
            )
        )
    return forward + recompute + backward + root


# -- efficiencies ------------------------------------------------------------------------------


def wave_efficiency(m: int, n: int, num_sms: int, batch: int = 1) -> float:
    """Useful fraction of the tiles × waves a GEMM's (M, N) output occupies (best tile);
    ``batch`` GEMMs of that shape in one batched kernel share the waves."""
    best = 0.0
    for tm, tn in GEMM_TILES:
        tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
        tiles = tiles_m * tiles_n * batch
        waves = math.ceil(tiles / num_sms)
        useful = (m * n) / (tiles_m * tm * tiles_n * tn) * tiles / (waves * num_sms)
        best = max(best, useful)
    return best


def attention_efficiency(
    target: HardwareSpec, seq_len: int, head_dim: int, backward: bool, precision: str = "bf16"
) -> float:
    """Fraction of the dtype's peak fused attention reaches (see the constants' sources):
    FlashAttention-2's in 16 bits, the GEMM fraction in fp32 (no tensor cores, no flash)."""
    saturation = seq_len / (seq_len + ATTENTION_HALF_SATURATION_TOKENS)
    if precision == "fp32":
        return mamf_fraction(target)[0] * saturation
    forward_fraction, backward_fraction = ATTENTION_FRACTION.get(
        target.architecture, DEFAULT_ATTENTION_FRACTION
    )
    fraction = backward_fraction if backward else forward_fraction
    scales = list(ATTENTION_SCALE.values())
    fraction *= ATTENTION_SCALE.get(target.architecture, sum(scales) / len(scales))
    if head_dim >= 128:
        head = 1.0
    elif head_dim >= 64:
        head = (
            ATTENTION_HEAD_DIM_64_FACTOR + (1 - ATTENTION_HEAD_DIM_64_FACTOR) * (head_dim - 64) / 64
        )
    else:
        head = ATTENTION_HEAD_DIM_64_FACTOR * head_dim / 64
    return fraction * saturation * head


def mamf_fraction(target: HardwareSpec) -> tuple[float, bool]:
    """(maximum achievable GEMM fraction of peak, whether it was measured for this GPU)."""
    if target.key in MAMF_FRACTION:
        return MAMF_FRACTION[target.key], True
    return DEFAULT_MAMF_FRACTION, False


def sustained_fraction(target: HardwareSpec) -> tuple[float, bool]:
    """(the fitted sustained fraction for the target's architecture, whether it was tuned)."""
    if target.architecture in SUSTAINED_FRACTION:
        return SUSTAINED_FRACTION[target.architecture], True
    values = list(SUSTAINED_FRACTION.values())
    return sum(values) / len(values), False


@dataclass(frozen=True, kw_only=True, slots=True)
class OpTimes:
    """Seconds per part (:data:`PARTS`) of a list of ops, before the sustained fraction."""

    gemm_s: float
    attention_s: float
    memory_bound_s: float
    launch_s: float
    gemm_flops: float
    kernels: int

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.attention_s + self.memory_bound_s + self.launch_s

    def parts(self) -> dict[str, float]:
        return {
            "gemm": self.gemm_s,
            "attention": self.attention_s,
            "memory_bound": self.memory_bound_s,
            "launch": self.launch_s,
        }


def time_ops(
    ops: Sequence[Op],
    target: HardwareSpec,
    precision: str,
    *,
    seq_len: int,
    head_dim: int,
    gemm_scale: float = 1.0,
    attention_scale: float = 1.0,
) -> OpTimes:
    """Roofline seconds of ``ops`` on ``target``: each op the longest of its compute, its
    memory traffic and a launch; what the launch floor adds is the ``launch`` part.
    ``gemm_scale`` multiplies GEMM FLOPs and ``attention_scale`` a fused attention's FLOPs and
    bytes (to match a counted total, see :class:`RooflineTime`).
    """
    peak = target.peak_flops(precision)
    if peak is None or target.memory_bandwidth_gbs is None:
        raise ValueError(f"{target.name} has no {precision} peak or memory bandwidth")
    bandwidth = target.memory_bandwidth_gbs * 1e9 * MEMORY_BANDWIDTH_EFFICIENCY
    gemm_fraction, _ = mamf_fraction(target)
    sms = target.num_sms or 1
    gemm = attention = memory = launch = flops = 0.0
    kernels = 0
    for op in ops:
        memory_s = op.bytes / bandwidth
        if op.kind in GEMM_KINDS:
            m, n, _ = op.mnk  # type: ignore[misc]
            work = op.flops * (gemm_scale if op.kind == "gemm" else 1.0)
            compute_s = work / (peak * gemm_fraction * wave_efficiency(m, n, sms, op.batch))
            seconds = max(compute_s, memory_s)
            flops += work * op.count
        elif op.kind == "attention":
            if attention_scale == 0.0:  # no attention layer: no kernel either
                continue
            fraction = attention_efficiency(target, seq_len, head_dim, op.backward, precision)
            seconds = attention_scale * max(op.flops / (peak * fraction), memory_s)
        elif op.kind == "scan":  # memory-bound: its FLOPs at the GEMM rate only bound it
            seconds = max(op.flops / (peak * gemm_fraction), memory_s)
        else:
            seconds = memory_s
        extra = max(LAUNCH_S - seconds, 0.0)
        if op.kind in ("gemm", "expert_gemm"):
            gemm += seconds * op.count
        elif op.kind in ("attention", "attention_gemm"):
            attention += seconds * op.count
        else:
            memory += seconds * op.count
        launch += extra * op.count
        kernels += op.count
    return OpTimes(
        gemm_s=gemm,
        attention_s=attention,
        memory_bound_s=memory,
        launch_s=launch,
        gemm_flops=flops,
        kernels=kernels,
    )


def optimizer_seconds(num_params: int, target: HardwareSpec) -> float:
    """Fused AdamW + clipping over ``num_params`` parameters: bytes over the bandwidth, plus the
    launches of its multi-tensor kernels."""
    bandwidth = (target.memory_bandwidth_gbs or 0.0) * 1e9 * MEMORY_BANDWIDTH_EFFICIENCY
    if bandwidth <= 0:
        raise ValueError(f"{target.name} has no memory bandwidth")
    return OPTIMIZER_BYTES_PER_PARAM * num_params / bandwidth + OPTIMIZER_KERNELS * LAUNCH_S
