"""How much of an audit the pages show: at a glance by default, everything with ``--full``.

Example::

    Detail.DEFAULT.charts      # 12: charts of the targets that did something, the most important first
    Detail.DEFAULT.chart_bytes # and no more than fit in 450 kB of the page
    Detail.FULL.quiet_charts   # True: the targets that never fired get charts too (folded away)

report.json always holds everything; the pages say how much more it has.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Detail:
    incidents: int          # incidents shown in full (the rest are counted per rule and status)
    incidents_per_rule: int # of them, at most this many of one run, rule and status
    charts: int | None      # charts of targets that did something (None: all)
    quiet_charts: bool      # also the targets that never fired (inside a <details>)
    decision_rows: int      # rows of the decision log
    dry_run_rows: int       # held-back actions listed with their diffs
    limit_rows: int         # grouped limit rows
    verdict_rows: int       # verdicts of targets that did something, per run
    chart_bytes: int | None = None      # charts stop once they take this much of the page (None: no limit)
    table_bytes: int | None = None      # so do the dry-run list and the decision log, each
    full: bool = False


# at a glance: the HTML of any audit stays under about 1 MB
Detail.DEFAULT = Detail(incidents=20, incidents_per_rule=3, charts=12, quiet_charts=False, decision_rows=200,
                        dry_run_rows=100, limit_rows=100, verdict_rows=100, chart_bytes=450_000, table_bytes=150_000)
Detail.FULL = Detail(incidents=500, incidents_per_rule=100, charts=None, quiet_charts=True, decision_rows=1000,
                     dry_run_rows=1000, limit_rows=500, verdict_rows=100_000, full=True)
