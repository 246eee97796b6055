"""Audit reports: what the controller saw, decided and changed, as HTML, JSON and Markdown.

Reads an ``audit.jsonl`` (``docs/audit-format.md``) and writes a self-contained
``report.html`` (timelines as inline SVG), a machine-readable ``report.json`` and
a ``report.md`` for terminals and pull requests. ``summarize`` and
``format_summary_table`` give the per-rule summary the CLI prints.

Example::

    from reflexarc.controller.report import write_report, summarize, format_summary_table, load_audit
    paths = write_report("runs/numa/audit.jsonl", "runs/numa")     # {"html": ..., "json": ..., "md": ...}
    print(format_summary_table(summarize(load_audit("runs/numa/audit.jsonl"))))

Overhead: one streaming pass over the audit; about 32 bytes per evaluated condition
in memory; the HTML grows with the plot width, not with the number of evaluations.
"""
from .audit import Audit, load_audit
from .summary import format_summary_table, summarize
from .writer import write_report

__all__ = ["Audit", "format_summary_table", "load_audit", "summarize", "write_report"]
