"""benchmarks/large_models.py: its table is re-derived from the committed profiles, plans and
logs, and its readers name what a profile traced and what a recommend planned or why not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import large_models as lm

ROWS = json.loads((lm.RESULTS / "large_models.json").read_text())["rows"]


@pytest.mark.parametrize("row", ROWS, ids=[r["case"] for r in ROWS])
def test_each_committed_row_is_what_its_committed_files_say(row: dict) -> None:
    where = lm.RAW / row["case"]
    summary = lm.probe_summary(where / "profile" / "probes.csv")
    for key in ("status", "single_traces", "rank_traces", "a_budget_row"):
        assert summary[key] == row[key], key
    profile = json.loads((where / "profile" / "profile.json").read_text())
    assert profile["model"]["num_params"] == row["num_params"]
    assert profile["budget_s"] == lm.BUDGET_S == row["budget_s"]
    plan = lm.plan_summary(where / "plan")
    if row["recommend_exit"] == 0:
        assert plan == row["plan"]
    else:  # no plan written; the log holds the one-line reason
        assert plan == {} and row["recommend_error"] in (where / "recommend.log").read_text()
    # The wall time is the one the log recorded.
    assert f"{row['profile_wall_s']:.1f} s]" in (where / "profile.log").read_text()


def test_the_committed_table_is_rendered_from_the_committed_rows() -> None:
    assert (lm.RESULTS / "large_models.md").read_text() == lm.markdown(ROWS)
    # and names every case the script runs, in its order
    assert [r["case"] for r in ROWS] == [c.key for c in lm.CASES]


def test_probe_rows_are_counted_by_group_and_kind(tmp_path: Path) -> None:
    header = "probe,name,status,reason,wall_s,precision,activation_checkpointing\n"
    rows = [
        "memory,bf16/none/b=4,ok,,1,bf16,none",
        "memory,bf16/none/b=8,ok,,1,bf16,none",
        "memory,bf16/none/b=4x2,ok,,1,bf16,none",
        "memory,bf16/full/b=4/lc4,ok,,1,bf16,full",
        "memory,fp32/full/b=4,skipped,time budget spent; --budget-s 300 would cover it,0,fp32,full",
        "memory_distributed,fsdpx2 bf16/full/b=1,ok,,3,bf16,full",
        "memory_distributed,fsdpx2 bf16/full/b=1 kept gathered,ok,,3,bf16,full",
        "memory_distributed,fsdpx2 bf16/none/b=1,error,IndexError,3,bf16,none",
    ]
    (tmp_path / "probes.csv").write_text(header + "\n".join(rows) + "\n")
    s = lm.probe_summary(tmp_path / "probes.csv")
    assert s["status"] == {"ok": 6, "skipped": 1, "error": 1}
    assert s["single_traces"] == {
        "bf16/none": 2,
        "bf16/none accumulating": 1,
        "bf16/full chunked loss": 1,
    }
    assert s["rank_traces"] == {"bf16/full": 1, "bf16/full kept gathered": 1}
    assert "--budget-s 300" in s["a_budget_row"]
    assert lm.traced(s["single_traces"]) == (
        "4: bf16/none; chunked loss: bf16/full; accumulating: bf16/none"
    )
    assert lm.traced({}) == "none"


def test_a_stop_is_told_in_a_few_words() -> None:
    error = (
        "error: nothing fits the memory budget of 72.00 GiB (0.9 × 80.00 GiB of NVIDIA H100): "
        "the smallest candidate (bf16, full checkpointing, fsdp×1024, micro-batch 1 × 4 "
        "accumulation) needs 171.18 GiB; try tensor or expert parallelism (the advisor does not "
        "plan them): 161.4 GiB of each rank do not shrink with more FSDP ranks (a gathered "
        "block, …), so no --world-size fits, or a --target with more memory"
    )
    assert lm._stop(error) == "nothing fits: 171.18 GiB a rank, 161.4 GiB of it unshrinkable"
    assert lm._stop("error: something else") == "something else"
    assert lm._gpus("--target h100-80gb --world-size 64 --nodes 8") == "64 (8 nodes)"
    assert lm._gpus("--target h100-80gb --world-size 8") == "8"
