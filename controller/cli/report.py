"""``reflexarc report AUDIT --out DIR``: the HTML, JSON and Markdown report
of an audit log (``controller.report``), and its summary table on stdout; a
file with no audit record in it is refused.

Example::

    reflexarc report /var/lib/reflexarc/audit.jsonl --out out/report

Overhead: one pass over the audit log, then the pages.
"""
from __future__ import annotations

from reflexarc.core.input_files import check_regular

from .shared import CliError, _output_dir


def cmd_report(args) -> int:
    from reflexarc.controller.report import format_summary_table, load_audit, write_audit_report
    check_regular(args.audit)
    out = _output_dir(args.out)
    audit = load_audit(args.audit)
    if audit.record_count == 0:
        first = f" (line {audit.malformed[0]['line']}: {audit.malformed[0]['reason']})" if audit.malformed else ""
        raise CliError(f"{args.audit}: not an audit log: no audit record in its "
                       f"{audit.malformed_count} non-blank line(s){first}")
    paths, summary = write_audit_report(audit, out, full=args.full)
    print(format_summary_table(summary))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0
