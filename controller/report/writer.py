"""Writing the three reports of one audit trail: ``report.html``, ``report.json``, ``report.md``.

Example::

    paths = write_report("runs/numa/audit.jsonl", "runs/numa")
    paths["html"]    # PosixPath('runs/numa/report.html')

``report.json`` holds ``format``, ``summary`` (exactly what ``summarize`` returns),
``decisions`` (every transition and action, uncapped), ``dry_run``, ``limits``
(grouped), ``malformed`` (first examples) and ``unknown_kinds``. Non-finite numbers
become null so any JSON parser reads it.

Overhead: one pass over the audit file, then linear in transitions and actions;
memory about 32 bytes per evaluated condition.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from .audit import Audit, load_audit
from .decisions import decisions, dry_run_changes, limit_groups
from .html_page import render_html
from .markdown_page import render_markdown
from .summary import summarize

FORMAT = "reflexarc-report/1"


def finite(value):
    """``value`` with NaN and infinities replaced by None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def report_data(audit: Audit, summary: dict, rows: list[dict]) -> dict:
    return finite({
        "format": FORMAT, "summary": summary, "decisions": rows, "dry_run": dry_run_changes(rows),
        "limits": limit_groups(audit), "malformed": audit.malformed,
        "unknown_kinds": dict(audit.unknown_kinds),
    })


def write_report(audit_path: str | Path, out_dir: str | Path) -> dict[str, Path]:
    """Read ``audit_path`` and write report.html, report.json and report.md into ``out_dir``."""
    audit = load_audit(audit_path)
    summary = summarize(audit)
    rows = decisions(audit)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"html": out / "report.html", "json": out / "report.json", "md": out / "report.md"}
    paths["html"].write_text(render_html(audit, summary, rows), encoding="utf-8")
    paths["json"].write_text(json.dumps(report_data(audit, summary, rows), indent=1, default=str,
                                        ensure_ascii=False) + "\n", encoding="utf-8")
    paths["md"].write_text(render_markdown(audit, summary, rows), encoding="utf-8")
    return paths
