"""What eager attention moves over its T×T scores, counted, and what that does to a what-if step.

Models that transformers builds without an SDPA path (Gemma 2: logit soft-capping; gpt-oss:
attention sinks) run their attention as plain matmuls and element-wise ops over the B·H·T²
scores of every layer. For published shapes of those models this script takes the profiler's
FLOP count (``profilers.flops.count_step_flops``: fake tensors, shallow copies extended to the
depth, nothing allocated), which for such a model also counts the score traffic
(``profilers.eager_attention``: bytes each op touching a score-shaped tensor reads and writes,
in fp32 and under bf16 autocast), and prices one micro-batch's forward+backward on an
H100-80GB with the what-if roofline (``strategies.whatif.RooflineTime``, the compute part of
``advisor predict --target h100-80gb``) twice: with the counted traffic (eager, as the trainer
runs it) and without it (the attention priced as a flash kernel, as before 2026-12-05).

Then the pair ``scripts/gpu_check.sh`` trains (MPT 125M at sequence 2048 with SDPA and with the
same model's attention written out by hand), predicted as ``benchmarks/whatif_measured.py``
will predict it once a GPU has run it: the eager/SDPA ratio written down before any GPU ran.

These are predictions, not measurements: no GPU ran them. What they show is how much of a
long-sequence step the flash pricing left out, and the bytes per score element each model's
code moves (the column a reader can check against the model's source).

Run ``python benchmarks/eager_attention.py``; writes ``benchmarks/results/eager_attention.md``
and ``.json``. About three minutes on two cores (the pair's two trace-only profiles, cached
under ``results/whatif_profiles/`` as ``whatif_published.py`` caches its own).
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
SEQ_LENS = (2048, 4096, 8192)


@dataclass(frozen=True)
class Shape:
    name: str
    model: str
    args: Mapping[str, Any]
    source: str


# From each model's config.json on the Hugging Face hub (read by hand; nothing is downloaded).
GEMMA2 = {"vocab_size": 256000, "head_dim": 256}
SHAPES = (
    Shape(
        "gemma-2-2b",
        "hf:gemma2",
        {
            **GEMMA2,
            "hidden_size": 2304,
            "intermediate_size": 9216,
            "num_hidden_layers": 26,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
        },
        "google/gemma-2-2b config.json",
    ),
    Shape(
        "gemma-2-9b",
        "hf:gemma2",
        {
            **GEMMA2,
            "hidden_size": 3584,
            "intermediate_size": 14336,
            "num_hidden_layers": 42,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
        },
        "google/gemma-2-9b config.json",
    ),
    Shape(
        "gemma-2-27b",
        "hf:gemma2",
        {
            **GEMMA2,
            "head_dim": 128,
            "hidden_size": 4608,
            "intermediate_size": 36864,
            "num_hidden_layers": 46,
            "num_attention_heads": 32,
            "num_key_value_heads": 16,
            "query_pre_attn_scalar": 144,
        },
        "google/gemma-2-27b config.json",
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
        "openai/gpt-oss-20b config.json",
    ),
)


def measure(shape: Shape, seq_len: int) -> dict[str, Any]:
    from advisor.workload import AdvisorWorkload
    from profilers.flops import ScoreTraffic, count_step_flops
    from profilers.hardware import lookup_target
    from profilers.workload import StepSpec
    from strategies.space import Candidate
    from strategies.whatif import RooflineTime, time_source

    workload = AdvisorWorkload(shape.model, {**shape.args, "max_position_embeddings": seq_len})
    t0 = time.perf_counter()
    count = count_step_flops(workload, StepSpec(seq_len=seq_len, micro_batch_size=1))
    count_s = time.perf_counter() - t0
    facts = workload.facts()
    if count.score_traffic is None:
        raise SystemExit(f"{shape.name}: no score traffic counted (an SDPA model?)")
    bf16 = ScoreTraffic.from_dict(count.score_traffic["bf16"])
    fp32 = ScoreTraffic.from_dict(count.score_traffic["fp32"])
    elements = facts.num_layers * facts.num_heads * seq_len  # score elements per token
    target = lookup_target(TARGET)
    row: dict[str, Any] = {
        "model": shape.name,
        "params": facts.num_params,
        "seq_len": seq_len,
        "count_s": round(count_s, 1),
        "bf16_bytes_per_token": bf16.forward_bytes + bf16.backward_bytes,
        "bf16_bytes_per_element": (bf16.forward_bytes + bf16.backward_bytes) / elements,
        "fp32_bytes_per_element": (fp32.forward_bytes + fp32.backward_bytes) / elements,
        "score_traffic": count.score_traffic,
    }
    for checkpointing in ("none", "full"):
        candidate = Candidate(
            precision="bf16",
            activation_checkpointing=checkpointing,
            parallelism="fsdp",
            world_size=8,
            micro_batch_size=1,
            grad_accum_steps=1,
        )
        times = {}
        for label, flops in (
            ("eager", count),
            ("flash", dataclasses.replace(count, score_traffic=None)),
        ):
            source = time_source(target, facts, seq_len, flops)
            assert isinstance(source, RooflineTime)
            priced = source.compute(candidate)
            times[label] = priced.forward_backward_s
            row[f"{checkpointing}_{label}_parts"] = dict(priced.parts)
        row[f"{checkpointing}_eager_s"] = times["eager"]
        row[f"{checkpointing}_flash_s"] = times["flash"]
        row[f"{checkpointing}_ratio"] = times["eager"] / times["flash"]
    return row


# scripts/gpu_check.sh's pair (its attn stages): MPT 125M at sequence 2048, micro-batch 4, bf16,
# one GPU, SDPA (the preset) and eager (benchmarks/models/eager_gpt.py, the same model).
PAIR_ARGS = {
    "n_layer": 12,
    "n_head": 12,
    "n_embd": 768,
    "vocab_size": 50368,
    "bias": False,
    "block_size": 2048,
}
PAIR_RUN = {
    "seq_len": 2048,
    "micro_batch_size": 4,
    "grad_accum_steps": 1,
    "precision": "bf16",
    "activation_checkpointing": "none",
}
PAIR_MODELS = {"sdpa": "gpt-small", "eager": "benchmarks/models/eager_gpt.py:eager_gpt"}
PAIR_TARGETS = ("h100-80gb", "h200")


def pair_prediction() -> list[dict[str, Any]]:
    """The step time ``benchmarks/whatif_measured.py`` will predict for the GPU check's pair,
    the same way (a trace-only CPU profile, ``advisor predict --target``), before any GPU ran
    it: per target, each step and the eager/SDPA ratio."""
    from benchmarks import whatif_published as wp
    from benchmarks.whatif_measured import gpu_check_row

    out = []
    for target in PAIR_TARGETS:
        rows = {
            label: gpu_check_row(model, PAIR_ARGS, PAIR_RUN, target, label)
            for label, model in PAIR_MODELS.items()
        }
        steps = {
            label: wp.predict_row(row, wp.profile_for(row, rows.values()))["predicted"][
                "step_time_s"
            ]
            for label, row in rows.items()
        }
        out.append({"target": target, **{f"{k}_step_s": v for k, v in steps.items()}})
        out[-1]["eager_over_sdpa"] = steps["eager"] / steps["sdpa"]
    return out


def pair_table(pairs: list[dict[str, Any]]) -> str:
    lines = [
        "| target | SDPA step s | eager step s | eager / SDPA |",
        "| --- | ---: | ---: | ---: |",
        *(
            f"| {p['target']} | {p['sdpa_step_s']:.4f} | {p['eager_step_s']:.4f} | "
            f"{p['eager_over_sdpa']:.2f}× |"
            for p in pairs
        ),
    ]
    return "\n".join(lines) + "\n"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| model | params | seq | B/score element bf16 (fp32) | GB/token bf16 | "
        "fwd+bwd s eager / flash-priced, none | ratio | full | ratio |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    )
    lines = [
        f"| {r['model']} | {r['params'] / 1e9:.2f}B | {r['seq_len']} | "
        f"{r['bf16_bytes_per_element']:.1f} ({r['fp32_bytes_per_element']:.1f}) | "
        f"{r['bf16_bytes_per_token'] / 1e9:.3f} | "
        f"{r['none_eager_s']:.3f} / {r['none_flash_s']:.3f} | {r['none_ratio']:.2f}× | "
        f"{r['full_eager_s']:.3f} / {r['full_flash_s']:.3f} | {r['full_ratio']:.2f}× |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


def main() -> None:
    rows = []
    for shape in SHAPES:
        for seq_len in SEQ_LENS:
            row = measure(shape, seq_len)
            rows.append(row)
            print(
                f"{shape.name} seq {seq_len}: {row['bf16_bytes_per_element']:.1f} B/element, "
                f"eager/flash {row['none_ratio']:.2f}x (none), {row['full_ratio']:.2f}x (full); "
                f"counted in {row['count_s']} s",
                flush=True,
            )
    intro = (
        "# Eager attention: the counted score traffic and the what-if step it prices\n\n"
        "Generated by `python benchmarks/eager_attention.py` (see its docstring). Micro-batch 1, "
        f"bf16, FSDP over 8 GPUs, target {TARGET}; forward+backward seconds of one micro-batch "
        "from the what-if roofline, with the profile's counted score traffic (eager) and without "
        "it (the attention priced as a flash kernel). Predictions: no GPU ran them.\n\n"
        "Shapes: " + "; ".join(f"{s.name} ({s.source})" for s in SHAPES) + ".\n\n"
    )
    pairs = pair_prediction()
    pair_intro = (
        "\n## The GPU check's pair, predicted before it ran\n\n"
        "`scripts/gpu_check.sh` trains MPT 125M (sequence 2048, micro-batch 4, bf16, one GPU) "
        "with SDPA (`gpt-small`) and with the same model's attention written out by hand "
        "(`benchmarks/models/eager_gpt.py`); `benchmarks/whatif_measured.py` will predict each "
        "run as below (trace-only CPU profiles, `advisor predict --target`) and hold them "
        "against the measured steps.\n\n"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = intro + table(rows) + pair_intro + pair_table(pairs)
    (RESULTS / "eager_attention.md").write_text(text)
    (RESULTS / "eager_attention.json").write_text(
        json.dumps({"shapes": rows, "gpu_check_pair": pairs}, indent=1) + "\n"
    )
    print(table(rows) + pair_table(pairs))


if __name__ == "__main__":
    main()
