"""``report.html``: one self-contained page (inline CSS and SVG, no scripts, no fetches).

Its first screen answers "what happened and why". Read top-down:

1. a one-line header: source, runs, time span, records, status; problems with the file;
2. **What happened**: one card per incident (``incidents.py``), failures,
   escalations and remediations first, then alerts and what dry-run would have
   done: policy / rule, target, when (breach, firing, action, verify, rollback,
   as offsets from the breach), why (the rule's ``when`` as written, ``all`` /
   ``any`` nested, each condition with the value that fired it), the action and
   its summary and outcome, the verify result with its values, the rollback;
   incidents beyond the cap are counted per rule and status;
3. **Runs**: per controller run in the file (each ``run`` ... ``end``): its
   counts in the audit's outcome names, its warnings, one line per rule (the
   targets that never fired folded into a count), and the verdicts of the
   targets that did something;
4. what dry-run would have changed (diffs), 5. timelines (charts of the targets
   that did something; ``--full`` adds the others, folded), 6. the decision log,
   7. limits hit, 8. lines that could not be read.

Every string from the audit is HTML-escaped. The caps come from
``detail.Detail``; report.json has everything.

Example::

    html = render_html(audit, summary, log, incidents)   # a filled DecisionLog and IncidentLog
    Path("report.html").write_text(html)

Overhead: linear in what is shown: O(width) per drawn condition, the capped
tables and cards; the targets that never fired cost a line per rule.
"""
from __future__ import annotations

from html import escape

from .audit import Audit, Track
from .decisions import DRY_RUN_OUTCOMES, DecisionLog, limit_groups
from .detail import Detail
from .fmt import Clock, compact, duration, number, pretty
from .incidents import BAD, DRY, GOOD, IncidentLog, status_rank
from .rules import RuleSpec, rule_specs, when_text
from .summary import OUTCOME_MEANING, ordered_outcomes, quiet_groups, quiet_line
from .timeline_svg import BASELINE_COLOUR, MARKERS, STATE_COLOURS, THRESHOLD_COLOUR, VALUE_COLOUR, render_timeline

MAX_DECISION_ROWS = Detail.DEFAULT.decision_rows
MAX_LIMIT_ROWS = Detail.DEFAULT.limit_rows
MAX_WHEN_ITEMS = 8            # steps of an incident's "when" line
STEP_WORDS = {"pending": "breach", "firing": "fired", "rolled_back": "rolled back"}
QUIET_STEPS = ("acting", "verifying", "cooldown", "ok")    # implied by the actions and results around them
GOOD_STATES = ("ok", "remediated")
BAD_STATES = ("failed", "escalated", "rolled_back")

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#212529;margin:0;background:#f8f9fa}
main{max-width:1320px;margin:0 auto;padding:14px 24px 48px;background:#fff}
h1{font-size:20px;margin:0 0 2px}h2{font-size:18px;margin:22px 0 8px;border-bottom:2px solid #dee2e6}
h3{font-size:15px;margin:16px 0 4px}
.head{color:#495057;margin:0 0 6px}.head b{color:#212529}
table{border-collapse:collapse;width:100%;margin:6px 0}
th,td{border:1px solid #dee2e6;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f1f3f5;font-weight:600}tr:nth-child(even) td{background:#fcfcfd}
.cards{display:flex;flex-wrap:wrap;gap:8px;margin:8px 0}
.card{border:1px solid #dee2e6;border-radius:6px;padding:4px 10px;min-width:70px}
.card b{display:block;font-size:18px}.card span{color:#495057;font-size:12px}
.warn{background:#fff4e6;border-left:4px solid #e8590c;padding:5px 10px;margin:5px 0}
.good td.verdict{border-left:4px solid #2b8a3e}.bad td.verdict{border-left:4px solid #c92a2a}
.busy td.verdict{border-left:4px solid #e8590c}.quiet td.verdict{border-left:4px solid #adb5bd}
.state{display:inline-block;padding:0 6px;border-radius:3px;font-size:12px;border:1px solid #adb5bd}
.lead{font-size:15px;margin:4px 0 8px}
.run-head{font-weight:600;margin:12px 0 6px;color:#343a40}
.incident{border:1px solid #dee2e6;border-left:6px solid #adb5bd;border-radius:6px;padding:8px 12px;margin:8px 0}
.incident.good{border-left-color:#2b8a3e}.incident.bad{border-left-color:#c92a2a}
.incident.dry{border-left-color:#1971c2}.incident.busy{border-left-color:#e8590c}
.incident>header{font-size:15px;margin-bottom:4px}
.status{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;color:#fff;
background:#868e96;margin-right:6px;vertical-align:1px}
.status.good{background:#2b8a3e}.status.bad{background:#c92a2a}.status.dry{background:#1971c2}
.status.busy{background:#e8590c}
.incident dl{display:grid;grid-template-columns:86px 1fr;gap:3px 12px;margin:0}
.incident dt{color:#495057;font-weight:600}.incident dd{margin:0}
.expr{margin:0}.expr ul{list-style:none;margin:0;padding-left:18px}.expr>ul{padding-left:0}
.op{font-weight:600;color:#5f3dc4}.cond .mark{display:inline-block;width:16px;font-weight:700}
.cond.holds .mark{color:#2b8a3e}.cond.fails .mark{color:#c92a2a}.cond.nodata .mark{color:#868e96}
.cond .val{color:#343a40;margin-left:6px}.cond .val b{font-weight:600}
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
details>summary{cursor:pointer;color:#1971c2}
"""


def e(value) -> str:
    return escape("" if value is None else str(value), quote=True)


def name_of(value) -> str:
    """A policy or rule name; an empty one (an old journal entry's) is said to be unknown."""
    return str(value) if value else "(not recorded)"


def state_chip(state) -> str:
    colour = STATE_COLOURS.get(str(state), "#fff")
    return f'<span class="state" style="background:{colour}">{e(state)}</span>'


def tone_of(status: str | None) -> str:
    if status in GOOD:
        return "good"
    if status in BAD:
        return "bad"
    if status in DRY:
        return "dry"
    return "busy"


def diff_html(lines: list[str]) -> str:
    out = []
    for line in lines:
        cls = {"+": "add", "-": "del"}.get(line[:1], "ctx")
        out.append(f'<span class="{cls}">{e(line)}</span>')
    return f'<pre class="diff">{"".join(out)}</pre>'


def _tone(row: dict) -> str:
    if row["actions"].get("failed") or row["final_state"] in BAD_STATES:
        return "bad"
    if not row["active"]:
        return "quiet"
    if row["final_state"] in GOOD_STATES or row["remediated_s"] is not None:
        return "good"
    return "busy"


def _span(clock: Clock, start, end, dur) -> str:
    return f"{clock.stamp(start)} – {clock.stamp(end)} ({duration(dur)})"


# --- header -------------------------------------------------------------------
def _header(summary: dict, clock: Clock) -> str:
    c = summary["counts"]
    runs = summary["runs"]
    status = ("complete" if summary["complete"]
              else '<b style="color:#c92a2a">incomplete: a run has no end record '
                   "(controller crashed or was killed)</b>")
    bits = [f"<b>{e(summary['source'])}</b>", f"{len(runs)} run{'s' if len(runs) != 1 else ''}",
            e(_span(clock, summary["start"], summary["end"], summary["duration"])),
            f"{c['records']:,} records ({c['evals']:,} evaluations)", status]
    out = ["<header>", "<h1>reflexarc audit report</h1>", f'<p class="head">{" · ".join(bits)}</p>']
    out += [f'<div class="warn">{e(w)}</div>' for w in summary["file_warnings"]]
    if summary["hands"]:
        out.append('<p class="head">By hand, and enforcement held:</p><ul>'
                   + "".join(f"<li>{e(h)}</li>" for h in summary["hands"]) + "</ul>")
    out.append("</header>")
    return "".join(out)


# --- what happened ---------------------------------------------------------------
def _value_text(item: dict | None) -> str:
    if item is None:
        return '<span class="val muted">not evaluated</span>'
    value = item.get("value")
    if value is None:
        return '<span class="val muted">no data</span>'
    text = f"<b>{e(number(value))}</b>"
    if item.get("threshold") is not None:
        text += f" {e(item.get('op') or 'vs')} {e(number(item['threshold']))}"
    if item.get("baseline") is not None:
        text += f" (baseline {e(number(item['baseline']))})"
    return f'<span class="val">{text}</span>'


def _leaf(text: str, item: dict | None) -> str:
    ok = item.get("ok") if item else None
    cls, mark = {True: ("holds", "✓"), False: ("fails", "✗")}.get(ok, ("nodata", "–"))
    return f'<li class="cond {cls}"><span class="mark">{mark}</span><code>{e(text)}</code>{_value_text(item)}</li>'


def _tree(tree, evidence: dict[str, dict]) -> str:
    if isinstance(tree, str):
        return _leaf(tree, evidence.get(tree))
    (kind, items), = tree.items()
    inner = "".join(_tree(item, evidence) for item in items)
    return f'<li><span class="op">{e(kind)} of</span><ul>{inner}</ul></li>'


def expression_html(tree, items: list[dict]) -> str:
    """The expression as written (nested ``all`` / ``any``), each condition with its value from ``items``."""
    evidence = {str(i.get("condition")): i for i in items or () if isinstance(i, dict)}
    if tree is None and len(evidence) == 1:
        tree = next(iter(evidence))
    if tree is None:
        leaves = "".join(_leaf(text, item) for text, item in evidence.items())
        return ('<div class="expr"><span class="muted">conditions (the audit does not say how they combine):</span>'
                f"<ul>{leaves}</ul></div>")
    extra = [text for text in evidence if text not in _leaf_texts(tree)]
    more = "".join(_leaf(text, evidence[text]) for text in extra)
    return f'<div class="expr"><ul>{_tree(tree, evidence)}{more}</ul></div>'


def _leaf_texts(tree) -> set[str]:
    if isinstance(tree, str):
        return {tree}
    (_, items), = tree.items()
    return set().union(*(_leaf_texts(i) for i in items))


def when_events(incident: dict) -> list[tuple[float, str]]:
    """(ts, what) of an incident's milestones: breach, firing, each action, the verify result, rollback."""
    events = [(s["ts"], s.get("seq", 0), "verify failed" if (s["from"], s["to"]) == ("verifying", "recovering")
               else STEP_WORDS.get(s["to"], s["to"])) for s in incident["steps"] if s["to"] not in QUIET_STEPS]
    events += [(a["ts"], a.get("seq", 0), f"{a['actuator']} {a['outcome']}")
               for a in incident["actions"] + incident["rollback"]]
    return [(ts, what) for ts, _, what in sorted(events, key=lambda ev: (ev[0], ev[1]))]


def _when_line(incident: dict, clock: Clock) -> str:
    onset = incident["onset"]
    events = when_events(incident)
    if not events:
        return e(clock.at(onset))
    shown = events[:MAX_WHEN_ITEMS]
    parts = [f"<b>{e(clock.at(shown[0][0]))}</b> {e(shown[0][1])}"]
    parts += [f"+{e(duration(ts - onset))} {e(what)}" for ts, what in shown[1:]]
    if len(events) > len(shown):
        parts.append(f"… {len(events) - len(shown)} more")
    return " → ".join(parts)


def _action_html(a: dict, clock: Clock) -> str:
    bits = [f"<b>{e(a['actuator'] or '?')}</b>" + (f" (step {e(a['step'])})" if a.get("step") is not None else ""),
            f'<span class="state">{e(a["outcome"])}</span>']
    if a.get("summary"):
        bits.append(e(a["summary"]))
    if a.get("error"):
        bits.append(f'<span style="color:#c92a2a">{e(a["error"])}</span>')
    if a.get("note"):
        bits.append(f'<span class="muted">({e(a["note"])})</span>')
    text = " ".join(bits)
    if a.get("diff"):
        more = f"\n… {a['diff_lines'] - len(a['diff'])} more lines in report.json" \
            if a["diff_lines"] > len(a["diff"]) else ""
        text += f"<details><summary>change</summary>{diff_html(a['diff'] + ([more] if more else []))}</details>"
    return f"<div>{text}</div>"


def verify_missing(incident: dict, spec: RuleSpec | None) -> str:
    """Why an incident has no verify result."""
    reached = {s["to"] for s in incident["steps"]}
    if spec is not None and not spec.verify:
        return "the rule has no verify condition"
    if "verifying" in reached:
        return "still verifying when the run ended"
    if incident.get("mode") in ("dry-run", "alert-only") and "remediated" in reached:
        return f"not verified: {incident['mode']} changed nothing to verify"
    if "remediated" in reached:
        return "remediated without a verify step"
    return "not verified"


def _verify_html(incident: dict, spec: RuleSpec | None, clock: Clock) -> str:
    v = incident["verify"]
    if v is None:
        return f'<span class="muted">{e(verify_missing(incident, spec))}</span>'
    head = (f'<b style="color:#2b8a3e">verified</b> at {e(clock.at(v["ts"]))} '
            f'(+{e(duration(v["ts"] - incident["onset"]))})'
            if v["ok"] else f'<b style="color:#c92a2a">verify failed</b> at {e(clock.at(v["ts"]))}'
                            + (f": {e(v['note'])}" if v.get("note") else ""))
    tree = spec.verify_when if spec is not None else None
    return head + expression_html(tree, v.get("evidence") or [])


def _rollback_html(incident: dict, spec: RuleSpec | None, clock: Clock) -> str:
    out = []
    said = {a.get("summary") for a in incident["actions"]}
    for a in incident["rollback"]:
        why = f" ({e(a['why'])})" if a.get("why") else ""
        summary = f": {e(a['summary'])}" if a.get("summary") and a["summary"] not in said else ""
        out.append(f"<div><b>{e(a['outcome'])}</b> {e(a['actuator'] or '')} at {e(clock.at(a['ts']))}"
                   f"{why}{summary}</div>")
    if incident.get("in_place"):
        out.append(f"<div>the change was still in place when the audit ends (journal "
                   f"{e(', '.join(incident['in_place']))})</div>")
    if not out:
        taken = any(a["outcome"] in ("applied", "planned") for a in incident["actions"])
        if not taken:
            return ""
        rule = f" (rollback: {e(spec.rollback)})" if spec is not None and spec.rollback else ""
        return f'<span class="muted">none recorded{rule}</span>'
    return "".join(out)


def incident_html(incident: dict, specs: dict, clock: Clock, number_: int) -> str:
    spec = specs.get((incident["run"], incident["policy"], incident["rule"]))
    status = incident["status"]
    tone = tone_of(status)
    head = (f'<header><span class="status {tone}">{e(status)}</span><b>{e(name_of(incident["policy"]))} / '
            f'{e(name_of(incident["rule"]))}</b> <code>{e(incident["target"])}</code> '
            f'<span class="muted">{e(incident.get("mode") or "")}</span></header>')
    rows = [("When", _when_line(incident, clock))]
    if incident["fired"] is not None:
        rows.append(("Why", expression_html(spec.when if spec else None, incident["evidence"])))
    else:
        origin = ""
        if incident.get("made_in"):
            origin = f" (made in run {incident['made_in']['run']} at {e(clock.at(incident['made_in']['ts']))})"
        rows.append(("Why", f"{e(incident.get('note') or 'an action outside a breach of this rule')}{origin}"))
    if incident["actions"]:
        acts = "".join(_action_html(a, clock) for a in incident["actions"])
        if incident["more_actions"]:
            acts += f'<div class="muted">… {incident["more_actions"]} more actions (report.json)</div>'
        rows.append(("Action", acts))
    if incident["held_back"]:
        rows.append(("Held back", e(", ".join(f"{n}x {r}" for r, n in incident["held_back"].items()))))
    if incident["fired"] is not None and any(a["outcome"] not in ("notified",) for a in incident["actions"]):
        rows.append(("Verify", _verify_html(incident, spec, clock)))
    rollback = _rollback_html(incident, spec, clock)
    if rollback:
        rows.append(("Rollback", rollback))
    body = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    return (f'<article class="incident {tone}" id="incident-{number_}" data-status="{e(status)}" '
            f'data-run="{incident["run"]}">{head}<dl>{body}</dl></article>')


def _specs(audit: Audit) -> dict[tuple[int, str, str], RuleSpec]:
    return {(run.index, *key): spec for run in audit.runs for key, spec in rule_specs(run).items()}


def _headline(counts: dict[str, int], quiet: int) -> str:
    if not counts and not quiet:
        return ""
    parts = [f'<span class="status {tone_of(s)}">{n:,} {e(s)}</span>' for s, n in counts.items()]
    if quiet:
        parts.append(f'<span class="muted">{quiet:,} target{"s" if quiet != 1 else ""} never fired</span>')
    return f'<p class="lead">{" ".join(parts)}</p>'


def _happened(summary: dict, incidents: IncidentLog, specs: dict, clock: Clock, detail: Detail) -> str:
    shown = incidents.shown(detail.incidents, detail.incidents_per_rule)
    several = len(summary["runs"]) > 1
    quiet = sum(1 for r in summary["rules"] if not r["active"])
    out = ['<section id="what-happened"><h2>What happened</h2>', _headline(incidents.counts(), quiet)]
    by_run: dict[int, list[dict]] = {}
    for incident in shown:
        by_run.setdefault(incident["run"], []).append(incident)
    n = 0
    for run in summary["runs"]:
        items = by_run.get(run["index"], [])
        if several:
            out.append(f'<div class="run-head" id="happened-run-{run["index"]}">Run {run["index"]} · '
                       f'{e(run["source"])} · {e(", ".join(run["modes"]) or "?")} · '
                       f'{e(_span(clock, run["start"], run["end"], run["duration"]))}'
                       f'{"" if run["complete"] or not run["has_run_record"] else " · no end record"}</div>')
        for incident in items:
            n += 1
            out.append(incident_html(incident, specs, clock, n))
        if not items and not any(g["run"] == run["index"] for g in incidents.groups.values()):
            acted = run["counts"]["active_targets"]
            what = ("no rule fired" if not acted else
                    "rules changed state but never acted or were held back")
            out.append(f'<p class="nothing">{what}{" in this run" if several else ""}.</p>')
    rest = incidents.not_shown(shown)
    if rest:
        out.append(f'<p class="muted">{sum(g["more"] for g in rest):,} more incidents, by rule and how they '
                   "ended (all are in report.json"
                   + ("" if detail.full else "; <code>reflexarc report --full</code> shows more here") + "):</p>")
        out.append('<table class="more-incidents"><tr>' + ("<th>Run</th>" if several else "")
                   + "<th>Policy / rule</th><th>Status</th><th>More</th><th>Targets</th><th>First</th>"
                   "<th>Last</th></tr>")
        for g in rest:
            out.append("<tr>" + (f"<td>{g['run']}</td>" if several else "")
                       + f"<td>{e(name_of(g['policy']))} / {e(name_of(g['rule']))}</td>"
                       f'<td><span class="status {tone_of(g["status"])}">{e(g["status"])}</span></td>'
                       f"<td>{g['more']:,}</td><td>{g['targets']:,}</td><td>{e(clock.at(g['first']))}</td>"
                       f"<td>{e(clock.at(g['last']))}</td></tr>")
        out.append("</table>")
    if incidents.cleared:
        out.append(f'<p class="muted">{incidents.cleared:,} breach{"es" if incidents.cleared != 1 else ""} cleared '
                   "before the rule acted.</p>")
    out.append("</section>")
    return "".join(out)


# --- runs -----------------------------------------------------------------------
def _cards(c: dict) -> str:
    cards = [("transitions", c["transitions"], "state changes of the rules")]
    cards += [(o, n, OUTCOME_MEANING.get(o, "")) for o, n in ordered_outcomes(c["actions"])]
    held = sum(c["limits"].values())
    if held:
        cards.append(("held back", held, "actions kept back by limits: " +
                      ", ".join(f"{n}x {r}" for r, n in c["limits"].items())))
    cards.append(("targets", c["targets"], f"{c['active_targets']} did something"))
    if c["retired"]:
        cards.append(("gone", c["retired"], "targets retired: their series stopped"))
    if c["errors"]:
        cards.append(("errors", c["errors"], "rule runs that raised"))
    return ('<div class="cards">' + "".join(
        f'<div class="card" data-count="{e(k)}" title="{e(t)}"><b>{v:,}</b><span>{e(k)}</span></div>'
        for k, v, t in cards) + "</div>")


def _rule_lines(summary_rows: list[dict], run_index: int, specs: dict) -> str:
    rows = [r for r in summary_rows if r["run"] == run_index]
    quiet = {(g["policy"], g["rule"]): g for g in quiet_groups(rows)}
    order = list(dict.fromkeys((r["policy"], r["rule"]) for r in rows))
    declared = [key[1:] for key in specs if key[0] == run_index]
    order += [k for k in declared if k not in order]
    if not order:
        return '<p class="nothing">no rule was evaluated</p>'
    out = ['<table class="rules"><tr><th>Policy / rule</th><th>Mode</th><th>When</th><th>Targets</th></tr>']
    for policy, rule in order:
        spec = specs.get((run_index, policy, rule))
        acted = sum(1 for r in rows if r["active"] and (r["policy"], r["rule"]) == (policy, rule))
        g = quiet.get((policy, rule))
        bits = []
        if acted:
            bits.append(f"{acted} did something (below)")
        if g:
            bits.append(e(quiet_line(g).split(": ", 1)[1]))
        if not bits:
            bits.append('<span class="muted">never evaluated</span>')
        when = e(when_text(spec.when)) if spec and spec.when is not None else \
            e(" ; ".join(spec.conditions)) if spec else ""
        mode = spec.mode if spec else next((r["mode"] for r in rows if (r["policy"], r["rule"]) == (policy, rule)), "?")
        out.append(f'<tr class="rule-line" data-quiet="{g["targets"] if g else 0}"><td>{e(name_of(policy))} / '
                   f'{e(name_of(rule))}</td><td>{e(mode)}</td><td><code>{when}</code></td>'
                   f'<td>{"; ".join(bits)}</td></tr>')
    out.append("</table>")
    return "".join(out)


def _verdicts(rows: list[dict], cap: int) -> str:
    active = [r for r in rows if r["active"]]
    if not active:
        return ""
    more = len(active) - cap
    active = active[:cap]
    out = ['<table class="verdicts"><tr><th>Policy</th><th>Rule</th><th>Target</th><th>Mode</th><th>Final state</th>'
           "<th>First action</th><th>Remediated</th><th>Verdict</th></tr>"]
    for r in active:
        out.append(f'<tr class="{_tone(r)}"><td>{e(name_of(r["policy"]))}</td><td>{e(name_of(r["rule"]))}</td>'
                   f'<td><code>{e(r["target"])}</code></td><td>{e(r["mode"])}</td>'
                   f'<td>{state_chip(r["final_state"])}</td><td>{e(duration(r["first_action_s"]))}</td>'
                   f'<td>{e(duration(r["remediated_s"]))}</td><td class="verdict">{e(r["verdict"])}</td></tr>')
    out.append("</table>")
    if more > 0:
        out.append(f'<p class="muted">{more:,} more targets did something: report.json has their verdicts.</p>')
    return "".join(out)


def _runs(summary: dict, specs: dict, clock: Clock, detail: Detail) -> str:
    several = len(summary["runs"]) > 1
    out = ['<section id="runs"><h2>' + ("Runs" if several else "The run") + "</h2>"]
    for run in summary["runs"]:
        head = (f"Run {run['index']} · " if several else "") + (
            f"{run['source']} · {', '.join(run['modes']) or '?'}"
            + (" (set by --mode)" if run["mode_override"] else "")
            + f" · {_span(clock, run['start'], run['end'], run['duration'])} · "
            + ("complete" if run["complete"] else "no end record"))
        if run["started_at"]:
            head += f" · started {run['started_at']}"
        out.append(f'<div class="run" id="run-{run["index"]}" data-run="{run["index"]}">'
                   f'<h3>{e(head)}</h3>{_cards(run["counts"])}')
        out += [f'<div class="warn">{e(w)}</div>' for w in run["warnings"]]
        for reload in run["reloads"]:
            what = "; ".join(f"{k} {', '.join(reload[k])}" for k in ("added", "removed", "changed") if reload.get(k))
            out.append(f'<p class="muted">policies reloaded at {e(clock.at(reload["ts"]))} ({e(reload["reason"])}): '
                       f'{e(reload["outcome"])}{": " + e(what) if what else ""}</p>')
        rows = [r for r in summary["rules"] if r["run"] == run["index"]]
        out.append(_rule_lines(summary["rules"], run["index"], specs))
        out.append(_verdicts(rows, detail.verdict_rows))
        out.append("</div>")
    out.append("</section>")
    return "".join(out)


# --- the rest ---------------------------------------------------------------------
def _change_cell(row: dict) -> str:
    if not row.get("has_change"):
        return '<span class="muted">no change</span>'
    summary = f"<div>{e(row['summary'])}</div>" if row.get("summary") else ""
    return summary + diff_html(row["diff"])


def _params(params) -> str:
    text = compact(params, limit=10_000)
    return f"<code>{e(text)}</code>" if len(text) <= 60 else f"<pre>{e(pretty(params))}</pre>"


def _dry_run(log: DecisionLog, detail: Detail) -> str:
    items = log.dry_run[:detail.dry_run_rows]
    head = (f'<h2 id="dry-run">What dry-run would have changed</h2><p class="muted">Actions held back by '
            f'dry-run or alert-only mode ({", ".join(DRY_RUN_OUTCOMES)}): {log.dry_run_total}.</p>')
    if not items:
        return head + '<p class="nothing" id="dry-run-nothing">nothing</p>'
    out = ['<table class="dry-run"><tr><th>Time</th><th>Policy / rule</th><th>Target</th><th>Action</th>'
           "<th>Outcome</th><th>Params</th><th>Change</th></tr>"]
    shown = _budgeted(out, (f'<tr class="dry-run-item" data-outcome="{e(r["outcome"])}"><td class="when">'
                            f'{e(r["time"])}</td><td>{e(name_of(r["policy"]))} / {e(name_of(r["rule"]))}</td>'
                            f'<td><code>{e(r["target"])}</code></td><td>{e(r["actuator"])} (step {e(r["step"])})</td>'
                            f'<td>{e(r["outcome"])}</td><td>{_params(r["params"])}</td>'
                            f'<td class="change">{_change_cell(r)}</td></tr>' for r in items), detail.table_bytes)
    out.append("</table>")
    if log.dry_run_total > shown:
        out.append(f'<p class="warn">{log.dry_run_total - shown} more are in report.json.</p>')
    return head + "".join(out)


def _legend() -> str:
    states = "".join(f'<span><i class="swatch" style="background:{c}"></i>{e(s)}</span>'
                     for s, c in STATE_COLOURS.items())
    markers = "".join(f'<span style="color:{colour}">{glyph}</span><span>{e(o)}</span>'
                      for o, (_, colour, _, glyph) in MARKERS.items())
    lines = "".join(f'<span><i class="line" style="border-top:2px {style} {colour}"></i>{name}</span>'
                    for name, colour, style in (("value (holds until the next evaluation)", VALUE_COLOUR, "solid"),
                                                ("threshold", THRESHOLD_COLOUR, "dashed"),
                                                ("baseline", BASELINE_COLOUR, "dotted")))
    return (f'<div class="legend"><b>States</b>{states}</div><div class="legend"><b>Actions</b>{markers}</div>'
            f'<div class="legend"><b>Lines</b>{lines}</div>')


def _rule_info(spec: RuleSpec | None) -> str:
    if spec is None:
        return ""
    bits = []
    if spec.when is not None:
        bits.append(f"when <code>{e(when_text(spec.when))}</code>")
    elif spec.conditions:
        bits.append("conditions " + "; ".join(f"<code>{e(c)}</code>" for c in spec.conditions)
                    + ' <span class="muted">(how they combine is not recorded)</span>')
    if spec.actions:
        bits.append("then " + " → ".join(f"<code>{e(a)}</code>" for a in spec.actions))
    if spec.verify:
        bits.append(f"verify <code>{e(spec.verify)}</code>")
    if spec.rollback:
        bits.append(f"rollback <code>{e(spec.rollback)}</code>")
    if spec.file:
        bits.append(f'<span class="muted">{e(spec.file)}</span>')
    return '<p class="rule-info">' + "; ".join(bits) + "</p>"


def _chart(track: Track, run, row: dict, specs: dict, clock: Clock) -> str:
    return (f'<section class="track" data-run="{run.index}"><h3>{e(name_of(row["policy"]))} / '
            f'{e(name_of(row["rule"]))} — <code>{e(row["target"])}</code> {state_chip(row["final_state"])}</h3>'
            + _rule_info(specs.get((run.index, row["policy"], row["rule"])))
            + render_timeline(track, run.first_ts, run.last_ts, clock, run.complete) + "</section>")


def _chart_order(rows: list[dict], incidents: IncidentLog) -> list[dict]:
    """Targets that did something, most important first: by the worst status of their incidents, then activity."""
    worst: dict[tuple, int] = {}
    for shelf in incidents.kept.values():
        for i in shelf:
            key = (i["run"], i["policy"], i["rule"], i["target"])
            worst[key] = min(worst.get(key, 99), status_rank(i["status"]))
    for (run, policy, rule, status), group in incidents.groups.items():
        for target in group["targets"]:
            key = (run, policy, rule, target)
            worst[key] = min(worst.get(key, 99), status_rank(status) + 0.5)
    return sorted((r for r in rows if r["active"]),
                  key=lambda r: (worst.get((r["run"], r["policy"], r["rule"], r["target"]), 98),
                                 -sum(r["actions"].values()), -r["transitions"]))


def _timelines(audit: Audit, summary: dict, incidents: IncidentLog, specs: dict, clock: Clock,
               detail: Detail) -> str:
    several = len(audit.runs) > 1
    used = 0
    out = ['<section id="timelines"><h2>Timelines</h2>', _legend()]
    for run in audit.runs:
        rows = [r for r in summary["rules"] if r["run"] == run.index]
        if several:
            out.append(f'<div class="run-head">Run {run.index}</div>')
        active = _chart_order(rows, incidents)
        drawn = 0
        for row in active if detail.charts is None else active[:detail.charts]:
            chart = _chart(run.tracks[(row["policy"], row["rule"], row["target"])], run, row, specs, clock)
            if detail.chart_bytes is not None and drawn and used + len(chart) > detail.chart_bytes:
                break
            out.append(chart)
            used += len(chart)
            drawn += 1
        if len(active) > drawn:
            out.append(f'<p class="muted">{len(active) - drawn} more target(s) did something; '
                       "<code>reflexarc report --full</code> draws them.</p>")
        quiet = [r for r in rows if not r["active"]]
        if quiet and detail.quiet_charts:
            out.append(f"<details><summary>{len(quiet):,} target(s) that never fired</summary>")
            for row in quiet:
                out.append(_chart(run.tracks[(row["policy"], row["rule"], row["target"])], run, row, specs, clock))
            out.append("</details>")
        elif quiet:
            out.append(f'<p class="muted quiet-charts" data-count="{len(quiet)}">{len(quiet):,} target(s) that never '
                       "fired are not drawn; <code>reflexarc report --full</code> draws them.</p>")
        if not rows:
            out.append('<p class="nothing">no rule was evaluated</p>')
    out.append("</section>")
    return "".join(out)


def _event_cell(r: dict) -> str:
    if r["kind"] == "transition":
        note = f'<div class="muted">{e(r["note"])}</div>' if r.get("note") else ""
        return f'{state_chip(r["from"])} → {state_chip(r["to"])}{note}'
    error = f'<div style="color:#c92a2a">{e(r["error"])}</div>' if r.get("error") else ""
    note = f'<div class="muted">{e(r["note"])}</div>' if r.get("note") else ""
    return (f'{e(r["actuator"])} (step {e(r["step"])})<div class="params"><code>{e(compact(r["params"]))}</code></div>'
            f"{error}{note}")


def _budgeted(out: list[str], rows, budget: int | None) -> int:
    """Append rendered ``rows`` to ``out`` until they take ``budget`` characters; how many went in."""
    used = n = 0
    for row in rows:
        if budget is not None and n and used + len(row) > budget:
            break
        out.append(row)
        used += len(row)
        n += 1
    return n


def _decision_row(r: dict, several: bool) -> str:
    evidence = "<br>".join(e(t) for t in r["evidence_text"]) or '<span class="muted">-</span>'
    outcome = e(r.get("outcome")) if r["kind"] == "action" else ""
    change = _change_cell(r) if r["kind"] == "action" else ""
    return (f'<tr class="{e(r["kind"])}">' + (f"<td>{r['run']}</td>" if several else "")
            + f'<td class="when">{e(r["time"])}</td>'
            f'<td>{e(name_of(r["policy"]))} / {e(name_of(r["rule"]))}</td><td><code>{e(r["target"])}</code></td>'
            f"<td>{_event_cell(r)}</td><td>{e(r.get('trigger') or '')}</td><td class=\"ev\">{evidence}</td>"
            f"<td>{e(r.get('mode') or '')}</td><td>{outcome}</td><td class=\"change\">{change}</td></tr>")


def _decisions(log: DecisionLog, several: bool, detail: Detail) -> str:
    rows = log.rows[:detail.decision_rows]
    out = [f'<h2 id="decisions">Decisions</h2><p class="muted">{log.total} transitions and actions; '
           "an action shows the trigger and evidence of the transition that led to it.</p>"]
    if not rows:
        return out[0] + '<p class="nothing">nothing happened</p>'
    out.append('<table class="decisions"><tr>' + ("<th>Run</th>" if several else "")
               + "<th>Time</th><th>Policy / rule</th><th>Target</th><th>Event</th>"
               "<th>Trigger</th><th>Evidence</th><th>Mode</th><th>Outcome</th><th>Change</th></tr>")
    shown = _budgeted(out, (_decision_row(r, several) for r in rows), detail.table_bytes)
    out.append("</table>")
    if log.total > shown:
        out.append(f'<p class="warn">{log.total - shown} more rows are in report.json.</p>')
    return "".join(out)


def _limits(audit: Audit, clock: Clock, detail: Detail) -> str:
    groups = limit_groups(audit)
    head = f'<h2 id="limits">Limits hit</h2><p class="muted">{len(audit.limits)} action(s) held back.</p>'
    if not groups:
        return head + '<p class="nothing">none</p>'
    several = len(audit.runs) > 1
    out = ['<table class="limits"><tr>' + ("<th>Run</th>" if several else "")
           + "<th>Reason</th><th>Policy / rule</th><th>Target</th><th>Times</th><th>First</th><th>Last</th></tr>"]
    for g in groups[:detail.limit_rows]:
        out.append("<tr>" + (f"<td>{g['run']}</td>" if several else "")
                   + f'<td>{e(g["reason"])}</td><td>{e(g["policy"])} / {e(g["rule"])}</td>'
                   f'<td><code>{e(g["target"])}</code></td><td>{g["count"]}</td>'
                   f'<td>{e(clock.at(g["first"]))}</td><td>{e(clock.at(g["last"]))}</td></tr>')
    out.append("</table>")
    if len(groups) > detail.limit_rows:
        out.append(f'<p class="muted">{len(groups) - detail.limit_rows} more are in report.json.</p>')
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


def render_html(audit: Audit, summary: dict, log: DecisionLog, incidents: IncidentLog,
                detail: Detail = Detail.DEFAULT) -> str:
    clock = Clock(audit.wall_clock)
    specs = _specs(audit)
    title = f"reflexarc audit: {summary['source']}"
    body = [_header(summary, clock), _happened(summary, incidents, specs, clock, detail),
            _runs(summary, specs, clock, detail), _dry_run(log, detail),
            _timelines(audit, summary, incidents, specs, clock, detail),
            _decisions(log, len(audit.runs) > 1, detail), _limits(audit, clock, detail), _input_problems(audit)]
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(title)}</title><style>{CSS}</style></head><body><main>"
            + "".join(body) + "</main></body></html>\n")
