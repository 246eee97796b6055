"""``report.md``: the report as GitHub Markdown, for a terminal or a pull request.

The same order as the HTML page without pictures: a header line, **What
happened** first (one entry per incident: policy / rule, target, when, why with
the values that fired it, the rule's ``all`` / ``any`` as written, action,
verify, rollback), then each run's counts, its rules (targets that never fired
folded into one line per rule) and the summary of the targets that did
something, what dry-run would have changed (``diff`` blocks), the decision log
(capped; report.json has all), limits and input problems. Text from the audit
reads as written, comparisons included (``912 < 346``): only what Markdown would
take for markup is escaped, a ``<`` that would open a tag, an ``&`` that would
name an entity, ``|`` and newlines.

Example::

    Path("report.md").write_text(render_markdown(audit, summary, log, incidents))

Overhead: linear in what is shown.
"""
from __future__ import annotations

import re

from .audit import Audit
from .decisions import DecisionLog, limit_groups
from .detail import Detail
from .fmt import Clock, compact, duration, number, pretty
from .html_page import verify_missing, when_events
from .incidents import IncidentLog
from .rules import rule_specs, when_text
from .summary import counts_line, ordered_outcomes, quiet_groups, quiet_line

MAX_DECISION_ROWS = Detail.DEFAULT.decision_rows


_ENTITY = re.compile(r"&(?=#?[A-Za-z0-9]+;)")     # &amp; &#60; ... would render as a character
_TAG = re.compile(r"<(?=[A-Za-z/!?])")              # <script> <!-- ... would render as HTML


def cell(value) -> str:
    text = "" if value is None else str(value)
    text = _TAG.sub("&lt;", _ENTITY.sub("&amp;", text))
    return text.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return out


def fence(text: str, lang: str = "") -> list[str]:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return [ticks + lang, *text.splitlines(), ticks]


def code(text) -> str:
    text = "" if text is None else str(text).replace("\n", " ")
    ticks = "`"
    while ticks in text:
        ticks += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def name_of(value) -> str:
    return str(value) if value else "(not recorded)"


def _span(clock: Clock, start, end, dur) -> str:
    return f"{clock.stamp(start)} – {clock.stamp(end)} ({duration(dur)})"


def _header(summary: dict, clock: Clock) -> list[str]:
    c = summary["counts"]
    runs = summary["runs"]
    status = "complete" if summary["complete"] else "**incomplete: a run has no end record**"
    out = ["# reflexarc audit report", "",
           " · ".join([f"**{cell(summary['source'])}**", f"{len(runs)} run{'s' if len(runs) != 1 else ''}",
                       _span(clock, summary["start"], summary["end"], summary["duration"]),
                       f"{c['records']:,} records ({c['evals']:,} evaluations)", status]), ""]
    out += [f"> **Warning:** {cell(w)}" + "  " for w in summary["file_warnings"]]
    if summary["hands"]:
        out += ["", "By hand, and enforcement held:", ""] + [f"- {cell(h)}" for h in summary["hands"]] + [""]
    return out


# --- what happened ----------------------------------------------------------------
def _value(item: dict | None) -> str:
    if item is None:
        return "not evaluated"
    if item.get("value") is None:
        return "no data"
    text = f"**{number(item['value'])}**"
    if item.get("threshold") is not None:
        text += f" {cell(item.get('op') or 'vs')} {number(item['threshold'])}"
    if item.get("baseline") is not None:
        text += f" (baseline {number(item['baseline'])})"
    return text


def _leaf(text: str, item: dict | None, indent: str) -> str:
    mark = {True: "✓", False: "✗"}.get(item.get("ok") if item else None, "–")
    return f"{indent}- {mark} {code(text)}: {_value(item)}"


def expression_lines(tree, items: list[dict], indent: str) -> list[str]:
    """The expression as written, nested ``all of`` / ``any of`` lists, each condition with its value."""
    evidence = {str(i.get("condition")): i for i in items or () if isinstance(i, dict)}
    if tree is None and len(evidence) == 1:
        tree = next(iter(evidence))
    if tree is None:
        return [f"{indent}- _conditions (the audit does not say how they combine):_"] + \
            [_leaf(text, item, indent + "  ") for text, item in evidence.items()]

    def walk(node, pad: str) -> list[str]:
        if isinstance(node, str):
            return [_leaf(node, evidence.get(node), pad)]
        (kind, children), = node.items()
        return [f"{pad}- **{kind} of**"] + [line for child in children for line in walk(child, pad + "  ")]

    return walk(tree, indent)


def _incident(incident: dict, specs: dict, clock: Clock, n: int) -> list[str]:
    spec = specs.get((incident["run"], incident["policy"], incident["rule"]))
    onset = incident["onset"]
    out = [f"{n}. **{incident['status']}** — **{cell(name_of(incident['policy']))} / "
           f"{cell(name_of(incident['rule']))}** {code(incident['target'])} ({cell(incident.get('mode') or '')})"]
    events = when_events(incident)
    if events:
        when = [f"{clock.at(events[0][0])} {events[0][1]}"] + [f"+{duration(ts - onset)} {what}"
                                                                 for ts, what in events[1:8]]
        out.append("   - When: " + cell(" → ".join(when) + (" …" if len(events) > 8 else "")))
    if incident["fired"] is not None:
        out.append("   - Why:")
        out += expression_lines(spec.when if spec else None, incident["evidence"], "     ")
    else:
        origin = f" (made in run {incident['made_in']['run']})" if incident.get("made_in") else ""
        out.append(f"   - Why: {cell(incident.get('note') or 'an action outside a breach of this rule')}{origin}")
    for a in incident["actions"]:
        bits = f"{cell(a['actuator'])}" + (f" (step {a['step']})" if a.get("step") is not None else "")
        bits += f" **{cell(a['outcome'])}**" + (f": {cell(a['summary'])}" if a.get("summary") else "")
        if a.get("error"):
            bits += f" error: {cell(a['error'])}"
        out.append(f"   - Action: {bits}")
    if incident["held_back"]:
        out.append("   - Held back: " + ", ".join(f"{n_}x {r}" for r, n_ in incident["held_back"].items()))
    v = incident["verify"]
    if v is not None:
        out.append(f"   - Verify: {'verified' if v['ok'] else 'verify failed'} at {clock.at(v['ts'])}"
                   + (f" ({cell(v['note'])})" if v.get("note") else ""))
        out += expression_lines(spec.verify_when if spec else None, v.get("evidence") or [], "     ")
    elif incident["fired"] is not None and incident["actions"]:
        out.append("   - Verify: " + cell(verify_missing(incident, spec)))
    said = {a.get("summary") for a in incident["actions"]}
    for a in incident["rollback"]:
        out.append(f"   - Rollback: **{cell(a['outcome'])}** {cell(a['actuator'] or '')} at {clock.at(a['ts'])}"
                   + (f" ({cell(a['why'])})" if a.get("why") else "")
                   + (f": {cell(a['summary'])}" if a.get("summary") and a["summary"] not in said else ""))
    if incident.get("in_place"):
        out.append("   - Rollback: the change was still in place when the audit ends")
    return out


def _happened(summary: dict, incidents: IncidentLog, specs: dict, clock: Clock, detail: Detail) -> list[str]:
    out = ["", "## What happened", ""]
    counts = incidents.counts()
    quiet = sum(1 for r in summary["rules"] if not r["active"])
    lead = [f"**{n:,} {s}**" for s, n in counts.items()] + ([f"{quiet:,} targets never fired"] if quiet else [])
    if lead:
        out += [" · ".join(lead), ""]
    several = len(summary["runs"]) > 1
    shown = incidents.shown(detail.incidents, detail.incidents_per_rule)
    n = 0
    for run in summary["runs"]:
        items = [i for i in shown if i["run"] == run["index"]]
        if several:
            out += [f"### Run {run['index']} · {run['source']} · {', '.join(run['modes']) or '?'} · "
                    f"{_span(clock, run['start'], run['end'], run['duration'])}", ""]
        for incident in items:
            n += 1
            out += _incident(incident, specs, clock, n)
        if not items and not any(g["run"] == run["index"] for g in incidents.groups.values()):
            out.append("_no rule acted_" if run["counts"]["active_targets"] else "_no rule fired_")
        out.append("")
    rest = incidents.not_shown(shown)
    if rest:
        out += [f"_{sum(g['more'] for g in rest):,} more incidents (all are in report.json):_", ""]
        out += table((["Run"] if several else []) + ["Policy / rule", "Status", "More", "Targets", "First", "Last"],
                     [([g["run"]] if several else []) + [f"{name_of(g['policy'])} / {name_of(g['rule'])}", g["status"],
                      g["more"], g["targets"], clock.at(g["first"]), clock.at(g["last"])] for g in rest])
    if incidents.cleared:
        out += ["", f"_{incidents.cleared:,} breach(es) cleared before the rule acted._"]
    return out


# --- runs -------------------------------------------------------------------------
def _runs(summary: dict, specs: dict, clock: Clock) -> list[str]:
    several = len(summary["runs"]) > 1
    out = ["", "## Runs" if several else "## The run", ""]
    for run in summary["runs"]:
        head = (f"Run {run['index']} · " if several else "") + (
            f"{run['source']} · {', '.join(run['modes']) or '?'}"
            + (" (set by --mode)" if run["mode_override"] else "")
            + f" · {_span(clock, run['start'], run['end'], run['duration'])} · "
            + ("complete" if run["complete"] else "**no end record**"))
        out += [f"### {head}", "", "**Counts:** " + cell(counts_line(run["counts"]))
                + f" · {run['counts']['targets']:,} targets ({run['counts']['active_targets']:,} did something)", ""]
        out += [f"> **Warning:** {cell(w)}" + "  " for w in run["warnings"]]
        rows = [r for r in summary["rules"] if r["run"] == run["index"]]
        quiet = {(g["policy"], g["rule"]): g for g in quiet_groups(rows)}
        keys = list(dict.fromkeys((r["policy"], r["rule"]) for r in rows))
        keys += [k[1:] for k in specs if k[0] == run["index"] and k[1:] not in keys]
        lines = []
        for policy, rule in keys:
            spec = specs.get((run["index"], policy, rule))
            when = (when_text(spec.when) if spec and spec.when is not None
                    else " ; ".join(spec.conditions) if spec else "")
            acted = sum(1 for r in rows if r["active"] and (r["policy"], r["rule"]) == (policy, rule))
            g = quiet.get((policy, rule))
            what = "; ".join(([f"{acted} did something"] if acted else [])
                             + ([quiet_line(g).split(": ", 1)[1]] if g else [])) or "never evaluated"
            lines.append([f"{name_of(policy)} / {name_of(rule)}", spec.mode if spec else "", when, what])
        if lines:
            out += ["", *table(["Policy / rule", "Mode", "When", "Targets"], lines)]
        active = [r for r in rows if r["active"]]
        out += ["", "#### Summary", ""]
        if active:
            out += table(["Policy", "Rule", "Target", "Mode", "Final state", "Fired", "Actions", "Would act",
                          "First action", "Remediated", "Verdict"],
                         [[r["policy"], r["rule"], r["target"], r["mode"], r["final_state"], r["firings"],
                           " ".join(f"{k}:{v}" for k, v in ordered_outcomes(r["actions"])) or "-",
                           r["would_have_acted"], duration(r["first_action_s"]), duration(r["remediated_s"]),
                           r["verdict"]] for r in active])
        else:
            out.append("_no target fired_")
        out.append("")
    return out


def _dry_run(log: DecisionLog, detail: Detail) -> list[str]:
    items = log.dry_run[:detail.dry_run_rows]
    out = ["", "## What dry-run would have changed", ""]
    if not items:
        return out + ["nothing"]
    for r in items:
        out.append(f"- `{r['time']}` **{cell(name_of(r['policy']))} / {cell(name_of(r['rule']))}** `{r['target']}`: "
                   f"{cell(r['actuator'])} (step {r['step']}) **{cell(r['outcome'])}**"
                   + (f": {cell(r['summary'])}" if r.get("summary") else ""))
        out.append("")
        out += ["  " + line for line in fence("\n".join(r["diff"]) if r.get("has_change")
                                               else pretty(r["params"]), "diff" if r.get("has_change") else "json")]
        out.append("")
    if log.dry_run_total > len(items):
        out += [f"_{log.dry_run_total - len(items)} more are in report.json._"]
    return out


def _decisions(log: DecisionLog, several: bool, detail: Detail) -> list[str]:
    out = ["", "## Decisions", ""]
    rows = log.rows[:detail.decision_rows]
    if not rows:
        return out + ["_nothing happened_"]
    body = []
    for r in rows:
        if r["kind"] == "transition":
            event = f"{r['from']} → {r['to']}" + (f" ({r['note']})" if r.get("note") else "")
            change = ""
        else:
            event = f"{r['actuator']} (step {r['step']})" + (f" error: {r['error']}" if r.get("error") else "") \
                + (f" ({r['note']})" if r.get("note") else "")
            change = (f"{r['summary'] or ''}\n{compact(r['before'], 80)} → {compact(r['after'], 80)}"
                      if r.get("has_change") else "no change")
        body.append(([r["run"]] if several else []) + [
            r["time"], f"{name_of(r['policy'])} / {name_of(r['rule'])}", r["target"], event,
            r.get("trigger") or "", "\n".join(r["evidence_text"]), r.get("mode") or "", r.get("outcome") or "", change])
    out += table((["Run"] if several else []) + ["Time", "Policy / rule", "Target", "Event", "Trigger", "Evidence",
                                                 "Mode", "Outcome", "Change"], body)
    if log.total > len(rows):
        out += ["", f"_{log.total - len(rows)} more rows are in report.json._"]
    return out


def _limits(audit: Audit, clock: Clock, detail: Detail) -> list[str]:
    out = ["", "## Limits hit", ""]
    groups = limit_groups(audit)
    if not groups:
        return out + ["none"]
    out += table(["Run", "Reason", "Policy / rule", "Target", "Times", "First", "Last"],
                 [[g["run"], g["reason"], f"{g['policy']} / {g['rule']}", g["target"], g["count"],
                   clock.at(g["first"]), clock.at(g["last"])] for g in groups[:detail.limit_rows]])
    if len(groups) > detail.limit_rows:
        out += ["", f"_{len(groups) - detail.limit_rows} more are in report.json._"]
    return out


def _input_problems(audit: Audit) -> list[str]:
    if not audit.malformed_count and not audit.unknown_kinds:
        return []
    out = ["", "## Input problems", "", f"{audit.malformed_count} malformed line(s) skipped.", ""]
    if audit.malformed:
        out += table(["Line", "Reason", "Text"], [[m["line"], m["reason"], m["text"]] for m in audit.malformed])
    out += [f"- {n} record(s) of unknown kind `{cell(k)}` ignored" for k, n in sorted(audit.unknown_kinds.items())]
    return out


def render_markdown(audit: Audit, summary: dict, log: DecisionLog, incidents: IncidentLog,
                    detail: Detail = Detail.DEFAULT) -> str:
    clock = Clock(audit.wall_clock)
    specs = {(run.index, *key): spec for run in audit.runs for key, spec in rule_specs(run).items()}
    lines = (_header(summary, clock) + _happened(summary, incidents, specs, clock, detail)
             + _runs(summary, specs, clock) + _dry_run(log, detail)
             + _decisions(log, len(audit.runs) > 1, detail) + _limits(audit, clock, detail)
             + _input_problems(audit))
    return "\n".join(lines) + "\n"
