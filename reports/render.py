"""Render a :class:`ReportView` into one self-contained HTML page, and write ``RUN/report.html``.

jinja2 with autoescape on and StrictUndefined: every string from the run files (model specs,
paths, factory strings, reasons) is HTML-escaped by the template, and a missing attribute is an
error, not an empty string. The chart data goes into a ``<script type="application/json">``
block as JSON whose ``<``, ``>`` and ``&`` are written as ``\\u003c`` … so no value can close the
script element. The page's Content-Security-Policy allows only its own inline scripts (by
hash) and no network request at all.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from profilers.rundir import RunDir, write_atomically
from reports.runfiles import load_run
from reports.view import ReportView, build_view

SCRIPTS = ("chart.umd.min.js", "chartjs-plugin-zoom.min.js", "report.js")
_SOURCE_MAP = re.compile(r"//# sourceMappingURL=\S+")
_SCRIPT_CLOSE = re.compile(r"</(script)", re.IGNORECASE)
_JSON_ESCAPES = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


@functools.cache
def _static(name: str) -> str:
    return (resources.files("reports") / "static" / name).read_text(encoding="utf-8")


def inline_script(source: str) -> str:
    """Vendored JavaScript made safe to inline: no source-map fetch, no ``</script`` inside."""
    return _SCRIPT_CLOSE.sub(r"<\\/\1", _SOURCE_MAP.sub("", source))


def script_json(data: Any) -> str:
    """JSON that is safe inside a ``<script>`` element (and valid JSON: no NaN)."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return "".join(_JSON_ESCAPES.get(ch, ch) for ch in text)


def _csp(scripts: list[str]) -> str:
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in scripts
    )
    return (
        f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    )


@functools.cache
def _environment() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.PackageLoader("reports", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(view: ReportView) -> str:
    """The page as one string."""
    from markupsafe import Markup

    scripts = [inline_script(_static(name)) for name in SCRIPTS]
    template = _environment().get_template("report.html.j2")
    return template.render(
        view=view,
        css=Markup(_static("report.css")),
        data=Markup(script_json(view.chart_data())),
        scripts=[Markup(s) for s in scripts],
        csp=_csp(scripts),
    )


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Build and render the report of ``run_dir`` into ``out`` (default RUN/report.html),
    atomically. Raises :class:`reports.runfiles.ReportError` when there is no run."""
    run = load_run(run_dir)
    html = render(build_view(run))
    path = Path(out) if out is not None else RunDir(run.root).report
    path.parent.mkdir(parents=True, exist_ok=True)  # as export does: a new folder is made
    write_atomically(path, html)
    return path
