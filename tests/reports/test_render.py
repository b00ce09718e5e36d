"""Rendering: one self-contained page, everything from the user escaped, charts' JSON safe."""

from __future__ import annotations

import base64
import hashlib
import html as html_module
import json
import re
from pathlib import Path

from reports import build_view, render, write_report
from reports.render import SCRIPTS, inline_script, script_json
from tests.reports.runs import HOSTILE_MODEL

SCRIPT_BLOCK = re.compile(r"<script([^>]*)>(.*?)</script>", re.DOTALL)


def _scripts(html: str) -> list[tuple[str, str]]:
    return SCRIPT_BLOCK.findall(html)


def test_hostile_model_spec_is_data_in_the_view_and_text_on_the_page(hostile_run: Path) -> None:
    view = build_view(hostile_run)
    # The view model keeps the user's string as it is: escaping is the renderer's job.
    assert view.title.startswith(HOSTILE_MODEL)
    assert view.summary is not None and view.summary.config["model"] == HOSTILE_MODEL
    assert HOSTILE_MODEL in view.commands.run
    html = render(view)
    assert "<script>alert(1)" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    # Every </script> closes one of the page's own script elements.
    blocks = _scripts(html)
    assert html.count("</script>") == len(blocks) == 1 + len(SCRIPTS)
    attrs, data = blocks[0]
    assert 'type="application/json"' in attrs
    assert HOSTILE_MODEL not in data
    assert json.loads(data)["charts"]  # still valid JSON


def test_hostile_strings_in_chart_data_are_escaped(hostile_run: Path) -> None:
    view = build_view(hostile_run)
    data = view.chart_data()
    # Put the spec where chart JSON carries user text (a tooltip), as a reason would be.
    data["charts"][0]["series"][0]["hover"].append(HOSTILE_MODEL + "\u2028&")
    text = script_json(data)
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == data


def test_shell_commands_quote_the_spec(hostile_run: Path) -> None:
    view = build_view(hostile_run)
    assert f"--model '{HOSTILE_MODEL}'" in view.commands.steps[0]


def test_vendored_scripts_are_inlined_safely() -> None:
    source = "var a = '</script><b>'; //# sourceMappingURL=chart.umd.min.js.map\n"
    out = inline_script(source)
    assert "</script" not in out and "sourceMappingURL" not in out
    assert "<\\/script><b>" in out


def test_page_is_self_contained(hand_run: Path) -> None:
    html = render(build_view(hand_run))
    assert 200_000 < len(html.encode()) < 2_000_000
    # Nothing to fetch: no external script, stylesheet, image, frame or font.
    assert not re.search(r"<(script|img|iframe|link)\b[^>]*\b(src|href)=", html)
    assert "url(" not in html.split("<script")[0]  # CSS loads nothing either
    # The CSP allows exactly the page's inline scripts (by hash) and no connection at all.
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)
    assert csp is not None
    policy = html_module.unescape(csp.group(1))
    assert "default-src 'none'" in policy
    for attrs, body in _scripts(html):
        if "application/json" in attrs:
            continue
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in policy
    for section in (
        "summary",
        "facts",
        "memory",
        "candidates",
        "validation",
        "communication",
        "training",
        "reproduce",
    ):
        assert f'<section id="{section}">' in html
    for chart in build_view(hand_run).charts:
        assert f'<canvas id="chart-{chart.id}"' in html


def test_partial_run_renders_its_notes(tmp_path: Path) -> None:
    from tests.reports.runs import make_hand_run

    root = make_hand_run(tmp_path / "run", plan=False)
    path = write_report(root)
    assert path == root / "report.html"
    html = path.read_text()
    assert "No recommendation yet" in html or "no recommendation yet" in html
    assert "No training yet" in html
    assert not (root / "report.html.tmp").exists()


def test_out_in_a_folder_not_made_yet_is_made(tmp_path: Path) -> None:
    """--out reports/x.html failed naming a hidden temp file; export makes the folder, and so
    does report."""
    from tests.reports.runs import make_hand_run

    root = make_hand_run(tmp_path / "run", plan=False)
    page = tmp_path / "pages" / "2026" / "run.html"
    assert write_report(root, page) == page
    assert "<html" in page.read_text()


def test_the_out_of_advisor_tune_alone_is_a_run_to_report(tmp_path: Path) -> None:
    """advisor tune --out DIR holds tuned_plan.json and tune/ only: 'holds no run files'."""
    import json
    import shutil

    from reports.view import build_view
    from tests.reports.runs import make_hand_run

    root = make_hand_run(tmp_path / "run", steps=None)
    tuned = tmp_path / "tuned"
    (tuned / "tune").mkdir(parents=True)
    plan = json.loads((root / "plan.json").read_text())
    plan["config"]["lr"] = 0.00125
    (tuned / "tuned_plan.json").write_text(json.dumps(plan))
    (tuned / "tune" / "study.json").write_text(json.dumps({"trials_asked": 2}))
    shutil.rmtree(root / "train", ignore_errors=True)
    page = write_report(tuned)
    assert page.is_file()
    summary = build_view(tuned).section("summary")
    assert not summary.note  # the tuned plan is the recommendation shown
    assert any(f.label == "optimizer (tuned)" for f in summary.facts)
