"""Run directories for the report tests (tests/reports/runs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reports.runs import HOSTILE_MODEL, make_hand_run


@pytest.fixture(scope="module")
def hand_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete run: profile, plan (fake validation), 40 training steps."""
    return make_hand_run(tmp_path_factory.mktemp("hand") / "run")


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete run whose model spec is markup: ``x.py:<script>alert(1)</script>``."""
    return make_hand_run(tmp_path_factory.mktemp("hostile") / "run", model=HOSTILE_MODEL)
