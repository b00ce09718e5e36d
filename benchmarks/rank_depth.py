"""A deep model's DDP/FSDP rank traced from 3- and 4-block copies against its whole trace.

``profilers.memory_distributed.trace_scaled`` extends a rank's fake-tensor trace in depth, window
by window (the profiler uses it for every model with 8 or more identical blocks). This traces
each case below both ways, in this process under a fake process group, with the CUDA allocator's
rounding, and prints the per-rank peak of each and the difference (the target is 0 bytes: the
blocks are identical, so every byte count is affine in depth within a window). The cases vary
what moves a rank's peak: width against sequence (activations against sharded gradients), full,
per-op and no checkpointing, bf16 autocast, accumulation, blocks kept gathered, world size.
tests/profilers/test_memory_distributed_blocks.py checks three of them in CI.

    python benchmarks/rank_depth.py      # writes benchmarks/results/rank_depth.{json,md}
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from advisor.workload import AdvisorWorkload  # noqa: E402
from profilers import memory_distributed as md  # noqa: E402
from profilers.memory_records import BYTE_COUNT_FIELDS  # noqa: E402
from profilers.workload import StepSpec  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
WIDE = {"n_embd": 256, "n_head": 4}
# model, model args, layers, seq, micro-batch, accumulation, precision, checkpointing,
# parallelism, world size, reshard after forward
CASES = [
    ("gpt-tiny", {}, 8, 32, 2, 1, "fp32", "none", "fsdp", 2, True),
    ("gpt-tiny", {}, 8, 32, 4, 2, "bf16", "full", "fsdp", 2, True),
    ("gpt-tiny", {}, 8, 32, 1, 1, "fp32", "none", "fsdp", 2, False),
    ("gpt-tiny", {}, 8, 32, 2, 1, "bf16", "ops", "fsdp", 2, True),
    ("gpt-tiny", {}, 8, 32, 1, 1, "fp32", "full", "fsdp", 2, True),
    ("gpt-tiny", {}, 8, 32, 2, 1, "fp32", "none", "ddp", 2, True),
    ("gpt-tiny", {}, 8, 32, 4, 2, "bf16", "full", "ddp", 2, True),
    ("llama-tiny", {}, 8, 32, 2, 1, "fp32", "none", "fsdp", 2, True),
    ("llama-tiny", {}, 8, 32, 4, 2, "bf16", "full", "fsdp", 2, True),
    ("llama-tiny", {}, 8, 32, 1, 1, "fp32", "none", "fsdp", 2, False),
    ("llama-tiny", {}, 8, 32, 2, 1, "fp32", "none", "ddp", 2, True),
    # Sharded gradients larger than a block's checkpoint: the end of backward can win deep down.
    ("gpt-tiny", WIDE, 12, 8, 1, 1, "fp32", "full", "fsdp", 2, True),
    ("gpt-tiny", WIDE, 12, 8, 1, 1, "bf16", "full", "fsdp", 8, True),
    ("llama-tiny", WIDE, 12, 16, 1, 1, "bf16", "full", "fsdp", 2, True),
    ("gpt-tiny", {}, 16, 64, 2, 1, "fp32", "none", "fsdp", 2, True),
]


def run() -> list[dict[str, object]]:
    rows = []
    for model, args, layers, seq, micro, accum, precision, ckpt, par, world, reshard in CASES:
        workload = AdvisorWorkload(model=model, model_args={**args, "n_layer": layers})
        scaling = md.rank_depth_scaling(workload)
        assert scaling is not None and scaling.layers == layers, (model, layers)
        spec = StepSpec(
            seq_len=seq,
            micro_batch_size=micro,
            grad_accum_steps=accum,
            precision=precision,
            activation_checkpointing=ckpt,
            parallelism=par,
            world_size=world,
            fsdp_reshard_after_forward=reshard,
        )
        with md._fake_process_group(world):
            started = time.perf_counter()
            raw = md.trace_raw(workload, spec, cuda_rounding=True)
            whole = raw.assemble(spec, cuda_rounding=True, started=started)
            whole_s = time.perf_counter() - started
            started = time.perf_counter()
            scaled = md.trace_scaled(workload, spec, cuda_rounding=True, scaling=scaling)
            scaled_s = time.perf_counter() - started
        differ = [f for f in BYTE_COUNT_FIELDS if getattr(whole, f) != getattr(scaled, f)]
        if whole.breakdown != scaled.breakdown:
            differ.append("breakdown")
        row = {
            "model": model,
            "model_args": args,
            "layers": layers,
            "seq_len": seq,
            "micro_batch_size": micro,
            "grad_accum_steps": accum,
            "precision": precision,
            "checkpointing": ckpt,
            "parallelism": par + ("" if reshard else " kept gathered"),
            "world_size": world,
            "whole_peak_bytes": whole.peak_bytes,
            "scaled_peak_bytes": scaled.peak_bytes,
            "fields_that_differ": differ,
            "whole_s": round(whole_s, 1),
            "scaled_s": round(scaled_s, 1),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| model | layers | seq | micro × accum | precision | checkpointing | layout | world "
        "| whole peak B | from 3+4 blocks B | fields that differ | trace s (whole / scaled) |",
        "|---|---:|---:|---|---|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        args = ",".join(f"{k}={v}" for k, v in r["model_args"].items())  # type: ignore[attr-defined]
        lines.append(
            f"| {r['model']}{' ' + args if args else ''} | {r['layers']} | {r['seq_len']} "
            f"| {r['micro_batch_size']} × {r['grad_accum_steps']} | {r['precision']} "
            f"| {r['checkpointing']} | {r['parallelism']} | {r['world_size']} "
            f"| {r['whole_peak_bytes']:,} | {r['scaled_peak_bytes']:,} "
            f"| {', '.join(r['fields_that_differ']) or 'none'} "  # type: ignore[arg-type]
            f"| {r['whole_s']} / {r['scaled_s']} |"
        )
    exact = sum(not r["fields_that_differ"] for r in rows)
    lines.append("")
    lines.append(f"{exact} of {len(rows)} cases identical in every byte count.")
    return "\n".join(lines) + "\n"


def main() -> None:
    rows = run()
    (RESULTS / "rank_depth.json").write_text(json.dumps(rows, indent=1) + "\n")
    text = table(rows)
    (RESULTS / "rank_depth.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
