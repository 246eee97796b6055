"""``report.html``: one self-contained page (inline CSS and SVG, no scripts, no fetches).

Read top-down: header (source, modes, span, counts, warnings), one verdict per
rule and target, what dry-run would have changed, a timeline picture per rule
and target, the decision log with evidence and diffs, limits hit, and lines of
the audit that could not be read. Every string from the audit is HTML-escaped.

Example::

    html = render_html(audit, summarize(audit), decisions(audit))
    Path("report.html").write_text(html)

Overhead: linear in transitions and actions, O(width) per condition for the
timelines; the decision table is capped at ``MAX_DECISION_ROWS`` (report.json has all).
"""
from __future__ import annotations

from html import escape

from .audit import Audit
from .decisions import DRY_RUN_OUTCOMES, dry_run_changes, limit_groups
from .fmt import Clock, compact, duration, pretty
from .summary import HEADLINE_OUTCOMES, declared_rules
from .timeline_svg import BASELINE_COLOUR, MARKERS, STATE_COLOURS, THRESHOLD_COLOUR, VALUE_COLOUR, render_timeline

MAX_DECISION_ROWS = 1000
MAX_LIMIT_ROWS = 500
GOOD_STATES = ("ok", "remediated")
BAD_STATES = ("failed", "escalated", "rolled_back")

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#212529;margin:0;background:#f8f9fa}
main{max-width:1320px;margin:0 auto;padding:18px 24px 48px;background:#fff}
h1{font-size:22px;margin:0 0 8px}h2{font-size:18px;margin:28px 0 8px;border-bottom:2px solid #dee2e6}
h3{font-size:15px;margin:18px 0 4px}
table{border-collapse:collapse;width:100%;margin:6px 0}
th,td{border:1px solid #dee2e6;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f1f3f5;font-weight:600}tr:nth-child(even) td{background:#fcfcfd}
.meta td:first-child{width:130px;color:#495057;font-weight:600}
.cards{display:flex;flex-wrap:wrap;gap:8px;margin:10px 0}
.card{border:1px solid #dee2e6;border-radius:6px;padding:6px 12px;min-width:88px}
.card b{display:block;font-size:20px}.card span{color:#495057;font-size:12px}
.warn{background:#fff4e6;border-left:4px solid #e8590c;padding:6px 10px;margin:6px 0}
.good td.verdict{border-left:4px solid #2b8a3e}.bad td.verdict{border-left:4px solid #c92a2a}
.busy td.verdict{border-left:4px solid #e8590c}.quiet td.verdict{border-left:4px solid #adb5bd}
.state{display:inline-block;padding:0 6px;border-radius:3px;font-size:12px;border:1px solid #adb5bd}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;margin:4px 0 8px}
.swatch{display:inline-block;width:14px;height:10px;margin-right:4px;vertical-align:middle;border:1px solid #adb5bd}
.line{display:inline-block;width:22px;margin-right:4px;vertical-align:middle;border-top-width:2px}
.rule-info{font-size:12px;color:#495057;margin:0 0 4px}.rule-info code{color:#212529}
pre{margin:0;font-size:12px;white-space:pre-wrap;word-break:break-word}
pre.diff .add{color:#2b8a3e;background:#ebfbee;display:block}
pre.diff .del{color:#c92a2a;background:#fff5f5;display:block}
pre.diff .ctx{display:block;color:#495057}
code{font-size:12px}.muted{color:#868e96}.nothing{font-style:italic}
td.ev{font-size:12px;max-width:280px;overflow-wrap:anywhere}td.when{white-space:nowrap}td.change{min-width:280px}
.params code{color:#495057;word-break:break-all}
"""


def e(value) -> str:
    return escape("" if value is None else str(value), quote=True)


def state_chip(state) -> str:
    colour = STATE_COLOURS.get(str(state), "#fff")
    return f'<span class="state" style="background:{colour}">{e(state)}</span>'


def diff_html(lines: list[str]) -> str:
    out = []
    for line in lines:
        cls = {"+": "add", "-": "del"}.get(line[:1], "ctx")
        out.append(f'<span class="{cls}">{e(line)}</span>')
    return f'<pre class="diff">{"".join(out)}</pre>'


def _tone(row: dict) -> str:
    if row["actions"].get("failed") or row["final_state"] in BAD_STATES:
        return "bad"
    if row["transitions"] == 0 and not row["actions"]:
        return "quiet"
    if row["final_state"] in GOOD_STATES or row["remediated_s"] is not None:
        return "good"
    return "busy"


def _header(summary: dict, clock: Clock) -> str:
    c = summary["counts"]
    modes = ", ".join(summary["modes"]) or "unknown"
    if summary["mode_override"]:
        modes += f" (override: {summary['mode_override']})"
    status = ("complete" if summary["complete"]
              else '<b style="color:#c92a2a">incomplete: no end record (controller crashed or was killed)</b>')
    meta = [("Source", e(summary["source"])), ("Started", e(summary["started_at"] or "-")),
            ("Modes", e(modes)),
            ("Time span", f"{e(clock.stamp(summary['start']))} – {e(clock.stamp(summary['end']))} "
                          f"({e(duration(summary['duration']))})"),
            ("Records", f"{c['records']} ({c['evals']} evaluations)"), ("Status", status)]
    cards = [("transitions", c["transitions"])] + [(o, c["actions"].get(o, 0)) for o in HEADLINE_OUTCOMES]
    cards += [("notified", c["actions"].get("notified", 0)), ("held back", sum(c["limits"].values())),
              ("malformed lines", c["malformed"])]
    parts = ["<h1>reflexarc audit report</h1>", '<table class="meta">']
    parts += [f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in meta]
    parts.append('</table><div class="cards">')
    parts += [f'<div class="card" data-count="{e(k)}"><b>{v}</b><span>{e(k)}</span></div>' for k, v in cards]
    parts.append("</div>")
    parts += [f'<div class="warn">{e(w)}</div>' for w in summary["warnings"]]
    return "".join(parts)


def _verdicts(summary: dict) -> str:
    if not summary["rules"]:
        return '<h2 id="verdicts">Verdicts</h2><p class="nothing">no rule was evaluated</p>'
    rows = ["<tr><th>Policy</th><th>Rule</th><th>Target</th><th>Mode</th><th>Final state</th>"
            "<th>First action</th><th>Remediated</th><th>Verdict</th></tr>"]
    for r in summary["rules"]:
        rows.append(f'<tr class="{_tone(r)}"><td>{e(r["policy"])}</td><td>{e(r["rule"])}</td>'
                    f'<td><code>{e(r["target"])}</code></td><td>{e(r["mode"])}</td>'
                    f'<td>{state_chip(r["final_state"])}</td><td>{e(duration(r["first_action_s"]))}</td>'
                    f'<td>{e(duration(r["remediated_s"]))}</td><td class="verdict">{e(r["verdict"])}</td></tr>')
    return '<h2 id="verdicts">Verdicts</h2><table class="verdicts">' + "".join(rows) + "</table>"


def _change_cell(row: dict) -> str:
    if not row.get("has_change"):
        return '<span class="muted">no change</span>'
    summary = f"<div>{e(row['summary'])}</div>" if row.get("summary") else ""
    return summary + diff_html(row["diff"])


def _params(params) -> str:
    text = compact(params, limit=10_000)
    return f"<code>{e(text)}</code>" if len(text) <= 60 else f"<pre>{e(pretty(params))}</pre>"


def _dry_run(rows: list[dict]) -> str:
    items = dry_run_changes(rows)
    head = (f'<h2 id="dry-run">What dry-run would have changed</h2><p class="muted">Actions held back by '
            f'dry-run or alert-only mode ({", ".join(DRY_RUN_OUTCOMES)}): {len(items)}.</p>')
    if not items:
        return head + '<p class="nothing" id="dry-run-nothing">nothing</p>'
    out = ['<table class="dry-run"><tr><th>Time</th><th>Policy / rule</th><th>Target</th><th>Action</th>'
           "<th>Outcome</th><th>Params</th><th>Change</th></tr>"]
    for r in items:
        out.append(f'<tr class="dry-run-item" data-outcome="{e(r["outcome"])}"><td class="when">{e(r["time"])}</td>'
                   f'<td>{e(r["policy"])} / {e(r["rule"])}</td><td><code>{e(r["target"])}</code></td>'
                   f'<td>{e(r["actuator"])} (step {e(r["step"])})</td><td>{e(r["outcome"])}</td>'
                   f'<td>{_params(r["params"])}</td><td class="change">{_change_cell(r)}</td></tr>')
    return head + "".join(out) + "</table>"


def _legend() -> str:
    states = "".join(f'<span><i class="swatch" style="background:{c}"></i>{e(s)}</span>'
                     for s, c in STATE_COLOURS.items())
    markers = "".join(f'<span style="color:{colour}">{glyph}</span><span>{e(o)}</span>'
                      for o, (_, colour, _, glyph) in MARKERS.items())
    lines = "".join(f'<span><i class="line" style="border-top:2px {style} {colour}"></i>{name}</span>'
                    for name, colour, style in (("value", VALUE_COLOUR, "solid"),
                                                ("threshold", THRESHOLD_COLOUR, "dashed"),
                                                ("baseline", BASELINE_COLOUR, "dotted")))
    return (f'<div class="legend"><b>States</b>{states}</div><div class="legend"><b>Actions</b>{markers}</div>'
            f'<div class="legend"><b>Lines</b>{lines}</div>')


def _rule_info(rule: dict | None, policy_file: str | None) -> str:
    if not rule:
        return ""
    bits = []
    if rule.get("conditions"):
        bits.append("when " + " and ".join(f"<code>{e(c)}</code>" for c in rule["conditions"]))
    if rule.get("actions"):
        bits.append("then " + " → ".join(f"<code>{e(a)}</code>" for a in rule["actions"]))
    if rule.get("verify"):
        bits.append(f"verify <code>{e(rule['verify'])}</code>")
    if rule.get("rollback"):
        bits.append(f"rollback <code>{e(rule['rollback'])}</code>")
    if policy_file:
        bits.append(f'<span class="muted">{e(policy_file)}</span>')
    return '<p class="rule-info">' + "; ".join(bits) + "</p>"


def _timelines(audit: Audit, summary: dict, clock: Clock) -> str:
    rules = {(p, str(r.get("name"))): r for p, r in declared_rules(audit)}
    files = {str(p.get("name")): p.get("file") for p in (audit.run or {}).get("policies") or ()
             if isinstance(p, dict)}
    out = ['<h2 id="timelines">Timelines</h2>', _legend()]
    for row in summary["rules"]:
        track = audit.tracks[(row["policy"], row["rule"], row["target"])]
        out.append(f'<section class="track"><h3>{e(row["policy"])} / {e(row["rule"])} — '
                   f'<code>{e(row["target"])}</code> {state_chip(row["final_state"])}</h3>')
        out.append(_rule_info(rules.get((row["policy"], row["rule"])), files.get(row["policy"])))
        out.append(render_timeline(track, audit.first_ts, audit.last_ts, clock, audit.complete))
        out.append("</section>")
    if not summary["rules"]:
        out.append('<p class="nothing">no rule was evaluated</p>')
    return "".join(out)


def _event_cell(r: dict) -> str:
    if r["kind"] == "transition":
        note = f'<div class="muted">{e(r["note"])}</div>' if r.get("note") else ""
        return f'{state_chip(r["from"])} → {state_chip(r["to"])}{note}'
    error = f'<div style="color:#c92a2a">{e(r["error"])}</div>' if r.get("error") else ""
    return (f'{e(r["actuator"])} (step {e(r["step"])})<div class="params"><code>{e(compact(r["params"]))}</code></div>'
            f"{error}")


def _decisions(rows: list[dict]) -> str:
    out = [f'<h2 id="decisions">Decisions</h2><p class="muted">{len(rows)} transitions and actions; '
           "an action shows the trigger and evidence of the transition that led to it.</p>"]
    if not rows:
        return out[0] + '<p class="nothing">nothing happened</p>'
    out.append('<table class="decisions"><tr><th>Time</th><th>Policy / rule</th><th>Target</th><th>Event</th>'
               "<th>Trigger</th><th>Evidence</th><th>Mode</th><th>Outcome</th><th>Change</th></tr>")
    for r in rows[:MAX_DECISION_ROWS]:
        evidence = "<br>".join(e(t) for t in r["evidence_text"]) or '<span class="muted">-</span>'
        outcome = e(r.get("outcome")) if r["kind"] == "action" else ""
        change = _change_cell(r) if r["kind"] == "action" else ""
        out.append(f'<tr class="{e(r["kind"])}"><td class="when">{e(r["time"])}</td>'
                   f'<td>{e(r["policy"])} / {e(r["rule"])}</td><td><code>{e(r["target"])}</code></td>'
                   f"<td>{_event_cell(r)}</td><td>{e(r.get('trigger') or '')}</td><td class=\"ev\">{evidence}</td>"
                   f"<td>{e(r.get('mode') or '')}</td><td>{outcome}</td><td class=\"change\">{change}</td></tr>")
    out.append("</table>")
    if len(rows) > MAX_DECISION_ROWS:
        out.append(f'<p class="warn">{len(rows) - MAX_DECISION_ROWS} more rows are in report.json.</p>')
    return "".join(out)


def _limits(audit: Audit, clock: Clock) -> str:
    groups = limit_groups(audit)
    head = f'<h2 id="limits">Limits hit</h2><p class="muted">{len(audit.limits)} action(s) held back.</p>'
    if not groups:
        return head + '<p class="nothing">none</p>'
    out = ['<table class="limits"><tr><th>Reason</th><th>Policy / rule</th><th>Target</th><th>Times</th>'
           "<th>First</th><th>Last</th></tr>"]
    for g in groups[:MAX_LIMIT_ROWS]:
        out.append(f'<tr><td>{e(g["reason"])}</td><td>{e(g["policy"])} / {e(g["rule"])}</td>'
                   f'<td><code>{e(g["target"])}</code></td><td>{g["count"]}</td>'
                   f'<td>{e(clock.at(g["first"]))}</td><td>{e(clock.at(g["last"]))}</td></tr>')
    out.append("</table>")
    return head + "".join(out)


def _input_problems(audit: Audit) -> str:
    if not audit.malformed_count and not audit.unknown_kinds:
        return ""
    out = [f'<h2 id="input">Input problems</h2><p>{audit.malformed_count} malformed line(s) skipped'
           f"{'; first examples:' if audit.malformed else '.'}</p>"]
    if audit.malformed:
        out.append('<table class="malformed"><tr><th>Line</th><th>Reason</th><th>Text</th></tr>')
        out += [f'<tr><td>{e(m["line"])}</td><td>{e(m["reason"])}</td><td><code>{e(m["text"])}</code></td></tr>'
                for m in audit.malformed]
        out.append("</table>")
    for kind, n in sorted(audit.unknown_kinds.items()):
        out.append(f"<p>{n} record(s) of unknown kind <code>{e(kind)}</code> ignored.</p>")
    return "".join(out)


def render_html(audit: Audit, summary: dict, rows: list[dict]) -> str:
    clock = Clock(audit.wall_clock)
    title = f"reflexarc audit: {summary['source']}"
    body = [_header(summary, clock), _verdicts(summary), _dry_run(rows), _timelines(audit, summary, clock),
            _decisions(rows), _limits(audit, clock), _input_problems(audit)]
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(title)}</title><style>{CSS}</style></head><body><main>"
            + "".join(body) + "</main></body></html>\n")
