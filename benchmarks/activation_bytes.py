"""Activation bytes per layer per token, traced, against the textbook count (issue 13, item 2).

For each model family (GPT, Llama, BERT, Bamba and Qwen3.5's two layer kinds, at a realistic
width) the single-device step is fake-traced (``profilers.memory.trace_step_memory``, no
allocation) with 2 and 3 layers at micro-batch 2 and 4. The bytes one more layer adds per
extra token,

    ((peak(3 layers, b=4) - peak(3 layers, b=2)) - (peak(2, 4) - peak(2, 2))) / (2 * seq_len),

are the activations a layer keeps for its backward, per token: parameters, optimizer state and
the output head cancel out, and so does anything that does not grow with both the batch and
the depth.

The textbook count (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", 2022, §4.1: ``sbh(34 + 5as/h)`` bytes per layer with 16-bit activations) drops its
dropout masks (2 bytes per h: our presets train without dropout) and its ``5as/h`` attention
matrix (flash/memory-efficient attention keeps only the output and a log-sum-exp), leaving,
per token, with h the width, f the MLP width and g = KV heads / heads:

* GPT / BERT (LayerNorm, GELU MLP): 2 norm inputs 4h + attention (input, q, k, v, output) 10h +
  MLP (input, GELU input, GELU output) 2h + 4f = 32h at f = 4h;
* Llama (RMSNorm, SwiGLU, GQA): norms 4h + attention (input 2h, q 2h, k and v 4gh, output 2h) +
  MLP (input 2h; w1 out, SiLU out, w3 out, product: 8f).

* Bamba (a Mamba-2 layer and a SwiGLU MLP, transformers' ``hf:bamba``; d the mixer's inner
  width, n its state, g its groups, H its heads), from what ``mamba_ssm``'s fused
  ``mamba_split_conv1d_scan_combined`` saves for backward (its ``save_for_backward``: the
  input ``zxbcdt``, the scan's output before the norm, the norm's fp32 rstd) and the layer's
  PyTorch ops: two RMSNorms over the fp32 residual stream (input and normalised copy: 8 h
  each), the in-projection's input 2 h, zxbcdt 2(2d + 2gn + H), the scan's output 2d, rstd
  4g, the MLP's two casts of its input 4 h and 8f. In fp32: no casts, 4 B everywhere. Traced
  with the fake kernels (profilers/ssm_kernels.py) and, for comparison, on transformers'
  PyTorch scan (the row ``bamba-torch``: the same formula, what the kernels hold).

* Qwen3.5 (transformers' ``hf:qwen3_5_text``; K, V the gated delta rule's key and value
  widths, a and kv attention's query and key/value widths; e = 2 bytes, 4 in fp32). Both
  layer kinds: two RMSNorms over the fp32 residual stream (input and fp32 normalised copy:
  16 h), the MLP's input (bf16: one cast per projection, 2 x 2 h; fp32: 4 h) and 4ef. A
  gated-delta layer: its four input projections' input (bf16: q/k/v, z, b and a each cast it:
  4 x 2 h; fp32: 4 h), the causal convolution's input e(2K + V) (causal-conv1d's
  ``save_for_backward``), what fla's ``chunk_gated_delta_rule`` saves (q and k normalised
  2eK, v eV, the WY matrix A 64e per value head; its fp32 inverse norms, cumulative gate and
  beta are per head: under 0.2 h together, left out), the gated RMSNorm (transformers'
  ``Qwen3_5RMSNormGated``, unfused: an fp32 copy of the kernel's output, its bf16 normalised
  copy, the fp32 product with the weight, the fp32 gate and its SiLU: 18 V; fp32 20 V) and
  the output projection's input eV. A gated-attention layer: its projections' input (bf16
  3 x 2 h), q_norm's fp32 input and normalised copy 8a (fp32: 12a, the input a view keeping
  q_proj's whole output, the gate's half too) and k_norm's 8kv, SDPA's q, k, v and output
  e(2a + 2kv), the output made contiguous, the sigmoid of the gate and their product (the
  output projection's input) 3ea.

fp32 doubles every term. With full checkpointing a layer keeps its input only: 2h at 16 bits
(4h for an fp32 residual stream, which autocast keeps). Where the measurement exceeds the
formula the table says why (autocast keeps norm inputs in fp32 and casts a shared input once
per projection; attention's output is saved by SDPA and again, reshaped, by the projection).

Run ``python benchmarks/activation_bytes.py``; writes ``benchmarks/results/activation_bytes.md``
and ``.json``. Takes about a minute (fake tensors: nothing is computed).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
SEQ_LEN = 1024
LAYERS = (2, 3)
MICRO = (2, 4)


@dataclass(frozen=True)
class Family:
    name: str
    model: str
    args: Mapping[str, Any]
    width: int
    ffn: int
    kv_ratio: float = 1.0  # KV heads / heads (the Qwen3.5 layers' widths are in ``dims``)
    layers_arg: str = "n_layer"
    # A Mamba-2 mixer's inner width, state, groups and heads (empty: an attention block);
    # ``kernels`` False traces it on transformers' PyTorch scan instead of mamba_ssm's kernel.
    ssm: Mapping[str, int] = field(default_factory=dict)
    kernels: bool = True
    # Qwen3.5's two layer kinds (``layer_types``, every layer of the traced copies the same):
    # "linear_attention" (a gated delta rule: key width K, value width V, value heads) or
    # "full_attention" (gated attention: query width, key/value width).
    layer_type: str = ""
    dims: Mapping[str, int] = field(default_factory=dict)

    def model_args(self, layers: int) -> dict[str, Any]:
        """The traced copy's arguments at ``layers`` layers."""
        kinds = {"layer_types": [self.layer_type] * layers} if self.layer_type else {}
        return {**self.args, self.layers_arg: layers, **kinds}

    def formula(self, precision: str, checkpointing: str) -> float:
        """Textbook bytes per layer per token (see the module docstring)."""
        scale = 2 if precision == "fp32" else 1
        h, f, g = self.width, self.ffn, self.kv_ratio
        if checkpointing == "full":
            return 2 * h * scale
        if self.layer_type:
            return self._qwen3_5(precision == "fp32")
        if self.ssm:
            d, n, g, heads = (self.ssm[k] for k in ("inner", "state", "groups", "heads"))
            e = 4 if precision == "fp32" else 2
            casts = 0 if precision == "fp32" else 1  # autocast's bf16 copies of fp32 inputs
            norms = 2 * 8 * h
            mixer = (4 if casts == 0 else 2) * h + e * (2 * d + 2 * g * n + heads) + e * d + 4 * g
            mlp = (4 if casts == 0 else 2 * 2) * h + 4 * e * f
            return norms + mixer + mlp
        if self.name == "llama":
            count = 4 * h + (2 * h + 2 * h + 4 * g * h + 2 * h) + 2 * h + 8 * f
        else:
            count = 4 * h + 10 * h + 2 * h + 4 * f
        return count * scale

    def _qwen3_5(self, fp32: bool) -> float:
        """A Qwen3.5 layer (transformers' code, the module docstring): bf16 under autocast
        (fp32 weights and residual stream) or fp32; per-head terms (under 0.2 h) left out."""
        h, f, d = self.width, self.ffn, self.dims
        e = 4 if fp32 else 2
        norms = 2 * 8 * h  # two RMSNorms: the fp32 input and its fp32 normalised copy
        mlp = (4 if fp32 else 2 * 2) * h + 4 * e * f  # its input (cast per projection) + 8f
        if self.layer_type == "linear_attention":
            k, v, heads = d["key"], d["value"], d["value_heads"]
            projections = 4 * h if fp32 else 4 * 2 * h  # qkv, z, b, a: one cast each
            conv = e * (2 * k + v)
            kernel = e * (2 * k + v + 64 * heads)  # q, k normalised, v, the WY matrix A
            gated_norm = 20 * v if fp32 else 18 * v
            return norms + projections + conv + kernel + gated_norm + e * v + mlp
        a, kv = d["query"], d["kv"]
        projections = 4 * h if fp32 else 3 * 2 * h  # q, k, v: one cast each
        # q_norm: its fp32 input (in fp32 a view keeping q_proj's whole output, gate included)
        # and normalised copy; k_norm the same over kv
        norms_qk = (8 + 4) * a + 8 * kv if fp32 else 8 * a + 8 * kv
        sdpa = e * (2 * a + 2 * kv)  # q, k, v and the output
        gate = 3 * e * a  # the output made contiguous, sigmoid(gate), their product (o_proj)
        return norms + projections + norms_qk + sdpa + gate + mlp


FAMILIES: tuple[Family, ...] = (
    # MPT-350M's shape (the published runs' GPT family), GPT-2's vocabulary.
    Family("gpt", "gpt-small", {"n_layer": 2, "n_head": 16, "n_embd": 1024}, 1024, 4096, 1.0),
    # Llama-3.2-1B's width, heads and MLP; 256-token vocabulary (the head cancels out anyway).
    Family(
        "llama",
        "llama-1b",
        {"n_layer": 2, "vocab_size": 256},
        2048,
        8192,
        8 / 32,
    ),
    Family("bert", "bert-base", {"n_layer": 2, "max_position": 1024}, 768, 3072, 1.0),
    # Bamba's default config (every layer a Mamba-2 layer): width 4096, inner 8192, state 256,
    # 1 group, 128 heads; MLP 14336. Traced as the kernels, then on the PyTorch scan.
    *(
        Family(
            name,
            "hf:bamba",
            {"vocab_size": 256},
            4096,
            14336,
            1.0,
            layers_arg="num_hidden_layers",
            ssm={"inner": 8192, "state": 256, "groups": 1, "heads": 128},
            kernels=kernels,
        )
        for name, kernels in (("bamba", True), ("bamba-torch", False))
    ),
    # Qwen3.5-9B's shape (width 4096, MLP 12288): its gated-delta layers (16 key heads and 32
    # value heads of 128; three in four layers) and its gated-attention layers (16 query heads
    # and 4 KV heads of 256, an output gate). Traced as fla's and causal-conv1d's kernels.
    *(
        Family(
            name,
            "hf:qwen3_5_text",
            {"vocab_size": 256},
            4096,
            12288,
            layers_arg="num_hidden_layers",
            layer_type=kind,
            dims=dims,
        )
        for name, kind, dims in (
            (
                "qwen3.5-delta",
                "linear_attention",
                {"key": 2048, "value": 4096, "value_heads": 32},
            ),
            ("qwen3.5-attn", "full_attention", {"query": 4096, "kv": 1024}),
        )
    ),
)


def per_layer_per_token(
    family: Family, precision: str, checkpointing: str
) -> tuple[float, dict[str, dict[str, float]]]:
    """The peak's growth per extra layer per extra token, and for each traced (layers,
    micro-batch) what the peak held: its bytes, activations and gradients, in MiB (where in the
    step the peak fell: gradients at their full size mean the end of backward)."""
    import profilers.memory_tracing as memory_tracing
    from advisor.workload import AdvisorWorkload
    from profilers.memory import trace_step_memory
    from profilers.workload import StepSpec

    peaks: dict[tuple[int, int], int] = {}
    moments: dict[str, dict[str, float]] = {}
    expected = memory_tracing.kernels_expected
    memory_tracing.kernels_expected = lambda: expected() if family.kernels else frozenset()
    try:
        for layers in LAYERS:
            workload = AdvisorWorkload(
                model=family.model,
                model_args=family.model_args(layers),
                data="synthetic",
            )
            for b in MICRO:
                spec = StepSpec(
                    seq_len=SEQ_LEN,
                    micro_batch_size=b,
                    precision=precision,
                    activation_checkpointing=checkpointing,
                )
                trace = trace_step_memory(workload, spec, target_device_type="cuda")
                peaks[layers, b] = trace.forward_backward_peak_bytes
                held = trace.forward_backward_breakdown
                moments[f"{layers} layers, micro-batch {b}"] = {
                    "peak_mib": round(trace.forward_backward_peak_bytes / 2**20, 1),
                    "activations_mib": round(held.activations / 2**20, 1),
                    "gradients_mib": round(held.gradients / 2**20, 1),
                }
    finally:
        memory_tracing.kernels_expected = expected
    (l1, l2), (b1, b2) = LAYERS, MICRO
    extra = (peaks[l2, b2] - peaks[l2, b1]) - (peaks[l1, b2] - peaks[l1, b1])
    return extra / ((l2 - l1) * (b2 - b1) * SEQ_LEN), moments


def peak_moves(moments: Mapping[str, Mapping[str, float]]) -> bool:
    """Whether the peak fell at different points of the step at the two micro-batch sizes:
    at one depth, the gradients held at the peak differ."""
    return any(
        moments[f"{layers} layers, micro-batch {MICRO[0]}"]["gradients_mib"]
        != moments[f"{layers} layers, micro-batch {MICRO[1]}"]["gradients_mib"]
        for layers in LAYERS
    )


def measure(say: Any = print) -> list[dict[str, Any]]:
    rows = []
    for family in FAMILIES:
        for precision in ("bf16", "fp32"):
            for checkpointing in ("none", "full"):
                measured, moments = per_layer_per_token(family, precision, checkpointing)
                formula = family.formula(precision, checkpointing)
                row = {
                    "family": family.name,
                    "width": family.width,
                    "precision": precision,
                    "checkpointing": checkpointing,
                    "measured_bytes_per_token": round(measured, 1),
                    "formula_bytes_per_token": formula,
                    "measured_over_h": round(measured / family.width, 2),
                    "formula_over_h": round(formula / family.width, 2),
                    "ratio": round(measured / formula, 3),
                    "peak_moves": peak_moves(moments),
                    "peaks": moments,
                }
                say(
                    f"{family.name:6s} {precision} {checkpointing:4s}: "
                    f"{row['measured_over_h']:6.2f} h measured, {row['formula_over_h']:6.2f} h "
                    f"formula ({row['ratio']:.2f}x)"
                )
                rows.append(row)
    return rows


# Why a measurement differs from the formula (read off the traces' saved tensors).
NOTES: tuple[str, ...] = (
    "fp32, no checkpointing: GPT and BERT keep exactly the textbook 64 h.",
    "bf16 (autocast), GPT/BERT: +4 h, the two LayerNorm inputs stay fp32 (the residual "
    "stream is fp32 under autocast: 2 x 2 h more than 16-bit).",
    "bf16, Llama: +4 h over 45 h: the two RMSNorm inputs are the fp32 residual stream (+2 x 2 h; "
    "an FSDP rank with bf16 parameters keeps them in bf16). Until 2026-12-03 it was +23 h "
    "(68.07 h): F.rms_norm under autocast kept an fp32 input and an fp32 normalised copy, each "
    "projection cast the shared fp32 output to bf16 again, grouped-query attention repeated k "
    "and v to every head, and the output projection read a copy of SDPA's output (RoPE made q "
    "contiguous in (b, heads, t, d)). advisor/models/llama.py's RMSNorm now keeps its input in "
    "its own dtype and the inverse RMS and returns one bf16 output under autocast, 16-bit "
    "attention uses SDPA's enable_gqa, and RoPE runs before the heads are transposed (as "
    "torchtitan's), so SDPA's output is read as a view.",
    "fp32, Llama: +6 h over 90 h: k and v repeated to every head (fp32 keeps repeat_interleave: "
    "SDPA's enable_gqa runs in CUDA's flash and math kernels only, not fp32's memory-efficient "
    "one; 2 x 4 h x 3/4). Was 108.07 h.",
    "Bamba (a Mamba-2 layer traced as mamba_ssm's fused kernel, profilers/ssm_kernels.py): the "
    "tensors one layer saves, listed by torch.autograd.graph.saved_tensors_hooks on a real "
    "layer running the fake kernel (sequence 64, 2026-12-05), sum to the formula within 0.2% "
    "(fp32 104.6 h: the two norms' inputs and normalised copies 16 h, the in-projection's "
    "input 4 h, zxbcdt 16.6 h, the scan's output 8 h, the MLP's input 4 h and its four "
    "f-wide tensors 56 h). This table's measure, the growth of the step's peak, reads less "
    "(0.93x bf16, 0.73x fp32), because the peak falls at different points of the step (found "
    "2026-12-06, 'Where the peak fell' below): at micro-batch 2 at the end of backward, where "
    "the layers' fp32 gradients (a 267M-parameter layer's: 1 GiB) outweigh the activations "
    "left, at micro-batch 4 as backward starts, all activations held. At that moment the "
    "activations grow per extra layer per token by the formula: fp32 (4798 - 3124) MiB over "
    "4 x 1024 tokens = 104.6 h; bf16 (4366 - 2836) MiB = 95.6 h, less the layer's 16-bit "
    "weight copies autocast holds (1067 MiB / 2 per layer, not per token) = 62.3 h. "
    "bamba-torch, the same layers on transformers' PyTorch scan (what a CUDA target's trace "
    "held before, and a GPU without mamba-ssm holds): 4.8x (bf16) and 4.4x (fp32) the "
    "kernel's count.",
    "Qwen3.5 (9B's shape, traced as fla's and causal-conv1d's kernels): the formula within "
    "0.2% for both layer kinds, but for attention in fp32, +18 h: on CUDA a grouped-query "
    "SDPA call in fp32 runs the math kernel (transformers passes enable_gqa; the "
    "memory-efficient kernel takes no grouped heads), which keeps the T x T probabilities "
    "(16 h at sequence 1024, growing with T), a scaled q and the repeated k and v instead of "
    "flash's q, k, v and output (profilers/memory_tracing.py, cuda_grouped_query_sdpa). The "
    "tensors, listed by saved_tensors_hooks on a real "
    "layer of each kind running the fake kernels on CPU (sequence 48, 2026-12-06), sum to the "
    "formula plus its per-head terms (gated delta 81.17 h bf16, 114.19 h fp32; attention "
    "71.16 h, 108.16 h). A gated-delta layer keeps 14% more than a Llama layer of its width "
    "would (71 h at this MLP): transformers' unfused gated RMSNorm alone keeps 18 h, four "
    "of its five tensors fp32, where a fused norm (fla's FusedRMSNormGated) keeps its input and "
    "the gate, 4 h; the four input projections each cast the same input (8 h). Two "
    "traces were wrong before 2026-12-06 and are mended: fla makes its inputs contiguous "
    "(input_guard), so v is kept as its own copy, not as a view keeping the convolution's "
    "whole output alive (+2 h); and transformers, unable to read fake position ids, assumed "
    "packed rows, built a causal mask and repeated k and v to every query head (attention "
    "+3.5 h bf16, +7 h fp32; every Hugging Face model with grouped-query attention), where a "
    "real step (token ids only) passes no mask and keeps k and v at their own heads "
    "(profilers/fake_kernels.py, unpacked_rows).",
    "Full checkpointing keeps each block's input: 4 h (the fp32 residual stream), not 2 h. "
    "Llama's peak with full checkpointing falls late in backward, after the earlier blocks' "
    "checkpoints are freed and while parameter gradients grow: the peak gains nothing per "
    "layer per token there (0 h), its growth per layer is the gradients'.",
)


def table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        "| family | h | precision | checkpointing | measured B/token/layer | formula | "
        "measured / formula |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['family']} | {r['width']} | {r['precision']} | {r['checkpointing']} | "
            f"{r['measured_bytes_per_token']:,.0f} ({r['measured_over_h']:g} h) | "
            f"{r['formula_bytes_per_token']:,.0f} ({r['formula_over_h']:g} h) | "
            f"{r['ratio']:.2f} |"
        )
    return lines


def peak_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """What each trace's peak held, for the rows whose peak fell at different points of the
    step at the two micro-batch sizes (the growth of the peak then mixes two moments)."""
    lines = [
        "| family | precision | checkpointing | trace | peak MiB | activations MiB | "
        "gradients MiB |",
        "| --- | --- | --- | --- | ---: | ---: | ---: |",
    ]
    moved = [r for r in rows if r["peak_moves"]]
    for r in moved:
        for trace, held in r["peaks"].items():
            lines.append(
                f"| {r['family']} | {r['precision']} | {r['checkpointing']} | {trace} | "
                f"{held['peak_mib']:,.0f} | {held['activations_mib']:,.0f} | "
                f"{held['gradients_mib']:,.0f} |"
            )
    return lines if moved else []


def main() -> int:
    rows = measure()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "activation_bytes.json").write_text(
        json.dumps(
            {
                "seq_len": SEQ_LEN,
                "layers": LAYERS,
                "micro_batch_sizes": MICRO,
                "families": [asdict(f) for f in FAMILIES],
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    md = [
        "# Activation bytes per layer per token: traced vs the textbook count",
        "",
        f"Generated by `python benchmarks/activation_bytes.py` (sequence {SEQ_LEN}, CUDA "
        "target: 512-byte rounding). Formula: Korthikanti et al. 2022 without dropout masks "
        "and with flash attention (see the script's docstring).",
        "",
        *table(rows),
        "",
        *(f"- {note}" for note in NOTES),
        "",
    ]
    if moves := peak_table(rows):
        md += [
            "## Where the peak fell",
            "",
            "The rows whose peak fell at different points of the step at the two micro-batch "
            "sizes (at one depth, the gradients held at the peak differ): their growth of the "
            "peak mixes two moments. What each trace's peak held:",
            "",
            *moves,
            "",
        ]
    (RESULTS / "activation_bytes.md").write_text("\n".join(md))
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
