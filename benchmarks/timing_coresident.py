"""Does a size time differently beside the other sizes a timing child holds?

The profile's timing child holds two micro-batch sizes (``profilers.phases_time._timing_child``:
the small one and a larger one, interleaved); the profiler-accuracy benchmark's truth child holds
every size of a group at once (2, 3, 6, 8 and 12 for gpt-tiny, round-robin) and re-timed the
probed sizes 5-32% faster than the profile had (benchmarks/results/
profiler_accuracy_selective_fp32.md: "drift"). If a size ran faster beside larger resident
configs (a heap already grown, warmer caches), that "drift" would be the truth's method, not
the host. This measures it: fresh one-thread processes, alternating in order, each timing
gpt-tiny fp32 (seq 128) with ``measure_interleaved`` (two warm-up steps, five rounds) as

* ``pair``: sizes 2 and 8 (what the profile's child holds);
* ``truth``: sizes 2, 3, 6, 8 and 12 (what the accuracy benchmark's truth child holds);
* ``alone8``: size 8 only (what ``advisor train`` runs: one config per process).

Prints each variant's median (over processes) of the per-process median step time at sizes 2
and 8, and the ratios to ``pair``; ``--out`` writes every sample as JSON.

    python benchmarks/timing_coresident.py --pairs 6 --out benchmarks/results/timing_coresident.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

# Run as a script only benchmarks/ is on the path: the repository root makes `benchmarks.`
# importable (a second entry when imported from the tests is harmless).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing_warmup import one_thread_child

VARIANTS = {"pair": (2, 8), "truth": (2, 3, 6, 8, 12), "alone8": (8,)}

_CHILD = """
import json, sys, torch
torch.set_num_threads(1)
from advisor.workload import AdvisorWorkload
from profilers.throughput import measure_interleaved
from profilers.workload import StepSpec
model, sizes = sys.argv[1], [int(b) for b in sys.argv[2].split(",")]
w = AdvisorWorkload(model, {}, "synthetic")
specs = [StepSpec(seq_len=128, micro_batch_size=b, precision="fp32") for b in sizes]
t = measure_interleaved(w, specs, "cpu", rounds=5, warmup=2)
print(json.dumps({x.spec.micro_batch_size: list(x.step_s) for x in t}))
"""


def sample(model: str, sizes: tuple[int, ...]) -> dict[str, list[float]]:
    """One fresh process: every timed step (seconds) per size."""
    got: dict[str, list[float]] = one_thread_child(_CHILD, model, ",".join(map(str, sizes)))
    return got


def summarize(samples: dict[str, list[dict[str, list[float]]]]) -> dict[str, dict[str, float]]:
    """Per variant and size: the median over processes of each process's median step time."""
    out: dict[str, dict[str, float]] = {}
    for variant, processes in samples.items():
        for size in ("2", "8"):
            medians = [statistics.median(p[size]) for p in processes if size in p]
            if medians:
                out.setdefault(variant, {})[size] = statistics.median(medians)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=6, help="processes per variant")
    parser.add_argument("--model", default="gpt-tiny")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    samples: dict[str, list[dict[str, list[float]]]] = {v: [] for v in VARIANTS}
    for i in range(args.pairs):
        order = list(VARIANTS) if i % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            got = sample(args.model, VARIANTS[name])
            samples[name].append(got)
            per_size = {b: round(statistics.median(s), 4) for b, s in got.items()}
            print(f"round {i + 1} {name}: {per_size}", flush=True)
    medians = summarize(samples)
    base = medians["pair"]
    print(f"\nmedian over {args.pairs} processes each ({args.model}, fp32, seq 128, 1 thread):")
    for variant, by_size in medians.items():
        text = ", ".join(f"b={b} {s:.4f} s ({s / base[b]:.3f}x)" for b, s in by_size.items())
        print(f"  {variant}: {text}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"model": args.model, "variants": VARIANTS, "samples": samples}
        args.out.write_text(json.dumps({**record, "medians": medians}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
