"""The report of a real run in headless Chromium: no console errors, no network request, every
chart drawn. Skips without Debian's ``chromium`` (CI installs it: .ci/run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reports import build_view
from tests.reports.browser import chromium_page, find_chromium, open_report
from tests.reports.runs import real_run

CHROMIUM = find_chromium()
if CHROMIUM is None and os.environ.get("ADVISOR_REQUIRE_CHROMIUM") == "1":
    raise RuntimeError("ADVISOR_REQUIRE_CHROMIUM=1 but no chromium: apt-get install -y chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not installed (apt-get install -y chromium; .ci/run does)",
)


def check_page(report: Path) -> dict[str, object]:
    assert CHROMIUM is not None
    expected = [c.id for c in build_view(report.parent).charts]
    with chromium_page(CHROMIUM) as page:
        state = open_report(page, report)
        errors = page.console_errors()
        requests = page.requests()
    assert errors == []
    # The file itself is the only request: nothing from the network, not even a source map.
    assert [u for u in requests if u != report.resolve().as_uri()] == []
    assert state["failed"] == []
    assert state["drawn"] == expected
    painted = state["painted"]
    assert isinstance(painted, dict)
    assert sorted(painted) == sorted(f"chart-{c}" for c in expected)
    for canvas, info in painted.items():
        assert info["chart"], canvas
        # Axes, labels and data: a drawn chart paints thousands of pixels, a blank one none.
        assert info["pixels"] > 2000, f"{canvas} looks blank: {info}"
    return state


def test_real_run_report_draws_every_chart(tmp_path_factory: pytest.TempPathFactory) -> None:
    out, result = real_run(tmp_path_factory.getbasetemp())
    assert result.exit_code == 0, result.output
    state = check_page(out / "report.html")
    assert {"memory-breakdown", "pareto", "train-loss", "train-lr"} <= set(state["drawn"])  # type: ignore[arg-type]


def test_hand_run_report_draws_every_chart(hand_run: Path) -> None:
    from reports import write_report

    state = check_page(write_report(hand_run))
    assert "comm-busbw" in state["drawn"]  # type: ignore[operator]


def test_hostile_model_spec_runs_no_script(hostile_run: Path) -> None:
    from reports import write_report

    assert CHROMIUM is not None
    report = write_report(hostile_run)
    with chromium_page(CHROMIUM) as page:
        open_report(page, report)
        title = page.evaluate("document.querySelector('h1').textContent")
        injected = page.evaluate("document.querySelectorAll('h1 script, dd script').length")
        assert page.console_errors() == []
    assert title.startswith("x.py:<script>alert(1)</script>")
    assert injected == 0
