"""``advisor recommend``'s table of the best candidates: two rows never look the same."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from advisor.cli.recommend import print_plan
from strategies.config import TrainConfig
from strategies.cost import cost_model_from_profile
from strategies.space import Candidate
from tests.strategies.profiles import SEQ_LEN, hand_profile


def _plan(*candidates: Candidate) -> SimpleNamespace:
    model = cost_model_from_profile(hand_profile(), memory_budget=0.9)
    predicted = model.predict_config(
        TrainConfig(model="gpt-tiny", seq_len=SEQ_LEN, micro_batch_size=4, grad_accum_steps=2)
    )
    first, *rest = candidates
    return SimpleNamespace(
        estimate=False,
        label="",
        validated=[],
        search={"space_size": len(candidates), "mode": "enumerate"},
        candidate=first,
        predicted=predicted,
        alternatives=[SimpleNamespace(candidate=c, prediction=predicted) for c in rest],
        baseline=None,
    )


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # one line per row: rich wraps cells to fit 80


def _table(capsys: pytest.CaptureFixture[str], tmp_path: Path, *candidates: Candidate) -> str:
    print_plan(_plan(*candidates), tmp_path)
    return capsys.readouterr().out


def _header(out: str) -> str:
    return next(line for line in out.splitlines() if "prec" in line)


BASE = Candidate.from_config(
    TrainConfig(model="gpt-tiny", seq_len=SEQ_LEN, micro_batch_size=4, grad_accum_steps=2)
)


def test_rows_that_differ_in_another_knob_show_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    chunked = dataclasses.replace(BASE, loss_chunks=16)
    compiled = dataclasses.replace(BASE, compile=True, num_workers=2)
    out = _table(capsys, tmp_path, BASE, chunked, compiled)
    assert "other" in _header(out)
    rows = [line for line in out.splitlines() if "4×2" in line]
    assert len(rows) == 3 and len(set(rows)) == 3
    assert "16ch" in rows[1] and "2w compiled" in rows[2]


def test_no_other_column_when_no_row_turns_another_knob(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = _table(capsys, tmp_path, BASE, dataclasses.replace(BASE, precision="bf16"))
    assert "other" not in _header(out) and "ckpt" in _header(out)


def _blocks_rows(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> list[str]:
    selective = dataclasses.replace(BASE, activation_checkpointing="blocks:16", loss_chunks=16)
    out = _table(capsys, tmp_path, BASE, selective)
    return [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in out.splitlines()]


def test_a_piped_table_is_as_wide_as_its_cells(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Piped to a log or `tee`: rich would assume 80 columns and cut "blocks:16" to "blocks…".
    monkeypatch.setenv("COLUMNS", "80")
    lines = _blocks_rows(capsys, tmp_path)
    row = next(line for line in lines if "blocks:16" in line)
    assert "16ch" in row and re.search(r"[\d,]+ \([\d,]+–[\d,]+\)", row)
    assert not any("…" in line for line in lines)


def test_a_narrow_terminal_folds_cells_and_never_cuts_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich: a terminal
    monkeypatch.delenv("NO_COLOR", raising=False)
    lines = _blocks_rows(capsys, tmp_path)
    assert max(len(line) for line in lines if "│" in line) <= 60
    assert not any("…" in line for line in lines)
    cells = "".join(line.split("│")[3].strip() for line in lines if line.count("│") > 3)
    assert "blocks:16" in cells  # folded over lines, read back whole


@pytest.mark.parametrize(
    ("screened", "title"),
    [
        (
            {"priced": 4, "fitting": 2, "unpriceable": 56},
            "best of 1 candidates (enumerate): 4 priced, 2 fit",
        ),
        ({"priced": 1, "fitting": 1, "unpriceable": 0}, "best of 1 candidates (enumerate)"),
        (None, "best of 1 candidates (enumerate)"),
    ],
)
def test_the_title_says_how_many_could_be_priced_and_fit(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    screened: dict[str, int] | None,
    title: str,
) -> None:
    """A 40 s gpt-tiny profile prices 4 of a 60-candidate space: "best of 60 candidates"
    alone read as a choice among 60."""
    plan = _plan(BASE)
    if screened is not None:
        plan.search["screened"] = screened
    print_plan(plan, tmp_path)
    first = capsys.readouterr().out.splitlines()[0].strip()
    assert first == title
