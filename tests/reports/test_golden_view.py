"""Golden report: the hand-made run's view (every section's text, tables and chart data) is
byte-identical to the committed one.

A guard for refactors of reports/ that must not change what the page says. Normalised: the
run directory (a temporary path), the search's wall time and the versions of the libraries
rendering the page. The
search's chunk order is seeded so that trial numbers are fixed (see
tests/advisor/test_golden_plan.py). Regenerate on purpose only, with
``ADVISOR_UPDATE_GOLDEN=1``, and say why in the commit message.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from reports.view import build_view
from tests.reports.runs import make_hand_run

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden" / "report"
UPDATE = os.environ.get("ADVISOR_UPDATE_GOLDEN") == "1"
NOW = datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.timezone.utc)


def _dump(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _dump(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _dump(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_dump(v) for v in value]
    return value


def view_text(root: Path) -> str:
    plan_path = root / "plan.json"
    plan = json.loads(plan_path.read_text())
    plan["search"]["wall_s"] = 1.0  # the search's own wall time varies run to run
    plan_path.write_text(json.dumps(plan, indent=1) + "\n")
    view = build_view(root, now=NOW)
    sections = []
    for section in view.sections:
        data = _dump(section)
        data.pop("charts")  # compared through chart_data below
        if section.id == "reproduce":
            data.pop("tables")  # library versions of whoever runs the test
        sections.append(data)
    text = json.dumps(
        {"title": view.title, "sections": sections, "charts": view.chart_data()},
        indent=1,
        sort_keys=True,
        default=str,
    )
    return text.replace(str(root), "RUN") + "\n"


@pytest.fixture
def seeded_enumeration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("strategies.search.random.SystemRandom", lambda: random.Random(0))


@pytest.mark.usefixtures("seeded_enumeration")
def test_the_hand_runs_view_is_byte_identical(tmp_path: Path) -> None:
    text = view_text(make_hand_run(tmp_path / "run"))
    path = GOLDEN / "view.json"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden file {path}: run with ADVISOR_UPDATE_GOLDEN=1 once"
    assert text == path.read_text(), f"the report's view differs from {path}"
