"""Mixture-of-experts layers priced at their experts' GEMM shapes: what it changes in a what-if.

transformers runs a MoE layer's experts as grouped GEMMs: tokens × top-k routed rows times the
stacked weights of all E experts. Until 2026-12-05 the what-if priced them as the block's one
dense FFN with its FLOPs scaled to the count: a large GEMM's efficiency, one expert's weights,
the activation at one FFN's width and no routing. The profile now records each grouped GEMM's
shape (``profilers.expert_gemms``) and the roofline prices it as a GEMM batched over the experts
(~rows/E rows each, balanced routing), reading every expert's weights per call, with the
activation at the routed width and the routing's gathers as memory-bound ops
(``strategies.roofline.expert_forward_ops``).

For published shapes of MoE models this script takes the profiler's FLOP count (fake tensors,
shallow copies extended in depth, nothing allocated) and prices one micro-batch's
forward+backward on an H100-80GB (bf16, FSDP over 8 GPUs, no checkpointing) with the what-if
roofline twice: with the record (now) and without it (as before). It also says, for the expert
input projection (K = hidden), the rows each expert multiplies and whether the call is bound by its
weights' bytes or by its FLOPs.

These are predictions, not measurements: no GPU ran them, and no published MoE training run was
reproduced (none of the stored tables uses transformers' MoE layers). What they show is how much
of a step the dense pricing left out, and where (fine-grained experts at small micro-batches).

Run ``python benchmarks/moe_experts.py``; writes ``benchmarks/results/moe_experts.md`` and
``.json``, with the step ``benchmarks/whatif_measured.py`` will predict for the GPU check's MoE
run (``scripts/gpu_check.sh``, ``benchmarks/models/moe_gpt.py``), written down before a GPU ran
it. A minute or two on two cores (the run's trace-only profile is cached under
``results/whatif_profiles/`` as ``whatif_published.py`` caches its own).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
TARGET = "h100-80gb"
SEQ_LEN = 4096
MICRO_BATCHES = (1, 4)


@dataclass(frozen=True)
class Shape:
    name: str
    model: str
    args: Mapping[str, Any]
    source: str


# From each model's config.json on the Hugging Face hub (read by hand; nothing is downloaded).
SHAPES = (
    Shape("mixtral-8x7b", "hf:mixtral", {}, "transformers' MixtralConfig defaults (8x7B)"),
    Shape(
        "qwen1.5-moe-a2.7b",
        "hf:qwen2_moe",
        {},
        "transformers' Qwen2MoeConfig defaults (Qwen1.5-MoE-A2.7B: 60 experts, top-4, a shared "
        "expert)",
    ),
    Shape(
        "olmoe-1b-7b",
        "hf:olmoe",
        {"intermediate_size": 1024},
        "allenai/OLMoE-1B-7B-0924 config.json (64 experts, top-8)",
    ),
    Shape(
        "qwen3-30b-a3b",
        "hf:qwen3_moe",
        {"num_hidden_layers": 48, "head_dim": 128},
        "Qwen/Qwen3-30B-A3B config.json (128 experts, top-8, head_dim 128)",
    ),
    Shape(
        "gpt-oss-20b",
        "hf:gpt_oss",
        {
            "hidden_size": 2880,
            "intermediate_size": 2880,
            "num_hidden_layers": 24,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "num_local_experts": 32,
            "num_experts_per_tok": 4,
            "vocab_size": 201088,
        },
        "openai/gpt-oss-20b config.json (32 experts, top-4; eager attention)",
    ),
)


def measure(shape: Shape) -> dict[str, Any]:
    from advisor.workload import AdvisorWorkload
    from profilers.flops import count_step_flops
    from profilers.hardware import lookup_target
    from profilers.workload import StepSpec
    from strategies import roofline
    from strategies.space import Candidate
    from strategies.whatif import RooflineTime, time_source

    workload = AdvisorWorkload(shape.model, {**shape.args, "max_position_embeddings": SEQ_LEN})
    t0 = time.perf_counter()
    count = count_step_flops(workload, StepSpec(seq_len=SEQ_LEN, micro_batch_size=1))
    count_s = time.perf_counter() - t0
    if not count.expert_gemms:
        raise SystemExit(f"{shape.name}: no expert GEMMs recorded (a dense model?)")
    facts = workload.facts()
    target = lookup_target(TARGET)
    row: dict[str, Any] = {
        "model": shape.name,
        "params": facts.num_params,
        "count_s": round(count_s, 1),
        "expert_gemms": count.expert_gemms,
        "micro_batches": {},
    }
    bandwidth = target.memory_bandwidth_gbs * 1e9 * roofline.MEMORY_BANDWIDTH_EFFICIENCY  # type: ignore[operator]
    peak = target.peak_flops("bf16") * roofline.mamf_fraction(target)[0]  # type: ignore[operator]
    for mb in MICRO_BATCHES:
        candidate = Candidate(
            precision="bf16",
            activation_checkpointing="none",
            parallelism="fsdp",
            world_size=8,
            micro_batch_size=mb,
            grad_accum_steps=1,
        )
        out: dict[str, Any] = {}
        for label, flops in (
            ("experts", count),
            ("dense", dataclasses.replace(count, expert_gemms=None)),
        ):
            source = time_source(target, facts, SEQ_LEN, flops)
            assert isinstance(source, RooflineTime)
            priced = source.compute(candidate)
            out[f"{label}_s"] = priced.forward_backward_s
            out[f"{label}_parts"] = dict(priced.parts)
            if label == "experts":
                first = next(  # the input projection: K is the hidden size
                    op
                    for op in roofline.block_forward_ops(
                        source.shape, mb * SEQ_LEN, SEQ_LEN, "bf16"
                    )
                    if op.kind == "expert_gemm" and op.mnk[2] == facts.hidden_size  # type: ignore[index]
                )
                out["rows_per_expert"] = first.mnk[0]  # type: ignore[index]
                out["up_projection_bytes_s"] = first.bytes / bandwidth
                out["up_projection_flops_s"] = first.flops / (
                    peak
                    * roofline.wave_efficiency(*first.mnk[:2], target.num_sms or 1, first.batch)  # type: ignore[index,call-arg]
                )
        out["ratio"] = out["experts_s"] / out["dense_s"]
        row["micro_batches"][mb] = out
    return row


# scripts/gpu_check.sh's MoE run (its moe stage): benchmarks/models/moe_gpt.py at MPT 125M's
# shape with 8 experts, 2 per token, sequence 2048, micro-batch 4, bf16, one GPU.
GPU_RUN_MODEL = "benchmarks/models/moe_gpt.py:moe_gpt"
GPU_RUN_ARGS = {
    "n_layer": 12,
    "n_head": 12,
    "n_embd": 768,
    "vocab_size": 50368,
    "bias": False,
    "block_size": 2048,
    "n_experts": 8,
    "top_k": 2,
}
GPU_RUN = {
    "seq_len": 2048,
    "micro_batch_size": 4,
    "grad_accum_steps": 1,
    "precision": "bf16",
    "activation_checkpointing": "none",
}
GPU_TARGETS = ("h100-80gb", "h200")


def gpu_run_prediction() -> list[dict[str, Any]]:
    """The step time ``benchmarks/whatif_measured.py`` will predict for the GPU check's MoE run,
    the same way (a trace-only CPU profile, ``advisor predict --target``), before any GPU ran
    it; and the same profile without its expert record (the dense pricing of before)."""
    from benchmarks import whatif_published as wp
    from benchmarks.whatif_measured import gpu_check_row

    out = []
    for target in GPU_TARGETS:
        row = gpu_check_row(GPU_RUN_MODEL, GPU_RUN_ARGS, GPU_RUN, target, "moe")
        profile = wp.profile_for(row, [row])
        if not (profile.flops and profile.flops.expert_gemms):
            raise SystemExit("the GPU run's profile has no expert record")
        dense = dataclasses.replace(
            profile, flops=dataclasses.replace(profile.flops, expert_gemms=None)
        )
        steps = {
            label: wp.predict_row(row, p)["predicted"]["step_time_s"]
            for label, p in (("experts", profile), ("dense", dense))
        }
        out.append(
            {
                "target": target,
                "experts_step_s": steps["experts"],
                "dense_step_s": steps["dense"],
                "expert_gemms": profile.flops.expert_gemms,
            }
        )
    return out


def gpu_table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| target | predicted step s (expert shapes) | dense-priced step s | ratio |",
        "| --- | ---: | ---: | ---: |",
        *(
            f"| {r['target']} | {r['experts_step_s']:.4f} | {r['dense_step_s']:.4f} | "
            f"{r['experts_step_s'] / r['dense_step_s']:.2f}× |"
            for r in runs
        ),
    ]
    return "\n".join(lines) + "\n"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| model | params | expert GEMMs (experts × K→N, rows/token) | micro-batch | "
        "rows per expert | up projection bound by | fwd+bwd s, experts / dense-priced | "
        "ratio |\n| --- | ---: | --- | ---: | ---: | --- | ---: | ---: |\n"
    )
    lines = []
    for r in rows:
        gemms = "; ".join(
            f"{int(g['experts'])} × {int(g['k'])}→{int(g['n'])}, {g['rows_per_token']:g}"
            for g in r["expert_gemms"]
        )
        for mb, m in r["micro_batches"].items():
            bytes_s, flops_s = m["up_projection_bytes_s"], m["up_projection_flops_s"]
            bound = (
                f"weights ({bytes_s / flops_s:.2f}× its FLOPs' time)"
                if bytes_s > flops_s
                else f"FLOPs (bytes {bytes_s / flops_s:.2f}×)"
            )
            lines.append(
                f"| {r['model']} | {r['params'] / 1e9:.1f}B | {gemms} | {mb} | "
                f"{m['rows_per_expert']} | {bound} | {m['experts_s']:.3f} / {m['dense_s']:.3f} | "
                f"{m['ratio']:.2f}× |"
            )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    rows = []
    for shape in SHAPES:
        row = measure(shape)
        rows.append(row)
        ratios = ", ".join(f"mb {mb}: {m['ratio']:.2f}x" for mb, m in row["micro_batches"].items())
        print(f"{shape.name}: experts/dense-priced {ratios}; counted in {row['count_s']} s")
    intro = (
        "# Mixture-of-experts layers priced at their experts' shapes\n\n"
        "Generated by `python benchmarks/moe_experts.py` (see its docstring). Sequence "
        f"{SEQ_LEN}, bf16, FSDP over 8 GPUs, no checkpointing, target {TARGET}; forward+backward "
        "seconds of one micro-batch from the what-if roofline with the profile's record of the "
        "expert GEMMs (each expert's rows, every expert's weights read per call, the routed "
        "activation and the routing's gathers) and without it (one dense FFN with the counted "
        "FLOPs, as before 2026-12-05). Predictions: no GPU ran them, and no published MoE run "
        "was reproduced.\n\n"
        "Shapes: " + "; ".join(f"{s.name} ({s.source})" for s in SHAPES) + ".\n\n"
    )
    gpu = gpu_run_prediction()
    gpu_intro = (
        "\n## The GPU check's MoE run, predicted before it ran\n\n"
        "`scripts/gpu_check.sh` trains `benchmarks/models/moe_gpt.py` (MPT 125M's shape, every "
        "MLP 8 experts with 2 per token, run as transformers runs MoE layers; sequence 2048, "
        "micro-batch 4, bf16, one GPU); `benchmarks/whatif_measured.py` will predict it as the "
        "first column (a trace-only CPU profile, `advisor predict --target`) and hold it against "
        "the measured step. The second column is the same profile priced without its expert "
        "record, as before 2026-12-05.\n\n"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "moe_experts.md").write_text(intro + table(rows) + gpu_intro + gpu_table(gpu))
    (RESULTS / "moe_experts.json").write_text(
        json.dumps({"shapes": rows, "gpu_check_run": gpu}, indent=1) + "\n"
    )
    print(table(rows) + gpu_table(gpu))


if __name__ == "__main__":
    main()
