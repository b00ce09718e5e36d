"""What torch.compile does to a step's memory on this machine (issue 14, item 2).

Fake tensors cannot trace inductor's kernels, so the profiler's compile probe
(``profilers.phases_compile``) measures it: after timing the eager and the compiled step side
by side in one child, it runs one more forward+backward of each at both micro-batch sizes and
reads the allocator's peak above the step's start (CPU: the profiler's memory events; CUDA:
the caching allocator's peak counter). The cost model adds compiled minus eager to the eager
trace, never counting a saving (``strategies.cost``, ``_compile_extra_bytes``).

This script runs that very child (``_compile_child``, each in a fresh process, an empty
inductor cache) on the default presets, fp32, seq 128, micro-batch 2 and 8, checkpointing
none and full, and writes ``benchmarks/results/compile_memory.json`` and ``.md``: per group
the eager and compiled transient bytes at each size, their difference, and the probe's
speed-up and cold compile time from the same child. About 45 s per group here.

    python benchmarks/compile_memory.py [--models gpt-tiny,llama-tiny]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from advisor.workload import AdvisorWorkload  # noqa: E402
from profilers.isolate import Isolation, run_isolated  # noqa: E402
from profilers.phases_compile import _compile_child, measurement_from_child  # noqa: E402
from profilers.workload import StepSpec  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MODELS = ("gpt-tiny", "llama-tiny")
MODES = ("none", "full")
SIZES = (2, 8)
SEQ_LEN = 128
TIMING_BUDGET_S = 30.0  # the child's interleaved timing; the peaks come after it


def measure(model: str, checkpointing: str) -> dict[str, Any]:
    workload = AdvisorWorkload(model=model, model_args={})
    specs = [
        StepSpec(seq_len=SEQ_LEN, micro_batch_size=b, activation_checkpointing=checkpointing)
        for b in SIZES
    ]
    outcome = run_isolated(
        Isolation(timeout_s=600), _compile_child, workload, specs, "cpu", TIMING_BUDGET_S
    )
    if not outcome.ok:
        return {"model": model, "checkpointing": checkpointing, "error": outcome.reason}
    m = measurement_from_child("fp32", checkpointing, outcome.value)
    peaks = outcome.value["transient_bytes"]  # per timer: (b0 eager, b0 compiled, b1 ...)
    return {
        "model": model,
        "checkpointing": checkpointing,
        "sizes": list(SIZES),
        "eager_bytes": [peaks[0], peaks[2]],
        "compiled_bytes": [peaks[1], peaks[3]],
        "extra_bytes_by_size": list(m.extra_bytes_by_size),
        "speedup_by_size": list(m.speedup_by_size),
        "compile_s": m.compile_s,
    }


def table_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    mib = 2**20
    lines = [
        "| model | checkpointing | b | eager fwd+bwd peak | compiled | compiled − eager | "
        "speed-up (eager/compiled) | cold compile |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['checkpointing']} | – | {r['error']} | | | | |")
            continue
        for i, b in enumerate(r["sizes"]):
            eager, compiled = r["eager_bytes"][i], r["compiled_bytes"][i]
            lines.append(
                f"| {r['model']} | {r['checkpointing']} | {b} | {eager / mib:.1f} MiB | "
                f"{compiled / mib:.1f} MiB | {(compiled - eager) / mib:+.2f} MiB "
                f"({compiled / eager - 1:+.1%}) | {r['speedup_by_size'][i]:.2f}× | "
                f"{r['compile_s']:.0f} s |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args(argv)
    import torch

    rows = []
    for model in args.models.split(","):
        for mode in MODES:
            print(f"{model} fp32/{mode}: compiling and measuring ...", flush=True)
            rows.append(measure(model, mode))
            print("\n".join(table_lines(rows[-1:])[2:]), flush=True)
    header = (
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"seq {SEQ_LEN}, fp32, one process per group; peaks are the forward+backward "
        "allocator peak above the step's start (CPU: profiler memory events)"
    )
    (RESULTS / "compile_memory.json").write_text(
        json.dumps({"setup": header, "rows": rows}, indent=1) + "\n"
    )
    title = "# torch.compile and a step's memory (this machine)"
    text = [title, "", header, "", *table_lines(rows)]
    (RESULTS / "compile_memory.md").write_text("\n".join(text) + "\n")
    print("\n".join(table_lines(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
