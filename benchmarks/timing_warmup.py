"""Does the profile's timing child read the larger micro-batch slow after one warm-up step?

The profile times two micro-batch sizes interleaved (``profilers.phases_time._timing_child``:
``measure_interleaved(..., warmup=1)``, 1-3 rounds); the profiler-accuracy benchmark's truth
re-times the same sizes with two warm-up steps and five rounds, and found the profile's
timings 5-32% slower (benchmarks/results/profiler_accuracy_selective_fp32.md). This measures
the warm-up alone: each sample is a fresh process (as a timing child is) that times the small
and the large size interleaved with W warm-up steps and R rounds; processes of the variants
alternate, so the host's drift falls on all of them alike. One thread per process (a shared
2-vCPU host). Prints per-variant medians of the large size's median step time and their
ratios; ``--out`` writes the raw samples as JSON.

    python benchmarks/timing_warmup.py --pairs 8 --out benchmarks/results/timing_warmup.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

VARIANTS = {"W1R3": (1, 3), "W2R3": (2, 3)}

_CHILD = """
import json, sys, torch
torch.set_num_threads(1)
from advisor.workload import AdvisorWorkload
from profilers.throughput import measure_interleaved
from profilers.workload import StepSpec
warmup, rounds, model = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
small, large = int(sys.argv[4]), int(sys.argv[5])
w = AdvisorWorkload(model, {}, "synthetic")
specs = [StepSpec(seq_len=128, micro_batch_size=b, precision="fp32") for b in (small, large)]
t = measure_interleaved(w, specs, "cpu", rounds=rounds, warmup=warmup)
print(json.dumps([x.median_step_s for x in t]))
"""


def one_thread_child(code: str, *args: str) -> Any:
    """Run ``code`` in a fresh one-thread interpreter (``python -c code *args``); the JSON it
    prints on its last line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def sample(warmup: int, rounds: int, model: str, small: int, large: int) -> list[float]:
    got: list[float] = one_thread_child(
        _CHILD, str(warmup), str(rounds), model, str(small), str(large)
    )
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=8, help="processes per variant")
    parser.add_argument("--model", default="gpt-tiny")
    parser.add_argument("--sizes", type=int, nargs=2, default=(2, 8))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    small, large = args.sizes
    samples: dict[str, list[list[float]]] = {v: [] for v in VARIANTS}
    for i in range(args.pairs):
        order = list(VARIANTS) if i % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            warmup, rounds = VARIANTS[name]
            got = sample(warmup, rounds, args.model, small, large)
            samples[name].append(got)
            print(
                f"pair {i + 1} {name}: b={small} {got[0]:.4f} s, b={large} {got[1]:.4f} s",
                flush=True,
            )
    medians = {v: [statistics.median(s[k] for s in samples[v]) for k in (0, 1)] for v in VARIANTS}
    base = medians["W1R3"]
    print(f"\nmedian over {args.pairs} processes each ({args.model}, fp32, seq 128, 1 thread):")
    for v, (m_small, m_large) in medians.items():
        print(
            f"  {v}: b={small} {m_small:.4f} s ({m_small / base[0]:.3f}x), "
            f"b={large} {m_large:.4f} s ({m_large / base[1]:.3f}x)"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "model": args.model,
                    "sizes": [small, large],
                    "samples": samples,
                    "medians": medians,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
