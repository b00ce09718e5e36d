"""benchmarks/compile_accuracy.py's analysis: the cost model's compiled and eager compute against
a truth child's steps, and the summary per tuning / held-out models."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks import compile_accuracy as ca
from profilers.throughput import StepTiming
from profilers.workload import StepSpec
from tests.strategies.test_compile_cost import compiled_profile, measured


def truth(eager_s: float, speedup: float) -> dict[str, Any]:
    """A truth child whose eager steps take ``eager_s`` per sample (+0.01 s optimizer) and whose
    compiled forward+backward is ``speedup`` times faster, at every size."""
    timings = []
    for b in ca.SIZES:
        for compiled in (False, True):
            fb = eager_s * b / (speedup if compiled else 1.0)
            timings.append(
                StepTiming(
                    spec=StepSpec(seq_len=128, micro_batch_size=b, compile=compiled),
                    device="cpu",
                    num_warmup=1,
                    forward_backward_s=(fb, fb, fb),
                    optimizer_s=(0.01, 0.01, 0.01),
                ).to_dict()
            )
    return {"timings": timings, "first_step_s": [1.0] * len(timings)}


def test_compare_reads_the_cost_models_compute_against_the_childs_steps() -> None:
    profile = compiled_profile(measured())  # speed-up 1.5 at b=2, 1.1 at b=8: linear between
    rows = ca.compare(profile, "none", truth(0.05, 1.2))
    assert [r["micro_batch_size"] for r in rows] == list(ca.SIZES)
    by_size = {r["micro_batch_size"]: r for r in rows}
    assert by_size[3]["predicted_speedup"] == pytest.approx(1.5 - 0.4 / 6, rel=1e-6)
    assert by_size[12]["predicted_speedup"] == pytest.approx(1.1, rel=1e-6)  # held beyond 8
    for r in rows:
        assert r["measured_speedup"] == pytest.approx(1.2)
        assert r["measured_eager_s"] == pytest.approx(0.05 * r["micro_batch_size"] + 0.01)
        assert r["predicted_compiled_s"] < r["predicted_eager_s"]
        assert r["rounds"] == 3
    summary = ca.summarize([{"model": "llama-tiny", "groups": [{"rows": rows}]}])
    assert set(summary) == {"held-out"} and summary["held-out"]["configs"] == 3
    speedup = summary["held-out"]["speedup"]
    assert speedup["max_abs"] == pytest.approx(abs(by_size[3]["predicted_speedup"] / 1.2 - 1))
    text = "\n".join(
        ca.summary_lines(summary)
        + ca.table_lines(
            [
                {
                    "model": "llama-tiny",
                    "groups": [
                        {"checkpointing": "none", "rows": rows},
                        {"checkpointing": "full", "reason": "timeout"},
                    ],
                }
            ]
        )
    )
    assert "held-out | 3 |" in text and "| llama-tiny | full | – | timeout |" in text
