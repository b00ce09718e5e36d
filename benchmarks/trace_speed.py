"""How long a fake-tensor memory trace takes, with and without each of two savings.

* **global peak only** (``profilers.memory_tracing.GlobalPeakOnly``, 2026-12-06): torch's
  ``MemTracker`` updates, at every op, the peak of every module it has met (for its per-module
  report); the profiler reads only the step's peak, so its trackers skip that walk. "before"
  puts torch's own ``_update_peak_stats`` back.
* **primed first iteration** (``AdvisorStep.prime_optimizer_state``, 2026-12-06): a trace
  runs two iterations and measures the second (the optimizer state must exist); the first is
  now one optimizer step on zero gradients instead of a forward and backward. "before" takes
  the method off the step, so the tracers run the real first iteration. DDP and fp32 FSDP
  ranks keep the real iteration anyway (``memory_distributed._primable``).

Each change is timed with the other in place. Each case is traced both ways, interleaved
(before, after, after, before, ... so a drift of the shared host falls on both); the table
gives the median seconds of each, their ratio, and whether every field of the two traces is
equal (the target: equal, and faster).

Then the cost of a whole-model trace against a scaled one (two shallow copies) at 8, 16 and
32 blocks of llama-tiny, with both: the profiler plans a whole ``blocks:K`` trace at
``L / (k1 + k2)`` scaled ones (``profilers.phases_core.whole_trace_factor``), which must bound
the measured ratio.

    python benchmarks/trace_speed.py     # writes benchmarks/results/trace_speed.{json,md}

Qwen3.5-9B's case needs transformers (``pip install -e '.[hf]'``) and takes most of the
time; ``--quick`` leaves it out.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from advisor.workload import AdvisorWorkload  # noqa: E402
from profilers.workload import StepSpec  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
ROUNDS = 3  # timed runs of each way per case, after one warm-up each
# name, model, model args, seq, micro-batch, precision, checkpointing, parallelism
Case = tuple[str, str, dict[str, Any], int, int, str, str, str]
CASES: list[Case] = [
    ("gpt-tiny", "gpt-tiny", {}, 128, 4, "fp32", "none", "single"),
    ("llama-tiny 5 layers", "llama-tiny", {"n_layer": 5}, 16, 2, "bf16", "none", "single"),
    ("llama-tiny 5 layers", "llama-tiny", {"n_layer": 5}, 16, 2, "bf16", "blocks:2", "single"),
    ("bert-tiny", "bert-tiny", {}, 64, 4, "fp32", "full", "single"),
    ("gpt-tiny", "gpt-tiny", {}, 64, 2, "fp16", "full", "single"),
    ("llama-tiny 8 layers, FSDP rank", "llama-tiny", {"n_layer": 8}, 64, 2, "bf16", "full", "fsdp"),
    ("gpt-tiny, FSDP rank", "gpt-tiny", {}, 64, 2, "fp32", "none", "fsdp"),
]
QWEN: Case = (
    "Qwen3.5-9B (copies of 8 and 12 layers)",
    "hf:qwen3_5_text",
    {},
    4096,
    4,
    "bf16",
    "full",
    "single",
)
CHANGES = {
    "global peak only": "torch's per-op walk of every module's peak, against the step's peak only",
    "primed first iteration": "a real first iteration, against one optimizer step on zero "
    "gradients",
}
VOLATILE = {"trace_seconds"}  # when it was traced and how long it took


def _trace(workload: AdvisorWorkload, spec: StepSpec) -> dict[str, Any]:
    from profilers import memory_distributed as md
    from profilers.memory import trace_step_memory

    if spec.parallelism == "single":
        traced = trace_step_memory(workload, spec, target_device_type="cuda")
    else:
        (traced,) = md.trace_in_this_process(workload, [spec], "cuda")
    return {k: v for k, v in traced.to_dict().items() if k not in VOLATILE}


@contextlib.contextmanager
def _without(change: str) -> Iterator[None]:
    """The code as it was before ``change``."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from advisor.trainer.step import AdvisorStep
    from profilers.memory_tracing import GlobalPeakOnly

    walk = change == "global peak only"
    owner: Any = GlobalPeakOnly if walk else AdvisorStep
    name = "_update_peak_stats" if walk else "prime_optimizer_state"
    ours = owner.__dict__[name]
    if walk:
        owner._update_peak_stats = MemTracker._update_peak_stats
    else:
        delattr(owner, name)  # not primable: the tracers run the real first iteration
    try:
        yield
    finally:
        setattr(owner, name, ours)


def _timed(
    change: str, way: str, workload: AdvisorWorkload, spec: StepSpec
) -> tuple[float, dict[str, Any]]:
    with _without(change) if way == "before" else contextlib.nullcontext():
        started = time.perf_counter()
        fields = _trace(workload, spec)
        return time.perf_counter() - started, fields


def speed_rows(change: str, cases: list[Case]) -> list[dict]:
    print(f"-- {change}", flush=True)
    rows = []
    for name, model, args, seq, micro, precision, ckpt, parallelism in cases:
        workload = AdvisorWorkload(model=model, model_args=args)
        spec = StepSpec(
            seq_len=seq,
            micro_batch_size=micro,
            precision=precision,
            activation_checkpointing=ckpt,
            parallelism=parallelism,
            world_size=2 if parallelism != "single" else 1,
        )
        seconds: dict[str, list[float]] = {"before": [], "after": []}
        fields: dict[str, dict[str, Any]] = {}
        order = ["before", "after"]
        for i in range(ROUNDS + 1):
            for way in order if i % 2 == 0 else order[::-1]:
                wall, traced = _timed(change, way, workload, spec)
                if i:  # the first round warms up both
                    seconds[way].append(wall)
                if fields.setdefault(way, traced) != traced:
                    raise AssertionError(f"{name}: two traces of one way differ")
        before, after = (statistics.median(seconds[w]) for w in ("before", "after"))
        row = {
            "change": change,
            "case": name,
            "precision": precision,
            "checkpointing": ckpt,
            "parallelism": parallelism,
            "before_s": seconds["before"],
            "after_s": seconds["after"],
            "median_before_s": round(before, 3),
            "median_after_s": round(after, 3),
            "speed_up": round(before / after, 2),
            "fields_equal": fields["before"] == fields["after"],
        }
        print(
            f"{name:40s} {precision} {ckpt:9s} {parallelism:6s} "
            f"{before:6.2f} s -> {after:6.2f} s  x{before / after:4.2f}  "
            f"equal={row['fields_equal']}",
            flush=True,
        )
        rows.append(row)
    return rows


def depth_rows() -> list[dict]:
    from profilers.memory_blocks import DepthScaling, trace_scaled
    from profilers.memory_tracing import trace
    from profilers.phases_core import whole_trace_factor

    rows = []
    for layers in (8, 16, 32):
        workload = AdvisorWorkload(model="llama-tiny", model_args={"n_layer": layers})
        whole_spec = StepSpec(
            seq_len=64,
            micro_batch_size=2,
            precision="bf16",
            activation_checkpointing=f"blocks:{layers // 2}",
        )
        scaled_spec = StepSpec(
            seq_len=64, micro_batch_size=2, precision="bf16", activation_checkpointing="full"
        )
        trace(workload, whole_spec, cuda_rounding=True)  # warm-up
        whole_s, scaled_s = [], []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            trace(workload, whole_spec, cuda_rounding=True)
            whole_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            trace_scaled(workload, scaled_spec, cuda_rounding=True, num_layers=layers)
            scaled_s.append(time.perf_counter() - started)
        ratio = statistics.median(whole_s) / statistics.median(scaled_s)
        planned = whole_trace_factor(DepthScaling(layers=layers, prefix=0, period=1, depths=(2, 3)))
        print(
            f"llama-tiny {layers:2d} blocks: whole blocks:{layers // 2} "
            f"{statistics.median(whole_s):.2f} s, scaled {statistics.median(scaled_s):.2f} s, "
            f"x{ratio:.2f} (planned x{planned:.2f})",
            flush=True,
        )
        rows.append(
            {
                "layers": layers,
                "whole_s": whole_s,
                "scaled_s": scaled_s,
                "ratio": round(ratio, 2),
                "planned": planned,
                "bounded": planned >= ratio,
            }
        )
    return rows


def markdown(speed: list[dict], depth: list[dict]) -> str:
    lines = [
        "# Trace speed: each saving against the code without it",
        "",
        "`python benchmarks/trace_speed.py`; medians of "
        f"{ROUNDS} interleaved runs each, after a warm-up; target: every field equal, faster.",
    ]
    for change in CHANGES:
        lines += [
            "",
            f"## {change} ({CHANGES[change]})",
            "",
            "| case | precision | checkpointing | layout | before (s) | after (s) | speed-up | "
            "fields equal |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in speed:
            if r["change"] != change:
                continue
            lines.append(
                f"| {r['case']} | {r['precision']} | {r['checkpointing']} | "
                f"{r['parallelism']} | {r['median_before_s']:.2f} | {r['median_after_s']:.2f} | "
                f"{r['speed_up']:.2f}x | {'yes' if r['fields_equal'] else '**no**'} |"
            )
    lines += [
        "",
        "## A whole-model trace against a scaled one (both savings), llama-tiny, bf16, "
        "2 x 64 tokens",
        "",
        "| blocks | whole blocks:L/2 (s) | scaled full (s) | ratio | planned (L / 5) | bounded |",
        "|---|---|---|---|---|---|",
    ]
    for r in depth:
        lines.append(
            f"| {r['layers']} | {statistics.median(r['whole_s']):.2f} | "
            f"{statistics.median(r['scaled_s']):.2f} | {r['ratio']:.2f}x | {r['planned']:.1f}x | "
            f"{'yes' if r['bounded'] else '**no**'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    quick = "--quick" in sys.argv[1:]
    cases = CASES if quick else [*CASES, QWEN]
    speed = [row for change in CHANGES for row in speed_rows(change, cases)]
    depth = depth_rows()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "trace_speed.json").write_text(
        json.dumps({"speed": speed, "depth": depth}, indent=1) + "\n"
    )
    text = markdown(speed, depth)
    (RESULTS / "trace_speed.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
