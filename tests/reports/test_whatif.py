"""A what-if plan (``advisor recommend --target``) on the page: it was never run on its target,
so the page says what it is planned for, reproduces it with --target, and never compares this
host's training with the target's prediction (audit 42)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from advisor.recommending import recommend
from reports.candidates import pareto_front
from reports.render import render
from reports.view import build_view
from strategies.config import TrainConfig
from strategies.space import SearchRequest
from tests.reports.runs import make_hand_run, write_training

TARGET = "2× NVIDIA H100 SXM5 80GB"


def _whatif(root: Path, *, world_size: int = 2, nodes: int = 1) -> Path:
    make_hand_run(root, plan=False)
    recommend(
        root / "profile.json",
        SearchRequest(global_batch_size=8, target="h100-80gb", world_size=world_size, nodes=nodes),
        out=root,
    )
    return root


@pytest.fixture(scope="module")
def whatif_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _whatif(tmp_path_factory.mktemp("whatif"))


def test_the_page_names_the_target_not_the_profiled_host_as_what_it_plans(
    whatif_run: Path,
) -> None:
    view = build_view(whatif_run)
    assert view.title.startswith(f"gpt-tiny (1.00M params): what-if for {TARGET}")
    assert "profiled on test CPU" in view.title
    headline = " ".join(view.section("summary").lead)
    assert f"What-if for {TARGET}, which this plan was never run on" in headline
    assert "predicted" in headline and "measured" not in headline.replace("measurements", "")
    rows = view.section("summary").tables[0].rows
    assert rows[0][0].text == f"predicted for {TARGET} (cost model)"


def test_a_whatif_is_reproduced_with_its_target_not_by_advisor_run(whatif_run: Path) -> None:
    commands = build_view(whatif_run).commands
    recommend_line = next(s for s in commands.steps if s.startswith("advisor recommend"))
    assert "--target h100-80gb" in recommend_line and "--world-size 2" in recommend_line
    # advisor run has no --target: it would plan (and train) for this host
    assert not commands.run.startswith("advisor run")
    assert commands.run.splitlines()[1] == recommend_line
    code = {c.title: c for c in build_view(whatif_run).section("reproduce").code}
    step_hint = code["Step by step"].hint
    assert f"The train line is for {TARGET}: run it there" in step_hint


def test_a_whatif_over_two_nodes_is_launched_on_two_nodes(tmp_path: Path) -> None:
    root = _whatif(tmp_path / "nodes", world_size=4, nodes=2)
    commands = build_view(root).commands
    recommend_line = next(s for s in commands.steps if s.startswith("advisor recommend"))
    assert "--target h100-80gb" in recommend_line and "--nodes 2" in recommend_line
    assert commands.steps[-1].endswith("--nnodes 2 --node-rank R --rdzv-endpoint NODE0_HOST:29500")
    # no single-node line of 4 ranks for a plan priced over 2 nodes of 2
    assert len(commands.torchrun) == 1
    assert "--nnodes=2 --nproc-per-node=2" in commands.torchrun[0]
    # c10d numbers the nodes itself: torchrun ignores --node-rank there, with a warning
    assert "--node-rank" not in commands.torchrun[0]


def test_an_untrained_whatif_says_where_to_train_it(whatif_run: Path) -> None:
    view = build_view(whatif_run)
    assert view.stages[-1].detail == "none (a what-if plan)"
    note = view.section("training").note
    assert note.startswith(f"No training: this is a what-if plan for {TARGET}. Train it there")


def test_a_whatif_trained_on_this_host_is_not_compared_with_the_targets_prediction(
    tmp_path: Path, whatif_run: Path
) -> None:
    """It read '+74427.9%' throughput error: a CPU's 1,001 tok/s against an H100's 746k."""
    root = tmp_path / "trained"
    shutil.copytree(whatif_run, root)
    config = TrainConfig(**json.loads((root / "plan.json").read_text())["config"])
    write_training(root / "train", config, steps=20, total_steps=20)  # device "cpu"
    view = build_view(root)
    assert [r.role for r in view.validations] == []
    assert view.section("validation").note.startswith("A what-if plan (--target) is never")
    training = view.section("training")
    assert "on this host (cpu)" in training.lead[0]
    for chart in training.charts:
        assert all(s.role != "predicted" for s in chart.series), chart.id
    headline = " ".join(view.section("summary").lead)
    assert f"on this host (cpu), not on {TARGET}" in headline
    rows = view.section("summary").tables[0].rows
    assert rows[-1][0].text.startswith("measured on this host (cpu), not the target")
    memory = view.section("memory")
    assert all(s.role != "measured" for c in memory.charts for s in c.series)
    assert "+74" not in render(view)


def test_a_baseline_outside_the_search_space_still_has_its_row(whatif_run: Path) -> None:
    """D9: the Memory section drew the baseline (fp32 on one GPU) and the speed-ups were taken
    against it, but the Candidates table, holding trials.csv only, had no row of it."""
    view = build_view(whatif_run)
    listed = {r["key"] for r in csv.DictReader((whatif_run / "trials.csv").open())}
    baseline = [r for r in view.trials if r.baseline]
    assert len(baseline) == 1 and baseline[0].key not in listed
    assert not baseline[0].in_space and baseline[0].key == "fp32/none/single1/mb8xga1/nw0"
    assert baseline[0].key in {b.key for b in view.memory_bars}
    section = view.section("candidates")
    table = section.tables[0]
    row = table.rows[table.row_classes.index("baseline")]
    assert [c.text for c in row[1:4]] == ["fp32", "none", "single"]
    assert row[9].text.startswith("not a candidate of this search")
    assert f"{len(listed)} candidates at global batch 8" in section.lead[0]
    assert "is not in the search's space" in section.lead[1]
    assert baseline[0] not in pareto_front(view.trials)


def test_a_whatif_trained_on_another_gpu_is_that_gpus_measurement() -> None:
    """Only the device kind was compared: an H100 plan trained on an A10 was held against the
    H100's prediction."""
    from reports.common import trained_elsewhere

    plan = {
        "estimate": True,
        "label": f"ESTIMATE for {TARGET}: ...",
        "machine": {"kind": "cuda", "name": "NVIDIA H100 SXM5 80GB"},
    }

    def trained(**config: str) -> bool:
        return trained_elsewhere(plan, {"device": "cuda:0", **config})

    assert trained(device_name="NVIDIA A10") is True
    assert trained(device_name="Some Future GPU") is True  # unknown: not the target
    assert trained(device_name="NVIDIA H100 80GB HBM3") is False
    assert trained() is False  # an older train_config.json: its kind alone
    assert trained_elsewhere(plan, {"device": "cpu"}) is True
    assert trained_elsewhere({**plan, "estimate": False}, {"device": "cpu"}) is False


def test_a_profile_traced_for_a_gpu_is_reproduced_so(tmp_path: Path, whatif_run: Path) -> None:
    """The profile line dropped --trace-for cuda: run again, it traced for the CPU and the
    plan priced other memory."""
    root = tmp_path / "cuda"
    shutil.copytree(whatif_run, root)
    line = next(s for s in build_view(root).commands.steps if s.startswith("advisor profile"))
    assert "--trace-for" not in line  # a CPU-traced profile
    profile = json.loads((root / "profile.json").read_text())
    for fit in profile["fits"]["memory"]:
        fit["target_device_type"] = "cuda"
    (root / "profile.json").write_text(json.dumps(profile))
    line = next(s for s in build_view(root).commands.steps if s.startswith("advisor profile"))
    assert "--trace-for cuda" in line
