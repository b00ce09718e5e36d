"""``advisor recommend``'s table of the best candidates: two rows never look the same."""

from __future__ import annotations

import dataclasses
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
