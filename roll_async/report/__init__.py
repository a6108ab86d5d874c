"""``roll-async report RUN_DIR``: one self-contained HTML page of a run, and a Chrome/Perfetto trace of its timeline.

The page inlines its CSS, JS and data (hand-drawn SVG; no chart library, no
network), so it opens from a file anywhere. See ``data.py`` for what it shows.
"""

from roll_async.report.build import write_report, write_trace
from roll_async.report.data import ReportData, load_report_data

__all__ = ["ReportData", "load_report_data", "write_report", "write_trace"]
