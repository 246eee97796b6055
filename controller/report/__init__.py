"""Audit reports: what the controller saw, decided and changed, as HTML, JSON and Markdown.

Reads an ``audit.jsonl`` (``docs/audit-format.md``) and writes a self-contained
``report.html`` (timelines as inline SVG), a machine-readable ``report.json`` and
a ``report.md`` for terminals and pull requests. The pages open with what
happened: each incident (a breach a rule acted on) with the values that fired
it, the action, its verify result and rollback; the targets that never fired
are a count per rule. Several controller runs in one file are reported run by
run. Both pages render one view model (``view.py``) through Jinja2 templates
(``pages.py``, ``templates/``). ``summarize`` and ``format_summary_table`` give
the per-rule summary the CLI prints.

Example::

    from reflexarc.controller.report import write_report, summarize, format_summary_table, load_audit
    paths = write_report("runs/numa/audit.jsonl", "runs/numa")     # {"html": ..., "json": ..., "md": ...}
    print(format_summary_table(summarize(load_audit("runs/numa/audit.jsonl"))))
    paths, summary = write_audit_report(load_audit("runs/numa/audit.jsonl"), "runs/numa")
    write_report("runs/numa/audit.jsonl", "runs/numa", full=True)   # every target's chart, longer tables

Overhead: two streaming passes over the audit (the fold, then the decision log
straight into report.json); in memory about 32 bytes per evaluated condition and
250 per transition, action and limit; the HTML grows with the plot width and the
targets that did something, not with the number of evaluations or of quiet
targets (its tables and charts are capped; ``full=True`` lifts the chart cap).

Several nodes' audits make one report across them (``fleet.py``,
``write_fleet_report``): each node's own report, and a page of the nodes,
their incidents by job and the fleet budget's and rollouts' events.
"""
from .audit import Audit, load_audit
from .fleet import FleetInputError, find_audits
from .summary import format_summary_table, summarize
from .writer import write_audit_report, write_fleet_report, write_report

__all__ = ["Audit", "FleetInputError", "find_audits", "format_summary_table", "load_audit", "summarize",
           "write_audit_report", "write_fleet_report", "write_report"]
