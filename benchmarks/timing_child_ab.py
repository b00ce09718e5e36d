"""Does the profile's own timing child read slower than the accuracy benchmark's truth child?

The profiler-accuracy benchmark found the profile's timings 5-32% slower than the truth's
re-timing of the same sizes minutes later (benchmarks/results/profiler_accuracy_selective_fp32.md,
"drift"). Two parts of the method were ruled out one at a time (``timing_warmup.py``: one
warm-up step against two; ``timing_coresident.py``: two resident sizes against five). This
compares the two children whole, each called exactly as its caller calls it, through the same
``run_isolated`` from one parent, alternating in order (A B, B A, ...):

* ``A`` -- ``profilers.phases_time._timing_child`` (what ``advisor profile`` runs per group): a
  first step at the small size plans the rounds, then sizes 2 and up to 8 interleaved, one
  warm-up step each, within ``--budget-s``;
* ``B`` -- what ``profiler_accuracy.py``'s truth child runs: ``measure_interleaved`` over sizes
  2, 3, 6, 8 and 12, two warm-up steps, five rounds;
* ``T`` -- what a training run is: size 8 alone in its process (two warm-up steps, five timed).

The first runs (``timing_child_ab.log``, before the fix) found A's larger size 5-10% slower than
B's and T's; pinning glibc malloc's thresholds in the timing child
(``profilers.host_allocator``) was the fix, and ``timing_child_ab_fixed.log`` measures it.

Per variant and size (2 and 8): the median over children of each child's median step time.
One OMP thread per process (``OMP_NUM_THREADS=1`` is set before torch is imported); gpt-tiny
fp32, seq 128, checkpointing ``--checkpointing`` (default none).

    python benchmarks/timing_child_ab.py --pairs 6 --out benchmarks/results/timing_child_ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES_B = (2, 3, 6, 8, 12)
REPORTED = (2, 8)
VARIANTS = ("A", "B", "T")


def one_child(variant: str, model: str, checkpointing: str, budget_s: float) -> dict[int, list]:
    """Every timed step (seconds) per size of one fresh child running ``variant``."""
    from advisor.workload import AdvisorWorkload
    from profilers.isolate import Isolation, run_isolated
    from profilers.phases_time import _timing_child
    from profilers.throughput import StepTiming, measure_interleaved
    from profilers.workload import StepSpec

    workload = AdvisorWorkload(model, {}, "synthetic")

    def spec(b: int) -> StepSpec:
        return StepSpec(
            seq_len=128,
            micro_batch_size=b,
            precision="fp32",
            activation_checkpointing=checkpointing,
        )

    if variant == "A":
        outcome = run_isolated(
            Isolation(timeout_s=600), _timing_child, workload, spec(2), 8, "cpu", budget_s
        )
        timings = [StepTiming.from_dict(d) for d in outcome.value] if outcome.ok else []
    else:
        outcome = run_isolated(
            Isolation(timeout_s=600),
            measure_interleaved,
            workload,
            [spec(b) for b in (SIZES_B if variant == "B" else (8,))],
            "cpu",
            rounds=5,
            warmup=2,
        )
        timings = list(outcome.value) if outcome.ok else []
    if not outcome.ok:
        raise SystemExit(f"variant {variant}: the child failed: {outcome.status}: {outcome.reason}")
    return {t.spec.micro_batch_size: list(t.step_s) for t in timings}


def summarize(children: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """Per variant and reported size: the median over children of each child's median."""
    out: dict[str, dict[int, float]] = {}
    for variant in VARIANTS:
        for b in REPORTED:
            medians = [
                statistics.median(c["samples"][b])
                for c in children
                if c["variant"] == variant and b in c["samples"]
            ]
            if medians:
                out.setdefault(variant, {})[b] = statistics.median(medians)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default="gpt-tiny")
    parser.add_argument("--checkpointing", default="none")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--budget-s", type=float, default=22.0, help="the A child's budget")
    parser.add_argument("--out", type=Path, help="write every sample as JSON")
    args = parser.parse_args(argv)
    children: list[dict[str, Any]] = []
    for pair in range(args.pairs):
        for variant in VARIANTS if pair % 2 == 0 else VARIANTS[::-1]:
            started = time.perf_counter()
            samples = one_child(variant, args.model, args.checkpointing, args.budget_s)
            medians = {
                b: round(statistics.median(s), 4) for b, s in samples.items() if b in REPORTED
            }
            print(
                f"pair {pair + 1} {variant}: {time.perf_counter() - started:.0f} s, load "
                f"{os.getloadavg()[0]:.1f}, median step {medians}, samples "
                f"{ {b: len(s) for b, s in samples.items()} }",
                flush=True,
            )
            children.append({"pair": pair + 1, "variant": variant, "samples": samples})
    summary = summarize(children)
    print(f"\nmedian over {args.pairs} children each ({args.model}, fp32, seq 128, 1 thread):")
    labels = {"A": "profile's child", "B": "truth's child", "T": "size 8 alone"}
    for variant in VARIANTS:
        print(
            f"  {variant} ({labels[variant]}): "
            + ", ".join(
                f"b={b} {summary[variant][b]:.4f} s ({summary[variant][b] / summary['A'][b]:.3f}x)"
                for b in REPORTED
                if b in summary[variant]
            )
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "model": args.model,
                    "checkpointing": args.checkpointing,
                    "children": children,
                    "summary": {v: {str(b): s for b, s in m.items()} for v, m in summary.items()},
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    os.environ["OMP_NUM_THREADS"] = "1"  # before torch is imported (in the parent and children)
    raise SystemExit(main())
