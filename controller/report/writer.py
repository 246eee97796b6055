"""Writing the three reports of one audit trail: ``report.html``, ``report.json``, ``report.md``.

Example::

    paths = write_report("runs/numa/audit.jsonl", "runs/numa")
    paths["html"]    # PosixPath('runs/numa/report.html')
    paths, summary = write_audit_report(load_audit("runs/numa/audit.jsonl"), "runs/numa")
    paths, fold = write_fleet_report(find_audits(["collected/"]), "out/fleet")   # across nodes (fleet.py)

``report.json`` holds ``format``, ``summary`` (exactly what ``summarize`` returns),
``decisions`` (every transition and action, uncapped, one per line), ``dry_run``,
``incidents`` (every breach a rule acted on or was held back from, as
``incidents.IncidentLog`` closes them, one per line), ``incident_counts`` (by
run and status), ``limits`` (grouped), ``malformed`` (first examples) and
``unknown_kinds``. Non-finite numbers become null so any JSON parser reads it.
It is written as the decision log is read (``decisions.iter_decisions``): the
held-back actions and the incidents wait in temporary files, spilled to disk
past ``SPOOL_BYTES``.

The pages show a share of it that reads at a glance (``Detail.DEFAULT``: the
incidents first, charts only of the targets that did something, capped tables);
``full=True`` (``reflexarc report --full``) draws every target and shows longer
tables (``Detail.FULL``). Each report is
written next to its place and renamed into it, so a reader never sees half a
report and whatever stood at that name (a FIFO too) is replaced, not written into.

Overhead: two passes over the audit file, then linear in transitions and
actions; memory about 32 bytes per evaluated condition and 250 per transition
and action, plus the rows and incidents the pages show.
"""
from __future__ import annotations

import errno
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

from .audit import Audit, load_audit
from .decisions import DecisionLog, iter_decisions, limit_groups
from .detail import Detail
from .incidents import IncidentLog
from .fleet import FleetFold, fleet_json, fleet_view, fold_fleet
from .pages import render_fleet, render_html, render_markdown
from .summary import summarize
from .view import page

FORMAT = "reflexarc-report/2"
FLEET_FORMAT = "reflexarc-fleet-report/1"
SPOOL_BYTES = 8 << 20


def finite(value):
    """``value`` with NaN and infinities replaced by None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def to_json(value) -> str:
    """Strict JSON of ``value``: no NaN or Infinity (they become null)."""
    try:
        return json.dumps(value, allow_nan=False, default=str, ensure_ascii=False)
    except ValueError:                       # a non-finite number somewhere: the slow path
        return json.dumps(finite(value), allow_nan=False, default=str, ensure_ascii=False)


def _light(incident: dict) -> dict:
    """An incident for report.json: its actions without their diffs (the decisions have them)."""
    return {**incident, "actions": [{k: v for k, v in a.items() if k != "diff"} for a in incident["actions"]],
            "rollback": [{k: v for k, v in a.items() if k != "diff"} for a in incident["rollback"]]}


def write_json(fh, audit: Audit, summary: dict, detail: Detail = Detail.DEFAULT,
               on_incident=None) -> tuple[DecisionLog, IncidentLog]:
    """Stream ``report.json`` into ``fh``; what the pages show of the decisions and the incidents comes back.
    ``on_incident(incident)`` is called with each incident as it closes (the report across nodes counts them)."""
    log = DecisionLog(cap=max(detail.decision_rows, detail.dry_run_rows))
    incidents = IncidentLog(audit, keep=detail.incidents, per_rule=detail.incidents_per_rule)
    fh.write(f'{{"format": {to_json(FORMAT)},\n"summary": {to_json(summary)},\n"decisions": [')
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES, mode="w+", encoding="utf-8") as dry_run, \
            tempfile.SpooledTemporaryFile(SPOOL_BYTES, mode="w+", encoding="utf-8") as settled:
        written = 0

        def keep(done: list[dict]) -> None:
            nonlocal written
            for incident in done:
                if on_incident is not None:
                    on_incident(incident)
                settled.write(("\n" if written == 0 else ",\n") + to_json(_light(incident)))
                written += 1

        for row in iter_decisions(audit):
            text = to_json(row)
            fh.write(("\n" if log.total == 0 else ",\n") + text)
            if log.add(row):
                dry_run.write(("\n" if log.dry_run_total == 1 else ",\n") + text)
            keep(incidents.add(row))
        keep(incidents.finish())
        fh.write('\n],\n"dry_run": [')
        dry_run.seek(0)
        shutil.copyfileobj(dry_run, fh)
        fh.write('\n],\n"incidents": [')
        settled.seek(0)
        shutil.copyfileobj(settled, fh)
    counts = {str(run["index"]): incidents.counts(run["index"]) for run in summary["runs"]}
    fh.write(f'\n],\n"incident_counts": {to_json(counts)},\n"limits": {to_json(limit_groups(audit))},\n'
             f'"malformed": {to_json(audit.malformed)},\n"unknown_kinds": {to_json(dict(audit.unknown_kinds))}}}\n')
    return log, incidents


def _replace(path: Path, write):
    """Call ``write(fh)`` on a new file beside ``path``, rename it to ``path``, return what it returned."""
    if path.is_dir():                         # a rename cannot replace it: say so before the work
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            result = write(fh)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return result


def write_audit_report(audit: Audit, out_dir: str | Path, full: bool = False,
                       on_incident=None) -> tuple[dict[str, Path], dict]:
    """Write report.html, report.json and report.md of ``audit`` into ``out_dir``;
    their paths, and the summary. ``full``: every target's chart, longer tables;
    ``on_incident``: see ``write_json``."""
    detail = Detail.FULL if full else Detail.DEFAULT
    summary = summarize(audit)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"html": out / "report.html", "json": out / "report.json", "md": out / "report.md"}
    log, incidents = _replace(paths["json"], lambda fh: write_json(fh, audit, summary, detail, on_incident))
    view = page(audit, summary, log, incidents, detail)
    _replace(paths["html"], lambda fh: fh.write(render_html(view)))
    _replace(paths["md"], lambda fh: fh.write(render_markdown(view)))
    return paths, summary


def write_fleet_report(audits: list[Path], out_dir: str | Path,
                       full: bool = False) -> tuple[dict[str, Path], FleetFold]:
    """Write each trail's report under ``out_dir/nodes/NODE/`` and the fleet's
    report.html, report.json and report.md into ``out_dir`` (``fleet.py``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fold = fold_fleet(audits, out, full, write_audit_report)
    view = fleet_view(fold)
    paths = {"html": out / "report.html", "json": out / "report.json", "md": out / "report.md"}
    _replace(paths["json"], lambda fh: fh.write(to_json({"format": FLEET_FORMAT, **fleet_json(fold)}) + "\n"))
    _replace(paths["html"], lambda fh: fh.write(render_fleet(view, "html")))
    _replace(paths["md"], lambda fh: fh.write(render_fleet(view, "md")))
    return paths, fold


def write_report(audit_path: str | Path, out_dir: str | Path, full: bool = False) -> dict[str, Path]:
    """Read ``audit_path`` and write report.html, report.json and report.md into ``out_dir``."""
    return write_audit_report(load_audit(audit_path), out_dir, full)[0]
