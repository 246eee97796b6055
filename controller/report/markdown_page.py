"""``report.md``: the report as GitHub Markdown, for a terminal or a pull request.

Same content as the HTML page without pictures: header and counts, a summary
table, verdicts, what dry-run would have changed (with ``diff`` blocks), the
decision log (capped at ``MAX_DECISION_ROWS``; report.json has all), limits and
input problems. Text from the audit escapes ``&``, ``<``, ``|`` and newlines.

Example::

    Path("report.md").write_text(render_markdown(audit, summary, rows))

Overhead: linear in transitions and actions.
"""
from __future__ import annotations

from .audit import Audit
from .decisions import dry_run_changes, limit_groups
from .fmt import Clock, compact, duration, pretty
from .summary import HEADLINE_OUTCOMES

MAX_DECISION_ROWS = 300


def cell(value) -> str:
    text = "" if value is None else str(value)
    return (text.replace("&", "&amp;").replace("<", "&lt;")
            .replace("|", "\\|").replace("\r", "").replace("\n", "<br>"))


def table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


def fence(text: str, lang: str = "") -> list[str]:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return [ticks + lang, *text.splitlines(), ticks]


def _header(summary: dict, clock: Clock) -> list[str]:
    c = summary["counts"]
    modes = ", ".join(summary["modes"]) or "unknown"
    if summary["mode_override"]:
        modes += f" (override: {summary['mode_override']})"
    out = ["# reflexarc audit report", ""]
    out += table(["", ""], [
        ["Source", summary["source"]], ["Started", summary["started_at"] or "-"], ["Modes", modes],
        ["Time span", f"{clock.stamp(summary['start'])} – {clock.stamp(summary['end'])} "
                      f"({duration(summary['duration'])})"],
        ["Records", f"{c['records']} ({c['evals']} evaluations)"],
        ["Status", "complete" if summary["complete"] else "**incomplete: no end record**"],
    ])
    counts = [f"transitions {c['transitions']}"] + [f"{o} {c['actions'].get(o, 0)}" for o in HEADLINE_OUTCOMES]
    counts += [f"notified {c['actions'].get('notified', 0)}", f"held back {sum(c['limits'].values())}",
               f"malformed lines {c['malformed']}"]
    out += ["", "**Counts:** " + " · ".join(counts), ""]
    out += [f"> **Warning:** {cell(w)}" + "  " for w in summary["warnings"]]
    return out


def _summary(summary: dict) -> list[str]:
    out = ["", "## Summary", ""]
    if not summary["rules"]:
        return out + ["_no rule was evaluated_"]
    out += table(["Policy", "Rule", "Target", "Mode", "Final state", "Fired", "Actions", "Would act",
                  "First action", "Remediated"],
                 [[r["policy"], r["rule"], r["target"], r["mode"], r["final_state"], r["firings"],
                   " ".join(f"{k}:{v}" for k, v in r["actions"].items()) or "-", r["would_have_acted"],
                   duration(r["first_action_s"]), duration(r["remediated_s"])] for r in summary["rules"]])
    out += ["", "## Verdicts", ""]
    out += [f"- **{cell(r['policy'])} / {cell(r['rule'])}** `{r['target']}`: {cell(r['verdict'])}"
            for r in summary["rules"]]
    return out


def _dry_run(rows: list[dict]) -> list[str]:
    items = dry_run_changes(rows)
    out = ["", "## What dry-run would have changed", ""]
    if not items:
        return out + ["nothing"]
    for r in items:
        out.append(f"- `{r['time']}` **{cell(r['policy'])} / {cell(r['rule'])}** `{r['target']}`: "
                   f"{cell(r['actuator'])} (step {r['step']}) **{cell(r['outcome'])}**"
                   + (f": {cell(r['summary'])}" if r.get("summary") else ""))
        out.append("")
        out += ["  " + line for line in fence("\n".join(r["diff"]) if r.get("has_change")
                                               else pretty(r["params"]), "diff" if r.get("has_change") else "json")]
        out.append("")
    return out


def _decisions(rows: list[dict]) -> list[str]:
    out = ["", "## Decisions", ""]
    if not rows:
        return out + ["_nothing happened_"]
    body = []
    for r in rows[:MAX_DECISION_ROWS]:
        if r["kind"] == "transition":
            event = f"{r['from']} → {r['to']}" + (f" ({r['note']})" if r.get("note") else "")
            change = ""
        else:
            event = f"{r['actuator']} (step {r['step']})" + (f" error: {r['error']}" if r.get("error") else "")
            change = (f"{r['summary'] or ''}\n{compact(r['before'], 80)} → {compact(r['after'], 80)}"
                      if r.get("has_change") else "no change")
        body.append([r["time"], f"{r['policy']} / {r['rule']}", r["target"], event, r.get("trigger") or "",
                     "\n".join(r["evidence_text"]), r.get("mode") or "", r.get("outcome") or "", change])
    out += table(["Time", "Policy / rule", "Target", "Event", "Trigger", "Evidence", "Mode", "Outcome", "Change"],
                 body)
    if len(rows) > MAX_DECISION_ROWS:
        out += ["", f"_{len(rows) - MAX_DECISION_ROWS} more rows are in report.json._"]
    return out


def _limits(audit: Audit, clock: Clock) -> list[str]:
    out = ["", "## Limits hit", ""]
    groups = limit_groups(audit)
    if not groups:
        return out + ["none"]
    return out + table(["Reason", "Policy / rule", "Target", "Times", "First", "Last"],
                       [[g["reason"], f"{g['policy']} / {g['rule']}", g["target"], g["count"],
                         clock.at(g["first"]), clock.at(g["last"])] for g in groups])


def _input_problems(audit: Audit) -> list[str]:
    if not audit.malformed_count and not audit.unknown_kinds:
        return []
    out = ["", "## Input problems", "", f"{audit.malformed_count} malformed line(s) skipped.", ""]
    if audit.malformed:
        out += table(["Line", "Reason", "Text"], [[m["line"], m["reason"], m["text"]] for m in audit.malformed])
    out += [f"- {n} record(s) of unknown kind `{cell(k)}` ignored" for k, n in sorted(audit.unknown_kinds.items())]
    return out


def render_markdown(audit: Audit, summary: dict, rows: list[dict]) -> str:
    clock = Clock(audit.wall_clock)
    lines = (_header(summary, clock) + _summary(summary) + _dry_run(rows) + _decisions(rows)
             + _limits(audit, clock) + _input_problems(audit))
    return "\n".join(lines) + "\n"
