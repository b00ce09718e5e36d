"""A DDP rank's memory priced from single-device traces (what a profile without a DDP rank trace
gives ``advisor predict``, every large model's what-if) against the rank's own fake-PG trace.

For each case the single-device steps are traced at micro-batches 1 and 4 (CUDA rounding), fitted
as the profiler fits them, and priced by ``strategies.cost`` for DDP×2 with no rank fit; the
DDP×2 rank of the same step is traced under a fake process group (advisor's real step: DDP's
reducer with gradient_as_bucket_view). Printed: the traced rank peak, the prediction, and the
rule before 2026-12-07 (the single-device forward/backward peak plus every gradient in the
buckets), each as a ratio to the trace. Target: never below the trace, within a few percent.
tests/strategies/test_ddp_memory.py checks four of these cases (sequence 64) in CI.

    python benchmarks/ddp_from_single.py   # writes benchmarks/results/ddp_from_single.{json,md}
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from advisor.workload import AdvisorWorkload  # noqa: E402
from profilers.memory import fit_memory_models  # noqa: E402
from profilers.memory import trace_step_memory as trace_single  # noqa: E402
from profilers.memory_distributed import trace_distributed_step_memories  # noqa: E402
from profilers.workload import StepSpec  # noqa: E402
from strategies.cost import cost_model_from_profile  # noqa: E402
from strategies.space import Candidate  # noqa: E402
from tests.strategies.profiles import hand_profile  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SEQ = 128
SIZES = (1, 4)
MODELS: tuple[tuple[str, dict[str, int]], ...] = (
    ("gpt-tiny", {}),
    ("llama-tiny", {}),
    ("gpt-tiny", {"n_layer": 6, "vocab_size": 4096}),
)
PRECISIONS = ("fp32", "bf16")
SETTINGS = ("none", "full")
MiB = 2**20


def spec(
    b: int, precision: str, ckpt: str, parallelism: str = "single", world: int = 1
) -> StepSpec:
    return StepSpec(
        seq_len=SEQ,
        micro_batch_size=b,
        precision=precision,
        activation_checkpointing=ckpt,
        parallelism=parallelism,
        world_size=world,
    )


def main() -> None:
    rows: list[dict[str, Any]] = []
    for name, args in MODELS:
        workload = AdvisorWorkload(name, args)
        singles = tuple(
            trace_single(workload, spec(b, p, c), target_device_type="cuda")
            for b in SIZES
            for p in PRECISIONS
            for c in SETTINGS
        )
        ranks = {
            t.spec: t
            for t in trace_distributed_step_memories(
                workload,
                [spec(b, p, c, "ddp", 2) for b in SIZES for p in PRECISIONS for c in SETTINGS],
                target_device_type="cuda",
            )
        }
        profile = hand_profile(kind="cuda", precisions=PRECISIONS)
        profile = dataclasses.replace(
            profile,
            workload={**profile.workload, "seq_len": SEQ},
            fits=dataclasses.replace(profile.fits, memory=tuple(fit_memory_models(singles))),
            memory=singles,
        )
        model = cost_model_from_profile(profile, 0.9)
        for p in PRECISIONS:
            for c in SETTINGS:
                for b in SIZES:
                    cand = Candidate(
                        precision=p,
                        activation_checkpointing=c,
                        parallelism="ddp",
                        world_size=2,
                        micro_batch_size=b,
                        grad_accum_steps=1,
                    )
                    memory = model.predict(cand).breakdown.memory
                    assert memory is not None and memory.source is None
                    predicted = memory.traced_bytes - memory.rounding_allowance_bytes
                    single = next(t for t in singles if t.spec == spec(b, p, c))
                    before = max(
                        single.forward_backward_peak_bytes + single.gradient_bytes,
                        single.optimizer_step_peak_bytes,
                    )
                    truth = ranks[spec(b, p, c, "ddp", 2)].peak_bytes
                    label = name + (
                        "" if not args else " " + ",".join(f"{k}={v}" for k, v in args.items())
                    )
                    rows.append(
                        {
                            "model": label,
                            "precision": p,
                            "checkpointing": c,
                            "micro_batch": b,
                            "traced_rank_bytes": truth,
                            "predicted_bytes": predicted,
                            "before_bytes": before,
                        }
                    )
                    print(
                        f"{label:32} {p} {c:4} b={b}: trace {truth / MiB:8.2f} MiB, predicted "
                        f"{predicted / truth - 1:+6.1%}, before {before / truth - 1:+6.1%}",
                        flush=True,
                    )
    ratios = [r["predicted_bytes"] / r["traced_rank_bytes"] - 1 for r in rows]
    old = [r["before_bytes"] / r["traced_rank_bytes"] - 1 for r in rows]
    lines = [
        "# A DDP rank priced from single-device traces vs its own trace",
        "",
        f"`python benchmarks/ddp_from_single.py`; sequence {SEQ}, DDP×2, CUDA rounding, fake "
        "tensors (no GPU needed). Ratios to the rank's fake-PG trace.",
        "",
        f"**Predicted: {min(ratios):+.1%} to {max(ratios):+.1%}** over {len(rows)} cases "
        f"({sum(r < 0 for r in ratios)} below the trace); the rule before 2026-12-07 (the "
        f"single-device peak plus every gradient): {min(old):+.1%} to {max(old):+.1%}.",
        "",
        "| model | precision | checkpointing | micro-batch | rank trace (MiB) | predicted "
        "| before |",
        "|---|---|---|---|---|---|---|",
    ]
    for r, new, was in zip(rows, ratios, old, strict=True):
        lines.append(
            f"| {r['model']} | {r['precision']} | {r['checkpointing']} | {r['micro_batch']} | "
            f"{r['traced_rank_bytes'] / MiB:.2f} | {new:+.1%} | {was:+.1%} |"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ddp_from_single.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "ddp_from_single.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines[4:5]))


if __name__ == "__main__":
    main()
