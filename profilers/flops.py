"""FLOPs of one training step: counted by the dispatcher, and the PaLM formula beside it.

:func:`count_step_flops` runs one forward+backward of the workload's real step under
``torch.utils.flop_counter.FlopCounterMode``, once per activation-checkpointing mode (recompute
adds a forward of each checkpointed block; ``ops`` recomputes only what is not a matmul or
attention, which counts nothing: its count is none's), and divides by the tokens of the
micro-batch. It traces under ``FakeTensorMode`` when the workload allows it (no allocation:
any model size, in seconds) and falls back to a real CPU step otherwise, saying why.

FlopCounterMode counts matmuls, convolutions and attention only (2 FLOPs per multiply-add);
element-wise ops, norms and softmax are free, as in the formula. Its registry lacks the CPU
flash-attention kernels that ``F.scaled_dot_product_attention`` dispatches to on CPU, so an
attention model traced on CPU silently loses its attention FLOPs. Every count first calls
:func:`register_cpu_sdpa_formulas`, which registers them, mirroring torch's own SDPA formulas
(the full T×T score matrix, no causal discount, the backward recomputing the scores once),
and :func:`profilers.fake_kernels.register_grouped_mm_formula`, which counts the grouped GEMMs
of mixture-of-experts layers (each routed token times one expert's weights).

A step whose attention ran as plain matmuls (no SDPA kernel in the count: Gemma 2, gpt-oss, a
hand-written attention) also gets its score traffic counted (:class:`ScoreTraffic`, by
:mod:`profilers.eager_attention`: what its element-wise ops over the T×T scores move, in fp32
and bf16), which FLOPs cannot show and a what-if prices at the memory bandwidth. A step with
mixture-of-experts grouped GEMMs also gets their shapes recorded (experts, K, N, routed rows per
token, calls: :mod:`profilers.expert_gemms`), which a what-if prices expert by expert. A step
with state-space (Mamba) layers runs them as their CUDA kernels' fakes, which add the kernels'
FLOPs to the count and record what each kernel reads and writes per token
(:mod:`profilers.ssm_kernels`), which a what-if prices at the memory bandwidth.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from profilers.checkpointing import OPS, block_fraction
from profilers.eager_attention import FIELDS as SCORE_TRAFFIC_FIELDS
from profilers.eager_attention import count_score_traffic
from profilers.expert_gemms import count_expert_gemms
from profilers.fake_kernels import (
    GROUPED_GEMM_OP,
    TraceOverBudget,
    register_grouped_mm_formula,
    run_fake_step,
)
from profilers.memory_blocks import depth_scaling
from profilers.ssm_kernels import WORK_FIELDS, counting_kernel_work
from profilers.workload import (
    CHECKPOINTING,
    BlockScalableWorkload,
    ModelContractError,
    ModelFacts,
    StepSpec,
    Workload,
)

if TYPE_CHECKING:
    import torch

METHODS: tuple[str, ...] = ("fake", "real")

# Attention as SDPA (every kernel's aten name has it) or as batched matmuls (eager attention:
# Gemma 2, gpt-oss, a hand-written attention).
SDPA_OP_MARK = "scaled_dot_product"
ATTENTION_MATMUL_OPS: tuple[str, ...] = ("aten.bmm", "aten.matmul")


def attention_as_matmuls(ops: Mapping[str, float]) -> bool:
    """Whether a step's counted ops (aten op -> FLOPs) ran attention as batched matmuls: some
    bmm and no SDPA kernel."""
    return any(op in ATTENTION_MATMUL_OPS for op in ops) and not any(
        SDPA_OP_MARK in op for op in ops
    )


# The precisions eager attention's score traffic is counted in (profilers.eager_attention): fp16
# autocast runs the same ops as bf16, at the same element sizes.
SCORE_TRAFFIC_PRECISIONS: tuple[str, ...] = ("fp32", "bf16")


@dataclass(frozen=True, kw_only=True, slots=True)
class ScoreTraffic:
    """Per training token: bytes the element-wise ops over an eager attention's T×T scores
    move and FLOPs of the matmuls into and out of them, forward and backward (one micro-batch,
    no recompute; :mod:`profilers.eager_attention`)."""

    forward_bytes: float
    backward_bytes: float
    forward_gemm_flops: float
    backward_gemm_flops: float

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScoreTraffic:
        return cls(**{k: float(data[k]) for k in SCORE_TRAFFIC_FIELDS})


def traffic_precision(precision: str) -> str:
    """The counted precision whose score traffic ``precision`` moves (fp16 runs bf16's ops)."""
    return "fp32" if precision == "fp32" else "bf16"


@dataclass(frozen=True, kw_only=True, slots=True)
class FlopCount:
    """Counted FLOPs per training token of one forward+backward, per checkpointing mode."""

    seq_len: int
    micro_batch_size: int
    tokens: int  # tokens in the counted micro-batch
    flops_per_token: dict[str, float]  # activation_checkpointing -> forward+backward FLOPs/token
    flops_by_op: dict[str, dict[str, float]]  # activation_checkpointing -> aten op -> FLOPs/token
    formula_flops_per_token: float | None  # PaLM App. B, see palm_flops_per_token
    method: str  # "fake" (FakeTensorMode trace) | "real" (a real CPU step)
    fallback_reason: str | None = None  # why the fake trace was not used
    # Counted on copies with these many blocks and extended to the model's depth (a deep
    # model: profilers.memory_blocks); None when the whole model was counted.
    scaled_from_blocks: tuple[int, int] | None = None
    # Attention run as plain matmuls (attention_as_matmuls): the traffic over its T×T scores
    # per counted precision ("fp32", "bf16"; ScoreTraffic's fields, from
    # profilers.eager_attention);
    # None for an SDPA model, or when the count could not be taken.
    score_traffic: dict[str, dict[str, float]] | None = None
    # Mixture-of-experts layers' grouped GEMMs (GROUPED_GEMM_OP in the count): one dict per
    # distinct forward shape, profilers.expert_gemms.FIELDS (experts, k, n, rows_per_token,
    # calls per step); None for a model without them, or when the record could not be taken.
    expert_gemms: list[dict[str, float]] | None = None
    # State-space layers' kernels (profilers.ssm_kernels): per kernel, its calls per step and
    # per training token the FLOPs and elements it reads and writes (WORK_FIELDS); None for a
    # model without them (or a count taken before 2026-12-06, or a real count).
    state_space_kernels: dict[str, dict[str, float]] | None = None

    def attention_as_matmuls(self) -> bool:
        """Whether the step ran attention as plain matmuls (no SDPA kernel in the count)."""
        return attention_as_matmuls(self.flops_by_op.get("none", {}))

    @property
    def model_flops_per_token(self) -> float:
        """Counted FLOPs per token without activation recompute.

        Includes what the kernels really do inside SDPA's backward (flash attention recomputes
        Q·Kᵀ once: +2·L·d·T, as torch counts it), which the PaLM formula leaves out; for an
        MFU comparable with published ones use ``formula_flops_per_token``.
        """
        return self.flops_per_token["none"]

    def per_token(self, checkpointing: str, num_layers: int = 0) -> float | None:
        """Counted FLOPs per token of ``checkpointing``: its own count, else none's for ``ops``
        and for ``blocks:K`` none's plus K/L of full's recompute (each checkpointed block runs
        its forward once more); None when neither is known (``ops-half`` without its own
        count: which matmuls it recomputes depends on the block)."""
        own = self.flops_per_token.get(checkpointing)
        if own is not None:
            return own
        if checkpointing == OPS:  # saves every matmul and attention output: none's FLOPs
            return self.flops_per_token.get("none")
        fraction = block_fraction(checkpointing, num_layers)
        plain, full = self.flops_per_token.get("none"), self.flops_per_token.get("full")
        if fraction is None or plain is None or full is None:
            return None
        return plain + fraction * (full - plain)

    @property
    def relative_difference(self) -> float | None:
        """(counted - formula) / formula, without recompute; None without a formula."""
        if not self.formula_flops_per_token:
            return None
        return (self.model_flops_per_token - self.formula_flops_per_token) / (
            self.formula_flops_per_token
        )

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["relative_difference"] = self.relative_difference
        # Written only when present, as before the fields existed (a profile's digest names
        # its study, which a re-run resumes).
        for optional in (
            "scaled_from_blocks",
            "score_traffic",
            "expert_gemms",
            "state_space_kernels",
        ):
            if data[optional] is None:
                del data[optional]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FlopCount:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        if values.get("scaled_from_blocks") is not None:
            k1, k2 = values["scaled_from_blocks"]
            values["scaled_from_blocks"] = (int(k1), int(k2))
        return cls(**values)


def palm_flops_per_token(
    num_params: int,
    num_layers: int,
    hidden: int,
    seq_len: int,
    *,
    num_embedding_params: int = 0,
) -> float:
    """Training FLOPs per token, 6N + 12·L·H·Q·T (PaLM paper, Appendix B).

    6N: each weight does one multiply-add (2 FLOPs) per token forward and two backward (the
    gradient of the input and of the weight). 12·L·H·Q·T: per layer the attention's two T×T
    matmuls, Q·Kᵀ and P·V, cost 2·2·T·(H·Q) forward per token, times 3 for the backward. H·Q
    (heads × head size) is the hidden size. No causal discount, no recompute.

    N, as in nanoGPT, counts the weights that multiply activations: ``num_params`` minus
    ``num_embedding_params``, the lookup-only tables (position embeddings, and the token
    embedding unless it is tied to the output head, whose matmul it then performs).
    """
    num_matmul_params = num_params - num_embedding_params
    return 6.0 * num_matmul_params + 12.0 * num_layers * hidden * seq_len


def lookup_only_params(facts: ModelFacts) -> int:
    """Embedding parameters that do no matmul (``num_embedding_params`` counts every table;
    a token table tied to the output head does the head's matmul, so it is given back)."""
    tied_head = facts.vocab_size * facts.hidden_size if facts.tied_embeddings else 0
    return max(facts.num_embedding_params - tied_head, 0)


def formula_flops_per_token(
    facts: ModelFacts, seq_len: int, expert_gemms: Sequence[Mapping[str, float]] | None = None
) -> float:
    """The PaLM formula for ``facts``' model; with its mixture-of-experts layers' grouped GEMMs
    (:attr:`FlopCount.expert_gemms`), N counts the experts a token is routed to only, as
    published MoE utilisations do (the activated parameters: Mixtral 8x7B's 12.9B of 46.7B, the
    DeepSeek-V3 report's 37B of 671B): with N every parameter, a model FLOPs utilisation of a
    Mixtral read 3.4x what its GPUs did."""
    return palm_flops_per_token(
        facts.num_params - unrouted_expert_params(expert_gemms),
        facts.num_layers,
        facts.hidden_size,
        seq_len,
        num_embedding_params=lookup_only_params(facts),
    )


def unrouted_expert_params(expert_gemms: Sequence[Mapping[str, float]] | None) -> int:
    """The expert weights a token does not multiply, from the step's grouped GEMMs: per call,
    E experts' K x N weights are read and each token's rows meet ``rows_per_token`` of them
    (its top-k), so E - top-k experts' weights sit out; 0 without grouped GEMMs."""
    return round(
        sum(
            g["calls"] * max(g["experts"] - g["rows_per_token"], 0.0) * g["k"] * g["n"]
            for g in expert_gemms or ()
        )
    )


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float | None) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the device's peak (PaLM App. B).

    Per device: pass one device's tokens/s and peak. None when the peak is unknown (CPU, a GPU
    missing from the table), never a guess.
    """
    if peak_flops is None or peak_flops <= 0 or tokens_per_s < 0 or flops_per_token < 0:
        return None
    return tokens_per_s * flops_per_token / peak_flops


def count_step_flops(
    workload: Workload,
    spec: StepSpec,
    *,
    prefer_fake: bool = True,
    also: Sequence[str] = (),
) -> FlopCount:
    """Count one forward+backward of ``workload``'s step at ``spec``, per training token.

    Only the shapes matter: the count is taken at fp32, one micro-batch, one device (FLOPs per
    token don't depend on precision, accumulation or data parallelism; each rank does the same
    work), for every activation-checkpointing mode. ``micro_batch_size`` does not change the
    per-token count; keep it small if the real fallback may run.
    """
    base = dataclasses.replace(
        spec, precision="fp32", grad_accum_steps=1, parallelism="single", world_size=1
    )
    fallback_reason: str | None = None
    counts: dict[str, dict[str, int]] | None = None
    # Not ops: it recomputes no matmul or attention (their outputs are saved), so its count is
    # none's (FlopCount.per_token; tests/advisor/test_trainer_selective.py counts the kernels),
    # and one more trace would cost a large model's profile seconds for nothing.
    # ``also``: more settings to count, e.g. ops-half (it recomputes some matmuls, so its count
    # is its own: nothing else predicts which of them).
    modes = (*CHECKPOINTING, *(m for m in also if m not in CHECKPOINTING))
    scaled: tuple[int, int] | None = None
    scaling = depth_scaling(workload) if prefer_fake else None
    if scaling is not None:
        # Past any blocks built unlike the rest the blocks are identical, so each op's count is
        # affine in the number of blocks (a fake count of a 70B model's 80 blocks took 37-57 s
        # of a 120 s profile; two shallow copies take seconds). All modes, or none, scaled.
        assert isinstance(workload, BlockScalableWorkload)
        try:
            counts = {
                mode: scaling.extend(
                    *(
                        _count(workload.with_blocks(k), base, mode, fake=True)
                        for k in scaling.depths
                    )
                )
                for mode in modes
            }
            scaled = scaling.depths
        except (TraceOverBudget, ModelContractError):  # no fallback can do better
            raise
        except Exception:  # a model whose forward needs all its blocks: count it whole
            counts = None
    if prefer_fake and counts is None:
        try:
            counts = {mode: _count(workload, base, mode, fake=True) for mode in modes}
        except TraceOverBudget:  # the profile's time is spent: no fallback
            raise
        except ModelContractError:  # a real step would break it the same way
            raise
        except Exception as exc:  # any failure of the trace: the real step still counts
            fallback_reason = f"FakeTensorMode trace failed: {type(exc).__name__}: {exc}"
            if exc.__cause__ is not None:
                fallback_reason += f" ({exc.__cause__})"
    else:
        fallback_reason = "prefer_fake=False"
    method = "fake"
    if counts is None:
        _refuse_a_real_count_too_large(workload, fallback_reason)
        counts = {mode: _count(workload, base, mode, fake=False) for mode in modes}
        method = "real"
    tokens = base.micro_batch_size * base.seq_len
    kernels = _kernel_work(counts.get("none", {}), tokens) if method == "fake" else None
    counts = {
        mode: {k: v for k, v in ops.items() if isinstance(k, str)} for mode, ops in counts.items()
    }
    traffic = None
    if method == "fake" and attention_as_matmuls(counts.get("none", {})):
        traffic = _score_traffic(workload, base)
    experts = None
    if method == "fake" and counts.get("none", {}).get(GROUPED_GEMM_OP, 0) > 0:
        try:
            experts = count_expert_gemms(workload, base) or None
        except TraceOverBudget:  # the profile's time is spent: no fallback
            raise
        except Exception:  # any failure of the trace: the what-if prices them as before
            experts = None
    try:
        formula: float | None = formula_flops_per_token(workload.facts(), base.seq_len, experts)
    except Exception:  # facts are optional for counting; no formula then
        formula = None
    return FlopCount(
        seq_len=base.seq_len,
        micro_batch_size=base.micro_batch_size,
        tokens=tokens,
        flops_per_token={mode: sum(ops.values()) / tokens for mode, ops in counts.items()},
        flops_by_op={
            mode: {op: n / tokens for op, n in sorted(ops.items())} for mode, ops in counts.items()
        },
        formula_flops_per_token=formula,
        method=method,
        fallback_reason=fallback_reason,
        scaled_from_blocks=scaled,
        score_traffic=traffic,
        expert_gemms=experts,
        state_space_kernels=kernels,
    )


# The keys a count holds a kernel's work under, beside its ops: (KERNEL_WORK, kernel, field).
KERNEL_WORK = "kernel_work"


def _kernel_work(counted: Mapping[Any, int], tokens: int) -> dict[str, dict[str, float]] | None:
    """The state-space kernels' record of one mode's count: calls per step, the rest per
    token; None when no such kernel ran."""
    out: dict[str, dict[str, float]] = {}
    for key, n in counted.items():
        if isinstance(key, tuple) and key[0] == KERNEL_WORK:
            _, kernel, field = key
            out.setdefault(kernel, dict.fromkeys(WORK_FIELDS, 0.0))[field] = (
                float(n) if field == "calls" else n / tokens
            )
    return {k: out[k] for k in sorted(out)} or None


def _score_traffic(workload: Workload, base: StepSpec) -> dict[str, dict[str, float]] | None:
    """The eager attention's score traffic per counted precision (a few shallow fake steps);
    None when a count fails (the what-if then prices the attention as flash, and says so)."""
    out = {}
    for precision in SCORE_TRAFFIC_PRECISIONS:
        spec = dataclasses.replace(base, precision=precision)
        try:
            out[precision] = count_score_traffic(workload, spec)
        except TraceOverBudget:  # the profile's time is spent: no fallback
            raise
        except Exception:  # any failure of the trace: priced as before, never the whole count
            return None
    return out


# A real count builds the model on the host and runs its forward and backward: its fp32
# weights and their gradients at least.
REAL_COUNT_BYTES_PER_PARAM = 8


def _refuse_a_real_count_too_large(workload: Workload, why: str | None) -> None:
    """Raise, rather than build on the host a model whose weights and gradients exceed the
    memory available there (a real count of a 50B model would swap or be killed)."""
    from profilers.device import read_host_memory

    try:
        params = workload.facts().num_params
    except Exception:  # facts are optional for counting
        return
    _, available = read_host_memory()
    need = REAL_COUNT_BYTES_PER_PARAM * params
    if available and need > available:
        raise RuntimeError(
            f"no FLOP count: the fake count failed ({why}) and a real step's fp32 weights and "
            f"gradients alone need {need / 2**30:.1f} GiB against {available / 2**30:.1f} GiB "
            "available on this host"
        )


def _count(workload: Workload, base: StepSpec, checkpointing: str, *, fake: bool) -> dict[Any, int]:
    """FLOPs per op name of one step (str keys) and, for a fake count, the state-space kernels'
    work ((:data:`KERNEL_WORK`, kernel, field) keys), all integers along which a count extends
    in depth."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    register_cpu_sdpa_formulas()
    register_grouped_mm_formula()
    spec = dataclasses.replace(base, activation_checkpointing=checkpointing)
    counter = FlopCounterMode(
        display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flop}
    )
    with counting_kernel_work() as work:
        if fake:  # the counter inside the fake mode: it sees each op first, then the fake runs it
            run_fake_step(workload, spec, counter)
        else:
            step = workload.build_step(spec, "cpu")
            batches = step.synthetic_batches(torch.Generator().manual_seed(0))
            with counter:
                step.forward_backward(batches)
    counts: dict[Any, int] = {
        str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items()
    }
    for op, n in work.flops.items():
        counts[op] = counts.get(op, 0) + n
    for kernel, record in work.kernels.items():
        counts.update({(KERNEL_WORK, kernel, field): n for field, n in record.items()})
    return counts


# -- a grouped convolution's backward, which FlopCounterMode over-counts --------------------


def conv_backward_flop(
    grad_out_shape: Any,
    x_shape: Any,
    w_shape: Any,
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: bool,
    _output_padding: Any,
    _groups: Any,
    output_mask: Any,
    out_shape: Any,
    **kw: Any,
) -> int:
    """A convolution's backward: its input's gradient and its weight's, each as many FLOPs as
    the forward (each output element's multiply-adds, once more). Torch's formula (2.13)
    counts the weight's gradient as a convolution of the input by the output gradient without
    its ``groups``: a depthwise convolution (every Mamba layer's, over thousands of channels)
    read ~channels times its FLOPs, 19.4 GFLOP per token of a Bamba's 79. Dense convolutions
    (groups 1) count the same either way."""
    from torch.utils.flop_counter import conv_flop_count

    forward = conv_flop_count(list(x_shape), list(w_shape), list(grad_out_shape), transposed)
    return int(forward) * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


# -- the CPU SDPA kernels missing from FlopCounterMode's registry ----------------------------


def _bhsd(shape: torch.Size | tuple[int, ...]) -> tuple[int, int, int, int]:
    """(batch, heads, seq, head_dim) of an SDPA operand; leading dims fold into batch."""
    *lead, heads, seq, dim = (1, 1, *tuple(shape))[-max(len(shape), 4) :]
    return math.prod(lead), heads, seq, dim


def _cpu_sdpa_flop(
    query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kw: Any
) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return int(sdpa_flop_count(_bhsd(query_shape), _bhsd(key_shape), _bhsd(value_shape)))


def _cpu_sdpa_backward_flop(
    grad_out_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kw: Any
) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    shapes = (_bhsd(s) for s in (grad_out_shape, query_shape, key_shape, value_shape))
    return int(sdpa_backward_flop_count(*shapes))


def register_cpu_sdpa_formulas() -> list[str]:
    """Register FLOP formulas for the CPU flash-attention ops if torch lacks them (idempotent).

    Returns the ops this call registered. Torch 2.13 counts ``_scaled_dot_product_flash_
    attention`` (CUDA) and friends but not ``..._for_cpu`` and its backward.
    """
    import torch
    from torch.utils import flop_counter

    aten = torch.ops.aten
    wanted = {
        "_scaled_dot_product_flash_attention_for_cpu": _cpu_sdpa_flop,
        "_scaled_dot_product_flash_attention_for_cpu_backward": _cpu_sdpa_backward_flop,
    }
    registered = []
    for name, formula in wanted.items():
        op = getattr(aten, name, None)
        # The registry is looked up anew: torch rebinds the module-level dict after import.
        if op is None or op in flop_counter.flop_registry:
            continue
        flop_counter.register_flop_formula(op)(formula)  # type: ignore[arg-type]
        registered.append(f"aten.{name}")
    return registered
