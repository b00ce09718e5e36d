"""The HTML report: a view model built from run files (compute), then rendered with jinja2.

    load_run(RUN) → RunFiles → build_view → ReportView → render → one self-contained page

Pure: reads files, imports no torch and touches no device.
"""

from reports.render import render, write_report
from reports.runfiles import ReportError, RunFiles, load_run
from reports.view import ReportView, build_view

__all__ = [
    "ReportError",
    "ReportView",
    "RunFiles",
    "build_view",
    "load_run",
    "render",
    "write_report",
]
