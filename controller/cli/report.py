"""``reflexarc report AUDIT [AUDIT...] --out DIR``: the HTML, JSON and Markdown
report of an audit log (``controller.report``), and its summary table on
stdout; a file with no audit record in it is refused.

Several audits, or a directory (every ``audit.jsonl`` below it: one node's
each), make one report across the nodes (``report/fleet.py``): DIR/report.html
lists the nodes, their incidents by job and the fleet's budget and breaker
events, and each node's own report is under DIR/nodes/NODE/.

Example::

    reflexarc report /var/lib/reflexarc/audit.jsonl --out out/report
    reflexarc report collected/ --out out/fleet      # collected/NODE/audit.jsonl ...

Overhead: one pass over the audit log, then the pages; for several, one node at a time.
"""
from __future__ import annotations

from pathlib import Path

from reflexarc.core.input_files import check_regular

from .shared import CliError, _output_dir


def cmd_report(args) -> int:
    from reflexarc.controller.report import (FleetInputError, find_audits, format_summary_table, load_audit,
                                             write_audit_report, write_fleet_report)
    try:
        audits = find_audits(args.audit)
    except FleetInputError as exc:
        raise CliError(str(exc)) from None
    out = _output_dir(args.out)
    if len(audits) > 1 or any(Path(path).is_dir() for path in args.audit):
        paths, fold = write_fleet_report(audits, out, full=args.full)
        for node in sorted(fold.nodes, key=lambda n: n.node):
            incidents = sum(node.statuses.values())
            print(f"{node.node}: {node.runs} run(s), {incidents} incident(s), "
                  f"{sum(node.refused.values())} refused change(s) ({node.audit})")
        for kind, path in paths.items():
            print(f"{kind}: {path}")
        return 0
    (path,) = audits
    check_regular(path)
    audit = load_audit(path)
    if audit.record_count == 0:
        first = f" (line {audit.malformed[0]['line']}: {audit.malformed[0]['reason']})" if audit.malformed else ""
        raise CliError(f"{path}: not an audit log: no audit record in its "
                       f"{audit.malformed_count} non-blank line(s){first}")
    paths, summary = write_audit_report(audit, out, full=args.full)
    print(format_summary_table(summary))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0
