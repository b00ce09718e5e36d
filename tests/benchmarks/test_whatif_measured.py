"""benchmarks/whatif_measured.py reads the GPU runs that ran alone, and only those."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks import whatif_measured as wm

H200_RUN = wm.RESULTS / "gpu_h200_2026-12-04"


def test_the_committed_h200_run_gives_its_validated_candidates_and_its_plans_training() -> None:
    rows = wm.measured_rows(H200_RUN)
    sources = [r.source.split(": ", 1)[1] for r in rows]
    assert sources == [
        "validated fp32/none/single1/mb32xga1/nw0",
        "validated fp32/blocks:1/single1/mb32xga1/nw0",
        "validated fp32/none/single1/mb16xga2/nw0",
        "train_plan",
    ]
    assert {r.target for r in rows} == {"h200"}
    assert rows[1].config["activation_checkpointing"] == "blocks:1"
    assert rows[2].config["micro_batch_size"] == 16 and rows[2].config["grad_accum_steps"] == 2
    # The training run: the median step after the first three (warm-up), 30 steps in all.
    lines = (H200_RUN / "train_plan/metrics.jsonl").read_text().splitlines()
    train = [json.loads(x) for x in lines]
    steps = sorted(r["step_time_s"] for r in train if r["kind"] == "train")
    assert steps[0] <= rows[3].step_time_s <= steps[-1]
    row = wm.as_row(rows[3])
    assert row.model_args == {"block_size": 1024} and row.target == "h200"


def test_runs_that_shared_the_device_are_left_out(tmp_path: Path) -> None:
    run = tmp_path / "gpu_x"
    for part in ("profile", "train_plan", "train_fsdp_w1", "train_fp16"):
        shutil.copytree(H200_RUN / part, run / part)
    rows = wm.measured_rows(run)
    assert [r.source for r in rows] == ["gpu_x: train_plan"]  # no plan.json: nothing validated
    assert wm.measured_rows(tmp_path / "nothing") == []


def test_a_real_scale_run_is_read_with_the_shape_it_was_built_with(tmp_path: Path) -> None:
    # scripts/gpu_check.sh's real_* runs (an MPT 1B shape at sequence 2048) have not run on a
    # GPU yet: the first time they do, whatif_measured must read them with their model args.
    run = tmp_path / "gpu_x"
    shutil.copytree(H200_RUN / "profile", run / "profile")
    real = run / "real_mpt1b_mb8_none"
    shutil.copytree(H200_RUN / "train_plan", real)
    saved = json.loads((real / "train_config.json").read_text())
    args = {"n_layer": 24, "n_head": 16, "n_embd": 2048, "vocab_size": 50368, "bias": False}
    args["block_size"] = 2048
    saved["config"] |= {
        "model_args": args,
        "seq_len": 2048,
        "precision": "bf16",
        "micro_batch_size": 8,
        "global_batch_size": 8,
    }
    (real / "train_config.json").write_text(json.dumps(saved))
    rows = wm.measured_rows(run)
    assert [r.source for r in rows] == ["gpu_x: real_mpt1b_mb8_none"]
    row = wm.as_row(rows[0])
    assert row.model_args == args and row.seq_len == 2048 and row.precision == "bf16"
    assert row.tokens_per_s_per_gpu == 2048 * 8 / rows[0].step_time_s


def test_the_eager_and_sdpa_runs_of_one_shape_are_compared_as_a_pair() -> None:
    def result(source: str, measured: float, predicted: float) -> dict[str, object]:
        return {
            "source": source,
            "measured_step_time_s": measured,
            "predicted_step_time_s": predicted,
        }

    results = [
        result("gpu_x: real_mpt125m_mb4_sdpa", 0.04, 0.035),
        result("gpu_x: real_mpt125m_mb4_eager", 0.10, 0.1106),
        result("gpu_x: real_mpt1b_mb8_none", 0.5, 0.5),
        result("gpu_y: real_mpt125m_mb4_sdpa", 0.04, 0.03),  # its eager run did not run
    ]
    (pair,) = wm.attention_pairs(results)
    assert pair["pair"] == "gpu_x: real_mpt125m_mb4"
    assert pair["measured_ratio"] == 0.10 / 0.04
    assert pair["predicted_ratio"] == 0.1106 / 0.035
    assert pair["error"] == pair["predicted_ratio"] / pair["measured_ratio"] - 1
